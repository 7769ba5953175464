// OpenMP port of Model Runner V2's sampling parameters (docs/sample.md, C41): the temperature and
// min-p, in place on the sampler's float32 logits, and the Gumbel-max sampler's tiles.
//
// Rows run in parallel (a row writes only itself). Division is IEEE float32 (built with
// -ffp-contract=off); min-p's log is C29's log32 and the noise C29's murmur3 stream, the oracle's
// and Triton's.
#include <omp.h>

#include <algorithm>
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

constexpr const char* kTemperature = "_temperature_kernel";
constexpr const char* kMinP = "_min_p_kernel";

// The vocabulary and its tiles: column indices are int32, a tile at most 2**16 wide.
void need_tiles(const char* kernel, std::int64_t v, std::int64_t block, std::int64_t least_vocab) {
  need_at_least(kernel, "vocab_size", v, least_vocab);
  need_power_of_two(kernel, "BLOCK_SIZE", block);
  if (block > (1 << 16)) fail(kernel, "BLOCK_SIZE", "must be <= 65536 (a tile), got " + std::to_string(block));
  if (v > std::numeric_limits<std::int32_t>::max() - block)  // never formed as a sum: v may be near 2**63
    fail(kernel, "vocab_size", "makes vocab_size + BLOCK_SIZE (column indices are int32) = " + std::to_string(v) + " + " +
                                   std::to_string(block) + ", outside int32");
}

// A [rows, width] tensor's rows at `stride` (the call sites pass its stride(0)).
void need_table(const char* kernel, const char* name, const char* stride_name, const Strided& t, std::int64_t rows,
                std::int64_t stride, std::int64_t width) {
  if (rows > 1) {
    if (stride != t.row_stride)
      fail(kernel, stride_name, std::string("must be ") + name + "'s row stride " + std::to_string(t.row_stride) + ", got " +
                                    std::to_string(stride));
    need_at_least(kernel, stride_name, stride, width);
  }
  need_rows(kernel, name, t, rows, stride, width);
}

