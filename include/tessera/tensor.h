// tessera::Tensor: a handle to a mutable tensor whose value is either pending (a node of the lazy
// graph) or realized (a buffer on a device). Ops only trace; values are computed when read
// (item(), to_vector(), printing) or on tessera::sync(), all pending tensors in one graph.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/device.h"
#include "tessera/dtype.h"
#include "tessera/error.h"
#include "tessera/shape.h"

namespace tessera {
struct TensorImpl;  // internal (src/tensor/tensor_impl.h): declared before the exported region
namespace detail {
struct TensorAccess;
}
}  // namespace tessera

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

class Tensor {
 public:
  Tensor() = default;  // undefined; most calls on it throw

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool is_realized() const;  // true once the value lives in a buffer
  // Whether both handles name the same tensor (copies of a handle share it, as in PyTorch).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // Replaces this tensor's value with new_data's (shape, dtype and device included), keeping
  // its identity: other handles and its autodiff state (requires_grad, grad) see the new value.
  void set_data(const Tensor& new_data);

  // ---- reading values (each realizes all pending tensors and counts one host sync) ----
  double item() const;  // one-element tensors only
  template <class T> std::vector<T> to_vector() const;
  std::string str() const;  // values, dtype and shape, like PyTorch's repr

  // ---- elementwise (broadcasting, PyTorch promotion; C++ scalars are weakly typed) ----
  Tensor operator-() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor tanh() const;
  Tensor to(DType t) const;  // cast
  Tensor to(const Device& d) const;  // explicit copy between devices

  // ---- reductions (dims may be negative; empty dims = all) ----
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor max(std::vector<int64_t> dims = {}, bool keepdim = false) const;

  // ---- movement (views in the graph; no copy unless the result is realized) ----
  Tensor reshape(Shape s) const;  // one entry may be -1
  Tensor permute(std::vector<int64_t> perm) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor expand(Shape s) const;   // -1 keeps a dimension
  // Elements start, start+step, ... below stop along `dim` (PyTorch slicing; step >= 1;
  // start/stop may be negative and are clamped like Python's).
  Tensor slice(int64_t dim, int64_t start, int64_t stop, int64_t step = 1) const;
  Tensor matmul(const Tensor& other) const;

  // ---- in place: rebinds this tensor to a new value (no-op on other handles' values) ----
  Tensor& add_(const Tensor& o);
  Tensor& add_(double s);
  Tensor& sub_(const Tensor& o);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(double s);
  Tensor& div_(const Tensor& o);
  Tensor& copy_(const Tensor& src);  // src is broadcast and cast to this tensor's shape/dtype

  // ---- autodiff ----
  // Marks a leaf as needing a gradient (like PyTorch's requires_grad_).
  Tensor& requires_grad_(bool on = true);
  bool requires_grad() const;
  bool is_leaf() const;  // no recorded history (created by the user, or needs no gradient)
  // The accumulated gradient of a leaf (undefined until a backward pass reaches it).
  Tensor grad() const;
  void set_grad(const Tensor& g);  // an undefined tensor clears it
  // Accumulates d(this)/d(leaf) into every leaf's grad(); `gradient` defaults to ones and is
  // required unless this tensor has one element. Emits lazy IR: nothing runs until a sync.
  void backward(const Tensor& gradient = Tensor()) const;
  // The same value without history.
  Tensor detach() const;


 private:
  friend struct detail::TensorAccess;  // the library's own layers (not part of the API)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) noexcept : impl_(std::move(impl)) {}
  std::shared_ptr<TensorImpl> impl_;
};

// ---- factories ----
struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device("cpu");
};
Tensor zeros(const Shape& s, TensorOptions o = {});
Tensor ones(const Shape& s, TensorOptions o = {});
Tensor full(const Shape& s, double value, TensorOptions o = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// Values start, start+step, ... below end; int64 when all three are integers unless o says otherwise.
Tensor arange(double end, std::optional<TensorOptions> o = std::nullopt);
Tensor arange(double start, double end, double step = 1, std::optional<TensorOptions> o = std::nullopt);
Tensor rand(const Shape& s, TensorOptions o = {});   // uniform in [0, 1)
Tensor randn(const Shape& s, TensorOptions o = {});  // standard normal
// Copies host data into a new realized tensor (numel(s) must equal data.size()).
template <class T>
__attribute__((visibility("default"))) Tensor from_vector(const std::vector<T>& data, const Shape& s, TensorOptions o = {});
// Instantiated in the library for these element types (as Tensor::to_vector is); the attribute
// exports them (#pragma GCC visibility does not reach template instantiations).
extern template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
extern template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
extern template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
extern template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
extern template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
Tensor scalar_tensor(double v, TensorOptions o = {});

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers divide as float32
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, double s);
Tensor operator>(const Tensor& a, double s);
Tensor operator<=(const Tensor& a, double s);
Tensor operator>=(const Tensor& a, double s);

// ---- movement and indexing ----
// Pads each dimension with lo/hi elements of `value`; pads.size() == 2 * dim(), ordered
// {lo0, hi0, lo1, hi1, ...} from the first dimension (unlike torch.nn.functional.pad).
Tensor pad(const Tensor& a, const std::vector<int64_t>& pads, double value = 0);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor matmul(const Tensor& a, const Tensor& b);  // batched, batch dims broadcast
// out[i][j][k] = a[index[i][j][k]][j][k] for dim 0 (torch.gather); index is int32/int64 and
// each entry must lie in [0, a.size(dim)) -- checked when the graph runs.
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);

// While alive, ops record no autodiff history (like torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
bool grad_enabled();

// Realizes every pending tensor still referenced by a live handle (one graph per device).
void sync();
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// The global random generator: a seed and an offset that advances per executed graph that
// draws. Saving and restoring both (checkpoints) reproduces every later draw.
void manual_seed(uint64_t seed);
struct RngState {
  uint64_t seed = 0, offset = 0;
};
RngState rng_state();
void set_rng_state(const RngState& s);

}  // namespace tessera
#pragma GCC visibility pop
