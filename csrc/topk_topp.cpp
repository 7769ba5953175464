// OpenMP port of the top-k/top-p mask (docs/topk_topp.md, C35).
//
// Rows run in parallel, one per iteration, as the persistent Triton programs take them; a row
// reads and writes only itself. Each cut-off is found by a radix select over an order-preserving
// key of the logits (three digits, the last two over the first digit's bin only), for the rank
// count (top-k) and the integer mass (top-p) alike, so the result is C35's exact cut-off whatever the thread count. The workspace and vLLM's
// pivot tables are not read.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "gumbel.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kKernel = "_topk_topp_kernel";
constexpr std::int64_t kTable = 200;
constexpr std::int64_t kMaxBlock = 1 << 16;
constexpr std::int64_t kMaxVocab = 1 << 21;  // a row's mass is exact in float64 (C35)

// Order-preserving unsigned key of a float32 without NaN; -0.0 keyed as +0.0 so that equal logits tie.
inline std::uint32_t key_of(float x) {
  if (x == 0.0f) x = 0.0f;
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

inline float value_of(std::uint32_t k) {
  const std::uint32_t b = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// C35's weight: floor(exp32(x - max) * 2**32). Below max - 23 it is 0 (exp(-23) < 2**-32), which
// spares the exp for the long tail of a vocabulary.
inline std::uint64_t weight_of(float x, float row_max) {
  const float d = x - row_max;
  if (!(d > -23.0f)) return 0;
  // At most 1: the split kernels take the maximum from a workspace, which may hold anything.
  return static_cast<std::uint64_t>(std::min(gumbel::exp32(d), 1.0f) * 4294967296.0f);
}

// The largest key c with weight(key >= c) >= need over the columns `in` admits, and the weight of
// the keys above c. Three digit passes (11, 11, 10 bits), each a histogram of the keys that share
// the digits fixed so far: the first over the row, which also collects the columns in the chosen
// bin, the other two over those only. The caller guarantees the total weight reaches need.
template <class In, class W>
std::pair<std::uint32_t, std::uint64_t> select(std::int64_t n, const std::uint32_t* keys, In in, W weight, std::uint64_t need,
                                               std::vector<std::uint64_t>& hist, std::vector<std::int64_t>& cand) {
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
  std::uint32_t prefix = 0;
  std::uint64_t above = 0;
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level], bits = kBits[level];
    hist.assign(std::size_t{1} << bits, 0);
    const std::uint32_t digit = (1u << bits) - 1;
    if (level == 0) {
      for (std::int64_t i = 0; i < n; ++i)
        if (in(i)) hist[keys[i] >> shift] += weight(i);
    } else {
      for (const std::int64_t i : cand)
        if ((keys[i] >> (shift + bits)) == prefix) hist[(keys[i] >> shift) & digit] += weight(i);
    }
    std::int64_t b = static_cast<std::int64_t>(digit);
    for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
    prefix = (prefix << bits) | static_cast<std::uint32_t>(b);
    if (level == 0) {
      cand.clear();
      for (std::int64_t i = 0; i < n; ++i)
        if ((keys[i] >> shift) == prefix && in(i)) cand.push_back(i);
    }
  }
  return {prefix, above};
}

struct Scratch {
  std::vector<std::uint32_t> keys;
  std::vector<std::uint64_t> weights, hist;
  std::vector<std::int64_t> cand;
};

