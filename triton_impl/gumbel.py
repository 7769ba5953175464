"""The random streams and numerics of Model Runner V2 as Triton device functions (reference/gumbel.py
is their specification), and probe kernels that store them so that tests compare them bit for bit.

Everything here runs interpreted (no libdevice: the interpreter cannot run it) and compiled. The
float32 transcendentals are C29's specified algorithms in float32; every multiply-add is an explicit
``tl.fma`` (one rounding whether or not the compiler fuses), and no other product feeds an addition
(the compiler would be free to fuse it).
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
def _exp_reduced(x):
    # exp32's range reduction and polynomial (reference/gumbel.py): exp(x) = p 2^k, p in [0.7, 1.42].
    t = tl.fma(x, 1.4426950408889634, 12582912.0)
    k = t.to(tl.int32, bitcast=True) - 0x4B400000
    kf = t - 12582912.0
    r = tl.fma(kf, -0.693145751953125, x)
    r = tl.fma(kf, -1.4286068203094173e-06, r)
    p = tl.full(x.shape, 1.0 / 5040.0, tl.float32)
    p = tl.fma(p, r, 1.0 / 720.0)
    p = tl.fma(p, r, 1.0 / 120.0)
    p = tl.fma(p, r, 1.0 / 24.0)
    p = tl.fma(p, r, 1.0 / 6.0)
    p = tl.fma(p, r, 0.5)
    p = tl.fma(p, r, 1.0)
    p = tl.fma(p, r, 1.0)
    return p, k


@triton.jit
def _exp_clamped(xc):
    # p 2^k of _exp_reduced for xc in exp32's clamped range, 2^k as two multiplies by powers of two:
    # p 2^(k >> 1) is exact, and the second multiply is exact where the result is normal (the
    # specification's exponent-field add gives the same bits there) and rounds once where it is not.
    p, k = _exp_reduced(xc)
    k1 = k >> 1
    return (p * ((k1 + 127) << 23).to(tl.float32, bitcast=True)) * ((k - k1 + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def exp32(x):
    # C29's exp (reference/gumbel.py states the algorithm): every step rounds once, and every product
    # that is added is an explicit fma, so the compiler's contraction cannot change a bit.
    x = x.to(tl.float32)
    xc = tl.where(x != x, 0.0, tl.where(x < -104.0, -104.0, tl.where(x > 89.0, 89.0, x)))
    return tl.where(x != x, x, _exp_clamped(xc))


@triton.jit
def exp32_nonpositive(x):
    # exp32 of x <= 0 or -inf (never NaN), for callers that know their arguments are (K15's
    # probabilities): the same bits without the NaN selects and the upper clamp.
    return _exp_clamped(tl.maximum(x.to(tl.float32), -104.0))


@triton.jit
def _log_core(b, bias):
    # C29's log of the float with bits b, whose exponent field minus `bias` is its exponent (127 for
    # a positive normal float; log32 scales subnormals by 2^23 first). No special values.
    e = (b >> 23) - bias
    mb = (b & 0x7FFFFF) | 0x3F800000
    big = mb > 0x3FB504F3
    f = tl.where(big, mb - 8388608, mb).to(tl.float32, bitcast=True) - 1.0
    ef = (e + big.to(tl.int32)).to(tl.float32)
    s = tl.math.div_rn(f, 2.0 + f)  # div_rn: the GPU's default division is not correctly rounded
    z = s * s
    q = tl.full(f.shape, 2.0 / 11.0, tl.float32)
    q = tl.fma(q, z, 2.0 / 9.0)
    q = tl.fma(q, z, 2.0 / 7.0)
    q = tl.fma(q, z, 2.0 / 5.0)
    q = tl.fma(q, z, 2.0 / 3.0)
    return tl.fma(ef, 0.693145751953125, tl.fma(ef, 1.4286068203094173e-06, tl.fma(-s, tl.fma(-z, q, f), f)))


@triton.jit
def log32_normal(x):
    # log32 of a positive normal float32 (the callers know it is one): the same bits, fewer steps.
    return _log_core(x.to(tl.int32, bitcast=True), 127)


@triton.jit
def log32(x):
    # C29's log (reference/gumbel.py).
    x = x.to(tl.float32)
    sub = x < 1.1754943508222875e-38
    y = _log_core(tl.where(sub, x * 8388608.0, x).to(tl.int32, bitcast=True), tl.where(sub, 150, 127))
    y = tl.where(x > 0.0, y, tl.where(x == 0.0, float("-inf"), float("nan")))
    return tl.where(x == float("inf"), x, y)


@triton.jit
def log1p32(x):
    # C29's log1p (reference/gumbel.py): log32(1 + x) plus the rounding error of 1 + x over 1 + x.
    x = x.to(tl.float32)
    u = 1.0 + x
    c = x - (u - 1.0)
    y = log32(u) + tl.where(c == 0.0, 0.0, tl.math.div_rn(c, tl.where(u == 0.0, 1.0, u)))
    return tl.where((x == float("inf")) | (x != x), x, y)


@triton.jit
def log1p32_negative(x):
    # log1p32 of x in (-1, 0]: 1 + x is then positive and normal (at least 2^-24).
    u = 1.0 + x
    c = x - (u - 1.0)
    return log32_normal(u) + tl.where(c == 0.0, 0.0, tl.math.div_rn(c, u))


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
    direct = log32_normal(tl.maximum(1.0 - u, 5.960464477539063e-08))
    return tl.where(u < 0.25, series, direct)


@triton.jit
def gumbel32(u):
    # u is a murmur3 uniform, at least 2^-33: -log(1 - u) is positive and normal.
    return -log32_normal(-log1p_neg32(u))


@triton.jit
def gumbel64(u):
    return -tl.log(-tl.log(u))



# -- upper bounds: the lanes K17 need not score (csrc/vmath.h states them; tests/test_gumbel.py
# checks the port's on every input and these against the port's bits). Not C29: no output takes
# their bits, only the fact that they bound.
@triton.jit
def log2_below(x):
    # About log2(x), from below, for positive normal x (Mitchell's approximation, low by < 0.0861).
    return tl.fma(x.to(tl.int32, bitcast=True).to(tl.float32), 1.1920928955078125e-07, -127.0)  # 2^-23


@triton.jit
def gumbel32_above(h):
    # At least gumbel32 of the uniform of hash h.
    u = (h >> 1).to(tl.int32, bitcast=True).to(tl.float32) * 4.656612873077393e-10  # 2^-31, exact
    w = tl.maximum(1.0 - u, 5.960464477539063e-08)
    t0 = tl.fma(log2_below(w), -0.6931471805599453, -0.059679970145225525)  # the port's float32 ln2 * 0.0861
    return tl.fma(log2_below(tl.maximum(t0, u)), -0.6931471805599453, 0.0009765625)


@triton.jit
def residual_above(d):
    # At least log1p32_negative(-exp32(d)) wherever exp32(d) < 1, -inf where d is not negative.
    c = tl.maximum(-d, 0.0009765625)  # 2^-10; a NaN d gives -inf below either way
    b = tl.fma(log2_below(c), 0.6931471805599453, 0.060656532645225525)  # ln2 * 0.0861 + 2^-10, float32
    return tl.where(d < 0.0, tl.minimum(b, 0.0), float("-inf"))

# -- probes: the primitives above, stored, for tests --------------------------------------------------
@triton.jit
def philox_probe_kernel(out_ptr, seed_ptr, offset_ptr, n, STEP: tl.constexpr, INCLUDES_ZERO: tl.constexpr,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    seed = tl.load(seed_ptr + i, mask=mask, other=0)
    if STEP >= 0:
        seed = spec_step_seed(seed, STEP)
    offset = tl.load(offset_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, tl_rand32(seed, offset, INCLUDES_ZERO), mask=mask)


@triton.jit
def murmur3_probe_kernel(hash_ptr, u32_ptr, u64_ptr, noise32_ptr, noise64_ptr, seed_ptr, pos_ptr, key_ptr, n,
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
def bounds_probe_kernel(noise_ptr, residual_ptr, h_ptr, d_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    h = tl.load(h_ptr + i, mask=mask, other=0).to(tl.uint32)
    tl.store(noise_ptr + i, gumbel32_above(h), mask=mask)
    tl.store(residual_ptr + i, residual_above(tl.load(d_ptr + i, mask=mask, other=0.0)), mask=mask)

@triton.jit
def numerics_probe_kernel(exp_ptr, log_ptr, log1p_ptr, x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=1.0)
    tl.store(exp_ptr + i, exp32(x), mask=mask)
    tl.store(log_ptr + i, log32(tl.abs(x)), mask=mask)
    tl.store(log1p_ptr + i, log1p32(tl.where(x < -1.0, -1.0, x)), mask=mask)  # NaN stays NaN


@triton.jit
def reciprocal(t):
    # RN(1 / t) for div_by where t is in [2^-20, 2^20] (a per-program value: temperatures), else
    # NaN, which sends div_by to the general division.
    ok = (t >= 9.5367431640625e-07) & (t <= 1048576.0)
    return tl.where(ok, tl.math.div_rn(1.0, tl.where(ok, t, 1.0)), float("nan"))


@triton.jit
def div_by_lanes(x, t, t_inv):
    # RN(x / t) for every lane of x in range (C6: correctly rounded), in three float32 steps instead
    # of a division per element (a reciprocal approximation, refinement and a check for the slow
    # path each): with t_inv = RN(1 / t), q = RN(x t_inv) is within an ulp of x / t, the remainder
    # x - q t is exact (one fma), and q + rem t_inv rounded once is RN(x / t) (Markstein's theorem),
    # unless a step leaves the normal range: |x| in (0, 2^-100) or (2^100, inf), or t outside
    # [2^-20, 2^20] (t_inv is then NaN). Zeros and infinities take q (exact for them). Returns the
    # quotients and the lanes out of range, which the caller must divide again with div_rn.
    # The ranges on |x|'s bits, one unsigned compare each: [2^-100, 2^100] is [0x0D800000, 0x71800000],
    # finite and nonzero is [1, 0x7F7FFFFF] (float compares took twice the instructions).
    q = x * t_inv
    a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    normal = (a - 0x0D800000).to(tl.uint32, bitcast=True) <= 0x64000000
    odd = ~normal & ((a - 1).to(tl.uint32, bitcast=True) < 0x7F7FFFFF)
    return tl.where(normal, tl.fma(tl.fma(-q, t, x), t_inv, q), q), odd


@triton.jit
def div_in_range(x, t, t_inv):
    # div_by_lanes' quotients where no lane of x is out of its range (out_of_range found none): the
    # zeros and infinities (which take q) told apart by float compares, not by the integer tests
    # that found the range, so the compiler cannot keep those tests' per-lane results alive from
    # the check to here as common subexpressions (with them, K13 held 166 registers a thread at
    # 8192 columns and 4 warps; 127 without, compiled for sm_90 by Triton 3.9).
    q = x * t_inv
    return tl.where((x != 0.0) & (x * 0.0 == 0.0), tl.fma(tl.fma(-q, t, x), t_inv, q), q)


@triton.jit
def out_of_range(x):
    # div_by_lanes' second result, from x alone: the lanes it cannot divide.
    a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return ((a - 0x0D800000).to(tl.uint32, bitcast=True) > 0x64000000) & ((a - 1).to(tl.uint32, bitcast=True) < 0x7F7FFFFF)


@triton.jit
def exact_reciprocal(t, t_inv):
    # Whether t (with t_inv = reciprocal(t)) is a power of two, 1 among them: then x t_inv is x / t,
    # one real number, and rounding it once gives RN(x / t) for every x (subnormal, zero, infinite).
    return ((t.to(tl.int32, bitcast=True) & 0x7FFFFF) == 0) & (t_inv == t_inv)


@triton.jit
def times_exact_reciprocal(x, t_inv):
    # RN(x / t) where exact_reciprocal holds. The select keeps compiled code from fusing the product
    # into a later addition, which would skip its rounding (x is never NaN in a kernel's input).
    return tl.where(x == x, x * t_inv, x)


@triton.jit
def div_by(x, t, t_inv):
    # RN(x / t) for a block x: a multiply by a power of two's reciprocal; else, unless a lane of the
    # block lies outside div_by_lanes' range (then the whole block divides the general way), its
    # three steps (branches the block takes together).
    if exact_reciprocal(t, t_inv):
        y = times_exact_reciprocal(x, t_inv)
    elif (tl.max(out_of_range(x).to(tl.int32)) > 0) | (t_inv != t_inv):
        y = tl.math.div_rn(x, t)
    else:
        y = div_in_range(x, t, t_inv)
    return y


@triton.jit
def div_probe_kernel(out_ptr, x_ptr, t_ptr, n, BLOCK: tl.constexpr):
    # One program per BLOCK elements and one divisor per program (t_ptr[pid]), as kernels use it.
    pid = tl.program_id(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    t = tl.load(t_ptr + pid)
    tl.store(out_ptr + i, div_by(tl.load(x_ptr + i, mask=mask, other=1.0), t, reciprocal(t)), mask=mask)


@triton.jit
def tree_sum(terms):
    # C29's tree_sum of a power-of-two float64 vector (zero-padded by the caller): folded in halves,
    # x[i] + x[i + w/2], a level at a time. Each level is a sum over an axis of two (one addition,
    # the same bits either way round), which the compiler makes one cross-lane exchange: the terms
    # stay one per lane (a fold by reshape and split put the whole vector, and its exp32, in every
    # thread).
    x = terms + 0.0
    for _ in tl.static_range(32):
        if x.shape[0] > 1:
            x = tl.sum(tl.reshape(x, (2, x.shape[0] // 2)), axis=0)
    return tl.reshape(x, ())


@triton.jit
def tree_sum_probe_kernel(out_ptr, x_ptr, x_stride, n, WIDTH: tl.constexpr):
    # one row of x (its first n terms, zero-padded to WIDTH) per program
    row = tl.program_id(0)
    i = tl.arange(0, WIDTH)
    tl.store(out_ptr + row, tree_sum(tl.load(x_ptr + row * x_stride + i, mask=i < n, other=0.0).to(tl.float64)))


SUM_SCALE = tl.constexpr(70368744177664.0)  # 2^46 (C29)


@triton.jit
def units_to_float(units):
    # A C29 sum: int64 units of 2^-46, rounded to float32 through float64.
    return (units.to(tl.float64) * (1.0 / SUM_SCALE)).to(tl.float32)


@triton.jit
def fixed46(t):
    # floor(t * 2^46) of float32 t in [0, 1]: the product is exact (a power of two; subnormal t
    # becomes normal), and the truncating conversion is one instruction on a GPU where the
    # significand shifted by the exponent in int64 took about ten.
    return (t * SUM_SCALE).to(tl.int64)


@triton.jit
def exp_units(x):
    # fixed46(exp32(x)) for x <= 0 (-inf included; C30 rules NaN out), the unit of every exp-sum,
    # in about half exp32's and fixed46's instructions: below -33 the term is under 2^-46 (0 units),
    # so x is clamped there and k stays in [-48, 0]; p 2^(46 + k) is then exact (p in [0.7, 1.42],
    # so a normal float below 2^47), and truncating it is floor(exp32(x) 2^46), never through the
    # float exp32 would assemble.
    p, k = _exp_reduced(tl.maximum(x, -33.0))
    return (p * ((k + (46 + 127)) << 23).to(tl.float32, bitcast=True)).to(tl.int64)


@triton.jit
def exp_nonpositive_probe_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(out_ptr + i, exp32_nonpositive(tl.load(x_ptr + i, mask=mask, other=0.0)), mask=mask)


@triton.jit
def exp_units_probe_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(out_ptr + i, exp_units(tl.load(x_ptr + i, mask=mask, other=0.0)), mask=mask)
