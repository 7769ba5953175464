// The random streams and numerics of Model Runner V2 (reference/gumbel.py is the specification):
// Triton's tl.rand (Philox4x32-10, word 0, its int-to-float conversion), murmur3 x86_32 with its
// float32 and float64 uniforms, and the C29 numerics (float32 transcendentals through float64,
// fused Horner steps). Built with -ffp-contract=off: every other operation rounds as written.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

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

template <class U>
[[gnu::always_inline]] inline U mix(U h, U key) {
  key = rotl(key * 0xCC9E2D51u, 15) * 0x1B873593u;
  return rotl(h ^ key, 13) * 5u + 0xE6546B64u;
}

// The hash state after `domain`, the seed's two words and the position's low word.
inline std::uint32_t murmur3_prefix(std::int64_t seed, std::int64_t pos, std::uint32_t domain = 0) {
  const std::uint64_t s = static_cast<std::uint64_t>(seed);
  std::uint32_t h = domain;
  h = mix(h, static_cast<std::uint32_t>(s));
  h = mix(h, static_cast<std::uint32_t>(s >> 32));
  return mix(h, static_cast<std::uint32_t>(static_cast<std::uint64_t>(pos)));
}

// The last block (`key`), the length (16 bytes) and the finalizer.
template <class U>
[[gnu::always_inline]] inline U murmur3_finish(U h, U key) {
  h = mix(h, key) ^ 16u;
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

inline std::uint32_t murmur3_hash32(std::int64_t seed, std::int64_t pos, std::uint32_t key, std::uint32_t domain = 0) {
  return murmur3_finish(murmur3_prefix(seed, pos, domain), key);
}

inline float murmur3_uniform32(std::int64_t seed, std::int64_t pos, std::uint32_t key) {
  const std::uint32_t h = murmur3_hash32(seed, pos, key);
  const float hi = static_cast<float>(h >> 16) * 0x1p-16f;
  const float lo = (static_cast<float>(h & 0xFFFFu) + 0.5f) * 0x1p-32f;
  return hi + lo;
}

inline double murmur3_uniform64(std::int64_t seed, std::int64_t pos, std::uint32_t key) {
  const std::uint64_t lo = murmur3_hash32(seed, pos, key);
  const std::uint64_t hi = murmur3_hash32(seed, pos, key, 0x9E3779B9u);
  const std::uint64_t r = ((hi << 32) | lo) >> 11;
  const double u = (static_cast<double>(r) + 0.5) * 0x1p-53;
  return u == 1.0 ? u - 0x1p-53 : u;
}

// -- C29 numerics ---------------------------------------------------------------------------------
inline float exp32(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }
inline float log32(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
inline float log1p32(float x) { return static_cast<float>(std::log1p(static_cast<double>(x))); }

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

}  // namespace specdiff::gumbel
