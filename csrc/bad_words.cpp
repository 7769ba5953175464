// OpenMP port of Model Runner V2's bad words (docs/bad_words.md, C43): each row's bad words whose
// prefix ends what the row sees (its request's committed output, then the drafts before it) ban
// their last token, -inf in place on the sampler's float32 logits.
//
// Everything read through an index (states, offsets, lengths, local positions, banned tokens) is
// checked before anything is written; then rows run in parallel (a row writes only itself).
#include <omp.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kBadWords = "_bad_words_kernel";

// An int32 or int64 tensor read element by element (the tables are too large to widen whole).
struct Ints {
  std::uintptr_t ptr;
  bool wide;
  std::int64_t operator[](std::int64_t i) const {
    return wide ? reinterpret_cast<const std::int64_t*>(ptr)[i] : reinterpret_cast<const std::int32_t*>(ptr)[i];
  }
};

Ints ints(const char* kernel, const char* name, const Buffer& b) {
  if (b.dtype != kInt32 && b.dtype != kInt64) throw TypeError(std::string(kernel) + ": '" + name + "' must be int32 or int64");
  return Ints{b.ptr, b.dtype == kInt64};
}

// A per-request table addressed as state * stride + column: the call site passes its stride(0).
void need_table_stride(const char* kernel, const char* name, const char* stride_name, const Strided& t, std::int64_t stride) {
  if (t.rows > 1 && stride != t.row_stride)
    fail(kernel, stride_name, std::string("must be ") + name + "'s row stride " + std::to_string(t.row_stride) + ", got " +
                                  std::to_string(stride));
}

std::string str(std::int64_t x) { return std::to_string(x); }

