// OpenMP port of Model Runner V2's batch-state kernels (docs/input_batch.md, C37).
//
// Mirrors reference/input_batch.py: every precondition of contracts/input_batch.py is checked
// before anything is written, then the batch rows run in parallel. No two rows write one element
// (queries and logits ranges are disjoint, written request states distinct), so the results never
// depend on the thread count. Checks compute offsets exactly (in 128 bits) as the contract does in
// Python integers; the kernels' own sums fit int32 by the contract.
#include <omp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"
#include "state.h"

namespace specdiff {
namespace {

using namespace state;

constexpr const char* kPrefill = "input_batch._prepare_prefill_inputs_kernel";
constexpr const char* kPos = "_prepare_pos_seq_lens_kernel";
constexpr const char* kCombine = "_combine_sampled_and_draft_tokens_kernel";
constexpr const char* kCounts = "_get_num_sampled_and_rejected_kernel";
constexpr const char* kPost = "_post_update_kernel";
constexpr const char* kComputed = "_post_update_num_computed_tokens_kernel";
constexpr const char* kExpand = "_expand_idx_mapping_kernel";

struct State {
  const char* name;
  std::int64_t size;
};

// contracts/input_batch.py: state_rows. idx_mapping's entries index every state in `states`.
std::vector<std::int64_t> state_rows(const char* kernel, const Buffer& idx_mapping, std::initializer_list<State> states,
                                     bool distinct, bool skip_negative) {
  const std::int64_t n = idx_mapping.numel;
  std::vector<std::int64_t> idx = load_ints(kernel, "idx_mapping_ptr", idx_mapping, n);
  for (const State& st : states)
    for (std::int64_t b = 0; b < n; ++b) {
      const std::int64_t s = idx[b];
      if (s < 0 && skip_negative) continue;
      if (s < 0 || s >= st.size)
        fail(kernel, "idx_mapping_ptr",
             "entry " + std::to_string(b) + " = " + std::to_string(s) + " must index '" + st.name + "' of " +
                 std::to_string(st.size) + " elements" + (skip_negative ? " (or be negative: a skipped row)" : ""));
    }
  if (distinct) {
    std::vector<std::pair<std::int64_t, std::int64_t>> seen;  // (state, row), sorted: the first repeat by row
    for (std::int64_t b = 0; b < n; ++b)
      if (idx[b] >= 0) seen.emplace_back(idx[b], b);
    std::sort(seen.begin(), seen.end());
    std::int64_t worst = -1, first = -1, state = -1;
    for (std::size_t i = 1; i < seen.size(); ++i)
      if (seen[i].first == seen[i - 1].first && (worst < 0 || seen[i].second < worst)) {
        worst = seen[i].second;
        first = seen[i - 1].second;
        state = seen[i].first;
      }
    if (worst >= 0) {
      // The contract names the first row whose state an earlier row already has, and that earlier row.
      for (std::int64_t b = 0; b < worst; ++b)
        if (idx[b] == state) {
          first = b;
          break;
        }
      fail(kernel, "idx_mapping_ptr",
           "entries " + std::to_string(first) + " and " + std::to_string(worst) + " are both " + std::to_string(state) +
               ": a request state appears once in a batch (C37)");
    }
  }
  return idx;
}

// -- K22 --------------------------------------------------------------------------------------
void prepare_prefill_inputs(Buffer input_ids, Strided next_prefill_tokens, std::int64_t next_stride,
                            std::int64_t num_lookahead, Buffer idx_mapping, Buffer query_start_loc,
                            Strided all_token_ids, std::int64_t tokens_stride, Buffer prefill_lens,
                            Buffer num_computed_tokens, std::int64_t block_size, std::int64_t lookahead_block) {
  const char* k = kPrefill;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> qsl = load_offsets(k, "query_start_loc_ptr", query_start_loc, n + 1);
  const std::vector<std::int64_t> idx = state_rows(
      k, idx_mapping, {{"prefill_lens_ptr", prefill_lens.numel}, {"num_computed_tokens_ptr", num_computed_tokens.numel}}, true, false);
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_power_of_two(k, "LOOKAHEAD_BLOCK", lookahead_block);
  if (num_lookahead < 0 || num_lookahead > lookahead_block)
    fail(k, "num_lookahead", "must be in [0, LOOKAHEAD_BLOCK=" + std::to_string(lookahead_block) + "], got " + std::to_string(num_lookahead));
  const Ints prefill(prefill_lens), computed(num_computed_tokens);
  std::int64_t widest = -1, copied = 0;
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t s = idx[b], p = prefill[s], c = computed[s];
    if (c >= p) continue;
    const i128 ql = static_cast<i128>(qsl[b + 1]) - qsl[b];
    if (c < 0)
      fail(k, "num_computed_tokens_ptr",
           "entry " + std::to_string(s) + " = " + std::to_string(c) + " (row " + std::to_string(b) + ", prefilling) must be >= 0");
    const i128 last = std::max(c + ql, std::min(static_cast<i128>(p), c + ql + num_lookahead));
    need_cells(k, "all_token_ids_ptr", all_token_ids, static_cast<i128>(s) * tokens_stride + c, last - c,
               "request state ", s, "'s tokens");
    need_len(k, "input_ids_ptr", input_ids, qsl[b + 1]);
    widest = std::max(widest, s);
    copied += static_cast<std::int64_t>(ql);
  }
  need_rows(k, "next_prefill_tokens_ptr", next_prefill_tokens, num_lookahead, next_stride, widest + 1);

