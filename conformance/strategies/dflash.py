"""Cases of the DFlash input-preparation kernel (K9): both HAS_NUM_REJECTED values (the integer
0 for the pointer without counts), rejected counts equal to and past a request's context,
empty requests, tables narrower than the positions need, and multi-tile requests."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from conformance.strategies.metadata import (
    I64,
    block_table,
    exclusive_offsets,
    padding,
    query_lengths,
    request_positions,
    wide_dtypes,
)
from contracts import dflash as contract
from contracts.spec import cdiv, next_power_of_2


@cases_for(contract.K9)
def dflash_cases() -> st.SearchStrategy[Case]:
    return _dflash_cases()


@st.composite
def _dflash_cases(draw: st.DrawFn) -> Case:
    lengths = draw(query_lengths(min_len=0, decode_len=8))  # context tokens per request; empty allowed
    first = draw(st.sampled_from([0, 0, 0, 2]))
    if lengths and first == 0 and lengths[0] == 0:
        lengths[0] = 1  # request 0 reads its last context position at qsl[1] - 1 >= 0
    b = len(lengths)
    k = draw(st.sampled_from([1, 2, 3, 4, 0]))  # num_speculative_tokens
    q = k + 1
    g = generator(draw(seeds))
    qsl = exclusive_offsets(lengths, I64, first)
    end = qsl[1:].tolist()

    has_rejected = draw(st.booleans())
    rejected = [0] * b
    if has_rejected:
        for r, n in enumerate(lengths):
            kind = draw(st.sampled_from(["some", "none", "all", "past"]))
            rej = {"none": 0, "some": int(torch.randint(0, n + 1, (1,), generator=g)), "all": n, "past": n + 2}[kind]
            # The last-position read qsl[r+1] - rej - 1 must stay inside target_positions; for
            # r >= 1 it may land in an earlier request (C23).
            rejected[r] = min(rej, end[r] - 1)
            if rejected[r] >= n and r:
                event("rejected count reaches an earlier request")
        counts = torch.tensor(rejected + [0] * padding(draw), dtype=draw(int_dtypes))
    else:
        counts = draw(st.sampled_from([0, 0, None]))  # the call site passes the integer 0

    n_ctx = int(qsl[-1]) + padding(draw)
    positions = torch.cat([torch.arange(first), request_positions(g, lengths), torch.arange(n_ctx - int(qsl[-1]))])
    total_input_tokens = n_ctx
    if int(qsl[-1]) > first + 1 and draw(st.sampled_from([False, False, False, True])):
        total_input_tokens = int(qsl[-1]) - 1  # context reads clamp to N_ctx - 1
        event("total_input_tokens below query_start_loc[-1]")

    block_size = draw(st.sampled_from([4, 1, 2, 16]))
    highest = int(positions.max()) + q if positions.numel() else q
    needed = cdiv(highest + 1, block_size)
    # Rows narrower than the positions need map into the last column of the stride (C23).
    cols = needed if draw(st.booleans()) else draw(st.integers(1, needed))
    # Rows r < B are read across the whole stride, so the table is never a column slice of a
    # wider buffer: its gaps would be read and are not its elements.
    # A table wider than block_table_stride, addressed with the narrower stride, shows that the
    # column clamp bound is the stride argument, not the allocated width (C23).
    extra = draw(st.sampled_from([0, 0, 0, 3]))
    table = block_table(g, b + draw(st.integers(0, 1)), cols + extra, 0, draw(int_dtypes))
    if extra:
        event("block_table_stride below the table's width")

    longest = max(lengths, default=0) + q
    lanes = min(256, next_power_of_2(longest))
    smaller = draw(st.sampled_from([None, None, 1, 4]))
    if smaller is not None and cdiv(longest, smaller) <= 16:
        lanes = smaller
    if cdiv(longest, lanes) > 1:
        event("several tiles per request")
    spare = padding(draw)
    args = dict(
        next_token_ids_ptr=torch.randint(0, 1000, (b,), generator=g).to(draw(int_dtypes)),
        target_positions_ptr=positions.to(draw(wide_dtypes)),
        out_input_ids_ptr=torch.zeros(b * q + spare, dtype=draw(int_dtypes)),
        out_context_positions_ptr=torch.zeros(int(qsl[-1]) + padding(draw), dtype=draw(wide_dtypes)),
        out_query_positions_ptr=torch.zeros(b * q + spare, dtype=draw(wide_dtypes)),
        out_context_slot_mapping_ptr=torch.zeros(int(qsl[-1]) + padding(draw), dtype=draw(wide_dtypes)),
        out_query_slot_mapping_ptr=torch.zeros(b * q + spare, dtype=draw(wide_dtypes)),
        out_token_indices_ptr=torch.zeros(b * k + padding(draw), dtype=draw(int_dtypes)),
        block_table_ptr=table,
        block_table_stride=cols,
        query_start_loc_ptr=qsl.to(draw(int_dtypes)),
        num_rejected_tokens_ptr=counts,
        parallel_drafting_token_id=draw(st.sampled_from([-3, 0, 151665])),
        block_size=block_size,
        num_query_per_req=q,
        num_speculative_tokens=k,
        total_input_tokens=total_input_tokens,
        BLOCK_SIZE=lanes,
        HAS_NUM_REJECTED=has_rejected,
    )
    return Case(contract.K9, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def earlier_request_position(kernel: str, a: Args, out: Outputs) -> int:
    """K9 requests whose last context position is read from an earlier request's tokens (C23)."""
    qsl = a["query_start_loc_ptr"].to(torch.int64).tolist()
    b = len(qsl) - 1
    rej = a["num_rejected_tokens_ptr"].to(torch.int64).tolist() if a["HAS_NUM_REJECTED"] else [0] * b
    return sum(1 for r in range(b) if qsl[r + 1] - rej[r] - 1 < qsl[r])


CLASSES: tuple[StateClass, ...] = (
    StateClass("last position read from an earlier request", ("copy_and_expand_dflash_inputs_kernel",), earlier_request_position,
               "more rejected tokens than the request has: vLLM reads an earlier request's position (C23)", required=False, hazard=True),
)
