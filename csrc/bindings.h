// pybind11 for the units that bind Python functions themselves: the module, the launcher and the
// probes (gumbel, roofline). Kernel units include launch.h alone and compile without it.
#pragma once

#include <pybind11/pybind11.h>

#include "launch.h"

namespace specdiff {
namespace py = pybind11;
}  // namespace specdiff

// SPECDIFF_PROBES(gumbel, "doc") { m.def("philox", &philox); } defines cpu_impl._C.gumbel, whose
// functions are probes for tests and benchmarks, not kernels.
#define SPECDIFF_PROBES(NAME, DOC)                                                                 \
  static void define_##NAME(::pybind11::module_& m);                                              \
  static const ::specdiff::RegisterFamily registered_##NAME({#NAME, DOC, nullptr, define_##NAME}); \
  static void define_##NAME(::pybind11::module_& m)

// A Buffer arrives from Python as a (data_ptr, dtype code, numel) tuple, or None for an absent
// optional tensor; a Strided as (data_ptr, dtype code, numel, rows, cols, row_stride); a Table as a
// tuple of Strided tuples (see
// CpuKernel.convert, cpu_impl/launcher.py).
namespace pybind11::detail {
template <>
struct type_caster<specdiff::Buffer> {
  PYBIND11_TYPE_CASTER(specdiff::Buffer, const_name("Buffer"));
  bool load(handle src, bool) {
    if (src.is_none()) {
      value = {0, -1, 0};
      return true;
    }
    if (!PyTuple_Check(src.ptr()) || PyTuple_GET_SIZE(src.ptr()) != 3) return false;
    PyObject* t = src.ptr();
    value.ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0)));
    value.dtype = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(t, 1)));
    value.numel = static_cast<std::int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2)));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  static handle cast(const specdiff::Buffer&, return_value_policy, handle) { return none().release(); }
};
template <>
struct type_caster<specdiff::Strided> {
  PYBIND11_TYPE_CASTER(specdiff::Strided, const_name("Strided"));
  bool load(handle src, bool) {
    if (!PyTuple_Check(src.ptr()) || PyTuple_GET_SIZE(src.ptr()) != 6) return false;
    PyObject* t = src.ptr();
    value.data.ptr = static_cast<std::uintptr_t>(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0)));
    value.data.dtype = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(t, 1)));
    value.data.numel = static_cast<std::int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2)));
    value.rows = static_cast<std::int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3)));
    value.cols = static_cast<std::int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4)));
    value.row_stride = static_cast<std::int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(t, 5)));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  static handle cast(const specdiff::Strided&, return_value_policy, handle) { return none().release(); }
};
template <>
struct type_caster<specdiff::Table> {
  PYBIND11_TYPE_CASTER(specdiff::Table, const_name("Table"));
  // A tuple or list of Strided tuples, one per KV-cache group.
  bool load(handle src, bool convert) {
    if (!PyTuple_Check(src.ptr()) && !PyList_Check(src.ptr())) return false;
    value.clear();
    for (const handle item : reinterpret_borrow<sequence>(src)) {
      make_caster<specdiff::Strided> one;
      if (!one.load(item, convert)) return false;
      value.push_back(cast_op<specdiff::Strided>(one));
    }
    return true;
  }
  static handle cast(const specdiff::Table&, return_value_policy, handle) { return none().release(); }
};
}  // namespace pybind11::detail
