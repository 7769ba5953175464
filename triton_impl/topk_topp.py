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
    # At most 1: the split kernels take the maximum from a workspace, which may hold anything.
    return (tl.minimum(exp32(x - row_max), 1.0) * 4294967296.0).to(tl.int64)


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


# The split top-p pipeline (C36; reference/topk_topp.py states each word of the workspace). Grid
# (B * S,): program pid takes slice pid % S of row pid // S. The workspace is float32 storage of
# int32 words, bitcast both ways.
KEY_NEG_INF = tl.constexpr(-2139095041)
KEY_MAX = tl.constexpr(0x7F7FFFFF)
KEY_POS_INF = tl.constexpr(0x7F800000)
INT32_MIN = tl.constexpr(-(2**31))
INT32_MAX = tl.constexpr(2**31 - 1)
MASS_MAX = tl.constexpr(2**53)
MAX_PASSES = tl.constexpr(64)


@triton.jit
def _word(ptr):
    return tl.load(ptr).to(tl.int32, bitcast=True).to(tl.int64)


@triton.jit
def _put(ptr, value, mask=None):
    tl.store(ptr, value.to(tl.int32).to(tl.float32, bitcast=True), mask=mask)


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo), hi)


@triton.jit
def _split_slice(pid, S: tl.constexpr, VOCAB_SIZE: tl.constexpr):
    # (row, slice, first column, end column) of a program.
    SLICE: tl.constexpr = (VOCAB_SIZE + S - 1) // S
    me = pid % S
    start = tl.minimum(me * SLICE, VOCAB_SIZE)
    return pid // S, me, start, tl.minimum(start + SLICE, VOCAB_SIZE)


@triton.jit
def _split_owned(K, P, row, HAS_K: tl.constexpr, VOCAB_SIZE: tl.constexpr):
    p = tl.load(P + row)
    own = p < 1.0
    if HAS_K:
        own = own & (tl.load(K + row) >= VOCAB_SIZE)
    return own, p


@triton.jit
def _split_start(STATS, row, S: tl.constexpr):
    # The search's range from STATS: [smallest finite key, largest key] over the row's slices.
    w = STATS + tl.cast(row, tl.int64) * S * 4 + tl.arange(0, S) * 4
    hi = _clamp(tl.max(tl.load(w).to(tl.int32, bitcast=True).to(tl.int64)), KEY_NEG_INF, KEY_MAX)
    lo = _clamp(tl.min(tl.load(w + 1).to(tl.int32, bitcast=True).to(tl.int64)), KEY_NEG_INF + 1, hi)
    return lo, hi


