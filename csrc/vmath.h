// Eight lanes at a time of the C29 numerics (gumbel.h holds the scalar specification).
//
// A float32 transcendental is float32(f(float64(x))): correctly rounded unless f(x) lies so close
// to the midpoint between two float32 values that the float64 result's last bits decide. The
// functions here evaluate f in float64 to about 2^-46 relative (range reduction and a polynomial,
// GCC vector extensions, no library call) and report, in `fix`, every lane whose float64 result
// lies within 2^12 float64 ulps of a float32 midpoint or in float32's subnormal range. Every other
// lane rounds to the float32 value any float64 implementation within 2^12 ulps gives, glibc's
// among them; the caller recomputes the reported lanes (about one in 2^16) with the scalar
// function. So a vectorized kernel returns the scalar port's bits, lane for lane.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "gumbel.h"

// The helpers pass vectors by value but are always inlined into their (target-cloned) callers.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace specdiff::vmath {

typedef double D8 __attribute__((vector_size(64)));
typedef std::int64_t L8 __attribute__((vector_size(64)));  // float64 bits, and lane masks (-1 true)
typedef float F8 __attribute__((vector_size(32)));
typedef std::int32_t I8 __attribute__((vector_size(32)));  // float32 lane masks
typedef std::uint32_t U8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline L8 bits(D8 x) { return reinterpret_cast<L8>(x); }
[[gnu::always_inline]] inline D8 from_bits(L8 b) { return reinterpret_cast<D8>(b); }

// Lane by lane: GCC 12 lowers __builtin_convertvector of F8 to D8 into four instructions.
[[gnu::always_inline]] inline D8 widen(F8 f) { return D8{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]}; }
[[gnu::always_inline]] inline F8 narrow(D8 d) { return __builtin_convertvector(d, F8); }  // round to nearest even

