// OpenMP port of Model Runner V2's rejection-sampler kernels (contracts/mrv2.py).
//
// Mirrors reference/mrv2.py: every index, count and copied value is checked before anything is
// written (spec §1.12), then the rows are filled in parallel. Offsets are int64 (C4).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "gumbel.h"
#include "launch.h"
#include "metadata.h"
#include "vmath.h"

namespace specdiff {
namespace {

constexpr const char* kGather = "_gather_draft_sampled_kernel";
constexpr const char* kFlatten = "_flatten_sampled_kernel";
constexpr const char* kStats = "_compute_local_logits_stats_kernel";
constexpr const char* kInsert = "_insert_resampled_kernel";
constexpr const char* kCumulative = "_compute_cumulative_log_p_kernel";
constexpr const char* kResidual = "_compute_local_residual_mass_kernel";
constexpr const char* kRejection = "_rejection_kernel";
constexpr const char* kResample = "_resample_kernel";
constexpr std::int64_t kMaxBlock = 1 << 16;  // C29: a tile's exact sum fits int64
constexpr double kSumScale = 0x1p46;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// `cu_num_logits`: all of it, R + 1 non-decreasing exclusive row offsets.
std::vector<std::int64_t> request_offsets(const char* k, const Buffer& cu_num_logits) {
  if (cu_num_logits.numel < 1) fail(k, "cu_num_logits_ptr", "must hold at least one element (num_reqs + 1)");
  return load_offsets(k, "cu_num_logits_ptr", cu_num_logits, cu_num_logits.numel);
}

// `cu_num_logits` of a vocabulary-wide kernel: every request owns at least its bonus row.
std::vector<std::int64_t> bonus_offsets(const char* k, const Buffer& cu_num_logits) {
  std::vector<std::int64_t> cu = request_offsets(k, cu_num_logits);
  for (std::size_t r = 0; r + 1 < cu.size(); ++r)
    if (cu[r + 1] <= cu[r]) fail(k, "cu_num_logits_ptr", "must give every request at least its bonus row");
  return cu;
}

// `nb` tiles of statistics, padded to a power of two for the Triton kernels' tile loops.
void need_padded_blocks(const char* k, std::int64_t nb, std::int64_t padded) {
  need_at_least(k, "vocab_num_blocks", nb, 1);
  need_power_of_two(k, "PADDED_VOCAB_NUM_BLOCKS", padded);
  if (padded < nb) fail(k, "PADDED_VOCAB_NUM_BLOCKS", "must be at least vocab_num_blocks=" + std::to_string(nb));
}

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
      NoGil nogil;
#pragma omp parallel for if (parallel_if(num_logits >= kParallelSmallRows)) schedule(static)
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
  const std::vector<std::int64_t> cu = request_offsets(kFlatten, cu_num_logits);
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
      NoGil nogil;
#pragma omp parallel for if (parallel_if(reqs >= kParallelSmallRows)) schedule(static)
      for (std::int64_t r = 0; r < reqs; ++r)
        for (std::int64_t i = 0; i < count[r]; ++i) dst[cu[r] + i] = static_cast<F>(src[r * sampled_stride + i]);
    });
  });
}

// -- the vocabulary-wide kernels: shared checks ----------------------------------------------------
// Rows other than a request's bonus row (the last row, or one followed by a row at step 0).
std::vector<std::int64_t> non_bonus_rows(const std::vector<std::int64_t>& local, std::int64_t n) {
  std::vector<std::int64_t> rows;
  for (std::int64_t i = 0; i + 1 < n; ++i)
    if (local[i + 1] != 0) rows.push_back(i);
  return rows;
}

// Each listed row's `width` cells at `stride` lie inside the buffer (no product wraps).
void need_cells(const char* k, const char* name, const Buffer& b, const std::vector<std::int64_t>& rows,
                std::int64_t stride, std::int64_t width, bool written = false) {
  if (rows.empty() || width == 0) return;
  // An output's rows are disjoint (C31 within one buffer): rows that overlap race in Triton.
  if (written && rows.size() > 1 && stride < width)
    fail(k, name, "must have rows " + std::to_string(width) + " cells apart or more (rows written may not overlap), row stride " +
                      std::to_string(stride));
  const std::int64_t last = *std::max_element(rows.begin(), rows.end());
  const std::int64_t at = flat_index(last, stride, width);
  if (stride < 0 || at < 0 || at > b.numel)
    fail(k, name, "must hold " + std::to_string(width) + " cells of row " + std::to_string(last) + " at row stride " +
                      std::to_string(stride) + " (" + std::to_string(b.numel) + " elements)");
}

// `width` logits from each flat start exist and (unless `spans_only`) are finite or -inf (C30);
// checked before any write. The vocabulary-wide kernels check the spans first and the values in
// their one pass over the logits (load_logits).
template <class T>
void need_logits(const char* k, const char* name, const Buffer& b, const std::vector<std::int64_t>& starts,
                 std::int64_t width, bool spans_only = false) {
  if (starts.empty() || width == 0) return;
  const T* p = b.as<T>();
  for (const std::int64_t at : starts) {
    if (at < 0 || at > b.numel - width)
      fail(k, name, "must hold " + std::to_string(width) + " elements from flat index " + std::to_string(at) + " (" +
                        std::to_string(b.numel) + " elements)");
    if (spans_only) continue;
    for (std::int64_t j = 0; j < width; ++j) {
      const float x = to_float(p[at + j]);
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        fail(k, name, "must hold finite values or -inf in the cells read (C30); flat index " + std::to_string(at + j) +
                          " holds " + std::to_string(x));
    }
  }
}

// The float32 temperatures at `slots` (read from `slots_name`): every slot inside temp_ptr first,
// then each temperature 0 or finite and > 0.
std::vector<float> temperatures(const char* k, const Buffer& temp, const std::vector<std::int64_t>& slots,
                                const char* slots_name = "expanded_idx_mapping_ptr") {
  for (const std::int64_t s : slots)
    if (s < 0 || s >= temp.numel)
      fail(k, slots_name, "must hold state slots in [0, " + std::to_string(temp.numel) + ") (temp_ptr's length)");
  if (temp.dtype != kFloat32) throw TypeError(std::string(k) + ": 'temp_ptr' must be float32");
  std::vector<float> t(slots.size());
  for (std::size_t j = 0; j < slots.size(); ++j) {
    t[j] = temp.as<float>()[slots[j]];
    if (!(t[j] == 0.0f || (t[j] > 0.0f && std::isfinite(t[j]))))
      fail(k, "temp_ptr", "must hold temperatures that are 0 (greedy) or finite and > 0 at the rows' slots");
  }
  return t;
}

// Flat index of column `column` of draft step `step` of `slot`, or -1 (never an element) when it
// overflows int64.
inline std::int64_t draft_offset(std::int64_t slot, std::int64_t stride_0, std::int64_t step, std::int64_t stride_1,
                                std::int64_t column) {
  const std::int64_t a = flat_index(slot, stride_0, 0), b = flat_index(step, stride_1, column);
  return a < 0 || b < 0 || a > std::numeric_limits<std::int64_t>::max() - b ? -1 : a + b;
}

// C29: the maximum of a tile and the exact sum of exp32(x - max) (0 when nothing is above -inf).
struct TileStats {
  float max;
  float sumexp;
};

inline std::int64_t fixed_term(float term) { return static_cast<std::int64_t>(static_cast<double>(term) * kSumScale); }
// A C29 sum: int64 units of 2^-46, rounded to float32 through float64.
inline float from_units(std::int64_t units) { return static_cast<float>(static_cast<double>(units) * (1.0 / kSumScale)); }

// The next tile's logits, fetched into L2 while this one computes: a tile is read from memory by
// load_logits and then computed from scratch, and without this the memory system idles during the
// computing half. One cache line per vector step; a prefetch past a buffer's end never faults.
struct Upcoming {
  const char* at = nullptr;
  std::int64_t bytes = 0;
  void fetch(std::int64_t line) const {
    if (line * 64 < bytes) __builtin_prefetch(at + line * 64, 0, 2);
  }
};

template <class T>
Upcoming upcoming(const T* logits, std::int64_t n) {
  return {reinterpret_cast<const char*>(logits), n * static_cast<std::int64_t>(sizeof(T))};
}

// The tile after cell c of a kernel whose cells run row by row over `nb` tiles of `block` columns:
// its row's index, first column and width (0 after the last cell: nothing to fetch).
struct NextTile {
  std::size_t row;
  std::int64_t lo, n;
};
inline NextTile next_tile(std::int64_t c, std::int64_t cells, std::int64_t nb, std::int64_t block, std::int64_t vocab) {
  const std::int64_t c1 = std::min(c + 1, cells - 1), lo = (c1 % nb) * block;
  return {static_cast<std::size_t>(c1 / nb), lo, c + 1 < cells ? std::min(block, vocab - lo) : 0};
}

// kLanes lanes at a time (vmath.h: the same bits as the scalar spec, lane for lane).
SPECDIFF_CLONES TileStats max_and_sumexp(const float* x, std::int64_t n, Upcoming next) {
  using namespace vmath;
  const std::int64_t nv = n & ~std::int64_t{kLanes - 1};
  Fv top = Fv{} + kNegInf;
  for (std::int64_t j = 0; j < nv; j += kLanes) {
    const Fv v = loadu(x + j);
    top = top < v ? v : top;  // std::max, lane by lane
  }
  float m = kNegInf;
  for (int l = 0; l < kLanes && nv > 0; ++l) m = std::max(m, top[l]);
  for (std::int64_t j = nv; j < n; ++j) m = std::max(m, x[j]);
  if (!(m > kNegInf)) return {m, 0.0f};
  Lv sum{};
  for (std::int64_t j = 0; j < nv; j += kLanes) {
    next.fetch(j / kLanes);
    sum += exp_units(loadu(x + j) - m);
  }
  std::int64_t fixed = 0;
  for (int l = 0; l < kLanes; ++l) fixed += sum[l];
  for (std::int64_t j = nv; j < n; ++j) fixed += fixed_term(gumbel::exp32(x[j] - m));
  return {m, from_units(fixed)};
}

