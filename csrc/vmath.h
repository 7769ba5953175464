// kLanes lanes at a time of the C29 numerics (gumbel.h holds the scalar specification). The
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

// Sixteen lanes: one AVX-512 register of float32 in the x86-64-v4 clone (K13, K15 and K17 ran 1.4-1.7x
// faster than with eight on Zen 5), two AVX2 registers in the v3 clone. GCC lowers some operations
// on these types lane by lane where it would not at eight (a loop over Horner coefficients, the `&`
// of two compares, selects of int64 lanes): the helpers avoid them, and a scalar `vmovd`/`vpextrd`
// run in a clone's disassembly is the sign of a new one.
constexpr int kLanes = 16;
typedef std::int64_t Lv __attribute__((vector_size(8 * kLanes)));  // int64 lanes (fixed-point sums)
typedef float Fv __attribute__((vector_size(4 * kLanes)));
typedef std::int32_t Iv __attribute__((vector_size(4 * kLanes)));  // float32 lane masks
typedef std::uint32_t Uv __attribute__((vector_size(4 * kLanes)));

[[gnu::always_inline]] inline Fv loadu(const float* p) {
  Fv v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// a * b + c rounded once, lane by lane: GCC turns the lanes' fmaf into one vfmadd in the clones
// that have FMA (and calls fmaf, slow but exact, in the baseline clone).
[[gnu::always_inline]] inline Fv fmav(Fv a, Fv b, Fv c) {
  Fv r;
  for (int l = 0; l < kLanes; ++l) r[l] = __builtin_fmaf(a[l], b[l], c[l]);
  return r;
}
[[gnu::always_inline]] inline Iv ibits(Fv x) { return reinterpret_cast<Iv>(x); }
[[gnu::always_inline]] inline Fv fbits(Iv b) { return reinterpret_cast<Fv>(b); }

// exp32's range reduction and polynomial: exp(x) = p 2^k with p in [0.7, 1.42].
[[gnu::always_inline]] inline Fv exp_reduced(Fv x, Iv& k) {
  const Fv t = fmav(x, Fv{} + gumbel::kLog2e, Fv{} + gumbel::kShift);
  k = ibits(t) - 0x4B400000;
  const Fv kf = t - gumbel::kShift;
  Fv r = fmav(kf, Fv{} - gumbel::kLn2Hi, x);
  r = fmav(kf, Fv{} - gumbel::kLn2Lo, r);
  // The Horner steps are written out: a loop over the coefficients left GCC a runtime loop whose
  // sixteen-lane fmas it did not vectorize.
  Fv p = fmav(Fv{} + 1.0f / 5040.0f, r, Fv{} + 1.0f / 720.0f);
  p = fmav(p, r, Fv{} + 1.0f / 120.0f);
  p = fmav(p, r, Fv{} + 1.0f / 24.0f);
  p = fmav(p, r, Fv{} + 1.0f / 6.0f);
  p = fmav(p, r, Fv{} + 0.5f);
  p = fmav(p, r, Fv{} + 1.0f);
  return fmav(p, r, Fv{} + 1.0f);
}

// p 2^k of exp_reduced, for x in exp32's clamped range [-104, 89]. The scalar form adds k to the
// exponent field where the result is normal and multiplies by two powers of two elsewhere; the two
// multiplies alone give the same bits everywhere (p 2^(k >> 1) is exact, and the second multiply
// is exact where the result is normal and rounds once where it is not), in fewer steps.
[[gnu::always_inline]] inline Fv exp_clamped(Fv xc) {
  Iv k;
  const Fv p = exp_reduced(xc, k);
  const Iv k1 = k >> 1;
  return (p * fbits((k1 + 127) << 23)) * fbits((k - k1 + 127) << 23);
}

// gumbel::exp32, lane by lane (compares only as conditions of selects).
[[gnu::always_inline]] inline Fv exp32(Fv x) {
  const Fv xc = x != x ? Fv{} : (x < -104.0f ? Fv{} - 104.0f : (x > 89.0f ? Fv{} + 89.0f : x));
  const Fv e = exp_clamped(xc);
  return x != x ? x : e;
}

// gumbel::exp32 of lanes <= 0 or -inf (never NaN): the same bits without the NaN selects and the
// upper clamp, for callers whose arguments are known to be so (K15's probabilities).
[[gnu::always_inline]] inline Fv exp32_nonpositive(Fv x) { return exp_clamped(x < -104.0f ? Fv{} - 104.0f : x); }

// fixed46(exp32(x)) for x <= 0 or -inf, the unit of every exp-sum: below -33 the term is under
// 2^-46, so x is clamped there, k stays in [-48, 0], and the units are p's significand shifted by
// its exponent plus k (triton_impl/gumbel.py exp_units; tests/test_gumbel.py checks them).
[[gnu::always_inline]] inline Lv exp_units(Fv x) {
  Iv k;
  const Fv p = exp_reduced(x < -33.0f ? Fv{} - 33.0f : x, k);
  const Iv b = ibits(p);
  const Lv m = __builtin_convertvector((b & 0x7FFFFF) | 0x800000, Lv);
  return (m << 26) >> __builtin_convertvector(26 - ((b >> 23) - 104 + k), Lv);  // shifts in [3, 52]
}

// C29's log of the floats with bits b, whose exponent fields minus `bias` are their exponents (127
// for positive normal floats). No special values.
[[gnu::always_inline]] inline Fv log_core(Iv b, Iv bias) {
  const Iv big = ((b & 0x7FFFFF) | 0x3F800000) > 0x3FB504F3;  // m > sqrt(2): halve it (-1 where true)
  const Fv f = fbits(((b & 0x7FFFFF) | 0x3F800000) - (big & 0x800000)) - 1.0f;
  const Fv ef = __builtin_convertvector((b >> 23) - bias - big, Fv);
  const Fv s = f / (2.0f + f), z = s * s;
  Fv q = fmav(Fv{} + 2.0f / 11.0f, z, Fv{} + 2.0f / 9.0f);
  q = fmav(q, z, Fv{} + 2.0f / 7.0f);
  q = fmav(q, z, Fv{} + 2.0f / 5.0f);
  q = fmav(q, z, Fv{} + 2.0f / 3.0f);
  return fmav(ef, Fv{} + gumbel::kLn2Hi, fmav(ef, Fv{} + gumbel::kLn2Lo, fmav(-s, fmav(-z, q, f), f)));
}

// gumbel::log32 of positive normal lanes (the callers know they are): the same bits, fewer steps.
[[gnu::always_inline]] inline Fv log32_normal(Fv x) { return log_core(ibits(x), Iv{} + 127); }

// gumbel::log1p32 of lanes in (-1, 0]: 1 + x is then positive and normal (at least 2^-24).
[[gnu::always_inline]] inline Fv log1p32_negative(Fv x) {
  const Fv u = 1.0f + x, c = x - (u - 1.0f);
  return log32_normal(u) + (c == 0.0f ? Fv{} : c / u);
}

// gumbel::log1p_neg32 and gumbel::gumbel32, lane by lane.
[[gnu::always_inline]] inline Fv gumbel32(Fv u) {
  Fv p = fmav(u, Fv{} + 0.125f, Fv{} + static_cast<float>(1.0 / 7.0));
  p = fmav(u, p, Fv{} + static_cast<float>(1.0 / 6.0));
  p = fmav(u, p, Fv{} + static_cast<float>(1.0 / 5.0));
  p = fmav(u, p, Fv{} + 0.25f);
  p = fmav(u, p, Fv{} + static_cast<float>(1.0 / 3.0));
  p = fmav(u, p, Fv{} + 0.5f);
  p = fmav(u, p, Fv{} + 1.0f);
  const Fv one_minus = 1.0f - u;
  const Fv floor = Fv{} + 5.960464477539063e-08f;
  const Fv lg = u < 0.25f ? -u * p : log32_normal(one_minus > floor ? one_minus : floor);
  return -log32_normal(-lg);  // u is at least 2^-33: -log(1 - u) is positive and normal
}

// gumbel::murmur3_uniform32 from the hash.
[[gnu::always_inline]] inline Fv uniform32(Uv h) {
  const Fv hi = __builtin_convertvector(reinterpret_cast<Iv>(h >> 16), Fv) * 0x1p-16f;
  const Fv lo = (__builtin_convertvector(reinterpret_cast<Iv>(h & 0xFFFFu), Fv) + 0.5f) * 0x1p-32f;
  return hi + lo;
}

// floor(t * 2^46) of float32 terms t in [0, 1] (C29's fixed-point units), as int64 lanes: the
// significand shifted by the exponent (below 2^-46, and for -0.0, it shifts out to 0).
[[gnu::always_inline]] inline Lv fixed46(Fv t) {
  const Iv b = ibits(t);
  const Iv shift = (b >> 23) - 104, down_lanes = shift >> 31;  // -1 where the significand shifts down
  const Iv up = shift & ~down_lanes, down = -shift & down_lanes;
  // One of the two counts is 0; the down count stops at 63 (its result is 0 from 47 on). Selects
  // on int64 lanes are kept out: GCC did not vectorize them at sixteen lanes.
  const Lv m = __builtin_convertvector((b & 0x7FFFFF) | 0x800000, Lv);
  return (m << __builtin_convertvector(up, Lv)) >> __builtin_convertvector(down > 63 ? Iv{} + 63 : down, Lv);
}

// -- Upper bounds: the lanes K17 need not score ----------------------------------------------------
// K17 keeps a tile's first largest score. A lane whose score cannot exceed the best one scored
// earlier in the tile changes neither the maximum nor its first index, so its exact score (an
// exp32, a log1p and the noise's two logs, four divisions in all) is not needed: a bound costing a
// dozen operations decides. The bounds are not C29: no output takes their bits, only the fact
// that they are bounds, which tests/test_gumbel.py checks for every input they can take (all 2^32
// hashes, all 2^32 float32 log-ratios). Float addition rounds monotonically, so bounds on the two
// terms of a score bound the score.
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kMitchell = 0.0861f;  // log2(x) - log2_below(x) < 0.08607 (plus 2^-17 of rounding)
// Added to both bounds: the exhaustive check's tightest case (residual_above near d = -2^-10, where
// 1 - exp32(d) has cancelled) needs 6.4e-4 of it, and keeps 3.4e-4; the noise's needs none.
constexpr float kBoundMargin = 0x1p-10f;

// About log2(x), from below, for positive normal x: x's bits read as a fixed-point number
// (Mitchell's approximation; exact at powers of two, low by at most kMitchell).
[[gnu::always_inline]] inline Fv log2_below(Fv x) {
  return fmav(__builtin_convertvector(ibits(x), Fv), Fv{} + 0x1p-23f, Fv{} - 127.0f);
}

// At least gumbel32(uniform32(h)) for every hash h. The uniform is taken as h 2^-32 in three steps
// (uniform32 takes eight), close enough for the margin. With w = max(1 - u, 2^-24) as gumbel32
// takes it, t = -log(w) is at least u and at least -ln2 (log2_below(w) + kMitchell); the noise
// -log(t) is then at most -ln2 log2_below(t). Loose by less than 0.15 where u >= 2^-16.
[[gnu::always_inline]] inline Fv gumbel32_above(Uv h) {
  const Fv u = __builtin_convertvector(reinterpret_cast<Iv>(h >> 1), Fv) * 0x1p-31f;
  const Fv one_minus = 1.0f - u, floor = Fv{} + 5.960464477539063e-08f;
  const Fv w = one_minus > floor ? one_minus : floor;
  const Fv t0 = fmav(log2_below(w), Fv{} - kLn2, Fv{} - kLn2 * kMitchell);
  return fmav(log2_below(t0 > u ? t0 : u), Fv{} - kLn2, Fv{} + kBoundMargin);
}

// At least log1p32_negative(-exp32(d)) wherever exp32(d) < 1, and -inf where d is not negative (or
// NaN; K17 scores those lanes -inf): log(1 - e^d) <= min(0, log(-d)). Below 2^-10, -d is raised to
// 2^-10: there 1 - exp32(d) has cancelled to a few significant bits. Loose by at most about 0.5.
[[gnu::always_inline]] inline Fv residual_above(Fv d) {
  const Fv nd = -d, c = nd > 0x1p-10f ? nd : Fv{} + 0x1p-10f;
  const Fv b = fmav(log2_below(c), Fv{} + kLn2, Fv{} + (kLn2 * kMitchell + kBoundMargin));
  return d < 0.0f ? (b < 0.0f ? b : Fv{}) : Fv{} + -__builtin_inff();
}

// Whether any lane of a compare's mask is set, and the largest lane: folded in halves (a loop
// over the lanes is what GCC leaves scalar).
[[gnu::always_inline]] inline bool any_lane(Iv m) {
  typedef std::int32_t I8 __attribute__((vector_size(32)));
  typedef std::int32_t I4 __attribute__((vector_size(16)));
  const I8 a = __builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7) | __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15);
  const I4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) | __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] | b[1] | b[2] | b[3]) != 0;
}
[[gnu::always_inline]] inline float max_lane(Fv v) {
  typedef float F8 __attribute__((vector_size(32)));
  typedef float F4 __attribute__((vector_size(16)));
  const F8 a0 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), a1 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const F8 a = a0 < a1 ? a1 : a0;
  const F4 b0 = __builtin_shufflevector(a, a, 0, 1, 2, 3), b1 = __builtin_shufflevector(a, a, 4, 5, 6, 7);
  const F4 b = b0 < b1 ? b1 : b0;
  return std::max(std::max(b[0], b[1]), std::max(b[2], b[3]));
}

}  // namespace specdiff::vmath