// One row, masked in place as reference/topk_topp.py states.
void mask_row(float* x, std::int64_t v, const std::int32_t* k_ptr, const float* p_ptr, std::int64_t r, bool split,
              float mask_value, Scratch& s) {
  s.keys.resize(v);
  float row_max = -std::numeric_limits<float>::infinity();
  std::int64_t finite = 0;
  for (std::int64_t i = 0; i < v; ++i) {
    s.keys[i] = key_of(x[i]);
    row_max = std::max(row_max, x[i]);
    finite += x[i] > -std::numeric_limits<float>::infinity();
  }
  const std::int64_t k = k_ptr != nullptr ? k_ptr[r] : v;
  const bool topk = k_ptr != nullptr && k < v && finite > k;
  bool topp = false;
  double p = 1.0;
  if (p_ptr != nullptr) {
    p = static_cast<double>(p_ptr[r]);
    topp = p < 1.0 && finite > 0 && !(split && k_ptr != nullptr && k >= v);
  }
  if (!topk && !topp) return;
  const std::uint32_t* keys = s.keys.data();
  const auto all = [](std::int64_t) { return true; };

  // The cut-off: keys above `pivot` kept, and the first `ties` keyed at it. Without top-k, every
  // key is a candidate for top-p.
  std::uint32_t pivot = 0;
  std::uint64_t ties = 0;
  if (topk) {
    const auto [c, above] = select(v, keys, all, [](std::int64_t) { return std::uint64_t{1}; }, static_cast<std::uint64_t>(k), s.hist, s.cand);
    pivot = c;
    ties = static_cast<std::uint64_t>(k) - above;
  }
  if (topp) {
    s.weights.assign(v, 0);
    std::uint64_t over = 0;
    for (std::int64_t i = 0; i < v; ++i)
      if (!topk || keys[i] > pivot) over += s.weights[i] = weight_of(x[i], row_max);
    const std::uint64_t tie_weight = topk ? weight_of(value_of(pivot), row_max) : 0;
    const std::uint64_t total = over + ties * tie_weight;
    // The smallest integer mass at least p * Z (float64, one rounding; Z < 2**53 is exact).
    const double need_f = p * static_cast<double>(total);
    std::uint64_t need = static_cast<std::uint64_t>(need_f);
    if (static_cast<double>(need) < need_f) ++need;
    if (over >= need) {
      const std::uint32_t floor = pivot;
      const auto in = [&](std::int64_t i) { return !topk || keys[i] > floor; };
      const auto [c, above] = select(v, keys, in, [&](std::int64_t i) { return s.weights[i]; }, need, s.hist, s.cand);
      pivot = c;
      const std::uint64_t w = weight_of(value_of(c), row_max);
      ties = (need - above + w - 1) / w;
    } else {  // the prefix ends among top-k's ties
      ties = (need - over + tie_weight - 1) / tie_weight;
    }
  }
  std::uint64_t seen = 0;
  for (std::int64_t i = 0; i < v; ++i) {
    const bool keep = keys[i] > pivot || (keys[i] == pivot && seen++ < ties);
    if (!keep) x[i] = mask_value;
  }
}

void topk_topp(Strided logits, std::int64_t stride, Buffer buffer, Buffer pct_table, Buffer cdf_table, Buffer k, Buffer p,
               std::int64_t batch, std::int64_t vocab, float mask_value, std::int64_t block, std::int64_t block_trunc,
               bool topk_enabled, bool topp_enabled, bool split) {
  need_at_least(kKernel, "BATCH_SIZE", batch, 0);
  need_at_least(kKernel, "VOCAB_SIZE", vocab, 1);
  if (vocab > kMaxVocab)
    fail(kKernel, "VOCAB_SIZE", "must be at most " + std::to_string(kMaxVocab) + " (C35: a row's mass is exact in float64)");
  for (const auto& [name, value] : {std::pair{"BLOCK_SIZE", block}, std::pair{"BLOCK_SIZE_TRUNC", block_trunc}}) {
    need_power_of_two(kKernel, name, value);
    if (value > kMaxBlock) fail(kKernel, name, "must be at most " + std::to_string(kMaxBlock));
  }
  for (const auto& [name, table] : {std::pair{"PERCENTILE_TO_STD_TABLE", pct_table}, std::pair{"NORMAL_CDF_TO_SIGMA_TABLE", cdf_table}})
    if (table.numel != kTable)
      fail(kKernel, name, "must hold vLLM's 200 entries, has " + std::to_string(table.numel));
  (void)buffer;  // its shape is the launcher's check (cpu_impl/topk_topp.py); never read
  if (batch == 0) return;
  if (batch > 1 && stride < vocab)
    fail(kKernel, "LOGITS_STRIDE_0",
         "must be >= VOCAB_SIZE=" + std::to_string(vocab) + " (rows written may not overlap), got " + std::to_string(stride));
  need_rows(kKernel, "LOGITS", logits, batch, stride, vocab);
  float* base = logits.as<float>();
  // C30, checked in parallel (a pass over every row); the first offending cell is named.
  std::vector<std::int64_t> bad(batch, -1);
  {
    NoGil nogil;
#pragma omp parallel for if (parallel_if(batch > 1)) schedule(static)
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t c = 0; c < vocab && bad[r] < 0; ++c) {
        const float x = base[r * stride + c];
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) bad[r] = c;
      }
  }
  for (std::int64_t r = 0; r < batch; ++r)
    if (bad[r] >= 0)
      fail(kKernel, "LOGITS",
           "must hold finite values or -inf (C30); row " + std::to_string(r) + ", column " + std::to_string(bad[r]) + " holds " +
               std::to_string(base[r * stride + bad[r]]));
  const std::int32_t* kv = nullptr;
  const float* pv = nullptr;
  if (topk_enabled) {
    need_len(kKernel, "K", k, batch);
    kv = k.as<std::int32_t>();
    for (std::int64_t r = 0; r < batch; ++r)
      if (kv[r] < 1) fail(kKernel, "K", "must hold k >= 1 in its first BATCH_SIZE=" + std::to_string(batch) + " entries, got " + std::to_string(kv[r]));
  }
  if (topp_enabled) {
    need_len(kKernel, "P", p, batch);
    pv = p.as<float>();
    for (std::int64_t r = 0; r < batch; ++r)
      if (!(pv[r] > 0.0f)) fail(kKernel, "P", "must hold p > 0 (and no NaN) in its first BATCH_SIZE entries");
  }
  NoGil nogil;
