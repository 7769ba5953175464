"""The harness's checks of itself and of what it tests, beyond conformance: the malformed-input fuzz,
thread invariance, sanitizers, planted faults and their gate, the signature gate, compilation for a
GPU target, the port's ISA clones, and ``show`` for saved cases. Each module adds its own
``python -m conformance`` subcommand."""
