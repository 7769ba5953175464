// OpenMP port of the KV slot-mapping kernel, vLLM's ComputeSlotMappingKernel.kernel (spec §2.10).
//
// Mirrors reference/slot_mapping.py: the query offsets, every scheduled position and every
// block-table read are checked before anything is written; then the tail is padded and each
// token's slot is computed. Tokens are independent, so the work is split by token, not by
// request: one long prefill spreads over every core. Offsets and products are int64 (C4).
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kSlots = "compute_slot_mapping_kernel";

// Tokens worth a thread of their own (worth_team): on 16 cores a team for 1024 requests (5120
// tokens) gained nothing over one thread; on 2 cores it gains a third.
constexpr std::int64_t kSlotTokensPerThread = 2048;


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

// The block table as the token loop reads it: rows of `stride`, and (when its elements are one
// run) the flat index every element lies below, so an element test is one comparison.
template <class T>
struct Table {
  const T* data;
  std::int64_t stride;
  std::int64_t end;  // -1: not one run; ask the Strided
};

// The smallest and largest of n >= 1 positions (vectorized: a decode batch checks a few
// positions per request, a prefill a long run).
template <class Pos>
SPECDIFF_CLONES void bounds(const Pos* __restrict__ p, std::int64_t n, std::int64_t& least, std::int64_t& most) {
  std::int64_t lo = static_cast<std::int64_t>(p[0]), hi = lo;
  for (std::int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, static_cast<std::int64_t>(p[i]));
    hi = std::max(hi, static_cast<std::int64_t>(p[i]));
  }
  least = lo;
  most = hi;
}

// The common launch (no context parallelism, a table of one run): the
// block index only grows with the position, and the last request's row ends nearest the table's
// end, so the batch's smallest and largest positions decide every token's checks in one vectorized
// pass, and the slots go straight to the output. False, with nothing written, when that bound does
// not hold: the token-by-token path then finds the first token without a slot, if there is one.
template <class Pos, class T, class O, class SplitFn>
bool direct_slots(const std::vector<std::int64_t>& qsl, const Pos* __restrict__ position, const Table<T>& tab, O* __restrict__ slots,
                  SplitFn split_of, std::int64_t kbs) {
  const std::size_t requests = qsl.size() - 1;
  const std::int64_t first = qsl.front(), last = qsl.back();
  if (tab.end < 0 || tab.stride < 0 || requests == 0) return false;
  if (last > first) {
    std::int64_t least = 0, most = 0, row = 0, flat = 0;
    bounds(position + first, last - first, least, most);
    if (least < 0 || __builtin_mul_overflow(static_cast<std::int64_t>(requests - 1), tab.stride, &row) ||
        __builtin_add_overflow(row, split_of(most).virtual_block, &flat) || flat >= tab.end)
      return false;
  }
  // The writes are independent: a large batch splits its tokens among the team (an `if` clause, so
  // the thread check's shim can force a small one parallel too).
  const std::int64_t n = last - first;
#pragma omp parallel if (worth_team(n, kSlotTokensPerThread))
  {
    const std::int64_t k = omp_get_num_threads(), i = omp_get_thread_num();
    const std::int64_t lo = first + n * i / k, end = first + n * (i + 1) / k;
    for (std::int64_t t = lo, r = lo < end ? request_of(qsl, lo) : 0; t < end; ++r) {
      const T* __restrict__ row = tab.data + r * tab.stride;
      const std::int64_t hi = std::min(end, qsl[static_cast<std::size_t>(r) + 1]);  // held: a store may not alias it
      for (; t < hi; ++t) {
        const Split s = split_of(static_cast<std::int64_t>(position[t]));
        slots[t] = static_cast<O>(static_cast<std::int64_t>(row[s.virtual_block]) * kbs + s.local_offset);
      }
    }
  }
  return true;
}

