// OpenMP port of Model Runner V2's block-table kernels (docs/block_table.md, C39).
//
// Mirrors reference/block_table.py: every precondition of contracts/block_table.py is checked
// before anything is written, then the groups' rows run in parallel; no two rows write one
// element. The groups' tables arrive as tensors (a Table), never as addresses. Every count a
// kernel loops over is read once, checked, and used as read.
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

constexpr const char* kGather = "_gather_block_tables_kernel";
constexpr const char* kSlots = "_compute_slot_mappings_kernel";

std::string group(const char* name, std::size_t g) { return std::string(name) + "[" + std::to_string(g) + "]"; }

// contracts/block_table.py: groups. One table per group in each of `tables`, group g's width
// strides[g]; returns the widths.
std::vector<std::int64_t> widths_of(const char* k, const char* strides_name, const Buffer& strides,
                                    std::initializer_list<std::pair<const char*, const Table*>> tables) {
  const std::size_t n = tables.begin()->second->size();
  const std::vector<std::int64_t> widths = load_ints(k, strides_name, strides, static_cast<std::int64_t>(n));
  for (const auto& [name, t] : tables) {
    if (t->size() != n)
      fail(k, name, "must hold one table per KV-cache group (" + std::to_string(n) + ", as '" + tables.begin()->first +
                        "'), holds " + std::to_string(t->size()));
    for (std::size_t g = 0; g < n; ++g)
      if ((*t)[g].cols != widths[g])
        fail(k, group(name, g).c_str(), "must have " + std::string(strides_name) + "[" + std::to_string(g) + "] = " +
                                            std::to_string(widths[g]) + " columns, has " + std::to_string((*t)[g].cols));
  }
  return widths;
}

