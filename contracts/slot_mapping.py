"""Contract of the KV slot-mapping kernel (docs/spec.md §2.10, vllm/v1/worker/block_table.py).

vLLM's kernel is the static Triton function ``ComputeSlotMappingKernel.kernel``; a dotted name
cannot be a module attribute, so every backend defines ``compute_slot_mapping_kernel`` and
exposes it as ``ComputeSlotMappingKernel.kernel`` too, the path vLLM's override registry uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import exclusive_offsets, item, require_elements
from contracts.spec import (
    INT,
    Earlier,
    KernelSpec,
    Role,
    at_least,
    constexpr,
    in_int64,
    power_of_two,
    ptr,
    require,
    require_fits,
    require_length,
    scalar,
)

I32, I64 = torch.int32, torch.int64
K10 = "compute_slot_mapping_kernel"


def scheduled_tokens(a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(request of each scheduled token, its global token index), for tokens in [qsl[0], qsl[R])."""
    qsl = a["query_start_loc_ptr"].to(torch.int64)
    lengths = torch.diff(qsl)
    tokens = torch.arange(int(qsl[0]), int(qsl[-1])) if qsl.numel() else torch.zeros(0, dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(lengths.numel()), lengths), tokens


def local_slots(a: Mapping[str, Any], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The §2.10 context-parallel split of ``positions`` (int64, >= 0): (virtual block index,
    offset inside the local block, whether this rank stores the token)."""
    kbs, w, rank, i = (a[n] for n in ("KV_CACHE_BLOCK_SIZE", "TOTAL_CP_WORLD_SIZE", "TOTAL_CP_RANK", "CP_KV_CACHE_INTERLEAVE_SIZE"))
    virtual = kbs * w
    vbi = positions // virtual
    vo = positions - vbi * virtual
    local = (vo // i) % w == rank
    lo = (vo // (w * i)) * i + vo % i
    return vbi, lo, local


def _preconditions(a: Mapping[str, Any]) -> None:
    qsl_t = a["query_start_loc_ptr"]
    require(qsl_t.numel() >= 1, K10, "query_start_loc_ptr", "must hold at least one element (num_reqs + 1)")
    qsl = exclusive_offsets(K10, "query_start_loc_ptr", qsl_t, qsl_t.numel())
    n, m = a["num_tokens"], a["max_num_tokens"]
    require(qsl[-1] <= n, K10, "num_tokens", f"must be >= query_start_loc[-1] = {qsl[-1]}, got {n}")
    require_length(K10, "positions_ptr", a["positions_ptr"], n)
    require_length(K10, "slot_mapping_ptr", a["slot_mapping_ptr"], max(m, qsl[-1]))
    for name in ("KV_CACHE_BLOCK_SIZE", "TOTAL_CP_WORLD_SIZE", "CP_KV_CACHE_INTERLEAVE_SIZE"):
        at_least(K10, name, a[name], 1)
    w, rank = a["TOTAL_CP_WORLD_SIZE"], a["TOTAL_CP_RANK"]
    require(0 <= rank < w, K10, "TOTAL_CP_RANK", f"must be in [0, TOTAL_CP_WORLD_SIZE={w}), got {rank}")
    kbs, i = a["KV_CACHE_BLOCK_SIZE"], a["CP_KV_CACHE_INTERLEAVE_SIZE"]
    in_int64(K10, "TOTAL_CP_WORLD_SIZE", kbs * w, "KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE")
    in_int64(K10, "CP_KV_CACHE_INTERLEAVE_SIZE", w * i, "TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE")
    power_of_two(K10, "BLOCK_SIZE", a["BLOCK_SIZE"])
    require_fits(K10, "PAD_ID", a["PAD_ID"], "slot_mapping_ptr", a["slot_mapping_ptr"])
    request, tokens = scheduled_tokens(a)
    if not tokens.numel():
        return
    positions = a["positions_ptr"][tokens].to(torch.int64)
    require(int(positions.min()) >= 0, K10, "positions_ptr", f"must hold positions >= 0 (C25), got {int(positions.min())}")
    vbi, _, local = local_slots(a, positions)
    # The virtual block index is not clamped: it may run into the next row, never past the table (C22).
    stride = a["block_table_stride"]
    if bool(local.any()):
        # request * stride + vbi is affine in each, so its corners bound it; in Python ints, since
        # int64 arithmetic wraps a huge stride onto a real element.
        rs, vs = request[local], vbi[local]
        corners = [r * stride + v for r in (int(rs.min()), int(rs.max())) for v in (int(vs.min()), int(vs.max()))]
        require(all(-(2**63) <= c < 2**63 for c in corners), K10, "block_table_ptr",
                f"is read at a flat index beyond int64 (row stride {stride}), which is not an element")
    flat = (request * stride + vbi)[local]
    require_elements(K10, "block_table_ptr", a["block_table_ptr"], flat, "a local token's block")


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    qsl = a["query_start_loc_ptr"].tolist()
    n, m = a["num_tokens"], a["max_num_tokens"]
    r = next((r for r in range(len(qsl) - 1) if qsl[r] <= index < qsl[r + 1]), None)
    if r is None:
        if n <= index < m:
            return f"slot {index} is in the tail [num_tokens={n}, max_num_tokens={m}): PAD_ID={a['PAD_ID']}"
        return f"slot {index} belongs to no request and is not in the tail [{n}, {m}): it must stay untouched"
    p = item(a["positions_ptr"], index)
    vbi, lo, local = (int(x) for x in local_slots(a, torch.tensor([p])))
    flat = r * a["block_table_stride"] + vbi
    table = f"block_table[{flat}]={item(a['block_table_ptr'], flat)}" if local else "another rank's token (PAD_ID)"
    return (
        f"request {r}, token {index - qsl[r]}: position={p}, virtual block {vbi}, local offset {lo}, {table}; "
        f"KBS={a['KV_CACHE_BLOCK_SIZE']} W={a['TOTAL_CP_WORLD_SIZE']} rank={a['TOTAL_CP_RANK']} I={a['CP_KV_CACHE_INTERLEAVE_SIZE']}"
    )


def _bind_0_30(a: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM 0.30.0's launch of K10 for a contract case: the attention block size equal to the KV cache
    block size and one block per KV block, as its call site passes them without a hybrid allocator.
    Then its block index is the virtual block (the local offset is below one block) and its slot
    block * block_size + local offset: the contract's (vllm/v1/worker/block_table.py in 0.30.0)."""
    return {**a, "block_size": a["KV_CACHE_BLOCK_SIZE"], "BLOCKS_PER_KV_BLOCK": 1}


def _predates_0_30(a: Mapping[str, Any]) -> str | None:
    """0.30.0 splits a local offset past the KV cache block (an interleave wider than the block, under
    context parallelism) into the next block-table entry; the contract's slot is block * KBS + offset."""
    _, tokens = scheduled_tokens(a)
    if not tokens.numel():
        return None
    _, lo, local = local_slots(a, a["positions_ptr"][tokens].to(torch.int64))
    past = bool((local & (lo >= a["KV_CACHE_BLOCK_SIZE"])).any())
    return "C22's slot of a local offset past its KV cache block (an interleave wider than the block)" if past else None


COMPUTE_SLOT_MAPPING = KernelSpec(
    name=K10,
    family="slot_mapping",
    # vLLM 0.30.0 (v1/worker/block_table.py) passed the attention block size and the blocks per KV
    # block beside KV_CACHE_BLOCK_SIZE; 0.32.0 passes KV_CACHE_BLOCK_SIZE alone.
    earlier=(Earlier("0.30.0", ("num_tokens", "max_num_tokens", "query_start_loc_ptr", "positions_ptr", "block_table_ptr",
                                "block_table_stride", "block_size", "slot_mapping_ptr", "KV_CACHE_BLOCK_SIZE",
                                "BLOCKS_PER_KV_BLOCK", "TOTAL_CP_WORLD_SIZE", "TOTAL_CP_RANK",
                                "CP_KV_CACHE_INTERLEAVE_SIZE", "PAD_ID", "BLOCK_SIZE"),
                     "block_size and BLOCKS_PER_KV_BLOCK beside KV_CACHE_BLOCK_SIZE", _bind_0_30, _predates_0_30),),
    qualname="vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel",
    params=(
        scalar("num_tokens", "positions.shape[0]; the tail starts here"),
        scalar("max_num_tokens", "max_num_batched_tokens; the tail ends here"),
        ptr("query_start_loc_ptr", INT, I32, "[num_reqs + 1] exclusive token offsets"),
        ptr("positions_ptr", INT, I64, "[num_tokens] position of each token"),
        ptr("block_table_ptr", INT, I32, "[max_num_reqs, max_blocks] block ids, rows of stride block_table_stride", contiguous=False, ndim=(2,)),
        scalar("block_table_stride", "row stride of the block table"),
        ptr("slot_mapping_ptr", INT, I64, "[max_num_tokens] KV slot per token", role=Role.OUT),
        constexpr("KV_CACHE_BLOCK_SIZE", "KBS"),
        constexpr("TOTAL_CP_WORLD_SIZE", "W, decode-context-parallel world size"),
        constexpr("TOTAL_CP_RANK", "RK, this rank"),
        constexpr("CP_KV_CACHE_INTERLEAVE_SIZE", "I, tokens per rank before the next rank's"),
        constexpr("PAD_ID", "slot of the tail and of other ranks' tokens (-1)"),
        constexpr("BLOCK_SIZE", "token tile (1024)"),
    ),
    # Canonical (num_reqs + 1,): one program per request plus the tail program.
    grid=lambda a: (a["query_start_loc_ptr"].numel(),),
    preconditions=_preconditions,
    explain=_explain,
    rule=lambda a, output, index, kind: "C22 padding tail" if index >= a["num_tokens"] else "C22 slot",
)

SPECS = (COMPUTE_SLOT_MAPPING,)
