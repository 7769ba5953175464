"""Contract of Model Runner V2's block-table kernels (docs/block_table.md, C39,
vllm/v1/worker/gpu/block_table.py).

Each KV-cache group ``g`` keeps a block table ``[max_num_reqs, max_num_blocks_g]`` (int32 block ids,
row ``s`` the request in state row ``s``). Before the forward pass, ``_gather_block_tables_kernel``
copies the batch's rows into the forward pass's tables (row ``b`` for batch row ``b``), nulls the
blocks a sliding window no longer reaches and zeroes the rows padded for CUDA graphs;
``_compute_slot_mappings_kernel`` maps every query token to its KV-cache slot, ``block * block_size
+ offset``, for the target step and every draft step, and pads the rest with ``PAD_ID``.

vLLM hands both kernels the groups' tables as a uint64 tensor of their addresses; a launch here
passes the tensors (:class:`contracts.spec.Table`), one per group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, flat_view, require_cells, require_rows
from contracts.spec import (
    INT,
    Earlier,
    KernelSpec,
    Role,
    constexpr,
    in_int32,
    power_of_two,
    ptr,
    require,
    require_fits,
    require_length,
    scalar,
    table,
)

I32, I64 = torch.int32, torch.int64
MODULE = "vllm.v1.worker.gpu.block_table"
K32 = "_gather_block_tables_kernel"
K33 = "_compute_slot_mappings_kernel"


def groups(kernel: str, a: Mapping[str, Any], tables: tuple[str, ...], strides: str) -> list[int]:
    """Each group's table width: every table in ``tables`` has one tensor per group, group ``g``'s
    ``[rows, strides[g]]`` (vLLM's stride is the table's width: the gather pads a row up to it)."""
    first = a[tables[0]]
    n = len(first)
    require_length(kernel, strides, a[strides], n)
    widths = a[strides][:n].tolist()
    for name in tables:
        require(len(a[name]) == n, kernel, name, f"must hold one table per KV-cache group ({n}, as '{tables[0]}'), holds {len(a[name])}")
        for g, (t, w) in enumerate(zip(a[name], widths)):
            require(t.shape[1] == w, kernel, f"{name}[{g}]", f"must have {strides}[{g}] = {w} columns, has shape {tuple(t.shape)}")
    return widths


# -- K32: the batch's block-table rows into the forward pass's tables -----------------------------
def _gather_pre(a: Mapping[str, Any]) -> None:
    k = K32
    power_of_two(k, "BLOCK_SIZE", a["BLOCK_SIZE"])
    widths = groups(k, a, ("src_block_table_ptrs", "dst_block_table_ptrs"), "block_table_strides")
    require(a["num_reqs"] >= 0, k, "num_reqs", f"must be >= 0, got {a['num_reqs']}")
    if a["MASK_SLIDING_WINDOW"]:
        for name in ("num_computed_tokens_ptr", "sliding_window_reach_ptr", "block_sizes_ptr"):
            require(a[name] is not None, k, name, "must be a tensor when MASK_SLIDING_WINDOW is set")
        require_length(k, "sliding_window_reach_ptr", a["sliding_window_reach_ptr"], len(widths))
        require_length(k, "block_sizes_ptr", a["block_sizes_ptr"], len(widths))
        sizes = a["block_sizes_ptr"][: len(widths)].tolist()
        for g, size in enumerate(sizes):
            require(size >= 1, k, "block_sizes_ptr", f"entry {g} = {size} must be >= 1")


def gathered_rows(a: Mapping[str, Any], grid: tuple[int, ...]) -> int:
    """Batch rows the gather copies: the first ``num_reqs`` of the grid's rows (the rest are padding)."""
    return max(0, min(a["num_reqs"], grid[1]))


