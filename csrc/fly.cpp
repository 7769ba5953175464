// OpenMP port of the FLy pre-pass (docs/fly.md, C33).
//
// One request per iteration, as one Triton program: a request writes only its own positions and
// reads only its own, so requests run in parallel with no ordering. Within a request, a position
// is written only after every test that reads it (windows look forward), so every test sees the
// launch's values, as the oracle states.
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>

#include "common.h"
#include "launch.h"

namespace specdiff {
namespace {

constexpr const char* kGreedy = "apply_fly_greedy_acceptance_kernel";
constexpr const char* kRandom = "apply_fly_random_acceptance_kernel";

// Checks shared by both kernels; returns T.
template <class C>
std::int64_t check_common(const char* kernel, const C* cu, std::int64_t b, const Buffer& draft, const Buffer& entropy,
                          const Buffer& is_greedy, std::int64_t vocab_size, std::int64_t window) {
  const std::int64_t t = check_cumulative(kernel, "cu_num_draft_tokens_ptr", cu, b);
  need_at_least(kernel, "vocab_size", vocab_size, 1);
  need_at_least(kernel, "FLY_WINDOW_SIZE", window, 0);
  checked_add(kernel, "FLY_WINDOW_SIZE", t, window, "a position plus the window");
  need_len(kernel, "draft_token_ids_ptr", draft, t);
  need_len(kernel, "fly_entropy_ptr", entropy, t);
  if (is_greedy.present()) need_len(kernel, "is_greedy_ptr", is_greedy, b);
  return t;
}

void apply_fly_greedy_acceptance(Buffer cu, Buffer draft, Buffer argmax, Buffer logits, Buffer entropy,
                                 Buffer is_greedy, std::int64_t vocab_size, float threshold, std::int64_t window) {
  with_int(kGreedy, "cu_num_draft_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    const std::int64_t t = check_common(kGreedy, cu.as<C>(), b, draft, entropy, is_greedy, vocab_size, window);
    need_len(kGreedy, "target_argmax_ptr", argmax, t);
    need_len(kGreedy, "target_logits_ptr", logits, t, vocab_size);
    // A deferred position stores its draft (< V) into the argmax buffer.
    if (argmax.dtype == kInt32 && vocab_size - 1 > std::numeric_limits<std::int32_t>::max())
      fail(kGreedy, "vocab_size", "must be <= 2147483648: a deferred draft id is stored into target_argmax_ptr's int32");
    with_int(kGreedy, "draft_token_ids_ptr", draft.dtype, [&](auto d_) {
      with_int(kGreedy, "target_argmax_ptr", argmax.dtype, [&](auto a_) {
        using D = decltype(d_);
        using A = decltype(a_);
        const D* d = draft.as<D>();
        A* am = argmax.as<A>();
        const float* lg = logits.as<float>();
        const float* ent = entropy.as<float>();
        const bool* g = is_greedy.present() ? is_greedy.as<bool>() : nullptr;
        const Cumulative<C> c{cu.as<C>()};
        NoGil nogil;
#pragma omp parallel for if (parallel_if(b >= kParallelGatherRows)) schedule(static)
        for (std::int64_t r = 0; r < b; ++r) {
          if (g != nullptr && !g[r]) continue;
          const std::int64_t s = c.start(r), n = c.count(r);
          for (std::int64_t pos = 0; pos + window < n; ++pos) {
            const std::int64_t tok = s + pos;
            const std::int64_t dv = d[tok];
            // Rejected yet plausible and uncertain; NaN entropy or logit never defers.
            if (dv == static_cast<std::int64_t>(am[tok]) || dv < 0 || dv >= vocab_size || !(ent[tok] >= threshold))
              continue;
            if (!(lg[tok * vocab_size + dv] > -std::numeric_limits<float>::infinity())) continue;
            bool confirmed = true;
            for (std::int64_t o = 1; o <= window && confirmed; ++o)
              confirmed = static_cast<std::int64_t>(d[tok + o]) == static_cast<std::int64_t>(am[tok + o]);
            if (confirmed) am[tok] = static_cast<A>(dv);
          }
        }
      });
    });
  });
}

// K2's test at one position (C6, C7, C9), and whether the draft is valid with q > 0 and p > 0.
template <class D>
struct Acceptance {
  const D* d;
  const float* p;
  const float* q;  // null: one-hot drafts, q = 1
  const double* u;
  std::int64_t vocab_size;

  bool native(std::int64_t tok, bool* plausible) const {
    const std::int64_t dv = d[tok];
    *plausible = false;
    if (dv < 0 || dv >= vocab_size) return false;
    const std::int64_t cell = tok * vocab_size + dv;
    const float pv = p[cell];
    const float qv = q == nullptr ? 1.0f : q[cell];
    if (!(qv > 0.0f)) return false;
    *plausible = pv > 0.0f;
    const float ratio = pv / qv;  // IEEE float32 quotient (C6), widened exactly (C7)
    return static_cast<double>(ratio) >= u[tok];
  }
};

void apply_fly_random_acceptance(Buffer cu, Buffer draft, Buffer draft_probs, Buffer target_probs, Buffer uniform,
                                 Buffer entropy, Buffer is_greedy, std::int64_t vocab_size, float threshold,
                                 bool no_draft_probs, std::int64_t window) {
  if (!is_greedy.present()) throw TypeError(std::string(kRandom) + ": 'is_greedy_ptr' must be a tensor, got None");
  with_int(kRandom, "cu_num_draft_tokens_ptr", cu.dtype, [&](auto c_) {
    using C = decltype(c_);
    const std::int64_t b = cu.numel;
    const std::int64_t t = check_common(kRandom, cu.as<C>(), b, draft, entropy, is_greedy, vocab_size, window);
    need_len(kRandom, "uniform_probs_ptr", uniform, t);
    need_len(kRandom, "target_probs_ptr", target_probs, t, vocab_size);
    if (!no_draft_probs) need_len(kRandom, "draft_probs_ptr", draft_probs, t, vocab_size);
    with_int(kRandom, "draft_token_ids_ptr", draft.dtype, [&](auto d_) {
      using D = decltype(d_);
      double* u = uniform.as<double>();
      const Acceptance<D> acc{draft.as<D>(), target_probs.as<float>(), no_draft_probs ? nullptr : draft_probs.as<float>(),
                              u, vocab_size};
      const float* ent = entropy.as<float>();
      const bool* g = is_greedy.as<bool>();
      const Cumulative<C> c{cu.as<C>()};
      NoGil nogil;
#pragma omp parallel for if (parallel_if(b >= kParallelGatherRows)) schedule(static)
      for (std::int64_t r = 0; r < b; ++r) {
        if (g[r]) continue;
        const std::int64_t s = c.start(r), n = c.count(r);
        for (std::int64_t pos = 0; pos + window < n; ++pos) {
          const std::int64_t tok = s + pos;
          bool plausible = false;
          if (acc.native(tok, &plausible) || !plausible || !(ent[tok] >= threshold)) continue;
          bool confirmed = true, unused = false;
          for (std::int64_t o = 1; o <= window && confirmed; ++o) confirmed = acc.native(tok + o, &unused);
          if (confirmed) u[tok] = 0.0;  // K2 then accepts: p/q >= 0
        }
      }
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(fly, "the FLy pre-pass of V1's rejection sampler") {
  def_kernel<&apply_fly_greedy_acceptance>(m, "apply_fly_greedy_acceptance");
  def_kernel<&apply_fly_random_acceptance>(m, "apply_fly_random_acceptance");
}

}  // namespace specdiff