// -- K32 --------------------------------------------------------------------------------------
void gather_block_tables(Buffer batch_idx_to_req_idx, Table src, Table dst, Buffer block_table_strides, Strided num_blocks,
                         std::int64_t num_blocks_stride, std::int64_t num_reqs, Buffer num_computed_tokens,
                         Buffer sliding_window_reach, Buffer block_sizes, bool mask, std::int64_t block_size,
                         std::int64_t grid_x, std::int64_t grid_y) {
  const char* k = kGather;
  need_power_of_two(k, "BLOCK_SIZE", block_size);
  const std::vector<std::int64_t> widths =
      widths_of(k, "block_table_strides", block_table_strides, {{"src_block_table_ptrs", &src}, {"dst_block_table_ptrs", &dst}});
  const std::int64_t ng = static_cast<std::int64_t>(widths.size());
  need_at_least(k, "num_reqs", num_reqs, 0);
  // Each group's sliding-window reach (0: none) and block size, read once.
  std::vector<std::int64_t> reach(static_cast<std::size_t>(ng), 0), sizes(static_cast<std::size_t>(ng), 1);
  if (mask) {
    if (!num_computed_tokens.present()) fail(k, "num_computed_tokens_ptr", "must be a tensor when MASK_SLIDING_WINDOW is set");
    if (!sliding_window_reach.present()) fail(k, "sliding_window_reach_ptr", "must be a tensor when MASK_SLIDING_WINDOW is set");
    if (!block_sizes.present()) fail(k, "block_sizes_ptr", "must be a tensor when MASK_SLIDING_WINDOW is set");
    reach = load_ints(k, "sliding_window_reach_ptr", sliding_window_reach, ng);
    sizes = load_ints(k, "block_sizes_ptr", block_sizes, ng);
    for (std::int64_t g = 0; g < ng; ++g)
      if (sizes[g] < 1) fail(k, "block_sizes_ptr", words("entry ", g, " = ", sizes[g], " must be >= 1"));
  }
  // The grid: (groups, rows), each row one of every forward-pass table's.
  if (grid_x != ng) fail(k, "grid", words("must be (num_kv_cache_groups=", ng, ", rows >= 0), got (", grid_x, ", ", grid_y, ")"));
  for (std::int64_t g = 0; g < ng; ++g)
    if (dst[g].rows < grid_y)
      fail(k, group("dst_block_table_ptrs", g).c_str(), words("must have the grid's ", grid_y, " rows, has ", dst[g].rows));
  const std::int64_t n = std::min(num_reqs, grid_y);
  const std::vector<std::int64_t> idx = load_ints(k, "batch_idx_to_req_idx", batch_idx_to_req_idx, n);
  const Ints counts(num_blocks), first(num_computed_tokens);
  // Per group and batch row: the blocks it holds, and how many leading ones are out of the window.
  std::vector<std::int64_t> held(static_cast<std::size_t>(ng * n)), dead(static_cast<std::size_t>(ng * n), 0);
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t s = idx[b];
    for (std::int64_t g = 0; g < ng; ++g) {
      if (s < 0 || s >= src[g].rows)
        fail(k, "batch_idx_to_req_idx", words("entry ", b, " = ", s, " must be a row of 'src_block_table_ptrs[", g, "]' of ",
                                              src[g].rows, " rows"));
      const i128 at = static_cast<i128>(g) * num_blocks_stride + s;
      need_cells(k, "num_blocks_ptr", num_blocks, at, 1, "group ", g, "'s block count of request state ", s);
      const std::int64_t h = counts[static_cast<std::int64_t>(at)];
      if (h < 0 || h > widths[g])
        fail(k, "num_blocks_ptr", words("group ", g, "'s count for request state ", s, " = ", h, " must be in [0, ", widths[g],
                                        "] (the table's width)"));
      held[g * n + b] = h;
      if (mask && reach[g] > 0) {
        if (s >= num_computed_tokens.numel)
          fail(k, "batch_idx_to_req_idx", words("entry ", b, " = ", s, " must index 'num_computed_tokens_ptr' of ",
                                                num_computed_tokens.numel, " elements"));
        const i128 below = static_cast<i128>(first[s]) - reach[g];
        need_int32(k, "num_computed_tokens_ptr", below, "request state ", s, "'s first position - group ", g, "'s reach");
        dead[g * n + b] = std::min(below > 0 ? static_cast<std::int64_t>(below) / sizes[g] : 0, h);
      }
    }
  }
  const std::int64_t padded = std::max<std::int64_t>(grid_y - n, 0);
  std::int64_t work = 0;
  for (std::int64_t h : held) work += h;
  for (std::int64_t g = 0; g < ng; ++g) work += padded * widths[g];
  rows(ng * grid_y, work, [&](std::int64_t r) {  // n <= grid_y: the grid's rows are the batch's, then padding
    const std::int64_t g = r / grid_y, b = r % grid_y;
    const std::int64_t w = widths[g];
    std::int32_t* out = dst[g].as<std::int32_t>() + b * w;
    if (b >= n) {  // a row padded for CUDA graphs: the null block throughout
      std::fill(out, out + w, 0);
      return;
    }
    const std::int64_t h = held[g * n + b], d = dead[g * n + b];
    const std::int32_t* in = src[g].as<std::int32_t>() + idx[b] * w;
    std::fill(out, out + d, 0);  // below the sliding window: the null block
    if (h > d) std::memcpy(out + d, in + d, static_cast<std::size_t>(h - d) * sizeof(std::int32_t));  // never on a null row
  });
}

// -- K33 --------------------------------------------------------------------------------------
struct SlotGroup {
  const std::int32_t* table;
  std::int64_t rows, width, size;
  bool enabled, sharded;
  int shift;  // log2(size) for a power of two, else -1
  // The block and the offset in it of a non-negative local position.
  std::int64_t block(std::int64_t local) const { return shift >= 0 ? local >> shift : local / size; }
  std::int64_t offset(std::int64_t local) const { return shift >= 0 ? local & (size - 1) : local % size; }
};

