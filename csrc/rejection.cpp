// OpenMP port of the rejection-sampler kernels (spec §2.1–§2.4).
//
// Each entry mirrors the PyTorch oracle in reference/rejection.py step by step, reads the
// caller's buffers in their own dtypes (templates, no widened copies) and writes results in
// place. Built with -ffp-contract=off and without fast-math (spec §1.8).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common.h"
#include "launch.h"

namespace specdiff {
namespace {

constexpr const char* kGreedy = "rejection_greedy_sample_kernel";
constexpr const char* kRandom = "rejection_random_sample_kernel";
constexpr const char* kExpand = "expand_kernel";
constexpr const char* kRecovered = "sample_recovered_tokens_kernel";

// Rows a rejection kernel processes: is_greedy[r] == want, or every row without a mask.
inline bool processes(const bool* is_greedy, std::int64_t r, bool want) {
  return is_greedy == nullptr || is_greedy[r] == want;
}

// The first n ids of a buffer fit the output's dtype: the kernel copies them into it (C5).
inline void need_ids_fit(const char* kernel, const char* name, const Buffer& ids, std::int64_t n, const Buffer& out) {
  if (ids.dtype != kInt64 || out.dtype != kInt32) return;
  for (std::int64_t i = 0; i < n; ++i) need_fits(kernel, name, ids.as<std::int64_t>()[i], "output_token_ids_ptr", out);
}

// Shared argument checks of K1 and K2; returns T.
template <class C>
std::int64_t check_rows(const char* kernel, const Buffer& out, const C* cu, std::int64_t b, const Buffer& draft,
                        const Buffer& bonus, const Buffer& is_greedy, bool want, std::int64_t max_spec_len,
                        std::int64_t* max_count) {
  need_at_least(kernel, "max_spec_len", max_spec_len, 0);
  const std::int64_t t = check_cumulative(kernel, "cu_num_draft_tokens_ptr", cu, b);
  if (max_spec_len == std::numeric_limits<std::int64_t>::max())
    fail(kernel, "max_spec_len", "must be < 2**63 - 1 (the row stride is max_spec_len + 1)");
  need_len(kernel, "output_token_ids_ptr", out, b, max_spec_len + 1);
  need_len(kernel, "draft_token_ids_ptr", draft, t);
  need_len(kernel, "bonus_token_ids_ptr", bonus, b);
  need_ids_fit(kernel, "draft_token_ids_ptr", draft, t, out);
  need_ids_fit(kernel, "bonus_token_ids_ptr", bonus, b, out);
  if (is_greedy.present()) need_len(kernel, "is_greedy_ptr", is_greedy, b);
  const Cumulative<C> c{cu};
  const bool* g = is_greedy.present() ? is_greedy.as<bool>() : nullptr;
  std::int64_t most = 0;
  for (std::int64_t r = 0; r < b; ++r)
    if (processes(g, r, want)) most = std::max(most, c.count(r));
  if (most > max_spec_len)
    fail(kernel, "max_spec_len", "must be >= every processed row's draft count (" + std::to_string(most) + ")");
  *max_count = most;
  return t;
}

void rejection_greedy_sample(Buffer out, Buffer cu, Buffer draft, Buffer argmax, Buffer bonus, Buffer is_greedy,
                             std::int64_t max_spec_len, Buffer uniform, Buffer rates, bool synthetic) {
  with_int(kGreedy, "cu_num_draft_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    std::int64_t most = 0;
    const std::int64_t t = check_rows(kGreedy, out, cu.as<C>(), b, draft, bonus, is_greedy, true, max_spec_len, &most);
    need_len(kGreedy, "target_argmax_ptr", argmax, t);
    if (synthetic) {
      if (!uniform.present()) fail(kGreedy, "uniform_probs_ptr", "is required in synthetic mode");
      need_len(kGreedy, "uniform_probs_ptr", uniform, t);
      need_len(kGreedy, "synthetic_conditional_rates_ptr", rates, most);
    }
    with_int(kGreedy, "output_token_ids_ptr", out.dtype, [&](auto o_) {
      with_int(kGreedy, "draft_token_ids_ptr", draft.dtype, [&](auto d_) {
        with_int(kGreedy, "target_argmax_ptr", argmax.dtype, [&](auto a_) {
          with_int(kGreedy, "bonus_token_ids_ptr", bonus.dtype, [&](auto x_) {
            using O = decltype(o_);
            using D = decltype(d_);
            using A = decltype(a_);
            using X = decltype(x_);
            O* o = out.as<O>();
            const D* d = draft.as<D>();
            const A* am = argmax.as<A>();
            const X* bon = bonus.as<X>();
            const bool* g = is_greedy.present() ? is_greedy.as<bool>() : nullptr;
            const double* u = uniform.present() ? uniform.as<double>() : nullptr;
            const float* rate = rates.present() ? rates.as<float>() : nullptr;
            const Cumulative<C> c{cu.as<C>()};
            const std::int64_t row_stride = max_spec_len + 1;  // from the argument (C2)
            NoGil nogil;
#pragma omp parallel for if (parallel_if(b >= kParallelSmallRows)) schedule(static)
            for (std::int64_t r = 0; r < b; ++r) {
              if (!processes(g, r, true)) continue;
              const std::int64_t s = c.start(r), n = c.count(r);
              O* row = o + r * row_stride;
              bool rejected = false;
              for (std::int64_t pos = 0; pos < n; ++pos) {
                const std::int64_t dv = d[s + pos];
                const std::int32_t av = static_cast<std::int32_t>(am[s + pos]);  // narrowed, as the kernel does
                bool accept;
                if (synthetic) {
                  // float64 u against the float32 rate widened exactly; strict; -1 drafts never pass.
                  accept = u[s + pos] < static_cast<double>(rate[pos]) && dv >= 0;
                  row[pos] = static_cast<O>(accept ? dv : av);
                } else {
                  accept = dv == av;
                  row[pos] = static_cast<O>(av);
                }
                if (!accept) {
                  rejected = true;
                  break;
                }
              }
              if (!rejected) row[n] = static_cast<O>(bon[r]);
            }
          });
        });
      });
    });
  });
}

void rejection_random_sample(Buffer out, Buffer cu, Buffer draft, Buffer draft_probs, Buffer target_probs,
                             Buffer bonus, Buffer recovered, Buffer uniform, Buffer is_greedy, std::int64_t max_spec_len,
                             std::int64_t vocab_size, Buffer rates, bool no_draft_probs, bool synthetic) {
  if (!is_greedy.present()) throw TypeError(std::string(kRandom) + ": 'is_greedy_ptr' must be a tensor, got None");
  need_at_least(kRandom, "vocab_size", vocab_size, 1);
  with_int(kRandom, "cu_num_draft_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    std::int64_t most = 0;
    const std::int64_t t = check_rows(kRandom, out, cu.as<C>(), b, draft, bonus, is_greedy, false, max_spec_len, &most);
    need_len(kRandom, "uniform_probs_ptr", uniform, t);
    need_len(kRandom, "recovered_token_ids_ptr", recovered, t);
    need_ids_fit(kRandom, "recovered_token_ids_ptr", recovered, t, out);
    need_len(kRandom, "target_probs_ptr", target_probs, t, vocab_size);
    if (!no_draft_probs) need_len(kRandom, "draft_probs_ptr", draft_probs, t, vocab_size);
    if (synthetic) need_len(kRandom, "synthetic_conditional_rates_ptr", rates, most);
    const Cumulative<C> c{cu.as<C>()};
    const bool* g = is_greedy.as<bool>();
    with_int(kRandom, "draft_token_ids_ptr", draft.dtype, [&](auto d_) {
      using D = decltype(d_);
      const D* d = draft.as<D>();
      if (!synthetic) {
        // An id >= V would read another row's probability (C11): invalid input.
        for (std::int64_t r = 0; r < b; ++r) {
          if (g[r]) continue;
          for (std::int64_t i = c.start(r); i < c.end(r); ++i)
            if (static_cast<std::int64_t>(d[i]) >= vocab_size)
              fail(kRandom, "draft_token_ids_ptr",
                   "must hold ids < vocab_size (" + std::to_string(vocab_size) + ") outside synthetic mode, got " +
                       std::to_string(static_cast<std::int64_t>(d[i])));
        }
      }
      with_int(kRandom, "output_token_ids_ptr", out.dtype, [&](auto o_) {
        with_int(kRandom, "bonus_token_ids_ptr", bonus.dtype, [&](auto x_) {
          with_int(kRandom, "recovered_token_ids_ptr", recovered.dtype, [&](auto rc_) {
            using O = decltype(o_);
            using X = decltype(x_);
            using RC = decltype(rc_);
            O* o = out.as<O>();
            const X* bon = bonus.as<X>();
            const RC* rec = recovered.as<RC>();
            const double* u = uniform.as<double>();
            const float* p = target_probs.as<float>();
            const float* q = no_draft_probs ? nullptr : draft_probs.as<float>();
            const float* rate = synthetic ? rates.as<float>() : nullptr;
            const std::int64_t row_stride = max_spec_len + 1;
            NoGil nogil;
#pragma omp parallel for if (parallel_if(b >= kParallelGatherRows)) schedule(static)
            for (std::int64_t r = 0; r < b; ++r) {
              if (g[r]) continue;
              const std::int64_t s = c.start(r), n = c.count(r);
              O* row = o + r * row_stride;
              bool rejected = false;
              for (std::int64_t pos = 0; pos < n; ++pos) {
                const std::int64_t tok = s + pos;
                const std::int64_t dv = d[tok];
                bool accept = false;
                if (dv < 0) {
                  accept = false;  // the -1 padding: no probability or rate is read (C10)
                } else if (synthetic) {
                  accept = u[tok] < static_cast<double>(rate[pos]);  // strict (C8)
                } else {
                  const std::int64_t cell = tok * vocab_size + dv;
                  const float pv = p[cell];
                  const float qv = no_draft_probs ? 1.0f : q[cell];
                  const float ratio = pv / qv;  // IEEE float32 quotient (C6)
                  // q == 0 and NaN reject (C9); the ratio is widened exactly, non-strict test.
                  accept = qv > 0.0f && static_cast<double>(ratio) >= u[tok];
                }
                if (accept) {
                  row[pos] = static_cast<O>(dv);
                } else {
                  row[pos] = static_cast<O>(rec[tok]);
                  rejected = true;
                  break;
                }
              }
              if (!rejected) row[n] = static_cast<O>(bon[r]);
            }
          });
        });
      });
    });
  });
}

