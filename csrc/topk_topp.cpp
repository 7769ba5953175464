// OpenMP port of the top-k/top-p mask (docs/topk_topp.md, C35).
//
// Rows run in parallel, one per iteration, as the persistent Triton programs take them; a row
// reads and writes only itself. Each cut-off is found by a radix select over an order-preserving
// key of the logits (three digits, the last two over the first digit's bin only), for the rank
// count (top-k) and the integer mass (top-p) alike, so the result is C35's exact cut-off whatever the thread count. The workspace and vLLM's
// pivot tables are not read.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "gumbel.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kKernel = "_topk_topp_kernel";
constexpr std::int64_t kTable = 200;
constexpr std::int64_t kMaxBlock = 1 << 16;
constexpr std::int64_t kMaxVocab = 1 << 21;  // a row's mass is exact in float64 (C35)

// Order-preserving unsigned key of a float32 without NaN; -0.0 keyed as +0.0 so that equal logits tie.
inline std::uint32_t key_of(float x) {
  if (x == 0.0f) x = 0.0f;
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

inline float value_of(std::uint32_t k) {
  const std::uint32_t b = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// C35's weight: floor(exp32(x - max) * 2**32). Below max - 23 it is 0 (exp(-23) < 2**-32), which
// spares the exp for the long tail of a vocabulary.
inline std::uint64_t weight_of(float x, float row_max) {
  const float d = x - row_max;
  if (!(d > -23.0f)) return 0;
  return static_cast<std::uint64_t>(gumbel::exp32(d) * 4294967296.0f);
}

// The largest key c with weight(key >= c) >= need over the columns `in` admits, and the weight of
// the keys above c. Three digit passes (11, 11, 10 bits), each a histogram of the keys that share
// the digits fixed so far: the first over the row, which also collects the columns in the chosen
// bin, the other two over those only. The caller guarantees the total weight reaches need.
template <class In, class W>
std::pair<std::uint32_t, std::uint64_t> select(std::int64_t n, const std::uint32_t* keys, In in, W weight, std::uint64_t need,
                                               std::vector<std::uint64_t>& hist, std::vector<std::int64_t>& cand) {
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
  std::uint32_t prefix = 0;
  std::uint64_t above = 0;
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level], bits = kBits[level];
    hist.assign(std::size_t{1} << bits, 0);
    const std::uint32_t digit = (1u << bits) - 1;
    if (level == 0) {
      for (std::int64_t i = 0; i < n; ++i)
        if (in(i)) hist[keys[i] >> shift] += weight(i);
    } else {
      for (const std::int64_t i : cand)
        if ((keys[i] >> (shift + bits)) == prefix) hist[(keys[i] >> shift) & digit] += weight(i);
    }
    std::int64_t b = static_cast<std::int64_t>(digit);
    for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
    prefix = (prefix << bits) | static_cast<std::uint32_t>(b);
    if (level == 0) {
      cand.clear();
      for (std::int64_t i = 0; i < n; ++i)
        if ((keys[i] >> shift) == prefix && in(i)) cand.push_back(i);
    }
  }
  return {prefix, above};
}

struct Scratch {
  std::vector<std::uint32_t> keys;
  std::vector<std::uint64_t> weights, hist;
  std::vector<std::int64_t> cand;
};

// One row, masked in place as reference/topk_topp.py states.
void mask_row(float* x, std::int64_t v, const std::int32_t* k_ptr, const float* p_ptr, std::int64_t r, bool split,
              float mask_value, Scratch& s) {
  s.keys.resize(v);
  float row_max = -std::numeric_limits<float>::infinity();
  std::int64_t finite = 0;
  for (std::int64_t i = 0; i < v; ++i) {
    s.keys[i] = key_of(x[i]);
    row_max = std::max(row_max, x[i]);
    finite += x[i] > -std::numeric_limits<float>::infinity();
  }
  const std::int64_t k = k_ptr != nullptr ? k_ptr[r] : v;
  const bool topk = k_ptr != nullptr && k < v && finite > k;
  bool topp = false;
  double p = 1.0;
  if (p_ptr != nullptr) {
    p = static_cast<double>(p_ptr[r]);
    topp = p < 1.0 && finite > 0 && !(split && k_ptr != nullptr && k >= v);
  }
  if (!topk && !topp) return;
  const std::uint32_t* keys = s.keys.data();
  const auto all = [](std::int64_t) { return true; };

  // The cut-off: keys above `pivot` kept, and the first `ties` keyed at it. Without top-k, every
  // key is a candidate for top-p.
  std::uint32_t pivot = 0;
  std::uint64_t ties = 0;
  if (topk) {
    const auto [c, above] = select(v, keys, all, [](std::int64_t) { return std::uint64_t{1}; }, static_cast<std::uint64_t>(k), s.hist, s.cand);
    pivot = c;
    ties = static_cast<std::uint64_t>(k) - above;
  }
  if (topp) {
    s.weights.assign(v, 0);
    std::uint64_t over = 0;
    for (std::int64_t i = 0; i < v; ++i)
      if (!topk || keys[i] > pivot) over += s.weights[i] = weight_of(x[i], row_max);
    const std::uint64_t tie_weight = topk ? weight_of(value_of(pivot), row_max) : 0;
    const std::uint64_t total = over + ties * tie_weight;
    // The smallest integer mass at least p * Z (float64, one rounding; Z < 2**53 is exact).
    const double need_f = p * static_cast<double>(total);
    std::uint64_t need = static_cast<std::uint64_t>(need_f);
    if (static_cast<double>(need) < need_f) ++need;
    if (over >= need) {
      const std::uint32_t floor = pivot;
      const auto in = [&](std::int64_t i) { return !topk || keys[i] > floor; };
      const auto [c, above] = select(v, keys, in, [&](std::int64_t i) { return s.weights[i]; }, need, s.hist, s.cand);
      pivot = c;
      const std::uint64_t w = weight_of(value_of(c), row_max);
      ties = (need - above + w - 1) / w;
    } else {  // the prefix ends among top-k's ties
      ties = (need - over + tie_weight - 1) / tie_weight;
    }
  }
  std::uint64_t seen = 0;
  for (std::int64_t i = 0; i < v; ++i) {
    const bool keep = keys[i] > pivot || (keys[i] == pivot && seen++ < ties);
    if (!keep) x[i] = mask_value;
  }
}