// Copies n logits as float32 into `dst`, divided by `temperature` (1 for the target: exact), -0.0
// read as +0.0 before and after (C30), and returns what the value checks would refuse: kNotFinite (NaN or +inf read)
// and kInfScaled (+inf after the division). Kernels compute from `dst` into scratch and run the
// checks that name the argument only when a tile reports something, before writing any output:
// one pass over the logits instead of three.
constexpr int kNotFinite = 1, kInfScaled = 2;

// A power-of-two temperature (1.0, the target's, among them) divides by multiplying with its exact
// reciprocal: x * 2^-e and x / 2^e are the same real number, so rounding it once gives the same bits
// for every x (subnormal, zero, infinite); the port never fuses the product into a later addition
// (-ffp-contract=off). A vector division costs several multiplies' throughput.
inline bool exact_reciprocal(float t) {
  const std::uint32_t b = gumbel::to_bits(t);
  return (b & 0x7FFFFFu) == 0 && (b >> 23) - 1u < 0xFEu;  // a positive normal power of two
}

// One pass, with the quotient as `scale` computes it (inlined into each clone's loop).
template <typename T, typename Scale>
[[gnu::always_inline]] inline int load_scaled(const T* src, std::int64_t n, float* dst, Scale scale) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  int bad = 0, scaled_inf = 0;
  for (std::int64_t q = 0; q < n; ++q) {
    const float v = to_float(src[q]);
    bad |= !(v < inf);
    dst[q] = scale(v + 0.0f) + 0.0f;  // -0.0 after the division too (C30)
    scaled_inf |= dst[q] == inf;
  }
  return bad * kNotFinite | scaled_inf * kInfScaled;
}

#define SPECDIFF_LOAD_LOGITS(T)                                                                           \
  SPECDIFF_CLONES int load_logits(const T* src, std::int64_t n, float temperature, float* dst) {          \
    if (exact_reciprocal(temperature)) {                                                                  \
      const float inverse = 1.0f / temperature;                                                           \
      return load_scaled(src, n, dst, [inverse](float v) { return v * inverse; });                        \
    }                                                                                                     \
    return load_scaled(src, n, dst, [temperature](float v) { return v / temperature; });                  \
  }
SPECDIFF_LOAD_LOGITS(float)
SPECDIFF_LOAD_LOGITS(BFloat16)
SPECDIFF_LOAD_LOGITS(Float16)
#undef SPECDIFF_LOAD_LOGITS

// After a fused pass whose tiles reported `bad` (load_logits's bits): the checks again, in the
// kernels' order, so that the error names the argument and the cell (the target's logits, then the
// draft's); what they pass can only be +inf after the temperature.
void refuse_logits(const char* k, int bad, const Buffer& target, const std::vector<std::int64_t>& target_starts,
                   const Buffer& draft, const std::vector<std::int64_t>& draft_starts, std::int64_t vocab) {
  if (bad == 0) return;
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_starts, vocab);
  });
  if (!draft_starts.empty())
    with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
      need_logits<decltype(d_)>(k, "draft_logits_ptr", draft, draft_starts, vocab);
    });
  fail(k, "draft_logits_ptr", "divided by the temperature must stay below +inf (C30)");
}

// -- K13 ---------------------------------------------------------------------------------------------
// The tiles of a vocabulary-wide kernel: a power of two up to kMaxBlock columns (C29: exact tile
// sums), and column indices that fit int32 in every tile (the Triton kernels index them so).
void need_tiles(const char* k, std::int64_t vocab, std::int64_t block) {
  need_power_of_two(k, "BLOCK_SIZE", block);
  if (block > kMaxBlock) fail(k, "BLOCK_SIZE", "must be at most 65536 (C29: exact tile sums)");
  if (vocab > (std::int64_t{1} << 31) - block)
    fail(k, "vocab_size", "must be at most 2^31 - BLOCK_SIZE = " + std::to_string((std::int64_t{1} << 31) - block) +
                              " (columns are indexed in int32)");
}

void logits_stats(Buffer t_argmax, std::int64_t t_argmax_stride, Buffer t_max, std::int64_t t_max_stride, Buffer t_sumexp,
                  std::int64_t t_sumexp_stride, Buffer d_max, std::int64_t d_max_stride, Buffer d_sumexp,
                  std::int64_t d_sumexp_stride, Buffer target, std::int64_t target_stride, Buffer draft,
                  std::int64_t draft_stride_0, std::int64_t draft_stride_1, Buffer expanded_idx_mapping,
                  Buffer expanded_local_pos, Buffer temp, std::int64_t vocab, std::int64_t num_logits, std::int64_t block,
                  bool has_draft) {
  const char* k = kStats;
  need_at_least(k, "num_logits", num_logits, 0);
  need_at_least(k, "vocab_size", vocab, 0);
  need_tiles(k, vocab, block);
  if (has_draft != draft.present()) fail(k, "HAS_DRAFT_LOGITS", "must be True exactly when draft_logits_ptr is a tensor");
  const std::vector<std::int64_t> slot_of = load_ints(k, "expanded_idx_mapping_ptr", expanded_idx_mapping, num_logits);
  const std::vector<std::int64_t> local = load_ints(k, "expanded_local_pos_ptr", expanded_local_pos, num_logits);
  const std::vector<std::int64_t> rows = non_bonus_rows(local, num_logits);
  if (rows.empty() || vocab == 0) return;
  const std::int64_t nb = ceil_div(vocab, block);
  std::vector<std::int64_t> slots, target_starts, draft_starts;
  for (const std::int64_t i : rows) slots.push_back(slot_of[i]);
  const std::vector<float> t = temperatures(k, temp, slots);
  struct Out {
    const char* name;
    const Buffer* b;
    std::int64_t stride;
  };
  std::vector<Out> outs = {{"target_local_argmax_ptr", &t_argmax, t_argmax_stride},
                           {"target_local_max_ptr", &t_max, t_max_stride},
                           {"target_local_sumexp_ptr", &t_sumexp, t_sumexp_stride}};
  if (has_draft) {
    outs.push_back({"draft_local_max_ptr", &d_max, d_max_stride});
    outs.push_back({"draft_local_sumexp_ptr", &d_sumexp, d_sumexp_stride});
  }
  for (const Out& o : outs) {
    const std::string stride_name = std::string(o.name, std::strlen(o.name) - 4) + "_stride";
    need_at_least(k, stride_name.c_str(), o.stride, 0);
    need_cells(k, o.name, *o.b, rows, o.stride, nb, true);
    if (o.b != &t_argmax && o.b->dtype != kFloat32) throw TypeError(std::string(k) + ": '" + o.name + "' must be float32");
  }
  need_at_least(k, "target_logits_stride", target_stride, 0);
  for (const std::int64_t i : rows) target_starts.push_back(flat_index(i, target_stride, 0));
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_starts, vocab, true);
  });
  std::vector<std::size_t> draft_index(rows.size());  // row j's entry in draft_starts (random rows only)
  if (has_draft) {
    need_at_least(k, "draft_logits_stride_0", draft_stride_0, 0);
    need_at_least(k, "draft_logits_stride_1", draft_stride_1, 0);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      if (local[rows[j]] < 0) fail(k, "expanded_local_pos_ptr", "must hold local positions >= 0");
      if (t[j] > 0.0f) {
        draft_index[j] = draft_starts.size();
        draft_starts.push_back(draft_offset(slots[j], draft_stride_0, local[rows[j]], draft_stride_1, 0));
      }
    }
    with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
      need_logits<decltype(d_)>(k, "draft_logits_ptr", draft, draft_starts, vocab, true);
    });
  }
  // Every cell's statistics go to scratch first: the value checks run in the same pass (load_logits).
  const std::int64_t cells = static_cast<std::int64_t>(rows.size()) * nb;
  std::vector<std::int64_t> argmax(cells);
  std::vector<float> tmax(cells), tsum(cells), dmax(has_draft ? cells : 0), dsum(has_draft ? cells : 0);
  int bad = 0;
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    using T = decltype(t_);
    with_logits(k, "draft_logits_ptr", has_draft ? draft.dtype : kFloat32, [&](auto d_) {
      using D = decltype(d_);
      NoGil nogil;
#pragma omp parallel if (parallel_if(cells * block >= (1 << 16))) reduction(| : bad)
      {
        std::vector<float> x(block);
#pragma omp for schedule(static)
        for (std::int64_t c = 0; c < cells; ++c) {
          const std::size_t j = static_cast<std::size_t>(c / nb);
          const std::int64_t b = c % nb, lo = b * block, n = std::min(block, vocab - lo);
          bad |= load_logits(target.as<T>() + target_starts[j] + lo, n, 1.0f, x.data());
          if (t[j] == 0.0f) {
            std::int64_t best = 0;  // the first index of the maximum (-inf tiles: 0)
            for (std::int64_t q = 1; q < n; ++q)
              if (x[q] > x[best]) best = q;
            argmax[c] = lo + best;
            tmax[c] = n > 0 ? x[best] : kNegInf;
            continue;
          }
          // The next read: this cell's draft tile, else the next cell's target tile.
          const D* draft_tile = has_draft ? draft.as<D>() + draft_starts[draft_index[j]] + lo : nullptr;
          const NextTile next = next_tile(c, cells, nb, block, vocab);
          const Upcoming next_target = upcoming(target.as<T>() + target_starts[next.row] + next.lo, next.n);
          const TileStats ts = max_and_sumexp(x.data(), n, has_draft ? upcoming(draft_tile, n) : next_target);
          tmax[c] = ts.max;
          tsum[c] = ts.sumexp;
          if (has_draft) {
            bad |= load_logits(draft_tile, n, t[j], x.data());
            const TileStats ds = max_and_sumexp(x.data(), n, next_target);
            dmax[c] = ds.max;
            dsum[c] = ds.sumexp;
          }
        }
      }
    });
  });
  refuse_logits(k, bad, target, target_starts, draft, draft_starts, vocab);
  with_int(k, "target_local_argmax_ptr", t_argmax.dtype, [&](auto a_) {
    using A = decltype(a_);
    for (std::int64_t c = 0; c < cells; ++c) {
      const std::int64_t i = rows[static_cast<std::size_t>(c / nb)], b = c % nb;
      t_max.as<float>()[i * t_max_stride + b] = tmax[c];
      if (t[static_cast<std::size_t>(c / nb)] == 0.0f) {
        t_argmax.as<A>()[i * t_argmax_stride + b] = static_cast<A>(argmax[c]);
        continue;
      }
      t_sumexp.as<float>()[i * t_sumexp_stride + b] = tsum[c];
      if (has_draft) {
        d_max.as<float>()[i * d_max_stride + b] = dmax[c];
        d_sumexp.as<float>()[i * d_sumexp_stride + b] = dsum[c];
      }
    }
  });
}