void expand(Buffer out, Buffer input, Buffer cu, std::int64_t replace_from, std::int64_t replace_to,
            std::int64_t max_num_tokens) {
  if (out.dtype != input.dtype) throw TypeError(std::string(kExpand) + ": 'output_ptr' must have the input's dtype");
  if (cu.numel != input.numel)
    fail(kExpand, "cu_num_tokens_ptr", "must have one entry per input value (" + std::to_string(input.numel) + ")");
  need_power_of_two(kExpand, "MAX_NUM_TOKENS", max_num_tokens);
  for (auto [name, v] : {std::pair{"replace_from", replace_from}, std::pair{"replace_to", replace_to}})
    if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
      fail(kExpand, name, "must be representable in int32");
  with_int(kExpand, "cu_num_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    const std::int64_t t = check_cumulative(kExpand, "cu_num_tokens_ptr", cu.as<C>(), b);
    need_len(kExpand, "output_ptr", out, t);
    auto run = [&](auto v_) {
      using V = decltype(v_);
      V* o = out.as<V>();
      const V* x = input.as<V>();
      // The test and the replacement happen in the data's dtype (C18).
      const V from = static_cast<V>(replace_from), to = static_cast<V>(replace_to);
      const Cumulative<C> c{cu.as<C>()};
      NoGil nogil;
#pragma omp parallel for if (parallel_if(b >= kParallelSmallRows)) schedule(static)
      for (std::int64_t r = 0; r < b; ++r) {
        const V v = x[r] == from ? to : x[r];
        const std::int64_t s = c.start(r), n = std::min(c.count(r), max_num_tokens);
        std::fill(o + s, o + s + n, v);
      }
    };
    switch (input.dtype) {
      case kFloat32: run(float{}); break;
      case kInt32: run(std::int32_t{}); break;
      case kInt64: run(std::int64_t{}); break;
      default: throw TypeError(std::string(kExpand) + ": 'input_ptr' must be float32, int32 or int64");
    }
  });
}

