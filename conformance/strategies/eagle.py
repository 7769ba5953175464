"""Cases of the EAGLE input-preparation kernels (K5–K8): draft steps with positions at and past
max_model_len, narrow block tables and aliased positions; padded batches with zero-draft and
discarded requests; sampled rows with -1 holes and out-of-vocabulary ids; and copy/expand with
and without shifting, parallel-drafting slots, rejected tokens and multi-tile requests."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, inclusive_cumsum, int_dtypes, seeds
from conformance.strategies.metadata import (
    I64,
    block_table,
    exclusive_offsets,
    padding,
    query_lengths,
    request_positions,
    spare_columns,
    wide_dtypes,
)
from contracts import eagle as contract
from contracts._checks import flat_view
from contracts.eagle import K5, K6, K7
from contracts.spec import cdiv, counts, next_power_of_2


# -- K5 ------------------------------------------------------------------------------------------
@cases_for(contract.K5)
def step_cases() -> st.SearchStrategy[Case]:
    return _step_cases()


@st.composite
def _step_cases(draw: st.DrawFn) -> Case:
    b = draw(st.integers(0, 8))
    input_batch_size = b + padding(draw)  # cudagraph padding rows get PAD_ID only
    block_size = draw(st.sampled_from([16, 1, 2, 4, 256]))
    max_model_len = draw(st.integers(1, 300))
    needed = cdiv(max_model_len, block_size)
    # The call site's width is ceil(max_model_len / block_size); narrower rows clamp the column.
    n_blocks = needed if draw(st.booleans()) else draw(st.integers(1, needed))
    g = generator(draw(seeds))

    position = torch.randint(-1, max_model_len, (b,), generator=g)
    seq_len = (position + 1).clamp_min(0) + torch.randint(0, 2, (b,), generator=g)
    edges = {"cap-2": max_model_len - 2, "cap-1": max_model_len - 1, "cap": max_model_len, "past": max_model_len + 7, "first": -1}
    for i, edge in draw(st.lists(st.tuples(st.integers(0, max(b - 1, 0)), st.sampled_from(list(edges))), max_size=3 if b else 0)):
        position[i] = max(edges[edge], -1)
        event(f"position at {edge}")
    for i, near in draw(st.lists(st.tuples(st.integers(0, max(b - 1, 0)), st.sampled_from([0, -1, 1])), max_size=2 if b else 0)):
        seq_len[i] = max(max_model_len + near, 0)  # seq_len + 1 at, below or past the cap

    spare = padding(draw)
    positions = torch.cat([position, torch.randint(0, max_model_len, (spare,), generator=g)]).to(draw(wide_dtypes))
    alias = draw(st.booleans())
    if alias:
        # From the second draft step on, the call site passes one buffer for both (C21).
        event("positions aliases out_clamped_positions")
        clamped = positions
    else:
        clamped = torch.zeros(b + padding(draw), dtype=draw(wide_dtypes))
    seq_lens = torch.cat([seq_len, torch.randint(0, max_model_len + 1, (padding(draw),), generator=g)])
    # The call site passes n_blocks_per_req = block_table.shape[1]; a table wider than the
    # argument shows that the clamp bound is the argument's (C21).
    wider_than_clamp = draw(st.sampled_from([0, 0, 0, 2]))
    table = block_table(g, b + draw(st.integers(0, 2)), n_blocks + wider_than_clamp, draw(spare_columns), draw(int_dtypes))
    args = dict(
        positions_ptr=positions,
        block_table_ptr=table,
        block_table_stride=table.stride(0),
        seq_lens_ptr=seq_lens.to(draw(int_dtypes)),
        out_clamped_positions_ptr=clamped,
        out_slot_mapping_ptr=torch.zeros(input_batch_size, dtype=draw(wide_dtypes)),
        block_size=block_size,
        max_model_len=max_model_len,
        n_blocks_per_req=n_blocks,
        PAD_ID=draw(st.sampled_from([-1, -5])),
        batch_size=b,
    )
    return Case(contract.K5, args)


# -- K6 ------------------------------------------------------------------------------------------
@cases_for(contract.K6)
def inputs_padded_cases() -> st.SearchStrategy[Case]:
    return _inputs_padded_cases()


@st.composite
def _inputs_padded_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 8))
    spare = padding(draw)  # buffers longer than num_reqs
    drafts = draw(st.lists(st.integers(0, 5), min_size=n + spare, max_size=n + spare))
    g = generator(draw(seeds))
    # accepted + 1 in [1, nd + 1]; drawn rows discarded (0) or past nd + 1 (negative rejections).
    valid = [int(torch.randint(1, nd + 2, (1,), generator=g)) for nd in drafts]
    for i, kind in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.sampled_from(["discarded", "over"])), max_size=2 if n else 0)):
        valid[i] = 0 if kind == "discarded" else drafts[i] + 2
        event(f"valid count {kind}")
    # The target ran nd + 1 tokens per request; zero-draft rows may be prefills of any length.
    lengths = [nd + 1 if nd or not draw(st.booleans()) else draw(st.integers(1, 40)) for nd in drafts]
    if 0 in drafts[:n]:
        event("zero-draft request")
    args = dict(
        cu_num_draft_tokens_ptr=inclusive_cumsum(drafts, draw(int_dtypes)),
        valid_sampled_tokens_count_ptr=torch.tensor(valid, dtype=draw(int_dtypes)),
        query_start_loc_gpu_ptr=exclusive_offsets(lengths, draw(int_dtypes)),
        token_indices_to_sample_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        num_rejected_tokens_gpu_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        num_reqs=n,
    )
    return Case(contract.K6, args)


# -- K7 ------------------------------------------------------------------------------------------
@cases_for(contract.K7)
def next_token_cases() -> st.SearchStrategy[Case]:
    return _next_token_cases()


@st.composite
def _next_token_cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 8))
    w = draw(st.integers(0, 6))  # K + 1 columns of the rejection output, or 1 without drafts
    vocab = draw(st.sampled_from([100, 1000, 7]))
    g = generator(draw(seeds))
    # A rejection-output row: accepted tokens then -1; drawn cells get holes and odd ids.
    accepted = torch.randint(0, w + 1, (n,), generator=g)
    rows = torch.where(torch.arange(w) < accepted[:, None], torch.randint(0, vocab, (n, w), generator=g), -1)
    specials = {"hole": -1, "negative": -2, "vocab": vocab, "far": 10 * vocab}
    for r, j, kind in draw(st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, max(w - 1, 0)), st.sampled_from(list(specials))), max_size=3 if n and w else 0)):
        rows[r, j] = specials[kind]
        event(f"sampled id: {kind}")
    # A column slice of a wider buffer: stride_sampled_token_ids > W (the spare cells hold junk).
    wider = draw(st.sampled_from([0, 0, 3]))
    storage = torch.full((n, w + wider), 12345, dtype=draw(int_dtypes))
    storage[:, :w] = rows
    sampled = storage[:, :w]
    bst = next_power_of_2(max(w, 1)) * draw(st.sampled_from([1, 1, 2]))
    spare = padding(draw)
    discard = torch.rand(n + spare, generator=g) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    args = dict(
        sampled_token_ids_ptr=sampled,
        discard_request_mask_ptr=discard,
        backup_next_token_ids_ptr=torch.randint(0, vocab, (n + padding(draw),), generator=g).to(draw(int_dtypes)),
        next_token_ids_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        valid_sampled_tokens_count_ptr=torch.zeros(n + padding(draw), dtype=draw(int_dtypes)),
        vocab_size=vocab,
        num_sampled_tokens_per_req=w,
        num_reqs=n,
        stride_sampled_token_ids=sampled.stride(0),
        BLOCK_SIZE_TOKENS=bst,
    )
    return Case(contract.K7, args)


# -- K8 ------------------------------------------------------------------------------------------
@cases_for(contract.K8)
def copy_expand_cases() -> st.SearchStrategy[Case]:
    return _copy_expand_cases()


@st.composite
def _copy_expand_cases(draw: st.DrawFn) -> Case:
    lengths = draw(query_lengths())
    b = len(lengths)
    g = generator(draw(seeds))
    # Request r keeps its tokens up to query_end_loc; the rest were rejected.
    rejected = [int(torch.randint(0, n, (1,), generator=g)) if draw(st.booleans()) else 0 for n in lengths]
    shift = draw(st.booleans())  # EAGLE-style (True) or draft model (False)
    p = draw(st.integers(1, 4))  # 1, or K with parallel drafting
    net_new = p - shift
    first = draw(st.sampled_from([0, 0, 0, 2]))  # query_start_loc[0] > 0 leaves a gap that stays untouched
    qsl = exclusive_offsets(lengths, I64, first)
    qend = qsl[1:] - 1 - torch.tensor(rejected, dtype=I64)
    n_in = int(qsl[-1]) + padding(draw)
    n_out = int(qsl[-1]) + b * net_new
    positions = torch.cat([torch.arange(first), request_positions(g, lengths), torch.arange(n_in - int(qsl[-1]))])
    longest = max(lengths, default=0) + net_new
    # The call site's min(256, next_power_of_2(...)); or a smaller tile so requests span several.
    bst = min(256, next_power_of_2(longest))
    smaller = draw(st.sampled_from([None, None, 1, 4]))
    if smaller is not None and cdiv(longest, smaller) <= 16:
        bst = smaller
    if cdiv(longest, bst) > 1:
        event("several token tiles per request")
    spare = padding(draw)
    args = dict(
        target_token_ids_ptr=torch.randint(0, 1000, (n_in,), generator=g).to(draw(int_dtypes)),
        target_positions_ptr=positions.to(draw(wide_dtypes)),
        next_token_ids_ptr=torch.randint(0, 1000, (b,), generator=g).to(draw(int_dtypes)),
        out_input_ids_ptr=torch.zeros(n_out + spare, dtype=draw(int_dtypes)),
        out_positions_ptr=torch.zeros(n_out + spare, dtype=draw(wide_dtypes)),
        out_is_rejected_token_mask_ptr=torch.zeros(n_out + spare, dtype=torch.bool),
        out_is_masked_token_mask_ptr=torch.zeros(n_out + spare, dtype=torch.bool),
        out_new_token_indices_ptr=torch.zeros(b * p + padding(draw), dtype=draw(int_dtypes)),
        out_hidden_state_mapping_ptr=torch.zeros(n_in + padding(draw), dtype=draw(int_dtypes)),
        query_start_loc_ptr=qsl.to(draw(int_dtypes)),
        query_end_loc_ptr=qend.to(draw(int_dtypes)),
        padding_token_id=draw(st.sampled_from([0, 0, 7])),
        parallel_drafting_token_id=draw(st.sampled_from([0, 999, -3])),
        total_input_tokens=n_in,
        num_padding_slots_per_request=p,
        shift_input_ids=shift,
        BLOCK_SIZE_TOKENS=bst,
    )
    return Case(contract.K8, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _zero_draft_requests(kernel: str, a: Args, out: Outputs) -> int:
    cu = a["cu_num_draft_tokens_ptr"]
    if kernel == K6:
        cu = cu[: a["num_reqs"]]
    return int((counts(cu) == 0).sum()) if cu.numel() else 0


def _discarded(kernel: str, a: Args, out: Outputs) -> int:
    return int(a["discard_request_mask_ptr"][: a["num_reqs"]].sum())


def _placeholder_samples(kernel: str, a: Args, out: Outputs) -> int:
    n, w, stride = a["num_reqs"], a["num_sampled_tokens_per_req"], a["stride_sampled_token_ids"]
    flat = flat_view(a["sampled_token_ids_ptr"]).tolist()
    return sum(1 for r in range(n) for j in range(w) if r * stride + j < len(flat) and flat[r * stride + j] == -1)


def _padding_rows(kernel: str, a: Args, out: Outputs) -> int:
    """Rows past batch_size are CUDA-graph padding (C21)."""
    return max(0, a["out_slot_mapping_ptr"].numel() - a["batch_size"])


CLASSES: tuple[StateClass, ...] = (
    StateClass("zero drafts", (K6,), _zero_draft_requests, "a request without drafts: 0 rejected tokens (C19)"),
    StateClass("padding rows", (K5,), _padding_rows, "CUDA-graph padding rows past batch_size (C21)"),
    StateClass("discarded requests", (K7,), _discarded, "a discarded request gets the backup token (C20)"),
    StateClass("placeholder drafts", (K7,), _placeholder_samples, "-1 (rejected) sampled tokens (C20)"),
)