  const Ints ids(input_ids), next(next_prefill_tokens), tokens(all_token_ids);
  rows(n, copied, [&](std::int64_t b) {
    const std::int64_t s = idx[b], p = prefill[s], c = computed[s];
    if (c >= p) return;
    const std::int64_t row = s * tokens_stride + c, ql = qsl[b + 1] - qsl[b];
    for (std::int64_t i = 0; i < ql; ++i) ids.set(qsl[b] + i, tokens[row + i]);
    // The next num_lookahead prompt tokens after the query; 0 past prefill_len.
    for (std::int64_t j = 0; j < num_lookahead; ++j)
      next.set(j * next_stride + s, c + ql + j < p ? tokens[row + ql + j] : 0);
  });
}

// -- K23 --------------------------------------------------------------------------------------
void prepare_pos_seq_lens(Buffer pos, Buffer seq_lens, Buffer idx_mapping, Buffer query_start_loc,
                          Buffer num_computed_tokens, std::int64_t max_num_reqs, std::int64_t block_size) {
  const char* k = kPos;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> qsl = load_offsets(k, "query_start_loc_ptr", query_start_loc, n + 1);
  const std::vector<std::int64_t> idx =
      state_rows(k, idx_mapping, {{"num_computed_tokens_ptr", num_computed_tokens.numel}}, false, false);
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_len(k, "pos_ptr", pos, qsl[n]);
  need_len(k, "seq_lens_ptr", seq_lens, std::max(n, max_num_reqs));
  const Ints computed(num_computed_tokens);
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t c = computed[idx[b]];
    need_int32(k, "num_computed_tokens_ptr", c, "row ", b, "'s first position");
    need_int32(k, "num_computed_tokens_ptr", static_cast<i128>(c) + qsl[b + 1] - qsl[b], "row ", b, "'s seq_len");
  }
  const Ints positions(pos), lens(seq_lens);
  rows(n, qsl[n] - qsl[0], [&](std::int64_t b) {
    const std::int64_t c = computed[idx[b]], ql = qsl[b + 1] - qsl[b];
    lens.set(b, c + ql);
    for (std::int64_t i = 0; i < ql; ++i) positions.set(qsl[b] + i, c + i);
  });
  // Rows past the batch read as empty sequences for full CUDA graphs.
  for (std::int64_t r = n; r < max_num_reqs; ++r) lens.set(r, 0);
}

