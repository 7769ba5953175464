"""CPU launcher of the KV slot-mapping kernel over csrc/slot_mapping.cpp.

vLLM registers overrides of this kernel as ``vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel``;
:class:`ComputeSlotMappingKernel` gives this module the same attribute path.
"""

from __future__ import annotations

from contracts import slot_mapping as contract
from cpu_impl.launcher import CpuKernel

compute_slot_mapping_kernel = CpuKernel(contract.COMPUTE_SLOT_MAPPING)


class ComputeSlotMappingKernel:
    """vLLM's owner class: ``ComputeSlotMappingKernel.kernel`` is the launcher above."""

    kernel = staticmethod(compute_slot_mapping_kernel)