void topk_topp(Strided logits, std::int64_t stride, Buffer buffer, Buffer pct_table, Buffer cdf_table, Buffer k, Buffer p,
               std::int64_t batch, std::int64_t vocab, float mask_value, std::int64_t block, std::int64_t block_trunc,
               bool topk_enabled, bool topp_enabled, bool split) {
  need_at_least(kKernel, "BATCH_SIZE", batch, 0);
  need_at_least(kKernel, "VOCAB_SIZE", vocab, 1);
  if (vocab > kMaxVocab)
    fail(kKernel, "VOCAB_SIZE", "must be at most " + std::to_string(kMaxVocab) + " (C35: a row's mass is exact in float64)");
  for (const auto& [name, value] : {std::pair{"BLOCK_SIZE", block}, std::pair{"BLOCK_SIZE_TRUNC", block_trunc}}) {
    need_power_of_two(kKernel, name, value);
    if (value > kMaxBlock) fail(kKernel, name, "must be at most " + std::to_string(kMaxBlock));
  }
  for (const auto& [name, table] : {std::pair{"PERCENTILE_TO_STD_TABLE", pct_table}, std::pair{"NORMAL_CDF_TO_SIGMA_TABLE", cdf_table}})
    if (table.numel != kTable)
      fail(kKernel, name, "must hold vLLM's 200 entries, has " + std::to_string(table.numel));
  (void)buffer;  // its shape is the launcher's check (cpu_impl/topk_topp.py); never read
  if (batch == 0) return;
  if (batch > 1 && stride < vocab)
    fail(kKernel, "LOGITS_STRIDE_0",
         "must be >= VOCAB_SIZE=" + std::to_string(vocab) + " (rows written may not overlap), got " + std::to_string(stride));
  need_rows(kKernel, "LOGITS", logits, batch, stride, vocab);
  float* base = logits.as<float>();
  // C30, checked in parallel (a pass over every row); the first offending cell is named.
  std::vector<std::int64_t> bad(batch, -1);
  {
    py::gil_scoped_release nogil;
#pragma omp parallel for if (parallel_if(batch > 1)) schedule(static)
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t c = 0; c < vocab && bad[r] < 0; ++c) {
        const float x = base[r * stride + c];
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) bad[r] = c;
      }
  }
  for (std::int64_t r = 0; r < batch; ++r)
    if (bad[r] >= 0)
      fail(kKernel, "LOGITS",
           "must hold finite values or -inf (C30); row " + std::to_string(r) + ", column " + std::to_string(bad[r]) + " holds " +
               std::to_string(base[r * stride + bad[r]]));
  const std::int32_t* kv = nullptr;
  const float* pv = nullptr;
  if (topk_enabled) {
    need_len(kKernel, "K", k, batch);
    kv = k.as<std::int32_t>();
    for (std::int64_t r = 0; r < batch; ++r)
      if (kv[r] < 1) fail(kKernel, "K", "must hold k >= 1 in its first BATCH_SIZE=" + std::to_string(batch) + " entries, got " + std::to_string(kv[r]));
  }
  if (topp_enabled) {
    need_len(kKernel, "P", p, batch);
    pv = p.as<float>();
    for (std::int64_t r = 0; r < batch; ++r)
      if (!(pv[r] > 0.0f)) fail(kKernel, "P", "must hold p > 0 (and no NaN) in its first BATCH_SIZE entries");
  }
  py::gil_scoped_release nogil;
#pragma omp parallel if (parallel_if(batch > 1))
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t r = 0; r < batch; ++r) mask_row(base + r * stride, vocab, kv, pv, r, split, mask_value, s);
  }
}

}  // namespace

void register_topk_topp(py::module_& m) { def_kernel<&topk_topp>(m, "_topk_topp"); }

}  // namespace specdiff
