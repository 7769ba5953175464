"""Cases of Model Runner V2's EAGLE/MTP drafter kernels (K29-K31): target batches with rejected
tokens and chunked prefills, CUDA-graph padding, the first draft column of a wider draft table,
every draft step up to the last, positions and lengths at max_model_len, and hidden states in
every float dtype."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from conformance.strategies.metadata import padding, wide_dtypes
from contracts import target_dependent_ar as contract

I32, I64 = torch.int32, torch.int64
floats = st.sampled_from([torch.bfloat16, torch.float32, torch.float16])


def _tensor(values: list[int], dtype: torch.dtype, spare: int = 0) -> torch.Tensor:
    return torch.tensor(values + [0] * spare, dtype=I64).to(dtype)


# -- K29 ------------------------------------------------------------------------------------
@cases_for(contract.K29)
def prefill_cases() -> st.SearchStrategy[Case]:
    return _prefill_cases()


@st.composite
def _prefill_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 6))
    g = generator(draw(seeds))
    lengths = [draw(st.sampled_from([1, 2, 4, 5])) if draw(st.integers(0, 4)) else draw(st.integers(6, 40)) for _ in range(n)]
    rejected = [draw(st.integers(0, q - 1)) for q in lengths]
    sampled = [draw(st.sampled_from([1, 2, 3, 0])) for _ in range(n)]  # 0: a chunked prefill
    states = n + draw(st.integers(0, 3))
    idx = draw(st.permutations(range(states)))[:n]
    qsl = [0]
    for q in lengths:
        qsl.append(qsl[-1] + q)
    tokens = qsl[-1] + padding(draw)
    max_num_reqs = n + draw(st.sampled_from([0, 0, 1, 4]))
    last = torch.randint(0, 1000, (states, 1), generator=g)
    last_dtype = draw(wide_dtypes)
    if draw(st.sampled_from([False] * 5 + [True])):
        last += 2**32  # the kernel narrows the last sampled token to int32
        last_dtype = I64
        event("last sampled token past int32")
    args = dict(
        last_token_indices_ptr=torch.zeros(max_num_reqs + padding(draw), dtype=draw(wide_dtypes)),
        draft_current_step_ptr=torch.tensor(7, dtype=draw(wide_dtypes)),
        draft_input_ids_ptr=torch.zeros(tokens, dtype=draw(int_dtypes)),
        draft_positions_ptr=torch.zeros(tokens, dtype=draw(wide_dtypes)),
        draft_query_start_loc_ptr=torch.zeros(max_num_reqs + 1 + padding(draw), dtype=draw(int_dtypes)),
        draft_seq_lens_ptr=torch.zeros(max_num_reqs + padding(draw), dtype=draw(int_dtypes)),
        target_input_ids_ptr=torch.randint(0, 1000, (tokens,), generator=g).to(draw(int_dtypes)),
        target_positions_ptr=torch.randint(0, 4000, (tokens,), generator=g).to(draw(wide_dtypes)),
        idx_mapping_ptr=_tensor(list(idx), draw(int_dtypes)),
        last_sampled_ptr=(last if draw(st.booleans()) else last.flatten()).to(last_dtype),
        next_prefill_tokens_ptr=torch.randint(0, 1000, (draw(st.integers(1, 2)), states), generator=g).to(draw(int_dtypes)),
        num_sampled_ptr=_tensor(sampled, draw(int_dtypes)),
        num_rejected_ptr=_tensor(rejected, draw(int_dtypes)),
        query_start_loc_ptr=_tensor(qsl, draw(int_dtypes), padding(draw)),
        seq_lens_ptr=torch.randint(1, 4000, (n,), generator=g).to(draw(int_dtypes)),
        max_num_reqs=max_num_reqs,
        BLOCK_SIZE=draw(st.sampled_from([1024, 1024, 4, 1])),
    )
    return Case(contract.K29, args)


# -- K30 ------------------------------------------------------------------------------------
def _max_model_len(draw: st.DrawFn, high: int) -> int:
    """Sometimes just above the positions: they reach it and clamp."""
    if draw(st.booleans()):
        return max(1, high + draw(st.integers(-2, 1)))
    return draw(st.sampled_from([4096, 2**31 - 1]))


@cases_for(contract.K30)
def decode_cases() -> st.SearchStrategy[Case]:
    return _decode_cases()


@st.composite
def _decode_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 6))
    k = draw(st.integers(1, 4))
    g = generator(draw(seeds))
    table = torch.randint(0, 1000, (n, k), generator=g).to(draw(wide_dtypes))
    drafts = table[:, 0] if draw(st.sampled_from([True, True, False])) else table[:, 0].contiguous()  # the call site's column
    rejected = torch.randint(0, k + 1, (n,), generator=g)
    seq = rejected + torch.randint(1, 60, (n,), generator=g)
    positions = seq - rejected - 1 + torch.randint(0, 2, (n,), generator=g)
    max_num_reqs = n + draw(st.sampled_from([0, 0, 1, 4]))
    args = dict(
        draft_tokens_ptr=drafts,
        draft_tokens_stride=drafts.stride(0),
        target_seq_lens_ptr=seq.to(draw(int_dtypes)),
        num_rejected_ptr=rejected.to(draw(int_dtypes)),
        input_ids_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        positions_ptr=_tensor(positions.tolist(), draw(wide_dtypes), padding(draw)),
        sample_src_positions_ptr=_tensor((positions + 1).tolist(), draw(wide_dtypes), padding(draw)),
        query_start_loc_ptr=torch.zeros(max_num_reqs + 1 + padding(draw), dtype=draw(int_dtypes)),
        seq_lens_ptr=torch.zeros(max_num_reqs + padding(draw), dtype=draw(int_dtypes)),
        max_model_len=_max_model_len(draw, int((seq - rejected).max()) + 1 if n else 1),
        max_num_reqs=max_num_reqs,
        BLOCK_SIZE=draw(st.sampled_from([1024, 1024, 2])),
        ADVANCE_DRAFT_POSITIONS=draw(st.sampled_from([True, True, False])),
    )
    return Case(contract.K30, args)


# -- K31 ------------------------------------------------------------------------------------
@cases_for(contract.K31)
def update_cases() -> st.SearchStrategy[Case]:
    return _update_cases()


@st.composite
def _update_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 6))
    k = draw(st.sampled_from([3, 4, 2, 1]))  # num_speculative_steps
    # Mostly a step before the last (the engine's are 1..k-1; the contract takes 0 too).
    step = draw(st.integers(0, k - 2)) if k > 1 and draw(st.integers(0, 3)) else k - 1
    g = generator(draw(seeds))
    hidden_size = draw(st.sampled_from([8, 3, 0, 40]))
    dtype = draw(floats)
    wider = draw(st.sampled_from([0, 0, 5]))
    hidden = torch.randn((n + draw(st.integers(0, 2)), hidden_size + wider), generator=g).to(dtype)[:, :hidden_size]
    following = torch.zeros((n + padding(draw), hidden_size + draw(st.sampled_from([0, 0, 2]))), dtype=dtype)[:, :hidden_size]
    out = torch.zeros((n + draw(st.integers(0, 2)), k + draw(st.sampled_from([0, 0, 3]))), dtype=draw(wide_dtypes))[:, :k]
    positions = torch.randint(0, 80, (n,), generator=g)
    seq = positions + 1
    args = dict(
        output_draft_tokens_ptr=out,
        output_draft_tokens_stride=out.stride(0),
        next_input_hidden_states_ptr=following,
        next_input_hidden_states_stride=following.stride(0),
        input_ids_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        positions_ptr=_tensor(positions.tolist(), draw(wide_dtypes), padding(draw)),
        sample_src_positions_ptr=_tensor((positions + 1).tolist(), draw(wide_dtypes), padding(draw)),
        seq_lens_ptr=_tensor(seq.tolist(), draw(int_dtypes), padding(draw)),
        draft_tokens_ptr=torch.randint(0, 1000, (n,), generator=g).to(draw(wide_dtypes)),
        current_draft_step_ptr=torch.tensor(step, dtype=draw(wide_dtypes)),
        hidden_states_ptr=hidden,
        hidden_states_stride=hidden.stride(0),
        hidden_size=hidden_size,
        max_model_len=_max_model_len(draw, int(seq.max()) if n else 1),
        num_speculative_steps=k,
        BLOCK_SIZE=draw(st.sampled_from([1024, 1024, 4])),
        ADVANCE_DRAFT_POSITIONS=draw(st.sampled_from([True, True, False])),
    )
    return Case(contract.K31, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def chunked(kernel: str, a: Args, out: Outputs) -> int:
    """K29 rows that emitted nothing: the next token is the next prompt token."""
    n = a["idx_mapping_ptr"].numel()
    return sum(1 for v in a["num_sampled_ptr"][:n].tolist() if v <= 0)


def rejected(kernel: str, a: Args, out: Outputs) -> int:
    n = a["idx_mapping_ptr"].numel() if kernel == contract.K29 else a["draft_tokens_ptr"].shape[0]
    return sum(1 for v in a["num_rejected_ptr"][:n].tolist() if v > 0)


def padded(kernel: str, a: Args, out: Outputs) -> int:
    n = a["idx_mapping_ptr"].numel() if kernel == contract.K29 else a["draft_tokens_ptr"].shape[0]
    return max(0, a["max_num_reqs"] - n) if n or kernel == contract.K30 else 0


def clamped(kernel: str, a: Args, out: Outputs) -> int:
    """Rows whose position or length reaches max_model_len and is clamped there."""
    if not a["ADVANCE_DRAFT_POSITIONS"]:
        return 0
    m = a["max_model_len"]
    if kernel == contract.K30:
        n = a["draft_tokens_ptr"].shape[0]
        seq = (a["target_seq_lens_ptr"][:n].to(I64) - a["num_rejected_ptr"][:n].to(I64)).tolist()
        return sum(1 for b in range(n) if int(a["positions_ptr"][b]) + 1 > m - 1 or seq[b] + 1 > m)
    n = a["draft_tokens_ptr"].numel()
    if int(a["current_draft_step_ptr"]) >= a["num_speculative_steps"] - 1:
        return 0
    return sum(1 for b in range(n) if int(a["positions_ptr"][b]) + 1 > m - 1 or int(a["seq_lens_ptr"][b]) + 1 > m)


def last_step(kernel: str, a: Args, out: Outputs) -> int:
    return int(int(a["current_draft_step_ptr"]) >= a["num_speculative_steps"] - 1 and a["draft_tokens_ptr"].numel() > 0)


def held(kernel: str, a: Args, out: Outputs) -> int:
    """Positions that do not advance (Gemma4 MTP)."""
    return int(not a["ADVANCE_DRAFT_POSITIONS"])


CLASSES: tuple[StateClass, ...] = (
    StateClass("chunked prefill", (contract.K29,), chunked, "a request still prefilling drafts from its next prompt token"),
    StateClass("rejected tokens left out", (contract.K29, contract.K30), rejected, "the drafter's query and length end before the rejected tokens"),
    StateClass("padded batch rows", (contract.K29, contract.K30), padded, "rows past num_reqs padded for full CUDA graphs"),
    StateClass("max_model_len clamping", (contract.K30, contract.K31), clamped, "a position or length clamped at max_model_len (C38)"),
    StateClass("the last draft step", (contract.K31,), last_step, "only the drafts are written"),
    StateClass("positions held", (contract.K30, contract.K31), held, "ADVANCE_DRAFT_POSITIONS off: positions and lengths stay"),
)
