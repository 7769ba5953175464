// OpenMP port of the EAGLE input-preparation kernels (spec §2.5–§2.8).
//
// Each entry mirrors the PyTorch oracle in reference/eagle.py step by step: every value-level
// precondition is checked before anything is written, small per-request inputs are read into
// int64 vectors, bulk buffers are read and written in their own dtypes (templates), and every
// offset and slot product is formed in int64 (C4).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kStep = "eagle_step_slot_mapping_metadata_kernel";
constexpr const char* kInputs = "eagle_prepare_inputs_padded_kernel";
constexpr const char* kNextToken = "eagle_prepare_next_token_padded_kernel";
constexpr const char* kExpand = "copy_and_expand_eagle_inputs_kernel";

// K6 and K7 touch a few values per row and go parallel at kParallelSmallRows: at 256 rows the fork
// and join was half of K6's time. K5 forks once each thread of the team gets kStepRowsPerThread rows
// (worth_team): on 16 cores a team took twice one thread's time for 256 rows (its block-table
// gathers are a cache miss each, but one thread overlaps hundreds); on 2 cores, 1024 rows gain.
constexpr std::int64_t kStepRowsPerThread = 512;

void eagle_step_slot_mapping_metadata(Buffer positions, Strided block_table, std::int64_t block_table_stride,
                                      Buffer seq_lens, Buffer out_clamped_positions, Buffer out_slot_mapping,
                                      std::int64_t block_size, std::int64_t max_model_len,
                                      std::int64_t n_blocks_per_req, std::int64_t pad_id, std::int64_t batch_size) {
  const std::int64_t b = batch_size, rows = out_slot_mapping.numel;  // rows = input_batch_size
  if (b < 0 || b > rows)
    fail(kStep, "batch_size",
         "must be in [0, len(out_slot_mapping_ptr) = " + std::to_string(rows) + "], got " + std::to_string(b));
  need_len(kStep, "seq_lens_ptr", seq_lens, b);
  need_len(kStep, "out_clamped_positions_ptr", out_clamped_positions, b);
  need_at_least(kStep, "block_size", block_size, 1);
  need_at_least(kStep, "max_model_len", max_model_len, 1);
  need_at_least(kStep, "n_blocks_per_req", n_blocks_per_req, 1);
  need_rows(kStep, "block_table_ptr", block_table, b, block_table_stride, n_blocks_per_req);
  need_len(kStep, "positions_ptr", positions, b);
  need_fits(kStep, "PAD_ID", pad_id, "out_slot_mapping_ptr", out_slot_mapping);

  with_int(kStep, "positions_ptr", positions.dtype, [&](auto p_) {
    with_int(kStep, "block_table_ptr", block_table.data.dtype, [&](auto t_) {
      with_int(kStep, "seq_lens_ptr", seq_lens.dtype, [&](auto s_) {
        with_int(kStep, "out_clamped_positions_ptr", out_clamped_positions.dtype, [&](auto c_) {
          with_int(kStep, "out_slot_mapping_ptr", out_slot_mapping.dtype, [&](auto o_) {
            using P = decltype(p_);
            using T = decltype(t_);
            using S = decltype(s_);
            using C = decltype(c_);
            using O = decltype(o_);
            const P* position = positions.as<P>();
            const std::int64_t bad = first_below(position, b, -1);
            if (bad >= 0)
              fail(kStep, "positions_ptr", "must hold positions >= -1 (C25), got " + std::to_string(position[bad]));
            const T* table = block_table.as<T>();
            S* seq = seq_lens.as<S>();
            C* clamped = out_clamped_positions.as<C>();
            O* slots = out_slot_mapping.as<O>();
            const Blocks blocks(block_size, n_blocks_per_req);
            const std::int64_t stride = block_table_stride, last = max_model_len - 1, pad = pad_id;
            NoGil nogil;
            // positions may be out_clamped_positions itself and no other overlap passes the launcher
            // (C21, C31), so row r reading its position before writing its own clamped position is
            // the whole of the aliasing rule: no copy of positions is needed.
#pragma omp parallel for if (worth_team(rows, kStepRowsPerThread)) schedule(static)
            for (std::int64_t r = 0; r < rows; ++r) {
              if (r >= b) {  // cudagraph padding: only the slot mapping is written
                slots[r] = static_cast<O>(pad);
                continue;
              }
              // position + 1 >= max_model_len neutralises the request: position 0, slot PAD_ID, seq_len 1.
              const std::int64_t p = static_cast<std::int64_t>(position[r]);
              const bool over = p >= last;
              const std::int64_t new_position = over ? 0 : p + 1;
              const std::int64_t slot = blocks.slot(table, r * stride, new_position);
              const std::int64_t seq_len = over ? 1 : static_cast<std::int64_t>(seq[r]) + 1;
              slots[r] = static_cast<O>(over ? pad : slot);
              clamped[r] = static_cast<C>(new_position);
              seq[r] = static_cast<S>(std::min(seq_len, last + 1));
            }
          });
        });
      });
    });
  });
}