#pragma omp parallel if (parallel_if(batch > 1))
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t r = 0; r < batch; ++r) mask_row(base + r * stride, vocab, kv, pv, r, split, mask_value, s);
  }
}

// The split top-p pipeline (C36): reference/topk_topp.py states every word it leaves in STATS and
// PARTS, and these programs write them bit for bit. A program (row, slice) reads its slice (the
// finishing round: its row), the row's STATS and the earlier rounds' PARTS, and writes only its
// own STATS words, its own PARTS record or its own slice: programs run in parallel, in any order.
namespace split {

constexpr std::int64_t kKeyNegInf = -2139095041, kKeyMax = 0x7F7FFFFF, kKeyPosInf = 0x7F800000;
constexpr std::int64_t kI32Min = std::numeric_limits<std::int32_t>::min(), kI32Max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMassMax = std::int64_t{1} << 53;
constexpr int kMaxPasses = 64;
constexpr std::int64_t kMaxSplits = 64, kMaxRounds = 16;

// The signed order key of reference/topk_topp.key32, and its inverse.
inline std::int64_t key(float x) { return static_cast<std::int32_t>(key_of(x) ^ 0x80000000u); }
inline float value(std::int64_t k) { return value_of(static_cast<std::uint32_t>(k) ^ 0x80000000u); }
inline std::int64_t weight(float x, float m) { return static_cast<std::int64_t>(weight_of(x, m)); }
inline std::int64_t clamp(std::int64_t x, std::int64_t lo, std::int64_t hi) { return std::min(std::max(x, lo), hi); }

// The workspace: float32 storage of int32 words.
inline std::int64_t word(const float* w, std::int64_t i) {
  std::int32_t v;
  std::memcpy(&v, w + i, sizeof v);
  return v;
}
inline void put(float* w, std::int64_t i, std::int64_t v) {
  const auto b = static_cast<std::int32_t>(static_cast<std::uint32_t>(v));  // wraps, as the oracle's int32 view
  std::memcpy(w + i, &b, sizeof b);
}

struct Bin {
  std::int64_t mass = 0, lo = kI32Max, hi = kI32Min;
};

struct Launch {
  float* logits;
  std::int64_t stride, vocab, slices, nb, fanout, rounds;
  const std::int32_t* k;
  const float* p;
  float* stats;
  float* parts;
  float* row(std::int64_t r) const { return logits + r * stride; }
  std::pair<std::int64_t, std::int64_t> bounds(std::int64_t me) const {
    const std::int64_t n = ceil_div(vocab, slices), start = std::min(me * n, vocab);
    return {start, std::min(start + n, vocab)};
  }
  bool owned(std::int64_t r) const { return p[r] < 1.0f && (k == nullptr || k[r] >= vocab); }
  std::int64_t slot(std::int64_t r, std::int64_t round, std::int64_t me) const { return ((r * rounds + round) * slices + me) * fanout * 3; }
};

void partials(const float* x, std::int64_t start, std::int64_t end, std::int64_t lo, std::int64_t hi, float m, std::int64_t nb,
              Bin* out) {
  for (std::int64_t b = 0; b < nb; ++b) out[b] = Bin{};
  const std::int64_t width = hi - lo + 1;
  for (std::int64_t i = start; i < end; ++i) {
    const std::int64_t kx = key(x[i]);
    if (!(x[i] > -std::numeric_limits<float>::infinity()) || kx < lo || kx > hi) continue;
    Bin& b = out[(kx - lo) * nb / width];
    b.mass += weight(x[i], m);
    b.lo = std::min(b.lo, kx);
    b.hi = std::max(b.hi, kx);
  }
}

struct Search {
  std::int64_t lo, hi;
  float m;
  float p;
  std::int64_t need = -1, above = 0;
  int status = 0;  // 1: found (cut, keep, before), 2: none (the row is left alone)
  std::int64_t cut = 0, keep = 0, before = 0;

