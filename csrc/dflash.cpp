// OpenMP port of the DFlash input-preparation kernel (spec §2.9).
//
// Mirrors reference/dflash.py: every precondition is checked before anything is written; then
// the context tokens and the query tokens of each request are written in two passes, each
// templated on the dtypes of the buffers it touches. Offsets and slot products are int64 (C4).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kDflash = "copy_and_expand_dflash_inputs_kernel";

void copy_and_expand_dflash_inputs(Buffer next_token_ids, Buffer target_positions, Buffer out_input_ids,
                                   Buffer out_context_positions, Buffer out_query_positions,
                                   Buffer out_context_slot_mapping, Buffer out_query_slot_mapping,
                                   Buffer out_token_indices, Strided block_table, std::int64_t block_table_stride,
                                   Buffer query_start_loc, Buffer num_rejected_tokens,
                                   std::int64_t parallel_drafting_token_id, std::int64_t block_size,
                                   std::int64_t num_query_per_req, std::int64_t num_speculative_tokens,
                                   std::int64_t total_input_tokens, std::int64_t block_size_lanes,
                                   bool has_num_rejected) {
  if (query_start_loc.numel < 1) fail(kDflash, "query_start_loc_ptr", "must hold at least one element (B + 1)");
  if (has_num_rejected != num_rejected_tokens.present())  // a tensor, not None or 0
    fail(kDflash, "HAS_NUM_REJECTED", "must be num_rejected_tokens_ptr is a tensor");
  const std::int64_t b = query_start_loc.numel - 1, n_ctx = total_input_tokens;
  const std::int64_t Q = num_query_per_req, K = num_speculative_tokens, stride = block_table_stride;
  const std::vector<std::int64_t> qsl = load_offsets(kDflash, "query_start_loc_ptr", query_start_loc, b + 1);
  need_len(kDflash, "out_context_positions_ptr", out_context_positions, qsl[b]);
  need_len(kDflash, "out_context_slot_mapping_ptr", out_context_slot_mapping, qsl[b]);
  // Context reads: min(i, N_ctx - 1) for i in [qsl[0], qsl[B]).
  const bool has_context = qsl[b] > qsl[0];
  if (has_context) {
    need_at_least(kDflash, "total_input_tokens", n_ctx, 1);
    need_len(kDflash, "target_positions_ptr", target_positions, std::min(qsl[b], n_ctx));
  }
  // Without HAS_NUM_REJECTED the argument (the integer 0 at the call site) is ignored (C23).
  const std::vector<std::int64_t> rejected = has_num_rejected
                                                 ? load_ints(kDflash, "num_rejected_tokens_ptr", num_rejected_tokens, b)
                                                 : std::vector<std::int64_t>(b, 0);
  const char* which = has_num_rejected ? "num_rejected_tokens_ptr" : "query_start_loc_ptr";
  for (std::int64_t r = 0; r < b; ++r) {
    std::int64_t at = -1;  // a count of rejected tokens near int64's ends reads nowhere
    if (__builtin_sub_overflow(qsl[r + 1] - 1, rejected[r], &at)) at = -1;
    if (at < 0 || at >= target_positions.numel)
      fail(kDflash, which,
           "makes request " + std::to_string(r) + " read its last position at " + std::to_string(at) +
               ", outside target_positions_ptr[0, " + std::to_string(target_positions.numel) + ")");
  }
  need_at_least(kDflash, "num_query_per_req", Q, 1);
  if (K != Q - 1)
    fail(kDflash, "num_speculative_tokens",
         "must be num_query_per_req - 1 = " + std::to_string(Q - 1) + ", got " + std::to_string(K));
  const std::vector<std::int64_t> next = load_ints(kDflash, "next_token_ids_ptr", next_token_ids, b);
  need_len(kDflash, "out_input_ids_ptr", out_input_ids, b, Q);
  need_len(kDflash, "out_query_positions_ptr", out_query_positions, b, Q);
  need_len(kDflash, "out_query_slot_mapping_ptr", out_query_slot_mapping, b, Q);
  need_len(kDflash, "out_token_indices_ptr", out_token_indices, b, K);
  need_at_least(kDflash, "block_size", block_size, 1);
  need_at_least(kDflash, "block_table_stride", stride, 1);
  need_rows(kDflash, "block_table_ptr", block_table, b, stride, stride);
  need_power_of_two(kDflash, "BLOCK_SIZE", block_size_lanes);

  // Positions are >= 0 (C25): every context position read, and the first query's, last + 1.
  std::vector<std::int64_t> last(b);
  with_int(kDflash, "target_positions_ptr", target_positions.dtype, [&](auto p_) {
    const auto* positions = target_positions.as<decltype(p_)>();
    if (has_context) {
      const std::int64_t from = std::min(qsl[0], n_ctx - 1), to = std::min(qsl[b], n_ctx);
      if (to > from && first_below(positions + from, to - from, 0) >= 0)
        fail(kDflash, "target_positions_ptr", "must hold context positions >= 0 (C25)");
    }
    for (std::int64_t r = 0; r < b; ++r) {
      // No clamp to the request's own range: it may read an earlier request's position (C23).
      last[r] = positions[qsl[r + 1] - rejected[r] - 1];
      if (last[r] < -1)
        fail(kDflash, "target_positions_ptr",
             "gives request " + std::to_string(r) + " a first query position " + std::to_string(last[r] + 1) +
                 " < 0 (C25)");
      checked_add(kDflash, "target_positions_ptr", last[r], Q, "a request's last query position");
    }
  });

  const Blocks blocks(block_size, stride);
  with_int(kDflash, "block_table_ptr", block_table.data.dtype, [&](auto t_) {
    using T = decltype(t_);
    const T* table = block_table.as<T>();
    // Context tokens, rejected ones included, keep their positions and get their slots.
    with_int(kDflash, "target_positions_ptr", target_positions.dtype, [&](auto p_) {
      with_int(kDflash, "out_context_positions_ptr", out_context_positions.dtype, [&](auto cp_) {
        with_int(kDflash, "out_context_slot_mapping_ptr", out_context_slot_mapping.dtype, [&](auto cs_) {
          using Pos = decltype(p_);
          using CP = decltype(cp_);
          using CS = decltype(cs_);
          const Pos* positions = target_positions.as<Pos>();
          CP* context_positions = out_context_positions.as<CP>();
          CS* context_slots = out_context_slot_mapping.as<CS>();
          NoGil nogil;
          // Static, not dynamic: see copy_and_expand_eagle_inputs (csrc/eagle.cpp).
#pragma omp parallel for if (parallel_if(qsl[b] - qsl[0] >= kParallelCopyTokens)) schedule(static)
          for (std::int64_t r = 0; r < b; ++r) {
            for (std::int64_t i = qsl[r]; i < qsl[r + 1]; ++i) {
              const std::int64_t position = positions[std::min(i, n_ctx - 1)];  // reads clamped to N_ctx - 1
              context_positions[i] = static_cast<CP>(position);
              context_slots[i] = static_cast<CS>(blocks.slot(table, r * stride, position));
            }
          }
        });
      });
    });
    // Query tokens: the next token, then K parallel-drafting (mask) tokens the drafter samples at.
    with_int(kDflash, "out_input_ids_ptr", out_input_ids.dtype, [&](auto i_) {
      with_int(kDflash, "out_query_positions_ptr", out_query_positions.dtype, [&](auto qp_) {
        with_int(kDflash, "out_query_slot_mapping_ptr", out_query_slot_mapping.dtype, [&](auto qs_) {
          with_int(kDflash, "out_token_indices_ptr", out_token_indices.dtype, [&](auto ti_) {
            using I = decltype(i_);
            using QP = decltype(qp_);
            using QS = decltype(qs_);
            using TI = decltype(ti_);
            I* ids = out_input_ids.as<I>();
            QP* query_positions = out_query_positions.as<QP>();
            QS* query_slots = out_query_slot_mapping.as<QS>();
            TI* token_indices = out_token_indices.as<TI>();
            NoGil nogil;
#pragma omp parallel for if (parallel_if(b * Q >= kParallelCopyTokens)) schedule(static)
            for (std::int64_t r = 0; r < b; ++r) {
              for (std::int64_t k = 0; k < Q; ++k) {
                const std::int64_t o = r * Q + k, position = last[r] + 1 + k;
                query_positions[o] = static_cast<QP>(position);
                query_slots[o] = static_cast<QS>(blocks.slot(table, r * stride, position));
                ids[o] = static_cast<I>(k == 0 ? next[r] : parallel_drafting_token_id);
                if (k >= 1) token_indices[r * K + k - 1] = static_cast<TI>(o);
              }
            }
          });
        });
      });
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(dflash, "DFlash input preparation") { def_kernel<&copy_and_expand_dflash_inputs>(m, "copy_and_expand_dflash_inputs"); }

}  // namespace specdiff
