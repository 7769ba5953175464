// The extension module cpu_impl._C: one submodule per kernel family.
#include <omp.h>

#include <algorithm>
#include <string>

#include "launch.h"

namespace specdiff {
void register_launcher(py::module_& m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdiff's OpenMP port of vLLM's speculative-decoding kernels";
  // One submodule per family unit that registered itself (SPECDIFF_FAMILY), in name order.
  auto all = specdiff::families();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return std::string(a.name) < b.name; });
  for (const auto& f : all) {
    auto sub = m.def_submodule(f.name, f.doc);
    f.define(sub);
  }
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
