"""The random streams and the numerics of Model Runner V2, as PyTorch: the readable specification
of ``triton_impl/gumbel.py`` and ``csrc/gumbel.h`` (docs/mrv2.md, "Randomness" and "Numerics").

Two counter-based generators, reproduced bit for bit, never injected:

* the acceptance uniform is Triton's ``tl.rand``: Philox4x32-10 keyed by the 64-bit seed
  (key = its two 32-bit words), counter = the offset's two words (the high one only for a 64-bit
  offset), output word 0 read as int32, folded to ``x >= 0`` by ``~x``, then one float32 multiply
  by ``float32(4.6566127342e-10)``; MRV2 clamps it away from zero;
* the resample noise is a murmur3 (x86_32) hash of (seed words, position, vocabulary index), turned
  into a float32 uniform ``RN((h + 0.5) * 2^-32)`` or, from two hashes, a float64 one.

Unsigned 32-bit words live in int64 tensors: every product of two words is split into 16-bit
halves so that nothing overflows int64.

Numerics (C29): float32 ``exp``, ``log`` and ``log1p`` are specified algorithms, not library
calls: a fixed sequence of float32 operations, each rounded once (IEEE round-to-nearest-even; the
multiply-adds are fused), so every backend computes the same bits from the same input, and runs at
float32 speed on a CPU and a GPU. They are within 2 ulps of the exact result (``tests/test_gumbel.py``
measures it over every float32 the kernels can pass). The noise polynomial's Horner steps are fused
multiply-adds too (what the GPU compiles vLLM's expression to).
"""

from __future__ import annotations

import torch

I64, F32, F64 = torch.int64, torch.float32, torch.float64
M32 = 0xFFFFFFFF
TL_RAND_MIN = 4.6566127342e-10  # as float32: 0x2FFFFFFF, the smallest nonzero tl.rand
_PHILOX_ROUND = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY = (0x9E3779B9, 0xBB67AE85)


def _mul32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) words of the 64-bit product of the constant word ``a`` and the words ``b``."""
    low_half = (a & 0xFFFF) * b  # < 2^48
    high_half = (a >> 16) * b  # < 2^48
    low = low_half + ((high_half & 0xFFFF) << 16)  # < 2^49
    return (high_half >> 16) + (low >> 32), low & M32


def _words(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.to(I64)
    return x & M32, (x >> 32) & M32  # two's-complement words, also of negative values


def philox_word0(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Word 0 of Philox4x32-10 at counter (offset words, 0, 0) under key (seed words), as tl.rand
    forms it: an int32 offset contributes no high word."""
    k0, k1 = _words(seed)
    c0, c1 = _words(offset)
    if offset.dtype != I64:
        c1 = torch.zeros_like(c1)
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(10):
        hi_b, lo_b = _mul32(_PHILOX_ROUND[1], c2)
        hi_a, lo_a = _mul32(_PHILOX_ROUND[0], c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY[0]) & M32, (k1 + _PHILOX_KEY[1]) & M32
    return c0


def tl_rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``tl.rand(seed, offset)``: float32 in [0, 1 - 2^-24]."""
    x = philox_word0(seed, offset)
    x = torch.where(x >= 2**31, x - 2**32, x)  # the word as int32
    x = torch.where(x < 0, -x - 1, x)
    return x.to(F32) * torch.tensor(TL_RAND_MIN, dtype=F32)


def tl_rand32(seed: torch.Tensor, offset: torch.Tensor, includes_zero: bool) -> torch.Tensor:
    """MRV2's acceptance uniform; without zero it is clamped up to float32(TL_RAND_MIN)."""
    u = tl_rand(seed, offset)
    return u if includes_zero else torch.clamp_min(u, torch.tensor(TL_RAND_MIN, dtype=F32))


