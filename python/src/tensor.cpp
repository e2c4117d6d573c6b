// tessera.Tensor: the C++ tessera::Tensor bound directly (no Python wrapper per op). This file:
// metadata, operators with PyTorch's promotion, autodiff and in-place ops; tensor_methods.cpp
// has the named ops, indexing.cpp __getitem__/__setitem__, interop.cpp numpy/DLPack/tolist.
#include <cmath>

#include "common.h"

namespace tpy {
namespace {

// a (op) Python number through the C++ scalar overloads (one constant node), after the cast
// PyTorch's weak promotion implies; anything else through operand().
template <class TT, class TS>
Tensor arith(const Tensor& a, nb::handle h, const char* name, TT tt, TS ts) {
  PyObject* p = h.ptr();
  if (PyFloat_Check(p)) return ts(tessera::is_floating(a.dtype()) ? a : a.to(DType::Float32), PyFloat_AS_DOUBLE(p));
  if (PyLong_Check(p) && !PyBool_Check(p) && a.dtype() != DType::Bool)
    return ts(a, static_cast<double>(nb::cast<int64_t>(h)));
  Tensor x = a, b = operand(a, h, name);
  weak_zero_dim(x, b);
  return tt(x, b);
}

template <class F>
Tensor binop(const Tensor& a, nb::handle h, const char* name, F f) {
  Tensor x = a, b = operand(a, h, name);
  weak_zero_dim(x, b);
  return f(x, b);
}
// h (op) a, for the reflected operators (h is never a Tensor there).
template <class F>
Tensor rbinop(const Tensor& a, nb::handle h, const char* name, F f) {
  Tensor x = a, b = operand(a, h, name);
  weak_zero_dim(x, b);
  return f(b, x);
}

Tensor floor_divide(const Tensor& a, const Tensor& b) {
  Tensor q = tessera::floor(tessera::div(a, b));
  DType t = tessera::promote(a.dtype(), b.dtype());
  return tessera::is_floating(t) ? q : q.to(t);
}
// Python's (and torch.remainder's) modulo: the sign of the divisor.
Tensor remainder(const Tensor& a, const Tensor& b) {
  DType t = tessera::promote(a.dtype(), b.dtype());
  DType c = tessera::is_floating(t) ? t : DType::Float64;
  Tensor x = a.to(c), y = b.to(c);
  Tensor r = x - tessera::floor(x / y) * y;
  return r.to(t);
}
Tensor logical(const Tensor& a, const Tensor& b, const char* name, Tensor (*f)(const Tensor&, const Tensor&)) {
  if (a.dtype() != DType::Bool || b.dtype() != DType::Bool)
    throw nb::type_error((std::string(name) + ": only bool tensors are supported by Tessera (got " +
                          tessera::dtype_name(a.dtype()) + " and " + tessera::dtype_name(b.dtype()) + ")").c_str());
  return f(a, b);
}

#define TPY_ARITH(pyname, rname, OP, FN)                                                                       \
  cls.def(pyname, [](const Tensor& a, nb::handle h) {                                                         \
    return arith(a, h, #FN, [](const Tensor& x, const Tensor& y) { return x OP y; },                          \
                 [](const Tensor& x, double s) { return x OP s; });                                           \
  });                                                                                                          \
  cls.def(rname, [](const Tensor& a, nb::handle h) {                                                          \
    return arith(a, h, #FN, [](const Tensor& x, const Tensor& y) { return y OP x; },                          \
                 [](const Tensor& x, double s) { return s OP x; });                                           \
  });

#define TPY_BIN(pyname, FN)                                                                  \
  cls.def(pyname, [](const Tensor& a, nb::handle h) { return binop(a, h, #FN, FN); })

nb::object self_after(nb::handle self) { return nb::borrow(self); }

int category(DType t) { return t == DType::Bool ? 0 : tessera::is_integral(t) ? 1 : 2; }

// t (op)= h, returning self: a Python number through the C++ scalar overload, anything else as
// operand(). Like PyTorch, an in-place result keeps t's dtype and refuses a higher category (a
// float into an integer tensor) rather than truncating it.
template <class FT, class FS>
nb::object inplace(nb::handle self, nb::handle h, const char* name, FT ft, FS fs) {
  Tensor& t = as_tensor(self);
  PyObject* p = h.ptr();
  auto refuse = [&](DType r) {
    throw tessera::Error(std::string("[") + name + "] result type " + tessera::dtype_name(r) +
                         " can't be cast to the desired output type " + tessera::dtype_name(t.dtype()));
  };
  if ((PyFloat_Check(p) || PyLong_Check(p)) && !PyBool_Check(p) && t.dtype() != DType::Bool) {
    if (PyFloat_Check(p) && !tessera::is_floating(t.dtype())) refuse(DType::Float32);
    fs(t, nb::cast<double>(h));
    return self_after(self);
  }
  Tensor b = operand(t, h, name);
  if (category(b.dtype()) > category(t.dtype())) refuse(b.dtype());
  ft(t, b);
  return self_after(self);
}

#define TPY_INPLACE(pyname, METHOD)                                                                      \
  cls.def(pyname, [](nb::handle self, nb::handle h) {                                                   \
    return inplace(self, h, #METHOD, [](Tensor& t, const Tensor& b) { t.METHOD(b); },                   \
                   [](Tensor& t, double s) { t.METHOD(s); });                                          \
  })

void bind_core(nb::class_<Tensor>& cls) {
  cls.def(nb::init<>())
      .def(nb::init<const Tensor&>(), nb::arg("data"),
           "A new handle on data's value and autodiff state (used by nn.Parameter subclasses)")
      // ---- metadata ----
      .def_prop_ro("shape", [](const Tensor& t) { return shape_tuple(t.shape()); })
      .def("size", [](const Tensor& t, nb::handle dim) -> nb::object {
             if (dim.is_none()) return shape_tuple(t.shape());
             return nb::int_(t.size(nb::cast<int64_t>(dim)));
           }, nb::arg("dim") = nb::none())
      .def("dim", &Tensor::dim)
      .def("ndimension", &Tensor::dim)
      .def_prop_ro("ndim", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("nelement", &Tensor::numel)
      .def("element_size", [](const Tensor& t) { return tessera::itemsize(t.dtype()); })
      .def_prop_ro("dtype", [](const Tensor& t) { return dtype_object(t.dtype()); })
      .def_prop_ro("device", &Tensor::device)
      .def_prop_ro("is_cuda", [](const Tensor& t) { return t.device().kind == "cuda"; })
      .def_prop_ro("is_cpu", [](const Tensor& t) { return t.device().kind == "cpu"; })
      .def("is_floating_point", [](const Tensor& t) { return tessera::is_floating(t.dtype()); })
      .def("is_contiguous", [](const Tensor&) { return true; })
      .def("__len__", [](const Tensor& t) {
        if (t.dim() == 0) throw nb::type_error("len() of a 0-d tensor");
        return t.size(0);
      })
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()) >> 4; })
      .def("__repr__", [](const Tensor& t) { return t.defined() ? t.str() : std::string("tensor(<undefined>)"); })
      // ---- autodiff ----
      .def_prop_rw("requires_grad", &Tensor::requires_grad,
                   [](Tensor& t, bool on) { t.requires_grad_(on); })
      .def("requires_grad_", [](nb::handle self, bool on) {
             as_tensor(self).requires_grad_(on);
             return self_after(self);
           }, nb::arg("requires_grad") = true)
      .def_prop_ro("is_leaf", &Tensor::is_leaf)
      .def_prop_ro("_version", &Tensor::version)
      .def("_failed", &Tensor::failed, "whether the graph computing this tensor failed (using it raises that error)")
      .def_prop_rw("grad",
                   [](const Tensor& t) -> std::optional<Tensor> {
                     Tensor g = t.grad();
                     if (!g.defined()) return std::nullopt;
                     return g;
                   },
                   [](Tensor& t, std::optional<Tensor> g) { t.set_grad(g ? *g : Tensor()); }, nb::arg("grad").none())
      .def("backward", [](const Tensor& t, std::optional<Tensor> gradient, nb::handle retain_graph, bool create_graph) {
             if (create_graph) throw nb::type_error("backward(create_graph=True) is not supported by Tessera");
             (void)retain_graph;  // the graph is lazy IR: a second backward needs nothing kept
             t.backward(gradient ? *gradient : Tensor());
           }, nb::arg("gradient").none() = nb::none(), nb::arg("retain_graph").none() = nb::none(),
           nb::arg("create_graph") = false)
      .def("detach", &Tensor::detach)
      .def("detach_", [](nb::handle self) {
        Tensor& t = as_tensor(self);
        t = t.detach();
        return self_after(self);
      })
      .def_prop_rw("data", &Tensor::detach, [](Tensor& t, const Tensor& v) { t.set_data(v); });

}

void bind_operators(nb::class_<Tensor>& cls) {
  TPY_ARITH("__add__", "__radd__", +, add)
  TPY_ARITH("__sub__", "__rsub__", -, sub)
  TPY_ARITH("__mul__", "__rmul__", *, mul)
  TPY_ARITH("__truediv__", "__rtruediv__", /, div)
  TPY_BIN("__eq__", tessera::eq);
  TPY_BIN("__ne__", tessera::ne);
  TPY_BIN("__lt__", tessera::lt);
  TPY_BIN("__le__", tessera::le);
  TPY_BIN("__gt__", tessera::gt);
  TPY_BIN("__ge__", tessera::ge);
  TPY_BIN("__floordiv__", floor_divide);
  TPY_BIN("__mod__", remainder);
  TPY_BIN("__matmul__", tessera::matmul);
  cls.def("__rfloordiv__", [](const Tensor& a, nb::handle h) { return rbinop(a, h, "floor_divide", floor_divide); });
  cls.def("__rmod__", [](const Tensor& a, nb::handle h) { return rbinop(a, h, "remainder", remainder); });
  cls.def("__rmatmul__", [](const Tensor& a, nb::handle h) { return rbinop(a, h, "matmul", tessera::matmul); });
  cls.def("__and__", [](const Tensor& a, nb::handle h) {
    return binop(a, h, "__and__", [](const Tensor& x, const Tensor& y) { return logical(x, y, "&", tessera::logical_and); });
  });
  cls.def("__or__", [](const Tensor& a, nb::handle h) {
    return binop(a, h, "__or__", [](const Tensor& x, const Tensor& y) { return logical(x, y, "|", tessera::logical_or); });
  });
  cls.def("__xor__", [](const Tensor& a, nb::handle h) {
    return binop(a, h, "__xor__", [](const Tensor& x, const Tensor& y) { return logical(x, y, "^", tessera::logical_xor); });
  });
  cls.def("__rand__", [](const Tensor& a, nb::handle h) {
    return binop(a, h, "__and__", [](const Tensor& x, const Tensor& y) { return logical(x, y, "&", tessera::logical_and); });
  });
  cls.def("__ror__", [](const Tensor& a, nb::handle h) {
    return binop(a, h, "__or__", [](const Tensor& x, const Tensor& y) { return logical(x, y, "|", tessera::logical_or); });
  });
  cls.def("__invert__", [](const Tensor& a) {
    if (a.dtype() != DType::Bool) throw nb::type_error("~: only bool tensors are supported by Tessera");
    return tessera::logical_not(a);
  });
  cls.def("__neg__", [](const Tensor& a) { return -a; });
  cls.def("__pos__", [](const Tensor& a) { return a; });
  cls.def("__abs__", [](const Tensor& a) { return a.abs(); });
  cls.def("__pow__", [](const Tensor& a, nb::handle h) {
    if (PyFloat_Check(h.ptr()) || (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))) {
      double e = nb::cast<double>(h);
      Tensor x = (PyFloat_Check(h.ptr()) && !tessera::is_floating(a.dtype())) ? a.to(DType::Float32) : a;
      return x.pow(e);
    }
    return binop(a, h, "pow", [](const Tensor& x, const Tensor& y) { return tessera::pow(x, y); });
  });
  cls.def("__rpow__", [](const Tensor& a, nb::handle h) {
    if (PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr())) return tessera::pow(nb::cast<double>(h), a);
    return rbinop(a, h, "pow", [](const Tensor& x, const Tensor& y) { return tessera::pow(x, y); });
  });

}

// In place: each returns self, like PyTorch.
void bind_inplace(nb::class_<Tensor>& cls) {
  TPY_INPLACE("__iadd__", add_);
  TPY_INPLACE("__isub__", sub_);
  TPY_INPLACE("__imul__", mul_);
  TPY_INPLACE("__itruediv__", div_);
  TPY_INPLACE("mul_", mul_);
  TPY_INPLACE("div_", div_);
  cls.def("add_", [](nb::handle self, nb::handle h, double alpha) {
    return inplace(self, h, "add_", [alpha](Tensor& t, const Tensor& b) { t.add_(alpha == 1 ? b : b * alpha); },
                   [alpha](Tensor& t, double s) { t.add_(s * alpha); });
  }, nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1.0);
  cls.def("sub_", [](nb::handle self, nb::handle h, double alpha) {
    return inplace(self, h, "sub_", [alpha](Tensor& t, const Tensor& b) { t.sub_(alpha == 1 ? b : b * alpha); },
                   [alpha](Tensor& t, double s) { t.sub_(s * alpha); });
  }, nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1.0);
  // copy_ and fill_ cast to t's dtype, as PyTorch's do.
  cls.def("copy_", [](nb::handle self, nb::handle src) {
    Tensor& t = as_tensor(self);
    t.copy_(operand(t, src, "copy_"));
    return self_after(self);
  }, nb::arg("src"));
  cls.def("fill_", [](nb::handle self, nb::handle v) {
    as_tensor(self).fill_(is_tensor(v) ? as_tensor(v).item() : nb::cast<double>(v));
    return self_after(self);
  }, nb::arg("value"));
  cls.def("zero_", [](nb::handle self) {
    as_tensor(self).zero_();
    return self_after(self);
  });
  // The remaining in-place ops: the out-of-place op, written back with copy_ semantics.
  cls.def("masked_fill_", [](nb::handle self, const Tensor& mask, nb::handle v) {
    Tensor& t = as_tensor(self);
    t.copy_(is_tensor(v) ? tessera::where(mask, as_tensor(v), t) : t.masked_fill(mask, nb::cast<double>(v)));
    return self_after(self);
  }, nb::arg("mask"), nb::arg("value"));
  cls.def("clamp_", [](nb::handle self, std::optional<double> lo, std::optional<double> hi) {
    Tensor& t = as_tensor(self);
    t.copy_(t.clamp(lo, hi));
    return self_after(self);
  }, nb::arg("min").none() = nb::none(), nb::arg("max").none() = nb::none());
  cls.def("normal_", [](nb::handle self, double mean, double std) {
    Tensor& t = as_tensor(self);
    t.copy_(tessera::randn(t.shape(), {DType::Float32, t.device()}) * std + mean);
    return self_after(self);
  }, nb::arg("mean") = 0.0, nb::arg("std") = 1.0);
  cls.def("uniform_", [](nb::handle self, double a, double b) {
    Tensor& t = as_tensor(self);
    t.copy_(tessera::rand(t.shape(), {DType::Float32, t.device()}) * (b - a) + a);
    return self_after(self);
  }, nb::arg("a") = 0.0, nb::arg("b") = 1.0);
}

}  // namespace

void bind_tensor(nb::module_& m) {
  nb::class_<Tensor> cls(m, "Tensor");
  bind_core(cls);
  bind_operators(cls);
  bind_inplace(cls);
  bind_tensor_methods(m, cls);
  bind_indexing(cls);
  bind_interop(m, cls);
}

}  // namespace tpy