// -- log-probabilities from tile statistics (K14–K17) ------------------------------------------------
struct Stats {
  const float* max;
  std::int64_t max_stride;
  const float* sumexp;
  std::int64_t sumexp_stride;
};

// C29: G + log(T), T the tree_sum of sumexp_b * exp32(max_b - G) (exact products).
inline float logsumexp(const Stats& s, std::int64_t row, std::int64_t nb) {
  const float* m = s.max + row * s.max_stride;
  const float* se = s.sumexp + row * s.sumexp_stride;
  float g = kNegInf;
  for (std::int64_t b = 0; b < nb; ++b) g = std::max(g, m[b]);
  const double total = gumbel::tree_sum(
      [&](std::int64_t b) { return static_cast<double>(se[b]) * static_cast<double>(gumbel::exp32(m[b] - g)); }, nb);
  return static_cast<float>(static_cast<double>(g) + std::log(total));
}

// Rows' statistics exist, hold no NaN, finite sums >= 0, and a tile above -inf each (C30).
void need_stats(const char* k, const std::string& side, const Buffer& mx, std::int64_t mx_stride, const Buffer& se,
                std::int64_t se_stride, const std::vector<std::int64_t>& rows, std::int64_t nb) {
  if (rows.empty()) return;
  const std::string max_name = side + "_local_max_ptr", sumexp_name = side + "_local_sumexp_ptr";
  const char* side_max = max_name.c_str();
  const char* side_sumexp = sumexp_name.c_str();
  need_at_least(k, (side + "_local_max_stride").c_str(), mx_stride, 0);
  need_cells(k, side_max, mx, rows, mx_stride, nb);
  need_at_least(k, (side + "_local_sumexp_stride").c_str(), se_stride, 0);
  need_cells(k, side_sumexp, se, rows, se_stride, nb);
  if (mx.dtype != kFloat32) throw TypeError(std::string(k) + ": '" + side_max + "' must be float32");
  if (se.dtype != kFloat32) throw TypeError(std::string(k) + ": '" + side_sumexp + "' must be float32");
  for (const std::int64_t i : rows) {
    bool live = false;
    for (std::int64_t b = 0; b < nb; ++b) {
      const float m = mx.as<float>()[i * mx_stride + b], e = se.as<float>()[i * se_stride + b];
      if (std::isnan(m) || m == std::numeric_limits<float>::infinity())
        fail(k, side_max, "must hold finite maxima or -inf in the rows read (C30)");
      if (!(e >= 0.0f && std::isfinite(e))) fail(k, side_sumexp, "must hold finite sums >= 0 in the rows read (C30)");
      live = live || m > kNegInf;
    }
    if (!live) fail(k, side_max, "must have a tile above -inf in every row read (a log-sum-exp of nothing is not a number)");
  }
}

// -- K14 ---------------------------------------------------------------------------------------------
void cumulative_log_p(Buffer out, Buffer target, std::int64_t target_stride, Buffer t_max, std::int64_t t_max_stride,
                      Buffer t_sumexp, std::int64_t t_sumexp_stride, Buffer draft_sampled, Buffer draft,
                      std::int64_t draft_stride_0, std::int64_t draft_stride_1, Buffer d_max, std::int64_t d_max_stride,
                      Buffer d_sumexp, std::int64_t d_sumexp_stride, Buffer cu_num_logits, Buffer idx_mapping, Buffer temp,
                      std::int64_t nb, std::int64_t padded, bool has_draft) {
  const char* k = kCumulative;
  const std::vector<std::int64_t> cu = bonus_offsets(k, cu_num_logits);
  const std::int64_t reqs = static_cast<std::int64_t>(cu.size()) - 1;
  const std::vector<std::int64_t> slots = load_ints(k, "idx_mapping_ptr", idx_mapping, reqs);
  need_padded_blocks(k, nb, padded);
  if (has_draft != draft.present()) fail(k, "HAS_DRAFT_LOGITS", "must be True exactly when draft_logits_ptr is a tensor");
  if (reqs == 0) return;
  const std::vector<float> t = temperatures(k, temp, slots, "idx_mapping_ptr");
  need_len(k, "draft_sampled_ptr", draft_sampled, cu.back());
  need_len(k, "cumulative_log_p_ptr", out, cu.back());
  if (out.dtype != kFloat32) throw TypeError(std::string(k) + ": 'cumulative_log_p_ptr' must be float32");
  const std::vector<std::int64_t> tokens = load_ints(k, "draft_sampled_ptr", draft_sampled, cu.back());
  // The steps with a draft: (request, row, token).
  std::vector<std::int64_t> rows, target_at, draft_at;
  for (std::int64_t r = 0; r < reqs; ++r) {
    if (t[r] == 0.0f) continue;
    for (std::int64_t i = cu[r]; i < cu[r + 1] - 1; ++i) {
      const std::int64_t d = tokens[i + 1];
      if (d < 0) continue;
      rows.push_back(i);
      const std::int64_t at = flat_index(i, target_stride, d);
      target_at.push_back(at);
      if (has_draft) {
        draft_at.push_back(draft_offset(slots[r], draft_stride_0, i - cu[r], draft_stride_1, d));
      }
    }
  }
  if (!rows.empty()) {
    need_stats(k, "target", t_max, t_max_stride, t_sumexp, t_sumexp_stride, rows, nb);
    need_at_least(k, "target_logits_stride", target_stride, 0);
    with_logits(k, "target_logits_ptr", target.dtype,
                [&](auto t_) { need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_at, 1); });
    if (has_draft) {
      need_stats(k, "draft", d_max, d_max_stride, d_sumexp, d_sumexp_stride, rows, nb);
      need_at_least(k, "draft_logits_stride_0", draft_stride_0, 0);
      need_at_least(k, "draft_logits_stride_1", draft_stride_1, 0);
      with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
        using D = decltype(d_);
        need_logits<D>(k, "draft_logits_ptr", draft, draft_at, 1);
        std::size_t j = 0;
        for (std::int64_t r = 0; r < reqs; ++r) {
          if (t[r] == 0.0f) continue;
          for (std::int64_t i = cu[r]; i < cu[r + 1] - 1; ++i)
            if (tokens[i + 1] >= 0 && to_float(draft.as<D>()[draft_at[j++]]) / t[r] == std::numeric_limits<float>::infinity())
              fail(k, "draft_logits_ptr", "divided by the temperature must stay below +inf (C30)");
        }
      });
    }
  }
  const Stats ts{t_max.as<float>(), t_max_stride, t_sumexp.as<float>(), t_sumexp_stride};
  const Stats ds{d_max.as<float>(), d_max_stride, d_sumexp.as<float>(), d_sumexp_stride};
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    with_logits(k, "draft_logits_ptr", has_draft ? draft.dtype : kFloat32, [&](auto d_) {
      using T = decltype(t_);
      using D = decltype(d_);
      float* cumulative = out.as<float>();
      NoGil nogil;
#pragma omp parallel for if (parallel_if(reqs >= kParallelGatherRows)) schedule(dynamic, 16)
      for (std::int64_t r = 0; r < reqs; ++r) {
        if (t[r] == 0.0f) continue;
        float log_p = 0.0f;
        for (std::int64_t i = cu[r]; i < cu[r + 1] - 1; ++i) {
          const std::int64_t d = tokens[i + 1];
          if (d >= 0) {
            const float lp = to_float(target.as<T>()[i * target_stride + d]) - logsumexp(ts, i, nb);
            float lq = 0.0f;
            if (has_draft) {
              const D* row = draft.as<D>() + slots[r] * draft_stride_0 + (i - cu[r]) * draft_stride_1;
              lq = to_float(row[d]) / t[r] - logsumexp(ds, i, nb);
            }
            log_p = std::fmin(log_p + (lp - lq), 0.0f);  // a NaN gives 0, as Triton's tl.minimum
          }
          cumulative[i] = log_p;
        }
      }
    });
  });
}

// Each row's logits read (`values(j, c)`, the draft's already divided by its temperature) lie at or
// below the row's C29 log-sum-exp: K13's statistics of these logits guarantee it, and every
// probability formed from them then lies in [0, 1].
template <class V>
void need_log_probs(const char* k, const std::string& side, const Stats& s, const std::vector<std::int64_t>& rows,
                    std::int64_t nb, std::int64_t width, V&& values) {
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const float lse = logsumexp(s, rows[j], nb);
    for (std::int64_t c = 0; c < width; ++c)
      if (values(j, c) > lse)
        fail(k, (side + "_local_max_ptr").c_str(),
             "and '" + side + "_local_sumexp_ptr' must be the statistics of the " + side + " logits read: row " +
                 std::to_string(rows[j]) + "'s log-sum-exp lies below one of its logits");
  }
}

