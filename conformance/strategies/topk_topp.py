"""Batches of the top-k/top-p mask: rows of Gaussian logits, of few distinct values (ties at every
cut-off), of neighbours closer than vLLM's 1e-9 duplicate test, of -inf cells (grammar masks) and
all -inf rows, of one far outlier (vLLM's standalone top-p overflow), of -0.0 and +0.0; k around
the finite count and the vocabulary, p at its edges; padded and viewed row layouts; persistent
grids of fewer programs than rows."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.kernels import topk_topp as contracts
from conformance.runner import Case
from conformance.strategies import cases_for, generator, seeds

# Few vocabulary sizes: VOCAB_SIZE is a constexpr (each one compiles anew).
VOCABS = [1, 2, 3, 8, 13, 64, 100, 257]
ROWS = ["gaussian", "levels", "neighbours", "masked", "all -inf", "one finite", "equal", "outlier", "zeros", "wide"]


def _row(kind: str, g: torch.Generator, v: int) -> torch.Tensor:
    x = torch.randn(v, generator=g) * 2
    if kind == "levels":
        x = torch.randint(-2, 3, (v,), generator=g).to(torch.float32)
    elif kind == "neighbours":  # distinct values 1 and 2 ulps apart (about 1e-10): vLLM's |a - b| < 1e-9 merges them
        a = torch.tensor(1e-3, dtype=torch.float32)
        b = torch.nextafter(a, torch.tensor(1.0))
        c = torch.nextafter(b, torch.tensor(1.0))
        x = torch.stack([a, b, c, torch.tensor(0.0), torch.tensor(1.0)])[torch.randint(0, 5, (v,), generator=g)]
    elif kind == "masked":
        x[torch.rand(v, generator=g) < 0.5] = float("-inf")
    elif kind == "all -inf":
        x.fill_(float("-inf"))
    elif kind == "one finite":
        x.fill_(float("-inf"))
        x[int(torch.randint(0, v, (), generator=g))] = 1.0
    elif kind == "equal":  # 2, 4 or 8 equal logits: p = 1/4, 1/2, 3/4 of their mass is exactly a prefix's
        x.fill_(float("-inf"))
        x[torch.randperm(v, generator=g)[: 2 ** int(torch.randint(1, 4, (), generator=g))]] = 1.0
    elif kind == "outlier":  # far above avg + 10 std of the first tile: vLLM's float32 exp overflows
        x[int(torch.randint(0, v, (), generator=g))] = 150.0
    elif kind == "zeros":
        x = torch.where(torch.rand(v, generator=g) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
    elif kind == "wide":  # magnitudes where float32 subtraction rounds: weights underflow to 0
        x = x * 1e4
    return x


@st.composite
def _case(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    b = draw(st.integers(0, 5))
    v = draw(st.sampled_from(VOCABS))
    kinds = [draw(st.sampled_from(ROWS)) for _ in range(b)]
    for kind in set(kinds):
        event(f"row: {kind}")
    rows = torch.stack([_row(kind, g, v) for kind in kinds]) if b else torch.zeros(0, v)
    # Layout: packed rows, rows inside a wider buffer (its gaps compared: nothing may touch them), or
    # vLLM's view of such a buffer.
    layout = draw(st.sampled_from(["packed", "padded", "view"]))
    stride = v if layout == "packed" else v + draw(st.integers(1, 5))
    wide = torch.randn(max(b, 1), stride, generator=g)
    wide[:b, :v] = rows
    # "padded": the buffer itself is LOGITS, VOCAB_SIZE covering part of each row.
    logits = {"packed": rows.clone(), "padded": wide[:b].contiguous(), "view": wide[:b, :v]}[layout]
    finite = [int((r > float("-inf")).sum()) for r in rows]
    topk, topp = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    k = p = None
    if topk:
        k = torch.tensor([draw(st.sampled_from([1, 2, max(f - 1, 1), max(f, 1), f + 1, max(v - 1, 1), v, v + 3, 2**31 - 1]))
                          for f in finite], dtype=torch.int32)
    if topp:
        p = torch.tensor([draw(st.one_of(st.sampled_from([0.5, 0.9, 1.0, 0.25, 0.75, 1.5, 1e-8, 0.99999994]), st.floats(0.0078125, 1.0, width=32)))
                          for _ in range(b)], dtype=torch.float32)
    pct, cdf = contracts.stand_in_tables()
    block = draw(st.sampled_from([4, 16, 64, 256]))
    programs = draw(st.integers(1, max(b, 1) + 1))
    args = dict(
        LOGITS=logits,
        LOGITS_STRIDE_0=stride,
        BUFFER=torch.empty(programs, v),
        PERCENTILE_TO_STD_TABLE=pct,
        NORMAL_CDF_TO_SIGMA_TABLE=cdf,
        K=k,
        P=p,
        BATCH_SIZE=b,
        VOCAB_SIZE=v,
        MASK_VALUE=draw(st.sampled_from([float("-inf"), -1e9, 0.0, -1e40])),
        BLOCK_SIZE=block,
        BLOCK_SIZE_TRUNC=draw(st.sampled_from([2, block])),
        TOPK_ENABLED=topk,
        TOPP_ENABLED=topp,
        SPLIT_COVERS_PONLY=draw(st.booleans()),
    )
    return Case(contracts.KERNEL, args)


@cases_for(contracts.KERNEL)
def cases() -> st.SearchStrategy[Case]:
    return _case()
