// The named Tensor methods (PyTorch's names, keywords and defaults), each a forward to the C++
// op of the same meaning; tessera/__init__.py exposes the same as tessera.<name>(tensor, ...).
#include <cmath>

#include "common.h"

namespace tpy {
namespace {

nb::handle g_return_max, g_return_min, g_return_topk;  // namedtuples (values, indices), never released

nb::tuple tensors_tuple(const std::vector<Tensor>& ts) {
  nb::list l;
  for (const Tensor& t : ts) l.append(nb::cast(t));
  return nb::tuple(l);
}

// x.max() / x.max(dim, keepdim) / x.max(other): PyTorch's three overloads.
nb::object extreme(const Tensor& t, nb::handle dim, bool keepdim, bool is_max) {
  if (dim.is_none()) return nb::cast(is_max ? t.max() : t.min());
  if (is_tensor(dim)) return nb::cast(is_max ? tessera::maximum(t, as_tensor(dim)) : tessera::minimum(t, as_tensor(dim)));
  auto [v, i] = is_max ? t.max(nb::cast<int64_t>(dim), keepdim) : t.min(nb::cast<int64_t>(dim), keepdim);
  return (is_max ? g_return_max : g_return_min)(v, i);
}

Tensor cast_opt(const Tensor& t, nb::handle dtype) { return dtype.is_none() ? t : t.to(to_dtype(dtype)); }

// x.to(dtype) / x.to(device) / x.to(device, dtype) / x.to(tensor) / x.to(dtype=..., device=...).
Tensor to_any(const Tensor& t, nb::args args, nb::kwargs kw) {
  std::optional<DType> dt;
  std::optional<tessera::Device> dev;
  for (nb::handle a : args) {
    if (is_dtype(a) || a.ptr() == (PyObject*)&PyFloat_Type) dt = to_dtype(a);
    else if (is_tensor(a)) { dt = as_tensor(a).dtype(); dev = as_tensor(a).device(); }
    else dev = to_device(a);
  }
  for (auto [k, v] : kw) {
    std::string key = nb::cast<std::string>(k);
    if (key == "dtype") dt = to_dtype_opt(v);
    else if (key == "device") dev = to_device_opt(v);
    else if (key == "non_blocking" || key == "copy") continue;  // copies are explicit here anyway
    else throw nb::type_error(("Tensor.to() got an unexpected keyword argument '" + key + "'").c_str());
  }
  Tensor r = t;
  if (dev && *dev != r.device()) r = r.to(*dev);
  if (dt) r = r.to(*dt);
  return r;
}

std::vector<Tensor> split_any(const Tensor& t, nb::handle sizes, int64_t dim) {
  if (PyLong_Check(sizes.ptr())) return tessera::split(t, nb::cast<int64_t>(sizes), dim);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (nb::handle s : sizes) {
    int64_t n = nb::cast<int64_t>(s);
    out.push_back(t.narrow(dim, start, n));
    start += n;
  }
  if (start != t.size(dim))
    throw nb::value_error(("split: sizes sum to " + std::to_string(start) + " but dim " + std::to_string(dim) +
                           " of " + tessera::shape_str(t.shape()) + " has " + std::to_string(t.size(dim))).c_str());
  return out;
}

Tensor clamp_any(const Tensor& t, nb::handle lo, nb::handle hi) {
  if (is_tensor(lo) || is_tensor(hi)) {
    Tensor r = t;
    if (!lo.is_none()) r = tessera::maximum(r, operand(r, lo, "clamp"));
    if (!hi.is_none()) r = tessera::minimum(r, operand(r, hi, "clamp"));
    return r;
  }
  return t.clamp(lo.is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(lo)),
                 hi.is_none() ? std::nullopt : std::optional<double>(nb::cast<double>(hi)));
}

Tensor nonzero_mask(const Tensor& t) {
  return t.dtype() == DType::Bool ? t : tessera::ne(t, tessera::zeros({}, {t.dtype(), t.device()}));
}

int64_t correction_of(nb::handle unbiased, nb::handle correction) {
  if (!correction.is_none()) return nb::cast<int64_t>(correction);
  if (!unbiased.is_none()) return nb::cast<bool>(unbiased) ? 1 : 0;
  return 1;
}

void bind_math(nb::class_<Tensor>& cls) {
  auto none = nb::none();
  // ---- elementwise ----
#define TPY_UNARY(name) cls.def(#name, [](const Tensor& t) { return tessera::name(t); })
  TPY_UNARY(neg); TPY_UNARY(abs); TPY_UNARY(sign); TPY_UNARY(sqrt); TPY_UNARY(rsqrt); TPY_UNARY(square);
  TPY_UNARY(reciprocal); TPY_UNARY(exp); TPY_UNARY(log); TPY_UNARY(sin); TPY_UNARY(cos); TPY_UNARY(tanh);
  TPY_UNARY(sigmoid); TPY_UNARY(relu); TPY_UNARY(floor); TPY_UNARY(ceil); TPY_UNARY(round); TPY_UNARY(erf);
  TPY_UNARY(silu); TPY_UNARY(logical_not);
#undef TPY_UNARY
  cls.def("negative", [](const Tensor& t) { return -t; });
  cls.def("gelu", [](const Tensor& t, const std::string& approximate) {
    if (approximate != "none" && approximate != "tanh")
      throw nb::value_error(("gelu: approximate must be 'none' or 'tanh', got '" + approximate + "'").c_str());
    return tessera::gelu(t, approximate == "tanh");
  }, nb::arg("approximate") = "none");
  cls.def("add", [](const Tensor& a, nb::handle h, double alpha) {
    Tensor b = operand(a, h, "add"), x = a;
    weak_zero_dim(x, b);
    return x + (alpha == 1 ? b : b * alpha);
  }, nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1.0);
  cls.def("sub", [](const Tensor& a, nb::handle h, double alpha) {
    Tensor b = operand(a, h, "sub"), x = a;
    weak_zero_dim(x, b);
    return x - (alpha == 1 ? b : b * alpha);
  }, nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1.0);
  nb::object pycls = cls;
  for (const char* alias : {"mul", "multiply"}) cls.attr(alias) = pycls.attr("__mul__");
  for (const char* alias : {"div", "divide", "true_divide"}) cls.attr(alias) = pycls.attr("__truediv__");
  cls.attr("floor_divide") = pycls.attr("__floordiv__");
  cls.attr("remainder") = pycls.attr("__mod__");
  cls.attr("pow") = pycls.attr("__pow__");
  cls.attr("matmul") = pycls.attr("__matmul__");
  cls.attr("mm") = pycls.attr("__matmul__");
  cls.attr("bmm") = pycls.attr("__matmul__");
  for (const char* n : {"eq", "ne", "lt", "le", "gt", "ge"}) cls.attr(n) = pycls.attr((std::string("__") + n + "__").c_str());
  cls.attr("greater") = pycls.attr("__gt__");
  cls.attr("less") = pycls.attr("__lt__");
  cls.def("logical_and", [](const Tensor& a, const Tensor& b) { return tessera::logical_and(a, b); });
  cls.def("logical_or", [](const Tensor& a, const Tensor& b) { return tessera::logical_or(a, b); });
  cls.def("logical_xor", [](const Tensor& a, const Tensor& b) { return tessera::logical_xor(a, b); });
  cls.def("maximum", [](const Tensor& a, const Tensor& b) { return tessera::maximum(a, b); });
  cls.def("minimum", [](const Tensor& a, const Tensor& b) { return tessera::minimum(a, b); });
  cls.def("clamp", clamp_any, nb::arg("min").none() = none, nb::arg("max").none() = none);
  cls.def("clip", clamp_any, nb::arg("min").none() = none, nb::arg("max").none() = none);
  cls.def("masked_fill", [](const Tensor& t, const Tensor& mask, nb::handle v) {
    if (is_tensor(v)) return tessera::where(mask, as_tensor(v).to(t.dtype()), t);
    return t.masked_fill(mask, nb::cast<double>(v));
  }, nb::arg("mask"), nb::arg("value"));
  cls.def("where", [](const Tensor& t, const Tensor& cond, nb::handle other) {
    Tensor o = operand(t, other, "where"), x = t;
    weak_zero_dim(x, o);
    return tessera::where(cond, x, o);
  }, nb::arg("condition"), nb::arg("other"));
  cls.def("lerp", [](const Tensor& a, const Tensor& b, double w) { return a + (b - a) * w; });

}

void bind_reductions(nb::class_<Tensor>& cls) {
  auto none = nb::none();
  cls.def("sum", [](const Tensor& t, nb::handle dim, bool keepdim, nb::handle dtype) {
    return cast_opt(t, dtype).sum(to_dims(dim), keepdim);
  }, nb::arg("dim").none() = none, nb::arg("keepdim") = false, nb::kw_only(), nb::arg("dtype").none() = none);
  cls.def("mean", [](const Tensor& t, nb::handle dim, bool keepdim, nb::handle dtype) {
    return cast_opt(t, dtype).mean(to_dims(dim), keepdim);
  }, nb::arg("dim").none() = none, nb::arg("keepdim") = false, nb::kw_only(), nb::arg("dtype").none() = none);
  cls.def("max", [](const Tensor& t, nb::handle dim, bool keepdim) { return extreme(t, dim, keepdim, true); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("min", [](const Tensor& t, nb::handle dim, bool keepdim) { return extreme(t, dim, keepdim, false); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("amax", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.amax(to_dims(dim), keepdim); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("amin", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.amin(to_dims(dim), keepdim); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("argmax", [](const Tensor& t, std::optional<int64_t> dim, bool keepdim) { return t.argmax(dim, keepdim); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("argmin", [](const Tensor& t, std::optional<int64_t> dim, bool keepdim) { return t.argmin(dim, keepdim); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("all", [](const Tensor& t, nb::handle dim, bool keepdim) { return nonzero_mask(t).to(DType::Int32).amin(to_dims(dim), keepdim).to(DType::Bool); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("any", [](const Tensor& t, nb::handle dim, bool keepdim) { return nonzero_mask(t).to(DType::Int32).amax(to_dims(dim), keepdim).to(DType::Bool); },
          nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("var", [](const Tensor& t, nb::handle dim, nb::handle unbiased, bool keepdim, nb::handle correction) {
    return tessera::var(t, to_dims(dim), correction_of(unbiased, correction), keepdim);
  }, nb::arg("dim").none() = none, nb::arg("unbiased").none() = none, nb::arg("keepdim") = false, nb::kw_only(),
     nb::arg("correction").none() = none);
  cls.def("std", [](const Tensor& t, nb::handle dim, nb::handle unbiased, bool keepdim, nb::handle correction) {
    return tessera::std(t, to_dims(dim), correction_of(unbiased, correction), keepdim);
  }, nb::arg("dim").none() = none, nb::arg("unbiased").none() = none, nb::arg("keepdim") = false, nb::kw_only(),
     nb::arg("correction").none() = none);
  // The vector norm over dim (all elements by default): p = 2, 1, inf or any positive number.
  cls.def("norm", [](const Tensor& t, nb::handle p, nb::handle dim, bool keepdim) {
    double ord = p.is_none() ? 2.0 : nb::cast<double>(p);
    std::vector<int64_t> dims = to_dims(dim);
    if (std::isinf(ord) && ord > 0) return t.abs().amax(dims, keepdim);
    if (ord == 2) return t.square().sum(dims, keepdim).sqrt();
    if (ord == 1) return t.abs().sum(dims, keepdim);
    if (!(ord > 0)) throw nb::value_error("norm: p must be positive (or inf)");
    return t.abs().pow(ord).sum(dims, keepdim).pow(1.0 / ord);
  }, nb::arg("p").none() = none, nb::arg("dim").none() = none, nb::arg("keepdim") = false);
  cls.def("logsumexp", [](const Tensor& t, nb::handle dim, bool keepdim) { return t.logsumexp(to_dims(dim), keepdim); },
          nb::arg("dim"), nb::arg("keepdim") = false);
  cls.def("softmax", [](const Tensor& t, int64_t dim, nb::handle dtype) { return cast_opt(t, dtype).softmax(dim); },
          nb::arg("dim"), nb::arg("dtype").none() = none);
  cls.def("log_softmax", [](const Tensor& t, int64_t dim, nb::handle dtype) { return cast_opt(t, dtype).log_softmax(dim); },
          nb::arg("dim"), nb::arg("dtype").none() = none);
  cls.def("cumsum", [](const Tensor& t, int64_t dim, nb::handle dtype) { return tessera::cumsum(cast_opt(t, dtype), dim); },
          nb::arg("dim"), nb::kw_only(), nb::arg("dtype").none() = none);
  cls.def("topk", [](const Tensor& t, int64_t k, int64_t dim, bool largest, bool sorted) {
    auto [v, i] = tessera::topk(t, k, dim, largest, sorted);
    return g_return_topk(v, i);
  }, nb::arg("k"), nb::arg("dim") = -1, nb::arg("largest") = true, nb::arg("sorted") = true);
  cls.def("multinomial", [](const Tensor& t, int64_t n, bool replacement, nb::handle generator) {
    if (!generator.is_none()) throw nb::type_error("multinomial(generator=...) is not supported by Tessera; use tessera.manual_seed");
    return tessera::multinomial(t, n, replacement);
  }, nb::arg("num_samples"), nb::arg("replacement") = false, nb::kw_only(), nb::arg("generator").none() = none);

}

void bind_movement(nb::class_<Tensor>& cls) {
  auto none = nb::none();
  nb::object pycls = cls;
  cls.def("reshape", [](const Tensor& t, nb::args s) { return t.reshape(shape_from_args(s, "reshape")); });
  cls.def("view", [](const Tensor& t, nb::args s) {
    if (s.size() == 1 && is_dtype(s[0])) throw nb::type_error("Tensor.view(dtype) is not supported by Tessera");
    return t.view(shape_from_args(s, "view"));
  });
  cls.def("view_as", [](const Tensor& t, const Tensor& o) { return t.view(o.shape()); });
  cls.def("reshape_as", [](const Tensor& t, const Tensor& o) { return t.reshape(o.shape()); });
  cls.def("permute", [](const Tensor& t, nb::args s) { return t.permute(shape_from_args(s, "permute")); });
  cls.def("expand", [](const Tensor& t, nb::args s) { return t.expand(shape_from_args(s, "expand")); });
  cls.def("expand_as", [](const Tensor& t, const Tensor& o) { return t.expand(o.shape()); });
  cls.def("repeat", [](const Tensor& t, nb::args s) { return t.repeat(shape_from_args(s, "repeat")); });
  cls.def("flatten", &Tensor::flatten, nb::arg("start_dim") = 0, nb::arg("end_dim") = -1);
  cls.def("squeeze", [](const Tensor& t, std::optional<int64_t> dim) { return dim ? t.squeeze(*dim) : t.squeeze(); },
          nb::arg("dim").none() = none);
  cls.def("unsqueeze", &Tensor::unsqueeze, nb::arg("dim"));
  cls.def("transpose", &Tensor::transpose, nb::arg("dim0"), nb::arg("dim1"));
  cls.attr("swapaxes") = pycls.attr("transpose");
  cls.def("t", [](const Tensor& t) {
    if (t.dim() > 2) throw nb::value_error(("t() expects a tensor with <= 2 dimensions, got " + tessera::shape_str(t.shape())).c_str());
    return t.dim() < 2 ? t : t.transpose(0, 1);
  });
  cls.def_prop_ro("T", [](const Tensor& t) {
    std::vector<int64_t> p;
    for (int64_t d = t.dim() - 1; d >= 0; --d) p.push_back(d);
    return t.permute(p);
  });
  cls.def_prop_ro("mT", [](const Tensor& t) { return t.transpose(-2, -1); });
  cls.def("contiguous", [](nb::handle self) { return nb::borrow(self); });
  cls.def("clone", [](const Tensor& t) { return t.clone(); });
  cls.def("split", [](const Tensor& t, nb::handle s, int64_t dim) { return tensors_tuple(split_any(t, s, dim)); },
          nb::arg("split_size"), nb::arg("dim") = 0);
  cls.def("chunk", [](const Tensor& t, int64_t n, int64_t dim) { return tensors_tuple(tessera::chunk(t, n, dim)); },
          nb::arg("chunks"), nb::arg("dim") = 0);
  cls.def("unbind", [](const Tensor& t, int64_t dim) {
    std::vector<Tensor> out;
    int64_t d = tessera::wrap_dim(dim, t.shape(), "unbind");
    for (int64_t i = 0; i < t.size(d); ++i) out.push_back(t.narrow(d, i, 1).squeeze(d));
    return tensors_tuple(out);
  }, nb::arg("dim") = 0);
  cls.def("narrow", &Tensor::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"));
  cls.def("gather", &Tensor::gather, nb::arg("dim"), nb::arg("index"));
  cls.def("index_select", &Tensor::index_select, nb::arg("dim"), nb::arg("index"));
  cls.def("scatter_add", [](const Tensor& t, int64_t dim, const Tensor& i, const Tensor& s) { return tessera::scatter_add(t, dim, i, s); },
          nb::arg("dim"), nb::arg("index"), nb::arg("src"));
  cls.def("tril", [](const Tensor& t, int64_t d) { return tessera::tril(t, d); }, nb::arg("diagonal") = 0);
  cls.def("triu", [](const Tensor& t, int64_t d) { return tessera::triu(t, d); }, nb::arg("diagonal") = 0);
  cls.def("flip", [](const Tensor& t, nb::args dims) { return tessera::flip(t, shape_from_args(dims, "flip")); });

  // ---- conversions ----
  cls.def("to", to_any);
  cls.def("type_as", [](const Tensor& t, const Tensor& o) { return t.to(o.dtype()); });
  cls.def("cpu", [](const Tensor& t) { return t.device().kind == "cpu" ? t : t.to(tessera::Device("cpu")); });
  cls.def("cuda", [](const Tensor& t, nb::handle d) {
    tessera::Device dev = d.is_none() ? tessera::Device("cuda", 0) : to_device(d);
    return t.device() == dev ? t : t.to(dev);
  }, nb::arg("device").none() = none);
#define TPY_CAST(name, T) cls.def(name, [](const Tensor& t) { return t.to(DType::T); })
  TPY_CAST("float", Float32); TPY_CAST("double", Float64); TPY_CAST("half", Float16); TPY_CAST("bfloat16", BFloat16);
  TPY_CAST("long", Int64); TPY_CAST("int", Int32); TPY_CAST("bool", Bool);
#undef TPY_CAST
}

}  // namespace

void bind_tensor_methods(nb::module_& m, nb::class_<Tensor>& cls) {
  nb::object namedtuple = nb::module_::import_("collections").attr("namedtuple");
  g_return_max = namedtuple("max", nb::make_tuple("values", "indices")).release();
  g_return_min = namedtuple("min", nb::make_tuple("values", "indices")).release();
  g_return_topk = namedtuple("topk", nb::make_tuple("values", "indices")).release();
  m.attr("_return_types") = nb::make_tuple(nb::borrow(g_return_max), nb::borrow(g_return_min), nb::borrow(g_return_topk));

  bind_math(cls);
  bind_reductions(cls);
  bind_movement(cls);
}

}  // namespace tpy
