// OpenMP port of Model Runner V2's logit bias (docs/logit_bias.md, C44): per row, in place on the
// sampler's float32 logits, the allowed token ids (the rest -inf), the logit bias (float32 adds) and
// min tokens (stop tokens -inf, restored where that leaves the row all -inf and the request asks).
//
// Every list, id and state is checked before anything is written; then rows run in parallel (a row
// writes only itself). Built with -ffp-contract=off: a bias is one float32 addition.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kBias = "_bias_kernel";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string str(std::int64_t x) { return std::to_string(x); }

// An int32 or int64 table read element by element.
struct Ints {
  std::uintptr_t ptr;
  bool wide;
  std::int64_t operator[](std::int64_t i) const {
    return wide ? reinterpret_cast<const std::int64_t*>(ptr)[i] : reinterpret_cast<const std::int32_t*>(ptr)[i];
  }
};

Ints ints(const char* name, const Buffer& b) {
  if (b.dtype != kInt32 && b.dtype != kInt64) throw TypeError(std::string(kBias) + ": '" + name + "' must be int32 or int64");
  return Ints{b.ptr, b.dtype == kInt64};
}

// One step's list: its count per state, its [max_num_reqs, width] table and the table's stride.
struct List {
  const char *count_name, *name, *what;
  std::vector<std::int64_t> counts;
  Strided table;
  std::int64_t stride;
  Ints ids;
  std::int64_t at(std::int64_t s, std::int64_t j) const { return ids[s * stride + j]; }
};

List list(const char* count_name, const char* name, const char* stride_name, const char* what, const Buffer& counts,
          const Strided& table, std::int64_t stride) {
  if (table.rows > 1 && stride != table.row_stride)
    fail(kBias, stride_name, std::string("must be ") + name + "'s row stride " + str(table.row_stride) + ", got " + str(stride));
  return List{count_name, name, what, load_ints(kBias, count_name, counts, counts.numel), table, stride, ints(name, table.data)};
}

// State s's count: in [0, width] and within BLOCK_SIZE; where the row reads the list (`read`), the
// state a row of the table (and of `also`, the bias values) and every id a column.
std::int64_t check_list(const List& l, std::int64_t r, std::int64_t s, std::int64_t v, std::int64_t block, bool read,
                        const Strided* also = nullptr, const char* also_name = nullptr) {
  const std::int64_t n = l.counts[s], width = also ? std::min(l.table.cols, also->cols) : l.table.cols;
  if (n < 0 || n > width)
    fail(kBias, l.count_name,
         "entry " + str(s) + " = " + str(n) + " must be in [0, " + str(width) + "] (the " + l.what + " table's width)");
  if (n > block) fail(kBias, "BLOCK_SIZE", "must hold state " + str(s) + "'s " + str(n) + " " + l.what + ", got " + str(block));
  if (n == 0 || !read) return 0;
  for (auto [name, rows] : {std::pair{l.name, l.table.rows}, std::pair{also_name, also ? also->rows : l.table.rows}})
    if (s >= rows)
      fail(kBias, "expanded_idx_mapping_ptr", "entry " + str(r) + " = " + str(s) + " must index '" + name + "' of " + str(rows) +
                                                  " request states");
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t c = l.at(s, j);
    if (c < 0 || c >= v)
      fail(kBias, l.name,
           "state " + str(s) + "'s " + l.what + " entry " + str(j) + " = " + str(c) + " must be a column in [0, " + str(v) + ")");
  }
  return n;
}

void need_no_nan(std::int64_t r, const float* row, const std::vector<char>& where, std::int64_t v, const char* why) {
  for (std::int64_t c = 0; c < v; ++c)
    if (where[c] && std::isnan(row[c]))
      fail(kBias, "logits_ptr", std::string("must hold no NaN ") + why +
                                    " (C44; a NaN's bits, and a maximum over one, are the platform's); row " + str(r) +
                                    ", column " + str(c));
}

