"""The one shared test utility: launch a kernel on a named backend, as the engine would."""

from __future__ import annotations

from typing import Any

import torch

from conformance.compositions import launch

BACKENDS = ("reference", "triton", "cpu")


def run(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> dict[str, Any]:
    """Launches and returns the arguments (outputs written in place)."""
    launch(backend, kernel, grid, **args)
    return args


def i32(x: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32)


def i64(x: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64)


def f32(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def f64(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)
