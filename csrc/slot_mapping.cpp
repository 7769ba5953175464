// OpenMP port of the KV slot-mapping kernel, vLLM's ComputeSlotMappingKernel.kernel (spec §2.10).
//
// Mirrors reference/slot_mapping.py: the query offsets, every scheduled position and every
// block-table read are checked before anything is written; then the tail is padded and each
// token's slot is computed. Tokens are independent, so the work is split by token, not by
// request: one long prefill spreads over every core. Offsets and products are int64 (C4).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kSlots = "compute_slot_mapping_kernel";

constexpr std::int64_t kParallelTokens = 16384;

// The §2.10 context-parallel split of a position (>= 0).
struct Split {
  std::int64_t virtual_block;  // index into the request's block-table row (not clamped, C22)
  std::int64_t local_offset;   // offset inside this rank's block
  bool local;                  // this rank stores the token
};

inline Split split(std::int64_t position, std::int64_t kbs, std::int64_t world, std::int64_t rank,
                   std::int64_t interleave) {
  // A virtual block spans KBS * W positions; within it, runs of I tokens go to ranks in turn.
  const std::int64_t virtual_block = position / (kbs * world);
  const std::int64_t offset = position - virtual_block * (kbs * world);
  return {virtual_block, (offset / (world * interleave)) * interleave + offset % interleave,
          (offset / interleave) % world == rank};
}

// The request of token t in [qsl[0], qsl[R]): the last r with qsl[r] <= t.
inline std::int64_t request_of(const std::vector<std::int64_t>& qsl, std::int64_t t) {
  return std::upper_bound(qsl.begin(), qsl.end(), t) - qsl.begin() - 1;
}

void compute_slot_mapping(std::int64_t num_tokens, std::int64_t max_num_tokens, Buffer query_start_loc,
                          Buffer positions, Strided block_table, std::int64_t block_table_stride, Buffer slot_mapping,
                          std::int64_t kbs, std::int64_t world, std::int64_t rank, std::int64_t interleave,
                          std::int64_t pad_id, std::int64_t block_size) {
  if (query_start_loc.numel < 1) fail(kSlots, "query_start_loc_ptr", "must hold at least one element (num_reqs + 1)");
  const std::vector<std::int64_t> qsl =
      load_offsets(kSlots, "query_start_loc_ptr", query_start_loc, query_start_loc.numel);
  const std::int64_t first = qsl.front(), last = qsl.back();
  if (last > num_tokens)
    fail(kSlots, "num_tokens",
         "must be >= query_start_loc[-1] = " + std::to_string(last) + ", got " + std::to_string(num_tokens));
  need_len(kSlots, "positions_ptr", positions, num_tokens);
  need_len(kSlots, "slot_mapping_ptr", slot_mapping, std::max(max_num_tokens, last));
  need_at_least(kSlots, "KV_CACHE_BLOCK_SIZE", kbs, 1);
  need_at_least(kSlots, "TOTAL_CP_WORLD_SIZE", world, 1);
  need_at_least(kSlots, "CP_KV_CACHE_INTERLEAVE_SIZE", interleave, 1);
  if (rank < 0 || rank >= world)
    fail(kSlots, "TOTAL_CP_RANK",
         "must be in [0, TOTAL_CP_WORLD_SIZE=" + std::to_string(world) + "), got " + std::to_string(rank));
  checked_mul(kSlots, "TOTAL_CP_WORLD_SIZE", kbs, world, "KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE");
  checked_mul(kSlots, "CP_KV_CACHE_INTERLEAVE_SIZE", world, interleave, "TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE");
  need_power_of_two(kSlots, "BLOCK_SIZE", block_size);
  need_fits(kSlots, "PAD_ID", pad_id, "slot_mapping_ptr", slot_mapping);

  with_int(kSlots, "positions_ptr", positions.dtype, [&](auto p_) {
    with_int(kSlots, "block_table_ptr", block_table.data.dtype, [&](auto t_) {
      with_int(kSlots, "slot_mapping_ptr", slot_mapping.dtype, [&](auto o_) {
        using Pos = decltype(p_);
        using T = decltype(t_);
        using O = decltype(o_);
        const Pos* position = positions.as<Pos>();
        const T* table = block_table.as<T>();
        O* slots = slot_mapping.as<O>();
        // Positions are >= 0 (C25); a local token's block lies inside the table: the virtual
        // block index may run into the next row, never past the table (C22).
        for (std::int64_t t = first; t < last; ++t) {
          if (position[t] < 0)
            fail(kSlots, "positions_ptr",
                 "must hold positions >= 0 (C25), got " + std::to_string(static_cast<std::int64_t>(position[t])));
          const Split s = split(position[t], kbs, world, rank, interleave);
          if (s.local) {
            const std::int64_t flat = flat_index(request_of(qsl, t), block_table_stride, s.virtual_block);
            need_element(kSlots, "block_table_ptr", block_table, flat, "a local token's block");
          }
        }
        py::gil_scoped_release nogil;
        // The tail is padded on every launch, so a smaller batch overwrites stale slots (C22).
        if (max_num_tokens > num_tokens) std::fill(slots + num_tokens, slots + max_num_tokens, static_cast<O>(pad_id));
#pragma omp parallel for if (parallel_if(last - first >= kParallelTokens)) schedule(static)
        for (std::int64_t t = first; t < last; ++t) {
          const Split s = split(position[t], kbs, world, rank, interleave);
          // The table is read only for this rank's tokens; the others get PAD_ID.
          const std::int64_t slot =
              s.local ? static_cast<std::int64_t>(table[request_of(qsl, t) * block_table_stride + s.virtual_block]) * kbs +
                            s.local_offset
                      : pad_id;
          slots[t] = static_cast<O>(slot);
        }
      });
    });
  });
}

}  // namespace

void register_slot_mapping(py::module_& m) { def_kernel<&compute_slot_mapping>(m, "compute_slot_mapping"); }

}  // namespace specdiff
