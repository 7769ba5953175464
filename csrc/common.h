// Shared plumbing of the OpenMP port: dtype codes, typed views of caller buffers, and
// argument checks that raise Python exceptions naming the argument. No pybind11 here: a unit that
// includes it compiles for about ten seconds more (bindings.h is the binding units').
//
// The Python launch wrappers (cpu_impl/) pass every tensor as (data pointer, dtype code,
// element count) after checking its type, device, rank and contiguity against the
// contract. This layer checks the value-level invariants (cumulative counts, lengths,
// ids inside buffers) before anything is written, then computes with the GIL released.
#pragma once

#include <Python.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace specdiff {

// What a launch raises: ValueError and TypeError in Python (module.cpp translates them).
struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct TypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The GIL released for a kernel's computation, reacquired when the scope ends.
class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {}
  ~NoGil() { PyEval_RestoreThread(state_); }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* state_;
};

// Rows of a small per-request kernel (a few loads and stores each) below which OpenMP's fork and
// join (microseconds; 10 us at 16 threads on the Xeon) costs more than the rows themselves.
constexpr std::int64_t kParallelSmallRows = 16384;
// Tokens from which the per-token copies of K8 and K9 (several ids, positions and slots each) fork
// the whole team, on 2 cores and on 16 alike (docs/benchmarks.md: the dflash copy of 1024 requests).
constexpr std::int64_t kParallelCopyTokens = 4096;
// Rows that each gather from a large table (a cache miss per draft: K2's probabilities) or stream a
// vocabulary row are worth threads far sooner.
constexpr std::int64_t kParallelGatherRows = 256;

// A build with -DSPECDIFF_FORCE_PARALLEL=1 (the ThreadSanitizer session, conformance/tools/sanitize.py) runs
// every parallel region on the whole team, however small: the serial thresholds below would hide
// a race from every small Hypothesis case. (The threads check forces GCC builds at run time with a
// preload shim instead; LLVM's OpenMP runtime, which TSan needs, has other entry points.)
#ifndef SPECDIFF_FORCE_PARALLEL
#define SPECDIFF_FORCE_PARALLEL 0
#endif
inline bool parallel_if(bool wanted) { return SPECDIFF_FORCE_PARALLEL || wanted; }

// Whether `work` items give every thread of the team `per_thread` or more. A fork and join costs
// about a microsecond on 2 cores and several on 16 (docs/benchmarks.md), so the threshold grows with
// the team: 2 cores fork for a batch that 16 run serially.
inline bool worth_team(std::int64_t work, std::int64_t per_thread) {
  return parallel_if(work / omp_get_max_threads() >= per_thread);
}

// Vectorized streaming loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time, so the default build is fast on every machine.
// A build with -DSPECDIFF_CLONE=3 (AVX2) or =1 (baseline) compiles only that one, so that a machine
// which would pick another can still check it against the oracle (conformance/tools/clones.py).
#if defined(SPECDIFF_CLONE) && SPECDIFF_CLONE == 3
#define SPECDIFF_CLONES __attribute__((target("arch=x86-64-v3")))
#elif defined(SPECDIFF_CLONE) && SPECDIFF_CLONE == 1
#define SPECDIFF_CLONES
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SPECDIFF_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECDIFF_CLONES
#endif

// Whether the scan prefetches in software. Intel's L2 streamer stops at every 4 KiB page and ramps
// up again, which cost a third of the bandwidth of K4's nine-stream scans (16-core Xeon: 150
// against 128 GB/s at 64 x 4 x 151936); AMD Zen's prefetchers follow a stream across pages, and
// there the prefetch instructions only take load slots (Zen 5, 2 cores: 12 % slower with them).
// Results never depend on it.
constexpr std::int64_t kPrefetch = 2048;  // elements ahead: 8 KiB of float32 (Xeon: 150 GB/s, 141 at 4 KiB)

inline bool prefetch_streams() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool intel_like = !__builtin_cpu_is("amd");
  return intel_like;
#else
  return true;
#endif
}

// Must match cpu_impl/launcher.py.
enum DType : int { kInt32 = 0, kInt64 = 1, kFloat32 = 2, kFloat64 = 3, kBool = 4, kBFloat16 = 5, kFloat16 = 6, kUInt8 = 7 };

inline std::size_t element_size(int dtype) {
  switch (dtype) {
    case kInt64: case kFloat64: return 8;
    case kInt32: case kFloat32: return 4;
    case kBFloat16: case kFloat16: return 2;
    default: return 1;
  }
}

struct Buffer {
  std::uintptr_t ptr;
  int dtype;
  std::int64_t numel;
  bool present() const { return dtype >= 0; }  // an empty tensor may have a null data pointer
  template <class T>
  T* as() const { return reinterpret_cast<T*>(ptr); }
};

[[noreturn]] inline void fail(const char* kernel, const char* name, const std::string& what) {
  throw ValueError(std::string(kernel) + ": '" + name + "' " + what);
}

inline void need_len(const char* kernel, const char* name, const Buffer& b, std::int64_t n) {
  if (b.numel < n)
    fail(kernel, name, "must hold at least " + std::to_string(n) + " elements, has " + std::to_string(b.numel));
}

inline void need_at_least(const char* kernel, const char* name, std::int64_t value, std::int64_t low) {
  if (value < low) fail(kernel, name, "must be >= " + std::to_string(low) + ", got " + std::to_string(value));
}

