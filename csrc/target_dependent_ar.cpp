// OpenMP port of Model Runner V2's EAGLE/MTP drafter kernels (docs/target_dependent_ar.md, C38).
//
// Mirrors reference/target_dependent_ar.py: every precondition of contracts/target_dependent_ar.py
// is checked before anything is written, then the rows run in parallel; no two rows write one
// element. Sums fit int32 by the contract; offsets are checked exactly (in 128 bits).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"
#include "state.h"

namespace specdiff {
namespace {

using namespace state;

constexpr const char* kPrefill = "target_dependent_ar._prepare_prefill_inputs_kernel";
constexpr const char* kDecode = "_prepare_decode_inputs_kernel";
constexpr const char* kUpdate = "_update_draft_inputs_kernel";

void need_max_model_len(const char* kernel, std::int64_t m) {
  if (m < 1 || m > INT32_MAX) fail(kernel, "max_model_len", "must be in [1, 2**31), got " + std::to_string(m));
}

std::int32_t to_int32(std::int64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v)); }

// -- K29 --------------------------------------------------------------------------------------
void prepare_prefill_inputs(Buffer last_token_indices, Buffer draft_current_step, Buffer draft_input_ids,
                            Buffer draft_positions, Buffer draft_query_start_loc, Buffer draft_seq_lens,
                            Buffer target_input_ids, Buffer target_positions, Buffer idx_mapping, Buffer last_sampled,
                            Buffer next_prefill_tokens, Buffer num_sampled, Buffer num_rejected, Buffer query_start_loc,
                            Buffer seq_lens, std::int64_t max_num_reqs, std::int64_t block_size) {
  const char* k = kPrefill;
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> qsl = load_offsets(k, "query_start_loc_ptr", query_start_loc, n + 1);
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_len(k, "seq_lens_ptr", seq_lens, n);
  need_len(k, "num_sampled_ptr", num_sampled, n);
  need_len(k, "num_rejected_ptr", num_rejected, n);
  const Ints idx(idx_mapping), sampled(num_sampled), rejected(num_rejected);
  std::int64_t copied = 0;
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t s = idx[b];
    const bool from_last = sampled[b] > 0;
    const Buffer& source = from_last ? last_sampled : next_prefill_tokens;
    if (s < 0 || s >= source.numel)
      fail(k, "idx_mapping_ptr",
           "entry " + std::to_string(b) + " = " + std::to_string(s) + " must index '" +
               (from_last ? "last_sampled_ptr" : "next_prefill_tokens_ptr") + "' of " + std::to_string(source.numel) +
               " elements");
    const std::int64_t ql = qsl[b + 1] - qsl[b], nr = rejected[b];
    if (nr < 0 || nr >= ql)
      fail(k, "num_rejected_ptr",
           "entry " + std::to_string(b) + " = " + std::to_string(nr) + " must be in [0, query_len=" + std::to_string(ql) + ")");
    const std::int64_t end = qsl[b + 1] - nr;
    need_len(k, "target_input_ids_ptr", target_input_ids, end);
    need_len(k, "target_positions_ptr", target_positions, end);
    need_len(k, "draft_input_ids_ptr", draft_input_ids, end);
    need_len(k, "draft_positions_ptr", draft_positions, end);
    copied += ql - nr;
  }
  if (n == 0) return;  // no program runs
  need_len(k, "last_token_indices_ptr", last_token_indices, std::max(n, max_num_reqs));
  need_len(k, "draft_seq_lens_ptr", draft_seq_lens, std::max(n, max_num_reqs));
  need_len(k, "draft_query_start_loc_ptr", draft_query_start_loc,
           std::max(static_cast<i128>(n), static_cast<i128>(max_num_reqs) + 1) > INT64_MAX ? INT64_MAX
                                                                                         : std::max(n, max_num_reqs + 1));
  need_len(k, "draft_current_step_ptr", draft_current_step, 1);

  const Ints last_out(last_token_indices), ids(draft_input_ids), positions(draft_positions), draft_qsl(draft_query_start_loc);
  const Ints draft_lens(draft_seq_lens), target_ids(target_input_ids), target_pos(target_positions), lens(seq_lens);
  const Ints last(last_sampled), next(next_prefill_tokens);
  rows(n, copied, [&](std::int64_t b) {
    const std::int64_t s = idx[b], start = qsl[b], kept = qsl[b + 1] - start - rejected[b];
    // The token the draft continues from: the last sampled one, narrowed to int32 as the kernel
    // casts it, or for a chunked prefill the next prompt token.
    const std::int64_t following = sampled[b] > 0 ? to_int32(last[s]) : next[s];
    for (std::int64_t i = 1; i < kept; ++i) ids.set(start + i - 1, target_ids[start + i]);
    ids.set(start + kept - 1, following);
    last_out.set(b, start + kept - 1);
    for (std::int64_t i = 0; i < kept; ++i) positions.set(start + i, target_pos[start + i]);
    draft_qsl.set(b, start);
    draft_lens.set(b, lens[b]);
  });
  // The last row's program: reset the step, pad the rows past the batch for CUDA graphs.
  Ints(draft_current_step).set(0, 0);
  for (std::int64_t r = n; r <= max_num_reqs; ++r) draft_qsl.set(r, qsl[n]);
  for (std::int64_t r = n; r < max_num_reqs; ++r) {
    draft_lens.set(r, 0);
    last_out.set(r, 0);
  }
}

