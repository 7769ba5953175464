// Helpers of the ports of Model Runner V2's step kernels (csrc/input_batch.cpp,
// csrc/target_dependent_ar.cpp): per-request state read and written at either integer width, the
// checks of C37 computed exactly in 128 bits as the contracts compute them in Python integers, and
// error messages worded only when a check fails (never per row: building one per row was most of
// a small kernel's time).
#pragma once

#include <omp.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "metadata.h"

namespace specdiff {
namespace state {

using i128 = __int128;

// An int32 or int64 buffer read and written element by element (the launcher admitted only
// those): a store narrows as a Triton store does.
struct Ints {
  std::uintptr_t ptr;
  int dtype;
  explicit Ints(const Buffer& b) : ptr(b.ptr), dtype(b.dtype) {}
  explicit Ints(const Strided& t) : Ints(t.data) {}
  std::int64_t operator[](std::int64_t i) const {
    return dtype == kInt32 ? reinterpret_cast<const std::int32_t*>(ptr)[i] : reinterpret_cast<const std::int64_t*>(ptr)[i];
  }
  void set(std::int64_t i, std::int64_t v) const {
    if (dtype == kInt32)
      reinterpret_cast<std::int32_t*>(ptr)[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
    else
      reinterpret_cast<std::int64_t*>(ptr)[i] = v;
  }
};

// A message of parts (text and integers).
inline void append(std::string& out, const char* part) { out += part; }
inline void append(std::string& out, std::int64_t part) { out += std::to_string(part); }
template <class... Parts>
std::string words(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}

inline std::string str(i128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<std::int64_t>(v));
  return v < 0 ? "(below -2**63)" : "(above 2**63)";
}

// contracts/_checks.py: require_cells. [at, at + width) are elements of t; `what` words them.
template <class... What>
void need_cells(const char* kernel, const char* name, const Strided& t, i128 at, i128 width, const What&... what) {
  if (width <= 0) return;
  if (at < 0 || at > static_cast<i128>(INT64_MAX) - width)
    fail(kernel, name, "is accessed at flat index " + str(at) + " (" + words(what...) + "), outside it");
  if (!t.holds(static_cast<std::int64_t>(at), static_cast<std::int64_t>(width)))
    fail(kernel, name, "must hold flat indices [" + str(at) + ", " + str(at + width) + ") (" + words(what...) + ")");
}

// C37: every sum the kernels form fits int32; `what` words the quantity.
template <class... What>
void need_int32(const char* kernel, const char* name, i128 v, const What&... what) {
  if (v < INT32_MIN || v > INT32_MAX) fail(kernel, name, "makes " + words(what...) + " = " + str(v) + ", outside int32");
}

// A contiguous buffer as one run of elements.
inline Strided flat(const Buffer& b) { return Strided{b, 1, b.numel, b.numel}; }

// f(b) for every batch row, in parallel past `work` elements of work: no two rows write one element.
template <class F>
void rows(std::int64_t n, std::int64_t work, F&& f) {
  NoGil nogil;
#pragma omp parallel for if (parallel_if(work >= kParallelCopyTokens)) schedule(static)
  for (std::int64_t b = 0; b < n; ++b) f(b);
}

}  // namespace state
}  // namespace specdiff
