"""The random streams of Model Runner V2, as PyTorch: the readable specification
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

The float32 ``exp``, ``log`` and ``log1p`` these build on are C29's specified algorithms
(``contracts/numerics.py``: the numerics are part of the contract, and the contracts' preconditions
are written in them). The noise polynomial's Horner steps are fused multiply-adds too (what the GPU
compiles vLLM's expression to).
"""

from __future__ import annotations

import torch

from contracts.numerics import fma32, log32

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


# -- resample noise ------------------------------------------------------------------------------
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


