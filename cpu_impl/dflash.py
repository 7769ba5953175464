"""CPU launcher of the DFlash input-preparation kernel over csrc/dflash.cpp."""

from __future__ import annotations

from conformance.contract import Args
from conformance.kernels import dflash as contracts
from cpu_impl import _C
from cpu_impl.eagle import strided_buf
from cpu_impl.launcher import CpuKernel, buf

_cpp = _C.dflash


def _copy_expand(a: Args) -> None:
    _cpp.copy_and_expand_dflash_inputs(
        buf(a["next_token_ids_ptr"]),
        buf(a["target_positions_ptr"]),
        buf(a["out_input_ids_ptr"]),
        buf(a["out_context_positions_ptr"]),
        buf(a["out_query_positions_ptr"]),
        buf(a["out_context_slot_mapping_ptr"]),
        buf(a["out_query_slot_mapping_ptr"]),
        buf(a["out_token_indices_ptr"]),
        strided_buf(a["block_table_ptr"]),
        a["block_table_stride"],
        buf(a["query_start_loc_ptr"]),
        buf(a["num_rejected_tokens_ptr"]),  # the integer 0 (no tensor) becomes an absent buffer
        a["parallel_drafting_token_id"],
        a["block_size"],
        a["num_query_per_req"],
        a["num_speculative_tokens"],
        a["total_input_tokens"],
        a["BLOCK_SIZE"],
        bool(a["HAS_NUM_REJECTED"]),
    )


copy_and_expand_dflash_inputs_kernel = CpuKernel(contracts.COPY_AND_EXPAND_DFLASH_INPUTS, _copy_expand)