void eagle_prepare_inputs_padded(Buffer cu_num_draft_tokens, Buffer valid_sampled_tokens_count,
                                 Buffer query_start_loc, Buffer token_indices_to_sample, Buffer num_rejected_tokens,
                                 std::int64_t num_reqs) {
  // The kernel clamps nothing and indexes nothing by value: only lengths matter (§2.6).
  const std::int64_t n = num_reqs;
  need_at_least(kInputs, "num_reqs", n, 0);
  const std::vector<std::int64_t> cu = load_ints(kInputs, "cu_num_draft_tokens_ptr", cu_num_draft_tokens, n);
  const Cumulative<std::int64_t> drafts{cu.data()};
  const std::vector<std::int64_t> valid =
      load_ints(kInputs, "valid_sampled_tokens_count_ptr", valid_sampled_tokens_count, n);
  const std::vector<std::int64_t> qsl = load_ints(kInputs, "query_start_loc_gpu_ptr", query_start_loc, n + 1);
  need_len(kInputs, "token_indices_to_sample_ptr", token_indices_to_sample, n);
  need_len(kInputs, "num_rejected_tokens_gpu_ptr", num_rejected_tokens, n);
  with_int(kInputs, "token_indices_to_sample_ptr", token_indices_to_sample.dtype, [&](auto i_) {
    with_int(kInputs, "num_rejected_tokens_gpu_ptr", num_rejected_tokens.dtype, [&](auto j_) {
      using I = decltype(i_);
      using J = decltype(j_);
      I* indices = token_indices_to_sample.as<I>();
      J* rejected_out = num_rejected_tokens.as<J>();
      NoGil nogil;
#pragma omp parallel for if (parallel_if(n >= kParallelSmallRows)) schedule(static)
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t num_drafts = drafts.count(r);  // cu[-1] is never read (C1)
        // No drafts, no rejections; otherwise unclamped, even if negative (C19).
        const std::int64_t rejected = num_drafts > 0 ? num_drafts + 1 - valid[r] : 0;
        indices[r] = static_cast<I>(qsl[r + 1] - 1 - rejected);
        rejected_out[r] = static_cast<J>(rejected);
      }
    });
  });
}

void eagle_prepare_next_token_padded(Strided sampled_token_ids, Buffer discard_request_mask,
                                     Buffer backup_next_token_ids, Buffer next_token_ids,
                                     Buffer valid_sampled_tokens_count, std::int64_t vocab_size,
                                     std::int64_t num_sampled_tokens_per_req, std::int64_t num_reqs,
                                     std::int64_t stride_sampled_token_ids, std::int64_t block_size_tokens) {
  const std::int64_t n = num_reqs, w = num_sampled_tokens_per_req, stride = stride_sampled_token_ids;
  need_at_least(kNextToken, "num_reqs", n, 0);
  need_at_least(kNextToken, "num_sampled_tokens_per_req", w, 0);
  need_power_of_two(kNextToken, "BLOCK_SIZE_TOKENS", block_size_tokens);
  if (block_size_tokens < w)
    fail(kNextToken, "BLOCK_SIZE_TOKENS",
         "must be >= num_sampled_tokens_per_req (" + std::to_string(w) + "), got " + std::to_string(block_size_tokens));
  need_rows(kNextToken, "sampled_token_ids_ptr", sampled_token_ids, n, stride, w);
  need_len(kNextToken, "discard_request_mask_ptr", discard_request_mask, n);
  const std::vector<std::int64_t> backup = load_ints(kNextToken, "backup_next_token_ids_ptr", backup_next_token_ids, n);
  need_len(kNextToken, "next_token_ids_ptr", next_token_ids, n);
  need_len(kNextToken, "valid_sampled_tokens_count_ptr", valid_sampled_tokens_count, n);
  with_int(kNextToken, "sampled_token_ids_ptr", sampled_token_ids.data.dtype, [&](auto x_) {
    with_int(kNextToken, "next_token_ids_ptr", next_token_ids.dtype, [&](auto t_) {
      with_int(kNextToken, "valid_sampled_tokens_count_ptr", valid_sampled_tokens_count.dtype, [&](auto c_) {
        using X = decltype(x_);
        using T = decltype(t_);
        using C = decltype(c_);
        const X* sampled = sampled_token_ids.as<X>();
        const bool* discard = discard_request_mask.as<bool>();
        T* next = next_token_ids.as<T>();
        C* count_out = valid_sampled_tokens_count.as<C>();
        NoGil nogil;
#pragma omp parallel for if (parallel_if(n >= kParallelSmallRows)) schedule(static)
        for (std::int64_t r = 0; r < n; ++r) {
          if (discard[r]) {  // the backup and a count of 0; the sampled row is not read (C20)
            next[r] = static_cast<T>(backup[r]);
            count_out[r] = 0;
            continue;
          }
          std::int64_t count = 0, last = backup[r];
          // With no column to read (w = 0) any stride is in contract: no row pointer is formed.
          for (std::int64_t j = 0; j < w; ++j) {
            const X* row = sampled + r * stride;
            const std::int64_t x = row[j];
            // Element-wise validity: -2 is valid, a -1 in the middle ends nothing (C20).
            if (x != -1 && x < vocab_size) {
              ++count;
              last = x;
            }
          }
          next[r] = static_cast<T>(last);
          count_out[r] = static_cast<C>(count);
        }
      });
    });
  });
}