void bad_words(Strided logits, std::int64_t logits_stride, Buffer mapping, Strided tokens, std::int64_t tokens_stride, Strided offsets,
               std::int64_t offsets_stride, Buffer num_bad_words, Strided all_token_ids, std::int64_t all_stride, Buffer prompt_len,
               Buffer total_len, Buffer input_ids, Buffer local_pos) {
  const char* k = kBadWords;
  if (logits.data.dtype != kFloat32) throw TypeError(std::string(k) + ": 'logits_ptr' must be float32");
  const std::int64_t n = logits.rows, v = logits.cols;
  if (n > 1) {
    if (logits_stride != logits.row_stride)
      fail(k, "logits_stride", "must be logits_ptr's row stride " + str(logits.row_stride) + ", got " + str(logits_stride));
    need_at_least(k, "logits_stride", logits_stride, v);
  }
  need_rows(k, "logits_ptr", logits, n, logits_stride, v);
  for (auto [name, b] : {std::pair{"expanded_idx_mapping_ptr", &mapping}, std::pair{"expanded_local_pos_ptr", &local_pos},
                         std::pair{"input_ids_ptr", &input_ids}})
    if (b->numel < n) fail(k, name, "must hold an entry per row (" + str(n) + "), has " + str(b->numel));
  need_table_stride(k, "bad_word_token_ids_ptr", "bad_word_token_ids_stride", tokens, tokens_stride);
  need_table_stride(k, "bad_word_offsets_ptr", "bad_word_offsets_stride", offsets, offsets_stride);
  need_table_stride(k, "all_token_ids_ptr", "all_token_ids_stride", all_token_ids, all_stride);
  const std::vector<std::int64_t> states = load_ints(k, "expanded_idx_mapping_ptr", mapping, n);
  const std::vector<std::int64_t> positions = load_ints(k, "expanded_local_pos_ptr", local_pos, n);
  const std::vector<std::int64_t> counts = load_ints(k, "num_bad_words_ptr", num_bad_words, num_bad_words.numel);
  const std::vector<std::int64_t> prompts = load_ints(k, "prompt_len_ptr", prompt_len, prompt_len.numel);
  const std::vector<std::int64_t> totals = load_ints(k, "total_len_ptr", total_len, total_len.numel);
  const Ints tok = ints(k, "bad_word_token_ids_ptr", tokens.data), off = ints(k, "bad_word_offsets_ptr", offsets.data);
  const Ints history = ints(k, "all_token_ids_ptr", all_token_ids.data), inputs = ints(k, "input_ids_ptr", input_ids);
  std::vector<char> checked(static_cast<std::size_t>(num_bad_words.numel), 0);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r], pos = positions[r];
    if (s < 0 || s >= num_bad_words.numel)
      fail(k, "expanded_idx_mapping_ptr", "entry " + str(r) + " = " + str(s) + " must index 'num_bad_words_ptr' of " +
                                              str(num_bad_words.numel) + " request states");
    if (pos < 0 || pos > r)
      fail(k, "expanded_local_pos_ptr",
           "entry " + str(r) + " = " + str(pos) + " must be in [0, " + str(r) + "] (the request's rows before it)");
    const std::int64_t nb = counts[s];
    if (nb < 0 || nb >= offsets.cols)
      fail(k, "num_bad_words_ptr", "entry " + str(s) + " = " + str(nb) + " must be in [0, " + str(offsets.cols - 1) +
                                       "] (bad_word_offsets_ptr holds " + str(offsets.cols) + " offsets a request)");
    if (nb == 0) continue;
    for (auto [name, rows] : {std::pair{"bad_word_offsets_ptr", offsets.rows}, std::pair{"bad_word_token_ids_ptr", tokens.rows},
                              std::pair{"all_token_ids_ptr", all_token_ids.rows}, std::pair{"prompt_len_ptr", prompt_len.numel},
                              std::pair{"total_len_ptr", total_len.numel}})
      if (s >= rows)
        fail(k, "expanded_idx_mapping_ptr", "entry " + str(r) + " = " + str(s) + " must index '" + name + "' of " + str(rows) +
                                                " request states (its row has bad words)");
    const std::int64_t prompt = prompts[s], total = totals[s];
    if (prompt < 0 || total < prompt)
      fail(k, "total_len_ptr",
           "entry " + str(s) + " = " + str(total) + " must be >= prompt_len " + str(prompt) + " >= 0 (state " + str(s) + ")");
    if (total > all_token_ids.cols)
      fail(k, "total_len_ptr", "entry " + str(s) + " = " + str(total) + " must be <= all_token_ids_ptr's " + str(all_token_ids.cols) +
                                   " columns (state " + str(s) + ")");
    if (total - prompt + pos > std::numeric_limits<std::int32_t>::max())
      fail(k, "expanded_local_pos_ptr", "makes row " + str(r) + "'s output length + local position, outside int32");
    if (checked[s]) continue;
    checked[s] = 1;
    const std::int64_t row = s * offsets_stride;
    if (off[row] < 0) fail(k, "bad_word_offsets_ptr", "state " + str(s) + "'s first offset " + str(off[row]) + " must be >= 0");
    for (std::int64_t j = 0; j < nb; ++j)  // each bad word has a token to ban
      if (off[row + j + 1] <= off[row + j])
        fail(k, "bad_word_offsets_ptr", "state " + str(s) + "'s offsets must increase (a bad word holds a token): bad word " + str(j) +
                                            " is [" + str(off[row + j]) + ", " + str(off[row + j + 1]) + ")");
    if (off[row + nb] > tokens.cols)
      fail(k, "bad_word_offsets_ptr", "state " + str(s) + "'s last offset " + str(off[row + nb]) + " must be <= bad_word_token_ids_ptr's " +
                                          str(tokens.cols) + " columns");
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t t = tok[s * tokens_stride + off[row + j + 1] - 1];
      if (t < 0 || t >= v)
        fail(k, "bad_word_token_ids_ptr", "state " + str(s) + "'s bad word " + str(j) + " bans token " + str(t) + ", outside the " +
                                              str(v) + " logits columns");
    }
  }
  float* base = logits.as<float>();
  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 16) if (worth_team(n * 64, 1 << 12))
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t s = states[r], nb = counts[s];
    if (nb == 0) continue;
    const std::int64_t pos = positions[r], prompt = prompts[s];
    const std::int64_t output_len = totals[s] - prompt, seen = output_len + pos;
    // Sequence index i: the committed output below output_len, then local position i - output_len + 1's input id.
    auto token_at = [&](std::int64_t i) {
      return i < output_len ? history[s * all_stride + prompt + i] : inputs[r - pos + (i - output_len + 1)];
    };
    const std::int64_t row = s * offsets_stride;
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t start = s * tokens_stride + off[row + j], end = s * tokens_stride + off[row + j + 1];
      const std::int64_t prefix_len = end - 1 - start;
      if (prefix_len > seen) continue;
      bool match = true;
      for (std::int64_t i = 0; i < prefix_len && match; ++i) match = tok[start + i] == token_at(seen - prefix_len + i);
      if (match) base[r * logits_stride + tok[end - 1]] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace

SPECDIFF_FAMILY(bad_words, "Model Runner V2's bad words: each row's bad words whose prefix ends what it sees ban their last token") {
  def_kernel<&bad_words>(m, "_bad_words");
}

}  // namespace specdiff
