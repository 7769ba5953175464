"""CPU launchers of Model Runner V2's batch-state kernels over csrc/input_batch.cpp."""

from __future__ import annotations

from contracts import input_batch as contract
from cpu_impl.launcher import CpuKernel

_prepare_prefill_inputs_kernel = CpuKernel(contract.PREPARE_PREFILL_INPUTS)
_prepare_pos_seq_lens_kernel = CpuKernel(contract.PREPARE_POS_SEQ_LENS)
_combine_sampled_and_draft_tokens_kernel = CpuKernel(contract.COMBINE_SAMPLED_AND_DRAFT_TOKENS)
_get_num_sampled_and_rejected_kernel = CpuKernel(contract.GET_NUM_SAMPLED_AND_REJECTED)
_post_update_kernel = CpuKernel(contract.POST_UPDATE)
_post_update_num_computed_tokens_kernel = CpuKernel(contract.POST_UPDATE_NUM_COMPUTED_TOKENS)
_expand_idx_mapping_kernel = CpuKernel(contract.EXPAND_IDX_MAPPING)
