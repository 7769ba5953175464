"""The GPU path: Triton kernels with vLLM 0.33.0's names, parameters and launch grids.

Without a GPU the kernels run under Triton's interpreter. ``TRITON_INTERPRET`` must be set
before a kernel is defined, so this package decides it once, on first import.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def mode() -> str:
    """How the Triton kernels run in this process: 'compiled' or 'interpreted'."""
    return "interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"


def device() -> str:
    return "cpu" if mode() == "interpreted" else "cuda"
