// cpu_impl._C.Launcher: a launch's type-level checks and conversion, and the call of the entry
// point, in one C++ pass over the bound arguments. The checks are the contract's, handed over
// as data by cpu_impl/launcher.py (one tuple per parameter); a launch they refuse is worded in
// Python by the contract itself, so the messages live in one place.
#include "bindings.h"

#include <vector>

namespace specdiff {

std::map<std::string, Entry>& entries() {
  static std::map<std::string, Entry> table;
  return table;
}

std::vector<Family>& families() {
  static std::vector<Family> all;  // constructed on first use: units register in any order
  return all;
}

namespace {

// Owned reference to a new object, or the pending Python error rethrown.
py::object own(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

std::int64_t as_int64(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// One fact of a tensor: an attribute (``dtype``) or a method called without arguments
// (``is_contiguous()``). For an exact torch.Tensor it is read through the C function of its
// descriptor on torch._C.TensorBase, found once: the attribute lookup and the method-call
// machinery were half of a launch's cost. Subclasses (which may redefine it in Python) and
// anything the descriptor does not describe go through the ordinary attribute protocol.
class Fact {
 public:
  Fact(const char* name, bool method) : name_(name), method_(method) {}

  void bind(PyTypeObject* tensor) {
    PyObject* d = _PyType_Lookup(tensor, name_.ptr());  // borrowed
    if (d == nullptr) return;
    if (!method_ && Py_IS_TYPE(d, &PyGetSetDescr_Type)) {
      get_ = reinterpret_cast<PyGetSetDescrObject*>(d)->d_getset;
    } else if (method_ && Py_IS_TYPE(d, &PyMethodDescr_Type)) {
      const PyMethodDef* m = reinterpret_cast<PyMethodDescrObject*>(d)->d_method;
      const int kind = m->ml_flags & (METH_VARARGS | METH_FASTCALL | METH_NOARGS | METH_O | METH_KEYWORDS);
      if (kind == METH_NOARGS || kind == (METH_VARARGS | METH_KEYWORDS) || kind == METH_VARARGS) meth_ = m;
    }
    exact_ = tensor;
  }

  // A new reference, or null with the Python error set.
  PyObject* of(PyObject* v) const {
    if (Py_TYPE(v) == exact_) {
      if (get_ != nullptr) return get_->get(v, get_->closure);
      if (meth_ != nullptr) {
        if (meth_->ml_flags & METH_NOARGS) return meth_->ml_meth(v, nullptr);
        static PyObject* const none = PyTuple_New(0);
        if (meth_->ml_flags & METH_KEYWORDS)
          return reinterpret_cast<PyCFunctionWithKeywords>(reinterpret_cast<void (*)()>(meth_->ml_meth))(v, none, nullptr);
        return meth_->ml_meth(v, none);
      }
    }
    if (!method_) return PyObject_GetAttr(v, name_.ptr());
    PyObject* stack[] = {nullptr, v};  // PY_VECTORCALL_ARGUMENTS_OFFSET: the callee may borrow the slot in front
    return PyObject_VectorcallMethod(name_.ptr(), stack + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  }

 private:
  py::str name_;
  bool method_;
  PyTypeObject* exact_ = nullptr;
  PyGetSetDef* get_ = nullptr;
  const PyMethodDef* meth_ = nullptr;
};

class Launcher {
 public:
  Launcher(const std::string& family, const std::string& name, const py::sequence& plan, const py::sequence& flags,
           py::object tensor_type, py::object module, py::object check, py::object stand_in)
      : tensor_type_(std::move(tensor_type)),
        module_(std::move(module)),
        entry_name_(name),
        check_(std::move(check)),
        stand_in_(std::move(stand_in)) {
    const auto found = entries().find(family + "." + name);
    if (found == entries().end()) throw py::value_error("no C++ entry point " + family + "." + name);
    entry_ = found->second;
    if (static_cast<std::size_t>(py::len(plan)) != entry_.arity)
      throw py::value_error(family + "." + name + " takes " + std::to_string(entry_.arity) + " arguments, the plan has " +
                            std::to_string(py::len(plan)));
    // (name, is_ptr, optional, int_zero, {dtype: code}, contiguous, ranks, written, may alias,
    // table): cpu_impl/launcher.py.
    for (const py::handle item : plan) {
      const auto t = item.cast<py::tuple>();
      Param p;
      PyObject* name = t[0].cast<py::str>().release().ptr();
      PyUnicode_InternInPlace(&name);  // the launch's keyword names are interned: found by identity
      p.name = py::reinterpret_steal<py::str>(name);
      p.ptr = t[1].cast<bool>();
      p.optional = t[2].cast<bool>();
      p.int_zero = t[3].cast<bool>();
      for (const auto kv : t[4].cast<py::dict>()) p.codes.emplace_back(py::reinterpret_borrow<py::object>(kv.first), kv.second.cast<int>());
      p.contiguous = t[5].cast<bool>();
      for (const py::handle r : t[6]) p.ranks |= 1u << r.cast<unsigned>();
      p.written = t[7].cast<bool>();
      p.may_alias = t[8].cast<std::string>();
      p.table = t[9].cast<bool>();
      params_.push_back(std::move(p));
    }
    for (std::size_t i = 0; i < params_.size(); ++i)
      for (std::size_t j = 0; j < params_.size(); ++j)
        if (params_[i].may_alias == std::string(py::str(params_[j].name))) params_[i].alias = j;
    // snapshot(): read-only contiguous tensors no written parameter may alias, decided once here.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      p.copied = p.ptr && !p.table && !p.written && p.contiguous && p.alias == SIZE_MAX;
      for (const Param& q : params_) p.copied = p.copied && q.alias != i;
    }
    native_ = module_.attr(entry_name_);
    // torch.Tensor itself: the exact type whose facts are read through their descriptors.
    for (Fact* f : {&layout_, &is_neg_, &requires_grad_, &dtype_, &is_cpu_, &shape_, &is_contiguous_, &data_ptr_})
      f->bind(reinterpret_cast<PyTypeObject*>(tensor_type_.ptr()));
    // (constexpr, tensor parameter, expect): the contract's Flag (C26), its test called as it is.
    for (const py::handle item : flags) {
      const auto t = item.cast<py::tuple>();
      flags_.push_back({t[0].cast<py::str>(), t[1].cast<py::str>(), t[2]});
    }
  }

  // Converts the bound launch, checks the flags, calls the value check unless it is None, then
  // the entry point: the native one, or a Python stand-in (given at construction, or put in the
  // submodule in its place) called with the Python entry's arguments. Returns kLaunched once the
  // entry point ran, or kRefused when an argument breaks the type-level contract; then nothing
  // was called and nothing written.
  int run(const py::dict& bound) {
    std::vector<Arg> args;
    if (!convert_all(bound, args) || overlapping(bound, args)) return kRefused;
    for (const Flag& f : flags_) {
      const int flag = PyObject_IsTrue(bound[f.constexpr_].ptr());
      if (flag < 0) throw py::error_already_set();
      const int want = PyObject_IsTrue(f.expect(bound[f.tensor]).ptr());
      if (want < 0) throw py::error_already_set();
      if (flag != want) return kRefused;
    }
    if (!check_.is_none()) check_(bound);
    const py::object current = own(PyObject_GetAttr(module_.ptr(), entry_name_.ptr()));
    const py::object& stand_in = stand_in_.is_none() && current.ptr() != native_.ptr() ? current : stand_in_;
    if (stand_in.is_none()) {
      std::vector<std::vector<unsigned char>> copies;
      snapshot(args, copies);
      entry_.invoke(args.data());
    } else {
      stand_in(*python_args(bound, args));
    }
    return kLaunched;
  }

  static constexpr int kLaunched = 0, kRefused = 1;

  // The native entry's Python arguments for the bound launch, or None when it breaks the
  // type-level contract.
  py::object python(const py::dict& bound) {
    std::vector<Arg> args;
    if (!convert_all(bound, args) || overlapping(bound, args)) return py::none();
    return python_args(bound, args);
  }

 private:
  struct Param {
    py::str name;
    bool ptr = false, optional = false, int_zero = false, contiguous = true, written = false, table = false;
    bool copied = false;             // an integer tensor of it is copied before the entry point reads it
    std::string may_alias;           // the one parameter this one may be (the same tensor object)
    std::size_t alias = SIZE_MAX;    // its index
    std::vector<std::pair<py::object, int>> codes;  // dtype object -> C++ dtype code
    unsigned ranks = 0;                              // bit n: n dimensions allowed
  };

  bool convert_all(const py::dict& bound, std::vector<Arg>& args) const {
    args.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!convert(params_[i], bound, args[i])) return false;
    return true;
  }

  // C31 (KernelSpec.check_overlap): a written tensor shares no byte with another tensor argument,
  // unless the contract declares the pair and both are the same elements (contracts.spec.same_elements).
  // A pointer table's tensors count one by one, as the table's parameter.
  bool overlapping(const py::dict& bound, const std::vector<Arg>& args) const {
    // (parameter, tensor); kept per thread so that a launch allocates nothing once warm
    thread_local std::vector<std::pair<std::size_t, const Strided*>> all;
    all.clear();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].table)
        for (const Strided& t : args[i].table) all.emplace_back(i, &t);
      else
        all.emplace_back(i, &args[i].tensor);
    }
    for (std::size_t a = 0; a < all.size(); ++a) {
      const auto [i, ti] = all[a];
      const auto [lo, hi] = span(*ti);
      if (lo == hi) continue;
      for (std::size_t b = a + 1; b < all.size(); ++b) {
        const auto [j, tj] = all[b];
        if (!params_[i].written && !params_[j].written) continue;
        const auto [lo2, hi2] = span(*tj);
        if (!(lo < hi2 && lo2 < hi)) continue;
        const bool declared = i != j && (params_[i].alias == j || params_[j].alias == i);
        if (!declared || !same_elements(*ti, *tj)) return true;
      }
    }
    return false;
  }