// -- K30 --------------------------------------------------------------------------------------
void prepare_decode_inputs(Strided draft_tokens, std::int64_t draft_stride, Buffer target_seq_lens, Buffer num_rejected,
                           Buffer input_ids, Buffer positions, Buffer sample_src_positions, Buffer query_start_loc,
                           Buffer seq_lens, std::int64_t max_model_len, std::int64_t max_num_reqs, std::int64_t block_size,
                           bool advance) {
  const char* k = kDecode;
  // Rows of the (1-D) column: its element count.
  const std::int64_t n = draft_tokens.data.numel;
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_rows(k, "draft_tokens_ptr", draft_tokens, n, draft_stride, 1);
  need_len(k, "target_seq_lens_ptr", target_seq_lens, n);
  need_len(k, "num_rejected_ptr", num_rejected, n);
  need_len(k, "input_ids_ptr", input_ids, n);
  need_len(k, "sample_src_positions_ptr", sample_src_positions, n);
  if (max_num_reqs == INT64_MAX)
    fail(k, "max_num_reqs", "makes max_num_reqs + 1 overflow int64");
  need_len(k, "query_start_loc_ptr", query_start_loc, max_num_reqs + 1);
  need_len(k, "seq_lens_ptr", seq_lens, std::max(n, max_num_reqs));
  if (advance) {
    need_max_model_len(k, max_model_len);
    need_len(k, "positions_ptr", positions, n);
  }
  const Ints sample(sample_src_positions), target(target_seq_lens), rejected(num_rejected), pos(positions);
  for (std::int64_t b = 0; b < n; ++b) {
    need_int32(k, "sample_src_positions_ptr", static_cast<i128>(sample[b]) + 1, "row ", b, "'s next sampling position");
    const i128 seq = static_cast<i128>(target[b]) - rejected[b];
    need_int32(k, "num_rejected_ptr", seq, "row ", b, "'s seq_len");
    if (advance) {
      need_int32(k, "positions_ptr", static_cast<i128>(pos[b]) + 1, "row ", b, "'s next position");
      need_int32(k, "target_seq_lens_ptr", seq + 1, "row ", b, "'s next seq_len");
    }
  }
  const Ints drafts(draft_tokens), ids(input_ids), qsl(query_start_loc), lens(seq_lens);
  rows(n, 0, [&](std::int64_t b) {
    ids.set(b, drafts[b * draft_stride]);
    sample.set(b, sample[b] + 1);
    std::int64_t seq = target[b] - rejected[b];
    if (advance) {
      // Clamped at the model's length so that nothing is read or written past it.
      pos.set(b, std::min(pos[b] + 1, max_model_len - 1));
      seq = std::min(seq + 1, max_model_len);
    }
    lens.set(b, seq);
  });
  // One token per request; rows past the batch are empty, for CUDA graphs.
  for (std::int64_t r = 0; r <= max_num_reqs; ++r) qsl.set(r, std::min(r, n));
  for (std::int64_t r = n; r < max_num_reqs; ++r) lens.set(r, 0);
}

