"""Cases of the KV slot-mapping kernel (K10): context parallelism (every world size, rank and
interleave of the spec), rows narrower than the positions (reads run into the next row),
cudagraph tails, gaps that stay untouched, unordered positions and rare >1024-token requests."""

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
    spare_columns,
    wide_dtypes,
)
from contracts import slot_mapping as contract
from contracts.slot_mapping import K10
from contracts.spec import cdiv


@cases_for(contract.K10)
def slot_mapping_cases() -> st.SearchStrategy[Case]:
    return _slot_mapping_cases()


@st.composite
def _slot_mapping_cases(draw: st.DrawFn) -> Case:
    lengths = draw(query_lengths(min_len=0, decode_len=4, prefill=(5, 40)))
    if lengths and draw(st.sampled_from([False] * 7 + [True])):
        lengths[draw(st.integers(0, len(lengths) - 1))] = draw(st.integers(1025, 1100))
        event("request longer than one 1024-token tile")
    b = len(lengths)
    g = generator(draw(seeds))
    first = draw(st.sampled_from([0, 0, 0, 3]))  # [0, qsl[0]) stays untouched
    qsl = exclusive_offsets(lengths, I64, first)
    scheduled = int(qsl[-1])
    num_tokens = scheduled + draw(st.sampled_from([0, 0, 0, 2]))  # [qsl[R], num_tokens) stays untouched
    max_num_tokens = max(num_tokens + draw(st.sampled_from([3, 0, 1, 17, -2])), 0)
    if max_num_tokens <= num_tokens:
        event("no tail to pad")

    positions = request_positions(g, lengths, high=200)
    if positions.numel() and draw(st.sampled_from([False, False, True])):
        positions = positions[torch.randperm(positions.numel(), generator=g)]  # need not increase
        event("unordered positions")
    positions = torch.cat([torch.arange(first), positions, torch.arange(num_tokens - scheduled)])

    kbs = draw(st.sampled_from([16, 1, 2, 4]))
    world = draw(st.sampled_from([1, 2, 4]))
    rank = draw(st.integers(0, world - 1))
    interleave = draw(st.sampled_from([1, 2, kbs]))
    if world > 1:
        event(f"context parallel: W={world}")

    # Virtual block of every scheduled token; rows narrower than that read the next row (C22).
    token_request = torch.repeat_interleave(torch.arange(b), torch.tensor(lengths, dtype=I64)) if b else torch.zeros(0, dtype=I64)
    virtual_block = positions[first:scheduled] // (kbs * world)
    widest = int(virtual_block.max()) + 1 if virtual_block.numel() else 1
    wider = draw(spare_columns)
    # Past the row's width a read runs into the next row; in a column slice of a wider buffer it
    # would land in a gap, which is not an element: sliced tables are wide enough.
    cols = widest if wider or draw(st.booleans()) else draw(st.integers(1, widest))
    stride = cols + wider
    rows = b + draw(st.integers(0, 2))
    if virtual_block.numel():
        need = int((token_request * stride + virtual_block).max()) + 1  # span the table must cover
        rows = max(rows, cdiv(need - cols, stride) + 1)
    if cols < widest:
        event("positions past the row's width")
    table = block_table(g, max(rows, 1), cols, wider, draw(int_dtypes))

    longest = max(lengths, default=0)
    tile = draw(st.sampled_from([1024, 1024, 4, 16]))
    if cdiv(longest, tile) > 32:
        tile = 1024
    args = dict(
        num_tokens=num_tokens,
        max_num_tokens=max_num_tokens,
        query_start_loc_ptr=qsl.to(draw(int_dtypes)),
        positions_ptr=positions.to(draw(wide_dtypes)),
        block_table_ptr=table,
        block_table_stride=table.stride(0),
        slot_mapping_ptr=torch.zeros(max(max_num_tokens, scheduled) + padding(draw), dtype=draw(wide_dtypes)),
        KV_CACHE_BLOCK_SIZE=kbs,
        TOTAL_CP_WORLD_SIZE=world,
        TOTAL_CP_RANK=rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=interleave,
        PAD_ID=draw(st.sampled_from([-1, -7])),
        BLOCK_SIZE=tile,
    )
    return Case(contract.K10, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _slots_past_row(kernel: str, a: Args, out: Outputs) -> int:
    """K10 local tokens whose virtual block index runs past their block-table row into the next (C22)."""
    from contracts.slot_mapping import local_slots, scheduled_tokens

    table = a["block_table_ptr"]
    _, tokens = scheduled_tokens(a)
    if not tokens.numel() or table.dim() != 2:
        return 0
    vbi, _, local = local_slots(a, a["positions_ptr"][tokens].to(torch.int64))
    return int(((vbi >= table.shape[1]) & local).sum())


def _padding_rows(kernel: str, a: Args, out: Outputs) -> int:
    """The padded tail [num_tokens, max_num_tokens) (C22)."""
    return max(0, a["max_num_tokens"] - a["num_tokens"])


CLASSES: tuple[StateClass, ...] = (
    StateClass("padding rows", (K10,), _padding_rows, "the padded tail of the slot mapping past num_tokens (C22)"),
    StateClass("slot read from the next block-table row", (K10,), _slots_past_row,
               "a local token's virtual block index is past its row: vLLM reads the next request's row (C22)", required=False, hazard=True),
)