  // Element k of one is element k of the other: the same first element, dtype and layout.
  static bool same_elements(const Strided& a, const Strided& b) {
    return a.data.ptr == b.data.ptr && a.data.dtype == b.data.dtype && a.data.numel == b.data.numel &&
           a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride;
  }

  // The bytes [lo, hi) a converted tensor's elements lie in (lo == hi: none, or no tensor). The
  // sizes come from a live tensor, so its extent fits in memory and nothing here overflows.
  static std::pair<std::uintptr_t, std::uintptr_t> span(const Strided& t) {
    if (!t.data.present() || t.data.numel == 0 || t.rows <= 0 || t.cols <= 0) return {0, 0};
    const auto extent = static_cast<std::uintptr_t>((t.rows - 1) * t.row_stride + t.cols);
    return {t.data.ptr, t.data.ptr + extent * element_size(t.data.dtype)};
  }

  // The integer inputs a kernel validates and then reads again with the GIL released (counts,
  // offsets, token ids, positions) are copied first and the entry point reads the copies: a
  // Python thread rewriting the caller's tensor mid-launch can no longer change a count after its
  // check and send a loop past a buffer. 2-D tables (block tables: values, never addresses) and
  // floats stay zero-copy; a tensor a written parameter may alias is read in place, as it must be.
  void snapshot(std::vector<Arg>& args, std::vector<std::vector<unsigned char>>& copies) const {
    copies.reserve(params_.size());  // the copies' buffers never move while a launch reads them
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Param& p = params_[i];
      Buffer& b = args[i].tensor.data;
      if (!p.copied || !b.present() || b.numel == 0 || (b.dtype != kInt32 && b.dtype != kInt64)) continue;
      const std::size_t bytes = static_cast<std::size_t>(b.numel) * element_size(b.dtype);
      copies.emplace_back(reinterpret_cast<const unsigned char*>(b.ptr), reinterpret_cast<const unsigned char*>(b.ptr) + bytes);
      b.ptr = reinterpret_cast<std::uintptr_t>(copies.back().data());
    }
  }

  static void absent(Arg& out) { out.tensor = Strided{Buffer{0, -1, 0}, 0, 0, 0}; }

  // PY_VECTORCALL_ARGUMENTS_OFFSET lets the callee borrow the slot before the arguments.
  std::int64_t call_int(PyObject* v, const py::str& method, long arg) const {
    const py::object a = own(PyLong_FromLong(arg));
    PyObject* stack[] = {nullptr, v, a.ptr()};
    return as_int64(own(PyObject_VectorcallMethod(method.ptr(), stack + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr)).ptr());
  }

  // One parameter, as cpu_impl/launcher.py's contract plan says; false: refused.
  bool convert(const Param& p, const py::dict& bound, Arg& out) const {
    PyObject* v = PyDict_GetItemWithError(bound.ptr(), p.name.ptr());  // borrowed
    if (v == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return false;
    }
    if (!p.ptr && !p.codes.empty()) {  // a float scalar: a Python float, or an int within int64
      if (PyFloat_Check(v)) {
        out.real = PyFloat_AsDouble(v);
        return true;
      }
      if (!PyLong_Check(v)) return false;
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow != 0) return false;
      if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
      out.real = static_cast<double>(x);
      return true;
    }
    if (!p.ptr) {
      if (!PyLong_Check(v)) return false;
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow != 0) return false;  // outside int64: the contract's check_scalars names it
      if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
      out.value = x;
      return true;
    }
    if (v == Py_None) {
      absent(out);
      return p.optional;
    }
    if (p.int_zero && PyLong_CheckExact(v)) {  // the integer 0 stands for no tensor (K9)
      int overflow = 0;
      const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
      if (overflow == 0 && x == 0) {
        absent(out);
        return true;
      }
    }
    if (p.table) {  // a tuple or list of tensors, one per KV-cache group (never raw addresses)
      if (!PyTuple_Check(v) && !PyList_Check(v)) return false;
      const py::sequence items = py::reinterpret_borrow<py::sequence>(v);
      out.table.resize(static_cast<std::size_t>(py::len(items)));
      for (std::size_t g = 0; g < out.table.size(); ++g)
        if (!tensor(p, items[g].ptr(), out.table[g])) return false;
      return true;
    }
    return tensor(p, v, out.tensor);
  }

  // One tensor argument, or one of a pointer table's; false: refused.
  bool tensor(const Param& p, PyObject* v, Strided& out) const {
    const int is_tensor = PyObject_IsInstance(v, tensor_type_.ptr());
    if (is_tensor < 0) throw py::error_already_set();
    if (is_tensor == 0) return false;
    // KernelSpec.check_types: a dense layout (asked first: a sparse tensor has no contiguity), no
    // lazy negation or conjugation (memory holds other values than the tensor), no autograd on a
    // written tensor, and data behind a non-empty tensor (a fake tensor reports the CPU and a null
    // pointer).
    if (own(layout_.of(v)).ptr() != strided_.ptr()) return false;
    // The conjugate bit exists only on complex tensors, which no contract accepts (torch asserts
    // so in TensorImpl::_set_conj); the negative bit can be set on any dtype.
    if (own(is_neg_.of(v)).ptr() != Py_False) return false;
    if (p.written && own(requires_grad_.of(v)).ptr() != Py_False) return false;
    const py::object dtype = own(dtype_.of(v));
    int code = -1;
    for (const auto& [d, c] : p.codes)
      if (d.ptr() == dtype.ptr()) code = c;
    if (code < 0 || own(is_cpu_.of(v)).ptr() != Py_True) return false;
    // One call for the rank and the element count.
    const py::object shape = own(shape_.of(v));
    if (!PyTuple_Check(shape.ptr())) return false;
    const Py_ssize_t dim = PyTuple_GET_SIZE(shape.ptr());
    if (dim >= 32 || !(p.ranks & (1u << dim))) return false;
    std::int64_t numel = 1;
    for (Py_ssize_t d = 0; d < dim; ++d) numel *= as_int64(PyTuple_GET_ITEM(shape.ptr(), d));
    const bool contiguous = own(is_contiguous_.of(v)).ptr() == Py_True;
    if (p.contiguous && !contiguous) return false;
    // A table with an explicit row stride (a Strided) need only have unit inner stride; a strided
    // 1-D tensor is rows of one element.
    if (!p.contiguous && !contiguous && dim > 1 && call_int(v, s_stride_, -1) != 1) return false;
    out.data = Buffer{static_cast<std::uintptr_t>(as_int64(own(data_ptr_.of(v)).ptr())), code, numel};
    if (numel != 0 && out.data.ptr == 0) return false;
    // A 2-D Strided parameter keeps its rows even when contiguous (a kernel may take its row count
    // from the tensor, as vLLM's grid logits.shape[0] * S does): the same elements as one run. So
    // does a pointer table's (contiguous) block table: rows of its width.
    if (p.table && dim == 2) {
      out.rows = as_int64(PyTuple_GET_ITEM(shape.ptr(), 0));
      out.cols = as_int64(PyTuple_GET_ITEM(shape.ptr(), 1));
      out.row_stride = out.cols;
    } else if (contiguous && (p.contiguous || dim != 2)) {  // one run of numel elements (_checks.py: geometry)
      out.rows = 1;
      out.cols = numel;
      out.row_stride = numel;
    } else if (dim == 1) {  // a strided column: rows of one element (_checks.py: geometry)
      out.rows = numel;
      out.cols = 1;
      out.row_stride = call_int(v, s_stride_, 0);
    } else {  // 2-D with unit inner stride (Param.contiguous=False)
      out.rows = as_int64(PyTuple_GET_ITEM(shape.ptr(), 0));
      out.cols = as_int64(PyTuple_GET_ITEM(shape.ptr(), 1));
      out.row_stride = call_int(v, s_stride_, 0);
    }
    return true;
  }

  // What the Python entry point takes: None, (ptr, code, numel), (ptr, code, numel, rows,
  // cols, row stride) for a Strided parameter, a tuple of those for a pointer table, and scalars
  // as the launch gave them.
  py::tuple python_args(const py::dict& bound, const std::vector<Arg>& args) const {
    py::tuple out(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Param& p = params_[i];
      const Strided& t = args[i].tensor;
      if (!p.ptr) {
        out[i] = bound[p.name];
      } else if (p.table) {
        py::tuple items(args[i].table.size());
        for (std::size_t g = 0; g < args[i].table.size(); ++g) {
          const Strided& e = args[i].table[g];
          items[g] = py::make_tuple(e.data.ptr, e.data.dtype, e.data.numel, e.rows, e.cols, e.row_stride);
        }
        out[i] = items;
      } else if (!t.data.present()) {
        out[i] = py::none();
      } else if (p.contiguous) {
        out[i] = py::make_tuple(t.data.ptr, t.data.dtype, t.data.numel);
      } else {
        out[i] = py::make_tuple(t.data.ptr, t.data.dtype, t.data.numel, t.rows, t.cols, t.row_stride);
      }
    }
    return out;
  }

  struct Flag {
    py::str constexpr_, tensor;
    py::object expect;
  };

  Entry entry_{};
  std::vector<Param> params_;
  std::vector<Flag> flags_;
  py::object tensor_type_, module_;
  py::str entry_name_;
  py::object check_, stand_in_, native_;
  py::object strided_ = py::module_::import("torch").attr("strided");
  Fact layout_{"layout", false}, is_neg_{"is_neg", true}, requires_grad_{"requires_grad", false}, dtype_{"dtype", false},
      is_cpu_{"is_cpu", false}, shape_{"shape", false}, is_contiguous_{"is_contiguous", true}, data_ptr_{"data_ptr", true};
  py::str s_stride_{"stride"};
};

}  // namespace

void register_launcher(py::module_& m) {
  py::class_<Launcher>(m, "Launcher", "A kernel's launch in C++: type-level checks, conversion, the entry point's call.")
      .def(py::init<const std::string&, const std::string&, const py::sequence&, const py::sequence&, py::object, py::object,
                    py::object, py::object>(),
           py::arg("family"), py::arg("name"), py::arg("plan"), py::arg("flags"), py::arg("tensor_type"), py::arg("module"),
           py::arg("check"), py::arg("stand_in"))
      .def("run", &Launcher::run, py::arg("bound"))
      .def("python", &Launcher::python, py::arg("bound"))
      .def_readonly_static("LAUNCHED", &Launcher::kLaunched)
      .def_readonly_static("REFUSED", &Launcher::kRefused);
}

}  // namespace specdiff
