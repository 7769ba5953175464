// The extension module cpu_impl._C: one submodule per kernel family.
#include <omp.h>

#include <algorithm>
#include <string>

#include "bindings.h"

namespace specdiff {
void register_launcher(py::module_& m);

namespace {

// One argument as the kernel units' type named ``type`` takes it (launch.h: ArgAs<T>::name), through
// pybind11's casters (bindings.h for Buffer, Strided and Table), converting as m.def's dispatch did.
template <class T>
T load(const std::string& qual, std::size_t i, const char* type, PyObject* v) {
  py::detail::make_caster<T> caster;
  if (!caster.load(v, true))
    throw TypeError(qual + ": argument " + std::to_string(i) + " must be " + type + ", got " + Py_TYPE(v)->tp_name);
  return py::detail::cast_op<T>(caster);
}

Arg convert(const std::string& qual, std::size_t i, const char* type, PyObject* v) {
  Arg a{};
  const std::string t = type;
  if (t == "Buffer")
    a.tensor.data = load<Buffer>(qual, i, type, v);
  else if (t == "Strided")
    a.tensor = load<Strided>(qual, i, type, v);
  else if (t == "Table")
    a.table = load<Table>(qual, i, type, v);
  else if (t == "int")
    a.value = load<std::int64_t>(qual, i, type, v);
  else if (t == "float")
    a.real = load<double>(qual, i, type, v);
  else
    a.value = load<bool>(qual, i, type, v);
  return a;
}

// cpu_impl._C.<family>.<name>(*args): the entry point called with Python values (what tests and
// the signature check call; launches go through the Launcher's table instead). Its docstring's
// first line is the signature pybind11 would have written, which the signature check reads.
void define_entry(py::module_& sub, const std::string& family, const char* name, const Entry& e) {
  std::string sig = std::string(name) + "(";
  for (std::size_t i = 0; i < e.arity; ++i) sig += (i ? ", arg" : "arg") + std::to_string(i) + ": " + e.types[i];
  sig += ") -> None";
  const std::string qual = family + "." + name;
  py::options plain;
  plain.disable_function_signatures();
  sub.def(
      name,
      [e, qual](py::args args) {
        if (static_cast<std::size_t>(args.size()) != e.arity)
          throw TypeError(qual + " takes " + std::to_string(e.arity) + " arguments, got " + std::to_string(args.size()));
        std::vector<Arg> converted;
        converted.reserve(e.arity);
        for (std::size_t i = 0; i < e.arity; ++i) converted.push_back(convert(qual, i, e.types[i], args[i].ptr()));
        e.invoke(converted.data());
      },
      sig.c_str());
}

}  // namespace
}  // namespace specdiff

PYBIND11_MODULE(_C, m) {
  using namespace specdiff;
  m.doc() = "specdiff's OpenMP port of vLLM's speculative-decoding kernels";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  // One submodule per family unit that registered itself (SPECDIFF_FAMILY), in name order.
  auto all = families();
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return std::string(a.name) < b.name; });
  for (const auto& f : all) {
    auto sub = m.def_submodule(f.name, f.doc);
    if (f.probes != nullptr) f.probes(sub);
    if (f.kernels == nullptr) continue;
    Kernels kernels;
    f.kernels(kernels);
    for (const auto& [name, entry] : kernels.entries) {
      entries()[std::string(f.name) + "." + name] = entry;
      define_entry(sub, f.name, name, entry);
    }
  }
  register_launcher(m);
  m.def("max_threads", [] { return omp_get_max_threads(); });
  // OpenMP leaves a count below 1 undefined, and a huge one spawns threads until the process dies.
  m.def(
      "set_num_threads",
      [](long long threads) {
        constexpr long long kMaxThreads = 1024;
        if (threads < 1 || threads > kMaxThreads)
          throw ValueError("set_num_threads: 'threads' must be in [1, " + std::to_string(kMaxThreads) + "], got " +
                           std::to_string(threads));
        omp_set_num_threads(static_cast<int>(threads));
      },
      py::arg("threads"));
}
