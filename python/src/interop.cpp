// Values in and out: Python numbers and lists, numpy arrays, DLPack (both ways), tolist/item,
// safetensors files. Out (numpy(), __dlpack__) shares a cpu tensor's buffer (Tensor::host_data);
// in copies once (docs/python.md says why).
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>

#include "common.h"

namespace tpy {
namespace {

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// The array's From elements as To values in a new tensor (from_vector takes the To vector).
template <class From, class To = From>
Tensor copy_in(const HostArray& a, const Shape& s, DType dtype, const tessera::Device& dev) {
  const From* p = static_cast<const From*>(a.data());
  std::vector<To> v(p, p + a.size());
  return tessera::from_vector(v, s, {dtype, dev});
}

// A host array (numpy, or any DLPack producer on the CPU) into a new tensor; `floats_as_f32`
// maps float64 to float32 (Python lists, as torch.tensor([1.5]) is float32).
Tensor from_array(const HostArray& a, bool floats_as_f32, const tessera::Device& dev) {
  Shape s;
  for (size_t i = 0; i < a.ndim(); ++i) s.push_back(static_cast<int64_t>(a.shape(i)));
  nb::dlpack::dtype t = a.dtype();
  using Code = nb::dlpack::dtype_code;
  auto code = static_cast<Code>(t.code);
  if (code == Code::Float && t.bits == 32) return copy_in<float>(a, s, DType::Float32, dev);
  if (code == Code::Float && t.bits == 64)
    return floats_as_f32 ? copy_in<double, float>(a, s, DType::Float32, dev) : copy_in<double>(a, s, DType::Float64, dev);
  if (code == Code::Int && t.bits == 64) return copy_in<int64_t>(a, s, DType::Int64, dev);
  if (code == Code::Int && t.bits == 32) return copy_in<int32_t>(a, s, DType::Int32, dev);
  if (code == Code::Bool) return copy_in<uint8_t>(a, s, DType::Bool, dev);
  // Narrow integers widen to int32 (tessera has no 8/16-bit integer dtypes): values are kept.
  if (code == Code::UInt && t.bits == 8) return copy_in<uint8_t, int32_t>(a, s, DType::Int32, dev);
  if (code == Code::Int && t.bits == 8) return copy_in<int8_t, int32_t>(a, s, DType::Int32, dev);
  if (code == Code::Int && t.bits == 16) return copy_in<int16_t, int32_t>(a, s, DType::Int32, dev);
  if (code == Code::UInt && t.bits == 16) return copy_in<uint16_t, int32_t>(a, s, DType::Int32, dev);
  throw nb::type_error(("unsupported array element type (DLPack code " + std::to_string(t.code) + ", " +
                        std::to_string(t.bits) + " bits): Tessera takes bool, int8-64, uint8/16, float32/64 (and "
                        "float16/bfloat16 through float32)").c_str());
}

nb::handle numpy_module() {
  static nb::handle np = nb::module_::import_("numpy").release();  // never released (see types.cpp)
  return np;
}

// A host copy of t as a numpy array (the array owns the copy).
template <class T>
nb::object to_numpy_as(const Tensor& t, const char* np_dtype = nullptr) {
  auto* v = new std::vector<T>(t.to_vector<T>());
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  nb::object arr = nb::cast(nb::ndarray<nb::numpy, T>(v->data(), shape.size(), shape.data(), owner));
  return np_dtype ? arr.attr("view")(np_dtype) : arr;
}

// bool: numpy's bool, or for DLPack uint8, which is how PyTorch 1.13 exchanges bool (it rejects
// DLPack's newer bool code).
nb::dlpack::dtype dl_dtype(DType t, bool dlpack) {
  using Code = nb::dlpack::dtype_code;
  auto d = [](Code c, int bits) { return nb::dlpack::dtype{static_cast<uint8_t>(c), static_cast<uint8_t>(bits), 1}; };
  switch (t) {
    case DType::Bool: return dlpack ? d(Code::UInt, 8) : d(Code::Bool, 8);
    case DType::Int32: return d(Code::Int, 32);
    case DType::Int64: return d(Code::Int, 64);
    case DType::Float16: return d(Code::Float, 16);
    case DType::BFloat16: return d(Code::Bfloat, 16);
    case DType::Float32: return d(Code::Float, 32);
    case DType::Float64: return d(Code::Float, 64);
  }
  return d(Code::Float, 32);
}

// The tensor's own host buffer as an array, no copy (a read-only numpy array, or a DLPack
// capsule); None where the device keeps no host memory. The array holds a
// share of the buffer, so it stays valid whatever happens to the tensor later. numpy's is
// read-only: tessera reads buffers when a graph runs, later than PyTorch's eager ops would, so a
// write through the array could reach ops traced before it; refusing the write is loud.
nb::object host_view(const Tensor& t, bool numpy) {
  if (t.numel() == 0) return nb::none();
  auto* keep = new std::shared_ptr<void>();
  void* p = t.host_data(keep);
  if (!p) {
    delete keep;
    return nb::none();
  }
  nb::capsule owner(keep, [](void* k) noexcept { delete static_cast<std::shared_ptr<void>*>(k); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  if (numpy)
    return nb::cast(nb::ndarray<nb::numpy, nb::ro, nb::device::cpu>(p, shape.size(), shape.data(), owner, nullptr,
                                                                      dl_dtype(t.dtype(), false)));
  return nb::cast(nb::ndarray<nb::device::cpu>(p, shape.size(), shape.data(), owner, nullptr, dl_dtype(t.dtype(), true)));
}

nb::object to_numpy(const Tensor& t) {
  if (t.requires_grad())
    throw nb::type_error("Can't call numpy() on a tensor that requires grad; use tensor.detach().numpy()");
  if (t.dtype() == DType::BFloat16) throw nb::type_error("numpy has no bfloat16: convert with .float() first");
  nb::object view = host_view(t, true);
  if (!view.is_none()) return view;
  switch (t.dtype()) {  // a device without host memory, or no elements: a host copy
    case DType::Float32: return to_numpy_as<float>(t);
    case DType::Float64: return to_numpy_as<double>(t);
    case DType::Int32: return to_numpy_as<int32_t>(t);
    case DType::Int64: return to_numpy_as<int64_t>(t);
    case DType::Bool: return to_numpy_as<uint8_t>(t, "bool");
    case DType::Float16: return to_numpy_as<float>(t).attr("astype")("float16");
    case DType::BFloat16: break;
  }
  return nb::none();
}

// Nested lists of Python numbers, as torch's tolist().
template <class T>
nb::object nest(const std::vector<T>& v, const Shape& s, size_t dim, size_t& pos) {
  if (dim == s.size()) {
    T x = v[pos++];
    return nb::cast(x);
  }
  nb::list l;
  for (int64_t i = 0; i < s[dim]; ++i) l.append(nest(v, s, dim + 1, pos));
  return l;
}
nb::object tolist(const Tensor& t) {
  size_t pos = 0;
  if (t.dtype() == DType::Bool) {
    std::vector<uint8_t> u = t.to_vector<uint8_t>();
    return nest(std::vector<bool>(u.begin(), u.end()), t.shape(), 0, pos);
  }
  if (tessera::is_integral(t.dtype())) return nest(t.to_vector<int64_t>(), t.shape(), 0, pos);
  return nest(t.to_vector<double>(), t.shape(), 0, pos);
}

nb::object item(const Tensor& t) {
  if (t.numel() != 1)
    throw nb::value_error(("a Tensor with " + std::to_string(t.numel()) + " elements cannot be converted to a Python scalar").c_str());
  if (t.dtype() == DType::Bool) return nb::bool_(t.item<bool>());
  if (tessera::is_integral(t.dtype())) return nb::int_(t.item<int64_t>());
  return nb::float_(t.item());
}

}  // namespace

Tensor from_python(nb::handle data, std::optional<DType> dtype, std::optional<tessera::Device> device) {
  tessera::Device dev = device.value_or(tessera::Device("cpu"));
  Tensor t;
  PyObject* p = data.ptr();
  if (is_tensor(data)) {  // torch.tensor(t): an independent copy without history
    t = as_tensor(data).detach().clone();
    if (device && t.device() != dev) t = t.to(dev);
  } else if (PyBool_Check(p)) {  // numbers become data, not graph constants: a new value never recompiles
    t = tessera::from_vector(std::vector<uint8_t>{p == Py_True}, {}, {DType::Bool, dev});
  } else if (PyLong_Check(p)) {
    t = tessera::from_vector(std::vector<int64_t>{nb::cast<int64_t>(data)}, {}, {DType::Int64, dev});
  } else if (PyFloat_Check(p)) {
    t = tessera::from_vector(std::vector<float>{static_cast<float>(PyFloat_AS_DOUBLE(p))}, {}, {DType::Float32, dev});
  } else {
    bool is_list = nb::isinstance<nb::list>(data) || nb::isinstance<nb::tuple>(data);
    nb::object arr = nb::borrow(data);
    if (!nb::hasattr(data, "__dlpack__")) arr = numpy_module().attr("asarray")(data);
    // float16/bfloat16 producers: through float32 (from_vector has no half types).
    nb::object src_dtype = nb::hasattr(arr, "dtype") ? arr.attr("dtype") : nb::none();
    std::string dname = src_dtype.is_none() ? "" : nb::cast<std::string>(nb::str(src_dtype));
    std::optional<DType> half;
    if (dname.find("bfloat16") != std::string::npos) half = DType::BFloat16;
    else if (dname.find("float16") != std::string::npos) half = DType::Float16;
    if (half) arr = nb::hasattr(arr, "astype") ? arr.attr("astype")("float32") : arr.attr("float")();
    if (!nb::hasattr(arr, "__dlpack__") && !nb::hasattr(arr, "__array_interface__"))
      throw nb::type_error((std::string("cannot make a tensor from ") + nb::repr(data).c_str()).c_str());
    if (nb::hasattr(arr, "is_contiguous") && !nb::cast<bool>(arr.attr("is_contiguous")())) arr = arr.attr("contiguous")();
    HostArray a;
    if (!nb::try_cast(arr, a, true)) {
      arr = numpy_module().attr("ascontiguousarray")(arr);
      if (!nb::try_cast(arr, a, true))
        throw nb::type_error((std::string("cannot make a tensor from ") + nb::repr(data).c_str()).c_str());
    }
    t = from_array(a, is_list, dev);
    if (half) t = t.to(*half);
  }
  if (dtype && *dtype != t.dtype()) t = t.to(*dtype);
  return t;
}

void bind_interop(nb::module_& m, nb::class_<Tensor>& cls) {
  cls.def("item", item);
  cls.def("tolist", tolist);
  cls.def("numpy", to_numpy);
  cls.def("__array__", [](const Tensor& t, nb::handle dtype) {
    nb::object a = to_numpy(t);
    return dtype.is_none() ? a : a.attr("astype")(dtype);
  }, nb::arg("dtype").none() = nb::none());
  cls.def("__float__", [](const Tensor& t) { return nb::cast<double>(item(t)); });
  cls.def("__int__", [](const Tensor& t) { return nb::cast<int64_t>(nb::int_(item(t))); });
  cls.def("__bool__", [](const Tensor& t) {
    if (t.numel() != 1)
      throw nb::value_error(("Boolean value of a Tensor with " + std::to_string(t.numel()) + " elements is ambiguous").c_str());
    return t.item<bool>();
  });
  cls.def("__index__", [](const Tensor& t) {
    if (!tessera::is_integral(t.dtype()) || t.numel() != 1)
      throw nb::type_error("only integer tensors of a single element can be converted to an index");
    return t.item<int64_t>();
  });
  // DLPack export: the tensor's own host buffer where it has one (cpu), else a host copy; either
  // way the consumer sees host memory (kDLCPU).
  cls.def("__dlpack__", [](const Tensor& t, nb::handle stream) {
    (void)stream;
    Tensor d = t.detach();
    nb::object capsule = host_view(d, false);  // nanobind hands a framework-less ndarray out as a DLPack capsule
    if (!capsule.is_none()) return capsule;
    return to_numpy(d.device().kind == "cpu" ? d : d.to(tessera::Device("cpu"))).attr("__dlpack__")();
  }, nb::arg("stream").none() = nb::none());
  cls.def("__dlpack_device__", [](const Tensor&) { return nb::make_tuple(1, 0); });

  m.def("tensor", [](nb::handle data, nb::handle dtype, nb::handle device, bool requires_grad) {
    Tensor t = from_python(data, to_dtype_opt(dtype), to_device_opt(device));
    if (requires_grad) t.requires_grad_(true);
    return t;
  }, nb::arg("data"), nb::kw_only(), nb::arg("dtype").none() = nb::none(), nb::arg("device").none() = nb::none(),
     nb::arg("requires_grad") = false);
  m.def("as_tensor", [](nb::handle data, nb::handle dtype, nb::handle device) -> nb::object {
    if (is_tensor(data) && dtype.is_none() && device.is_none()) return nb::borrow(data);
    return nb::cast(from_python(data, to_dtype_opt(dtype), to_device_opt(device)));
  }, nb::arg("data"), nb::arg("dtype").none() = nb::none(), nb::arg("device").none() = nb::none());
  m.def("from_numpy", [](nb::handle a) { return from_python(a, std::nullopt, std::nullopt); });
  m.def("from_dlpack", [](nb::handle a) {
    if (!nb::hasattr(a, "__dlpack__")) throw nb::type_error("from_dlpack expects an object with __dlpack__");
    return from_python(a, std::nullopt, std::nullopt);
  });

  m.def("save_file", [](const std::map<std::string, Tensor>& tensors, const std::string& path,
                        std::optional<std::map<std::string, std::string>> meta) {
    tessera::io::save_safetensors(path, tensors, meta.value_or(tessera::io::Metadata{}));
  }, nb::arg("tensors"), nb::arg("filename"), nb::arg("metadata").none() = nb::none());
  m.def("load_file", [](const std::string& path, nb::handle device) {
    return tessera::io::load_safetensors(path, nullptr, device.is_none() ? tessera::Device("cpu") : to_device(device));
  }, nb::arg("filename"), nb::arg("device").none() = nb::none());
}

}  // namespace tpy
