// Eight lanes at a time of the C29 numerics (gumbel.h holds the scalar specification). The
// algorithms are float32 operations that each round once, so a lane computes exactly the scalar
// function's bits: there is nothing to recompute.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "gumbel.h"

// The helpers pass vectors by value but are always inlined into their (target-cloned) callers.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace specdiff::vmath {

typedef std::int64_t L8 __attribute__((vector_size(64)));  // int64 lanes (fixed-point sums)
typedef float F8 __attribute__((vector_size(32)));
typedef std::int32_t I8 __attribute__((vector_size(32)));  // float32 lane masks
typedef std::uint32_t U8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline F8 loadu(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// a * b + c rounded once, lane by lane: GCC turns the lanes' fmaf into one vfmadd in the clones
// that have FMA (and calls fmaf, slow but exact, in the baseline clone).
[[gnu::always_inline]] inline F8 fma8(F8 a, F8 b, F8 c) {
  F8 r;
  for (int l = 0; l < 8; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
  return r;
}
[[gnu::always_inline]] inline I8 ibits(F8 x) { return reinterpret_cast<I8>(x); }
[[gnu::always_inline]] inline F8 fbits(I8 b) { return reinterpret_cast<F8>(b); }

// exp32's range reduction and polynomial: exp(x) = p 2^k with p in [0.7, 1.42].
[[gnu::always_inline]] inline F8 exp_reduced(F8 x, I8& k) {
  const F8 t = fma8(x, F8{} + gumbel::kLog2e, F8{} + gumbel::kShift);
  k = ibits(t) - 0x4B400000;
  const F8 kf = t - gumbel::kShift;
  F8 r = fma8(kf, F8{} - gumbel::kLn2Hi, x);
  r = fma8(kf, F8{} - gumbel::kLn2Lo, r);
  F8 p = F8{} + 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = fma8(p, r, F8{} + c);
  return p;
}

// gumbel::exp32, lane by lane (compares only as conditions of selects).
[[gnu::always_inline]] inline F8 exp32(F8 x) {
  const F8 xc = x != x ? F8{} : (x < -104.0f ? F8{} - 104.0f : (x > 89.0f ? F8{} + 89.0f : x));
  I8 k;
  const F8 p = exp_reduced(xc, k);
  const I8 normal = (k >= -125) & (k <= 127);
  const F8 shifted = fbits(ibits(p) + ((normal ? k : I8{}) << 23));
  const I8 k1 = k >> 1;
  const F8 wide = (p * fbits((k1 + 127) << 23)) * fbits((k - k1 + 127) << 23);
  return x != x ? x : (normal ? shifted : wide);
}

// fixed46(exp32(x)) for x <= 0 or -inf, the unit of every exp-sum: below -33 the term is under
// 2^-46, so x is clamped there, k stays in [-48, 0], and the units are p's significand shifted by
// its exponent plus k (triton_impl/gumbel.py exp_units; tests/test_gumbel.py checks them).
[[gnu::always_inline]] inline L8 exp_units(F8 x) {
  I8 k;
  const F8 p = exp_reduced(x < -33.0f ? F8{} - 33.0f : x, k);
  const I8 b = ibits(p);
  const L8 m = __builtin_convertvector((b & 0x7FFFFF) | 0x800000, L8);
  return (m << 26) >> __builtin_convertvector(26 - ((b >> 23) - 104 + k), L8);  // shifts in [3, 52]
}

// C29's log of the floats with bits b, whose exponent fields minus `bias` are their exponents (127
// for positive normal floats). No special values.
[[gnu::always_inline]] inline F8 log_core(I8 b, I8 bias) {
  const I8 big = ((b & 0x7FFFFF) | 0x3F800000) > 0x3FB504F3;  // m > sqrt(2): halve it (-1 where true)
  const F8 f = fbits(((b & 0x7FFFFF) | 0x3F800000) - (big & 0x800000)) - 1.0f;
  const F8 ef = __builtin_convertvector((b >> 23) - bias - big, F8);
  const F8 s = f / (2.0f + f), z = s * s;
  F8 q = F8{} + 2.0f / 11.0f;
  for (const float c : {2.0f / 9.0f, 2.0f / 7.0f, 2.0f / 5.0f, 2.0f / 3.0f}) q = fma8(q, z, F8{} + c);
  return fma8(ef, F8{} + gumbel::kLn2Hi, fma8(ef, F8{} + gumbel::kLn2Lo, fma8(-s, fma8(-z, q, f), f)));
}

// gumbel::log32 of positive normal lanes (the callers know they are): the same bits, fewer steps.
[[gnu::always_inline]] inline F8 log32_normal(F8 x) { return log_core(ibits(x), I8{} + 127); }

// gumbel::log1p32 of lanes in (-1, 0]: 1 + x is then positive and normal (at least 2^-24).
[[gnu::always_inline]] inline F8 log1p32_negative(F8 x) {
  const F8 u = 1.0f + x, c = x - (u - 1.0f);
  return log32_normal(u) + (c == 0.0f ? F8{} : c / u);
}

// gumbel::log1p_neg32 and gumbel::gumbel32, lane by lane.
[[gnu::always_inline]] inline F8 gumbel32(F8 u) {
  F8 p = F8{} + 0.125f;
  for (const double c : {1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0})
    p = fma8(u, p, F8{} + static_cast<float>(c));
  const F8 one_minus = 1.0f - u;
  const F8 floor = F8{} + 5.960464477539063e-08f;
  const F8 lg = u < 0.25f ? -u * p : log32_normal(one_minus > floor ? one_minus : floor);
  return -log32_normal(-lg);  // u is at least 2^-33: -log(1 - u) is positive and normal
}

// gumbel::murmur3_uniform32 from the hash.
[[gnu::always_inline]] inline F8 uniform32(U8 h) {
  const F8 hi = __builtin_convertvector(reinterpret_cast<I8>(h >> 16), F8) * 0x1p-16f;
  const F8 lo = (__builtin_convertvector(reinterpret_cast<I8>(h & 0xFFFFu), F8) + 0.5f) * 0x1p-32f;
  return hi + lo;
}

// floor(t * 2^46) of float32 terms t in [0, 1] (C29's fixed-point units), as int64 lanes: the
// significand shifted by the exponent (below 2^-46, and for -0.0, it shifts out to 0).
[[gnu::always_inline]] inline L8 fixed46(F8 t) {
  const I8 b = ibits(t);
  const L8 shift = __builtin_convertvector((b >> 23) - 104, L8);
  const L8 m = __builtin_convertvector((b & 0x7FFFFF) | 0x800000, L8);
  // Both shift counts are kept in [0, 63]: the lane's select then picks the meaningful one.
  const L8 up = shift < 0 ? L8{} : shift, down = shift > 0 ? L8{} : (shift < -63 ? L8{} + 63 : -shift);
  return shift >= 0 ? m << up : m >> down;
}

}  // namespace specdiff::vmath