// The tiling of a vocabulary-wide kernel: `nb` tiles of `block` over `vocab`.
void need_vocab_blocks(const char* k, std::int64_t vocab, std::int64_t block, std::int64_t nb, std::int64_t padded) {
  need_at_least(k, "vocab_size", vocab, 1);
  need_tiles(k, vocab, block);
  need_padded_blocks(k, nb, padded);
  const std::int64_t tiles = ceil_div(vocab, block);
  if (nb != tiles) fail(k, "vocab_num_blocks", "must be cdiv(vocab_size, BLOCK_SIZE) = " + std::to_string(tiles));
}

// K15's tile: the C29 sum of max(fma(P, exp32(x - lse_t), -exp32(y - lse_d)), 0). Sets `above`
// when a logit lies above its row's log-sum-exp (statistics not of these logits).
inline std::int64_t residual_term(float x, float y, float lse_t, float lse_d, float p_prev) {
  const float m_b = gumbel::exp32(x - lse_t), m_s = gumbel::exp32(y - lse_d);
  return fixed_term(std::max(std::fmaf(p_prev, m_b, -m_s), 0.0f));
}

SPECDIFF_CLONES std::int64_t residual_mass(const float* x, const float* y, std::int64_t n, float lse_t, float lse_d,
                                           float p_prev, int& above, Upcoming next_x, Upcoming next_y) {
  using namespace vmath;
  const std::int64_t nv = n & ~std::int64_t{kLanes - 1};
  const auto terms = [&](std::int64_t j) __attribute__((always_inline)) {  // inlined: vector ABI
    const Fv m_b = exp32_nonpositive(loadu(x + j) - lse_t), m_s = exp32_nonpositive(loadu(y + j) - lse_d);
    const Fv term = fmav(Fv{} + p_prev, m_b, -m_s);
    return fixed46(term < 0.0f ? Fv{} : term);  // std::max(term, 0)
  };
  Lv sum{};
  Fv top = Fv{} + kNegInf, top_d = Fv{} + kNegInf;
  for (std::int64_t j = 0; j < nv; j += kLanes) {
    top = top < loadu(x + j) ? loadu(x + j) : top;
    top_d = top_d < loadu(y + j) ? loadu(y + j) : top_d;
    next_x.fetch(j / kLanes);
    next_y.fetch(j / kLanes);
    sum += terms(j);
  }
  std::int64_t fixed = 0;
  for (int l = 0; l < kLanes; ++l) {
    fixed += sum[l];
    above |= top[l] > lse_t || top_d[l] > lse_d;
  }
  for (std::int64_t j = nv; j < n; ++j) {
    above |= x[j] > lse_t || y[j] > lse_d;
    fixed += residual_term(x[j], y[j], lse_t, lse_d, p_prev);
  }
  return fixed;
}

// -- K15 ---------------------------------------------------------------------------------------------
void local_residual_mass(Buffer out, std::int64_t out_stride, Buffer cumulative, Buffer target, std::int64_t target_stride,
                         Buffer t_max, std::int64_t t_max_stride, Buffer t_sumexp, std::int64_t t_sumexp_stride,
                         Buffer draft, std::int64_t draft_stride_0, std::int64_t draft_stride_1, Buffer d_max,
                         std::int64_t d_max_stride, Buffer d_sumexp, std::int64_t d_sumexp_stride, Buffer draft_sampled,
                         Buffer expanded_idx_mapping, Buffer expanded_local_pos, Buffer temp, std::int64_t vocab,
                         std::int64_t num_logits, std::int64_t nb, std::int64_t block, std::int64_t padded) {
  const char* k = kResidual;
  need_at_least(k, "num_logits", num_logits, 0);
  need_vocab_blocks(k, vocab, block, nb, padded);
  const std::vector<std::int64_t> slot_of = load_ints(k, "expanded_idx_mapping_ptr", expanded_idx_mapping, num_logits);
  const std::vector<std::int64_t> local = load_ints(k, "expanded_local_pos_ptr", expanded_local_pos, num_logits);
  const std::vector<std::int64_t> tokens = load_ints(k, "draft_sampled_ptr", draft_sampled, num_logits);
  if (num_logits == 0) return;
  for (const std::int64_t l : local)
    if (l < 0) fail(k, "expanded_local_pos_ptr", "must hold local positions >= 0");
  // Block verification looks one step ahead: a request's first and bonus rows need no residual
  // mass, nor a row whose own draft is a placeholder; greedy rows are skipped too.
  std::vector<std::int64_t> candidates, slots;
  for (const std::int64_t i : non_bonus_rows(local, num_logits))
    if (local[i] != 0 && tokens[i + 1] >= 0) {
      candidates.push_back(i);
      slots.push_back(slot_of[i]);
    }
  const std::vector<float> all_t = temperatures(k, temp, slots);
  std::vector<std::int64_t> rows, row_slot, target_at, draft_at;
  std::vector<float> t;
  for (std::size_t j = 0; j < candidates.size(); ++j)
    if (all_t[j] != 0.0f) {
      rows.push_back(candidates[j]);
      row_slot.push_back(slots[j]);
      t.push_back(all_t[j]);
    }
  if (rows.empty()) return;
  // A later step reads the row before it (K14's log-ratio): row 0 has none.
  if (rows.front() == 0)
    fail(k, "expanded_local_pos_ptr", "must be 0 at row 0 when row 0 is read: a later step reads the row before it");
  need_at_least(k, "local_residual_mass_stride", out_stride, 0);
  need_cells(k, "local_residual_mass_ptr", out, rows, out_stride, nb, true);
  if (out.dtype != kFloat32) throw TypeError(std::string(k) + ": 'local_residual_mass_ptr' must be float32");
  need_len(k, "cumulative_log_p_ptr", cumulative, rows.back());
  if (cumulative.dtype != kFloat32) throw TypeError(std::string(k) + ": 'cumulative_log_p_ptr' must be float32");
  for (const std::int64_t i : rows)
    if (!(cumulative.as<float>()[i - 1] <= 0.0f))
      fail(k, "cumulative_log_p_ptr",
           "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the rows before those read");
  need_stats(k, "target", t_max, t_max_stride, t_sumexp, t_sumexp_stride, rows, nb);
  need_stats(k, "draft", d_max, d_max_stride, d_sumexp, d_sumexp_stride, rows, nb);
  need_at_least(k, "target_logits_stride", target_stride, 0);
  for (const std::int64_t i : rows) target_at.push_back(flat_index(i, target_stride, 0));
  need_at_least(k, "draft_logits_stride_0", draft_stride_0, 0);
  need_at_least(k, "draft_logits_stride_1", draft_stride_1, 0);
  for (std::size_t j = 0; j < rows.size(); ++j)
    draft_at.push_back(draft_offset(row_slot[j], draft_stride_0, local[rows[j]], draft_stride_1, 0));
  const Stats ts{t_max.as<float>(), t_max_stride, t_sumexp.as<float>(), t_sumexp_stride};
  const Stats ds{d_max.as<float>(), d_max_stride, d_sumexp.as<float>(), d_sumexp_stride};
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_at, vocab, true);
  });
  with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
    need_logits<decltype(d_)>(k, "draft_logits_ptr", draft, draft_at, vocab, true);
  });
  // Masses go to scratch; the value checks run in the same pass and name the argument afterwards.
  const std::int64_t cells = static_cast<std::int64_t>(rows.size()) * nb;
  std::vector<float> masses(cells), lse_t(rows.size()), lse_d(rows.size());
  for (std::size_t j = 0; j < rows.size(); ++j) {
    lse_t[j] = logsumexp(ts, rows[j], nb);
    lse_d[j] = logsumexp(ds, rows[j], nb);
  }
  int bad = 0, above = 0;
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
    using T = decltype(t_);
    with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
      using D = decltype(d_);
      const float* prefix = cumulative.as<float>();
      NoGil nogil;
#pragma omp parallel if (parallel_if(cells * block >= (1 << 16))) reduction(| : bad, above)
      {
        std::vector<float> x(block), y(block);
#pragma omp for schedule(static)
        for (std::int64_t c = 0; c < cells; ++c) {
          const std::size_t j = static_cast<std::size_t>(c / nb);
          const std::int64_t b = c % nb, i = rows[j], lo = b * block, n = std::min(block, vocab - lo);
          bad |= load_logits(target.as<T>() + target_at[j] + lo, n, 1.0f, x.data());
          bad |= load_logits(draft.as<D>() + draft_at[j] + lo, n, t[j], y.data());
          // p_prev: the joint ratio before this step. Each term is one rounding (C29), in [0, 1].
          const float p_prev = gumbel::exp32(prefix[i - 1]);
          const NextTile next = next_tile(c, cells, nb, block, vocab);
          const std::int64_t fixed = residual_mass(x.data(), y.data(), n, lse_t[j], lse_d[j], p_prev, above,
                                                   upcoming(target.as<T>() + target_at[next.row] + next.lo, next.n),
                                                   upcoming(draft.as<D>() + draft_at[next.row] + next.lo, next.n));
          masses[c] = from_units(fixed);
        }
      }
    });
  });
  refuse_logits(k, bad, target, target_at, draft, draft_at, vocab);
  if (above) {
    with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
      need_log_probs(k, "target", ts, rows, nb, vocab,
                     [&](std::size_t j, std::int64_t c) { return to_float(target.as<decltype(t_)>()[target_at[j] + c]); });
    });
    with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
      need_log_probs(k, "draft", ds, rows, nb, vocab, [&](std::size_t j, std::int64_t c) {
        return to_float(draft.as<decltype(d_)>()[draft_at[j] + c]) / t[j];
      });
    });
  }
  float* mass = out.as<float>();
  for (std::int64_t c = 0; c < cells; ++c) mass[rows[static_cast<std::size_t>(c / nb)] * out_stride + c % nb] = masses[c];
}

