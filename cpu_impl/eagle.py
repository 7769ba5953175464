"""CPU launchers of the EAGLE input-preparation kernels over csrc/eagle.cpp."""

from __future__ import annotations

import torch

from conformance.contract import Args
from conformance.kernels import eagle as contracts
from conformance.kernels._checks import geometry
from cpu_impl import _C
from cpu_impl.launcher import DTYPE_CODES, CpuKernel, buf

_cpp = _C.eagle


def strided_buf(t: torch.Tensor) -> tuple[int, ...]:
    """A tensor addressed as ``row * stride + column`` (a block table, K7's sampled tokens), with
    the geometry of its elements so that the C++ side can check every read (csrc/metadata.h)."""
    return (t.data_ptr(), DTYPE_CODES[t.dtype], t.numel(), *geometry(t))


def _step(a: Args) -> None:
    _cpp.eagle_step_slot_mapping_metadata(
        buf(a["positions_ptr"]),
        strided_buf(a["block_table_ptr"]),
        a["block_table_stride"],
        buf(a["seq_lens_ptr"]),
        buf(a["out_clamped_positions_ptr"]),
        buf(a["out_slot_mapping_ptr"]),
        a["block_size"],
        a["max_model_len"],
        a["n_blocks_per_req"],
        a["PAD_ID"],
        a["batch_size"],
    )


def _inputs_padded(a: Args) -> None:
    _cpp.eagle_prepare_inputs_padded(
        buf(a["cu_num_draft_tokens_ptr"]),
        buf(a["valid_sampled_tokens_count_ptr"]),
        buf(a["query_start_loc_gpu_ptr"]),
        buf(a["token_indices_to_sample_ptr"]),
        buf(a["num_rejected_tokens_gpu_ptr"]),
        a["num_reqs"],
    )


def _next_token(a: Args) -> None:
    _cpp.eagle_prepare_next_token_padded(
        strided_buf(a["sampled_token_ids_ptr"]),
        buf(a["discard_request_mask_ptr"]),
        buf(a["backup_next_token_ids_ptr"]),
        buf(a["next_token_ids_ptr"]),
        buf(a["valid_sampled_tokens_count_ptr"]),
        a["vocab_size"],
        a["num_sampled_tokens_per_req"],
        a["num_reqs"],
        a["stride_sampled_token_ids"],
        a["BLOCK_SIZE_TOKENS"],
    )


def _copy_expand(a: Args) -> None:
    _cpp.copy_and_expand_eagle_inputs(
        buf(a["target_token_ids_ptr"]),
        buf(a["target_positions_ptr"]),
        buf(a["next_token_ids_ptr"]),
        buf(a["out_input_ids_ptr"]),
        buf(a["out_positions_ptr"]),
        buf(a["out_is_rejected_token_mask_ptr"]),
        buf(a["out_is_masked_token_mask_ptr"]),
        buf(a["out_new_token_indices_ptr"]),
        buf(a["out_hidden_state_mapping_ptr"]),
        buf(a["query_start_loc_ptr"]),
        buf(a["query_end_loc_ptr"]),
        a["padding_token_id"],
        a["parallel_drafting_token_id"],
        a["total_input_tokens"],
        a["num_padding_slots_per_request"],
        bool(a["shift_input_ids"]),
        a["BLOCK_SIZE_TOKENS"],
    )


eagle_step_slot_mapping_metadata_kernel = CpuKernel(contracts.EAGLE_STEP_SLOT_MAPPING_METADATA, _step)
eagle_prepare_inputs_padded_kernel = CpuKernel(contracts.EAGLE_PREPARE_INPUTS_PADDED, _inputs_padded)
eagle_prepare_next_token_padded_kernel = CpuKernel(contracts.EAGLE_PREPARE_NEXT_TOKEN_PADDED, _next_token)
copy_and_expand_eagle_inputs_kernel = CpuKernel(contracts.COPY_AND_EXPAND_EAGLE_INPUTS, _copy_expand)