// -- K24 --------------------------------------------------------------------------------------
void combine_sampled_and_draft_tokens(Buffer input_ids, Buffer idx_mapping, Buffer last_sampled_tokens,
                                      Buffer query_start_loc, Buffer seq_lens, Buffer prefill_len, Strided draft_tokens,
                                      std::int64_t draft_stride, Buffer cu_num_logits, Buffer logits_indices,
                                      std::int64_t block_size, std::int64_t new_sampled) {
  const char* k = kCombine;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> qsl = load_offsets(k, "query_start_loc_ptr", query_start_loc, n + 1);
  const std::vector<std::int64_t> cu = load_offsets(k, "cu_num_logits_ptr", cu_num_logits, n + 1);
  const std::vector<std::int64_t> idx = state_rows(k, idx_mapping, {{"prefill_len_ptr", prefill_len.numel}}, false, false);
  if (new_sampled != 0 && new_sampled != 1)
    fail(k, "NUM_NEW_SAMPLED_TOKENS", "must be 0 or 1, got " + std::to_string(new_sampled));
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_len(k, "seq_lens_ptr", seq_lens, n);
  need_len(k, "logits_indices_ptr", logits_indices, cu[n]);
  need_len(k, "input_ids_ptr", input_ids, qsl[n]);
  const Ints seq(seq_lens), prefill(prefill_len);
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t s = idx[b], nl = cu[b + 1] - cu[b], ql = qsl[b + 1] - qsl[b];
    if (nl < new_sampled || nl > ql)
      fail(k, "cu_num_logits_ptr",
           "gives row " + std::to_string(b) + " " + std::to_string(nl) + " logits: must be in [NUM_NEW_SAMPLED_TOKENS=" +
               std::to_string(new_sampled) + ", its " + std::to_string(ql) + " query tokens]");
    if (nl > block_size)
      fail(k, "cu_num_logits_ptr",
           "gives row " + std::to_string(b) + " " + std::to_string(nl) + " logits, more than BLOCK_SIZE=" + std::to_string(block_size));
    const std::int64_t sl = seq[b], p = prefill[s];
    if (sl <= p) continue;
    if (new_sampled && static_cast<i128>(sl) - nl >= p && s >= last_sampled_tokens.numel)
      fail(k, "last_sampled_tokens_ptr",
           "must hold request state " + std::to_string(s) + "'s entry, has " + std::to_string(last_sampled_tokens.numel));
    need_cells(k, "draft_tokens_ptr", draft_tokens, static_cast<i128>(s) * draft_stride, nl - new_sampled,
               "request state ", s, "'s drafts");
  }
  const Ints ids(input_ids), last(last_sampled_tokens), drafts(draft_tokens), logits(logits_indices);
  rows(n, cu[n], [&](std::int64_t b) {
    const std::int64_t s = idx[b], nl = cu[b + 1] - cu[b], nd = nl - new_sampled;
    // The logits rows are the query's last num_logits tokens.
    const std::int64_t logits_start = qsl[b + 1] - nl;
    for (std::int64_t i = 0; i < nl; ++i) logits.set(cu[b] + i, logits_start + i);
    const std::int64_t sl = seq[b], p = prefill[s];
    if (sl <= p) return;  // a prefill chunk: its tokens are the prompt's
    if (new_sampled && sl - nl >= p) ids.set(logits_start, last[s]);
    for (std::int64_t i = 0; i < nd; ++i) ids.set(qsl[b + 1] - nd + i, drafts[s * draft_stride + i]);
  });
}

// -- K25 --------------------------------------------------------------------------------------
void get_num_sampled_and_rejected(Buffer num_sampled, Buffer num_rejected, Buffer seq_lens, Buffer cu_num_logits,
                                  Buffer idx_mapping, Buffer prefill_len) {
  const char* k = kCounts;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> cu = load_offsets(k, "cu_num_logits_ptr", cu_num_logits, n + 1);
  const std::vector<std::int64_t> idx = state_rows(k, idx_mapping, {{"prefill_len_ptr", prefill_len.numel}}, false, false);
  need_len(k, "num_sampled_ptr", num_sampled, n);
  need_len(k, "num_rejected_ptr", num_rejected, n);
  need_len(k, "seq_lens_ptr", seq_lens, n);
  const Ints sampled(num_sampled), rejected(num_rejected), seq(seq_lens), prefill(prefill_len);
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t ns = sampled[b], nl = cu[b + 1] - cu[b];
    need_int32(k, "cu_num_logits_ptr", nl, "row ", b, "'s logits count");  // num_rejected is at most it
    if (ns < 0 || ns > nl)
      fail(k, "num_sampled_ptr",
           "entry " + std::to_string(b) + " = " + std::to_string(ns) + " must be in [0, " + std::to_string(nl) + "] (its logits)");
  }
  rows(n, 0, [&](std::int64_t b) {
    // A chunked prefill before its last chunk emits and rejects nothing.
    const bool chunked = seq[b] < prefill[idx[b]];
    const std::int64_t ns = chunked ? 0 : sampled[b];
    sampled.set(b, ns);
    rejected.set(b, chunked ? 0 : cu[b + 1] - cu[b] - ns);
  });
}

