"""CPU launchers of Model Runner V2's EAGLE/MTP drafter kernels over csrc/target_dependent_ar.cpp."""

from __future__ import annotations

from contracts import target_dependent_ar as contract
from cpu_impl.launcher import CpuKernel

_prepare_prefill_inputs_kernel = CpuKernel(contract.PREPARE_PREFILL_INPUTS)
_prepare_decode_inputs_kernel = CpuKernel(contract.PREPARE_DECODE_INPUTS)
_update_draft_inputs_kernel = CpuKernel(contract.UPDATE_DRAFT_INPUTS)
