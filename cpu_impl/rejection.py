"""CPU launchers of the rejection-sampler kernels over csrc/rejection.cpp."""

from __future__ import annotations

from conformance.contract import Args
from conformance.kernels import rejection as contracts
from cpu_impl import _C
from cpu_impl.launcher import CpuKernel, buf

_cpp = _C.rejection


def _vocab_columns(a: Args, kernel: str, *names: str) -> None:
    """[rows, V] tensors have V = vocab_size columns: the C++ side sees element counts, not shapes."""
    v = a["vocab_size"]
    for name in names:
        t = a[name]
        if t is not None and t.shape[-1] != v:
            raise ValueError(f"{kernel}: '{name}' must have shape [rows, vocab_size={v}], got {tuple(t.shape)}")


def _greedy(a: Args) -> None:
    _cpp.rejection_greedy_sample(
        buf(a["output_token_ids_ptr"]),
        buf(a["cu_num_draft_tokens_ptr"]),
        buf(a["draft_token_ids_ptr"]),
        buf(a["target_argmax_ptr"]),
        buf(a["bonus_token_ids_ptr"]),
        buf(a["is_greedy_ptr"]),
        a["max_spec_len"],
        buf(a["uniform_probs_ptr"]),
        buf(a["synthetic_conditional_rates_ptr"]),
        bool(a["SYNTHETIC_MODE"]),
    )


def _random(a: Args) -> None:
    _vocab_columns(a, contracts.REJECTION_RANDOM.name, "target_probs_ptr", "draft_probs_ptr")
    _cpp.rejection_random_sample(
        buf(a["output_token_ids_ptr"]),
        buf(a["cu_num_draft_tokens_ptr"]),
        buf(a["draft_token_ids_ptr"]),
        buf(a["draft_probs_ptr"]),
        buf(a["target_probs_ptr"]),
        buf(a["bonus_token_ids_ptr"]),
        buf(a["recovered_token_ids_ptr"]),
        buf(a["uniform_probs_ptr"]),
        buf(a["is_greedy_ptr"]),
        a["max_spec_len"],
        a["vocab_size"],
        buf(a["synthetic_conditional_rates_ptr"]),
        bool(a["NO_DRAFT_PROBS"]),
        bool(a["SYNTHETIC_MODE"]),
    )


def _expand(a: Args) -> None:
    _cpp.expand(
        buf(a["output_ptr"]),
        buf(a["input_ptr"]),
        buf(a["cu_num_tokens_ptr"]),
        a["replace_from"],
        a["replace_to"],
        a["MAX_NUM_TOKENS"],
    )


def _recovered(a: Args) -> None:
    _vocab_columns(a, contracts.SAMPLE_RECOVERED.name, "target_probs_ptr", "draft_probs_ptr", "inv_q_ptr")
    _cpp.sample_recovered_tokens(
        buf(a["output_token_ids_ptr"]),
        buf(a["cu_num_draft_tokens_ptr"]),
        buf(a["draft_token_ids_ptr"]),
        buf(a["draft_probs_ptr"]),
        buf(a["target_probs_ptr"]),
        buf(a["inv_q_ptr"]),
        a["vocab_size"],
        a["BLOCK_SIZE"],
        bool(a["NO_DRAFT_PROBS"]),
        bool(a["USE_FP64_GUMBEL"]),
    )


rejection_greedy_sample_kernel = CpuKernel(contracts.REJECTION_GREEDY, _greedy)
rejection_random_sample_kernel = CpuKernel(contracts.REJECTION_RANDOM, _random)
expand_kernel = CpuKernel(contracts.EXPAND, _expand)
sample_recovered_tokens_kernel = CpuKernel(contracts.SAMPLE_RECOVERED, _recovered)
