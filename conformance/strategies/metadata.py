"""Batch metadata shared by the input-preparation strategies (K5–K10): ragged query lengths,
exclusive query offsets, per-request contiguous positions and block tables.

Structure is drawn by Hypothesis (it shrinks toward a few short decode requests); bulk values
(block ids, token ids) come from a seeded torch generator.
"""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

I32, I64 = torch.int32, torch.int64

# Dtypes of a parameter whose call-site dtype is int64 (positions, slots): shrinks toward int64.
wide_dtypes = st.sampled_from([I64, I32])


@st.composite
def query_lengths(
    draw: st.DrawFn,
    max_requests: int = 6,
    min_len: int = 1,
    decode_len: int = 6,
    prefill: tuple[int, int] = (20, 300),
    max_prefills: int = 1,
) -> list[int]:
    """Tokens per request: decode-sized (``min_len..decode_len``: drafts + 1) with, at drawn
    places, a few prefill-sized requests (shrinks toward all decode)."""
    lengths = draw(st.lists(st.integers(min_len, decode_len), max_size=max_requests))
    if lengths and max_prefills:
        for i in draw(st.lists(st.integers(0, len(lengths) - 1), max_size=max_prefills)):
            lengths[i] = draw(st.integers(*prefill))
            event("prefill-sized request")
    return lengths


def exclusive_offsets(lengths: list[int], dtype: torch.dtype, start: int = 0) -> torch.Tensor:
    """``query_start_loc``: ``[start, start + l0, start + l0 + l1, ...]`` (length ``len + 1``)."""
    return torch.tensor([start] + lengths, dtype=I64).cumsum(0).to(dtype)


def padding(draw: st.DrawFn) -> int:
    """Spare elements past the last written one (cudagraph padding): their poison must survive."""
    return draw(st.sampled_from([0, 0, 1, 3]))


def request_positions(g: torch.Generator, lengths: list[int], high: int = 500) -> torch.Tensor:
    """int64 positions, contiguous within each request from a random start in ``[0, high)``."""
    parts = [int(torch.randint(0, high, (1,), generator=g)) + torch.arange(n) for n in lengths]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=I64)


# Extra columns of the buffer a block table is sliced from: the row stride exceeds the width.
spare_columns = st.sampled_from([0, 0, 3])


def block_table(g: torch.Generator, rows: int, cols: int, wider: int, dtype: torch.dtype, high: int = 1000) -> torch.Tensor:
    """A ``[rows, cols]`` table of random block ids in ``[0, high)``: a column slice of a
    ``[rows, cols + wider]`` buffer, as the kernels take the row stride as an argument."""
    storage = torch.randint(0, high, (rows, cols + wider), generator=g).to(dtype)
    if wider:
        event("strided block table")
    return storage[:, :cols]
