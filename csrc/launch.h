// The C++ half of a launch. Every entry point is registered twice: as a Python function,
// cpu_impl._C.<family>.<name>, taking (data_ptr, dtype code, numel) tuples (what tests and the
// signature check call), and in a table that cpu_impl._C.Launcher calls directly with arguments
// it converted from the launch's tensors itself. A small kernel at 256 requests runs in about a
// microsecond; checking and converting five tensors attribute by attribute in Python took two
// more, and pybind11's dispatch of the tuples another half.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "metadata.h"

namespace pybind11 {
class module_;
}

namespace specdiff {

// A pointer table's tensors (Param.table: one per KV-cache group), each a 2-D Strided.
using Table = std::vector<Strided>;

// One converted argument: a tensor (its Buffer, and the row geometry a Strided parameter needs),
// a pointer table, or an integer (scalars and constexpr flags).
struct Arg {
  Strided tensor;
  std::int64_t value;
  double real;  // a float scalar (Param.dtypes == (float32,)): Triton passes it as float32
  Table table;
};

template <class T>
struct ArgAs;
template <>
struct ArgAs<Buffer> {
  static constexpr const char* name = "Buffer";  // as Python sees it
  static Buffer get(const Arg& a) { return a.tensor.data; }
};
template <>
struct ArgAs<Strided> {
  static constexpr const char* name = "Strided";  // as Python sees it
  static Strided get(const Arg& a) { return a.tensor; }
};
template <>
struct ArgAs<Table> {
  static constexpr const char* name = "Table";  // as Python sees it
  static const Table& get(const Arg& a) { return a.table; }
};
template <>
struct ArgAs<std::int64_t> {
  static constexpr const char* name = "int";  // as Python sees it
  static std::int64_t get(const Arg& a) { return a.value; }
};
template <>
struct ArgAs<float> {
  static constexpr const char* name = "float";  // as Python sees it
  static float get(const Arg& a) { return static_cast<float>(a.real); }  // rounded to nearest, as Triton packs it
};
template <>
struct ArgAs<bool> {
  static constexpr const char* name = "bool";  // as Python sees it
  static bool get(const Arg& a) { return a.value != 0; }  // as pybind11 converts an int: bool()
};

struct Entry {
  void (*invoke)(const Arg*);
  std::size_t arity;
  const char* const* types;  // each argument's type as Python sees it: Buffer, Strided, Table, int, float, bool
};

// "<family>.<name>" -> entry point; filled while the module initialises, read-only afterwards.
std::map<std::string, Entry>& entries();

template <auto F, class... A, std::size_t... I>
void invoke_with(const Arg* a, void (*)(A...), std::index_sequence<I...>) {
  F(ArgAs<A>::get(a[I])...);
}

template <auto F, class... A>
Entry entry_of(void (*)(A...)) {
  static constexpr const char* types[] = {ArgAs<A>::name..., nullptr};
  return {[](const Arg* a) { invoke_with<F>(a, F, std::index_sequence_for<A...>{}); }, sizeof...(A), types};
}

// A family's kernels, as its unit declares them (SPECDIFF_FAMILY below).
struct Kernels {
  std::vector<std::pair<const char*, Entry>> entries;
};

// Registers entry point F as cpu_impl._C.<family>.<name> (module.cpp makes the Python function) and
// in the launcher's table.
template <auto F>
void def_kernel(Kernels& m, const char* name) {
  m.entries.emplace_back(name, entry_of<F>(F));
}

// A submodule cpu_impl._C.<name>: each family's unit registers itself while the library loads
// (SPECDIFF_FAMILY below), so a new family adds its .cpp file and nothing else. A unit of probes
// that bind their own Python functions registers `probes` instead (bindings.h: SPECDIFF_PROBES).
struct Family {
  const char* name;
  const char* doc;
  void (*kernels)(Kernels&);
  void (*probes)(pybind11::module_&);
};
std::vector<Family>& families();
struct RegisterFamily {
  RegisterFamily(const Family& f) { families().push_back(f); }
};

// SPECDIFF_FAMILY(fly, "doc") { def_kernel<&f>(m, "f"); } defines cpu_impl._C.fly.
#define SPECDIFF_FAMILY(NAME, DOC)                                                                 \
  static void define_##NAME(::specdiff::Kernels& m);                                              \
  static const ::specdiff::RegisterFamily registered_##NAME({#NAME, DOC, define_##NAME, nullptr}); \
  static void define_##NAME(::specdiff::Kernels& m)

}  // namespace specdiff
