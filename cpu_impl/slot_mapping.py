"""CPU launcher of the KV slot-mapping kernel over csrc/slot_mapping.cpp.

vLLM registers overrides of this kernel as ``vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel``;
:class:`ComputeSlotMappingKernel` gives this module the same attribute path.
"""

from __future__ import annotations

from conformance.contract import Args
from conformance.kernels import slot_mapping as contracts
from cpu_impl import _C
from cpu_impl.eagle import strided_buf
from cpu_impl.launcher import CpuKernel, buf

_cpp = _C.slot_mapping


def _slots(a: Args) -> None:
    _cpp.compute_slot_mapping(
        a["num_tokens"],
        a["max_num_tokens"],
        buf(a["query_start_loc_ptr"]),
        buf(a["positions_ptr"]),
        strided_buf(a["block_table_ptr"]),
        a["block_table_stride"],
        buf(a["slot_mapping_ptr"]),
        a["KV_CACHE_BLOCK_SIZE"],
        a["TOTAL_CP_WORLD_SIZE"],
        a["TOTAL_CP_RANK"],
        a["CP_KV_CACHE_INTERLEAVE_SIZE"],
        a["PAD_ID"],
        a["BLOCK_SIZE"],
    )


compute_slot_mapping_kernel = CpuKernel(contracts.COMPUTE_SLOT_MAPPING, _slots)


class ComputeSlotMappingKernel:
    """vLLM's owner class: ``ComputeSlotMappingKernel.kernel`` is the launcher above."""

    kernel = staticmethod(compute_slot_mapping_kernel)