// K4, the exponential race (spec §2.4). The work item is (request, vocabulary chunk): every
// draft position of the request scans its own target (and draft) chunk against the request's
// inv_q chunk, up to four positions side by side, so each inv_q vector is loaded once for all of
// them and the launch streams each input byte from DRAM once. Each (draft token, chunk) leaves its
// best (value, index); the per-token merge visits chunks in vocabulary order. Max and lowest index
// are exact operations, so the result depends on neither the chunk size nor the thread count (and
// the chunk size may adapt to both).

struct Best {
  double value;
  std::int64_t index;
};

constexpr int kRows = 4;                  // draft positions scanned side by side

// Scores are formed exactly as the oracle forms them: one float32 subtraction (or the target with
// the draft's lane zeroed), then a float32 (or, with the fp64 option, float64) product. A NaN
// score fails every `>` and never wins (C15).
template <class S, bool NoDraft>
inline S score(const float* p, const float* q, const S* inv_q, std::int64_t j, std::int64_t excluded) {
  float w;
  if constexpr (NoDraft) {
    w = j == excluded ? 0.0f : p[j];
  } else {
    const float diff = p[j] - q[j];
    w = diff > 0.0f ? diff : 0.0f;  // max(p - q, 0) with NaN giving 0 (C16)
  }
  return static_cast<S>(w) * inv_q[j];
}

