// OpenMP port of Model Runner V2's penalties (docs/penalties.md, C42): the repetition, frequency and
// presence penalties in place on the sampler's float32 logits, and the prompt bitmask and output
// counts a new request's prefill fills.
//
// K39's rows run in parallel (a row writes only itself); every operation rounds once (built with
// -ffp-contract=off: no product fuses into the subtraction after it). K40's rows run in parallel
// and update the tables with atomics, as vLLM's kernel does: two rows may name one state.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"
#include "state.h"

namespace specdiff {
namespace {

using state::i128;
using state::need_cells;
using state::need_int32;

constexpr const char* kPenalties = "_penalties_kernel";
constexpr const char* kBincount = "_bincount_kernel";
constexpr std::int64_t kWord = 32;  // prompt tokens per bitmask word
constexpr float kFrequencyBound = 0x1p96f;  // times any int32 count: finite (contracts/penalties.py)

bool uses_penalty(float rep, float freq, float pres) { return rep != 1.0f || freq != 0.0f || pres != 0.0f; }

// C42's domain of a penalised row r of state s: its reads inside their tensors, no lane making a NaN.
void check_penalised_row(const Strided& logits, std::int64_t stride, const state::Ints& tokens, std::int64_t token_count,
                         std::int64_t r, std::int64_t s, std::int64_t pos, float rep, float freq, float pres,
                         const Strided& mask, std::int64_t mask_stride, const Strided& counts, std::int64_t counts_stride,
                         std::int64_t v) {
  const char* k = kPenalties;
  const std::string state = std::to_string(s);
  if (!(rep == 1.0f || (rep > 0.0f && rep < std::numeric_limits<float>::infinity())))
    fail(k, "repetition_penalty_ptr", "must be finite and > 0 where a row is penalised (C42); state " + state + " holds " +
                                          std::to_string(rep));
  if (!(std::fabs(freq) <= kFrequencyBound))
    fail(k, "frequency_penalty_ptr", "must be finite, |x| <= 2**96, where a row is penalised (C42); state " + state + " holds " +
                                         std::to_string(freq));
  if (!(std::fabs(pres) < std::numeric_limits<float>::infinity()))
    fail(k, "presence_penalty_ptr", "must be finite where a row is penalised (C42); state " + state + " holds " +
                                        std::to_string(pres));
  const float* row = logits.as<float>() + r * stride;
  for (std::int64_t c = 0; c < v; ++c)
    if (std::isnan(row[c]))
      fail(k, "logits_ptr", "must hold no NaN in a row it penalises (C42, C30); row " + std::to_string(r) + ", column " +
                                std::to_string(c));
  if (pos < 0 || pos > r + 1)
    fail(k, "expanded_local_pos_ptr", "entry " + std::to_string(r) + " = " + std::to_string(pos) + " must be in [0, " +
                                          std::to_string(r + 1) + "]: the row's earlier drafts lie from index 0 on");
  if (pos && token_count <= r)
    fail(k, "token_ids_ptr", "must hold row " + std::to_string(r) + "'s token (its earlier drafts end there), has " +
                                 std::to_string(token_count));
  need_cells(k, "output_bin_counts_ptr", counts, static_cast<i128>(s) * counts_stride, v, "request state ", s, "'s counts");
  if (rep != 1.0f)
    need_cells(k, "prompt_bin_mask_ptr", mask, static_cast<i128>(s) * mask_stride, ceil_div(v, kWord), "request state ", s,
               "'s prompt words");
  if (!pos) return;
  std::vector<std::int64_t> drafts;  // the earlier drafts inside the vocabulary, sorted: equal ones adjacent
  for (std::int64_t j = r - pos + 1; j <= r; ++j)
    if (tokens[j] >= 0 && tokens[j] < v) drafts.push_back(tokens[j]);
  std::sort(drafts.begin(), drafts.end());
  const std::int32_t* base = counts.as<std::int32_t>() + s * counts_stride;
  for (std::size_t i = 0; i < drafts.size();) {
    std::size_t j = i;
    while (j < drafts.size() && drafts[j] == drafts[i]) ++j;
    need_int32(k, "output_bin_counts_ptr", static_cast<i128>(base[drafts[i]]) + static_cast<i128>(j - i), "row ", r,
               "'s count of token ", drafts[i], " (request state ", s, "'s count plus its earlier drafts)");
    i = j;
  }
}

void penalties(Strided logits, std::int64_t logits_stride, Buffer mapping, Buffer token_ids, Buffer local_pos, Buffer rep_t,
               Buffer freq_t, Buffer pres_t, Strided mask, std::int64_t mask_stride, Strided counts, std::int64_t counts_stride,
               std::int64_t v, std::int64_t block) {
  const char* k = kPenalties;
  const std::int64_t n = logits.rows;
  need_at_least(k, "vocab_size", v, 0);
  need_power_of_two(k, "BLOCK_SIZE", block);
  if (block < kWord || block > (1 << 16))
    fail(k, "BLOCK_SIZE", "must be in [32, 65536] (a tile of whole bitmask words), got " + std::to_string(block));
  if (v > std::numeric_limits<std::int32_t>::max() - block)  // never formed as a sum: v may be near 2**63
    fail(k, "vocab_size", "makes vocab_size + BLOCK_SIZE (column indices are int32) = " + std::to_string(v) + " + " +
                              std::to_string(block) + ", outside int32");
  if (n > 1) {
    if (logits_stride != logits.row_stride)
      fail(k, "logits_stride", "must be logits_ptr's row stride " + std::to_string(logits.row_stride) + ", got " +
                                   std::to_string(logits_stride));
    need_at_least(k, "logits_stride", logits_stride, v);
  }
  need_rows(k, "logits_ptr", logits, n, logits_stride, v);
  if (mapping.numel < n)
    fail(k, "expanded_idx_mapping_ptr", "must hold an entry per row (" + std::to_string(n) + "), has " + std::to_string(mapping.numel));
  if (local_pos.numel < n)
    fail(k, "expanded_local_pos_ptr", "must hold an entry per row (" + std::to_string(n) + "), has " + std::to_string(local_pos.numel));
  if (mask.cols < ceil_div(v, kWord))
    fail(k, "prompt_bin_mask_ptr", "must have >= " + std::to_string(ceil_div(v, kWord)) + " columns (a request state's row), has " +
                                       std::to_string(mask.cols));
  if (counts.cols < v)
    fail(k, "output_bin_counts_ptr", "must have >= " + std::to_string(v) + " columns (a request state's row), has " +
                                         std::to_string(counts.cols));
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  for (std::int64_t r = 0; r < n; ++r)
    for (auto [table, b] : {std::pair{"repetition_penalty_ptr", &rep_t}, std::pair{"frequency_penalty_ptr", &freq_t},
                            std::pair{"presence_penalty_ptr", &pres_t}})
      if (states[r] < 0 || states[r] >= b->numel)
        fail(k, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(states[r]) + " must index '" +
                                                table + "' of " + std::to_string(b->numel) + " request states");
  if (v == 0) return;
  const float* rep = rep_t.as<float>();
  const float* freq = freq_t.as<float>();
  const float* pres = pres_t.as<float>();
  const std::vector<std::int64_t> positions = load_ints(k, "expanded_local_pos_ptr", local_pos, n);
  const state::Ints tokens(token_ids);
  std::vector<std::int64_t> penalised;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r];
    if (!uses_penalty(rep[s], freq[s], pres[s])) continue;  // neither read nor written
    check_penalised_row(logits, logits_stride, tokens, token_ids.numel, r, s, positions[r], rep[s], freq[s], pres[s], mask,
                        mask_stride, counts, counts_stride, v);
    penalised.push_back(r);
  }
  const std::int64_t m = static_cast<std::int64_t>(penalised.size());
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(m * v, 1 << 15))
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t r = penalised[i], s = states[r], pos = positions[r];
    const float p = rep[s], f = freq[s], q = pres[s];
    const std::int32_t* base = counts.as<std::int32_t>() + s * counts_stride;
    std::vector<std::int32_t> count(base, base + v);
    for (std::int64_t j = r - pos + 1; j <= r; ++j)  // the earlier drafts count as output tokens
      if (tokens[j] >= 0 && tokens[j] < v) ++count[tokens[j]];
    const std::uint32_t* words = p != 1.0f ? mask.as<std::uint32_t>() + s * mask_stride : nullptr;
    const float inv = 1.0f / p;  // vLLM's 1.0 / scale, then a product: two roundings
    float* row = logits.as<float>() + r * logits_stride;
    for (std::int64_t c = 0; c < v; ++c) {
      float x = row[c];
      const bool seen = count[c] > 0;
      if (words && (seen || ((words[c / kWord] >> (c % kWord)) & 1u))) x = x > 0.0f ? x * inv : x * p;
      x = x - f * static_cast<float>(count[c]);
      x = x - q * (seen ? 1.0f : 0.0f);
      row[c] = x;
    }
  }
}