def _gather_grid(a: Mapping[str, Any], grid: tuple[int, ...]) -> None:
    """The grid is (groups, rows): rows below num_reqs are the batch's, the rest padding zeroed; every
    one a row of each forward-pass table. Reads of a batch row's state are checked here, where the
    rows are known."""
    k = K32
    src, dst = a["src_block_table_ptrs"], a["dst_block_table_ptrs"]
    require(len(grid) == 2 and grid[0] == len(src) and grid[1] >= 0, k, "grid",
            f"must be (num_kv_cache_groups={len(src)}, rows >= 0), got {grid}")
    rows = grid[1]
    for g, t in enumerate(dst):
        require(t.shape[0] >= rows, k, f"dst_block_table_ptrs[{g}]", f"must have the grid's {rows} rows, has shape {tuple(t.shape)}")
    n = gathered_rows(a, grid)
    require_length(k, "batch_idx_to_req_idx", a["batch_idx_to_req_idx"], n)
    idx = a["batch_idx_to_req_idx"][:n].tolist()
    counts, stride = a["num_blocks_ptr"], a["num_blocks_stride"]
    mask = a["MASK_SLIDING_WINDOW"]
    if mask and n:
        reach = a["sliding_window_reach_ptr"][: len(src)].tolist()
        first = a["num_computed_tokens_ptr"]
    for b, s in enumerate(idx):
        for g, t in enumerate(src):
            require(0 <= s < t.shape[0], k, "batch_idx_to_req_idx",
                    f"entry {b} = {s} must be a row of 'src_block_table_ptrs[{g}]' of {t.shape[0]} rows")
            at = g * stride + s
            require_cells(k, "num_blocks_ptr", counts, at, 1, f"group {g}'s block count of request state {s}")
            held = int(flat_view(counts)[at])
            require(0 <= held <= t.shape[1], k, "num_blocks_ptr",
                    f"group {g}'s count for request state {s} = {held} must be in [0, {t.shape[1]}] (the table's width)")
            if mask and reach[g] > 0:
                require(0 <= s < first.numel(), k, "batch_idx_to_req_idx",
                        f"entry {b} = {s} must index 'num_computed_tokens_ptr' of {first.numel()} elements")
                in_int32(k, "num_computed_tokens_ptr", int(first[s]) - reach[g], f"request state {s}'s first position - group {g}'s reach")


def _gather_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    g = int(output.rpartition("[")[2].rstrip("]")) if "[" in output else 0
    width = a["dst_block_table_ptrs"][g].shape[1]
    b, col = divmod(index, width) if width else (0, index)
    if b >= a["num_reqs"]:
        return f"group {g}, row {b}: padding past num_reqs={a['num_reqs']} (zeroed up to the grid's rows, untouched past them)"
    s = int(a["batch_idx_to_req_idx"][b])
    held = int(flat_view(a["num_blocks_ptr"])[g * a["num_blocks_stride"] + s])
    line = f"group {g}, batch row {b} -> request state {s}, column {col}: the request holds {held} blocks"
    if a["MASK_SLIDING_WINDOW"]:
        line += (f"; reach {int(a['sliding_window_reach_ptr'][g])}, first position {int(a['num_computed_tokens_ptr'][s])}, "
                 f"block size {int(a['block_sizes_ptr'][g])}")
    return line


# Earlier releases' parameter lists (KernelSpec.earlier), from their source distributions.
_WINDOW = ("num_computed_tokens_ptr", "sliding_window_reach_ptr", "block_sizes_ptr", "MASK_SLIDING_WINDOW")
_GATHER = ("batch_idx_to_req_idx", "src_block_table_ptrs", "dst_block_table_ptrs", "block_table_strides", "num_blocks_ptr",
           "num_blocks_stride", "num_reqs")


