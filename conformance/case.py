"""A case: one launch of one kernel, as the strategies draw it, the runner runs it and a file keeps it
(conformance/casefile.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import contracts
from contracts.spec import KernelSpec


@dataclass
class Case:
    """One launch of one kernel: arguments by parameter name (CPU tensors), and the grid.

    Parameters that alias each other are the same tensor object in ``args``. ``grid`` is
    the canonical grid when None. ``positional`` launches with positional arguments instead
    of the keywords vLLM's dispatchers use.
    """

    kernel: str
    args: dict[str, Any]
    grid: tuple[int, ...] | None = None
    positional: bool = False
    note: str = ""
    # How a saved case was run: {"backends": [...], "vllm": "0.33.0"} (see casefile.save_case).
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> KernelSpec:
        return contracts.get(self.kernel)

    def launch_grid(self) -> tuple[int, ...]:
        return self.grid if self.grid is not None else tuple(self.spec.grid(self.args))
