// tessera.dtype, tessera.device, the exception types and the argument conversions of common.h.
#include <array>
#include <cstring>
#include <typeinfo>

#include "common.h"

namespace tpy {
namespace {

constexpr int kDTypes = 7;
// Module-lifetime objects are plain handles holding a reference that is never dropped: a static
// nb::object would be released after the interpreter is gone.
std::array<nb::handle, kDTypes>& dtype_objects() {
  static std::array<nb::handle, kDTypes> objs;
  return objs;
}

int category(DType t) { return t == DType::Bool ? 0 : tessera::is_integral(t) ? 1 : 2; }

nb::handle g_index_error, g_runtime_error;

// PyTorch raises IndexError for out-of-range indices and dims, RuntimeError for the rest (shape
// mismatches, dtypes, devices); the message is tessera's ("[op] shapes ... (in scope 'a.b')").
void translate(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const tessera::Error& e) {
    const char* msg = e.what();
    bool index = std::strstr(msg, "out of range") || std::strstr(msg, "[index") || std::strstr(msg, "[index_put");
    PyErr_SetString((index ? g_index_error : g_runtime_error).ptr(), msg);
  } catch (const std::bad_cast&) {  // nb::cast of an argument of the wrong Python type
    PyErr_SetString(PyExc_TypeError, "an argument has the wrong type (see the signature in docs/python.md)");
  }
}

}  // namespace

nb::object dtype_object(DType t) { return nb::borrow(dtype_objects()[static_cast<int>(t)]); }

bool is_dtype(nb::handle h) { return nb::isinstance<PyDType>(h); }

DType to_dtype(nb::handle h) {
  if (nb::isinstance<PyDType>(h)) return nb::cast<PyDType&>(h).t;
  // Python's own types, as torch.zeros(2, dtype=float) takes them.
  if (h.ptr() == (PyObject*)&PyFloat_Type) return DType::Float64;
  if (h.ptr() == (PyObject*)&PyLong_Type) return DType::Int64;
  if (h.ptr() == (PyObject*)&PyBool_Type) return DType::Bool;
  throw nb::type_error((std::string("expected a tessera.dtype, got ") + nb::repr(h).c_str()).c_str());
}

std::optional<DType> to_dtype_opt(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return to_dtype(h);
}

bool is_device_like(nb::handle h) { return nb::isinstance<nb::str>(h) || nb::isinstance<tessera::Device>(h); }

tessera::Device to_device(nb::handle h) {
  if (nb::isinstance<tessera::Device>(h)) return nb::cast<tessera::Device>(h);
  if (nb::isinstance<nb::str>(h)) return tessera::Device(nb::cast<std::string>(h));
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) return tessera::Device("cuda", nb::cast<int>(h));  // torch: an ordinal
  throw nb::type_error((std::string("expected a device (a string such as 'cpu' or a tessera.device), got ") +
                        nb::repr(h).c_str()).c_str());
}

std::optional<tessera::Device> to_device_opt(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return to_device(h);
}

std::vector<int64_t> to_dims(nb::handle h) {
  if (h.is_none()) return {};
  if (PyLong_Check(h.ptr())) return {nb::cast<int64_t>(h)};
  if (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) {
    std::vector<int64_t> d;
    for (nb::handle e : h) d.push_back(nb::cast<int64_t>(e));
    if (d.empty()) throw nb::value_error("an empty tuple of dims is not supported (pass None for all dims)");
    return d;
  }
  throw nb::type_error((std::string("dim must be an int, a tuple of ints or None, got ") + nb::repr(h).c_str()).c_str());
}

Shape to_shape(nb::handle h) {
  if (PyLong_Check(h.ptr())) return {nb::cast<int64_t>(h)};
  Shape s;
  for (nb::handle e : h) s.push_back(nb::cast<int64_t>(e));
  return s;
}

Shape shape_from_args(const nb::args& args, const char* op) {
  if (args.size() == 1 && !PyLong_Check(args[0].ptr())) {
    nb::handle h = args[0];
    if (!nb::isinstance<nb::tuple>(h) && !nb::isinstance<nb::list>(h))
      throw nb::type_error((std::string(op) + "(): expected ints or a tuple of ints, got " + nb::repr(h).c_str()).c_str());
    return to_shape(h);
  }
  Shape s;
  for (nb::handle e : args) s.push_back(nb::cast<int64_t>(e));
  return s;
}

