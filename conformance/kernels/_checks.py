"""Value-level checks shared by the input-preparation contracts (K5–K10).

Block tables and the sampled-token matrix are addressed as ``row * stride + column`` from the
data pointer, with the stride taken from a scalar argument (spec §1.4); what such a kernel may
read is the tensor's *span*, not its element count. Query offsets are exclusive cumulative
counts (§1.2).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.contract import check_cumulative, require


def require_length(kernel: str, name: str, t: Any, need: int) -> None:
    """A tensor argument holds at least ``need`` elements (non-tensors are checked elsewhere)."""
    if isinstance(t, torch.Tensor):
        require(t.numel() >= need, kernel, name, f"must hold at least {need} elements, has {t.numel()}")


def span(t: torch.Tensor) -> int:
    """Elements a possibly strided tensor covers from its first element to its last: the flat
    indices ``[0, span)`` a kernel may address from its data pointer (``numel`` if contiguous)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def require_flat(kernel: str, name: str, t: torch.Tensor, lo: int, hi: int, what: str) -> None:
    """Flat indices ``lo..hi`` (inclusive; nothing if ``hi < lo``) lie inside ``t``'s span."""
    if hi >= lo:
        require(lo >= 0 and hi < span(t), kernel, name, f"is read at flat index {lo if lo < 0 else hi} ({what}), spans {span(t)} elements")


def require_rows(kernel: str, name: str, t: torch.Tensor, rows: int, stride: int, width: int) -> None:
    """Every flat element ``r * stride + c`` with ``r < rows`` and ``c < width`` lies inside ``t``."""
    if rows > 0 and width > 0:
        last = (rows - 1) * stride
        require_flat(kernel, name, t, min(0, last), max(0, last) + width - 1, f"{rows} rows of {width} at stride {stride}")


def exclusive_offsets(kernel: str, name: str, qsl: torch.Tensor, entries: int) -> list[int]:
    """The first ``entries`` elements of ``query_start_loc``: non-negative, non-decreasing."""
    require(qsl.numel() >= entries, kernel, name, f"must hold at least {entries} elements, has {qsl.numel()}")
    qsl = qsl[:entries]
    check_cumulative(kernel, name, qsl)
    return qsl.tolist()


def power_of_two(kernel: str, name: str, value: int) -> None:
    require(value >= 1 and value & (value - 1) == 0, kernel, name, f"must be a power of two, got {value}")


def at_least(kernel: str, name: str, value: int, low: int) -> None:
    require(value >= low, kernel, name, f"must be >= {low}, got {value}")


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of everything a strided tensor spans: element ``i`` is flat index ``i`` from
    the data pointer, as a kernel that addresses ``row * stride + column`` sees it."""
    return torch.as_strided(t, (span(t),), (1,))


def item(t: Any, i: int) -> Any:
    """Flat element ``i`` of a tensor argument, for failure explanations."""
    return flat_view(t)[i].item() if isinstance(t, torch.Tensor) else t
