"""CPU launchers of the EAGLE input-preparation kernels over csrc/eagle.cpp."""

from __future__ import annotations

from contracts import eagle as contract
from cpu_impl.launcher import CpuKernel

eagle_step_slot_mapping_metadata_kernel = CpuKernel(contract.EAGLE_STEP_SLOT_MAPPING_METADATA)
eagle_prepare_inputs_padded_kernel = CpuKernel(contract.EAGLE_PREPARE_INPUTS_PADDED)
eagle_prepare_next_token_padded_kernel = CpuKernel(contract.EAGLE_PREPARE_NEXT_TOKEN_PADDED)
copy_and_expand_eagle_inputs_kernel = CpuKernel(contract.COPY_AND_EXPAND_EAGLE_INPUTS)