nb::tuple shape_tuple(const Shape& s) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(s.size()));
  for (size_t i = 0; i < s.size(); ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(s[i]));
  return nb::steal<nb::tuple>(t);
}

void weak_zero_dim(Tensor& a, Tensor& b) {
  if (a.dtype() == b.dtype()) return;
  bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return;
  if (a0 && category(a.dtype()) <= category(b.dtype())) a = a.to(b.dtype());
  if (b0 && category(b.dtype()) <= category(a.dtype())) b = b.to(a.dtype());
}

Tensor operand(const Tensor& like, nb::handle h, const char* op) {
  if (is_tensor(h)) return as_tensor(h);
  PyObject* p = h.ptr();
  tessera::TensorOptions o{like.dtype(), like.device()};
  if (PyBool_Check(p)) return tessera::full({}, p == Py_True ? 1.0 : 0.0, o);
  if (PyLong_Check(p)) {
    if (like.dtype() == DType::Bool) o.dtype = DType::Int64;
    return tessera::full({}, static_cast<double>(nb::cast<int64_t>(h)), o);
  }
  if (PyFloat_Check(p)) {
    if (!tessera::is_floating(like.dtype())) o.dtype = DType::Float32;
    return tessera::full({}, PyFloat_AS_DOUBLE(p), o);
  }
  try {
    return from_python(h, std::nullopt, like.device());  // numpy scalars and arrays, nested lists
  } catch (const tessera::Error&) {
    throw;
  } catch (const std::exception&) {  // not array-like (nb::python_error, a failed cast ...)
    throw nb::type_error((std::string(op) + ": unsupported operand " + nb::repr(nb::handle(Py_TYPE(p))).c_str() +
                          " (expected a tessera.Tensor or a number)").c_str());
  }
}

void register_errors(nb::module_& m) {
  // Subclasses of the built-in types, so `except RuntimeError` catches them as with PyTorch.
  g_runtime_error = nb::handle(PyErr_NewExceptionWithDoc("tessera.TesseraError",
      "An error from Tessera (a RuntimeError, as PyTorch raises)", PyExc_RuntimeError, nullptr));
  g_index_error = nb::handle(PyErr_NewExceptionWithDoc("tessera.TesseraIndexError",
      "An index or dimension out of range (an IndexError, as PyTorch raises)", PyExc_IndexError, nullptr));
  m.attr("TesseraError") = g_runtime_error;
  m.attr("TesseraIndexError") = g_index_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) { translate(p); });
}

void bind_types(nb::module_& m) {
  nb::class_<PyDType>(m, "dtype")
      .def("__repr__", [](const PyDType& d) { return std::string("tessera.") + tessera::dtype_name(d.t); })
      .def_prop_ro("is_floating_point", [](const PyDType& d) { return tessera::is_floating(d.t); })
      .def_prop_ro("is_signed", [](const PyDType& d) { return d.t != DType::Bool; })
      .def_prop_ro("itemsize", [](const PyDType& d) { return tessera::itemsize(d.t); })
      .def("__reduce__", [](const PyDType& d) { return std::string(tessera::dtype_name(d.t)); });
  for (int i = 0; i < kDTypes; ++i) {
    DType t = static_cast<DType>(i);
    dtype_objects()[i] = nb::cast(PyDType{t}).release();
    m.attr(tessera::dtype_name(t)) = dtype_objects()[i];
  }

  nb::class_<tessera::Device>(m, "device")
      .def("__init__", [](tessera::Device* d, nb::handle spec) { new (d) tessera::Device(to_device(spec)); })
      .def("__init__", [](tessera::Device* d, const std::string& kind, int index) { new (d) tessera::Device(kind, index); })
      .def_ro("type", &tessera::Device::kind)
      .def_ro("index", &tessera::Device::index)
      .def("__str__", [](const tessera::Device& d) { return d.index == 0 && d.kind == "cpu" ? d.kind : d.str(); })
      .def("__repr__", [](const tessera::Device& d) {
        return "device(type='" + d.kind + "', index=" + std::to_string(d.index) + ")";
      })
      .def("__eq__", [](const tessera::Device& d, nb::handle o) { return is_device_like(o) && to_device(o) == d; })
      .def("__hash__", [](const tessera::Device& d) { return std::hash<std::string>()(d.str()); });
}

}  // namespace tpy
