"""vLLM's host-side spec-decode logic (the V1 and Model Runner V2 rejection samplers, top-k/top-p in
``sampler``; Model Runner V2's whole speculative-decoding step with its drafter in ``step``),
composed over whichever backend's kernels are asked for: end-to-end checks of the kernels together."""
