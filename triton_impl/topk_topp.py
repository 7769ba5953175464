"""Triton kernel of the top-k/top-p mask, with vLLM 0.33.0's name, parameters and persistent grid
``(programs,)`` (docs/topk_topp.md, C35).

vLLM's body searches value pivots with an absolute tolerance (1e-9) and an 18-round cap. This one
finds C35's exact cut-offs over an order-preserving integer key of the float32 logits: the largest
key whose rank count (top-k) or integer mass (top-p) from the top reaches the target, by at most
33 halvings of the key range. With top-k, one pass copies the logits above a Gaussian guess at the
k-th into the row's workspace; when at least k pass, both bisections read only those candidates
(otherwise the whole row). Without top-k, top-p's candidates are the logits above a Gaussian guess
whose mass reaches p, or failing that every logit within 23 of the maximum (the rest weigh 0). The result depends on no
tile size and no workspace contents (it is written before it is read); vLLM's pivot tables go
unread. The row index is cast with ``tl.cast`` (the interpreter makes a ``tl.range`` variable a
Python int, on which vLLM's ``row_id.to(tl.int64)`` fails).
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl.gumbel import exp32


@triton.jit
def _key(x):
    # Order-preserving int64 key of a float32 (no NaN): -0.0 keyed as +0.0, so that equal
    # logits tie. Negative floats have their magnitude bits flipped; the map is its own inverse.
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit
def _moments(row, VOCAB_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # Mean and spread of the first tile's finite logits (the guesses' Gaussian model).
    offs = tl.arange(0, BLOCK_SIZE)
    x = tl.load(row + offs, mask=offs < VOCAB_SIZE, other=-float("inf"))
    live = x > -float("inf")
    m = tl.maximum(tl.sum(live.to(tl.float32)), 1.0)
    avg = tl.sum(tl.where(live, x, 0.0)) / m
    return avg, tl.sqrt(tl.maximum(tl.sum(tl.where(live, x * x, 0.0)) / m - avg * avg, 0.0))


@triton.jit
def _upper_quantile(q):
    # The standard normal's quantile of 1 - q for q in (0, 0.5] (Abramowitz and Stegun 26.2.23).
    t = tl.sqrt(-2.0 * tl.log(q))
    return t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308)))


@triton.jit
def _compact(row, scratch, floor, row_max, VOCAB_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, MASS: tl.constexpr):
    # Copies the logits above `floor`, in column order, into the workspace; returns their count and,
    # with MASS, their mass and the whole row's (Z without top-k).
    n = tl.zeros((), tl.int32)
    mass = tl.zeros((), tl.int64)
    total = tl.zeros((), tl.int64)
    for t in range(0, (VOCAB_SIZE + BLOCK_SIZE - 1) // BLOCK_SIZE):
        offs = t * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        inside = offs < VOCAB_SIZE
        x = tl.load(row + offs, mask=inside, other=-float("inf"))
        take = inside & (x > floor)
        tl.store(scratch + n + tl.cumsum(take.to(tl.int32), 0) - 1, x, mask=take)
        n += tl.sum(take.to(tl.int32))
        if MASS:
            w = tl.where(inside, _weight(x, row_max), 0)
            mass += tl.sum(tl.where(take, w, 0))
            total += tl.sum(w)
    return n, mass, total


@triton.jit
def _value(key):
    bits = key.to(tl.int32)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _weight(x, row_max):
    # C35: floor(exp32(x - max) * 2**32); the float32 product is exact, the cast floors.
    return (exp32(x - row_max) * 4294967296.0).to(tl.int64)


@triton.jit
def _need(p, total):
    # The smallest integer mass at least p * Z (float64, one rounding).
    need_f = p.to(tl.float64) * total.to(tl.float64)
    need = need_f.to(tl.int64)
    return tl.where(need.to(tl.float64) < need_f, need + 1, need)


@triton.jit
def _search(src, n, lo, hi, need, row_max, BLOCK_SIZE: tl.constexpr, MASS: tl.constexpr):
    # The largest key c in [lo, hi) whose weight from the top reaches `need`, among `src`'s n logits,
    # given that weight(key >= lo) reaches it and weight(key >= hi) does not; and weight(key > c). A
    # logit weighs 1 (a rank count, top-k) or its C35 weight (MASS, top-p).
    above = tl.zeros((), tl.int64)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        got = tl.zeros((), tl.int64)
        for t in range(0, tl.cdiv(n, BLOCK_SIZE)):
            offs = t * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            x = tl.load(src + offs, mask=offs < n, other=-float("inf"))
            live = (offs < n) & (_key(x) >= mid)
            if MASS:
                got += tl.sum(tl.where(live, _weight(x, row_max), 0))
            else:
                got += tl.sum(live.to(tl.int64))
        if got >= need:
            lo = mid
        else:
            hi = mid
            above = got
    return lo, above


@triton.jit
def _topk_topp_kernel(
    LOGITS,  # [B, V] float32, rows LOGITS_STRIDE_0 apart, masked in place
    LOGITS_STRIDE_0,
    BUFFER,  # [programs, V] workspace: a program's candidates, written before they are read
    PERCENTILE_TO_STD_TABLE,  # vLLM's pivot tables: unread here
    NORMAL_CDF_TO_SIGMA_TABLE,
    K,  # [B] int32, or anything when not TOPK_ENABLED
    P,  # [B] float32, or anything when not TOPP_ENABLED
    BATCH_SIZE,
    VOCAB_SIZE: tl.constexpr,
    MASK_VALUE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_SIZE_TRUNC: tl.constexpr,
    TOPK_ENABLED: tl.constexpr,
    TOPP_ENABLED: tl.constexpr,
    SPLIT_COVERS_PONLY: tl.constexpr,
):
    NUM_TILES: tl.constexpr = (VOCAB_SIZE + BLOCK_SIZE - 1) // BLOCK_SIZE
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    scratch = BUFFER + tl.cast(pid, tl.int64) * VOCAB_SIZE
    for row_id in tl.range(pid, BATCH_SIZE, num_programs):
        row = LOGITS + tl.cast(row_id, tl.int64) * LOGITS_STRIDE_0

        # The row's maximum, smallest and largest keys, and finite count.
        row_max = -float("inf")
        key_lo = tl.full((), 2**31, tl.int64)
        key_hi = tl.full((), -(2**31) - 1, tl.int64)
        finite = tl.zeros((), tl.int32)
        for t in range(0, NUM_TILES):
            offs = t * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
            inside = offs < VOCAB_SIZE
            x = tl.load(row + offs, mask=inside, other=-float("inf"))
            key = _key(x)
            row_max = tl.maximum(row_max, tl.max(x))
            key_lo = tl.minimum(key_lo, tl.min(tl.where(inside, key, 2**31)))
            key_hi = tl.maximum(key_hi, tl.max(tl.where(inside, key, -(2**31) - 1)))
            finite += tl.sum((inside & (x > -float("inf"))).to(tl.int32))

        # Which steps apply (reference/topk_topp.applies).
        k = tl.full((), VOCAB_SIZE, tl.int64)
        if TOPK_ENABLED:
            k = tl.load(K + row_id).to(tl.int64)
        do_topk = TOPK_ENABLED & (k < VOCAB_SIZE) & (finite > k)
        do_topp = False
        p = 1.0
        if TOPP_ENABLED:
            p = tl.load(P + row_id)
            do_topp = (p < 1.0) & (finite > 0)
            if SPLIT_COVERS_PONLY and TOPK_ENABLED:
                do_topp = do_topp & (k < VOCAB_SIZE)

        # The cut-off: values keyed above `pivot` are kept, and the first `ties` keyed at it. The
        # searches read `src`, `n` values: the row, or (with top-k) the workspace's compacted candidates.
        pivot = tl.full((), -(2**31) - 1, tl.int64)
        ties = tl.zeros((), tl.int64)
        src = row
        n = tl.full((), VOCAB_SIZE, tl.int32)
        if do_topk:
            # Candidates: the logits above a guess at the k-th (the Gaussian quantile of k / V from the
            # first tile, lowered by a margin), copied in column order into the row's workspace. When
            # at least k pass, every key down to the k-th is among them; otherwise the row is searched.
            # Speed only: any guess gives the same result.
            avg, std = _moments(row, VOCAB_SIZE, BLOCK_SIZE)
            z = _upper_quantile(tl.minimum(k.to(tl.float32) / VOCAB_SIZE, 0.5))
            guess = avg + std * (z - 0.15 * tl.abs(z))  # lowered by 15 %, as vLLM lowers its table's
            n, _, _ = _compact(row, scratch, guess, row_max, VOCAB_SIZE, BLOCK_SIZE, False)
            lo = key_lo
            if n >= k:
                src = scratch
                lo = _key(guess) + 1
            else:
                n = tl.full((), VOCAB_SIZE, tl.int32)
            pivot, above = _search(src, n, lo, key_hi + 1, k, row_max, BLOCK_SIZE, False)
            ties = k - above
        if do_topp:
            tie_weight = _weight(_value(pivot), row_max)
            if do_topk:
                # Z: the mass top-k kept, the candidates above its cut-off and `ties` of its weight.
                over = tl.zeros((), tl.int64)
                for t in range(0, tl.cdiv(n, BLOCK_SIZE)):
                    offs = t * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
                    x = tl.load(src + offs, mask=offs < n, other=-float("inf"))
                    over += tl.sum(tl.where((offs < n) & (_key(x) > pivot), _weight(x, row_max), 0))
                total = over + ties * tie_weight
                need = _need(p, total)
            else:
                # Candidates: the logits above a guess whose mass reaches p were the row Gaussian (its
                # softmax mass is then Gaussian with mean avg + std**2); the same pass sums Z. Short of
                # p: every logit within 23 of the maximum (below that a weight is 0), mass Z.
                avg, std = _moments(row, VOCAB_SIZE, BLOCK_SIZE)
                zp = tl.where(p >= 0.5, _upper_quantile(tl.maximum(1.0 - p, 1e-30)), -_upper_quantile(tl.minimum(p, 0.5)))
                floor = row_max - 23.0
                guess = avg + std * std - std * (1.15 * zp + 0.5)
                guess = tl.where((guess > floor) & (guess < row_max), guess, floor)
                n, over, total = _compact(row, scratch, guess, row_max, VOCAB_SIZE, BLOCK_SIZE, True)
                need = _need(p, total)
                if over < need:
                    guess = floor
                    n, over, total = _compact(row, scratch, guess, row_max, VOCAB_SIZE, BLOCK_SIZE, True)
                src = scratch
                pivot = _key(guess)
            if over >= need:
                pivot, above = _search(src, n, pivot + 1, key_hi + 1, need, row_max, BLOCK_SIZE, True)
                tie_weight = _weight(_value(pivot), row_max)
                ties = (need - above + tie_weight - 1) // tie_weight
            else:
                # The prefix reaches p among top-k's ties: fewer of them.
                ties = (need - over + tie_weight - 1) // tie_weight

        # Mask everything but the cut-off's survivors, ties taken in column order.
        if do_topk | do_topp:
            seen = tl.zeros((), tl.int64)
            for t in range(0, NUM_TILES):
                offs = t * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
                inside = offs < VOCAB_SIZE
                x = tl.load(row + offs, mask=inside, other=-float("inf"))
                key = _key(x)
                tie = (inside & (key == pivot)).to(tl.int64)
                rank = seen + tl.cumsum(tie, 0) - tie
                keep = (key > pivot) | ((tie != 0) & (rank < ties))
                tl.store(row + offs, tl.where(keep, x, MASK_VALUE), mask=inside)
                seen += tl.sum(tie)
