"""The PyTorch oracle of every kernel: the readable specification (docs/spec.md and the family pages).

Each function has the vLLM kernel's name, parameters and order, and states what the kernel computes
for a launch inside its contract (``contracts/``); it does not validate. The harness applies the
contract before the oracle runs: the ``reference`` backend (``conformance/backends.py``) binds the
launch and checks it, as the C++ launchers do, so an out-of-contract launch is refused by name there.
"""
