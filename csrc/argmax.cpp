// OpenMP port of vLLM's CPU sampler ops (docs/argmax.md, C40): greedy_argmax and
// fused_gumbel_argmax.
//
// Rows run in parallel, each scanned by one thread in the contract's order. The Gumbel scan skips a
// token only where it provably cannot replace the best (the noise bound, then an exp test with a
// slack far above its rounding), so it gives the full scan's token. vLLM's op prunes with the same
// two tests, the second without the slack, and gives the top draw +inf noise (u rounds to 1.0).
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kGreedy = "greedy_argmax";
constexpr const char* kGumbel = "fused_gumbel_argmax";
constexpr std::uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
constexpr std::uint64_t kTopDraw = (1ULL << 53) - 1;  // u = 1 - 2**-54: no float64, -log(u) = 2**-54
// Every noise is below this: the top draw's is -log(2**-54) = 37.43.
constexpr double kNoiseBound = 37.5;
// The exp test's slack on exp's argument. The test decides only while the gap to close is within
// [-1, 37.5] (beyond, the bound or exp > 1 decides), where the test's and the noise's rounding
// move it by less than 2**-44.
constexpr double kSlack = 0x1.0p-24;

inline std::uint64_t splitmix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void check_rows(const char* kernel, const Buffer& sampled, const Strided& logits) {
  if (logits.cols < 1) fail(kernel, "logits", "must have at least one column (a vocabulary), has 0");
  if (sampled.numel != logits.rows)
    fail(kernel, "sampled", "must hold one id per row of logits (" + std::to_string(logits.rows) + "), has " +
                                std::to_string(sampled.numel));
}

// The first NaN of the row, else its first maximum (torch.argmax).
SPECDIFF_CLONES std::int64_t greedy_row(const float* row, std::int64_t v) {
  constexpr int kLanes = 32;  // two AVX-512 registers: two independent max chains
  float best[kLanes];
  int nan[kLanes];
  for (int j = 0; j < kLanes; ++j) best[j] = -std::numeric_limits<float>::infinity(), nan[j] = 0;
  const std::int64_t body = v - v % kLanes;
  for (std::int64_t i = 0; i < body; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float x = row[i + j];
      nan[j] |= x != x;
      best[j] = x > best[j] ? x : best[j];
    }
  float top = -std::numeric_limits<float>::infinity();
  int any_nan = 0;
  for (int j = 0; j < kLanes; ++j) top = best[j] > top ? best[j] : top, any_nan |= nan[j];
  for (std::int64_t i = body; i < v; ++i) top = row[i] > top ? row[i] : top, any_nan |= row[i] != row[i];
  // The first match: 16 lanes tested at once (vectorized), then the lane.
  std::int64_t i = 0;
  for (; i < body; i += kLanes) {
    int hit = 0;
    for (int j = 0; j < kLanes; ++j) hit |= any_nan ? row[i + j] != row[i + j] : row[i + j] == top;
    if (hit) break;
  }
  for (; i < v; ++i)
    if (any_nan ? row[i] != row[i] : row[i] == top) return i;
  return 0;  // not reached: the maximum or a NaN is in the row
}

void greedy_argmax(Buffer sampled, Strided logits) {
  check_rows(kGreedy, sampled, logits);
  std::int64_t* out = sampled.as<std::int64_t>();
  const float* base = logits.as<float>();
  const std::int64_t rows = logits.rows, v = logits.cols, stride = logits.row_stride;
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(rows * v, 1 << 16))
  for (std::int64_t b = 0; b < rows; ++b) out[b] = greedy_row(base + b * stride, v);
}

inline double noise_of(std::uint64_t d) {
  const double minus_log_u = d == kTopDraw ? 0x1.0p-54 : -std::log((static_cast<double>(d) + 0.5) * 0x1.0p-53);
  return -std::log(minus_log_u);
}

// One token of C40's scan: the first token that is not -inf is the best; a later one replaces it
// when (x - best_x) + g > best_g. A token is skipped only where that cannot hold: even the noise
// bound does not reach, or -log(u) >= 1 - u already exceeds exp(-(best_g - gap)) with slack, so that
// its noise stays below best_g - gap by far more than rounding. Returns whether the best changed.
struct Scan {
  double best_x = 0.0, best_g = 0.0;
  std::int64_t best = 0;
  bool seen = false;

