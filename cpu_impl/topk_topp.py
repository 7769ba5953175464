"""CPU launcher of the top-k/top-p mask over csrc/topk_topp.cpp."""

from __future__ import annotations

from conformance.contract import Args, require
from conformance.kernels import topk_topp as contracts
from cpu_impl.launcher import CpuKernel


def _buffer(a: Args) -> None:
    # The C++ side sees the workspace's element count only; its rows are VOCAB_SIZE wide.
    b, v, buffer = a["BATCH_SIZE"], a["VOCAB_SIZE"], a["BUFFER"]
    if b > 0:
        require(buffer.shape[0] >= 1 and buffer.shape[1] == v, contracts.KERNEL, "BUFFER",
                f"must have shape [programs >= 1, VOCAB_SIZE={v}], got {tuple(buffer.shape)}")


_topk_topp_kernel = CpuKernel(contracts.TOPK_TOPP, _buffer)