// C42's domain of K40: states in range, prompt_len <= prefill_len, tokens inside the tables' widths
// and every count still an int32 after the rows add theirs.
void bincount(Buffer mapping, Strided all_tokens, std::int64_t tokens_stride, Buffer prompt_len_t, Buffer prefill_len_t,
              Strided mask, std::int64_t mask_stride, Strided counts, std::int64_t counts_stride, std::int64_t block) {
  const char* k = kBincount;
  need_power_of_two(k, "BLOCK_SIZE", block);
  if (block > (1 << 16)) fail(k, "BLOCK_SIZE", "must be <= 65536 (a tile), got " + std::to_string(block));
  const std::int64_t n = mapping.numel;
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  const state::Ints prompt_len(prompt_len_t), prefill_len(prefill_len_t), tokens(all_tokens);
  std::vector<std::int64_t> added;  // flat count cells, once per output token of each row
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r];
    for (auto [table, b] : {std::pair{"prefill_len_ptr", &prefill_len_t}, std::pair{"prompt_len_ptr", &prompt_len_t}})
      if (s < 0 || s >= b->numel)
        fail(k, "expanded_idx_mapping_ptr", "entry " + std::to_string(r) + " = " + std::to_string(s) + " must index '" + table +
                                                "' of " + std::to_string(b->numel) + " request states");
    const std::int64_t p = prompt_len[s], f = prefill_len[s];
    if (p < 0 || p > f)
      fail(k, "prompt_len_ptr", "entry " + std::to_string(s) + " = " + std::to_string(p) + " must be in [0, prefill_len = " +
                                    std::to_string(f) + "] (row " + std::to_string(r) + ")");
    need_int32(k, "prefill_len_ptr", static_cast<i128>(f) + block, "request state ", s,
               "'s prefill_len + BLOCK_SIZE (token indices are int32)");
    if (!f) continue;
    const i128 at = static_cast<i128>(s) * tokens_stride;
    need_cells(k, "all_token_ids_ptr", all_tokens, at, f, "request state ", s, "'s prefill tokens [0, ", f, ")");
    const std::int64_t first = static_cast<std::int64_t>(at);
    for (auto [lo_i, hi_i, prompt] : {std::tuple{std::int64_t{0}, p, true}, std::tuple{p, f, false}}) {
      if (lo_i == hi_i) continue;
      std::int64_t lo = tokens[first + lo_i], hi = lo;
      for (std::int64_t i = lo_i; i < hi_i; ++i) lo = std::min(lo, tokens[first + i]), hi = std::max(hi, tokens[first + i]);
      const std::int64_t limit = prompt ? kWord * mask.cols : counts.cols;
      if (lo < 0 || (prompt ? hi / kWord >= mask.cols : hi >= counts.cols))
        fail(k, "all_token_ids_ptr", "request state " + std::to_string(s) + "'s " + (prompt ? "prompt" : "output") +
                                         " tokens must lie in [0, " + std::to_string(limit) + "), hold " +
                                         std::to_string(lo < 0 ? lo : hi));
      if (prompt) {
        need_cells(k, "prompt_bin_mask_ptr", mask, static_cast<i128>(s) * mask_stride, hi / kWord + 1, "request state ", s,
                   "'s prompt words");
      } else {
        need_cells(k, "output_bin_counts_ptr", counts, static_cast<i128>(s) * counts_stride, hi + 1, "request state ", s,
                   "'s counts");
        for (std::int64_t i = lo_i; i < hi_i; ++i) added.push_back(s * counts_stride + tokens[first + i]);
      }
    }
  }
  std::sort(added.begin(), added.end());  // each count plus every token the rows add to it stays int32
  const std::int32_t* cells = counts.as<std::int32_t>();
  for (std::size_t i = 0; i < added.size();) {
    std::size_t j = i;
    while (j < added.size() && added[j] == added[i]) ++j;
    if (static_cast<i128>(cells[added[i]]) + static_cast<i128>(j - i) > INT32_MAX)
      fail(k, "output_bin_counts_ptr", "makes a count (flat index " + std::to_string(added[i]) + ") plus its " +
                                           std::to_string(j - i) + " new tokens exceed int32");
    i = j;
  }
  std::uint32_t* words = mask.as<std::uint32_t>();
  std::int32_t* bins = counts.as<std::int32_t>();
  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (worth_team(static_cast<std::int64_t>(added.size()) + n, 1 << 14))
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r], p = prompt_len[s], f = prefill_len[s], first = s * tokens_stride;
    for (std::int64_t i = 0; i < f; ++i) {
      const std::int64_t t = tokens[first + i];
      if (i < p)
        __atomic_fetch_or(words + s * mask_stride + t / kWord, std::uint32_t{1} << (t % kWord), __ATOMIC_RELAXED);
      else
        __atomic_fetch_add(bins + s * counts_stride + t, 1, __ATOMIC_RELAXED);
    }
  }
}

}  // namespace

SPECDIFF_FAMILY(penalties, "Model Runner V2's penalties: repetition, frequency and presence; the prompt bitmask and output counts") {
  def_kernel<&penalties>(m, "_penalties");
  def_kernel<&bincount>(m, "_bincount");
}

}  // namespace specdiff