@triton.jit
def _split_partials(src, start, end, lo, hi, m, F: tl.constexpr, BLOCK: tl.constexpr):
    # Mass, smallest and largest key of the finite logits of columns [start, end) in each of 3F/4
    # equal bins of [lo, hi] (bins F*3/4 .. F - 1 stay empty).
    NB: tl.constexpr = 3 * F // 4
    b = tl.arange(0, F)
    mass = tl.zeros([F], tl.int64)
    mn = tl.full([F], INT32_MAX, tl.int64)
    mx = tl.full([F], INT32_MIN, tl.int64)
    width = hi - lo + 1
    for i in range(start, end, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < end, other=-float("inf"))
        k = _key(x)
        live = (x > -float("inf")) & (k >= lo) & (k <= hi)
        hit = live[None, :] & ((((k - lo) * NB) // width)[None, :] == b[:, None])
        w = tl.where(live, _weight(x, m), 0)
        mass += tl.sum(tl.where(hit, w[None, :], 0), axis=1)
        mn = tl.minimum(mn, tl.min(tl.where(hit, k[None, :], INT32_MAX), axis=1))
        mx = tl.maximum(mx, tl.max(tl.where(hit, k[None, :], INT32_MIN), axis=1))
    return mass, mn, mx


@triton.jit
def _split_records(PARTS, base, S: tl.constexpr, F: tl.constexpr):
    # Round records of S slices from word `base`: [S, F] masses, smallest and largest keys.
    NB: tl.constexpr = 3 * F // 4
    b = tl.arange(0, F)[None, :]
    ok = (b < NB) & (tl.arange(0, S)[:, None] >= 0)
    w = PARTS + base + tl.arange(0, S)[:, None] * (F * 3) + b * 4
    low = tl.load(w, mask=ok, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
    high = tl.load(w + 1, mask=ok, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
    mn = tl.load(w + 2, mask=ok, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
    mx = tl.load(w + 3, mask=ok, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
    mass = _clamp(high * 4294967296 + (low & 0xFFFFFFFF), 0, MASS_MAX)
    return tl.where(ok, mass, 0), tl.where(ok, mn, INT32_MAX), tl.where(ok, mx, INT32_MIN)


@triton.jit
def _split_combine(mass_s, mn_s, mx_s, me, status, lo, hi, m, p, need, above, cut, keep, before,
                   SL: tl.constexpr, F: tl.constexpr):
    # One round of the search (reference/topk_topp.Search.combine) over SL slices' records; a row
    # whose search has ended (status 1: found, 2: none) passes through unchanged.
    b = tl.arange(0, F)
    mass = tl.sum(mass_s, axis=0)
    searching = status == 0
    need = tl.where(searching & (need < 0), _need(p, above + tl.sum(mass)), need)
    over = above + tl.sum(tl.where(b[None, :] > b[:, None], mass[None, :], 0), axis=1)
    pick = tl.max(tl.where((mass > 0) & (over + mass >= need), b, -1))
    sel = b == pick
    new_lo = _clamp(tl.min(tl.where(sel, tl.min(mn_s, axis=0), INT32_MAX)), lo, hi)
    new_hi = _clamp(tl.max(tl.where(sel, tl.max(mx_s, axis=0), INT32_MIN)), new_lo, hi)
    new_above = tl.sum(tl.where(sel, over, 0))
    w = _weight(_value(new_lo), m)
    ties = tl.sum(tl.where(sel[None, :], mass_s, 0), axis=1) // tl.maximum(w, 1)
    ties = tl.where(w > 0, ties, 0)
    room = need - 1 - new_above
    new_keep = tl.where((room < 0) | (w == 0), 0, tl.minimum(tl.sum(ties), room // tl.maximum(w, 1) + 1))
    ends = new_lo == new_hi
    go = searching & (pick >= 0)
    status = tl.where(searching & (pick < 0), 2, tl.where(go & ends, 1, status))
    cut = tl.where(go & ends, new_lo, cut)
    keep = tl.where(go & ends, new_keep, keep)
    before = tl.where(go & ends, tl.sum(tl.where(tl.arange(0, SL) < me, ties, 0)), before)
    return status, tl.where(go, new_lo, lo), tl.where(go, new_hi, hi), need, tl.where(go, new_above, above), cut, keep, before


@triton.jit
def _topp_sb_stats_kernel(LOGITS, LOGITS_STRIDE_0, STATS, K, P, HAS_K: tl.constexpr, VOCAB_SIZE: tl.constexpr,
                          S: tl.constexpr, BLOCK: tl.constexpr):
    row, me, start, end = _split_slice(tl.program_id(0), S, VOCAB_SIZE)
    own, p = _split_owned(K, P, row, HAS_K, VOCAB_SIZE)
    if own:
        src = LOGITS + tl.cast(row, tl.int64) * LOGITS_STRIDE_0
        top = tl.full((), KEY_NEG_INF, tl.int64)
        bottom = tl.full((), KEY_POS_INF, tl.int64)
        for i in range(start, end, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            x = tl.load(src + offs, mask=offs < end, other=-float("inf"))
            k = _key(x)
            top = tl.maximum(top, tl.max(k))
            bottom = tl.minimum(bottom, tl.min(tl.where(x > -float("inf"), k, KEY_POS_INF)))
        w = STATS + (tl.cast(row, tl.int64) * S + me) * 4
        _put(w, top)
        _put(w + 1, bottom)
        _put(w + 2, top * 0)
        _put(w + 3, top * 0)


@triton.jit
def _split_replay(PARTS, row, me, rounds, lo, hi, m, p, S: tl.constexpr, F: tl.constexpr, NUM_ROUNDS: tl.constexpr):
    # The row's search after the records of rounds 0 .. rounds - 1.
    status = tl.zeros((), tl.int32)
    need = tl.full((), -1, tl.int64)
    above = tl.zeros((), tl.int64)
    cut = tl.zeros((), tl.int64)
    keep = tl.zeros((), tl.int64)
    before = tl.zeros((), tl.int64)
    for j in range(0, rounds):
        if status == 0:
            mass, mn, mx = _split_records(PARTS, ((tl.cast(row, tl.int64) * NUM_ROUNDS + j) * S) * F * 3, S, F)
            status, lo, hi, need, above, cut, keep, before = _split_combine(
                mass, mn, mx, me, status, lo, hi, m, p, need, above, cut, keep, before, S, F)
    return status, lo, hi, need, above, cut, keep, before


@triton.jit
def _topp_sb_step_kernel(LOGITS, LOGITS_STRIDE_0, STATS, PARTS, K, P, ROUND, HAS_K: tl.constexpr, S: tl.constexpr,
                         F: tl.constexpr, NUM_ROUNDS: tl.constexpr, VOCAB_SIZE: tl.constexpr, BLOCK: tl.constexpr):
    row, me, start, end = _split_slice(tl.program_id(0), S, VOCAB_SIZE)
    own, p = _split_owned(K, P, row, HAS_K, VOCAB_SIZE)
    lo, hi = _split_start(STATS, row, S)
    if own & (hi != KEY_NEG_INF):
        m = _value(hi)
        status, lo, hi, need, above, cut, keep, before = _split_replay(PARTS, row, me, ROUND, lo, hi, m, p, S, F, NUM_ROUNDS)
        slot = PARTS + ((tl.cast(row, tl.int64) * NUM_ROUNDS + ROUND) * S + me) * F * 3
        src = LOGITS + tl.cast(row, tl.int64) * LOGITS_STRIDE_0
        if status == 0:
            if ROUND == NUM_ROUNDS - 1:
                # The last round finishes the search over the whole row, pass after pass.
                passes = 0
                while (status == 0) & (passes < MAX_PASSES):
                    mass, mn, mx = _split_partials(src, 0, VOCAB_SIZE, lo, hi, m, F, BLOCK)
                    status, lo, hi, need, above, cut, keep, before = _split_combine(
                        mass[None, :], mn[None, :], mx[None, :], 0, status, lo, hi, m, p, need, above, cut, keep, before, 1, F)
                    passes += 1
                ties = tl.zeros((), tl.int64)
                for i in range(0, start, BLOCK):
                    offs = i + tl.arange(0, BLOCK)
                    x = tl.load(src + offs, mask=offs < start, other=-float("inf"))
                    ties += tl.sum(((offs < start) & (_key(x) == cut)).to(tl.int64))
                found = status == 1
                i = tl.arange(0, 4 * F)
                rec = tl.where(i == 0, tl.where(found, 1, 2), 0)
                rec = tl.where(found & (i == 1), cut, rec)
                rec = tl.where(found & (i == 2), keep, rec)
                rec = tl.where(found & (i == 3), ties, rec)
                _put(slot + i, rec, mask=i < 3 * F)
            else:
                NB: tl.constexpr = 3 * F // 4
                mass, mn, mx = _split_partials(src, start, end, lo, hi, m, F, BLOCK)
                b = tl.arange(0, F)
                _put(slot + b * 4, mass & 0xFFFFFFFF, mask=b < NB)
                _put(slot + b * 4 + 1, mass >> 32, mask=b < NB)
                _put(slot + b * 4 + 2, mn, mask=b < NB)
                _put(slot + b * 4 + 3, mx, mask=b < NB)


@triton.jit
def _topp_sb_mask_kernel(LOGITS, LOGITS_STRIDE_0, STATS, PARTS, K, P, HAS_K: tl.constexpr, MASK_VALUE: tl.constexpr,
                         S: tl.constexpr, F: tl.constexpr, NUM_ROUNDS: tl.constexpr, VOCAB_SIZE: tl.constexpr,
                         BLOCK: tl.constexpr):
    row, me, start, end = _split_slice(tl.program_id(0), S, VOCAB_SIZE)
    own, p = _split_owned(K, P, row, HAS_K, VOCAB_SIZE)
    lo, hi = _split_start(STATS, row, S)
    if own & (hi != KEY_NEG_INF):
        m = _value(hi)
        status, lo, hi, need, above, cut, keep, before = _split_replay(
            PARTS, row, me, NUM_ROUNDS - 1, lo, hi, m, p, S, F, NUM_ROUNDS)
        if status == 0:
            slot = PARTS + ((tl.cast(row, tl.int64) * NUM_ROUNDS + NUM_ROUNDS - 1) * S + me) * F * 3
            status = tl.where(_word(slot) == 1, 1, 2)
            cut = _word(slot + 1)
            keep = _word(slot + 2)
            before = _word(slot + 3)
        if status == 1:
            src = LOGITS + tl.cast(row, tl.int64) * LOGITS_STRIDE_0
            seen = before
            for i in range(start, end, BLOCK):
                offs = i + tl.arange(0, BLOCK)
                inside = offs < end
                x = tl.load(src + offs, mask=inside, other=-float("inf"))
                k = _key(x)
                tie = (inside & (k == cut)).to(tl.int64)
                rank = tl.cumsum(tie, 0) - tie + seen
                kept = (k > cut) | ((tie != 0) & (rank < keep))
                tl.store(src + offs, tl.where(kept, x, MASK_VALUE), mask=inside)
                seen += tl.sum(tie)
