// tessera.zeros/ones/full/empty/arange/rand/randn/randint/linspace/eye and the *_like forms,
// with PyTorch's signatures (sizes as varargs or one tuple; dtype/device/requires_grad keywords).
#include "common.h"

namespace tpy {
namespace {

struct Opts {
  std::optional<DType> dtype;
  tessera::Device device{"cpu"};
  bool requires_grad = false;
};

// dtype=, device=, requires_grad= (layout/pin_memory/memory_format: accepted only at defaults).
Opts parse(const nb::kwargs& kw, const char* op, std::optional<tessera::Device> like_device = std::nullopt) {
  Opts o;
  if (like_device) o.device = *like_device;
  for (auto [k, v] : kw) {
    std::string key = nb::cast<std::string>(k);
    if (key == "dtype") o.dtype = to_dtype_opt(v);
    else if (key == "device") { if (!v.is_none()) o.device = to_device(v); }
    else if (key == "requires_grad") o.requires_grad = nb::cast<bool>(v);
    else if ((key == "layout" || key == "pin_memory" || key == "memory_format" || key == "generator") && (v.is_none() || v.ptr() == Py_False)) continue;
    else throw nb::type_error((std::string(op) + "() got an unexpected keyword argument '" + key + "' (not supported by Tessera)").c_str());
  }
  return o;
}

Tensor finish(Tensor t, const Opts& o) {
  if (o.requires_grad) t.requires_grad_(true);
  return t;
}

template <class F>
void def_sized(nb::module_& m, const char* name, F make) {
  m.def(name, [make, name](nb::args size, nb::kwargs kw) {
    Shape s;
    if (kw.contains("size")) {  // zeros(size=(2, 3))
      s = to_shape(kw["size"]);
      nb::del(kw["size"]);
    } else {
      s = shape_from_args(size, name);
    }
    Opts o = parse(kw, name);
    return finish(make(s, tessera::TensorOptions{o.dtype.value_or(DType::Float32), o.device}), o);
  });
}

template <class F>
void def_like(nb::module_& m, const char* name, F make) {
  m.def(name, [make, name](const Tensor& t, nb::kwargs kw) {
    Opts o = parse(kw, name, t.device());
    return finish(make(t.shape(), tessera::TensorOptions{o.dtype.value_or(t.dtype()), o.device}), o);
  }, nb::arg("input"), nb::arg("kwargs"));
}

DType scalar_dtype(nb::handle v) {
  if (PyBool_Check(v.ptr())) return DType::Bool;
  if (PyLong_Check(v.ptr())) return DType::Int64;
  return DType::Float32;
}
double number(nb::handle v) { return is_tensor(v) ? as_tensor(v).item() : nb::cast<double>(v); }

}  // namespace

void bind_factories(nb::module_& m) {
  def_sized(m, "zeros", [](const Shape& s, tessera::TensorOptions o) { return tessera::zeros(s, o); });
  def_sized(m, "ones", [](const Shape& s, tessera::TensorOptions o) { return tessera::ones(s, o); });
  // empty: zeros (a lazy constant costs nothing until realized; reading it is defined here).
  def_sized(m, "empty", [](const Shape& s, tessera::TensorOptions o) { return tessera::zeros(s, o); });
  def_sized(m, "rand", [](const Shape& s, tessera::TensorOptions o) { return tessera::rand(s, o); });
  def_sized(m, "randn", [](const Shape& s, tessera::TensorOptions o) { return tessera::randn(s, o); });
  def_like(m, "zeros_like", [](const Shape& s, tessera::TensorOptions o) { return tessera::zeros(s, o); });
  def_like(m, "ones_like", [](const Shape& s, tessera::TensorOptions o) { return tessera::ones(s, o); });
  def_like(m, "empty_like", [](const Shape& s, tessera::TensorOptions o) { return tessera::zeros(s, o); });
  def_like(m, "rand_like", [](const Shape& s, tessera::TensorOptions o) { return tessera::rand(s, o); });
  def_like(m, "randn_like", [](const Shape& s, tessera::TensorOptions o) { return tessera::randn(s, o); });
  m.def("full", [](nb::handle size, nb::handle value, nb::kwargs kw) {
    Opts o = parse(kw, "full");
    return finish(tessera::full(to_shape(size), number(value), {o.dtype.value_or(scalar_dtype(value)), o.device}), o);
  }, nb::arg("size"), nb::arg("fill_value"), nb::arg("kwargs"));
  m.def("full_like", [](const Tensor& t, nb::handle value, nb::kwargs kw) {
    Opts o = parse(kw, "full_like", t.device());
    return finish(tessera::full(t.shape(), number(value), {o.dtype.value_or(t.dtype()), o.device}), o);
  }, nb::arg("input"), nb::arg("fill_value"), nb::arg("kwargs"));
  m.def("arange", [](nb::handle a, nb::handle b, nb::handle step, nb::kwargs kw) {
    Opts o = parse(kw, "arange");
    bool ints = true;
    for (nb::handle h : {a, b, step})
      if (!h.is_none() && !PyLong_Check(h.ptr()) && !(is_tensor(h) && !tessera::is_floating(as_tensor(h).dtype()))) ints = false;
    DType t = o.dtype.value_or(ints ? DType::Int64 : DType::Float32);
    double start = b.is_none() ? 0 : number(a), end = b.is_none() ? number(a) : number(b);
    return finish(tessera::arange(start, end, step.is_none() ? 1 : number(step), tessera::TensorOptions{t, o.device}), o);
  }, nb::arg("start"), nb::arg("end").none() = nb::none(), nb::arg("step").none() = nb::none(), nb::arg("kwargs"));
  m.def("randint", [](nb::args args, nb::kwargs kw) {
    // randint(high, size) or randint(low, high, size); size may also come as a keyword.
    std::vector<nb::handle> pos(args.begin(), args.end());
    nb::object size_kw;
    nb::kwargs rest;
    for (auto [k, v] : kw) {
      std::string key = nb::cast<std::string>(k);
      if (key == "size") size_kw = nb::borrow(v);
      else if (key == "low" || key == "high") pos.insert(key == "low" ? pos.begin() : pos.end(), v);
      else rest[k] = v;
    }
    if (size_kw.is_valid()) pos.push_back(size_kw);
    if (pos.size() != 2 && pos.size() != 3) throw nb::type_error("randint(low=0, high, size, *, dtype=None, device=None)");
    int64_t low = pos.size() == 3 ? nb::cast<int64_t>(pos[0]) : 0, high = nb::cast<int64_t>(pos[pos.size() - 2]);
    Opts o = parse(rest, "randint");
    return finish(tessera::randint(low, high, to_shape(pos.back()), {o.dtype.value_or(DType::Int64), o.device}), o);
  });
  m.def("linspace", [](double start, double end, int64_t steps, nb::kwargs kw) {
    Opts o = parse(kw, "linspace");
    return finish(tessera::linspace(start, end, steps, {o.dtype.value_or(DType::Float32), o.device}), o);
  }, nb::arg("start"), nb::arg("end"), nb::arg("steps"), nb::arg("kwargs"));
  m.def("eye", [](int64_t n, std::optional<int64_t> cols, nb::kwargs kw) {
    Opts o = parse(kw, "eye");
    return finish(tessera::eye(n, cols.value_or(-1), {o.dtype.value_or(DType::Float32), o.device}), o);
  }, nb::arg("n"), nb::arg("m").none() = nb::none(), nb::arg("kwargs"));
}

}  // namespace tpy