def spec_step_seed(seed: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """Block verification's per-step seed: the step XORed into the seed's high word (wraps)."""
    return seed.to(I64) ^ (torch.as_tensor(step, dtype=I64) << 32)


# -- murmur3 -------------------------------------------------------------------------------------
def _mul_lo(a: int, b: torch.Tensor) -> torch.Tensor:
    return _mul32(a, b)[1]


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & M32


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _mul_lo(0x1B873593, _rotl(_mul_lo(0xCC9E2D51, key), 15))
    h = _rotl(h ^ key, 13)
    return (_mul_lo(5, h) + 0xE6546B64) & M32


def murmur3_hash32(seed: torch.Tensor, pos: torch.Tensor, key: torch.Tensor, domain: int = 0) -> torch.Tensor:
    """murmur3 x86_32 of the four words (seed low, seed high, position low, key) under ``domain``."""
    seed, pos, key = torch.broadcast_tensors(seed.to(I64), pos.to(I64), key.to(I64))
    s0, s1 = _words(seed)
    h = torch.full_like(s0, domain)
    for word in (s0, s1, pos & M32, key & M32):
        h = _mix(h, word)
    h = h ^ 16  # the length in bytes
    h = _mul_lo(0x85EBCA6B, h ^ (h >> 16))
    h = _mul_lo(0xC2B2AE35, h ^ (h >> 13))
    return h ^ (h >> 16)


def murmur3_uniform32(seed: torch.Tensor, pos: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``RN_f32((h + 0.5) * 2^-32)``, formed from the hash's 16-bit halves (exact products, one
    rounding in the sum): in (0, 1], 1 included when h is near 2^32."""
    h = murmur3_hash32(seed, pos, key)
    hi = (h >> 16).to(F32) * 2.0**-16
    lo = ((h & 0xFFFF).to(F32) + 0.5) * 2.0**-32
    return hi + lo


def murmur3_uniform64(seed: torch.Tensor, pos: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """float64 ``(r + 0.5) * 2^-53`` of the top 53 bits of two hashes (domains 0 and 0x9E3779B9),
    kept below 1."""
    lo = murmur3_hash32(seed, pos, key)
    hi = murmur3_hash32(seed, pos, key, domain=0x9E3779B9)
    r = (hi << 21) | (lo >> 11)  # ((hi << 32) | lo) >> 11, < 2^53
    u = (r.to(F64) + 0.5) * 2.0**-53
    return torch.where(u == 1.0, u - 2.0**-53, u)


# -- numerics (C29) ------------------------------------------------------------------------------
def _f32(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=F32)


_SHIFT = _f32(12582912.0)  # 1.5 * 2^23: fma(x, 1/ln 2, _SHIFT) holds round(x / ln 2) in its low bits
_LOG2E = _f32(1.4426950408889634)
_LN2_HI = _f32(0.693145751953125)  # 16 significant bits: k * _LN2_HI is exact for |k| < 2^8
_LN2_LO = _f32(1.4286068203094173e-06)  # ln 2 - _LN2_HI
_EXP_TAYLOR = tuple(_f32(c) for c in (1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0))
_LOG_SERIES = tuple(_f32(c) for c in (2 / 9, 2 / 7, 2 / 5, 2 / 3))


def _from_bits(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.int32).view(F32)


def exp32(x: torch.Tensor) -> torch.Tensor:
    """C29's exp: x clamped to [-104, 89] (beyond, the result is 0 or inf anyway); k = round(x / ln 2)
    by one fused multiply-add; r = x - k ln 2 in two fused steps (|r| <= 0.35); e^r by Taylor to
    degree 7 in fused Horner steps; then 2^k: an exponent-field add where the result is normal, else
    two multiplies by 2^(k >> 1) and 2^(k - (k >> 1)) (the second rounds once, to a subnormal or
    inf). NaN stays NaN."""
    x = x.to(F32)
    xc = torch.where(x != x, 0.0, torch.clamp(x, -104.0, 89.0))
    t = fma32(xc, _LOG2E, _SHIFT)
    k = t.view(torch.int32).to(I64) - 0x4B400000
    kf = t - _SHIFT
    r = fma32(kf, -_LN2_HI, xc)
    r = fma32(kf, -_LN2_LO, r)
    p = torch.full_like(r, 1 / 5040)
    for c in _EXP_TAYLOR:
        p = fma32(p, r, c)
    normal = (k >= -125) & (k <= 127)
    shifted = _from_bits(p.view(torch.int32).to(I64) + torch.where(normal, k, 0) * 2**23)
    k1 = torch.div(k, 2, rounding_mode="floor")
    wide = (p * _from_bits((k1 + 127) * 2**23)) * _from_bits((k - k1 + 127) * 2**23)
    return torch.where(x != x, x, torch.where(normal, shifted, wide))


def log32(x: torch.Tensor) -> torch.Tensor:
    """C29's log: x = 2^e m with m in [sqrt(1/2), sqrt(2)] (subnormals scaled by 2^23 first), f = m - 1
    (exact), s = f / (2 + f), log m = 2 atanh(s) = f - s (f - z q(z)) (as f = 2s + s f) with z = s^2
    and q the series of 2 / (2j + 1) to z^4 (fused Horner steps), then e ln 2 added in two fused
    steps. log 0 = -inf,
    log inf = inf, negative and NaN give NaN."""
    x = x.to(F32)
    sub = x < 2.0**-126
    b = torch.where(sub, x * 2.0**23, x).view(torch.int32).to(I64)
    e = torch.div(b, 2**23, rounding_mode="floor") - torch.where(sub, 150, 127)
    mb = (b & 0x7FFFFF) | 0x3F800000
    big = mb > 0x3FB504F3  # m > sqrt(2): halve it
    f = _from_bits(torch.where(big, mb - 2**23, mb)) - 1.0
    ef = (e + big.to(I64)).to(F32)
    s = f / (2.0 + f)
    z = s * s
    q = torch.full_like(z, 2 / 11)
    for c in _LOG_SERIES:
        q = fma32(q, z, c)
    y = fma32(ef, _LN2_HI, fma32(ef, _LN2_LO, fma32(-s, fma32(-z, q, f), f)))
    y = torch.where(x > 0, y, torch.where(x == 0, float("-inf"), float("nan")))
    return torch.where(x == float("inf"), x, y)


def log1p32(x: torch.Tensor) -> torch.Tensor:
    """C29's log1p: u = 1 + x (rounded), c = x - (u - 1) its rounding error (exact), then
    log32(u) + c / u (0 for c when u is 0: log1p(-1) = -inf); inf and NaN come back as they are."""
    x = x.to(F32)
    u = 1.0 + x
    c = x - (u - 1.0)
    y = log32(u) + torch.where(c == 0, 0.0, c / u)
    return torch.where((x == float("inf")) | (x != x), x, y)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    """float32 ``a * b + c`` rounded once. The float64 product is exact; the float64 sum is rounded
    to odd (an inexact sum whose last bit is even moves one float64 ulp toward the exact value, by
    its TwoSum error), and a round-to-odd float64 rounds to float32 as the exact value would."""
    p = a.to(F64) * b.to(F64)
    c = torch.as_tensor(c, dtype=F32).to(F64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err == p + c exactly
    bits = s.view(I64)
    nudge = (err != 0) & ((bits & 1) == 0) & torch.isfinite(s)
    toward = torch.where((err > 0) == (s > 0), 1, -1)  # away from zero when the exact value is larger in magnitude
    return torch.where(nudge, bits + toward, bits).view(F64).to(F32)


_HORNER = tuple(torch.tensor(1.0 / k, dtype=F32) for k in (7, 6, 5, 4, 3, 2, 1))


def log1p_neg32(u: torch.Tensor) -> torch.Tensor:
    """vLLM's ``_log1p_neg_stable``: ``log(1 - u)`` as ``-u * P(u)`` (degree-7 Horner in fused
    steps from 1/8) below 0.25, else ``log32(max(1 - u, 2^-24))``."""
    p = torch.full_like(u, 0.125)
    for c in _HORNER:
        p = fma32(u, p, c)
    series = -u * p
    direct = log32(torch.clamp_min(1.0 - u, 2.0**-24))
    return torch.where(u < 0.25, series, direct)


def gumbel32(u: torch.Tensor) -> torch.Tensor:
    """The float32 resample noise ``-log(-log(1 - u))`` of a murmur3 uniform."""
    return -log32(-log1p_neg32(u))


def gumbel64(u: torch.Tensor) -> torch.Tensor:
    """The float64 resample noise ``-log(-log(u))`` (float64 libraries: C29 tolerance)."""
    return -torch.log(-torch.log(u))


SUM_SCALE = 2.0**46  # C29: tile sums are exact in units of 2^-46 (a 2^16-term tile of [0, 1] fits int64)


def exact_sum(terms: torch.Tensor) -> torch.Tensor:
    """The float32 sum over the last dimension of float32 terms in [0, 1]: each term truncated to a
    multiple of 2^-46, summed exactly in int64 (so any order gives the same bits), then converted
    to float64 and rounded to float32."""
    fixed = (terms.to(F64) * SUM_SCALE).to(I64).sum(-1)
    return (fixed.to(F64) * (1.0 / SUM_SCALE)).to(F32)


def max_and_sumexp(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile (last dimension): the maximum and the exact sum of exp32(x - max); 0 for a tile
    with no value above -inf."""
    m = x.max(-1).values
    live = m > float("-inf")
    e = exp32(x - torch.where(live, m, 0.0)[..., None])
    return m, torch.where(live, exact_sum(torch.where(live[..., None], e, 0.0)), 0.0)


def logsumexp(m: torch.Tensor, se: torch.Tensor) -> torch.Tensor:
    """C29 log-sum-exp of a row from its tile maxima ``m`` and sums ``se`` (float32):
    ``G + log(T)``, ``G = max m``, ``T`` the float64 sum in tile order of ``se_b * exp32(m_b - G)``
    (each product exact in float64, so a fused multiply-add changes nothing), rounded to float32."""
    g = m.max()
    e = exp32(m - g)
    total = torch.zeros((), dtype=F64)
    for term in se.to(F64) * e.to(F64):
        total = total + term
    return (g.to(F64) + torch.log(total)).to(F32)