// Context parallelism's deal of a group's positions to the ranks (contracts/block_table.py: local_positions).
struct Slotter {
  std::int64_t cp, interleave, rank;
  // The position in the rank's share of the group, and whether this rank holds the token.
  bool local(const SlotGroup& G, std::int64_t p, std::int64_t& out) const {
    if (cp == 1 || !G.sharded) {
      out = p;
      return true;
    }
    const std::int64_t virtual_size = G.size * cp, offset = p % virtual_size;
    out = p / virtual_size * G.size + offset / (interleave * cp) * interleave + offset % interleave;
    return offset / interleave % cp == rank;
  }
};

void compute_slot_mappings(std::int64_t max_num_tokens, Buffer idx_mapping, Buffer query_start_loc, Buffer pos, Table tables,
                           Buffer block_table_strides, Buffer block_sizes, Buffer slot_mapping_enabled, Buffer dcp_sharded,
                           Strided slot_mappings, std::int64_t slot_mappings_stride, std::int64_t cp_rank, std::int64_t cp_size,
                           std::int64_t cp_interleave, std::int64_t pad_id, std::int64_t triton_block_size) {
  const char* k = kSlots;
  need_power_of_two(k, "TRITON_BLOCK_SIZE", triton_block_size);
  need_at_least(k, "CP_SIZE", cp_size, 1);
  need_at_least(k, "CP_INTERLEAVE", cp_interleave, 1);
  const std::vector<std::int64_t> widths = widths_of(k, "block_table_strides", block_table_strides, {{"block_table_ptrs", &tables}});
  const std::int64_t ng = static_cast<std::int64_t>(widths.size());
  const std::vector<std::int64_t> sizes = load_ints(k, "block_sizes", block_sizes, ng);
  need_len(k, "slot_mapping_enabled", slot_mapping_enabled, ng);
  if (cp_size != 1) need_len(k, "dcp_sharded", dcp_sharded, ng);
  std::vector<SlotGroup> groups(static_cast<std::size_t>(ng));
  for (std::int64_t g = 0; g < ng; ++g) {
    if (sizes[g] < 1) fail(k, "block_sizes", words("entry ", g, " = ", sizes[g], " must be >= 1"));
    need_int32(k, "block_sizes", static_cast<i128>(sizes[g]) * cp_size, "group ", g, "'s virtual block (block_size * CP_SIZE)");
    const bool pow2 = (sizes[g] & (sizes[g] - 1)) == 0;
    groups[g] = {tables[g].as<std::int32_t>(), tables[g].rows, widths[g], sizes[g], slot_mapping_enabled.as<std::uint8_t>()[g] != 0,
                 cp_size != 1 && dcp_sharded.as<std::uint8_t>()[g] != 0, pow2 ? __builtin_ctzll(static_cast<unsigned long long>(sizes[g])) : -1};
  }
  const std::int64_t n = idx_mapping.numel;
  const std::vector<std::int64_t> qsl = load_offsets(k, "query_start_loc", query_start_loc, n + 1);
  const std::int64_t tokens = qsl[n];
  need_at_least(k, "max_num_tokens", max_num_tokens, 0);
  if (slot_mappings.data.dtype == kInt32 && (pad_id < INT32_MIN || pad_id > INT32_MAX))
    fail(k, "PAD_ID", "must fit slot_mappings_ptr's int32, got " + std::to_string(pad_id));
  need_len(k, "pos", pos, tokens);
  const std::int64_t width = std::max(tokens, max_num_tokens);
  need_rows(k, "slot_mappings_ptr", slot_mappings, ng, slot_mappings_stride, width);
  if (ng > 1 && slot_mappings_stride < width)
    fail(k, "slot_mappings_stride", words("= ", slot_mappings_stride, " must be >= ", width,
                                          " (the tokens and padding of one group's row), or groups' rows overlap"));
  const std::vector<std::int64_t> idx = load_ints(k, "idx_mapping", idx_mapping, n);
  const Ints positions(pos);
  const Slotter slot{cp_size, cp_interleave, cp_rank};

  // Each group's slots of the batch's tokens, computed and checked row by row in parallel into a
  // scratch buffer before anything is written; a row the contract refuses is computed again
  // serially, for its message. A real token's position is >= 0, its request a row of the table,
  // the column it reads inside the row, its slot inside int32 (vLLM forms block * block_size in
  // int32); a dummy row's positions are never read.
  const std::int64_t first = qsl[0], span = tokens - first;
  std::vector<std::int64_t> computed(static_cast<std::size_t>(ng * span));
  auto row_slots = [&](std::int64_t g, std::int64_t b, bool loud) -> bool {
    const SlotGroup& G = groups[g];
    const std::int64_t s = idx[b];
    // Token t's slot is computed[g * span + t - first]: indices, never a pointer before the buffer.
    const std::int64_t base = g * span - first;
    if (s >= G.rows && qsl[b] < qsl[b + 1]) {
      if (loud) fail(k, "idx_mapping", words("request state ", s, " must be a row of 'block_table_ptrs[", g, "]' of ", G.rows, " rows"));
      return false;
    }
    for (std::int64_t t = qsl[b]; t < qsl[b + 1]; ++t) {
      std::int64_t value = pad_id, local = 0;
      // A dummy row, a group without slots, or (context parallelism) another rank's token: PAD_ID.
      if (s >= 0) {
        const std::int64_t p = positions[t];
        if (p < 0) {
          if (loud) fail(k, "pos", words("entry ", t, " = ", p, " is a request's token's position and must be >= 0"));
          return false;
        }
        if (slot.local(G, p, local)) {
          const std::int64_t column = G.enabled ? G.block(local) : 0;
          if (column >= G.width) {
            if (loud) fail(k, "pos", words("entry ", t, " = ", p, " reads column ", column, " of group ", g, "'s table of width ", G.width));
            return false;
          }
          if (G.enabled) {
            const i128 product = static_cast<i128>(G.table[s * G.width + column]) * G.size, id = product + G.offset(local);
            if (product < INT32_MIN || product > INT32_MAX || id > INT32_MAX) {
              if (loud) {
                need_int32(k, "block_table_ptrs", product, "group ", g, "'s block * block_size");
                need_int32(k, "block_table_ptrs", id, "group ", g, "'s slot");
              }
              return false;
            }
            value = static_cast<std::int64_t>(id);
          }
        }
      }
      computed[static_cast<std::size_t>(base + t)] = value;
    }
    return true;
  };
  std::vector<unsigned char> ok(static_cast<std::size_t>(ng * n), 1);
  rows(ng * n, ng * span, [&](std::int64_t r) { ok[r] = row_slots(r / n, r % n, false); });
  for (std::int64_t r = 0; r < ng * n; ++r)
    if (!ok[r] && row_slots(r / n, r % n, true)) fail(k, "block_table_ptrs", "changed while the launch read it");

  const Ints out(slot_mappings);
  rows(ng, ng * width, [&](std::int64_t g) {
    const std::int64_t row = g * slot_mappings_stride;
    for (std::int64_t t = first; t < tokens; ++t) out.set(row + t, computed[static_cast<std::size_t>(g * span + t - first)]);
    // Past the batch, up to max_num_tokens: padding for CUDA graphs.
    for (std::int64_t t = tokens; t < max_num_tokens; ++t) out.set(row + t, pad_id);
  });
}

}  // namespace

SPECDIFF_FAMILY(block_table, "Model Runner V2's block tables and slot mappings") {
  def_kernel<&gather_block_tables>(m, "_gather_block_tables");
  def_kernel<&compute_slot_mappings>(m, "_compute_slot_mappings");
}

}  // namespace specdiff