[[gnu::always_inline]] inline F8 loadu(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline bool any(L8 m) {
  std::int64_t r = 0;
  for (int l = 0; l < 8; ++l) r |= m[l];
  return r != 0;
}

constexpr double kMagic = 0x1.8p52;  // x + kMagic rounds x to an integer held in the low bits
constexpr std::int64_t kMagicBits = 0x4338000000000000;

// Lanes whose float32 rounding may depend on the last `guard` float64 ulps of `y` (`exact`: y is
// the float64 rounding of an exact value, so only a result on a midpoint is ambiguous), and lanes
// in float32's subnormal range, whose midpoints lie elsewhere.
[[gnu::always_inline]] inline void ambiguous(D8 y, std::int64_t guard, L8& fix) {
  const L8 b = bits(y);
  const L8 off = (b & ((std::int64_t{1} << 29) - 1)) - (std::int64_t{1} << 28);  // from the float32 midpoint
  L8 distance = (off ^ (off >> 63)) - (off >> 63);
  // 2^-151 <= |y| < 2^-126 counts as distance 0; below 2^-151 every float64 neighbour rounds to 0.
  // Compares only as conditions of selects: GCC 12 scalarizes a compare's mask used as a value.
  const D8 magnitude = from_bits(b & 0x7FFFFFFFFFFFFFFF);
  distance = magnitude < 0x1p-126 ? (magnitude >= 0x1p-151 ? L8{} : L8{} + guard) : distance;
  fix = distance < guard ? L8{} - 1 : fix;
}

constexpr std::int64_t kGuard = std::int64_t{1} << 12;

// float64 exp, about 2^-47 relative. Lanes are clamped to [-120, 100] first: beyond, the float32
// result is 0 or +inf for any accuracy (-inf gives 0, NaN stays NaN).
[[gnu::always_inline]] inline D8 exp64(D8 x) {
  x = x < -120.0 ? D8{} - 120.0 : x;
  x = x > 100.0 ? D8{} + 100.0 : x;
  const D8 t = x * 0x1.71547652b82fep0 + kMagic;  // k = round(x / ln 2) in t's low bits
  const D8 k = t - kMagic;
  // ln 2 in two parts (fdlibm's): k * hi is exact, and so is x - k * hi for |k| < 2^8.
  const D8 r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;  // |r| <= 0.347
  // Taylor to degree 11 (0.347^12 / 12! < 2^-47) by Estrin's scheme: Horner's chain of eleven
  // dependent multiply-adds held the loop to its latency.
  const D8 r2 = r * r, r4 = r2 * r2;
  const D8 a = (1.0 + r) + r2 * (0.5 + r * (1.0 / 6.0));
  const D8 b = (1.0 / 24.0 + r * (1.0 / 120.0)) + r2 * (1.0 / 720.0 + r * (1.0 / 5040.0));
  const D8 c = (1.0 / 40320.0 + r * (1.0 / 362880.0)) + r2 * (1.0 / 3628800.0 + r * (1.0 / 39916800.0));
  const D8 p = a + r4 * (b + r4 * c);
  return p * from_bits((bits(t) + 1023) << 52);  // 2^k: the exponent field from k's low bits
}

// float64 log of positive normal lanes, about 2^-50 relative: x = 2^e m with m in [sqrt(1/2),
// sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), a series in s^2 <= 0.0295 to degree 8.
[[gnu::always_inline]] inline D8 log64(D8 x) {
  const L8 b = bits(x);
  L8 e = (b >> 52) - 1023;
  D8 m = from_bits((b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000);
  e = m > 1.4142135623730951 ? e + 1 : e;
  m = m > 1.4142135623730951 ? m * 0.5 : m;
  const D8 f = m - 1.0;
  const D8 s = f / (2.0 + f);
  const D8 z = s * s;
  D8 q = D8{} + 2.0 / 17.0;
  for (const double c : {2.0 / 15.0, 2.0 / 13.0, 2.0 / 11.0, 2.0 / 9.0, 2.0 / 7.0, 2.0 / 5.0, 2.0 / 3.0}) q = q * z + c;
  const D8 lm = 2.0 * s + s * (z * q);
  const D8 ed = from_bits(e + kMagicBits) - kMagic;
  return ed * 6.93147180369123816490e-01 + (lm + ed * 1.90821492927058770002e-10);
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

// gumbel::exp32, lane by lane (C29's algorithm; compares only as conditions of selects).
[[gnu::always_inline]] inline F8 exp32(F8 x, L8&) {
  const F8 xc = x != x ? F8{} : (x < -104.0f ? F8{} - 104.0f : (x > 89.0f ? F8{} + 89.0f : x));
  const F8 t = fma8(xc, F8{} + gumbel::kLog2e, F8{} + gumbel::kShift);
  const I8 k = ibits(t) - 0x4B400000;
  const F8 kf = t - gumbel::kShift;
  F8 r = fma8(kf, F8{} - gumbel::kLn2Hi, xc);
  r = fma8(kf, F8{} - gumbel::kLn2Lo, r);
  F8 p = F8{} + 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = fma8(p, r, F8{} + c);
  const I8 normal = (k >= -125) & (k <= 127);
  const F8 shifted = fbits(ibits(p) + ((normal ? k : I8{}) << 23));
  const I8 k1 = k >> 1;
  const F8 wide = (p * fbits((k1 + 127) << 23)) * fbits((k - k1 + 127) << 23);
  return x != x ? x : (normal ? shifted : wide);
}

// gumbel::log32, lane by lane.
[[gnu::always_inline]] inline F8 log32(F8 x, L8&) {
  const I8 sub = x < 0x1p-126f;
  const I8 b = ibits(sub ? x * 0x1p23f : x);
  const I8 big0 = ((b & 0x7FFFFF) | 0x3F800000) > 0x3FB504F3;
  const I8 mb = ((b & 0x7FFFFF) | 0x3F800000) - (big0 & 0x800000);
  const F8 f = fbits(mb) - 1.0f;
  const F8 ef = __builtin_convertvector((b >> 23) - (sub ? I8{} + 150 : I8{} + 127) - big0, F8);  // big0 is -1 where true
  const F8 s = f / (2.0f + f), z = s * s;
  F8 q = F8{} + 2.0f / 11.0f;
  for (const float c : {2.0f / 9.0f, 2.0f / 7.0f, 2.0f / 5.0f, 2.0f / 3.0f}) q = fma8(q, z, F8{} + c);
  const F8 y = fma8(ef, F8{} + gumbel::kLn2Hi, fma8(ef, F8{} + gumbel::kLn2Lo, fma8(-s, fma8(-z, q, f), f)));
  const F8 special = x == 0.0f ? F8{} - __builtin_inff() : F8{} + __builtin_nanf("");
  return x == __builtin_inff() ? x : (x > 0.0f ? y : special);
}

// gumbel::log1p32, lane by lane.
[[gnu::always_inline]] inline F8 log1p32(F8 x, L8& fix) {
  const F8 u = 1.0f + x, c = x - (u - 1.0f);
  const F8 y = log32(u, fix) + (c == 0.0f ? F8{} : c / (u == 0.0f ? F8{} + 1.0f : u));
  return (x == __builtin_inff()) | (x != x) ? x : y;
}

// float32 a * b + c rounded once.
[[gnu::always_inline]] inline F8 fma32(F8 a, F8 b, F8 c, L8&) { return fma8(a, b, c); }

// gumbel::log1p_neg32 and gumbel::gumbel32, lane by lane.
[[gnu::always_inline]] inline F8 gumbel32(F8 u, L8& fix) {
  F8 p = F8{} + 0.125f;
  for (const double c : {1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0})
    p = fma32(u, p, F8{} + static_cast<float>(c), fix);
  const F8 one_minus = 1.0f - u;
  const F8 floor = F8{} + 5.960464477539063e-08f;
  const F8 lg = u < 0.25f ? -u * p : log32(one_minus > floor ? one_minus : floor, fix);
  return -log32(-lg, fix);
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