// A scalar the kernel stores into `out` is representable in its dtype (the oracle cannot store it
// otherwise; a cast would wrap it).
inline void need_fits(const char* kernel, const char* name, std::int64_t value, const char* out_name, const Buffer& out) {
  if (out.dtype == kInt32 && (value < std::numeric_limits<std::int32_t>::min() || value > std::numeric_limits<std::int32_t>::max()))
    fail(kernel, name, std::string("must fit ") + out_name + "'s int32, got " + std::to_string(value));
}

// Checked size and index arithmetic (C32): a product or sum that leaves int64 is a ValueError
// naming the argument, never a wrapped count that a short buffer passes or a negative index.
// `what` states the quantity ("KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE").
inline std::int64_t checked_mul(const char* kernel, const char* name, std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    fail(kernel, name, std::string("makes ") + what + " = " + std::to_string(a) + " * " + std::to_string(b) + " overflow int64");
  return out;
}

inline std::int64_t checked_add(const char* kernel, const char* name, std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out))
    fail(kernel, name, std::string("makes ") + what + " = " + std::to_string(a) + " + " + std::to_string(b) + " overflow int64");
  return out;
}

// ceil(a / b) for a >= 0 and b >= 1, without forming a + b - 1 (which wraps for a near 2**63).
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

inline void need_power_of_two(const char* kernel, const char* name, std::int64_t value) {
  if (value < 1 || (value & (value - 1)) != 0)
    fail(kernel, name, "must be a power of two, got " + std::to_string(value));
}

// `rows` rows of `width` elements. The product is checked for overflow: a huge scalar (a
// vocabulary size of 2**62) must not wrap to a small count that a short buffer passes.
inline void need_len(const char* kernel, const char* name, const Buffer& b, std::int64_t rows, std::int64_t width) {
  std::int64_t n = 0;
  if (rows > 0 && width > 0 && __builtin_mul_overflow(rows, width, &n))
    fail(kernel, name,
         "must hold " + std::to_string(rows) + " rows of " + std::to_string(width) + " elements, more than any buffer, has " +
             std::to_string(b.numel));
  need_len(kernel, name, b, rows > 0 && width > 0 ? n : 0);
}

// Calls f(T{}) with T the C++ type of an integer buffer's dtype.
template <class F>
inline void with_int(const char* kernel, const char* name, int dtype, F&& f) {
  switch (dtype) {
    case kInt32: f(std::int32_t{}); return;
    case kInt64: f(std::int64_t{}); return;
    default: throw TypeError(std::string(kernel) + ": '" + name + "' must be int32 or int64");
  }
}

template <class F>
inline void with_float(const char* kernel, const char* name, int dtype, F&& f) {
  switch (dtype) {
    case kFloat32: f(float{}); return;
    case kFloat64: f(double{}); return;
    default: throw TypeError(std::string(kernel) + ": '" + name + "' must be float32 or float64");
  }
}

// Half-precision logits, read as float32 (exact conversions).
struct BFloat16 {
  std::uint16_t bits;
};
inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) {
  const std::uint32_t w = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
// IEEE binary16 by its bits (compilers without a _Float16 on x86, clang 14's among them, build this
// too). Its exponent and fraction, moved into float32's fields, read as 2^-112 times the value, so
// one exact multiplication rebiases normal and subnormal halves alike; infinities and NaNs (payload
// kept) are set directly.
struct Float16 {
  std::uint16_t bits;
};
inline float to_float(Float16 x) {
  const std::uint32_t magnitude = x.bits & 0x7fffu, sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  std::uint32_t w = magnitude << 13;
  float f;
  std::memcpy(&f, &w, sizeof f);
  f *= 0x1p112f;
  std::memcpy(&w, &f, sizeof w);
  if (magnitude >= 0x7c00u) w = 0x7f800000u | (magnitude & 0x3ffu) << 13;
  w |= sign;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

// Calls f(T{}) with T the C++ type of a logits buffer's dtype (float32, bfloat16, float16).
template <class F>
inline void with_logits(const char* kernel, const char* name, int dtype, F&& f) {
  switch (dtype) {
    case kFloat32: f(float{}); return;
    case kBFloat16: f(BFloat16{}); return;
    case kFloat16: f(Float16{}); return;
    default: throw TypeError(std::string(kernel) + ": '" + name + "' must be float32, bfloat16 or float16");
  }
}

// Inclusive cumulative counts (spec §1.2): start(0) is the constant 0, cu[-1] is never read.
template <class C>
struct Cumulative {
  const C* cu;
  std::int64_t start(std::int64_t r) const { return r == 0 ? 0 : static_cast<std::int64_t>(cu[r - 1]); }
  std::int64_t end(std::int64_t r) const { return static_cast<std::int64_t>(cu[r]); }
  std::int64_t count(std::int64_t r) const { return end(r) - start(r); }
};

// Checks cu is non-negative and non-decreasing; returns its total, T = cu[B-1] (0 if B = 0).
template <class C>
inline std::int64_t check_cumulative(const char* kernel, const char* name, const C* cu, std::int64_t b) {
  std::int64_t prev = 0;
  for (std::int64_t r = 0; r < b; ++r) {
    const std::int64_t v = cu[r];
    if (v < prev)
      fail(kernel, name,
           r == 0 ? "must start at a non-negative count" : "must be non-decreasing (entry " + std::to_string(r) + ")");
    prev = v;
  }
  return prev;
}

}  // namespace specdiff
