"""C29, the numerics contract of Model Runner V2 (docs/mrv2.md, "Numerics"): float32 ``exp``, ``log``
and ``log1p`` as specified algorithms, not library calls (a fixed sequence of float32 operations,
each rounded once, IEEE round-to-nearest-even, the multiply-adds fused), and vocabulary-wide sums
exact in fixed point. Every backend computes the same bits from the same input, at float32 speed on
a CPU and a GPU; ``tests/test_gumbel.py`` measures each function within 2 ulps of the exact result.

The PyTorch statement here is what the oracle (``reference/``) computes with and what the contracts'
preconditions are written in; ``triton_impl/gumbel.py`` and ``csrc/vmath.h`` implement the same
sequences.
"""

from __future__ import annotations

import torch

I64, F32, F64 = torch.int64, torch.float32, torch.float64


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


def tree_sum(terms: torch.Tensor) -> torch.Tensor:
    """C29's float64 sum of a row of per-tile terms: each term plus 0.0 (``-0.0`` becomes 0.0),
    zero-padded to a power of two ``w``, then folded in halves, ``x[i] + x[i + w/2]`` for
    ``i < w/2``, down to one value. Each addition rounds once (and adding two values is the same
    either way round), so every backend gets the same bits. A GPU folds a level per cross-lane
    exchange (log2 steps, where an order along the tiles is a reduction per tile). More zero
    padding changes nothing (the first folds add 0.0): a kernel may pad to its ``PADDED_*``
    width."""
    x = terms.to(F64).reshape(-1) + 0.0
    width = 1 << max(x.numel() - 1, 0).bit_length()
    x = torch.cat([x, x.new_zeros(width - x.numel())])
    while x.numel() > 1:
        x = x[: x.numel() // 2] + x[x.numel() // 2 :]
    return x[0]


def logsumexp(m: torch.Tensor, se: torch.Tensor) -> torch.Tensor:
    """C29 log-sum-exp of a row from its tile maxima ``m`` and sums ``se`` (float32):
    ``G + log(T)``, ``G = max m``, ``T`` the ``tree_sum`` of ``se_b * exp32(m_b - G)`` (each product
    exact in float64, so a fused multiply-add changes nothing), rounded to float32."""
    g = m.max()
    total = tree_sum(se.to(F64) * exp32(m - g).to(F64))
    return (g.to(F64) + torch.log(total)).to(F32)
