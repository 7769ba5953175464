"""CPU launchers of Model Runner V2's block-table kernels over csrc/block_table.cpp."""

from __future__ import annotations

from contracts import block_table as contract
from cpu_impl.launcher import CpuKernel

_gather_block_tables_kernel = CpuKernel(contract.GATHER_BLOCK_TABLES)
_compute_slot_mappings_kernel = CpuKernel(contract.COMPUTE_SLOT_MAPPINGS)