  bool step(std::int64_t i, double x, std::uint64_t d) {
    if (x == -std::numeric_limits<double>::infinity()) return false;
    if (seen) {
      const double gap = x - best_x;  // the candidate wins iff fl(gap + g) > best_g
      if (gap + kNoiseBound <= best_g) return false;
      // 1 - u of the float64 u the noise is computed from (vLLM's (2**53 - 1 - d + 0.5) * 2**-53 is
      // 1 - u before u's rounding: up to a quarter more for a draw near the top, which prunes a
      // winner). A NaN gap fails the test, as the comparison below fails.
      const double one_minus_u = 1.0 - (static_cast<double>(d) + 0.5) * 0x1.0p-53;  // exact for u >= 1/2
      if (one_minus_u >= std::exp((gap - best_g) + kSlack)) return false;
    }
    const double g = noise_of(d);
    if (seen && !((x - best_x) + g > best_g)) return false;
    best = i, best_x = x, best_g = g, seen = true;
    return true;
  }
};

constexpr int kBlock = 16;

inline std::uint64_t draw_of(std::uint64_t key, std::int64_t i) {
  return splitmix64(key + static_cast<std::uint64_t>(i + 1) * kGamma) >> 11;
}

// A block's draws, their 1 - u, and its largest logit (NaN ignored): the block's exp test below
// takes them at once (vectorized).
SPECDIFF_CLONES float block_draws(std::uint64_t key, std::int64_t i0, const float* x, std::uint64_t* d, double* one_minus_u) {
  float top = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < kBlock; ++j) {
    d[j] = draw_of(key, i0 + j);
    one_minus_u[j] = 1.0 - (static_cast<double>(d[j]) + 0.5) * 0x1.0p-53;
    top = x[j] > top ? x[j] : top;
  }
  return top;
}

// The scan, 16 tokens at a time once a best exists: one exp per block bounds every token's exp test
// from above (exp is monotone: the block's largest logit gives the largest threshold), so a token
// whose 1 - u passes it would fail its own test, against the same best. The rest take their own
// step; once the best changes the block's remaining tokens take theirs.
std::int64_t gumbel_row(const float* row, std::int64_t v, std::uint64_t seed) {
  const std::uint64_t key = splitmix64(seed);
  Scan scan;
  std::int64_t i = 0;
  for (; i < v && !scan.seen; ++i) scan.step(i, row[i], draw_of(key, i));
  std::uint64_t d[kBlock];
  double one_minus_u[kBlock];
  for (; i + kBlock <= v; i += kBlock) {
    const double top = block_draws(key, i, row + i, d, one_minus_u);
    const double bound = std::exp(((top - scan.best_x) - scan.best_g) + kSlack);
    int j = 0;
    for (; j < kBlock; ++j) {
      if (one_minus_u[j] >= bound) continue;  // a NaN bound passes nothing
      if (scan.step(i + j, row[i + j], d[j])) break;
    }
    for (++j; j < kBlock; ++j) scan.step(i + j, row[i + j], d[j]);
  }
  for (; i < v; ++i) scan.step(i, row[i], draw_of(key, i));
  return scan.best;
}

void fused_gumbel_argmax(Buffer sampled, Strided logits, Buffer seeds) {
  check_rows(kGumbel, sampled, logits);
  if (seeds.numel != logits.rows)
    fail(kGumbel, "seeds", "must hold one seed per row of logits (" + std::to_string(logits.rows) + "), has " +
                               std::to_string(seeds.numel));
  std::int64_t* out = sampled.as<std::int64_t>();
  const std::int64_t* seed = seeds.as<std::int64_t>();
  const float* base = logits.as<float>();
  const std::int64_t rows = logits.rows, v = logits.cols, stride = logits.row_stride;
  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (parallel_if(rows > 1))
  for (std::int64_t b = 0; b < rows; ++b) out[b] = gumbel_row(base + b * stride, v, static_cast<std::uint64_t>(seed[b]));
}

}  // namespace

SPECDIFF_FAMILY(argmax, "vLLM's CPU sampler ops: greedy and Gumbel-max argmax") {
  def_kernel<&greedy_argmax>(m, "greedy_argmax");
  def_kernel<&fused_gumbel_argmax>(m, "fused_gumbel_argmax");
}

}  // namespace specdiff