  // One round over `n` slices' records of `nb` bins each (rec[s * nb + b]).
  void combine(const Bin* rec, std::int64_t n, std::int64_t nb, std::int64_t me) {
    Bin tot[8];
    for (std::int64_t b = 0; b < nb; ++b) {
      tot[b] = Bin{};
      for (std::int64_t s = 0; s < n; ++s) {
        tot[b].mass += rec[s * nb + b].mass;
        tot[b].lo = std::min(tot[b].lo, rec[s * nb + b].lo);
        tot[b].hi = std::max(tot[b].hi, rec[s * nb + b].hi);
      }
    }
    if (need < 0) {  // the first round weighs every finite logit: Z
      std::int64_t z = above;
      for (std::int64_t b = 0; b < nb; ++b) z += tot[b].mass;
      const double need_f = static_cast<double>(p) * static_cast<double>(z);
      need = static_cast<std::int64_t>(need_f);
      if (static_cast<double>(need) < need_f) ++need;
    }
    std::int64_t over = above, pick = -1;
    for (std::int64_t b = nb - 1; b >= 0; --b) {
      if (tot[b].mass > 0 && over + tot[b].mass >= need) {
        pick = b;
        break;
      }
      over += tot[b].mass;
    }
    if (pick < 0) {
      status = 2;
      return;
    }
    const std::int64_t new_lo = clamp(tot[pick].lo, lo, hi), new_hi = clamp(tot[pick].hi, new_lo, hi);
    lo = new_lo;
    hi = new_hi;
    above = over;
    if (lo != hi) return;
    const std::int64_t w = weight(value(lo), m);
    std::int64_t ties = 0;
    before = 0;
    for (std::int64_t s = 0; s < n; ++s) {
      const std::int64_t t = w > 0 ? rec[s * nb + pick].mass / w : 0;
      if (s < me) before += t;
      ties += t;
    }
    const std::int64_t room = need - 1 - above;
    keep = room < 0 || w == 0 ? 0 : std::min(ties, room / w + 1);
    status = 1;
    cut = lo;
  }
};

// Row r's search from STATS; nullopt-like status 2 for a row without a finite logit.
bool start(const Launch& L, std::int64_t r, Search& s) {
  std::int64_t top = kI32Min, bottom = kI32Max;
  for (std::int64_t i = 0; i < L.slices; ++i) {
    top = std::max(top, word(L.stats, (r * L.slices + i) * 4));
    bottom = std::min(bottom, word(L.stats, (r * L.slices + i) * 4 + 1));
  }
  const std::int64_t hi = clamp(top, kKeyNegInf, kKeyMax);
  if (hi == kKeyNegInf) return false;
  s = Search{clamp(bottom, kKeyNegInf + 1, hi), hi, value(hi), L.p[r]};
  return true;
}

void records(const Launch& L, std::int64_t r, std::int64_t round, std::vector<Bin>& rec) {
  rec.resize(L.slices * L.nb);
  for (std::int64_t s = 0; s < L.slices; ++s) {
    const std::int64_t base = L.slot(r, round, s);
    for (std::int64_t b = 0; b < L.nb; ++b) {
      const std::int64_t low = word(L.parts, base + 4 * b), high = word(L.parts, base + 4 * b + 1);
      rec[s * L.nb + b] = Bin{clamp(high * 4294967296LL + (low & 0xFFFFFFFFLL), 0, kMassMax), word(L.parts, base + 4 * b + 2),
                              word(L.parts, base + 4 * b + 3)};
    }
  }
}

void replay(const Launch& L, std::int64_t r, std::int64_t me, std::int64_t rounds, Search& s, std::vector<Bin>& rec) {
  for (std::int64_t j = 0; j < rounds && s.status == 0; ++j) {
    records(L, r, j, rec);
    s.combine(rec.data(), L.slices, L.nb, me);
  }
}

void stats_program(const Launch& L, std::int64_t r, std::int64_t me) {
  const auto [lo, hi] = L.bounds(me);
  const float* x = L.row(r);
  std::int64_t top = kKeyNegInf, bottom = kKeyPosInf;
  for (std::int64_t i = lo; i < hi; ++i) {
    top = std::max(top, key(x[i]));
    if (x[i] > -std::numeric_limits<float>::infinity()) bottom = std::min(bottom, key(x[i]));
  }
  const std::int64_t at = (r * L.slices + me) * 4;
  put(L.stats, at, top);
  put(L.stats, at + 1, bottom);
  put(L.stats, at + 2, 0);
  put(L.stats, at + 3, 0);
}

void step_program(const Launch& L, std::int64_t r, std::int64_t me, std::int64_t round, std::vector<Bin>& rec) {
  Search s{};
  if (!start(L, r, s)) return;
  replay(L, r, me, round, s, rec);
  if (s.status != 0) return;
  const float* x = L.row(r);
  const std::int64_t at = L.slot(r, round, me);
  Bin bins[8];
  if (round == L.rounds - 1) {  // the last round finishes the search over the whole row
    for (int pass = 0; pass < kMaxPasses && s.status == 0; ++pass) {
      partials(x, 0, L.vocab, s.lo, s.hi, s.m, L.nb, bins);
      s.combine(bins, 1, L.nb, 0);
    }
    std::int64_t ties = 0;
    for (std::int64_t i = 0; i < L.bounds(me).first; ++i) ties += key(x[i]) == s.cut;
    const bool found = s.status == 1;
    for (std::int64_t w = 0; w < 3 * L.fanout; ++w) put(L.parts, at + w, 0);
    put(L.parts, at, found ? 1 : 2);
    if (found) {
      put(L.parts, at + 1, s.cut);
      put(L.parts, at + 2, s.keep);
      put(L.parts, at + 3, ties);
    }
    return;
  }
  const auto [lo, hi] = L.bounds(me);
  partials(x, lo, hi, s.lo, s.hi, s.m, L.nb, bins);
  for (std::int64_t b = 0; b < L.nb; ++b) {
    put(L.parts, at + 4 * b, bins[b].mass & 0xFFFFFFFFLL);
    put(L.parts, at + 4 * b + 1, bins[b].mass >> 32);
    put(L.parts, at + 4 * b + 2, bins[b].lo);
    put(L.parts, at + 4 * b + 3, bins[b].hi);
  }
}

void mask_program(const Launch& L, std::int64_t r, std::int64_t me, float mask_value, std::vector<Bin>& rec) {
  Search s{};
  if (!start(L, r, s)) return;
  replay(L, r, me, L.rounds - 1, s, rec);
  if (s.status == 0) {
    const std::int64_t at = L.slot(r, L.rounds - 1, me);
    s.status = word(L.parts, at) == 1 ? 1 : 2;
    s.cut = word(L.parts, at + 1);
    s.keep = word(L.parts, at + 2);
    s.before = word(L.parts, at + 3);
  }
  if (s.status != 1) return;
  const auto [lo, hi] = L.bounds(me);
  float* x = L.row(r);
  std::int64_t seen = s.before;
  for (std::int64_t i = lo; i < hi; ++i) {
    const std::int64_t kx = key(x[i]);
    const bool keep = kx > s.cut || (kx == s.cut && seen++ < s.keep);
    if (!keep) x[i] = mask_value;
  }
}

// The checks every split kernel makes (contracts/topk_topp.py, _split_preconditions).
// The stats kernel has no PARTS, F or NUM_ROUNDS (has_parts false).
Launch check(const char* kernel, Strided logits, std::int64_t stride, Buffer stats, bool has_parts, Buffer parts, Buffer k, Buffer p,
             bool has_k, std::int64_t vocab, std::int64_t slices, std::int64_t fanout, std::int64_t rounds, std::int64_t block) {
  const std::int64_t rows = logits.rows;
  need_at_least(kernel, "VOCAB_SIZE", vocab, 1);
  if (vocab > kMaxVocab) fail(kernel, "VOCAB_SIZE", "must be at most " + std::to_string(kMaxVocab) + " (C35: a row's mass is exact in float64)");
  need_power_of_two(kernel, "S", slices);
  if (slices > kMaxSplits) fail(kernel, "S", "must be at most " + std::to_string(kMaxSplits));
  need_power_of_two(kernel, "BLOCK", block);
  if (block > kMaxBlock) fail(kernel, "BLOCK", "must be at most " + std::to_string(kMaxBlock));
  need_len(kernel, "STATS", stats, rows * slices, 4);
  if (has_parts) {
    if (fanout != 4 && fanout != 8) fail(kernel, "F", "must be one of (4, 8), got " + std::to_string(fanout));
    need_at_least(kernel, "NUM_ROUNDS", rounds, 1);
    if (rounds > kMaxRounds) fail(kernel, "NUM_ROUNDS", "must be at most " + std::to_string(kMaxRounds));
    need_len(kernel, "PARTS", parts, rows * rounds * slices, fanout * 3);
  }
  Launch L{logits.as<float>(), stride, vocab, slices, 3 * fanout / 4, fanout, rounds, nullptr, nullptr, stats.as<float>(),
           parts.as<float>()};
  if (rows == 0) return L;
  if (rows > 1 && stride < vocab)
    fail(kernel, "LOGITS_STRIDE_0",
         "must be >= VOCAB_SIZE=" + std::to_string(vocab) + " (rows written may not overlap), got " + std::to_string(stride));
  need_rows(kernel, "LOGITS", logits, rows, stride, vocab);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < vocab; ++c) {
      const float x = L.row(r)[c];
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        fail(kernel, "LOGITS", "must hold finite values or -inf (C30); row " + std::to_string(r) + ", column " + std::to_string(c) +
                                   " holds " + std::to_string(x));
    }
  if (has_k) {
    need_len(kernel, "K", k, rows);
    L.k = k.as<std::int32_t>();
  }
  need_len(kernel, "P", p, rows);
  L.p = p.as<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    if (!(L.p[r] > 0.0f)) fail(kernel, "P", "must hold p > 0 (and no NaN) in its first B entries");
  return L;
}

