// OpenMP port of Model Runner V2's rejection-sampler kernels (conformance/kernels/mrv2.py).
//
// Mirrors reference/mrv2.py: every index, count and copied value is checked before anything is
// written (spec §1.12), then the rows are filled in parallel. Offsets are int64 (C4).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kGather = "_gather_draft_sampled_kernel";
constexpr const char* kFlatten = "_flatten_sampled_kernel";

constexpr std::int64_t kParallelRows = 16384;

void gather_draft_sampled(Buffer draft_sampled, Buffer pos_out, Buffer input_ids, Buffer positions, Buffer logits_indices,
                          Buffer expanded_idx_mapping, Buffer expanded_local_pos, Buffer prefill_len,
                          std::int64_t num_logits, std::int64_t block_size) {
  need_at_least(kGather, "num_logits", num_logits, 0);
  need_power_of_two(kGather, "BLOCK_SIZE", block_size);
  need_len(kGather, "draft_sampled_ptr", draft_sampled, num_logits);
  need_len(kGather, "pos_ptr", pos_out, num_logits);
  const std::vector<std::int64_t> token = load_ints(kGather, "logits_indices_ptr", logits_indices, num_logits);
  const std::vector<std::int64_t> slot = load_ints(kGather, "expanded_idx_mapping_ptr", expanded_idx_mapping, num_logits);
  const std::vector<std::int64_t> local = load_ints(kGather, "expanded_local_pos_ptr", expanded_local_pos, num_logits);
  const std::vector<std::int64_t> ids = load_ints(kGather, "input_ids_ptr", input_ids, input_ids.numel);
  const std::vector<std::int64_t> position = load_ints(kGather, "positions_ptr", positions, positions.numel);
  const std::vector<std::int64_t> prefill = load_ints(kGather, "prefill_len_ptr", prefill_len, prefill_len.numel);
  const std::int64_t tokens = std::min(input_ids.numel, positions.numel);
  for (std::int64_t i = 0; i < num_logits; ++i) {
    if (token[i] < 0 || token[i] >= tokens)
      fail(kGather, "logits_indices_ptr",
           "must hold token indices in [0, " + std::to_string(tokens) + ") (the shorter of input_ids and positions)");
    if (slot[i] < 0 || slot[i] >= prefill_len.numel)
      fail(kGather, "expanded_idx_mapping_ptr",
           "must hold request slots in [0, " + std::to_string(prefill_len.numel) + ") (prefill_len's length)");
    if (position[token[i]] < 0) fail(kGather, "positions_ptr", "must hold positions >= 0 at the gathered tokens (C25)");
    if (local[i] < 0) fail(kGather, "expanded_local_pos_ptr", "must hold local positions >= 0");
    need_fits(kGather, "input_ids_ptr", ids[token[i]], "draft_sampled_ptr", draft_sampled);
    need_fits(kGather, "positions_ptr", position[token[i]], "pos_ptr", pos_out);
  }
  with_int(kGather, "draft_sampled_ptr", draft_sampled.dtype, [&](auto d_) {
    with_int(kGather, "pos_ptr", pos_out.dtype, [&](auto p_) {
      using D = decltype(d_);
      using P = decltype(p_);
      D* out_ids = draft_sampled.as<D>();
      P* out_pos = pos_out.as<P>();
      py::gil_scoped_release nogil;
#pragma omp parallel for if (num_logits >= kParallelRows) schedule(static)
      for (std::int64_t i = 0; i < num_logits; ++i) {
        const std::int64_t t = token[i], p = position[t];
        // A draft row of a step that starts inside the prefill is a placeholder (-1).
        const bool placeholder = local[i] > 0 && p - local[i] < prefill[slot[i]];
        out_ids[i] = static_cast<D>(placeholder ? -1 : ids[t]);
        out_pos[i] = static_cast<P>(p);
      }
    });
  });
}

void flatten_sampled(Buffer flat_sampled, Strided sampled, std::int64_t sampled_stride, Buffer num_sampled,
                     Buffer cu_num_logits) {
  if (cu_num_logits.numel < 1) fail(kFlatten, "cu_num_logits_ptr", "must hold at least one element (num_reqs + 1)");
  const std::vector<std::int64_t> cu = load_offsets(kFlatten, "cu_num_logits_ptr", cu_num_logits, cu_num_logits.numel);
  const std::int64_t reqs = static_cast<std::int64_t>(cu.size()) - 1;
  const std::vector<std::int64_t> count = load_ints(kFlatten, "num_sampled_ptr", num_sampled, reqs);
  for (std::int64_t r = 0; r < reqs; ++r)
    if (count[r] < 0 || count[r] > cu[r + 1] - cu[r])
      fail(kFlatten, "num_sampled_ptr",
           "must hold counts in [0, cu[r+1] - cu[r]] so that requests write disjoint rows; request " + std::to_string(r) +
               " has " + std::to_string(count[r]) + " for " + std::to_string(cu[r + 1] - cu[r]) + " rows");
  if (reqs == 0) return;  // nothing is written: the offsets need no room
  need_len(kFlatten, "flat_sampled_ptr", flat_sampled, cu.back());
  for (std::int64_t r = 0; r < reqs; ++r)
    if (count[r] > 0 && !sampled.holds(flat_index(r, sampled_stride, 0), count[r]))
      fail(kFlatten, "sampled_ptr",
           "must hold request " + std::to_string(r) + "'s " + std::to_string(count[r]) + " accepted tokens at row " +
               std::to_string(r) + " x row stride " + std::to_string(sampled_stride));
  with_int(kFlatten, "sampled_ptr", sampled.data.dtype, [&](auto s_) {
    with_int(kFlatten, "flat_sampled_ptr", flat_sampled.dtype, [&](auto f_) {
      using S = decltype(s_);
      using F = decltype(f_);
      const S* src = sampled.as<S>();
      F* dst = flat_sampled.as<F>();
      for (std::int64_t r = 0; r < reqs; ++r)
        for (std::int64_t i = 0; i < count[r]; ++i)
          need_fits(kFlatten, "sampled_ptr", static_cast<std::int64_t>(src[r * sampled_stride + i]), "flat_sampled_ptr",
                    flat_sampled);
      py::gil_scoped_release nogil;
#pragma omp parallel for if (reqs >= kParallelRows) schedule(static)
      for (std::int64_t r = 0; r < reqs; ++r)
        for (std::int64_t i = 0; i < count[r]; ++i) dst[cu[r] + i] = static_cast<F>(src[r * sampled_stride + i]);
    });
  });
}

}  // namespace

void register_mrv2(py::module_& m) {
  def_kernel<&gather_draft_sampled>(m, "_gather_draft_sampled");
  def_kernel<&flatten_sampled>(m, "_flatten_sampled");
}

}  // namespace specdiff
