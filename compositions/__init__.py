"""vLLM's host-side spec-decode logic (the V1 and Model Runner V2 rejection samplers, top-k/top-p),
composed over whichever backend's kernels are asked for: end-to-end checks of the kernels together."""
