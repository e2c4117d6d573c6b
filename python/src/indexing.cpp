// x[...] and x[...] = v: Python indices to tessera::indexing (integers, slices, None, Ellipsis,
// one integer index tensor or list), boolean masks (a host read of the mask, as PyTorch's
// data-dependent shape needs), and writes through index_put_ or where.
#include "common.h"

namespace tpy {
namespace {
using tessera::indexing::Slice;
using tessera::indexing::TensorIndex;

bool is_bool_tensor(nb::handle h) { return is_tensor(h) && as_tensor(h).dtype() == DType::Bool; }

// A slice bound or index: a Python int, a one-element integer tensor (`for i in ix: x[i:i+n]`) or
// anything with __index__ (numpy integers).
int64_t as_index(nb::handle h) {
  if (is_tensor(h)) {
    const Tensor& t = as_tensor(h);
    if (!tessera::is_integral(t.dtype()) || t.numel() != 1)
      throw nb::type_error(("only one-element integer tensors can be used as a slice bound or index, got " +
                            std::string(tessera::dtype_name(t.dtype())) + tessera::shape_str(t.shape())).c_str());
    return t.item<int64_t>();
  }
  Py_ssize_t v = PyNumber_AsSsize_t(h.ptr(), PyExc_IndexError);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

std::optional<int64_t> bound(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  return as_index(h);
}

TensorIndex one_index(nb::handle h, const Tensor& x) {
  PyObject* p = h.ptr();
  if (PyLong_Check(p) && !PyBool_Check(p)) return TensorIndex(nb::cast<int64_t>(h));
  if (PySlice_Check(p)) {
    auto* s = reinterpret_cast<PySliceObject*>(p);
    std::optional<int64_t> step = bound(s->step);
    if (step && *step < 1) throw nb::value_error("step must be greater than zero (PyTorch does not support negative steps either)");
    return TensorIndex(Slice(bound(s->start), bound(s->stop), step));
  }
  if (h.is_none()) return TensorIndex(tessera::indexing::None);
  if (p == Py_Ellipsis) return TensorIndex(tessera::indexing::Ellipsis);
  if (is_tensor(h)) {
    const Tensor& t = as_tensor(h);
    if (!tessera::is_integral(t.dtype()))
      throw nb::index_error(("tensors used as indices must be integer (or bool, alone), got " +
                             std::string(tessera::dtype_name(t.dtype()))).c_str());
    return TensorIndex(t);
  }
  if (nb::isinstance<nb::list>(h)) return TensorIndex(from_python(h, DType::Int64, x.device()));
  if (PyIndex_Check(p)) return TensorIndex(as_index(h));
  throw nb::type_error((std::string("unsupported index ") + nb::repr(h).c_str() +
                        " (Tessera takes ints, slices, None, ..., an integer tensor or list, or a bool mask)").c_str());
}

std::vector<TensorIndex> to_indices(nb::handle key, const Tensor& x) {
  std::vector<TensorIndex> ix;
  if (nb::isinstance<nb::tuple>(key)) {
    for (nb::handle e : key) {
      if (is_bool_tensor(e)) throw nb::index_error("a bool mask is supported only as the whole index (x[mask])");
      ix.push_back(one_index(e, x));
    }
  } else {
    ix.push_back(one_index(key, x));
  }
  return ix;
}

// x[mask] for a mask shaped like x's leading dims: the rows where it is true (reads the mask).
Tensor masked_select(const Tensor& x, const Tensor& mask) {
  const Shape& ms = mask.shape();
  if (ms.size() > x.shape().size() || !std::equal(ms.begin(), ms.end(), x.shape().begin()))
    throw nb::index_error(("the mask " + tessera::shape_str(ms) + " does not match the leading dims of the indexed tensor " +
                           tessera::shape_str(x.shape())).c_str());
  std::vector<uint8_t> m = mask.to_vector<uint8_t>();
  std::vector<int64_t> rows;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i]) rows.push_back(static_cast<int64_t>(i));
  Shape flat{static_cast<int64_t>(m.size())};
  flat.insert(flat.end(), x.shape().begin() + static_cast<long>(ms.size()), x.shape().end());
  Tensor idx = tessera::from_vector(rows, {static_cast<int64_t>(rows.size())}, {DType::Int64, x.device()});
  return x.reshape(flat).index_select(0, idx);
}

Tensor value_for(const Tensor& x, nb::handle v) {
  Tensor t = operand(x, v, "__setitem__");
  return t.to(x.dtype());
}

}  // namespace

void bind_indexing(nb::class_<Tensor>& cls) {
  cls.def("__getitem__", [](const Tensor& x, nb::handle key) {
    if (is_bool_tensor(key)) return masked_select(x, as_tensor(key));
    return x.index(to_indices(key, x));
  });
  cls.def("__setitem__", [](Tensor& x, nb::handle key, nb::handle v) {
    if (is_bool_tensor(key)) {  // x[mask] = v: a where over the mask broadcast to x
      const Tensor& mask = as_tensor(key);
      Shape s = mask.shape();
      while (s.size() < x.shape().size()) s.push_back(1);
      x.copy_(tessera::where(mask.reshape(s), value_for(x, v), x));
      return;
    }
    std::vector<TensorIndex> ix = to_indices(key, x);
    for (const TensorIndex& e : ix)
      if (e.kind() == TensorIndex::Kind::Tensor)
        throw nb::index_error("assignment through an integer index tensor is not supported by Tessera (use a bool mask or slices)");
    x.index_put_(ix, value_for(x, v));
  });
  cls.def("__iter__", [](const Tensor& x) {
    if (x.dim() == 0) throw nb::type_error("iteration over a 0-d tensor");
    nb::list l;
    for (int64_t i = 0; i < x.size(0); ++i) l.append(nb::cast(x.index({TensorIndex(i)})));
    return nb::iter(l);
  });
}

}  // namespace tpy