// The rows' request states, each checked against the per-request table; the rows inside logits.
std::vector<std::int64_t> check_rows(const char* kernel, const char* table, const Strided& logits, std::int64_t stride,
                                     const Buffer& mapping, const Buffer& params, std::int64_t v, std::int64_t block) {
  const std::int64_t n = logits.rows;
  need_tiles(kernel, v, block, 0);
  need_table(kernel, "logits_ptr", "logits_stride", logits, n, stride, v);
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

constexpr const char* kGumbel = "_gumbel_sample_kernel";
constexpr std::int64_t kDraftNoiseSalt = std::int64_t{1} << 30;

struct GumbelRow {
  std::int64_t state;  // negative: a padding row
  float temp;
  std::int64_t seed, pos, cache_at;
};

template <class L>
float logit_at(const Strided& logits, std::int64_t r, std::int64_t stride, std::int64_t c) {
  return to_float(logits.as<L>()[r * stride + c]);
}

void gumbel_sample(Strided local_argmax, std::int64_t argmax_stride, Strided local_max, std::int64_t max_stride, Buffer cache,
                   std::int64_t cache_s0, std::int64_t cache_s1, Buffer cols, Strided source, std::int64_t source_stride,
                   Strided logits, std::int64_t logits_stride, Buffer mapping, Buffer seeds, Buffer pos, Buffer temp,
                   std::int64_t v, std::int64_t block, bool is_drafting, bool apply_temperature, bool use_fp64,
                   bool per_token_col) {
  const char* k = kGumbel;
  const std::int64_t n = logits.rows;
  need_tiles(k, v, block, 1);
  const std::int64_t nb = ceil_div(v, block);
  need_table(k, "logits_ptr", "logits_stride", logits, n, logits_stride, v);
  need_table(k, "local_argmax_ptr", "local_argmax_stride", local_argmax, n, argmax_stride, nb);
  need_table(k, "local_max_ptr", "local_max_stride", local_max, n, max_stride, nb);
  for (auto [name, b] : {std::pair{"expanded_idx_mapping_ptr", &mapping}, std::pair{"pos_ptr", &pos}})
    if (b->numel < n) fail(k, name, "must hold an entry per row (" + std::to_string(n) + "), has " + std::to_string(b->numel));
  const bool cached = cache.present();
  if (cached) {
    if (!cols.present()) fail(k, "logits_cache_col_ptr", "must be given with logits_cache_ptr");
    if (!source.data.present()) fail(k, "logits_cache_source_ptr", "must be given with logits_cache_ptr (the host passes the logits)");
    if (source.data.dtype != cache.dtype) fail(k, "logits_cache_source_ptr", "must have logits_cache_ptr's dtype");
    need_table(k, "logits_cache_source_ptr", "logits_cache_source_stride", source, n, source_stride, v);
    const std::int64_t need = per_token_col ? n : 1;
    if (cols.numel < need)
      fail(k, "logits_cache_col_ptr", "must hold " + std::to_string(need) + " column(s), has " + std::to_string(cols.numel));
    need_at_least(k, "logits_cache_stride_0", cache_s0, 0);
    need_at_least(k, "logits_cache_stride_1", cache_s1, 0);
  }
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  const std::vector<std::int64_t> positions = load_ints(k, "pos_ptr", pos, n);
  const std::vector<std::int64_t> columns = cached ? load_ints(k, "logits_cache_col_ptr", cols, per_token_col ? n : 1)
                                                   : std::vector<std::int64_t>{};
  std::vector<GumbelRow> rows(static_cast<std::size_t>(n));
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;
  for (std::int64_t r = 0; r < n; ++r) {
    GumbelRow& g = rows[r];
    g.state = states[r], g.pos = positions[r], g.temp = 0.0f, g.seed = 0, g.cache_at = -1;
    if (g.pos < 0 || g.pos >= (std::int64_t{1} << 62))
      fail(k, "pos_ptr", "entry " + std::to_string(r) + " = " + std::to_string(g.pos) + " must be a position in [0, 2**62)");
    with_logits(k, "logits_ptr", logits.data.dtype, [&](auto l_) {
      using L = decltype(l_);
      for (std::int64_t c = 0; c < v; ++c) {
        const float x = logit_at<L>(logits, r, logits_stride, c);
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
          fail(k, "logits_ptr", "must hold finite values or -inf (C30); row " + std::to_string(r) + ", column " + std::to_string(c));
      }
    });
    if (g.state < 0) continue;
    for (auto [name, b] : {std::pair{"temp_ptr", &temp}, std::pair{"seeds_ptr", &seeds}})
      if (g.state >= b->numel)
        fail(k, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(g.state) + " must index '" + name +
                                                "' of " + std::to_string(b->numel) + " request states (or be negative: padding)");
    g.temp = temp.as<float>()[g.state];
    if (!(g.temp == 0.0f || (g.temp > 0.0f && g.temp < std::numeric_limits<float>::infinity())))
      fail(k, "temp_ptr", "must be 0 or finite and positive for a row that samples (C41); state " + std::to_string(g.state) +
                              " holds " + std::to_string(g.temp));
    g.seed = seeds.as<std::int64_t>()[g.state];
    if (cached) {
      const std::int64_t col = columns[per_token_col ? r : 0];
      if (col < 0)
        fail(k, "logits_cache_col_ptr", "row " + std::to_string(r) + "'s column " + std::to_string(col) + " must be >= 0 (a draft step)");
      std::int64_t at = flat_index(g.state, cache_s0, 0), part = flat_index(col, cache_s1, 0);
      if (at < 0 || part < 0 || __builtin_add_overflow(at, part, &at) || at < 0 || at > cache.numel - v)
        fail(k, "logits_cache_col_ptr", "places row " + std::to_string(r) + "'s cache copy (state " + std::to_string(g.state) +
                                            ") outside logits_cache_ptr's " + std::to_string(cache.numel) + " elements");
      g.cache_at = at;
      spans.emplace_back(at, r);
    }
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].first + v)
      fail(k, "expanded_idx_mapping_ptr", "rows " + std::to_string(spans[i - 1].second) + " and " + std::to_string(spans[i].second) +
                                              " copy into overlapping cache cells");
  NoGil nogil;
  with_logits(k, "logits_ptr", logits.data.dtype, [&](auto l_) {
    using L = decltype(l_);
#pragma omp parallel for schedule(dynamic, 1) if (worth_team(n * v, 1 << 15))
    for (std::int64_t r = 0; r < n; ++r) {
      const GumbelRow& g = rows[r];
      std::int64_t seed = g.seed;
      if (cached) {
        if (g.cache_at >= 0) {
          const std::size_t bytes = element_size(cache.dtype);
          std::memcpy(reinterpret_cast<char*>(cache.ptr) + g.cache_at * bytes,
                      reinterpret_cast<const char*>(source.data.ptr) + r * source_stride * bytes, static_cast<std::size_t>(v) * bytes);
        }
        seed = gumbel::spec_step_seed(seed, columns[per_token_col ? r : 0]);
      }
      // The hash state after seed and position, once per row (each lane adds only its column).
      const std::int64_t p = g.pos + (is_drafting ? kDraftNoiseSalt : 0);
      const std::uint32_t prefix = gumbel::murmur3_prefix(seed, p), prefix_hi = gumbel::murmur3_prefix(seed, p, gumbel::kDomainHi);
      std::int64_t* arg_out = local_argmax.as<std::int64_t>() + r * argmax_stride;
      for (std::int64_t b = 0; b < nb; ++b) {
        double best = -std::numeric_limits<double>::infinity();
        std::int64_t best_c = b * block;
        for (std::int64_t c = b * block; c < (b + 1) * block; ++c) {
          double score = -std::numeric_limits<double>::infinity();
          if (c < v) {
            float x = logit_at<L>(logits, r, logits_stride, c) + 0.0f;  // -0.0 reads as +0.0 (C30)
            if (g.temp != 0.0f && apply_temperature) x = x / g.temp;
            const std::uint32_t key = static_cast<std::uint32_t>(c);
            const std::uint32_t h = g.temp != 0.0f ? gumbel::murmur3_finish(prefix, key) : 0u;
            if (use_fp64) {
              score = x;
              if (g.temp != 0.0f) score = score + gumbel::gumbel64(gumbel::uniform64(h, gumbel::murmur3_finish(prefix_hi, key)));
            } else {
              float s32 = x;
              if (g.temp != 0.0f) s32 = s32 + gumbel::gumbel32(gumbel::uniform32(h));
              score = s32;
            }
          }
          if (c == b * block || score > best) best = score, best_c = c;
        }
        arg_out[b] = best_c;
        if (use_fp64)
          local_max.as<double>()[r * max_stride + b] = best;
        else
          local_max.as<float>()[r * max_stride + b] = static_cast<float>(best);
      }
    }
  });
}

}  // namespace

SPECDIFF_FAMILY(sample, "Model Runner V2's sampling parameters: temperature and min-p; the Gumbel-max sampler's tiles") {
  def_kernel<&temperature>(m, "_temperature");
  def_kernel<&min_p>(m, "_min_p");
  def_kernel<&gumbel_sample>(m, "_gumbel_sample");
}

}  // namespace specdiff