// -- K16 ---------------------------------------------------------------------------------------------
// The target argmax of a greedy row from K13's tiles: the first tile holding the highest maximum
// (NaN never wins), then that tile's argmax.
template <class A>
std::int64_t global_argmax(const float* mx, std::int64_t mx_stride, const A* am, std::int64_t am_stride,
                           std::int64_t row, std::int64_t nb) {
  float best = kNegInf;
  std::int64_t block = 0;
  for (std::int64_t b = 0; b < nb; ++b)
    if (mx[row * mx_stride + b] > best) {
      best = mx[row * mx_stride + b];
      block = b;
    }
  return static_cast<std::int64_t>(am[row * am_stride + block]);
}

void rejection(Buffer sampled, std::int64_t sampled_stride, Buffer rejected_steps, Buffer target_lse_out,
               Buffer draft_lse_out, Buffer target, std::int64_t target_stride, Buffer t_argmax,
               std::int64_t t_argmax_stride, Buffer t_max, std::int64_t t_max_stride, Buffer t_sumexp,
               std::int64_t t_sumexp_stride, Buffer draft_sampled, Buffer draft, std::int64_t draft_stride_0,
               std::int64_t draft_stride_1, Buffer d_max, std::int64_t d_max_stride, Buffer d_sumexp,
               std::int64_t d_sumexp_stride, Buffer cu_num_logits, Buffer idx_mapping, Buffer temp, Buffer seed_buf,
               Buffer pos_buf, Buffer rates, Buffer cumulative, Buffer residual, std::int64_t residual_stride,
               Buffer fly_entropy, float threshold, std::int64_t nb, std::int64_t padded, bool has_draft,
               bool synthetic, bool block, std::int64_t fly) {
  const char* k = kRejection;
  need_at_least(k, "FLY_WINDOW_SIZE", fly, 0);
  if (synthetic && block) fail(k, "USE_BLOCK_VERIFICATION", "excludes SYNTHETIC_MODE (rejection_sample asserts it)");
  if (fly > 0 && (synthetic || block))
    fail(k, "FLY_WINDOW_SIZE", "must be 0 with SYNTHETIC_MODE or USE_BLOCK_VERIFICATION (rejection_sample asserts it)");
  if (has_draft != draft.present()) fail(k, "HAS_DRAFT_LOGITS", "must be True exactly when draft_logits_ptr is a tensor");
  if (synthetic != rates.present())
    fail(k, "SYNTHETIC_MODE", "must be True exactly when synthetic_conditional_rates_ptr is a tensor");
  if (block != cumulative.present())
    fail(k, "USE_BLOCK_VERIFICATION", "must be True exactly when cumulative_log_p_ptr is a tensor");
  if ((fly > 0) != fly_entropy.present())
    fail(k, "FLY_WINDOW_SIZE", "must be positive exactly when fly_entropy_ptr is a tensor");
  if (residual.present() != (block && has_draft))
    fail(k, "local_residual_mass_ptr",
         "must be a tensor exactly with USE_BLOCK_VERIFICATION and draft logits (K15's output), else None");
  const std::vector<std::int64_t> cu = bonus_offsets(k, cu_num_logits);
  const std::int64_t reqs = static_cast<std::int64_t>(cu.size()) - 1;
  const std::vector<std::int64_t> slots = load_ints(k, "idx_mapping_ptr", idx_mapping, reqs);
  need_padded_blocks(k, nb, padded);
  need_len(k, "rejected_steps_ptr", rejected_steps, reqs);
  need_len(k, "target_rejected_logsumexp_ptr", target_lse_out, reqs);
  need_len(k, "draft_rejected_logsumexp_ptr", draft_lse_out, reqs);
  if (reqs == 0) return;
  const std::vector<float> t = temperatures(k, temp, slots, "idx_mapping_ptr");
  if (seed_buf.dtype != kInt64) throw TypeError(std::string(k) + ": 'seed_ptr' must be int64");
  for (const char* name : {"target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"})
    if ((name[0] == 't' ? target_lse_out : draft_lse_out).dtype != kFloat32)
      throw TypeError(std::string(k) + ": '" + name + "' must be float32");
  if ((rates.present() && rates.dtype != kFloat32) || (fly_entropy.present() && fly_entropy.dtype != kFloat32))
    throw TypeError(std::string(k) + ": 'synthetic_conditional_rates_ptr' and 'fly_entropy_ptr' must be float32");
  for (const std::int64_t s : slots)
    if (s >= seed_buf.numel)
      fail(k, "idx_mapping_ptr", "must hold state slots in [0, " + std::to_string(seed_buf.numel) + ") (seed_ptr's length)");
  const std::int64_t nl = cu.back();
  const std::vector<std::int64_t> tokens = load_ints(k, "draft_sampled_ptr", draft_sampled, nl);
  const std::vector<std::int64_t> pos = load_ints(k, "pos_ptr", pos_buf, nl);
  const bool wide_pos = pos_buf.dtype == kInt64;
  std::int64_t widest = 0;
  for (std::int64_t r = 0; r < reqs; ++r) widest = std::max(widest, cu[r + 1] - cu[r] - 1);
  if (widest == 0) {
    // No drafts: every request records 0 accepted and log-sum-exps of 0.
    with_int(k, "rejected_steps_ptr", rejected_steps.dtype, [&](auto n_) {
      for (std::int64_t r = 0; r < reqs; ++r) rejected_steps.as<decltype(n_)>()[r] = 0;
    });
    for (std::int64_t r = 0; r < reqs; ++r) target_lse_out.as<float>()[r] = draft_lse_out.as<float>()[r] = 0.0f;
    return;
  }
  need_at_least(k, "sampled_stride", sampled_stride, widest);  // requests write disjoint cells
  std::int64_t last = 0;
  for (std::int64_t r = 0; r < reqs; ++r)
    if (cu[r + 1] - cu[r] > 1) last = std::max(last, flat_index(r, sampled_stride, cu[r + 1] - cu[r] - 2));
  if (last < 0 || last >= sampled.numel)
    fail(k, "sampled_ptr", "must hold flat index " + std::to_string(last) + " (row stride " + std::to_string(sampled_stride) +
                               "): every request's drafts");
  if (synthetic) need_len(k, "synthetic_conditional_rates_ptr", rates, widest);
  if (fly > 0) need_len(k, "fly_entropy_ptr", fly_entropy, nl);
  for (const std::int64_t d : tokens)
    if (d >= 0) need_fits(k, "draft_sampled_ptr", d, "sampled_ptr", sampled);
  std::vector<std::int64_t> greedy_rows, random_rows, ahead, target_at, draft_at;
  std::vector<float> draft_t;
  for (std::int64_t r = 0; r < reqs; ++r)
    for (std::int64_t i = cu[r]; i < cu[r + 1] - 1; ++i) {
      (t[r] == 0.0f ? greedy_rows : random_rows).push_back(i);
      // The next step's masses, read where that step's draft is no placeholder (K15 fills those rows only).
      if (t[r] != 0.0f && i > cu[r] && tokens[i + 1] >= 0) ahead.push_back(i);
    }
  with_int(k, "target_local_argmax_ptr", t_argmax.dtype, [&](auto a_) {
    using A = decltype(a_);
    if (greedy_rows.empty()) return;
    need_at_least(k, "target_local_max_stride", t_max_stride, 0);
    need_cells(k, "target_local_max_ptr", t_max, greedy_rows, t_max_stride, nb);
    need_at_least(k, "target_local_argmax_stride", t_argmax_stride, 0);
    need_cells(k, "target_local_argmax_ptr", t_argmax, greedy_rows, t_argmax_stride, nb);
    if (t_max.dtype != kFloat32) throw TypeError(std::string(k) + ": 'target_local_max_ptr' must be float32");
    for (const std::int64_t i : greedy_rows)
      for (std::int64_t b = 0; b < nb; ++b)
        need_fits(k, "target_local_argmax_ptr", static_cast<std::int64_t>(t_argmax.as<A>()[i * t_argmax_stride + b]),
                  "sampled_ptr", sampled);
  });
  need_stats(k, "target", t_max, t_max_stride, t_sumexp, t_sumexp_stride, random_rows, nb);
  if (has_draft) need_stats(k, "draft", d_max, d_max_stride, d_sumexp, d_sumexp_stride, random_rows, nb);
  // Tokens whose logits are read: every valid draft of a random request, and of a greedy one under FLy.
  for (std::int64_t r = 0; r < reqs; ++r) {
    if (t[r] == 0.0f && fly == 0) continue;
    for (std::int64_t i = cu[r]; i < cu[r + 1] - 1; ++i) {
      const std::int64_t d = tokens[i + 1];
      if (d < 0) continue;
      target_at.push_back(flat_index(i, target_stride, d));
      if (t[r] != 0.0f && !block) {
        draft_at.push_back(draft_offset(slots[r], draft_stride_0, i - cu[r], draft_stride_1, d));
        draft_t.push_back(t[r]);
      }
    }
  }
  if (!target_at.empty()) {
    need_at_least(k, "target_logits_stride", target_stride, 0);
    with_logits(k, "target_logits_ptr", target.dtype,
                [&](auto t_) { need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_at, 1); });
    if (has_draft && !draft_at.empty()) {
      need_at_least(k, "draft_logits_stride_0", draft_stride_0, 0);
      need_at_least(k, "draft_logits_stride_1", draft_stride_1, 0);
      with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
        using D = decltype(d_);
        need_logits<D>(k, "draft_logits_ptr", draft, draft_at, 1);
        for (std::size_t j = 0; j < draft_at.size(); ++j)
          if (to_float(draft.as<D>()[draft_at[j]]) / draft_t[j] == std::numeric_limits<float>::infinity())
            fail(k, "draft_logits_ptr", "divided by the temperature must stay below +inf (C30)");
      });
    }
  }
  if (block && !random_rows.empty()) {
    need_len(k, "cumulative_log_p_ptr", cumulative, nl);
    if (cumulative.dtype != kFloat32) throw TypeError(std::string(k) + ": 'cumulative_log_p_ptr' must be float32");
    for (const std::int64_t i : random_rows)
      if (!(cumulative.as<float>()[i] <= 0.0f))
        fail(k, "cumulative_log_p_ptr",
             "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the random requests' draft rows");
    if (has_draft) {
      need_at_least(k, "local_residual_mass_stride", residual_stride, 0);
      need_cells(k, "local_residual_mass_ptr", residual, ahead, residual_stride, nb);
      if (!ahead.empty() && residual.dtype != kFloat32)
        throw TypeError(std::string(k) + ": 'local_residual_mass_ptr' must be float32");
      for (const std::int64_t i : ahead)
        for (std::int64_t b = 0; b < nb; ++b) {
          const float m = residual.as<float>()[i * residual_stride + b];
          if (!(m >= 0.0f && std::isfinite(m)))
            fail(k, "local_residual_mass_ptr", "must hold finite masses >= 0 (K15's) at the rows read");
        }
    }
  }
  const Stats ts{t_max.as<float>(), t_max_stride, t_sumexp.as<float>(), t_sumexp_stride};
  const Stats ds{d_max.as<float>(), d_max_stride, d_sumexp.as<float>(), d_sumexp_stride};
  with_int(k, "sampled_ptr", sampled.dtype, [&](auto s_) {
  with_int(k, "rejected_steps_ptr", rejected_steps.dtype, [&](auto n_) {
  with_int(k, "target_local_argmax_ptr", t_argmax.dtype, [&](auto a_) {
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
  with_logits(k, "draft_logits_ptr", has_draft ? draft.dtype : kFloat32, [&](auto d_) {
    using S = decltype(s_);
    using N = decltype(n_);
    using A = decltype(a_);
    using T = decltype(t_);
    using D = decltype(d_);
    S* out = sampled.as<S>();
    const float* entropy = fly_entropy.present() ? fly_entropy.as<float>() : nullptr;
    const float* rate = rates.present() ? rates.as<float>() : nullptr;
    const float* ratio_log = cumulative.present() ? cumulative.as<float>() : nullptr;
    NoGil nogil;
#pragma omp parallel for if (parallel_if(reqs >= kParallelGatherRows)) schedule(dynamic, 16)
    for (std::int64_t r = 0; r < reqs; ++r) {
      const std::int64_t start = cu[r], n = cu[r + 1] - cu[r] - 1, seed = seed_buf.as<std::int64_t>()[slots[r]];
      const bool greedy = t[r] == 0.0f;
      S* row_out = out + r * sampled_stride;
      std::int64_t accepted_length = 0, pending = -1, rejected_argmax = 0;
      float target_lse = 0.0f, draft_lse = 0.0f;
      bool verifying = true;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t row = start + i;
        const bool valid = tokens[row + 1] >= 0;
        const std::int64_t d = std::max<std::int64_t>(tokens[row + 1], 0);
        if (!greedy && fly == 0) verifying = verifying && valid;  // a placeholder ends a random request
        if (!verifying) continue;
        std::int64_t target_argmax = 0;
        bool can_defer = false, accepted = false;
        const float u = gumbel::tl_rand32(block ? gumbel::spec_step_seed(seed, i) : seed, pos[row], wide_pos, false);
        if (greedy) {
          target_argmax = global_argmax(t_max.as<float>(), t_max_stride, t_argmax.as<A>(), t_argmax_stride, row, nb);
          accepted = (synthetic ? u < rate[i] : target_argmax == d) && valid;
          if (fly > 0) can_defer = valid && to_float(target.as<T>()[row * target_stride + d]) > kNegInf;
        } else if (block) {
          const float ratio = gumbel::exp32(ratio_log[row]);  // the joint ratio after this step
          const std::int64_t next = i < n - 1 ? tokens[row + 2] : -1;
          float h = ratio;
          if (next >= 0) {
            float mass;
            if (has_draft) {
              const float* tiles = residual.as<float>() + (row + 1) * residual_stride;  // K15's (C29's tree_sum)
              mass = static_cast<float>(gumbel::tree_sum([&](std::int64_t b) { return static_cast<double>(tiles[b]); }, nb));
            } else {
              const float p = gumbel::exp32(to_float(target.as<T>()[(row + 1) * target_stride + next]) - logsumexp(ts, row + 1, nb));
              mass = ratio * (1.0f - p);
            }
            const float denom = mass + 1.0f - ratio;
            h = denom > 0.0f ? mass / denom : 1.0f;
          }
          if (u <= h) accepted_length = i + 1;  // no early exit: a later accept takes the block up to it
          row_out[i] = static_cast<S>(d);
        } else {
          const float step_target_lse = logsumexp(ts, row, nb);
          const float step_draft_lse = has_draft ? logsumexp(ds, row, nb) : 0.0f;
          float lp = kNegInf, lq = has_draft ? kNegInf : 0.0f;
          if (valid) {
            lp = to_float(target.as<T>()[row * target_stride + d]) - step_target_lse;
            if (has_draft)
              lq = to_float(draft.as<D>()[slots[r] * draft_stride_0 + i * draft_stride_1 + d]) / t[r] - step_draft_lse;
          }
          if (fly == 0 || pending < 0) {
            target_lse = step_target_lse;
            draft_lse = step_draft_lse;
          }
          // p(d) > u * q(d), strictly, in the log domain.
          accepted = synthetic ? u < rate[i] : lp > gumbel::log32(u) + lq;
          if (fly > 0) {
            accepted = accepted && valid;
            can_defer = valid && lp > kNegInf && lq > kNegInf;
          }
        }
        if (block && !greedy) continue;
        if (fly > 0) {
          if (pending >= 0) {
            verifying = accepted;  // only accepted drafts confirm a deferred rejection
            if (accepted && i - pending == fly) {
              accepted_length = i + 1;
              pending = -1;
            }
          } else if (accepted) {
            accepted_length = i + 1;
          } else {
            rejected_argmax = target_argmax;
            verifying = can_defer && i + fly < n && entropy[row] >= threshold;
            if (verifying) pending = i;
          }
          row_out[i] = static_cast<S>(d);
        } else {
          verifying = accepted;
          accepted_length += accepted;
          row_out[i] = static_cast<S>(greedy && !accepted ? target_argmax : d);
        }
      }
      if (fly > 0 && greedy && accepted_length < n) row_out[accepted_length] = static_cast<S>(rejected_argmax);
      rejected_steps.as<N>()[r] = static_cast<N>(accepted_length);
      if (block && !greedy && accepted_length < n) {
        target_lse = logsumexp(ts, start + accepted_length, nb);
        if (has_draft) draft_lse = logsumexp(ds, start + accepted_length, nb);
      }
      target_lse_out.as<float>()[r] = target_lse;
      draft_lse_out.as<float>()[r] = draft_lse;
    }
  });
  });
  });
  });
  });
}