// Slots of tokens [lo, hi) into out[t], walking the requests from the one holding lo; returns the
// first token without one (a negative position, C25, or a local block outside the table, C22: the
// virtual block index may run into the next row, never past the table), or hi.
template <class Pos, class T, class SplitFn>
std::int64_t slots_of(const std::vector<std::int64_t>& qsl, const Pos* position, const Table<T>& tab,
                      const Strided& table, std::int64_t lo, std::int64_t hi, std::int64_t* out, SplitFn split_of,
                      std::int64_t pad_id, std::int64_t kbs) {
  std::int64_t r = request_of(qsl, lo);
  for (std::int64_t t = lo; t < hi; ++r) {
    const std::int64_t end = std::min(hi, qsl[static_cast<std::size_t>(r) + 1]);
    std::int64_t row = 0;
    const bool row_overflows = __builtin_mul_overflow(r, tab.stride, &row);  // matters only to local tokens
    for (; t < end; ++t) {
      const std::int64_t p = static_cast<std::int64_t>(position[t]);
      if (p < 0) return t;
      const Split s = split_of(p);
      std::int64_t slot = pad_id;  // the table is read only for this rank's tokens
      if (s.local) {
        std::int64_t flat = 0;
        if (row_overflows || __builtin_add_overflow(row, s.virtual_block, &flat)) return t;
        if (tab.end >= 0 ? (flat < 0 || flat >= tab.end) : !table.holds(flat)) return t;
        slot = static_cast<std::int64_t>(tab.data[flat]) * kbs + s.local_offset;
      }
      out[t] = slot;
    }
  }
  return hi;
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
        // One fused pass: each token's slot goes to scratch, or the token is the first with none (a
        // negative position, C25, or a local block outside the table, C22: the virtual block index
        // may run into the next row, never past the table). Nothing is written before every token
        // has its slot.
        const std::int64_t n = last - first;
        const std::int64_t span = block_table.row_stride <= block_table.cols && block_table.rows > 0 && block_table.cols > 0
                                      ? (block_table.rows - 1) * block_table.row_stride + block_table.cols : -1;
        const Table<T> tab{table, block_table_stride, span};
        const bool pow2 = (kbs & (kbs - 1)) == 0;
        const int shift = pow2 ? __builtin_ctzll(static_cast<unsigned long long>(kbs)) : 0;
        // No context parallelism: a block is KBS positions, every token local.
        auto by_shift = [=](std::int64_t p) { return Split{p >> shift, p & (kbs - 1), true}; };
        auto by_division = [=](std::int64_t p) { return Split{p / kbs, p % kbs, true}; };
        auto by_rank = [=](std::int64_t p) { return split(p, kbs, world, rank, interleave); };
        if (world == 1) {
          NoGil nogil;
          if (pow2 ? direct_slots(qsl, position, tab, slots, by_shift, kbs) : direct_slots(qsl, position, tab, slots, by_division, kbs)) {
            // The tail is padded on every launch, so a smaller batch overwrites stale slots (C22).
            if (max_num_tokens > num_tokens) std::fill(slots + num_tokens, slots + max_num_tokens, static_cast<O>(pad_id));
            return;
          }
        }
        // Token by token: each slot goes to scratch, or the token is the first without one.
        // Nothing is written before every token has its slot.
        std::unique_ptr<std::int64_t[]> scratch(new std::int64_t[static_cast<std::size_t>(n)]);
        std::int64_t bad = last;
        {
          NoGil nogil;
          auto run = [&](std::int64_t lo, std::int64_t hi) -> std::int64_t {
            std::int64_t* out = scratch.get() - first;
            if (world != 1) return slots_of(qsl, position, tab, block_table, lo, hi, out, by_rank, pad_id, kbs);
            if (pow2) return slots_of(qsl, position, tab, block_table, lo, hi, out, by_shift, pad_id, kbs);
            return slots_of(qsl, position, tab, block_table, lo, hi, out, by_division, pad_id, kbs);
          };
#pragma omp parallel if (worth_team(n, kSlotTokensPerThread)) reduction(min : bad)
          {
            const std::int64_t k = omp_get_num_threads(), i = omp_get_thread_num();
            bad = run(first + n * i / k, first + n * (i + 1) / k);
          }
        }
        if (bad < last) {  // worded as the oracle words it
          if (position[bad] < 0)
            fail(kSlots, "positions_ptr",
                 "must hold positions >= 0 (C25), got " + std::to_string(static_cast<std::int64_t>(position[bad])));
          const Split s = split(position[bad], kbs, world, rank, interleave);
          need_element(kSlots, "block_table_ptr", block_table, flat_index(request_of(qsl, bad), block_table_stride, s.virtual_block),
                       "a local token's block");
        }
        NoGil nogil;
        if (max_num_tokens > num_tokens) std::fill(slots + num_tokens, slots + max_num_tokens, static_cast<O>(pad_id));
        for (std::int64_t t = first; t < last; ++t) slots[t] = static_cast<O>(scratch[static_cast<std::size_t>(t - first)]);
      });
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(slot_mapping, "KV slot mapping") { def_kernel<&compute_slot_mapping>(m, "compute_slot_mapping"); }

}  // namespace specdiff
