"""Value-level checks shared by the input-preparation contracts (K5–K10) and Model Runner V2's step (K22–K31).

Block tables and the sampled-token matrix are addressed as ``row * stride + column`` from the
data pointer, with the stride taken from a scalar argument (docs/spec.md §1.4). A read is inside the
tensor when its flat index is one of the tensor's elements: for a column slice of a wider
buffer, the gaps between rows belong to the buffer, not to the tensor, and are out of bounds.
Query offsets are exclusive cumulative counts (§1.2).
"""

from __future__ import annotations

from typing import Any

import torch

from contracts.spec import check_cumulative, require


def span(t: torch.Tensor) -> int:
    """Elements a possibly strided tensor covers from its first element to its last."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def geometry(t: torch.Tensor) -> tuple[int, int, int]:
    """(rows, columns, row stride) of the flat indices that are elements of ``t``: rows runs of
    ``columns`` elements, ``row stride`` apart. A contiguous tensor is one run of ``numel``; a
    column slice of a wider buffer has gaps between its rows that are not its elements; a strided
    1-D tensor is rows of one element."""
    if t.is_contiguous():
        return (1, t.numel(), t.numel())
    if t.dim() == 1:  # a column of a wider buffer (vLLM's draft_tokens[:, 0]): rows of one element
        return (t.shape[0], 1, t.stride(0))
    return (t.shape[0], t.shape[1], t.stride(0))  # 2-D with unit inner stride (Param.contiguous=False)


def holds(t: torch.Tensor, flat: torch.Tensor, width: int = 1) -> torch.Tensor:
    """Whether flat indices ``[f, f + width)`` from ``t``'s data pointer are all elements of ``t``."""
    rows, cols, stride = geometry(t)
    if rows == 0 or cols == 0:
        return torch.zeros_like(flat, dtype=torch.bool)
    # Written so that nothing wraps in int64: flat may be as large as 2**63 - 1 (a huge stride).
    if stride <= cols:  # the runs touch: the elements are [0, span)
        return (flat >= 0) & (flat <= (rows - 1) * stride + cols - width)
    row = flat.div(stride, rounding_mode="floor")
    return (flat >= 0) & (row < rows) & (flat - row * stride <= cols - width)


def require_rows(kernel: str, name: str, t: torch.Tensor, rows: int, stride: int, width: int) -> None:
    """Every flat index ``r * stride + c`` with ``r < rows`` and ``c < width`` is an element of ``t``."""
    if rows > 0 and width > 0:
        # The first row outside the tensor's span, in Python ints (r * stride may not fit int64);
        # then, with every row inside it, the first that starts in a gap between the tensor's rows.
        limit = span(t) - width  # the last flat index a row may start at
        if limit < 0:
            r = 0
        elif stride < 0 and rows > 1:
            r = 1
        elif stride > 0 and (rows - 1) * stride > limit:
            r = limit // stride + 1
        else:
            # Now rows * stride fits the tensor's span, so this is linear in the tensor, never in
            # `rows` (a stride of 0 repeats row 0 however many rows there are).
            ok = holds(t, torch.arange(rows if stride else 1, dtype=torch.int64) * stride, width)
            r = int((~ok).nonzero()[0]) if not ok.all() else -1
        if r >= 0:
            raise ValueError(f"{kernel}: '{name}' must hold row {r}'s {width} elements at flat index {r * stride} (row stride {stride}), shape {tuple(t.shape)}")


def require_elements(kernel: str, name: str, t: torch.Tensor, flat: torch.Tensor, what: str) -> None:
    """Every flat index in ``flat`` is an element of ``t``."""
    ok = holds(t, flat)
    if not ok.all():
        i = int((~ok).nonzero()[0])
        raise ValueError(f"{kernel}: '{name}' is read at flat index {int(flat[i])} ({what}), which is not an element of shape {tuple(t.shape)}")


def require_cells(kernel: str, name: str, t: torch.Tensor, flat: int, width: int, what: str) -> None:
    """Flat indices ``[flat, flat + width)`` (``flat`` a Python int, never wrapped) are elements of ``t``."""
    if width > 0:
        require(0 <= flat <= 2**63 - 1 - width, kernel, name, f"is accessed at flat index {flat} ({what}), outside it")
        ok = bool(holds(t, torch.tensor([flat], dtype=torch.int64), width)[0])
        require(ok, kernel, name, f"must hold flat indices [{flat}, {flat + width}) ({what}), shape {tuple(t.shape)}")


def exclusive_offsets(kernel: str, name: str, qsl: torch.Tensor, entries: int) -> list[int]:
    """The first ``entries`` elements of ``query_start_loc``: non-negative, non-decreasing."""
    require(qsl.numel() >= entries, kernel, name, f"must hold at least {entries} elements, has {qsl.numel()}")
    qsl = qsl[:entries]
    check_cumulative(kernel, name, qsl)
    return qsl.tolist()


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of everything a strided tensor spans: element ``i`` is flat index ``i`` from
    the data pointer, as a kernel that addresses ``row * stride + column`` sees it. Indices
    that are not elements of ``t`` (see :func:`holds`) are never read in valid input."""
    return torch.as_strided(t, (span(t),), (1,))


def item(t: Any, i: int) -> Any:
    """Flat element ``i`` of a tensor argument, for failure explanations."""
    return flat_view(t)[i].item() if isinstance(t, torch.Tensor) else t
