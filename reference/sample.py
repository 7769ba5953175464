"""The oracle of Model Runner V2's sampling parameters (docs/sample.md, C41): the readable
specification.

Row ``r`` (a token) takes the parameters of request state ``expanded_idx_mapping[r]`` and changes
only its first ``vocab_size`` columns, in place.

``_temperature_kernel``: a temperature of 0 (greedy; -0.0 too) or 1 leaves the row alone; any other
divides every logit by it, rounded once (IEEE float32 division: NaN, infinite and negative
temperatures divide like any other).

``_min_p_kernel``: a min-p of 0 leaves the row alone; any other masks to -inf every logit below the
threshold ``max(row) + log(min_p)``, one float32 addition of C29's ``log32`` (so min-p 1 keeps the
maximum's ties, above 1 masks the whole row, and a negative or NaN min-p, whose log is NaN, masks
nothing). A row of -inf only stays as it is.

``_gumbel_sample_kernel``: for row ``r`` of request state ``s`` (negative: a padding row, which
reads no state and draws no noise) and every tile of ``BLOCK_SIZE`` columns, the tile's Gumbel-max
winner and its score. The logits are read as float32 (``-0.0`` as ``+0.0``, C30), divided by the
temperature when ``APPLY_TEMPERATURE`` and the temperature is not 0, widened to float64 with
``USE_FP64``; at a temperature other than 0 each column ``c`` adds the noise of the murmur3 stream
at (seed, position, c) (C29's float32 ``-log(-log(1 - u))``, or float64 ``-log(-log(u))``), the
position salted by ``2**30`` when ``IS_DRAFTING`` and the seed by the cache column
(``spec_step_seed``) when the draft-logits cache is written. Columns past ``V`` score -inf; a tile's
winner is its first maximum. With the cache, a request's row first copies its raw logits
(``logits_cache_source_ptr``) into the cache at its state and column.
"""

from __future__ import annotations

import torch

from contracts import sample as contract
from reference import gumbel


def _temperature_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    for r in range(contract.rows(locals())):
        t = temperature_ptr[int(expanded_idx_mapping_ptr[r])]
        if t == 0.0 or t == 1.0:
            continue
        row = logits_ptr[r, :vocab_size]
        row.copy_(row / t)


def _min_p_kernel(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    min_p_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    for r in range(contract.rows(locals())):
        p = min_p_ptr[int(expanded_idx_mapping_ptr[r])]
        if p == 0.0 or vocab_size == 0:
            continue
        row = logits_ptr[r, :vocab_size]
        threshold = contract.min_p_threshold(row.max(), p)
        row.masked_fill_(row < threshold, float("-inf"))


def _gumbel_sample_kernel(
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    IS_DRAFTING: bool,
    APPLY_TEMPERATURE: bool,
    USE_FP64: bool,
    PER_TOKEN_COL: bool,
) -> None:
    a = locals()
    nb = contract.tiles(a)
    for r in range(contract.rows(a)):
        s = int(expanded_idx_mapping_ptr[r])
        if logits_cache_ptr is not None and s >= 0:
            at = contract.cache_offset(a, r)
            logits_cache_ptr.view(-1)[at : at + vocab_size] = logits_cache_source_ptr[r, :vocab_size]
        tiles = gumbel_scores(a, r)
        best = tiles.argmax(-1)  # the first index of each tile's maximum
        local_argmax_ptr[r, :nb] = torch.arange(nb) * BLOCK_SIZE + best
        local_max_ptr[r, :nb] = tiles.gather(1, best[:, None])[:, 0].to(local_max_ptr.dtype)


def gumbel_scores(a: dict, r: int) -> torch.Tensor:
    """K38's scores of row ``r``, tile by tile (``[NB, BLOCK_SIZE]``, -inf past V)."""
    v, block = a["vocab_size"], a["BLOCK_SIZE"]
    nb = contract.tiles(a)
    cols = torch.arange(nb * block)
    s = int(a["expanded_idx_mapping_ptr"][r])
    temp = a["temp_ptr"][s] if s >= 0 else torch.tensor(0.0)
    seed = a["seeds_ptr"][s] if s >= 0 else torch.tensor(0, dtype=torch.int64)
    if a["logits_cache_ptr"] is not None:
        col = int(a["logits_cache_col_ptr"].reshape(-1)[r if a["PER_TOKEN_COL"] else 0])
        seed = gumbel.spec_step_seed(seed, col)
    x = torch.full((nb * block,), float("-inf"), dtype=torch.float32)
    x[:v] = a["logits_ptr"][r, :v].to(torch.float32) + 0.0  # -0.0 reads as +0.0 (C30)
    if temp != 0.0 and a["APPLY_TEMPERATURE"]:
        x = x / temp
    if a["USE_FP64"]:
        x = x.to(torch.float64)
    if temp != 0.0:
        pos = torch.tensor(int(a["pos_ptr"][r]) + (contract.DRAFT_NOISE_SALT if a["IS_DRAFTING"] else 0), dtype=torch.int64)
        if a["USE_FP64"]:
            noise = gumbel.gumbel64(gumbel.murmur3_uniform64(seed, pos, cols))
        else:
            noise = gumbel.gumbel32(gumbel.murmur3_uniform32(seed, pos, cols))
        x = torch.where(cols < v, x + noise, float("-inf"))
    return x.view(nb, block)