// -- K26 --------------------------------------------------------------------------------------
void post_update(Buffer idx_mapping, Buffer num_computed_tokens, Buffer last_sampled_tokens, Strided output_bin_counts,
                 std::int64_t bins_stride, Strided sampled_tokens, std::int64_t sampled_stride, Buffer num_sampled,
                 Buffer num_rejected, Buffer query_start_loc, Strided all_token_ids, std::int64_t tokens_stride,
                 Buffer total_len, Buffer draft_tokens, Buffer draft_tokens_out, std::int64_t num_draft_tokens) {
  const char* k = kPost;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> idx = state_rows(k, idx_mapping,
                                                   {{"num_computed_tokens_ptr", num_computed_tokens.numel},
                                                    {"last_sampled_tokens_ptr", last_sampled_tokens.numel},
                                                    {"total_len_ptr", total_len.numel}},
                                                   true, true);
  need_len(k, "num_sampled_ptr", num_sampled, n);
  need_len(k, "num_rejected_ptr", num_rejected, n);
  const bool has_qsl = query_start_loc.present(), has_drafts = draft_tokens.present();
  const bool has_bins = output_bin_counts.data.present();
  if (has_qsl) need_len(k, "query_start_loc_ptr", query_start_loc, n + 1);
  const std::int64_t nd = num_draft_tokens;
  if (has_drafts) {
    if (!draft_tokens_out.present()) fail(k, "draft_tokens_out_ptr", "must be a tensor when draft_tokens_ptr is one");
    need_at_least(k, "num_draft_tokens", nd, 0);
  }
  const Ints sampled_n(num_sampled), rejected(num_rejected), total(total_len), computed(num_computed_tokens);
  const Ints sampled(sampled_tokens), bins(output_bin_counts);
  const Ints qsl(has_qsl ? query_start_loc : Buffer{0, kInt64, 0});
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t s = idx[b];
    if (s < 0) continue;
    if (has_drafts) {
      need_cells(k, "draft_tokens_ptr", flat(draft_tokens), static_cast<i128>(b) * nd, nd, "row ", b, "'s drafts");
      need_cells(k, "draft_tokens_out_ptr", flat(draft_tokens_out), static_cast<i128>(s) * nd, nd, "request state ", s, "'s drafts");
    }
    const std::int64_t ns = sampled_n[b];
    if (ns < 0) fail(k, "num_sampled_ptr", "entry " + std::to_string(b) + " = " + std::to_string(ns) + " must be >= 0");
    need_cells(k, "sampled_tokens_ptr", sampled_tokens, static_cast<i128>(b) * sampled_stride, ns, "row ", b, "'s sampled tokens");
    if (ns) {
      const std::int64_t start = total[s];
      need_int32(k, "num_sampled_ptr", static_cast<i128>(start) + ns, "request state ", s, "'s total_len");
      if (start < 0)
        fail(k, "total_len_ptr", "entry " + std::to_string(s) + " = " + std::to_string(start) + " must be >= 0 where tokens are appended");
      need_cells(k, "all_token_ids_ptr", all_token_ids, static_cast<i128>(s) * tokens_stride + start, ns, "request state ", s, "'s tokens");
    }
    if (has_bins) {
      const std::int64_t from = b * sampled_stride;
      for (std::int64_t i = 0; i < ns; ++i) {
        const std::int64_t t = sampled[from + i];
        if (t < 0)
          fail(k, "sampled_tokens_ptr",
               words("token ", t, " of row ", b, " indexes output_bin_counts (must be >= 0)"));
        need_cells(k, "output_bin_counts_ptr", output_bin_counts, static_cast<i128>(s) * bins_stride + t, 1,
                   "request state ", s, "'s count of token ", t);
      }
      // A count grows once per occurrence of its token in the row.
      for (std::int64_t i = 0; i < ns; ++i) {
        const std::int64_t t = sampled[from + i];
        std::int64_t times = 0;
        for (std::int64_t j = 0; j < ns; ++j) times += sampled[from + j] == t;
        need_int32(k, "output_bin_counts_ptr", static_cast<i128>(bins[s * bins_stride + t]) + times,
                   "request state ", s, "'s count of token ", t);
      }
    }
    const i128 ql = has_qsl ? static_cast<i128>(qsl[b + 1]) - qsl[b] : 0;
    need_int32(k, "query_start_loc_ptr", ql, "row ", b, "'s query_len");
    const i128 delta = ql - rejected[b];
    need_int32(k, "num_rejected_ptr", delta, "row ", b, "'s query_len - num_rejected");
    need_int32(k, "num_computed_tokens_ptr", computed[s] + delta, "request state ", s, "'s num_computed");
  }

  const Ints last(last_sampled_tokens), tokens(all_token_ids), drafts(draft_tokens), drafts_out(draft_tokens_out);
  rows(n, 0, [&](std::int64_t b) {
    const std::int64_t s = idx[b];
    if (s < 0) return;  // a row whose request finished or needs no update
    if (has_drafts)
      for (std::int64_t i = 0; i < nd; ++i) drafts_out.set(s * nd + i, drafts[b * nd + i]);
    const std::int64_t start = total[s], ns = sampled_n[b], from = b * sampled_stride;
    if (ns > 0) {
      last.set(s, sampled[from + ns - 1]);
      total.set(s, start + ns);
    }
    // Appended at the length read before the update; counted one by one (a token may repeat).
    for (std::int64_t i = 0; i < ns; ++i) {
      const std::int64_t t = sampled[from + i];
      tokens.set(s * tokens_stride + start + i, t);
      if (has_bins) bins.set(s * bins_stride + t, bins[s * bins_stride + t] + 1);
    }
    const std::int64_t ql = has_qsl ? qsl[b + 1] - qsl[b] : 0;
    computed.set(s, computed[s] + ql - rejected[b]);
  });
}

