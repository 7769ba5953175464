// OpenMP port of Model Runner V2's sampling parameters (docs/sample.md, C41): the temperature and
// min-p, in place on the sampler's float32 logits.
//
// Rows run in parallel (a row writes only itself). Division is IEEE float32 (built with
// -ffp-contract=off); min-p's log is C29's log32, the oracle's and Triton's.
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "gumbel.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kTemperature = "_temperature_kernel";
constexpr const char* kMinP = "_min_p_kernel";

// The rows' request states, each checked against the per-request table; the rows inside logits.
std::vector<std::int64_t> check_rows(const char* kernel, const char* table, const Strided& logits, std::int64_t stride,
                                     const Buffer& mapping, const Buffer& params, std::int64_t v, std::int64_t block) {
  const std::int64_t n = logits.rows;
  need_at_least(kernel, "vocab_size", v, 0);
  need_power_of_two(kernel, "BLOCK_SIZE", block);
  if (block > (1 << 16)) fail(kernel, "BLOCK_SIZE", "must be <= 65536 (a tile), got " + std::to_string(block));
  if (v > std::numeric_limits<std::int32_t>::max() - block)  // never formed as a sum: v may be near 2**63
    fail(kernel, "vocab_size", "makes vocab_size + BLOCK_SIZE (column indices are int32) = " + std::to_string(v) + " + " +
                                   std::to_string(block) + ", outside int32");
  if (n > 1) {
    if (stride != logits.row_stride)
      fail(kernel, "logits_stride", "must be logits_ptr's row stride " + std::to_string(logits.row_stride) + ", got " +
                                        std::to_string(stride));
    need_at_least(kernel, "logits_stride", stride, v);
  }
  need_rows(kernel, "logits_ptr", logits, n, stride, v);
  if (mapping.numel < n)
    fail(kernel, "expanded_idx_mapping_ptr", "must hold a request state per row (" + std::to_string(n) + "), has " +
                                                 std::to_string(mapping.numel));
  std::vector<std::int64_t> states = load_ints(kernel, "expanded_idx_mapping_ptr", mapping, n);
  for (std::int64_t r = 0; r < n; ++r)
    if (states[r] < 0 || states[r] >= params.numel)
      fail(kernel, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(states[r]) +
                                                   " must index '" + table + "' of " + std::to_string(params.numel) +
                                                   " request states");
  return states;
}

// C41's domain where a row is read: no NaN logit, and a temperature that divides finite and positive.
void check_read_rows(const char* kernel, const char* table, const Strided& logits, std::int64_t stride,
                     const std::vector<std::int64_t>& states, const float* params, std::int64_t v, bool divides) {
  const float* base = logits.as<float>();
  for (std::int64_t r = 0; r < logits.rows; ++r) {
    const float value = params[states[r]];
    if (value == 0.0f || (divides && value == 1.0f) || v == 0) continue;
    if (divides && !(value > 0.0f && value < std::numeric_limits<float>::infinity()))
      fail(kernel, table, "must be 0, 1, or finite and positive where a row divides by it (C41); state " +
                              std::to_string(states[r]) + " holds " + std::to_string(value));
    const float* row = base + r * stride;
    for (std::int64_t c = 0; c < v; ++c)
      if (std::isnan(row[c]))
        fail(kernel, "logits_ptr", std::string("must hold no NaN in a row it ") + (divides ? "divides" : "masks") +
                                       " (C41); row " + std::to_string(r) + ", column " + std::to_string(c));
  }
}

void temperature(Strided logits, std::int64_t stride, Buffer mapping, Buffer temperature, std::int64_t v, std::int64_t block) {
  const std::vector<std::int64_t> states = check_rows(kTemperature, "temperature_ptr", logits, stride, mapping, temperature, v, block);
  const std::int64_t n = logits.rows;
  float* base = logits.as<float>();
  const float* temp = temperature.as<float>();
  check_read_rows(kTemperature, "temperature_ptr", logits, stride, states, temp, v, true);
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(n * v, 1 << 15))
  for (std::int64_t r = 0; r < n; ++r) {
    const float t = temp[states[r]];
    if (t == 0.0f || t == 1.0f) continue;
    float* row = base + r * stride;
    for (std::int64_t c = 0; c < v; ++c) row[c] = row[c] / t;
  }
}

// C41: the row's maximum plus log32(min_p), one float32 addition; logits below it become -inf.
void min_p(Strided logits, std::int64_t stride, Buffer mapping, Buffer min_p, std::int64_t v, std::int64_t block) {
  const std::vector<std::int64_t> states = check_rows(kMinP, "min_p_ptr", logits, stride, mapping, min_p, v, block);
  const std::int64_t n = logits.rows;
  float* base = logits.as<float>();
  const float* p = min_p.as<float>();
  check_read_rows(kMinP, "min_p_ptr", logits, stride, states, p, v, false);
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(n * v, 1 << 15))
  for (std::int64_t r = 0; r < n; ++r) {
    const float mp = p[states[r]];
    if (mp == 0.0f || v == 0) continue;
    float* row = base + r * stride;
    float top = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < v; ++c) top = row[c] > top ? row[c] : top;
    const float threshold = top + gumbel::log32(mp);
    for (std::int64_t c = 0; c < v; ++c)
      if (row[c] < threshold) row[c] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

SPECDIFF_FAMILY(sample, "Model Runner V2's sampling parameters: temperature and min-p") {
  def_kernel<&temperature>(m, "_temperature");
  def_kernel<&min_p>(m, "_min_p");
}

}  // namespace specdiff
