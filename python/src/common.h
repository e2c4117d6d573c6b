// Shared by the binding's translation units: argument conversion (dtypes, devices, dims, Python
// scalars as PyTorch's weakly typed operands) and the registration functions of each part.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tessera/profiler.h>
#include <tessera/tessera.h>

namespace tpy {
namespace nb = nanobind;
using tessera::DType;
using tessera::Shape;
using tessera::Tensor;

// tessera.dtype: one Python object per DType (tessera.float32 is x.dtype, so `is` works).
struct PyDType {
  DType t;
};
nb::object dtype_object(DType t);
DType to_dtype(nb::handle h);                        // a tessera.dtype (or Python float/int/bool)
std::optional<DType> to_dtype_opt(nb::handle h);     // None -> nullopt
tessera::Device to_device(nb::handle h);             // "cpu", "cuda:0", tessera.device, int
std::optional<tessera::Device> to_device_opt(nb::handle h);
bool is_dtype(nb::handle h);
bool is_device_like(nb::handle h);                   // a str or tessera.device

// Dims: an int, a tuple/list of ints, or None (all).
std::vector<int64_t> to_dims(nb::handle h);
// A shape given as f(2, 3) or f((2, 3)) or f([2, 3]).
Shape shape_from_args(const nb::args& args, const char* op);
Shape to_shape(nb::handle h);
nb::tuple shape_tuple(const Shape& s);

inline bool is_tensor(nb::handle h) { return nb::isinstance<Tensor>(h); }
inline Tensor& as_tensor(nb::handle h) { return nb::cast<Tensor&>(h, false); }

// A binary operand: a Tensor as is; a Python bool/int/float as a 0-d tensor of the dtype
// PyTorch's weak scalar promotion gives next to `like`; anything array-like via tessera.tensor.
Tensor operand(const Tensor& like, nb::handle h, const char* op);
// PyTorch treats a 0-d tensor next to a higher-rank one of the same kind like a scalar: it does
// not widen the result (float32 + float64 0-d -> float32). Applies that to a pair.
void weak_zero_dim(Tensor& a, Tensor& b);
Tensor from_python(nb::handle data, std::optional<DType> dtype, std::optional<tessera::Device> device);

void register_errors(nb::module_& m);
void bind_types(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_tensor_methods(nb::module_& m, nb::class_<Tensor>& cls);
void bind_indexing(nb::class_<Tensor>& cls);
void bind_interop(nb::module_& m, nb::class_<Tensor>& cls);
void bind_factories(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_optim(nb::module_& m);  // optim.cpp: tessera._C._optim (tessera.optim's kernels)
void bind_onnx(nb::module_& m);   // onnx.cpp: tessera._C._onnx (tessera.onnx), where ONNX import is built

}  // namespace tpy
