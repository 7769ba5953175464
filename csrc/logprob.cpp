// OpenMP port of Model Runner V2's logprob kernels (docs/logprob.md, C45): the log-softmax at a
// row's ids, the sampled token's rank, and the ids to score.
//
// Rows run in parallel (a row writes only itself). The log-softmax is C29's (the oracle's and
// Triton's): exact tile sums of exp32(x - G), their tree_sum, one float64 log; float32
// subtractions round as written (built with -ffp-contract=off).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common.h"
#include "gumbel.h"
#include "launch.h"
#include "metadata.h"
#include "vmath.h"

namespace specdiff {
namespace {

constexpr const char* kLogSoftmax = "_topk_log_softmax_kernel";
constexpr const char* kRanks = "_ranks_kernel";
constexpr const char* kFill = "_fill_logprob_token_ids_kernel";
constexpr double kSumScale = 0x1p46;  // C29: tile sums in units of 2^-46
constexpr std::int64_t kMaxBlock = std::int64_t{1} << 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A tile width over `extent` columns: a power of two of at most 2^16 (C29's exact tile sums), and
// extent + width within int32 (vLLM's column indices).
void need_tiles(const char* k, const char* extent_name, std::int64_t extent, const char* block_name, std::int64_t block) {
  need_at_least(k, extent_name, extent, 0);
  need_power_of_two(k, block_name, block);
  if (block > kMaxBlock) fail(k, block_name, "must be <= 65536 (a tile), got " + std::to_string(block));
  if (extent > std::numeric_limits<std::int32_t>::max() - block)  // never formed as a sum: extent may be near 2**63
    fail(k, extent_name, std::string("makes ") + extent_name + " + " + block_name + " (column indices are int32) = " +
                             std::to_string(extent) + " + " + std::to_string(block) + ", outside int32");
}

// A [rows, width] tensor's rows at `stride` (the call sites pass its stride(0)).
void need_table(const char* k, const char* name, const char* stride_name, const Strided& t, std::int64_t rows,
                std::int64_t stride, std::int64_t width) {
  if (rows > 1) {
    if (stride != t.row_stride)
      fail(k, stride_name, std::string("must be ") + name + "'s row stride " + std::to_string(t.row_stride) + ", got " +
                               std::to_string(stride));
    need_at_least(k, stride_name, stride, width);
  }
  need_rows(k, name, t, rows, stride, width);
}

// Element (r, c) of a table addressed as r * stride + c, widened to int64.
std::int64_t int_at(const Buffer& b, std::int64_t flat) {
  return b.dtype == kInt32 ? b.as<std::int32_t>()[flat] : b.as<std::int64_t>()[flat];
}

// C29: the exact sum of exp32(x - g) over x[0, n) (x - g <= 0 or -inf), in units of 2^-46, kLanes
// lanes at a time (vmath.h: the scalar specification's bits, lane for lane).
SPECDIFF_CLONES std::int64_t exp_units_sum(const float* x, std::int64_t n, float g) {
  using namespace vmath;
  const std::int64_t nv = n & ~std::int64_t{kLanes - 1};
  Lv sum{};
  for (std::int64_t j = 0; j < nv; j += kLanes) sum += exp_units(loadu(x + j) - g);
  std::int64_t units = 0;
  for (int l = 0; l < kLanes; ++l) units += sum[l];
  for (std::int64_t j = nv; j < n; ++j) units += static_cast<std::int64_t>(static_cast<double>(gumbel::exp32(x[j] - g)) * kSumScale);
  return units;
}

// C45's normalizer of a row x[0, v): G its maximum (-0.0 read as +0.0), and L = RN(log T), T the
// tree_sum of its tiles' exact sums of exp32(x - G), each rounded to float32.
struct Normalizer {
  float g, lse;
};

Normalizer normalizer(const float* x, std::int64_t v, std::int64_t block) {
  float g = kNegInf;
  for (std::int64_t c = 0; c < v; ++c) g = std::max(g, x[c]);
  g = g + 0.0f;
  const std::int64_t nb = ceil_div(v, block);
  const double total = gumbel::tree_sum(
      [&](std::int64_t b) {
        const std::int64_t units = exp_units_sum(x + b * block, std::min(block, v - b * block), g);
        return static_cast<double>(static_cast<float>(static_cast<double>(units) * (1.0 / kSumScale)));
      },
      nb);
  return {g, static_cast<float>(std::log(total))};
}

void topk_log_softmax(Buffer output, Strided logits, std::int64_t logits_stride, Strided ids, std::int64_t ids_stride,
                      std::int64_t topk, std::int64_t v, std::int64_t block, std::int64_t topk_block) {
  const char* k = kLogSoftmax;
  const std::int64_t n = logits.rows;
  need_tiles(k, "vocab_size", v, "BLOCK_SIZE", block);
  need_tiles(k, "topk", topk, "TOPK_BLOCK_SIZE", topk_block);
  need_table(k, "logits_ptr", "logits_stride", logits, n, logits_stride, v);
  if (n == 0 || topk == 0) return;
  need_table(k, "topk_ids_ptr", "topk_ids_stride", ids, n, ids_stride, topk);
  const std::int64_t cells = checked_mul(k, "output_ptr", n, topk, "rows * topk");
  if (output.numel < cells)
    fail(k, "output_ptr", "must hold " + std::to_string(n) + " rows of topk = " + std::to_string(topk) +
                              " scores (written at row * topk), has " + std::to_string(output.numel) + " elements");
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < topk; ++c) {
      const std::int64_t id = int_at(ids.data, r * ids_stride + c);
      if (id < 0 || id >= v)
        fail(k, "topk_ids_ptr", "must hold token ids in [0, vocab_size = " + std::to_string(v) + "); row " + std::to_string(r) +
                                    ", column " + std::to_string(c) + " holds " + std::to_string(id));
    }
  // C45's domain, before anything is written: finite values or -inf, and a value above -inf per row.
  float* out = output.as<float>();
  with_logits(k, "logits_ptr", logits.data.dtype, [&](auto l_) {
    using L = decltype(l_);
    for (std::int64_t r = 0; r < n; ++r) {
      const L* row = logits.as<L>() + r * logits_stride;
      bool live = false;
      for (std::int64_t c = 0; c < v; ++c) {
        const float x = to_float(row[c]);
        if (std::isnan(x) || x == kInf)
          fail(k, "logits_ptr", "must hold finite values or -inf in the rows it scores (C45); row " + std::to_string(r) +
                                    ", column " + std::to_string(c));
        live = live || x > kNegInf;
      }
      if (!live)
        fail(k, "logits_ptr", "must hold a logit above -inf in every row it scores (C45); row " + std::to_string(r) + " holds none");
    }
    NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (worth_team(n * v, 1 << 15))
    for (std::int64_t r = 0; r < n; ++r) {
      // float32 rows are read in place; half-precision ones as a float32 copy (exact conversions).
      std::vector<float> copy;
      const float* x = nullptr;
      if constexpr (std::is_same_v<L, float>) {
        x = logits.as<float>() + r * logits_stride;
      } else {
        copy.resize(static_cast<std::size_t>(v));
        const L* row = logits.as<L>() + r * logits_stride;
        for (std::int64_t c = 0; c < v; ++c) copy[c] = to_float(row[c]);
        x = copy.data();
      }
      const Normalizer z = normalizer(x, v, block);
      for (std::int64_t c = 0; c < topk; ++c) {
        const float d = x[int_at(ids.data, r * ids_stride + c)] - z.g;
        out[r * topk + c] = d - z.lse;
      }
    }
  });
}

// C45: the columns of [0, V) whose logit is >= the token's (IEEE: -0.0 == +0.0, NaN compares false).
void ranks(Buffer output, Strided logits, std::int64_t logits_stride, Buffer token_ids, std::int64_t v, std::int64_t block) {
  const char* k = kRanks;
  const std::int64_t n = logits.rows;
  need_tiles(k, "vocab_size", v, "BLOCK_SIZE", block);
  need_table(k, "logits_ptr", "logits_stride", logits, n, logits_stride, v);
  for (auto [name, b] : {std::pair{"output_ptr", &output}, std::pair{"token_ids_ptr", &token_ids}})
    if (b->numel < n) fail(k, name, "must hold an entry per row (" + std::to_string(n) + "), has " + std::to_string(b->numel));
  const std::vector<std::int64_t> tokens = load_ints(k, "token_ids_ptr", token_ids, n);
  for (std::int64_t r = 0; r < n; ++r)
    if (tokens[r] < 0 || tokens[r] >= v)
      fail(k, "token_ids_ptr", "must hold token ids in [0, vocab_size = " + std::to_string(v) + "); row " + std::to_string(r) +
                                   " holds " + std::to_string(tokens[r]));
  std::int64_t* out = output.as<std::int64_t>();
  NoGil nogil;
  with_logits(k, "logits_ptr", logits.data.dtype, [&](auto l_) {
    using L = decltype(l_);
#pragma omp parallel for schedule(static) if (worth_team(n * v, 1 << 15))
    for (std::int64_t r = 0; r < n; ++r) {
      const L* row = logits.as<L>() + r * logits_stride;
      const float x = to_float(row[tokens[r]]);
      std::int64_t count = 0;
      for (std::int64_t c = 0; c < v; ++c) count += to_float(row[c]) >= x;
      out[r] = count;
    }
  });
}

void fill_logprob_token_ids(Strided out_ids, std::int64_t out_ids_stride, Strided out_valid, std::int64_t out_valid_stride,
                            Buffer sampled, Strided topk, std::int64_t topk_stride, Buffer mapping, Buffer num_custom,
                            Strided custom, std::int64_t custom_stride, std::int64_t num_topk, std::int64_t padded) {
  const char* k = kFill;
  const std::int64_t n = out_ids.rows;
  need_power_of_two(k, "PADDED_COLS", padded);
  if (padded > kMaxBlock) fail(k, "PADDED_COLS", "must be <= 65536, got " + std::to_string(padded));
  need_at_least(k, "NUM_TOPK", num_topk, 0);
  if (num_topk > padded)
    fail(k, "NUM_TOPK", "must be <= PADDED_COLS = " + std::to_string(padded) + " (the columns a row can write), got " +
                            std::to_string(num_topk));
  for (auto [name, b] : {std::pair{"sampled_token_ids_ptr", &sampled}, std::pair{"expanded_idx_mapping_ptr", &mapping}})
    if (b->numel < n) fail(k, name, "must hold an entry per row (" + std::to_string(n) + "), has " + std::to_string(b->numel));
  if (n == 0) return;
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  for (std::int64_t r = 0; r < n; ++r)
    if (states[r] < 0 || states[r] >= num_custom.numel)
      fail(k, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(states[r]) +
                                              " must index 'num_per_req_token_ids_ptr' of " + std::to_string(num_custom.numel) +
                                              " request states");
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n));
  std::int64_t widest = 1, topk_rows = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t c = counts[r] = int_at(num_custom, states[r]), s = states[r];
    if (c <= 0) {
      topk_rows = r + 1;
      widest = std::max(widest, 1 + num_topk);
      continue;
    }
    const std::string at = "; state " + std::to_string(s) + " (row " + std::to_string(r) + ") holds " + std::to_string(c);
    if (c > padded)
      fail(k, "num_per_req_token_ids_ptr",
           "must hold counts <= PADDED_COLS = " + std::to_string(padded) + " (a row writes at most that many ids)" + at);
    if (custom_stride != custom.row_stride)
      fail(k, "per_req_token_ids_stride", "must be per_req_token_ids' row stride " + std::to_string(custom.row_stride) +
                                              ", got " + std::to_string(custom_stride));
    if (c > custom.cols)
      fail(k, "num_per_req_token_ids_ptr", "must hold counts <= per_req_token_ids' width " + std::to_string(custom.cols) + at);
    if (s >= custom.rows)
      fail(k, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(s) +
                                              " must index a row of 'per_req_token_ids_ptr' (" + std::to_string(custom.rows) + " rows)");
    widest = std::max(widest, 1 + c);
  }
  // Only the rows that take the top-k read it (NUM_TOPK == 0: a placeholder, never read).
  if (num_topk > 0 && topk_rows > 0) need_table(k, "topk_indices_ptr", "topk_indices_stride", topk, topk_rows, topk_stride, num_topk);
  need_table(k, "out_token_ids_ptr", "out_token_ids_stride", out_ids, n, out_ids_stride, widest);
  need_table(k, "out_valid_mask_ptr", "out_valid_mask_stride", out_valid, n, out_valid_stride, widest);
  std::int64_t* ids = out_ids.as<std::int64_t>();
  bool* valid = out_valid.as<bool>();
  const std::vector<std::int64_t> sampled_ids = load_ints(k, "sampled_token_ids_ptr", sampled, n);
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(n * widest, 1 << 15))
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t* row = ids + r * out_ids_stride;
    bool* row_valid = valid + r * out_valid_stride;
    row[0] = sampled_ids[r];
    row_valid[0] = true;
    const bool own = counts[r] > 0;
    const std::int64_t width = own ? counts[r] : num_topk;
    for (std::int64_t c = 0; c < width; ++c) {
      row[1 + c] = own ? int_at(custom.data, states[r] * custom_stride + c) : int_at(topk.data, r * topk_stride + c);
      row_valid[1 + c] = true;
    }
  }
}

}  // namespace

SPECDIFF_FAMILY(logprob, "Model Runner V2's logprob kernels: the log-softmax at a row's ids, the sampled token's rank, the ids to score") {
  def_kernel<&topk_log_softmax>(m, "_topk_log_softmax");
  def_kernel<&ranks>(m, "_ranks");
  def_kernel<&fill_logprob_token_ids>(m, "_fill_logprob_token_ids");
}

}  // namespace specdiff
