"""CPU launcher of the DFlash input-preparation kernel over csrc/dflash.cpp."""

from __future__ import annotations

from contracts import dflash as contract
from cpu_impl.launcher import CpuKernel

copy_and_expand_dflash_inputs_kernel = CpuKernel(contract.COPY_AND_EXPAND_DFLASH_INPUTS)
