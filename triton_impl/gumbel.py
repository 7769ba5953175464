"""The random streams and numerics of Model Runner V2 as Triton device functions (reference/gumbel.py
is their specification), and probe kernels that store them so that tests compare them bit for bit.

Everything here runs interpreted (no libdevice: the interpreter cannot run it) and compiled. The
float32 transcendentals go through float64 and round once (C29); the Horner steps of the noise
polynomial are explicit ``tl.fma`` (one rounding whether or not the compiler fuses).
"""

from __future__ import annotations

import triton
import triton.language as tl

TL_RAND_MIN = tl.constexpr(4.6566127342e-10)


@triton.jit
def tl_rand32(seed, offset, includes_zero: tl.constexpr):
    u = tl.rand(seed, offset)
    if not includes_zero:
        u = tl.maximum(u, TL_RAND_MIN)
    return u


@triton.jit
def spec_step_seed(seed, step):
    return seed ^ (tl.cast(step, tl.int64) << 32)


@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _mix(h, key):
    key = _rotl(key * 0xCC9E2D51, 15) * 0x1B873593
    return _rotl(h ^ key, 13) * 5 + 0xE6546B64


@triton.jit
def murmur3_hash32(seed, pos, key, domain: tl.constexpr = 0):
    # All arithmetic in uint32 (wraps): seed words, the position's low word, the key.
    seed = tl.cast(seed, tl.int64)
    h = tl.cast(seed ^ seed, tl.uint32) ^ domain
    h = _mix(h, tl.cast(seed & 0xFFFFFFFF, tl.uint32))
    h = _mix(h, tl.cast((seed >> 32) & 0xFFFFFFFF, tl.uint32))
    h = _mix(h, tl.cast(tl.cast(pos, tl.int64) & 0xFFFFFFFF, tl.uint32))
    h = _mix(h, tl.cast(key, tl.uint32))
    h = h ^ 16
    h = (h ^ (h >> 16)) * 0x85EBCA6B
    h = (h ^ (h >> 13)) * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def murmur3_uniform32(seed, pos, key):
    h = murmur3_hash32(seed, pos, key)
    hi = tl.cast(h >> 16, tl.int32).to(tl.float32) * 1.52587890625e-05  # 2^-16, exact
    lo = (tl.cast(h & 0xFFFF, tl.int32).to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 2^-32, exact
    return hi + lo


@triton.jit
def murmur3_uniform64(seed, pos, key):
    lo = tl.cast(murmur3_hash32(seed, pos, key), tl.uint64)
    hi = tl.cast(murmur3_hash32(seed, pos, key, domain=0x9E3779B9), tl.uint64)
    r = ((hi << 32) | lo) >> 11
    u = (tl.cast(r, tl.int64).to(tl.float64) + 0.5) * 1.1102230246251565e-16  # 2^-53
    return tl.where(u == 1.0, u - 1.1102230246251565e-16, u)


@triton.jit
def exp32(x):
    return tl.exp(x.to(tl.float64)).to(tl.float32)


@triton.jit
def log32(x):
    return tl.log(x.to(tl.float64)).to(tl.float32)


@triton.jit
def log1p64(x):
    # log1p without libdevice: log(1 + x) corrected by the rounding of 1 + x (Goldberg).
    one_plus = 1.0 + x
    exact = (one_plus == 1.0) | (one_plus == float("inf"))  # log1p(x) = x there (and inf at inf)
    safe = tl.where(exact, 2.0, one_plus)
    return tl.where(exact, x, tl.log(safe) * (x / (safe - 1.0)))


@triton.jit
def log1p32(x):
    return log1p64(x.to(tl.float64)).to(tl.float32)


@triton.jit
def log1p_neg32(u):
    p = tl.full(u.shape, 0.125, tl.float32)
    p = tl.fma(u, p, 1.0 / 7.0)
    p = tl.fma(u, p, 1.0 / 6.0)
    p = tl.fma(u, p, 1.0 / 5.0)
    p = tl.fma(u, p, 1.0 / 4.0)
    p = tl.fma(u, p, 1.0 / 3.0)
    p = tl.fma(u, p, 1.0 / 2.0)
    p = tl.fma(u, p, 1.0)
    series = -u * p
    direct = log32(tl.maximum(1.0 - u, 5.960464477539063e-08))
    return tl.where(u < 0.25, series, direct)


@triton.jit
def gumbel32(u):
    return -log32(-log1p_neg32(u))


@triton.jit
def gumbel64(u):
    return -tl.log(-tl.log(u))


# -- probes: the primitives above, stored, for tests --------------------------------------------------
@triton.jit
def _philox_probe_kernel(out_ptr, seed_ptr, offset_ptr, n, STEP: tl.constexpr, INCLUDES_ZERO: tl.constexpr,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    if STEP >= 0:
        seed = spec_step_seed(seed, STEP)
    offset = tl.load(offset_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, tl_rand32(seed, offset, INCLUDES_ZERO), mask=mask)


@triton.jit
def _murmur3_probe_kernel(hash_ptr, u32_ptr, u64_ptr, noise32_ptr, noise64_ptr, seed_ptr, pos_ptr, key_ptr, n,
                          BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    pos = tl.load(pos_ptr + i, mask=mask, other=0)
    key = tl.load(key_ptr + i, mask=mask, other=0)
    tl.store(hash_ptr + i, tl.cast(murmur3_hash32(seed, pos, key), tl.int64), mask=mask)
    u32 = murmur3_uniform32(seed, pos, key)
    u64 = murmur3_uniform64(seed, pos, key)
    tl.store(u32_ptr + i, u32, mask=mask)
    tl.store(u64_ptr + i, u64, mask=mask)
    tl.store(noise32_ptr + i, gumbel32(u32), mask=mask)
    tl.store(noise64_ptr + i, gumbel64(u64), mask=mask)


@triton.jit
def _numerics_probe_kernel(exp_ptr, log_ptr, log1p_ptr, x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=1.0)
    tl.store(exp_ptr + i, exp32(x), mask=mask)
    tl.store(log_ptr + i, log32(tl.abs(x)), mask=mask)
    tl.store(log1p_ptr + i, log1p32(tl.maximum(x, -1.0)), mask=mask)


SUM_SCALE = tl.constexpr(70368744177664.0)  # 2^46 (C29)


@triton.jit
def exact_sum(terms):
    """The C29 sum of a tile of float32 terms in [0, 1]: exact in units of 2^-46 (int64), then
    rounded to float32 through float64."""
    fixed = (terms.to(tl.float64) * SUM_SCALE).to(tl.int64)
    return (tl.sum(fixed, axis=0).to(tl.float64) * (1.0 / SUM_SCALE)).to(tl.float32)


@triton.jit
def max_and_sumexp(x):
    m = tl.max(x, axis=0)
    live = m > float("-inf")
    e = exp32(x - tl.where(live, m, 0.0))
    return m, tl.where(live, exact_sum(tl.where(live, e, 0.0)), 0.0)