// For K draft rows of one request, the lowest index of the largest non-NaN score in [0, len) of
// the slices p[k], q[k] against inv_q; {-inf, 0} when every score of a row is NaN or -inf.
// excluded[k] is the slice index of row k's zeroed lane (NoDraft), or -1. One 64-byte vector of
// lanes (GCC vector extensions: exact IEEE operations, lowered to whatever ISA the clone targets).
//
// The hot loop keeps only each lane's maximum (one vmax per vector; NaN never replaces a lane), not
// where it was seen: tracking the index cost a compare and a blend per vector. After every
// kSubBlock entries a row notes whether its best rose strictly (a tie stays with the earlier
// entry, as a sequential strict-> scan keeps it) and in which sub-block; at the end it rescans
// that one sub-block for the lowest index holding its best.
constexpr std::int64_t kSubBlock = 256;  // entries

typedef float F8 __attribute__((vector_size(32), aligned(4), may_alias));
typedef double D8 __attribute__((vector_size(64), aligned(8), may_alias));

// Eight floats widened exactly to doubles, lane by lane: GCC 12 lowers __builtin_convertvector
// of these to two 4-lane conversions and two shuffles (4 instructions instead of one vcvtps2pd
// zmm), which held the float64 scan to 60-75 % of the read roofline on 2 cores.
[[gnu::always_inline]] inline void widen(const F8& w, D8& out) {
  out = D8{w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]};
}

