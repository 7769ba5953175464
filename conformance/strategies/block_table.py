"""Cases of Model Runner V2's block-table kernels (K32-K33): one to three KV-cache groups of different
widths and block sizes, batches whose rows hold partly filled tables, sliding-window groups whose
leading blocks fall out of the window, rows padded for CUDA graphs, dummy rows, groups without slot
mappings, queries that cross block boundaries (chunked prefill), and context parallelism."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from conformance.strategies.metadata import padding, wide_dtypes
from contracts import block_table as contract
from contracts.spec import Table

I32, I64 = torch.int32, torch.int64
block_sizes = st.sampled_from([16, 4, 1, 2])


def _tensor(values: list[int], dtype: torch.dtype, spare: int = 0) -> torch.Tensor:
    return torch.tensor(values + [0] * spare, dtype=I64).to(dtype)


def _ids(g: torch.Generator, rows: int, width: int) -> torch.Tensor:
    return torch.randint(0, 1000, (rows, width), generator=g, dtype=I32)


# -- K32 ------------------------------------------------------------------------------------
@cases_for(contract.K32)
def gather_cases() -> st.SearchStrategy[Case]:
    return _gather_cases()


@st.composite
def _gather_cases(draw: st.DrawFn) -> Case:
    ng = draw(st.integers(1, 3))
    g = generator(draw(seeds))
    n = draw(st.integers(0, 6))
    states = n + draw(st.integers(0, 3))
    widths = [draw(st.sampled_from([6, 3, 1, 12, 0])) for _ in range(ng)]
    idx = list(draw(st.permutations(range(states)))[:n]) if states else []
    if n > 1 and draw(st.sampled_from([False] * 5 + [True])):
        idx[-1] = idx[0]  # one request state in two batch rows: both rows get its blocks
    num_reqs = n if draw(st.integers(0, 4)) else draw(st.integers(0, n))
    rows = num_reqs + draw(st.sampled_from([0, 0, 1, 3]))  # the grid's rows: padding for CUDA graphs
    held = torch.stack([torch.randint(0, w + 1, (states,), generator=g) for w in widths]) if states else torch.zeros((ng, 0))
    counts = held.to(draw(int_dtypes))
    if draw(st.sampled_from([False, False, True])):  # the counts of a wider buffer, by row stride
        counts = torch.zeros((ng, states + 2), dtype=counts.dtype)[:, :states].copy_(counts)
    if draw(st.sampled_from([False, False, False, True])):
        counts = counts.contiguous().flatten()
    stride = counts.stride(0) if counts.dim() == 2 else states
    sizes = [draw(block_sizes) for _ in range(ng)]
    mask = draw(st.booleans())
    reach = [draw(st.sampled_from([0, 8, 1, 32])) for _ in range(ng)]
    first = torch.randint(0, 80, (states,), generator=g)
    dst_rows = rows + draw(st.sampled_from([0, 0, 2]))
    args = dict(
        batch_idx_to_req_idx=_tensor(idx, draw(wide_dtypes)),
        src_block_table_ptrs=Table(_ids(g, states, w) for w in widths),
        dst_block_table_ptrs=Table(torch.zeros((dst_rows, w), dtype=I32) for w in widths),
        block_table_strides=_tensor(widths, draw(wide_dtypes)),
        num_blocks_ptr=counts,
        num_blocks_stride=stride,
        num_reqs=num_reqs,
        num_computed_tokens_ptr=first.to(draw(int_dtypes)) if mask else None,
        sliding_window_reach_ptr=_tensor(reach, draw(int_dtypes)) if mask else None,
        block_sizes_ptr=_tensor(sizes, draw(int_dtypes)) if mask else None,
        MASK_SLIDING_WINDOW=mask,
        BLOCK_SIZE=draw(st.sampled_from([1024, 1024, 4])),
    )
    return Case(contract.K32, args, grid=(ng, rows))


# -- K33 ------------------------------------------------------------------------------------
@cases_for(contract.K33)
def slot_cases() -> st.SearchStrategy[Case]:
    return _slot_cases()


@st.composite
def _slot_cases(draw: st.DrawFn) -> Case:
    ng = draw(st.integers(1, 3))
    g = generator(draw(seeds))
    n = draw(st.integers(0, 6))
    states = n + draw(st.integers(0, 2))
    idx = list(draw(st.permutations(range(states)))[:n]) if states else []
    idx = [-1 if draw(st.sampled_from([False] * 4 + [True])) else s for s in idx]  # dummy rows
    # Mostly decode rows of 1 + drafts tokens; sometimes a prefill chunk across several blocks.
    lengths = [draw(st.sampled_from([1, 4, 5, 0])) if draw(st.integers(0, 3)) else draw(st.integers(6, 40)) for _ in range(n)]
    first = draw(st.sampled_from([0, 0, 0, 2]))
    qsl = [first]
    for q in lengths:
        qsl.append(qsl[-1] + q)
    tokens = qsl[-1]
    pos = torch.zeros(tokens + padding(draw), dtype=I64)
    for b, q in enumerate(lengths):
        # A request's tokens are consecutive positions; a dummy row's are whatever the buffer held.
        start = int(torch.randint(0, 120, (1,), generator=g))
        pos[qsl[b]:qsl[b] + q] = start + torch.arange(q) if idx[b] >= 0 else torch.randint(-5, 200, (q,), generator=g)
    cp = draw(st.sampled_from([1, 1, 1, 2, 4]))
    interleave = draw(st.sampled_from([1, 1, 2])) if cp > 1 else 1
    sizes = [draw(block_sizes) for _ in range(ng)]
    enabled = [draw(st.sampled_from([True, True, True, False])) for _ in range(ng)]
    sharded = [draw(st.booleans()) for _ in range(ng)]
    a = dict(CP_SIZE=cp, CP_INTERLEAVE=interleave, cp_rank=draw(st.integers(0, cp - 1)), block_sizes=torch.tensor(sizes),
             dcp_sharded=torch.tensor(sharded))
    real = torch.tensor([s >= 0 for b, s in enumerate(idx) for _ in range(lengths[b])], dtype=torch.bool)
    widths = []
    for k in range(ng):  # wide enough for every block a real token reads
        local, _ = contract.local_positions(a, k, pos[first:tokens].clamp_min(0))
        need = int(local[real].div(sizes[k], rounding_mode="floor").max()) + 1 if real.any() else 1
        widths.append(need + draw(st.sampled_from([0, 0, 3])))
    m = tokens + draw(st.sampled_from([0, 0, 1, 4])) if draw(st.integers(0, 5)) else max(0, tokens - 2)
    width = max(tokens, m)
    out = torch.zeros((ng, width + draw(st.sampled_from([0, 0, 3]))), dtype=draw(st.sampled_from([I64, I64, I32])))
    args = dict(
        max_num_tokens=m,
        idx_mapping=_tensor(idx, draw(wide_dtypes)),
        query_start_loc=_tensor(qsl, draw(int_dtypes), padding(draw)),
        pos=pos.to(draw(wide_dtypes)),
        block_table_ptrs=Table(_ids(g, max(states, 1), w) for w in widths),
        block_table_strides=_tensor(widths, draw(wide_dtypes)),
        block_sizes=_tensor(sizes, draw(int_dtypes)),
        slot_mapping_enabled=torch.tensor(enabled),
        dcp_sharded=torch.tensor(sharded),
        slot_mappings_ptr=out,
        slot_mappings_stride=out.stride(0),
        cp_rank=a["cp_rank"],
        CP_SIZE=cp,
        CP_INTERLEAVE=interleave,
        PAD_ID=draw(st.sampled_from([-1, -1, -1, -5])),
        TRITON_BLOCK_SIZE=draw(st.sampled_from([1024, 1024, 4])),
    )
    return Case(contract.K33, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def padded_rows(kernel: str, a: Args, out: Outputs) -> int:
    """K32 rows past num_reqs the oracle wrote (zeroed for CUDA graphs; rows past the grid keep the poison)."""
    poison = torch.iinfo(I32).min + 1
    return sum(int((t[a["num_reqs"]:] != poison).any(dim=1).sum()) for name, t in out.items() if t.numel())


def window(kernel: str, a: Args, out: Outputs) -> int:
    """Gathered rows with leading blocks out of a sliding window: nulled."""
    if not a["MASK_SLIDING_WINDOW"]:
        return 0
    n = min(a["num_reqs"], a["batch_idx_to_req_idx"].numel())
    count = 0
    for k in range(len(a["src_block_table_ptrs"])):
        reach, size = int(a["sliding_window_reach_ptr"][k]), int(a["block_sizes_ptr"][k])
        for b in range(n):
            s = int(a["batch_idx_to_req_idx"][b])
            count += reach > 0 and (int(a["num_computed_tokens_ptr"][s]) - reach) // size > 0
    return count


def groups(kernel: str, a: Args, out: Outputs) -> int:
    table = a["src_block_table_ptrs" if kernel == contract.K32 else "block_table_ptrs"]
    return int(len(table) > 1)


def dummy_rows(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for s in a["idx_mapping"].tolist() if s < 0)


def disabled(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for e in a["slot_mapping_enabled"][: len(a["block_table_ptrs"])].tolist() if not e)


def context_parallel(kernel: str, a: Args, out: Outputs) -> int:
    return int(a["CP_SIZE"] > 1 and bool(a["dcp_sharded"][: len(a["block_table_ptrs"])].any()))


def crossing(kernel: str, a: Args, out: Outputs) -> int:
    """Real rows whose tokens cross a block boundary of the first group (a prefill chunk)."""
    qsl, size = a["query_start_loc"].tolist(), int(a["block_sizes"][0]) if len(a["block_table_ptrs"]) else 1
    count = 0
    for b, s in enumerate(a["idx_mapping"].tolist()):
        if s >= 0 and qsl[b + 1] > qsl[b]:
            count += int(a["pos"][qsl[b]]) // size != int(a["pos"][qsl[b + 1] - 1]) // size
    return count


def tail(kernel: str, a: Args, out: Outputs) -> int:
    n = a["idx_mapping"].numel()
    return max(0, a["max_num_tokens"] - int(a["query_start_loc"][n]))


CLASSES: tuple[StateClass, ...] = (
    StateClass("padded batch rows", (contract.K32,), padded_rows, "forward-pass rows past num_reqs: zeroed up to the grid's rows"),
    StateClass("sliding-window groups", (contract.K32,), window, "leading blocks below a sliding window read as the null block"),
    StateClass("several KV-cache groups", (contract.K32, contract.K33), groups, "tables of different widths and block sizes, one program each"),
    StateClass("dummy rows", (contract.K33,), dummy_rows, "idx_mapping -1: the row's tokens are PAD_ID, its positions never read"),
    StateClass("groups without slot mappings", (contract.K33,), disabled, "slot_mapping_enabled False: every token PAD_ID"),
    StateClass("context parallelism", (contract.K33,), context_parallel, "a sharded group's tokens dealt to the ranks (C39)"),
    StateClass("queries across blocks", (contract.K33,), crossing, "a chunked prefill whose tokens span several blocks"),
    StateClass("padding past the batch", (contract.K33,), tail, "tokens up to max_num_tokens: PAD_ID for CUDA graphs"),
)