// -- K17 ---------------------------------------------------------------------------------------------
// One tile of a resampled row: `x` the target logits (-0.0 read as +0.0; a one-hot draft's token
// already -inf), `y` the draft's divided by the temperature for a residual row, else null.
struct ResampleTile {
  const float* x;
  const float* y;
  float lse_t, lse_d, shift;
  bool shifted, noise;
  std::int64_t seed, pos, lo;
  Upcoming next_x{}, next_y{};  // the next cell's logits (the float32 path fetches them)
};

// The tile's score at q with float32 noise, as the scalar port computes it.
inline float resample_score32(const ResampleTile& r, std::int64_t q) {
  float v = r.x[q];
  if (r.y != nullptr) {
    float lp = v - r.lse_t;
    if (r.shifted) lp = lp + r.shift;  // the block residual scales p by the joint ratio
    const float lq = r.y[q] - r.lse_d;
    // log max(p - q, 0) = log p + log(1 - q/p), -inf where q >= p (NaN ratios included).
    const float ratio = gumbel::exp32(lq - lp);
    v = ratio < 1.0f ? lp + gumbel::log1p32(-ratio) : kNegInf;
  }
  if (r.noise)
    v = v + gumbel::gumbel32(gumbel::murmur3_uniform32(r.seed, r.pos, static_cast<std::uint32_t>(r.lo + q)));
  return v;
}