// The largest lane of a vector whose lanes are never NaN, in log2(lanes) shuffles (a lane-by-lane
// loop compiled to sixteen extracts, a third of the scan's time at 256-entry sub-blocks).
template <class S, class VS>
[[gnu::always_inline]] inline S max_lane(const VS& vector) {
  constexpr int L = 64 / sizeof(S);
  VS v = vector;
  // __builtin_shufflevector: constant lane indices, in GCC (12 and later) and clang alike.
  const auto fold = [&v](const VS& swapped) __attribute__((always_inline)) { v = swapped > v ? swapped : v; };
  if constexpr (L == 16) {
    fold(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    fold(__builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    fold(__builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    fold(__builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  } else {
    fold(__builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
    fold(__builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
    fold(__builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  }
  return v[0];
}

template <class S, bool NoDraft, bool Prefetch, int K>
[[gnu::always_inline]] inline void scan_block(const float* const* p, const float* const* q, const S* inv_q,
                                              std::int64_t len, const std::int64_t* excluded, Best* out) {
  constexpr int L = 64 / sizeof(S);  // 16 float32 or 8 float64 lanes
  constexpr std::int64_t G = kSubBlock / L;
  typedef S VS __attribute__((vector_size(64), aligned(sizeof(S)), may_alias));
  typedef float VF __attribute__((vector_size(L * 4), aligned(4), may_alias));
  const S inf = std::numeric_limits<S>::infinity();
  const VF zero = {};
  std::int64_t hole_group[K], hole_lane[K];  // the group and lane of each row's zeroed entry
  for (int k = 0; k < K; ++k) {
    const bool inside = NoDraft && excluded[k] >= 0 && excluded[k] < len;
    hole_group[k] = inside ? excluded[k] / L : -1;
    hole_lane[k] = inside ? excluded[k] % L : 0;
  }
  // Row k's scores of group g, formed as score() forms each one (the product is exact in the
  // lane width: a vector and a scalar product round alike).
  auto scores = [&](int k, std::int64_t g, const VS& iq, VS& s) __attribute__((always_inline)) {
    VF w = *reinterpret_cast<const VF*>(p[k] + g * L);
    if constexpr (NoDraft) {
      if (g == hole_group[k]) w[hole_lane[k]] = 0.0f;  // exactly the draft's lane (C16)
    } else {
      const VF diff = w - *reinterpret_cast<const VF*>(q[k] + g * L);
      w = diff > zero ? diff : zero;  // max(p - q, 0) with NaN giving 0 (C16)
    }
    if constexpr (sizeof(S) == 4)
      s = w;
    else
      widen(w, s);  // widened exactly; the product is float64 (C17)
    s *= iq;
  };
  S top[K];
  std::int64_t at[K];
  for (int k = 0; k < K; ++k) {
    top[k] = -inf;
    at[k] = 0;
  }
  const std::int64_t groups = len / L;
  std::int64_t rose[K];  // the first group of the sub-block where each row's best last rose
  for (int k = 0; k < K; ++k) rose[k] = -1;
  for (std::int64_t g0 = 0; g0 < groups; g0 += G) {
    const std::int64_t g1 = std::min(groups, g0 + G);
    VS mv[K];
    for (int k = 0; k < K; ++k) mv[k] = VS{} + top[k];
    for (std::int64_t g = g0; g < g1; ++g) {
      // Software prefetch a few KiB ahead (see prefetch_streams()). Into every cache level (T0),
      // not non-temporal: Intel's NTA prefetch skips L2, and with nine streams per thread the
      // lines left L1 before their use (the 16-core Xeon ran at a third of its bandwidth). A
      // prefetch past the end of a buffer never faults.
      if constexpr (Prefetch) __builtin_prefetch(inv_q + g * L + kPrefetch, 0, 3);
      const VS iq = *reinterpret_cast<const VS*>(inv_q + g * L);
      for (int k = 0; k < K; ++k) {
        if constexpr (Prefetch) {
          __builtin_prefetch(p[k] + g * L + kPrefetch, 0, 3);
          if constexpr (!NoDraft) __builtin_prefetch(q[k] + g * L + kPrefetch, 0, 3);
        }
        VS s;
        scores(k, g, iq, s);
        mv[k] = s > mv[k] ? s : mv[k];
      }
    }
    for (int k = 0; k < K; ++k) {
      const S m = max_lane<S>(mv[k]);
      if (m > top[k]) {
        top[k] = m;
        rose[k] = g0;
      }
    }
  }
  // Only the sub-block where a row's best last rose holds its first occurrence (later equal
  // scores never raised it): one rescan per row, for the lowest index equal to it.
  for (int k = 0; k < K; ++k) {
    if (rose[k] < 0) continue;
    const std::int64_t g1 = std::min(groups, rose[k] + G);
    for (std::int64_t g = rose[k]; g < g1; ++g) {
      VS s;
      scores(k, g, *reinterpret_cast<const VS*>(inv_q + g * L), s);
      int lane = L;
      for (int l = L - 1; l >= 0; --l) lane = s[l] == top[k] ? l : lane;
      if (lane < L) {
        at[k] = g * L + lane;
        break;
      }
    }
  }
  for (int k = 0; k < K; ++k) {
    for (std::int64_t j = groups * L; j < len; ++j) {
      const S sc = score<S, NoDraft>(p[k], NoDraft ? nullptr : q[k], inv_q, j, NoDraft ? excluded[k] : -1);
      if (sc > top[k]) {
        top[k] = sc;
        at[k] = j;
      }
    }
    out[k] = {static_cast<double>(top[k]), at[k]};
  }
}

// One entry point per (inv_q width, draft-probs) pair, compiled for AVX-512, AVX2 and baseline
// x86-64 (SPECDIFF_CLONES) and picked at load time, so the default build is fast on every machine.

// Scans the draft tokens [tok, tok + n) of one request on chunk [lo, hi), kRows at a time, writing
// best[token * chunks + k].
template <class S, bool NoDraft, bool Prefetch>
[[gnu::always_inline]] inline void scan_request(const float* p, const float* q, const S* inv_q, const std::int64_t* draft,
                                                std::int64_t tok, std::int64_t n, std::int64_t vocab, std::int64_t lo,
                                                std::int64_t hi, Best* best, std::int64_t chunks, std::int64_t k) {
  const float* pr[kRows];
  const float* qr[kRows];
  std::int64_t excl[kRows];
  Best found[kRows];
  for (std::int64_t i = 0; i < n; i += kRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kRows, n - i));
    for (int r = 0; r < rows; ++r) {
      const std::int64_t t = tok + i + r;
      pr[r] = p + t * vocab + lo;
      qr[r] = NoDraft ? nullptr : q + t * vocab + lo;
      excl[r] = NoDraft ? draft[i + r] - lo : -1;  // a draft id outside [lo, hi) zeroes nothing
    }
    switch (rows) {
      case 4: scan_block<S, NoDraft, Prefetch, 4>(pr, qr, inv_q + lo, hi - lo, excl, found); break;
      case 3: scan_block<S, NoDraft, Prefetch, 3>(pr, qr, inv_q + lo, hi - lo, excl, found); break;
      case 2: scan_block<S, NoDraft, Prefetch, 2>(pr, qr, inv_q + lo, hi - lo, excl, found); break;
      default: scan_block<S, NoDraft, Prefetch, 1>(pr, qr, inv_q + lo, hi - lo, excl, found); break;
    }
    for (int r = 0; r < rows; ++r) best[(tok + i + r) * chunks + k] = {found[r].value, found[r].index + lo};
  }
}

#define SPECDIFF_SCAN_REQUEST(NAME, S, NODRAFT, PREFETCH)                                                       \
  SPECDIFF_CLONES void NAME(const float* p, const float* q, const S* inv_q, const std::int64_t* draft,            \
                            std::int64_t tok, std::int64_t n, std::int64_t vocab, std::int64_t lo, std::int64_t hi, \
                            Best* best, std::int64_t chunks, std::int64_t k) {                                    \
    scan_request<S, NODRAFT, PREFETCH>(p, q, inv_q, draft, tok, n, vocab, lo, hi, best, chunks, k);               \
  }
SPECDIFF_SCAN_REQUEST(scan_request_f32_draft, float, false, true)
SPECDIFF_SCAN_REQUEST(scan_request_f32_nodraft, float, true, true)
SPECDIFF_SCAN_REQUEST(scan_request_f64_draft, double, false, true)
SPECDIFF_SCAN_REQUEST(scan_request_f64_nodraft, double, true, true)
SPECDIFF_SCAN_REQUEST(scan_request_f32_draft_hw, float, false, false)
SPECDIFF_SCAN_REQUEST(scan_request_f32_nodraft_hw, float, true, false)
SPECDIFF_SCAN_REQUEST(scan_request_f64_draft_hw, double, false, false)
SPECDIFF_SCAN_REQUEST(scan_request_f64_nodraft_hw, double, true, false)
#undef SPECDIFF_SCAN_REQUEST

template <class S, bool NoDraft>
void scan_rows(const float* p, const float* q, const S* inv_q, const std::int64_t* draft, std::int64_t tok,
               std::int64_t n, std::int64_t vocab, std::int64_t lo, std::int64_t hi, Best* best, std::int64_t chunks,
               std::int64_t k) {
  const bool pf = prefetch_streams();
  if constexpr (sizeof(S) == 4) {
    auto* f = NoDraft ? (pf ? scan_request_f32_nodraft : scan_request_f32_nodraft_hw)
                      : (pf ? scan_request_f32_draft : scan_request_f32_draft_hw);
    f(p, q, inv_q, draft, tok, n, vocab, lo, hi, best, chunks, k);
  } else {
    auto* f = NoDraft ? (pf ? scan_request_f64_nodraft : scan_request_f64_nodraft_hw)
                      : (pf ? scan_request_f64_draft : scan_request_f64_draft_hw);
    f(p, q, inv_q, draft, tok, n, vocab, lo, hi, best, chunks, k);
  }
}

// Vocabulary chunk width: whole rows (the longest streams, which DRAM serves best), split only as
// far as needed for about four work items per thread, so that one request still spreads over every
// core; at least 2048 entries, a multiple of 256. Results never depend on it.
std::int64_t chunk_width(std::int64_t requests, std::int64_t vocab, int threads) {
  const std::int64_t want = 4 * static_cast<std::int64_t>(threads);
  const std::int64_t chunks = requests >= want ? 1 : (want + requests - 1) / requests;
  const std::int64_t w = ((vocab + chunks - 1) / chunks + 255) / 256 * 256;
  return std::max<std::int64_t>(w, 2048);
}

void sample_recovered_tokens(Buffer out, Buffer cu, Buffer draft, Buffer draft_probs, Buffer target_probs,
                             Buffer inv_q, std::int64_t vocab_size, std::int64_t block_size, bool no_draft_probs,
                             bool use_fp64_gumbel) {
  need_at_least(kRecovered, "vocab_size", vocab_size, 1);
  need_power_of_two(kRecovered, "BLOCK_SIZE", block_size);
  if (use_fp64_gumbel != (inv_q.dtype == kFloat64))
    fail(kRecovered, "USE_FP64_GUMBEL", "must be inv_q_ptr is float64");
  with_int(kRecovered, "cu_num_draft_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    const std::int64_t t = check_cumulative(kRecovered, "cu_num_draft_tokens_ptr", cu.as<C>(), b);
    need_len(kRecovered, "output_token_ids_ptr", out, t);
    need_len(kRecovered, "draft_token_ids_ptr", draft, t);
    need_len(kRecovered, "target_probs_ptr", target_probs, t, vocab_size);
    if (!no_draft_probs) need_len(kRecovered, "draft_probs_ptr", draft_probs, t, vocab_size);
    need_len(kRecovered, "inv_q_ptr", inv_q, b, vocab_size);
    if (t == 0) return;
    const Cumulative<C> c{cu.as<C>()};
    with_int(kRecovered, "draft_token_ids_ptr", draft.dtype, [&](auto d_) {
      with_int(kRecovered, "output_token_ids_ptr", out.dtype, [&](auto o_) {
        with_float(kRecovered, "inv_q_ptr", inv_q.dtype, [&](auto s_) {
          using D = decltype(d_);
          using O = decltype(o_);
          using S = decltype(s_);
          const D* d = draft.as<D>();
          O* o = out.as<O>();
          const float* p = target_probs.as<float>();
          const float* q = no_draft_probs ? nullptr : draft_probs.as<float>();
          const S* iq = inv_q.as<S>();
          // Draft ids widened once (read only without draft probabilities).
          std::vector<std::int64_t> ids(no_draft_probs ? t : 0);
          for (std::int64_t i = 0; i < static_cast<std::int64_t>(ids.size()); ++i) ids[i] = d[i];
          const bool parallel = t * vocab_size >= 32768;
          const std::int64_t width = chunk_width(b, vocab_size, parallel ? omp_get_max_threads() : 1);
          const std::int64_t chunks = (vocab_size + width - 1) / width;
          std::vector<Best> best(t * chunks);
          NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (parallel_if(parallel))
          for (std::int64_t w = 0; w < b * chunks; ++w) {
            const std::int64_t r = w / chunks, k = w % chunks;
            const std::int64_t s = c.start(r), n = c.count(r);
            if (n == 0) continue;
            const std::int64_t lo = k * width, hi = std::min(lo + width, vocab_size);
            const std::int64_t* dr = no_draft_probs ? ids.data() + s : nullptr;
            if (no_draft_probs)
              scan_rows<S, true>(p, q, iq + r * vocab_size, dr, s, n, vocab_size, lo, hi, best.data(), chunks, k);
            else
              scan_rows<S, false>(p, q, iq + r * vocab_size, dr, s, n, vocab_size, lo, hi, best.data(), chunks, k);
          }
#pragma omp parallel for schedule(static) if (parallel_if(t >= kParallelSmallRows))
          for (std::int64_t tok = 0; tok < t; ++tok) {
            // Strictly larger replaces: ties across chunks go to the earlier one; all -inf gives 0.
            Best acc{-std::numeric_limits<double>::infinity(), 0};
            for (std::int64_t k = 0; k < chunks; ++k)
              if (best[tok * chunks + k].value > acc.value) acc = best[tok * chunks + k];
            o[tok] = static_cast<O>(acc.index);
          }
        });
      });
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(rejection, "rejection-sampler family") {
  def_kernel<&rejection_greedy_sample>(m, "rejection_greedy_sample");
  def_kernel<&rejection_random_sample>(m, "rejection_random_sample");
  def_kernel<&expand>(m, "expand");
  def_kernel<&sample_recovered_tokens>(m, "sample_recovered_tokens");
}

}  // namespace specdiff
