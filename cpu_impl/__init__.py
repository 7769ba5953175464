"""Launch wrappers over the OpenMP port (csrc/), in the Triton launch form.

``cpu_impl.rejection.expand_kernel[grid](*args, **kwargs)`` binds exactly like the Triton
kernel of the same name, ignores the grid (§1.11) and computes on CPU tensors in place, so
an engine can register these objects as kernel overrides.
"""
