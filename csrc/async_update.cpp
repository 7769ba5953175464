// C++ port of the async-scheduling update (docs/async_update.md, C34).
//
// vLLM 0.33.0 runs it as a torch.compile'd PyTorch function with no range checks; here every
// previous position is checked before anything is read, every value is gathered before anything
// is written (a request's previous slot may be another request's new one), and a new request
// (negative position) reads nothing.
#include <omp.h>

#include <string>
#include <vector>

#include "common.h"
#include "launch.h"

namespace specdiff {
namespace {

constexpr const char* kUpdate = "update_num_computed_tokens_for_batch_change";

struct Gathered {
  bool participating;
  std::int32_t computed;
  std::int32_t valid;
};

void update_num_computed_tokens_for_batch_change(Buffer num_computed, Buffer num_accepted, Buffer prev_positions,
                                                 Buffer valid_count, Buffer prev_drafts, Buffer cpu_computed) {
  const std::int64_t n = prev_positions.numel;
  for (auto [name, b] : {std::pair{"num_accepted_tokens", &num_accepted}, std::pair{"cpu_num_computed_tokens", &cpu_computed}})
    if (b->numel != n)
      fail(kUpdate, name, "must hold exactly len(prev_positions) = " + std::to_string(n) + " elements, has " +
                              std::to_string(b->numel));
  need_len(kUpdate, "num_computed_tokens", num_computed, n);
  with_int(kUpdate, "prev_positions", prev_positions.dtype, [&](auto p_) {
    with_int(kUpdate, "prev_num_draft_tokens", prev_drafts.dtype, [&](auto d_) {
      using P = decltype(p_);
      using D = decltype(d_);
      const P* prev = prev_positions.as<P>();
      const D* drafts = prev_drafts.as<D>();
      std::int32_t* computed = num_computed.as<std::int32_t>();
      std::int32_t* accepted = num_accepted.as<std::int32_t>();
      const std::int32_t* valid = valid_count.as<std::int32_t>();
      const std::int32_t* cpu = cpu_computed.as<std::int32_t>();
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = prev[i];
        for (auto [name, size] : {std::pair{"valid_sampled_token_count", valid_count.numel},
                                  std::pair{"prev_num_draft_tokens", prev_drafts.numel},
                                  std::pair{"num_computed_tokens", num_computed.numel}})
          if (p >= size)
            fail(kUpdate, "prev_positions",
                 "entry " + std::to_string(i) + " = " + std::to_string(p) + " indexes '" + name + "' of " +
                     std::to_string(size) + " elements (must be < " + std::to_string(size) +
                     ", or negative for a new request)");
      }
      std::vector<Gathered> g(n);
      NoGil nogil;
#pragma omp parallel if (parallel_if(n >= kParallelSmallRows))
      {
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t p = prev[i];
          g[i] = p < 0 ? Gathered{false, 0, 0} : Gathered{drafts[p] > 0, computed[p], valid[p]};
        }
        // The implicit barrier: every gather is done before the first write.
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < n; ++i) {
          if (g[i].participating) {
            // int32 addition wraps, as the engine's does (C32: value arithmetic wraps).
            computed[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(g[i].computed) +
                                                    static_cast<std::uint32_t>(g[i].valid));
            accepted[i] = g[i].valid;
          } else {
            computed[i] = cpu[i];
          }
        }
      }
    });
  });
}

}  // namespace

SPECDIFF_FAMILY(async_update, "the async-scheduling update of num_computed_tokens") {
  def_kernel<&update_num_computed_tokens_for_batch_change>(m, "update_num_computed_tokens_for_batch_change");
}

}  // namespace specdiff