// The first index of the tile's largest float32 score and that score (all -inf: index 0), kLanes
// lanes at a time. With noise, a vector is scored only where a lane's bound (vmath's
// residual_above and gumbel32_above, a dozen operations) exceeds the best score so far: no other
// lane can be the tile's first maximum. The bounds are tested for kGroup lanes together, because
// the test that any lane of a mask passes costs as much as the bounds of a vector; the vectors of
// a group that passes are then tested one by one.
SPECDIFF_CLONES std::pair<float, std::int64_t> resample_tile32(const ResampleTile& r, std::int64_t n) {
  using namespace vmath;
  constexpr std::int64_t kGroup = 8 * kLanes;
  const std::int64_t nv = n & ~std::int64_t{kLanes - 1};
  const Uv h = Uv{} + gumbel::murmur3_prefix(r.seed, r.pos);
  Iv lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  // The first key's hash constant times the lanes' keys; a vector step adds kLanes times it.
  const Uv key_c1 = reinterpret_cast<Uv>(lane + static_cast<std::int32_t>(r.lo)) * gumbel::kMurmurC1;
  // The logits, the residual's log p and log(q/p), and the noise's hash of the kLanes lanes from j.
  struct Lanes {
    Fv x, lp, d;
    Uv h;
  };
  const auto lanes = [&](std::int64_t j) __attribute__((always_inline)) {  // inlined: vector ABI
    Lanes a{loadu(r.x + j), {}, {}, {}};
    a.lp = a.x;
    if (r.y != nullptr) {
      a.lp = a.x - r.lse_t;
      if (r.shifted) a.lp = a.lp + r.shift;  // the block residual scales p by the joint ratio
      a.d = loadu(r.y + j) - r.lse_d - a.lp;
    }
    if (r.noise) a.h = gumbel::murmur3_finish_scaled(h, key_c1 + static_cast<std::uint32_t>(j) * gumbel::kMurmurC1);
    return a;
  };
  Fv best = Fv{} + kNegInf;
  Iv at = lane;  // each lane's first index of its best (all -inf: its first)
  float top = kNegInf;  // the best score so far
  for (std::int64_t g = 0; g < nv; g += kGroup) {
    const std::int64_t end = std::min(g + kGroup, nv);
    Iv above_top[kGroup / kLanes];  // per vector: the lanes whose bound exceeds the best score so far
    if (r.noise) {
      Iv any{};
      for (std::int64_t j = g; j < end; j += kLanes) {
        r.next_x.fetch(j / kLanes);
        r.next_y.fetch(j / kLanes);
        const Lanes a = lanes(j);
        above_top[(j - g) / kLanes] = (r.y != nullptr ? a.lp + residual_above(a.d) : a.x) + gumbel32_above(a.h) > top;
        any |= above_top[(j - g) / kLanes];
      }
      if (!any_lane(any)) continue;
    }
    for (std::int64_t j = g; j < end; j += kLanes) {
      if (r.noise && !any_lane(above_top[(j - g) / kLanes])) continue;
      const Lanes a = lanes(j);
      Fv v = a.x;
      if (r.y != nullptr) {
        // log max(p - q, 0) = log p + log(1 - q/p), -inf where q >= p (NaN ratios included).
        const Fv ratio = exp32(a.d);
        const Fv log1p = log1p32_negative(ratio < 1.0f ? -ratio : Fv{});
        v = ratio < 1.0f ? a.lp + log1p : Fv{} + kNegInf;
      }
      if (r.noise) v = v + gumbel32(uniform32(a.h));
      at = best < v ? lane + static_cast<std::int32_t>(j) : at;
      best = best < v ? v : best;
    }
    if (r.noise) top = max_lane(best);
  }
  top = kNegInf;
  std::int64_t arg = 0;
  if (nv > 0) {
    top = max_lane(best);
    arg = nv;
    for (int l = 0; l < kLanes; ++l)
      if (best[l] == top) arg = std::min<std::int64_t>(arg, at[l]);
  }
  for (std::int64_t q = nv; q < n; ++q) {
    const float score = resample_score32(r, q);
    if (q == 0 || score > top) {
      top = score;
      arg = q;
    }
  }
  return {top, arg};
}

void resample(Buffer out_argmax, std::int64_t out_argmax_stride, Buffer out_max, std::int64_t out_max_stride, Buffer target,
              std::int64_t target_stride, Buffer target_lse, Buffer draft, std::int64_t draft_stride_0,
              std::int64_t draft_stride_1, Buffer draft_lse, Buffer rejected_step, Buffer cu_num_logits,
              Buffer expanded_idx_mapping, Buffer draft_sampled, Buffer temp, Buffer seed_buf, Buffer pos_buf,
              Buffer cumulative, Buffer contexts, std::int64_t /*contexts_stride*/, Buffer watermarking,
              Buffer skip_mask, std::int64_t /*key_0*/, std::int64_t /*key_1*/, std::int64_t vocab, std::int64_t block,
              bool has_draft, bool fp64, bool use_block, std::int64_t context_width, bool watermark, bool dedup) {
  const char* k = kResample;
  if (watermark || dedup) fail(k, "WATERMARK", "must be False: the watermark branch is not specified yet (docs/mrv2.md)");
  if (contexts.present()) fail(k, "contexts_ptr", "must be None without WATERMARK");
  if (watermarking.present()) fail(k, "watermarking_ptr", "must be None without WATERMARK");
  if (skip_mask.present()) fail(k, "watermarking_skip_mask_ptr", "must be None without WATERMARK");
  need_at_least(k, "CONTEXT_WIDTH", context_width, 1);
  need_at_least(k, "vocab_size", vocab, 1);
  need_tiles(k, vocab, block);
  if (has_draft != draft.present()) fail(k, "HAS_DRAFT_LOGITS", "must be True exactly when draft_logits_ptr is a tensor");
  if (fp64 != (out_max.dtype == kFloat64)) fail(k, "USE_FP64", "must be True exactly when resampled_local_max_ptr is float64");
  if (use_block != cumulative.present())
    fail(k, "USE_BLOCK_VERIFICATION", "must be True exactly when cumulative_log_p_ptr is a tensor");
  const std::int64_t nb = vocab / block + (vocab % block != 0);
  const std::vector<std::int64_t> cu = bonus_offsets(k, cu_num_logits);
  const std::int64_t reqs = static_cast<std::int64_t>(cu.size()) - 1;
  const std::vector<std::int64_t> steps = load_ints(k, "rejected_step_ptr", rejected_step, reqs);
  if (reqs == 0) return;
  for (std::int64_t r = 0; r < reqs; ++r)
    if (steps[r] < 0 || steps[r] > cu[r + 1] - cu[r] - 1)
      fail(k, "rejected_step_ptr", "must hold accepted counts in [0, drafts]; request " + std::to_string(r) + " has " +
                                       std::to_string(steps[r]) + " for " + std::to_string(cu[r + 1] - cu[r] - 1) + " drafts");
  const std::int64_t nl = cu.back();
  const std::vector<std::int64_t> slot_of = load_ints(k, "expanded_idx_mapping_ptr", expanded_idx_mapping, nl);
  const std::vector<std::int64_t> tokens = load_ints(k, "draft_sampled_ptr", draft_sampled, nl);
  const std::vector<std::int64_t> pos = load_ints(k, "pos_ptr", pos_buf, nl);
  std::vector<std::int64_t> rows(reqs), slots(reqs);
  for (std::int64_t r = 0; r < reqs; ++r) {
    rows[r] = cu[r] + steps[r];
    slots[r] = slot_of[rows[r]];
  }
  const std::vector<float> t = temperatures(k, temp, slots);
  if (seed_buf.dtype != kInt64) throw TypeError(std::string(k) + ": 'seed_ptr' must be int64");
  for (const std::int64_t s : slots)
    if (s >= seed_buf.numel)
      fail(k, "expanded_idx_mapping_ptr",
           "must hold state slots in [0, " + std::to_string(seed_buf.numel) + ") (seed_ptr's length)");
  // Writers: random requests, and greedy ones at their bonus row. A residual request takes its
  // rejected draft's distribution out of the target's.
  std::vector<std::int64_t> writers, residual, target_at, draft_at;
  std::vector<char> bonus(reqs), takes_draft(reqs);
  for (std::int64_t r = 0; r < reqs; ++r) {
    bonus[r] = rows[r] == cu[r + 1] - 1;
    if (t[r] == 0.0f && !bonus[r]) continue;
    writers.push_back(r);
    takes_draft[r] = t[r] != 0.0f && !bonus[r] && tokens[rows[r] + 1] >= 0;
    if (takes_draft[r] && has_draft) residual.push_back(r);
  }
  if (writers.empty()) return;
  if (out_argmax.dtype == kInt32 && vocab - 1 > std::numeric_limits<std::int32_t>::max())
    fail(k, "vocab_size", "must fit resampled_local_argmax_ptr's int32, got " + std::to_string(vocab - 1));
  need_at_least(k, "resampled_local_argmax_stride", out_argmax_stride, 0);
  need_cells(k, "resampled_local_argmax_ptr", out_argmax, writers, out_argmax_stride, nb, true);
  need_at_least(k, "resampled_local_max_stride", out_max_stride, 0);
  need_cells(k, "resampled_local_max_ptr", out_max, writers, out_max_stride, nb, true);
  need_at_least(k, "target_logits_stride", target_stride, 0);
  for (const std::int64_t r : writers) target_at.push_back(flat_index(rows[r], target_stride, 0));
  with_logits(k, "target_logits_ptr", target.dtype,
              [&](auto t_) { need_logits<decltype(t_)>(k, "target_logits_ptr", target, target_at, vocab, true); });
  if (!residual.empty()) {
    for (const auto& [name, b] : {std::pair<const char*, const Buffer*>{"target_rejected_logsumexp_ptr", &target_lse},
                                  {"draft_rejected_logsumexp_ptr", &draft_lse}}) {
      need_len(k, name, *b, reqs);
      if (b->dtype != kFloat32) throw TypeError(std::string(k) + ": '" + name + "' must be float32");
      for (const std::int64_t r : residual)
        if (!std::isfinite(b->as<float>()[r]))
          fail(k, name, "must hold finite log-sum-exps (K16's) for the requests resampled");
    }
    need_at_least(k, "draft_logits_stride_0", draft_stride_0, 0);
    need_at_least(k, "draft_logits_stride_1", draft_stride_1, 0);
    for (const std::int64_t r : residual) {
      draft_at.push_back(draft_offset(slots[r], draft_stride_0, steps[r], draft_stride_1, 0));
    }
    with_logits(k, "draft_logits_ptr", draft.dtype, [&](auto d_) {
      need_logits<decltype(d_)>(k, "draft_logits_ptr", draft, draft_at, vocab, true);
    });
    if (use_block) {
      std::int64_t last = -1;
      for (const std::int64_t r : residual)
        if (steps[r] > 0) last = std::max(last, rows[r] - 1);
      if (last >= 0) {
        need_len(k, "cumulative_log_p_ptr", cumulative, last + 1);
        if (cumulative.dtype != kFloat32) throw TypeError(std::string(k) + ": 'cumulative_log_p_ptr' must be float32");
        for (const std::int64_t r : residual)
          if (steps[r] > 0 && !(cumulative.as<float>()[rows[r] - 1] <= 0.0f))
            fail(k, "cumulative_log_p_ptr",
                 "must hold log-ratios <= 0 (K14's running min(., 0)), no NaN, at the rows before those resampled");
      }
    }
  }
  with_int(k, "resampled_local_argmax_ptr", out_argmax.dtype, [&](auto a_) {
  with_float(k, "resampled_local_max_ptr", out_max.dtype, [&](auto m_) {
  with_logits(k, "target_logits_ptr", target.dtype, [&](auto t_) {
  with_logits(k, "draft_logits_ptr", has_draft ? draft.dtype : kFloat32, [&](auto d_) {
    using A = decltype(a_);
    using M = decltype(m_);
    using T = decltype(t_);
    using D = decltype(d_);
    // Tiles go to scratch; the value checks run in the same pass and name the argument afterwards.
    const std::int64_t cells = static_cast<std::int64_t>(writers.size()) * nb;
    std::vector<std::int64_t> args(cells);
    std::vector<M> maxima(cells);
    std::vector<std::size_t> residual_index(reqs);
    for (std::size_t j = 0; j < residual.size(); ++j) residual_index[residual[j]] = j;
    int bad = 0;
    {
      NoGil nogil;
#pragma omp parallel if (parallel_if(cells * block >= (1 << 16))) reduction(| : bad)
      {
        std::vector<float> x(block), y(block);
#pragma omp for schedule(static)
        for (std::int64_t c = 0; c < cells; ++c) {
          const std::size_t w = static_cast<std::size_t>(c / nb);
          const std::int64_t r = writers[w], b = c % nb, lo = b * block;
          const std::int64_t n = std::min(block, vocab - lo), row = rows[r];
          const bool residual_row = takes_draft[r] && has_draft;
          bad |= load_logits(target.as<T>() + target_at[w] + lo, n, 1.0f, x.data());
          if (residual_row)
            bad |= load_logits(draft.as<D>() + draft_at[residual_index[r]] + lo, n, t[r], y.data());
          else if (takes_draft[r] && tokens[row + 1] >= lo && tokens[row + 1] < lo + n)
            x[tokens[row + 1] - lo] = kNegInf;  // a one-hot draft: the target without it
          const bool shifted = use_block && residual_row && steps[r] > 0;
          ResampleTile tile{x.data(), residual_row ? y.data() : nullptr,
                                  residual_row ? target_lse.as<float>()[r] : 0.0f,
                                  residual_row ? draft_lse.as<float>()[r] : 0.0f,
                                  shifted ? cumulative.as<float>()[row - 1] : 0.0f, shifted, t[r] != 0.0f,
                                  seed_buf.as<std::int64_t>()[slots[r]], pos[row], lo};
          const NextTile next = next_tile(c, cells, nb, block, vocab);
          const std::int64_t r1 = writers[next.row];
          tile.next_x = upcoming(target.as<T>() + target_at[next.row] + next.lo, next.n);
          if (takes_draft[r1] && has_draft)
            tile.next_y = upcoming(draft.as<D>() + draft_at[residual_index[r1]] + next.lo, next.n);
          if constexpr (std::is_same_v<M, float>) {
            std::tie(maxima[c], args[c]) = resample_tile32(tile, n);
          } else {
            // float64 noise: the float32 value widened, plus float64 Gumbel noise.
            ResampleTile noiseless = tile;
            noiseless.noise = false;
            M best = -std::numeric_limits<M>::infinity();
            std::int64_t arg = 0;
            for (std::int64_t q = 0; q < n; ++q) {
              M score = static_cast<M>(resample_score32(noiseless, q));
              if (tile.noise)
                score = score + gumbel::gumbel64(gumbel::murmur3_uniform64(tile.seed, tile.pos,
                                                                           static_cast<std::uint32_t>(lo + q)));
              if (q == 0 || score > best) {  // the first index of the maximum (all -inf: index 0)
                best = score;
                arg = q;
              }
            }
            maxima[c] = best;
            args[c] = arg;
          }
        }
      }
    }
    refuse_logits(k, bad, target, target_at, draft, draft_at, vocab);
    for (std::int64_t c = 0; c < cells; ++c) {
      const std::int64_t r = writers[static_cast<std::size_t>(c / nb)], b = c % nb;
      out_argmax.as<A>()[r * out_argmax_stride + b] = static_cast<A>(b * block + args[c]);
      out_max.as<M>()[r * out_max_stride + b] = maxima[c];
    }
  });
  });
  });
  });
}

