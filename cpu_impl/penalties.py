"""CPU launchers of Model Runner V2's penalties over csrc/penalties.cpp."""

from __future__ import annotations

from contracts import penalties as contract
from cpu_impl.launcher import CpuKernel

_penalties_kernel = CpuKernel(contract.PENALTIES)
_bincount_kernel = CpuKernel(contract.BINCOUNT)