// -- K31 --------------------------------------------------------------------------------------
void update_draft_inputs(Strided output_draft_tokens, std::int64_t output_stride, Strided next_hidden,
                         std::int64_t next_stride, Buffer input_ids, Buffer positions, Buffer sample_src_positions,
                         Buffer seq_lens, Buffer draft_tokens, Buffer current_draft_step, Strided hidden_states,
                         std::int64_t hidden_stride, std::int64_t hidden_size, std::int64_t max_model_len,
                         std::int64_t num_speculative_steps, std::int64_t block_size, bool advance) {
  const char* k = kUpdate;
  const std::int64_t n = draft_tokens.numel;
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  need_len(k, "current_draft_step_ptr", current_draft_step, 1);
  const std::int64_t step = Ints(current_draft_step)[0];
  if (step < 0) fail(k, "current_draft_step_ptr", "must be >= 0, got " + std::to_string(step));
  for (std::int64_t b = 0; b < n; ++b) {
    const i128 at = static_cast<i128>(b) * output_stride + step;
    if (at < 0 || at > INT64_MAX - 1 || !output_draft_tokens.holds(static_cast<std::int64_t>(at)))
      fail(k, "output_draft_tokens_ptr", "must hold flat index " + str(at) + " (row " + std::to_string(b) + "'s draft " +
                                             std::to_string(step) + ")");
  }
  const bool last_step = static_cast<i128>(step) >= static_cast<i128>(num_speculative_steps) - 1;
  const Ints out(output_draft_tokens), tokens(draft_tokens);
  if (last_step) {  // the last step: only the drafts are written
    rows(n, 0, [&](std::int64_t b) { out.set(b * output_stride + step, tokens[b]); });
    return;
  }
  need_len(k, "sample_src_positions_ptr", sample_src_positions, n);
  need_len(k, "input_ids_ptr", input_ids, n);
  need_at_least(k, "hidden_size", hidden_size, 0);
  if (next_hidden.data.dtype != hidden_states.data.dtype)
    fail(k, "next_input_hidden_states_ptr", "must have hidden_states_ptr's dtype");
  need_rows(k, "hidden_states_ptr", hidden_states, n, hidden_stride, hidden_size);
  need_rows(k, "next_input_hidden_states_ptr", next_hidden, n, next_stride, hidden_size);
  const Ints sample(sample_src_positions), pos(positions), lens(seq_lens), ids(input_ids);
  for (std::int64_t b = 0; b < n; ++b)
    need_int32(k, "sample_src_positions_ptr", static_cast<i128>(sample[b]) + 1,
               "row ", b, "'s next sampling position");
  if (advance) {
    need_max_model_len(k, max_model_len);
    need_len(k, "positions_ptr", positions, n);
    for (std::int64_t b = 0; b < n; ++b)
      need_int32(k, "positions_ptr", static_cast<i128>(pos[b]) + 1, "row ", b, "'s next value");
    need_len(k, "seq_lens_ptr", seq_lens, n);
    for (std::int64_t b = 0; b < n; ++b)
      need_int32(k, "seq_lens_ptr", static_cast<i128>(lens[b]) + 1, "row ", b, "'s next value");
  }
  const std::size_t bytes = element_size(hidden_states.data.dtype);
  auto* src = reinterpret_cast<const char*>(hidden_states.data.ptr);
  auto* dst = reinterpret_cast<char*>(next_hidden.data.ptr);
  rows(n, n * hidden_size, [&](std::int64_t b) {
    out.set(b * output_stride + step, tokens[b]);
    sample.set(b, sample[b] + 1);
    ids.set(b, tokens[b]);
    // The draft model's hidden state becomes the next step's input, bit for bit.
    if (hidden_size > 0)
      std::memcpy(dst + b * next_stride * bytes, src + b * hidden_stride * bytes, static_cast<std::size_t>(hidden_size) * bytes);
    if (advance) {
      pos.set(b, std::min(pos[b] + 1, max_model_len - 1));
      lens.set(b, std::min(lens[b] + 1, max_model_len));
    }
  });
}

}  // namespace

SPECDIFF_FAMILY(target_dependent_ar, "Model Runner V2's EAGLE/MTP drafter") {
  def_kernel<&prepare_prefill_inputs>(m, "_prepare_prefill_inputs");
  def_kernel<&prepare_decode_inputs>(m, "_prepare_decode_inputs");
  def_kernel<&update_draft_inputs>(m, "_update_draft_inputs");
}

}  // namespace specdiff
