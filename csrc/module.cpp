// The extension module cpu_impl._C: one submodule per kernel family.
#include <omp.h>

#include "common.h"

namespace specdiff {
void register_rejection(py::module_& m);
void register_eagle(py::module_& m);
void register_dflash(py::module_& m);
void register_slot_mapping(py::module_& m);
void register_mrv2(py::module_& m);
void register_fly(py::module_& m);
void register_async_update(py::module_& m);
void register_topk_topp(py::module_& m);
void register_gumbel(py::module_& m);
void register_roofline(py::module_& m);
void register_launcher(py::module_& m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdiff's OpenMP port of vLLM's speculative-decoding kernels";
  auto rejection = m.def_submodule("rejection", "rejection-sampler family");
  specdiff::register_rejection(rejection);
  auto eagle = m.def_submodule("eagle", "EAGLE input preparation");
  specdiff::register_eagle(eagle);
  auto dflash = m.def_submodule("dflash", "DFlash input preparation");
  specdiff::register_dflash(dflash);
  auto slot_mapping = m.def_submodule("slot_mapping", "KV slot mapping");
  specdiff::register_slot_mapping(slot_mapping);
  auto mrv2 = m.def_submodule("mrv2", "Model Runner V2's rejection sampler");
  specdiff::register_mrv2(mrv2);
  auto fly = m.def_submodule("fly", "the FLy pre-pass of V1's rejection sampler");
  specdiff::register_fly(fly);
  auto async_update = m.def_submodule("async_update", "the async-scheduling update of num_computed_tokens");
  specdiff::register_async_update(async_update);
  auto topk_topp = m.def_submodule("topk_topp", "the top-k/top-p mask");
  specdiff::register_topk_topp(topk_topp);
  auto gumbel = m.def_submodule("gumbel", "MRV2's random streams and numerics, as probes (not kernels)");
  specdiff::register_gumbel(gumbel);
  auto roofline = m.def_submodule("roofline", "the benchmarks' read roofline (not a kernel)");
  specdiff::register_roofline(roofline);
  specdiff::register_launcher(m);
  m.def("max_threads", [] { return omp_get_max_threads(); });
  // OpenMP leaves a count below 1 undefined, and a huge one spawns threads until the process dies.
  m.def(
      "set_num_threads",
      [](long long threads) {
        constexpr long long kMaxThreads = 1024;
        if (threads < 1 || threads > kMaxThreads)
          throw pybind11::value_error("set_num_threads: 'threads' must be in [1, " + std::to_string(kMaxThreads) + "], got " +
                                std::to_string(threads));
        omp_set_num_threads(static_cast<int>(threads));
      },
      pybind11::arg("threads"));
}