// -- K27 --------------------------------------------------------------------------------------
void post_update_num_computed_tokens(Buffer idx_mapping, Buffer num_computed_tokens, Buffer query_start_loc) {
  const char* k = kComputed;
  const std::int64_t n = idx_mapping.numel;
  need_len(k, "query_start_loc_ptr", query_start_loc, n + 1);
  const std::vector<std::int64_t> idx =
      state_rows(k, idx_mapping, {{"num_computed_tokens_ptr", num_computed_tokens.numel}}, true, false);
  const Ints qsl(query_start_loc), computed(num_computed_tokens);
  for (std::int64_t b = 0; b < n; ++b) {
    const i128 ql = static_cast<i128>(qsl[b + 1]) - qsl[b];
    need_int32(k, "query_start_loc_ptr", ql, "row ", b, "'s query_len");
    need_int32(k, "num_computed_tokens_ptr", computed[idx[b]] + ql, "request state ", idx[b], "'s num_computed");
  }
  rows(n, 0, [&](std::int64_t b) { computed.set(idx[b], computed[idx[b]] + qsl[b + 1] - qsl[b]); });
}

// -- K28 --------------------------------------------------------------------------------------
void expand_idx_mapping(Buffer idx_mapping, Buffer expanded_idx_mapping, Buffer expanded_local_pos, Buffer cu_num_logits,
                        std::int64_t block_size) {
  const char* k = kExpand;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> cu = load_offsets(k, "cu_num_logits_ptr", cu_num_logits, n + 1);
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  for (std::int64_t b = 0; b < n; ++b)
    if (cu[b + 1] - cu[b] > block_size)
      fail(k, "cu_num_logits_ptr",
           "gives row " + std::to_string(b) + " " + std::to_string(cu[b + 1] - cu[b]) + " logits, more than BLOCK_SIZE=" +
               std::to_string(block_size));
  need_len(k, "expanded_idx_mapping_ptr", expanded_idx_mapping, cu[n]);
  need_len(k, "expanded_local_pos_ptr", expanded_local_pos, cu[n]);
  const Ints idx(idx_mapping), expanded(expanded_idx_mapping), local(expanded_local_pos);
  rows(n, cu[n], [&](std::int64_t b) {
    for (std::int64_t i = 0; i < cu[b + 1] - cu[b]; ++i) {
      expanded.set(cu[b] + i, idx[b]);
      local.set(cu[b] + i, i);
    }
  });
}

}  // namespace

SPECDIFF_FAMILY(input_batch, "Model Runner V2's batch state") {
  def_kernel<&prepare_prefill_inputs>(m, "_prepare_prefill_inputs");
  def_kernel<&prepare_pos_seq_lens>(m, "_prepare_pos_seq_lens");
  def_kernel<&combine_sampled_and_draft_tokens>(m, "_combine_sampled_and_draft_tokens");
  def_kernel<&get_num_sampled_and_rejected>(m, "_get_num_sampled_and_rejected");
  def_kernel<&post_update>(m, "_post_update");
  def_kernel<&post_update_num_computed_tokens>(m, "_post_update_num_computed_tokens");
  def_kernel<&expand_idx_mapping>(m, "_expand_idx_mapping");
}

}  // namespace specdiff
