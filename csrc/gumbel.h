// The random streams and numerics of Model Runner V2 (reference/gumbel.py is the specification):
// Triton's tl.rand (Philox4x32-10, word 0, its int-to-float conversion), murmur3 x86_32 with its
// float32 and float64 uniforms, and the C29 numerics (specified float32 algorithms,
// fused Horner steps). Built with -ffp-contract=off: every other operation rounds as written.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specdiff::gumbel {

constexpr float kTlRandMin = 4.6566127342e-10f;  // 0x2FFFFFFF

inline std::uint32_t philox_word0(std::int64_t seed, std::int64_t offset, bool wide_offset) {
  const std::uint64_t s = static_cast<std::uint64_t>(seed), o = static_cast<std::uint64_t>(offset);
  std::uint32_t k0 = static_cast<std::uint32_t>(s), k1 = static_cast<std::uint32_t>(s >> 32);
  std::uint32_t c0 = static_cast<std::uint32_t>(o), c1 = wide_offset ? static_cast<std::uint32_t>(o >> 32) : 0u;
  std::uint32_t c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t b = 0xCD9E8D57ull * c2, a = 0xD2511F53ull * c0;
    const std::uint32_t n0 = static_cast<std::uint32_t>(b >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(a >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(b);
    c3 = static_cast<std::uint32_t>(a);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// tl.rand(seed, offset): the word as int32, ~x when negative, one float32 multiply.
inline float tl_rand(std::int64_t seed, std::int64_t offset, bool wide_offset) {
  std::int32_t x = static_cast<std::int32_t>(philox_word0(seed, offset, wide_offset));
  if (x < 0) x = ~x;
  return static_cast<float>(x) * kTlRandMin;
}

inline float tl_rand32(std::int64_t seed, std::int64_t offset, bool wide_offset, bool includes_zero) {
  const float u = tl_rand(seed, offset, wide_offset);
  return includes_zero ? u : std::max(u, kTlRandMin);
}

inline std::int64_t spec_step_seed(std::int64_t seed, std::int64_t step) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(seed) ^ (static_cast<std::uint64_t>(step) << 32));
}

// Templates over the word type: std::uint32_t here, eight-lane vectors in vmath.h (one hash).
template <class U>
[[gnu::always_inline]] inline U rotl(U x, int r) {
  return (x << r) | (x >> (32 - r));
}

constexpr std::uint32_t kMurmurC1 = 0xCC9E2D51u;

// One block, given as key * kMurmurC1 (a caller stepping through consecutive keys adds the constant).
template <class U>
[[gnu::always_inline]] inline U mix_scaled(U h, U key_c1) {
  const U key = rotl(key_c1, 15) * 0x1B873593u;
  return rotl(h ^ key, 13) * 5u + 0xE6546B64u;
}

template <class U>
[[gnu::always_inline]] inline U mix(U h, U key) {
  return mix_scaled(h, key * kMurmurC1);
}

// The hash state after `domain`, the seed's two words and the position's low word.
inline std::uint32_t murmur3_prefix(std::int64_t seed, std::int64_t pos, std::uint32_t domain = 0) {
  const std::uint64_t s = static_cast<std::uint64_t>(seed);
  std::uint32_t h = domain;
  h = mix(h, static_cast<std::uint32_t>(s));
  h = mix(h, static_cast<std::uint32_t>(s >> 32));
  return mix(h, static_cast<std::uint32_t>(static_cast<std::uint64_t>(pos)));
}

// The last block (given as key * kMurmurC1), the length (16 bytes) and the finalizer.
template <class U>
[[gnu::always_inline]] inline U murmur3_finish_scaled(U h, U key_c1) {
  h = mix_scaled(h, key_c1) ^ 16u;
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

template <class U>
[[gnu::always_inline]] inline U murmur3_finish(U h, U key) {
  return murmur3_finish_scaled(h, key * kMurmurC1);
}

inline std::uint32_t murmur3_hash32(std::int64_t seed, std::int64_t pos, std::uint32_t key, std::uint32_t domain = 0) {
  return murmur3_finish(murmur3_prefix(seed, pos, domain), key);
}

// The float64 uniform's second hash takes this domain.
constexpr std::uint32_t kDomainHi = 0x9E3779B9u;

// The uniforms of a hash (of two, float64): a caller with a row's prefix finishes each lane's hash.
inline float uniform32(std::uint32_t h) {
  const float hi = static_cast<float>(h >> 16) * 0x1p-16f;
  const float lo = (static_cast<float>(h & 0xFFFFu) + 0.5f) * 0x1p-32f;
  return hi + lo;
}

inline double uniform64(std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t r = ((hi << 32) | lo) >> 11;
  const double u = (static_cast<double>(r) + 0.5) * 0x1p-53;
  return u == 1.0 ? u - 0x1p-53 : u;
}

inline float murmur3_uniform32(std::int64_t seed, std::int64_t pos, std::uint32_t key) {
  return uniform32(murmur3_hash32(seed, pos, key));
}

inline double murmur3_uniform64(std::int64_t seed, std::int64_t pos, std::uint32_t key) {
  return uniform64(murmur3_hash32(seed, pos, key), murmur3_hash32(seed, pos, key, kDomainHi));
}

// -- C29 numerics ---------------------------------------------------------------------------------
// Specified float32 algorithms (reference/gumbel.py states them): every step rounds once, the
// multiply-adds are std::fmaf, so the bits are the oracle's and Triton's on any machine.
[[gnu::always_inline]] inline float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
[[gnu::always_inline]] inline std::uint32_t to_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2Hi = 0.693145751953125f;
constexpr float kLn2Lo = 1.4286068203094173e-06f;

inline float exp32(float x) {
  if (x != x) return x;
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float t = std::fmaf(xc, kLog2e, kShift);
  const std::int32_t k = static_cast<std::int32_t>(to_bits(t) - 0x4B400000u);
  const float kf = t - kShift;
  float r = std::fmaf(kf, -kLn2Hi, xc);
  r = std::fmaf(kf, -kLn2Lo, r);
  float p = 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = std::fmaf(p, r, c);
  if (k >= -125 && k <= 127) return from_bits(to_bits(p) + (static_cast<std::uint32_t>(k) << 23));
  const std::int32_t k1 = k >> 1;
  return (p * from_bits(static_cast<std::uint32_t>(k1 + 127) << 23)) * from_bits(static_cast<std::uint32_t>(k - k1 + 127) << 23);
}

inline float log32(float x) {
  if (!(x > 0.0f)) return x == 0.0f ? -INFINITY : NAN;
  if (x == INFINITY) return x;
  const bool sub = x < 0x1p-126f;
  const std::uint32_t b = to_bits(sub ? x * 0x1p23f : x);
  std::int32_t e = static_cast<std::int32_t>(b >> 23) - (sub ? 150 : 127);
  std::uint32_t mb = (b & 0x7FFFFFu) | 0x3F800000u;
  if (mb > 0x3FB504F3u) {  // m > sqrt(2): halve it
    mb -= 0x800000u;
    e += 1;
  }
  const float f = from_bits(mb) - 1.0f, ef = static_cast<float>(e);
  const float s = f / (2.0f + f), z = s * s;
  float q = 2.0f / 11.0f;
  for (const float c : {2.0f / 9.0f, 2.0f / 7.0f, 2.0f / 5.0f, 2.0f / 3.0f}) q = std::fmaf(q, z, c);
  return std::fmaf(ef, kLn2Hi, std::fmaf(ef, kLn2Lo, std::fmaf(-s, std::fmaf(-z, q, f), f)));
}

inline float log1p32(float x) {
  if (x == INFINITY || x != x) return x;
  const float u = 1.0f + x, c = x - (u - 1.0f);
  return log32(u) + (c == 0.0f ? 0.0f : c / u);
}

// vLLM's _log1p_neg_stable with fused Horner steps.
inline float log1p_neg32(float u) {
  if (u < 0.25f) {
    float p = 0.125f;
    for (const double c : {1.0 / 7.0, 1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0})
      p = std::fmaf(u, p, static_cast<float>(c));
    return -u * p;
  }
  return log32(std::max(1.0f - u, 5.960464477539063e-08f));
}

inline float gumbel32(float u) { return -log32(-log1p_neg32(u)); }
inline double gumbel64(double u) { return -std::log(-std::log(u)); }

// C29's tree_sum of term(0) .. term(nb - 1), zero-padded to a power of two `width` and folded in
// halves (x[i] + x[i + width/2]): the sum of the terms at indices r, r + s, r + 2s, ... is that of
// those at r and r + s with step 2s added, down to single terms, each given + 0.0 (so -0.0 is
// 0.0). The same additions as a GPU's fold, without the buffer.
template <class Term>
double tree_sum(const Term& term, std::int64_t r, std::int64_t s, std::int64_t width, std::int64_t nb) {
  if (r >= nb) return 0.0;
  if (s == width) return term(r) + 0.0;
  return tree_sum(term, r, 2 * s, width, nb) + tree_sum(term, r + s, 2 * s, width, nb);
}

template <class Term>
double tree_sum(const Term& term, std::int64_t nb) {
  std::int64_t width = 1;
  while (width < nb) width *= 2;
  return tree_sum(term, 0, 1, width, nb);
}

}  // namespace specdiff::gumbel