void copy_and_expand_eagle_inputs(Buffer target_token_ids, Buffer target_positions, Buffer next_token_ids,
                                  Buffer out_input_ids, Buffer out_positions, Buffer out_is_rejected_token_mask,
                                  Buffer out_is_masked_token_mask, Buffer out_new_token_indices,
                                  Buffer out_hidden_state_mapping, Buffer query_start_loc, Buffer query_end_loc,
                                  std::int64_t padding_token_id, std::int64_t parallel_drafting_token_id,
                                  std::int64_t total_input_tokens, std::int64_t num_padding_slots_per_request,
                                  bool shift_input_ids, std::int64_t block_size_tokens) {
  const std::int64_t b = query_end_loc.numel, P = num_padding_slots_per_request;
  const std::vector<std::int64_t> qend = load_ints(kExpand, "query_end_loc_ptr", query_end_loc, b);
  const std::vector<std::int64_t> qsl = load_offsets(kExpand, "query_start_loc_ptr", query_start_loc, b + 1);
  for (std::int64_t r = 0; r < b; ++r)
    if (qend[r] < qsl[r] || qend[r] > qsl[r + 1] - 1)
      fail(kExpand, "query_end_loc_ptr",
           "entry " + std::to_string(r) + " (" + std::to_string(qend[r]) + ") must lie in request " +
               std::to_string(r) + "'s tokens [" + std::to_string(qsl[r]) + ", " + std::to_string(qsl[r + 1]) + ")");
  const std::int64_t n_in = total_input_tokens;
  if (qsl[b] > n_in)
    fail(kExpand, "total_input_tokens",
         "must be >= query_start_loc[" + std::to_string(b) + "] = " + std::to_string(qsl[b]) + ", got " +
             std::to_string(n_in));
  need_len(kExpand, "target_token_ids_ptr", target_token_ids, n_in);
  need_len(kExpand, "target_positions_ptr", target_positions, n_in);
  const std::vector<std::int64_t> next = load_ints(kExpand, "next_token_ids_ptr", next_token_ids, b);
  need_at_least(kExpand, "num_padding_slots_per_request", P, 1);
  const std::int64_t net_new = P - (shift_input_ids ? 1 : 0);
  // A huge P must not wrap the output length to one a short buffer passes (the fuzz's 2**62):
  // b * net_new + qsl[b] is -1 when it overflows int64 (both terms are >= 0 otherwise).
  const std::int64_t n_out = flat_index(b, net_new, qsl[b]);
  if (n_out < 0)
    fail(kExpand, "out_input_ids_ptr",
         "must hold query_start_loc[-1] + " + std::to_string(b) + " * " + std::to_string(net_new) +
             " elements, more than any buffer, has " + std::to_string(out_input_ids.numel));
  need_len(kExpand, "out_input_ids_ptr", out_input_ids, n_out);
  need_len(kExpand, "out_positions_ptr", out_positions, n_out);
  need_len(kExpand, "out_is_rejected_token_mask_ptr", out_is_rejected_token_mask, n_out);
  need_len(kExpand, "out_is_masked_token_mask_ptr", out_is_masked_token_mask, n_out);
  need_len(kExpand, "out_new_token_indices_ptr", out_new_token_indices, b, P);
  if (shift_input_ids) need_len(kExpand, "out_hidden_state_mapping_ptr", out_hidden_state_mapping, qsl[b]);
  need_power_of_two(kExpand, "BLOCK_SIZE_TOKENS", block_size_tokens);
  // The first position of each request: positions are never shifted (C24).
  std::vector<std::int64_t> first_position(b);
  with_int(kExpand, "target_positions_ptr", target_positions.dtype, [&](auto p_) {
    for (std::int64_t r = 0; r < b; ++r) first_position[r] = target_positions.as<decltype(p_)>()[qsl[r]];
  });

  with_int(kExpand, "target_token_ids_ptr", target_token_ids.dtype, [&](auto d_) {
    with_int(kExpand, "out_input_ids_ptr", out_input_ids.dtype, [&](auto i_) {
      with_int(kExpand, "out_positions_ptr", out_positions.dtype, [&](auto p_) {
        with_int(kExpand, "out_new_token_indices_ptr", out_new_token_indices.dtype, [&](auto n_) {
          with_int(kExpand, "out_hidden_state_mapping_ptr", out_hidden_state_mapping.dtype, [&](auto h_) {
            using D = decltype(d_);
            using I = decltype(i_);
            using Pos = decltype(p_);
            using N = decltype(n_);
            using H = decltype(h_);
            const D* tokens = target_token_ids.as<D>();
            I* ids = out_input_ids.as<I>();
            Pos* positions = out_positions.as<Pos>();
            bool* is_rejected = out_is_rejected_token_mask.as<bool>();
            bool* is_masked = out_is_masked_token_mask.as<bool>();
            N* new_indices = out_new_token_indices.as<N>();
            H* hidden = out_hidden_state_mapping.as<H>();
            NoGil nogil;
            // Static: a thread takes the same requests every launch, so their lines are still in its
            // own cache; schedule(dynamic) moved them between cores at every call (the dflash copy,
            // the same loop shape, took 39 us on 2 threads against 25 us on one at 1024 requests).
#pragma omp parallel for if (parallel_if(n_out >= kParallelCopyTokens)) schedule(static)
            for (std::int64_t r = 0; r < b; ++r) {
              const std::int64_t qs = qsl[r], qn = qsl[r + 1], qe = qend[r];
              // EAGLE (shifting): the ids move left by one and the bonus fills the gap.
              const std::int64_t nv = shift_input_ids ? qe - qs : qe - qs + 1;
              const std::int64_t off = shift_input_ids ? 1 : 0;
              const std::int64_t o0 = qs + r * (shift_input_ids ? P - 1 : P);
              const std::int64_t nrej = qn - qe - 1;
              const std::int64_t total = nv + P + nrej;  // consecutive requests tile the output
              // Regions of output slot j: valid [0, nv), bonus nv, parallel (nv, nv + P), rejected after.
              for (std::int64_t j = 0; j < total; ++j) {
                const std::int64_t o = o0 + j;
                const bool rejected = j >= nv + P;
                const std::int64_t id = j < nv    ? static_cast<std::int64_t>(tokens[qs + off + j])
                                        : j == nv ? next[r]
                                        : !rejected ? parallel_drafting_token_id
                                                    : padding_token_id;
                ids[o] = static_cast<I>(id);
                positions[o] = static_cast<Pos>(rejected ? 0 : first_position[r] + j);  // never shifted (C24)
                is_rejected[o] = rejected;
                is_masked[o] = j > nv && !rejected;
              }
              // The drafter samples at the bonus slot and the parallel slots.
              for (std::int64_t k = 0; k < P; ++k) new_indices[r * P + k] = static_cast<N>(o0 + nv + k);
              if (shift_input_ids)  // every input token, rejected ones included (C24)
                for (std::int64_t j = 0; j < qn - qs; ++j) hidden[qs + j] = static_cast<H>(o0 + j);
            }
          });
        });
      });
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(eagle, "EAGLE input preparation") {
  def_kernel<&eagle_step_slot_mapping_metadata>(m, "eagle_step_slot_mapping_metadata");
  def_kernel<&eagle_prepare_inputs_padded>(m, "eagle_prepare_inputs_padded");
  def_kernel<&eagle_prepare_next_token_padded>(m, "eagle_prepare_next_token_padded");
  def_kernel<&copy_and_expand_eagle_inputs>(m, "copy_and_expand_eagle_inputs");
}

}  // namespace specdiff