void bias(Strided logits, std::int64_t logits_stride, std::int64_t v, Buffer mapping, Buffer num_allowed, Strided allowed,
          std::int64_t allowed_stride, Buffer num_bias, Strided bias_ids, std::int64_t bias_ids_stride, Strided bias,
          std::int64_t bias_stride,
          Buffer pos, Buffer min_lens, Buffer num_stop, Buffer restore, Strided stop, std::int64_t stop_stride, std::int64_t block,
          std::int64_t logits_block, bool check_all_masked_rows) {
  const char* k = kBias;
  if (logits.data.dtype != kFloat32) throw TypeError(std::string(k) + ": 'logits_ptr' must be float32");
  if (bias.data.dtype != kFloat32) throw TypeError(std::string(k) + ": 'bias_ptr' must be float32");
  const std::int64_t n = logits.rows;
  need_at_least(k, "vocab_size", v, 0);
  for (auto [name, b] : {std::pair{"BLOCK_SIZE", block}, std::pair{"LOGITS_BLOCK_SIZE", logits_block}}) {
    need_power_of_two(k, name, b);
    if (b > (1 << 16)) fail(k, name, "must be <= 65536 (a tile), got " + str(b));
  }
  if (v > std::numeric_limits<std::int32_t>::max() - logits_block)  // never formed as a sum: v may be near 2**63
    fail(k, "vocab_size", "makes vocab_size + LOGITS_BLOCK_SIZE (column indices are int32) = " + str(v) + " + " + str(logits_block) +
                              ", outside int32");
  if (n > 1) {
    if (logits_stride != logits.row_stride)
      fail(k, "logits_stride", "must be logits_ptr's row stride " + str(logits.row_stride) + ", got " + str(logits_stride));
    need_at_least(k, "logits_stride", logits_stride, v);
  }
  need_rows(k, "logits_ptr", logits, n, logits_stride, v);
  for (auto [name, b] : {std::pair{"expanded_idx_mapping_ptr", &mapping}, std::pair{"pos_ptr", &pos}})
    if (b->numel < n) fail(k, name, "must hold an entry per row (" + str(n) + "), has " + str(b->numel));
  const List a_list = list("num_allowed_token_ids_ptr", "allowed_token_ids_ptr", "allowed_token_ids_stride", "allowed token ids",
                           num_allowed, allowed, allowed_stride);
  const List b_list = list("num_logit_bias_ptr", "bias_token_ids_ptr", "bias_token_ids_stride", "logit bias token ids", num_bias,
                           bias_ids, bias_ids_stride);
  const List s_list = list("num_stop_token_ids_ptr", "stop_token_ids_ptr", "stop_token_ids_stride", "stop token ids", num_stop, stop,
                           stop_stride);
  if (bias.rows > 1 && bias_stride != bias.row_stride)
    fail(k, "bias_stride", "must be bias_ptr's row stride " + str(bias.row_stride) + ", got " + str(bias_stride));
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  const std::vector<std::int64_t> positions = load_ints(k, "pos_ptr", pos, n);
  const std::vector<std::int64_t> mins = load_ints(k, "min_lens_ptr", min_lens, min_lens.numel);
  const std::vector<std::int64_t> restores = load_ints(k, "restore_when_all_masked_ptr", restore, restore.numel);
  const float* values = bias.as<float>();
  float* base = logits.as<float>();
  std::vector<char> active(static_cast<std::size_t>(n), 0), restoring(static_cast<std::size_t>(n), 0);
  std::vector<char> keep, marks;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r];
    for (auto [name, size] : {std::pair{"num_allowed_token_ids_ptr", num_allowed.numel}, std::pair{"num_logit_bias_ptr", num_bias.numel},
                              std::pair{"min_lens_ptr", min_lens.numel}, std::pair{"num_stop_token_ids_ptr", num_stop.numel}})
      if (s < 0 || s >= size)
        fail(k, "expanded_idx_mapping_ptr",
             "entry " + str(r) + " = " + str(s) + " must index '" + name + "' of " + str(size) + " request states");
    const std::int64_t p = positions[r];
    if (p < 0 || p >= std::numeric_limits<std::int32_t>::max())
      fail(k, "pos_ptr", "entry " + str(r) + " = " + str(p) + " must be a position in [0, 2**31 - 1) (pos + 1 is int32)");
    const float* row = base + r * logits_stride;
    const std::int64_t na = check_list(a_list, r, s, v, block, true);
    keep.assign(static_cast<std::size_t>(v), na == 0);
    for (std::int64_t j = 0; j < na; ++j) keep[a_list.at(s, j)] = 1;
    const std::int64_t nb = check_list(b_list, r, s, v, block, true, &bias, "bias_ptr");
    if (nb > 0) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(nb));
      for (std::int64_t j = 0; j < nb; ++j) ids[j] = b_list.at(s, j);
      std::vector<std::int64_t> sorted = ids;
      std::sort(sorted.begin(), sorted.end());
      for (std::int64_t j = 1; j < nb; ++j)  // a dict's keys: two lanes adding to one column would race
        if (sorted[j] == sorted[j - 1])
          fail(k, "bias_token_ids_ptr", "state " + str(s) + " lists token " + str(sorted[j]) + " twice (C44: distinct ids, a dict's keys)");
      marks.assign(static_cast<std::size_t>(v), 0);
      for (std::int64_t j = 0; j < nb; ++j) {
        const float b = values[s * bias_stride + j];
        if (!std::isfinite(b))
          fail(k, "bias_ptr", "state " + str(s) + "'s bias " + str(j) + " = " + std::to_string(b) + " must be finite (C44)");
        marks[ids[j]] = keep[ids[j]];
      }
      need_no_nan(r, row, marks, v, "at a column it biases");
    }
    active[r] = s_list.counts[s] > 0 && p + 1 < mins[s];
    const std::int64_t ns = check_list(s_list, r, s, v, block, active[r]);
    if (!active[r]) continue;
    if (check_all_masked_rows) {
      if (s >= restore.numel)
        fail(k, "expanded_idx_mapping_ptr", "entry " + str(r) + " = " + str(s) + " must index 'restore_when_all_masked_ptr' of " +
                                                str(restore.numel) + " request states");
      restoring[r] = restores[s] != 0;
    }
    if (restoring[r]) {
      for (std::int64_t j = 0; j < ns; ++j) keep[s_list.at(s, j)] = 0;
      need_no_nan(r, row, keep, v, "in a row scanned for a live logit");
    }
  }
  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 4) if (worth_team(n * v, 1 << 15))
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r];
    float* row = base + r * logits_stride;
    // 1. Allowed token ids: the listed columns keep their values, the rest become -inf.
    const std::int64_t na = a_list.counts[s];
    if (na > 0) {
      std::vector<float> kept(static_cast<std::size_t>(na));
      for (std::int64_t j = 0; j < na; ++j) kept[j] = row[a_list.at(s, j)];
      std::fill(row, row + v, kNegInf);
      for (std::int64_t j = 0; j < na; ++j) row[a_list.at(s, j)] = kept[j];
    }
    // 2. Logit bias: one float32 addition at each (distinct) listed column.
    for (std::int64_t j = 0; j < b_list.counts[s]; ++j) {
      const std::int64_t c = b_list.at(s, j);
      row[c] = row[c] + values[s * bias_stride + j];
    }
    // 3. Min tokens: the stop tokens become -inf; a restoring row left all -inf takes back their finite values.
    if (!active[r]) continue;
    const std::int64_t ns = s_list.counts[s];
    std::vector<float> saved(static_cast<std::size_t>(ns));
    for (std::int64_t j = 0; j < ns; ++j) saved[j] = row[s_list.at(s, j)];
    for (std::int64_t j = 0; j < ns; ++j) row[s_list.at(s, j)] = kNegInf;
    if (!restoring[r]) continue;
    bool masked = true;
    for (std::int64_t c = 0; c < v && masked; ++c) masked = row[c] == kNegInf;
    if (!masked) continue;
    for (std::int64_t j = 0; j < ns; ++j)
      if (std::isfinite(saved[j])) row[s_list.at(s, j)] = saved[j];
  }
}

}  // namespace

SPECDIFF_FAMILY(logit_bias, "Model Runner V2's logit bias: allowed token ids, float32 biases and min tokens' stop masks") {
  def_kernel<&bias>(m, "_bias");
}

}  // namespace specdiff
