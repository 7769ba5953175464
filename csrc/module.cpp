// The extension module cpu_impl._C: one submodule per kernel family.
#include <omp.h>

#include <algorithm>
#include <string>

#include "bindings.h"

namespace specdiff {
void register_launcher(py::module_& m);

namespace {

[[noreturn]] void wrong_argument(const std::string& qual, std::size_t i, const char* type, PyObject* v) {
  throw TypeError(qual + ": argument " + std::to_string(i) + " must be " + type + ", got " + Py_TYPE(v)->tp_name);
}

std::int64_t int_of(const std::string& qual, std::size_t i, PyObject* v) {
  const long long x = PyLong_Check(v) ? PyLong_AsLongLong(v) : -1;
  if (!PyLong_Check(v) || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    wrong_argument(qual, i, "an int64", v);
  }
  return x;
}

// Arguments as the kernel units' types take them: Buffer (data_ptr, dtype code, numel) or None,
// Strided (data_ptr, dtype code, numel, rows, cols, row_stride), int, float, bool.
Arg convert(const std::string& qual, std::size_t i, const char* type, PyObject* v) {
  Arg a{};
  const std::string t = type;
  if (t == "Buffer" || t == "Strided") {
    const Py_ssize_t n = t == "Buffer" ? 3 : 6;
    if (t == "Buffer" && v == Py_None) {
      a.tensor.data = {0, -1, 0};
      return a;
    }
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != n) wrong_argument(qual, i, type, v);
    const unsigned long long ptr = PyLong_Check(PyTuple_GET_ITEM(v, 0)) ? PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(v, 0)) : 0;
    if (PyErr_Occurred() || !PyLong_Check(PyTuple_GET_ITEM(v, 0))) {
      PyErr_Clear();
      wrong_argument(qual, i, "a data pointer first", v);
    }
    std::int64_t f[6] = {};
    for (Py_ssize_t k = 1; k < n; ++k) f[k] = int_of(qual, i, PyTuple_GET_ITEM(v, k));
    a.tensor.data = {static_cast<std::uintptr_t>(ptr), static_cast<int>(f[1]), f[2]};
    a.tensor.rows = f[3];
    a.tensor.cols = f[4];
    a.tensor.row_stride = f[5];
  } else if (t == "int") {
    a.value = int_of(qual, i, v);
  } else if (t == "float") {
    a.real = PyFloat_AsDouble(v);
    if (a.real == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      wrong_argument(qual, i, "a float", v);
    }
  } else {
    const int truth = PyObject_IsTrue(v);
    if (truth < 0) {
      PyErr_Clear();
      wrong_argument(qual, i, "a bool", v);
    }
    a.value = truth;
  }
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
