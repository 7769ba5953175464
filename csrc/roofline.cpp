// The benchmarks' read roofline, measured with a reader shaped like K4's scan (not a kernel).
//
// A roofline must be a bound: a kernel that beats it is a harness error. torch's sum and dot read
// one or two streams per thread without software prefetch, and on the 16-core Xeon K4's
// nine-stream scan, which prefetches across 4 KiB pages there, read faster than both. This reader
// sums a float32 buffer as K4 scans: every thread takes a contiguous share and reads `streams`
// slices of it side by side, 64-byte vectors, with K4's prefetch policy.
#include <omp.h>

#include "bindings.h"
#include "common.h"

namespace specdiff {
namespace {

typedef float VF __attribute__((vector_size(64), aligned(4), may_alias));
constexpr int kLanes = 16;
constexpr int kMaxStreams = 16;

template <bool Prefetch>
[[gnu::always_inline]] inline float sum_streams(const float* x, std::int64_t len, int streams) {
  const std::int64_t slice = len / streams / kLanes * kLanes;
  VF acc[kMaxStreams] = {};
  for (std::int64_t i = 0; i < slice; i += kLanes)
    for (int s = 0; s < streams; ++s) {
      if constexpr (Prefetch) __builtin_prefetch(x + s * slice + i + kPrefetch, 0, 3);
      acc[s] += *reinterpret_cast<const VF*>(x + s * slice + i);
    }
  float total = 0.0f;
  for (int s = 0; s < streams; ++s)
    for (int l = 0; l < kLanes; ++l) total += acc[s][l];
  return total;
}

SPECDIFF_CLONES float sum_streams_prefetch(const float* x, std::int64_t len, int streams) {
  return sum_streams<true>(x, len, streams);
}
SPECDIFF_CLONES float sum_streams_hw(const float* x, std::int64_t len, int streams) {
  return sum_streams<false>(x, len, streams);
}

// The sum of the first (numel / threads / streams / 16) * 16 elements of every stream slice of
// every thread's share (a checksum: its value only keeps the reads from being optimized away).
double read_streams(Buffer x, std::int64_t streams) {
  constexpr const char* kName = "read_streams";
  if (x.dtype != kFloat32) throw py::type_error(std::string(kName) + ": 'x' must be float32");
  if (streams < 1 || streams > kMaxStreams)
    fail(kName, "streams", "must be in [1, " + std::to_string(kMaxStreams) + "], got " + std::to_string(streams));
  const float* data = x.as<float>();
  auto* const sum = prefetch_streams() ? sum_streams_prefetch : sum_streams_hw;
  double total = 0.0;
  py::gil_scoped_release nogil;
#pragma omp parallel reduction(+ : total)
  {
    const std::int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
    const std::int64_t share = x.numel / n;
    total += sum(data + t * share, share, static_cast<int>(streams));
  }
  return total;
}

}  // namespace

SPECDIFF_PROBES(roofline, "the benchmarks' read roofline (not a kernel)") {
  m.def("read_streams", &read_streams, py::arg("x"), py::arg("streams"),
        "Sum a float32 buffer as K4 reads: per thread, `streams` slices side by side (the read roofline).");
}

}  // namespace specdiff
