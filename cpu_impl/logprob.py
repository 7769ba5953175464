"""CPU launchers of Model Runner V2's logprob kernels over csrc/logprob.cpp."""

from __future__ import annotations

from contracts import logprob as contract
from cpu_impl.launcher import CpuKernel

_topk_log_softmax_kernel = CpuKernel(contract.TOPK_LOG_SOFTMAX)
_ranks_kernel = CpuKernel(contract.RANKS)
_fill_logprob_token_ids_kernel = CpuKernel(contract.FILL_TOKEN_IDS)