def _bind_gather_0_32(a: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.30.0-0.32.0's launch of K32: the contract's arguments without the window's, which it does not take."""
    return {k: v for k, v in a.items() if k not in _WINDOW}


def _gather_predates_0_32(a: Mapping[str, Any]) -> str | None:
    return "C39 sliding-window nulling (0.33.0)" if a["MASK_SLIDING_WINDOW"] else None


_EARLIER_K32 = (
    Earlier("0.21.0", (*_GATHER, "max_num_blocks", "BLOCK_SIZE"),
            "padded rows zeroed to one max_num_blocks for every group; no sliding-window nulling"),
    Earlier("0.32.0", (*_GATHER, "BLOCK_SIZE"), "no sliding-window nulling (its four parameters came in 0.33.0)",
            _bind_gather_0_32, _gather_predates_0_32),
)
_SLOTS = ("max_num_tokens", "idx_mapping", "query_start_loc", "pos", "block_table_ptrs", "block_table_strides", "block_sizes")
_SLOTS_TAIL = ("slot_mappings_ptr", "slot_mappings_stride", "cp_rank", "CP_SIZE", "CP_INTERLEAVE", "PAD_ID", "TRITON_BLOCK_SIZE")
_EARLIER_K33 = (
    Earlier("0.21.0", (*_SLOTS, *_SLOTS_TAIL), "every group mapped and sharded alike (no slot_mapping_enabled, no dcp_sharded)"),
    Earlier("0.30.0", (*_SLOTS, "kernel_block_sizes", "slot_mapping_enabled", *_SLOTS_TAIL),
            "context parallelism over kernel block sizes beside the KV block sizes; every group sharded (no dcp_sharded)"),
)


GATHER_BLOCK_TABLES = KernelSpec(
    name=K32,
    earlier=_EARLIER_K32,
    family="block_table",
    qualname=f"{MODULE}.{K32}",
    params=(
        ptr("batch_idx_to_req_idx", INT, I64, "[num_reqs] batch row -> request state"),
        table("src_block_table_ptrs", (I32,), I32, "per group: [max_num_reqs, max_num_blocks] block ids by request state"),
        table("dst_block_table_ptrs", (I32,), I32, "per group: [>= rows, max_num_blocks] the forward pass's table, row b for "
              "batch row b", role=Role.OUT),
        ptr("block_table_strides", INT, I64, "[groups] each table's row stride: its width"),
        ptr("num_blocks_ptr", INT, I32, "[groups, max_num_reqs] blocks each request holds", contiguous=False, ndim=(1, 2)),
        scalar("num_blocks_stride", "num_blocks' row stride"),
        scalar("num_reqs", "batch rows; the grid's rows past it are padding"),
        ptr("num_computed_tokens_ptr", INT, I32, "[max_num_reqs] each request's first scheduled position", optional=True,
            unread_unless="MASK_SLIDING_WINDOW"),
        ptr("sliding_window_reach_ptr", INT, I32, "[groups] tokens below the first position attention still reads (0: no "
            "window)", optional=True, unread_unless="MASK_SLIDING_WINDOW"),
        ptr("block_sizes_ptr", INT, I32, "[groups] tokens per block", optional=True, unread_unless="MASK_SLIDING_WINDOW"),
        constexpr("MASK_SLIDING_WINDOW", "null the blocks below each sliding window"),
        constexpr("BLOCK_SIZE", "column tile (1024 at the call site)"),
    ),
    grid=lambda a: (len(a["src_block_table_ptrs"]), a["num_reqs"]),
    preconditions=_gather_pre,
    check_grid=_gather_grid,
    explain=_gather_explain,
    rule=lambda a, output, index, kind: "C39 block-table gather",
    call_site=lambda a: (a["num_blocks_ptr"].dim() == 2 and a["num_blocks_stride"] == a["num_blocks_ptr"].stride(0)
                         and a["num_reqs"] == a["batch_idx_to_req_idx"].numel()),
)


# -- K33: every query token's KV-cache slot ----------------------------------------------------------
def local_positions(a: Mapping[str, Any], g: int, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in the rank's share of group ``g``'s cache, whether each token is this rank's) of
    non-negative positions: under context parallelism (CP_SIZE > 1) a sharded group's virtual block
    of ``block_size * CP_SIZE`` tokens deals runs of CP_INTERLEAVE tokens to the ranks in turn."""
    cp = a["CP_SIZE"]
    if cp == 1 or not bool(a["dcp_sharded"][g]):
        return pos, torch.ones_like(pos, dtype=torch.bool)
    size, interleave = int(a["block_sizes"][g]), a["CP_INTERLEAVE"]
    virtual, offset = pos.div(size * cp, rounding_mode="floor"), pos.remainder(size * cp)
    mine = offset.div(interleave, rounding_mode="floor").remainder(cp) == a["cp_rank"]
    local = (offset.div(interleave * cp, rounding_mode="floor") * interleave + offset.remainder(interleave))
    return virtual * size + local, mine


def _slot_pre(a: Mapping[str, Any]) -> None:
    k = K33
    power_of_two(k, "TRITON_BLOCK_SIZE", a["TRITON_BLOCK_SIZE"])
    for name in ("CP_SIZE", "CP_INTERLEAVE"):
        require(a[name] >= 1, k, name, f"must be >= 1, got {a[name]}")
    widths = groups(k, a, ("block_table_ptrs",), "block_table_strides")
    ng = len(widths)
    require_length(k, "block_sizes", a["block_sizes"], ng)
    require_length(k, "slot_mapping_enabled", a["slot_mapping_enabled"], ng)
    if a["CP_SIZE"] != 1:
        require_length(k, "dcp_sharded", a["dcp_sharded"], ng)
    sizes = a["block_sizes"][:ng].tolist()
    for g, size in enumerate(sizes):
        require(size >= 1, k, "block_sizes", f"entry {g} = {size} must be >= 1")
        in_int32(k, "block_sizes", size * a["CP_SIZE"], f"group {g}'s virtual block (block_size * CP_SIZE)")
    idx = a["idx_mapping"]
    n = idx.numel()
    qsl = exclusive_offsets(k, "query_start_loc", a["query_start_loc"], n + 1)
    tokens, m = qsl[n], a["max_num_tokens"]
    require(m >= 0, k, "max_num_tokens", f"must be >= 0, got {m}")
    require_fits(k, "PAD_ID", a["PAD_ID"], "slot_mappings_ptr", a["slot_mappings_ptr"])
    require_length(k, "pos", a["pos"], tokens)
    out, stride = a["slot_mappings_ptr"], a["slot_mappings_stride"]
    width = max(tokens, m)  # each group's row: the batch's tokens, then the padding up to max_num_tokens
    require_rows(k, "slot_mappings_ptr", out, ng, stride, width)
    require(ng <= 1 or stride >= width, k, "slot_mappings_stride",
            f"= {stride} must be >= {width} (the tokens and padding of one group's row), or groups' rows overlap")
    if not n or not ng:
        return
    # The block each real token reads, in every group (a disabled group reads column 0): inside the
    # request's row, and its slot inside int32 as vLLM's int32 block * block_size computes it.
    rows = torch.repeat_interleave(idx.to(I64), torch.tensor([qsl[b + 1] - qsl[b] for b in range(n)], dtype=I64))
    pos = a["pos"][qsl[0]:tokens].to(I64)
    real = rows >= 0
    negative = real & (pos < 0)
    if negative.any():
        i = int(negative.nonzero()[0])
        require(False, k, "pos", f"entry {qsl[0] + i} = {int(pos[i])} is a request's token's position and must be >= 0")
    for g, (t, w) in enumerate(zip(a["block_table_ptrs"], widths)):
        outside = real & (rows >= t.shape[0])
        if outside.any():
            i = int(outside.nonzero()[0])
            require(False, k, "idx_mapping", f"request state {int(rows[i])} must be a row of 'block_table_ptrs[{g}]' of {t.shape[0]} rows")
        local, mine = local_positions(a, g, pos.clamp_min(0))
        enabled = bool(a["slot_mapping_enabled"][g])
        column = local.div(sizes[g], rounding_mode="floor") if enabled else torch.zeros_like(local)
        read = real & mine
        past = read & (column >= w)
        if past.any():
            i = int(past.nonzero()[0])
            require(False, k, "pos", f"entry {qsl[0] + i} = {int(pos[i])} reads column {int(column[i])} of group {g}'s table "
                    f"of width {w}")
        if enabled and read.any():
            slots = t[rows[read], column[read]].to(I64) * sizes[g]
            in_int32(k, "block_table_ptrs", int(slots.min()), f"group {g}'s smallest block * block_size")
            in_int32(k, "block_table_ptrs", int(slots.max()), f"group {g}'s largest block * block_size")
            in_int32(k, "block_table_ptrs", int((slots + local[read].remainder(sizes[g])).max()), f"group {g}'s largest slot")


def _slot_explain(a: Mapping[str, Any], output: str, index: int) -> str:
    stride = a["slot_mappings_stride"]
    g, t = divmod(index, stride) if stride else (0, index)
    qsl = a["query_start_loc"].tolist()
    n = a["idx_mapping"].numel()
    if t >= qsl[n]:
        return f"group {g}, token {t}: padding past the batch's {qsl[n]} tokens (PAD_ID={a['PAD_ID']} up to max_num_tokens={a['max_num_tokens']})"
    b = next((b for b in range(n) if qsl[b] <= t < qsl[b + 1]), None)
    if b is None:
        return f"group {g}, token {t}: before the first query (query_start_loc[0]={qsl[0]}): untouched"
    s = int(a["idx_mapping"][b])
    return (f"group {g}, token {t} of batch row {b} -> request state {s}{' (a dummy row)' if s < 0 else ''}: position "
            f"{int(a['pos'][t])}, block size {int(a['block_sizes'][g])}, enabled {bool(a['slot_mapping_enabled'][g])}")


COMPUTE_SLOT_MAPPINGS = KernelSpec(
    name=K33,
    earlier=_EARLIER_K33,
    family="block_table",
    qualname=f"{MODULE}.{K33}",
    params=(
        scalar("max_num_tokens", "slot_mappings' columns: padded with PAD_ID from the batch's tokens to here"),
        ptr("idx_mapping", INT, I64, "[num_reqs] batch row -> request state (negative: a dummy row, all PAD_ID)"),
        ptr("query_start_loc", INT, I32, "[num_reqs + 1] query offsets"),
        ptr("pos", INT, I64, "[>= num_tokens] positions"),
        table("block_table_ptrs", (I32,), I32, "per group: [max_num_reqs, max_num_blocks] block ids by request state"),
        ptr("block_table_strides", INT, I64, "[groups] each table's row stride: its width"),
        ptr("block_sizes", INT, I32, "[groups] tokens per block"),
        ptr("slot_mapping_enabled", (torch.bool,), torch.bool, "[groups] False: the group's slots are all PAD_ID"),
        ptr("dcp_sharded", (torch.bool,), torch.bool, "[groups] the group's cache is split across context-parallel ranks"),
        ptr("slot_mappings_ptr", INT, I64, "[groups, >= max_num_tokens] each token's slot", role=Role.OUT, contiguous=False,
            ndim=(1, 2)),
        scalar("slot_mappings_stride", "its row stride"),
        scalar("cp_rank", "this rank under context parallelism"),
        constexpr("CP_SIZE", "context-parallel ranks (1: none)"),
        constexpr("CP_INTERLEAVE", "tokens dealt to a rank at a time"),
        constexpr("PAD_ID", "the slot of a token that writes no KV (-1)"),
        constexpr("TRITON_BLOCK_SIZE", "token tile (1024 at the call site)"),
    ),
    # One program per group and batch row, and one more per group for the padding.
    grid=lambda a: (len(a["block_table_ptrs"]), a["idx_mapping"].numel() + 1),
    preconditions=_slot_pre,
    explain=_slot_explain,
    rule=lambda a, output, index, kind: "C39 slot mapping",
    call_site=lambda a: (a["slot_mappings_ptr"].dim() == 2 and a["slot_mappings_stride"] == a["slot_mappings_ptr"].stride(0)
                         and a["max_num_tokens"] == a["slot_mappings_ptr"].shape[1] and a["PAD_ID"] == -1),
)

SPECS = (GATHER_BLOCK_TABLES, COMPUTE_SLOT_MAPPINGS)