// Runs program(r, slice, scratch) for every owned row's slices, in parallel.
template <class F>
void programs(const Launch& L, std::int64_t rows, F program) {
  const std::int64_t n = rows * L.slices;
  NoGil nogil;
#pragma omp parallel if (parallel_if(n > 1))
  {
    std::vector<Bin> rec;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t pid = 0; pid < n; ++pid)
      if (L.owned(pid / L.slices)) program(pid / L.slices, pid % L.slices, rec);
  }
}

}  // namespace split

void topp_sb_stats(Strided logits, std::int64_t stride, Buffer stats, Buffer k, Buffer p, bool has_k, std::int64_t vocab,
                   std::int64_t slices, std::int64_t block) {
  const auto L = split::check("_topp_sb_stats_kernel", logits, stride, stats, false, Buffer{0, -1, 0}, k, p, has_k, vocab, slices, 4, 1, block);
  split::programs(L, logits.rows, [&](std::int64_t r, std::int64_t me, std::vector<split::Bin>&) { split::stats_program(L, r, me); });
}

void topp_sb_step(Strided logits, std::int64_t stride, Buffer stats, Buffer parts, Buffer k, Buffer p, std::int64_t round, bool has_k,
                  std::int64_t slices, std::int64_t fanout, std::int64_t rounds, std::int64_t vocab, std::int64_t block) {
  const char* kernel = "_topp_sb_step_kernel";
  const auto L = split::check(kernel, logits, stride, stats, true, parts, k, p, has_k, vocab, slices, fanout, rounds, block);
  if (round < 0 || round >= rounds)
    fail(kernel, "ROUND", "must be in [0, NUM_ROUNDS=" + std::to_string(rounds) + "), got " + std::to_string(round));
  split::programs(L, logits.rows, [&](std::int64_t r, std::int64_t me, std::vector<split::Bin>& rec) { split::step_program(L, r, me, round, rec); });
}

void topp_sb_mask(Strided logits, std::int64_t stride, Buffer stats, Buffer parts, Buffer k, Buffer p, bool has_k, float mask_value,
                  std::int64_t slices, std::int64_t fanout, std::int64_t rounds, std::int64_t vocab, std::int64_t block) {
  const auto L = split::check("_topp_sb_mask_kernel", logits, stride, stats, true, parts, k, p, has_k, vocab, slices, fanout, rounds, block);
  split::programs(L, logits.rows, [&](std::int64_t r, std::int64_t me, std::vector<split::Bin>& rec) { split::mask_program(L, r, me, mask_value, rec); });
}

}  // namespace

SPECDIFF_FAMILY(topk_topp, "the top-k/top-p mask") {
  def_kernel<&topk_topp>(m, "_topk_topp");
  def_kernel<&topp_sb_stats>(m, "_topp_sb_stats");
  def_kernel<&topp_sb_step>(m, "_topp_sb_step");
  def_kernel<&topp_sb_mask>(m, "_topp_sb_mask");
}

}  // namespace specdiff
