"""CPU launcher of the DFlash input-preparation kernel over csrc/dflash.cpp."""

from __future__ import annotations

from conformance.kernels import dflash as contracts
from cpu_impl.launcher import CpuKernel

copy_and_expand_dflash_inputs_kernel = CpuKernel(contracts.COPY_AND_EXPAND_DFLASH_INPUTS)