// -- K18 ---------------------------------------------------------------------------------------------
void insert_resampled(Buffer sampled, std::int64_t sampled_stride, Buffer num_sampled, Buffer local_argmax,
                      std::int64_t local_argmax_stride, Buffer local_max, std::int64_t local_max_stride, std::int64_t nb,
                      Buffer cu_num_logits, Buffer expanded_idx_mapping, Buffer temp, std::int64_t padded) {
  const char* k = kInsert;
  const std::vector<std::int64_t> cu = request_offsets(k, cu_num_logits);
  const std::int64_t reqs = static_cast<std::int64_t>(cu.size()) - 1;
  const std::vector<std::int64_t> count = load_ints(k, "num_sampled_ptr", num_sampled, reqs);
  need_at_least(k, "resample_num_blocks", nb, 1);
  need_power_of_two(k, "PADDED_RESAMPLE_NUM_BLOCKS", padded);
  if (padded < nb) fail(k, "PADDED_RESAMPLE_NUM_BLOCKS", "must be at least resample_num_blocks=" + std::to_string(nb));
  if (reqs == 0) return;
  std::vector<std::int64_t> rows(reqs);
  for (std::int64_t r = 0; r < reqs; ++r) {
    if (count[r] < 0 || count[r] > cu[r + 1] - cu[r] - 1)
      fail(k, "num_sampled_ptr", "must hold accepted counts in [0, drafts]; request " + std::to_string(r) + " has " +
                                     std::to_string(count[r]) + " for " + std::to_string(cu[r + 1] - cu[r] - 1) + " drafts");
    rows[r] = cu[r] + count[r];
  }
  need_fits(k, "num_sampled_ptr", *std::max_element(count.begin(), count.end()) + 1, "num_sampled_ptr", num_sampled);
  const std::int64_t last_row = *std::max_element(rows.begin(), rows.end());
  if (last_row >= expanded_idx_mapping.numel)
    fail(k, "expanded_idx_mapping_ptr", "must hold the slot of row " + std::to_string(last_row));
  const std::vector<std::int64_t> slot_of = load_ints(k, "expanded_idx_mapping_ptr", expanded_idx_mapping, last_row + 1);
  std::vector<std::int64_t> slots(reqs);
  for (std::int64_t r = 0; r < reqs; ++r) slots[r] = slot_of[rows[r]];
  const std::vector<float> t = temperatures(k, temp, slots);
  const std::vector<std::int64_t> tokens = load_ints(k, "resampled_local_argmax_ptr", local_argmax, local_argmax.numel);
  std::vector<std::int64_t> writers;  // requests that insert: random, or greedy at the bonus row
  for (std::int64_t r = 0; r < reqs; ++r)
    if (t[r] != 0.0f || rows[r] == cu[r + 1] - 1) writers.push_back(r);
  if (!writers.empty()) {
    need_at_least(k, "resampled_local_max_stride", local_max_stride, 0);
    need_at_least(k, "resampled_local_argmax_stride", local_argmax_stride, 0);
    need_cells(k, "resampled_local_max_ptr", local_max, writers, local_max_stride, nb);
    need_cells(k, "resampled_local_argmax_ptr", local_argmax, writers, local_argmax_stride, nb);
    need_at_least(k, "sampled_stride", sampled_stride, 0);
    for (const std::int64_t r : writers) {
      const std::int64_t at = flat_index(r, sampled_stride, count[r]);
      if (at < 0 || at >= sampled.numel)
        fail(k, "sampled_ptr", "must hold flat index " + std::to_string(at) + " (row stride " + std::to_string(sampled_stride) + ")");
      for (std::int64_t b = 0; b < nb; ++b)
        need_fits(k, "resampled_local_argmax_ptr", tokens[r * local_argmax_stride + b], "sampled_ptr", sampled);
    }
  }
  with_int(k, "sampled_ptr", sampled.dtype, [&](auto s_) {
    with_int(k, "num_sampled_ptr", num_sampled.dtype, [&](auto n_) {
      with_float(k, "resampled_local_max_ptr", local_max.dtype, [&](auto m_) {
        using S = decltype(s_);
        using N = decltype(n_);
        using M = decltype(m_);
        const auto writing = static_cast<std::int64_t>(writers.size());
        NoGil nogil;
#pragma omp parallel for if (parallel_if(writing >= kParallelSmallRows)) schedule(static)
        for (std::int64_t w = 0; w < writing; ++w) {
          const std::int64_t r = writers[w];
          const M* m = local_max.as<M>() + r * local_max_stride;
          std::int64_t best = 0;
          M top = -std::numeric_limits<M>::infinity();
          for (std::int64_t b = 0; b < nb; ++b)
            if (m[b] > top) {  // NaN never wins; the first tile of the maximum does
              top = m[b];
              best = b;
            }
          sampled.as<S>()[r * sampled_stride + count[r]] = static_cast<S>(tokens[r * local_argmax_stride + best]);
        }
        for (std::int64_t r = 0; r < reqs; ++r) num_sampled.as<N>()[r] = static_cast<N>(count[r] + 1);
      });
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(mrv2, "Model Runner V2's rejection sampler") {
  def_kernel<&gather_draft_sampled>(m, "_gather_draft_sampled");
  def_kernel<&flatten_sampled>(m, "_flatten_sampled");
  def_kernel<&logits_stats>(m, "_compute_local_logits_stats");
  def_kernel<&insert_resampled>(m, "_insert_resampled");
  def_kernel<&cumulative_log_p>(m, "_compute_cumulative_log_p");
  def_kernel<&local_residual_mass>(m, "_compute_local_residual_mass");
  def_kernel<&rejection>(m, "_rejection");
  def_kernel<&resample>(m, "_resample");
}

}  // namespace specdiff
