// tessera::Tensor: a handle to a mutable tensor whose value is either pending (a node of the lazy
// graph) or realized (a buffer on a device). Ops only trace; values are computed when read
// (item(), to_vector(), printing) or on tessera::sync(), all pending tensors in one graph.
//
// Methods or free functions? libtorch's rule:
//  - Every op is a free function: tessera::exp(x), tessera::softmax(x, 1), tessera::reshape(x, s)
//    (here and in ops.h). That is where an op is written and documented.
//  - The common ones are also methods, with libtorch's names and defaults: x.exp(), x.softmax(1),
//    x.reshape(s). A method is a one-line forward to its free function, never a second
//    implementation. The method set is the list below; an op missing from it (erf, gelu, where,
//    cat, conv2d, layer_norm ...) is called as a free function only.
//  - Methods only: what belongs to the handle itself or that libtorch has only as a method:
//    metadata (shape(), dtype() ...), reading values (item(), to_vector()), conversions (to(),
//    contiguous(), view()), in-place ops (add_(), +=, copy_(), fill_(), index_put_()) and
//    autodiff (requires_grad_(), backward(), grad(), detach()).
// Reductions take their dims as a list ({1} or {0, 2}; empty = all), except max(dim)/min(dim),
// which return values and indices like libtorch's; amax/amin reduce several dims to values.
#pragma once
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
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

namespace indexing {
class TensorIndex;
}

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
  // Whether the graph computing this value failed while running: using or reading the tensor
  // throws that failure (sync(); "Failure isolation" in docs/architecture.md).
  bool failed() const;
  // How many values in-place ops gave this tensor, less those a failed graph took back (roughly
  // PyTorch's _version). Optimizers read it to tell whether their last step landed.
  int64_t version() const;
  // Whether both handles name the same tensor (copies of a handle share it, as in PyTorch).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // Replaces this tensor's value with new_data's (shape, dtype and device included), keeping
  // its identity: other handles and its autodiff state (requires_grad, grad) see the new value.
  void set_data(const Tensor& new_data);

  // ---- reading values (each realizes all pending tensors and counts one host sync) ----
  double item() const;  // one-element tensors only
  // The same converted to T: float, double, int32_t, int64_t, uint8_t or bool.
  template <class T> T item() const;
  template <class T> std::vector<T> to_vector() const;
  std::string str() const;  // values, dtype and shape, like PyTorch's repr
  // Zero-copy reading (numpy and DLPack from Python): realizes the value (a counted host sync)
  // and returns the address of its buffer when the device keeps buffers in host memory (the cpu
  // backend), else nullptr (read through to_vector there). `keep` receives a share of that
  // buffer: the memory stays valid while the share lives, whatever happens to this tensor (a
  // shared buffer is never donated, so in-place ops on the tensor write a new one). It holds
  // numel() elements of dtype() in row-major order (bool: 1 byte; float16/bfloat16: 2).
  void* host_data(std::shared_ptr<void>* keep) const;

  // ---- conversions ----
  Tensor to(DType t) const;  // cast
  Tensor to(const Device& d) const;  // explicit copy between devices
  Tensor contiguous() const { return *this; }  // a no-op: values here have no strides
  // A new tensor with the same value and history (in-place ops on it leave this one alone).
  Tensor clone() const;

  // ---- elementwise (forwards to the free functions of the same name) ----
  Tensor operator-() const;  // neg
  Tensor neg() const;
  Tensor abs() const;
  Tensor sign() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor square() const;
  Tensor reciprocal() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor pow(const Tensor& exponent) const;
  Tensor pow(double exponent) const;
  Tensor clamp(std::optional<double> min, std::optional<double> max = std::nullopt) const;
  Tensor masked_fill(const Tensor& mask, double value) const;

  // ---- reductions (dims may be negative; empty dims = all) ----
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor amax(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor amin(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor max() const;  // of every element
  Tensor min() const;
  // Values and indices (int64) of the first maximum/minimum along dim: auto [v, i] = x.max(1).
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor logsumexp(std::vector<int64_t> dims, bool keepdim = false) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // ---- movement (views in the graph; no copy unless the result is realized) ----
  Tensor reshape(Shape s) const;  // one entry may be -1
  Tensor view(Shape s) const;     // reshape: every tensor here can be viewed in any shape
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor permute(std::vector<int64_t> perm) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor expand(Shape s) const;   // -1 keeps a dimension
  Tensor repeat(const std::vector<int64_t>& repeats) const;
  Tensor slice(int64_t dim, int64_t start, int64_t stop, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor matmul(const Tensor& other) const;
  // libtorch's indexing (tessera::indexing: Slice, None, Ellipsis): x.index({Slice(), 0}) is
  // Python's x[:, 0]. An integer picks one element and drops its dim; Slice(start, stop, step)
  // slices (absent bounds: the whole dim; step >= 1); None inserts a dim of extent 1; Ellipsis
  // stands for every dim not indexed otherwise; one integer Tensor index selects along its dim
  // (x.index({Slice(), idx}) is index_select(x, 1, idx) for a 1-D idx; negative entries count
  // from the end). The result is a view.
  Tensor index(const std::vector<indexing::TensorIndex>& indices) const;

  // ---- in place: rebinds this tensor to a new value (no-op on other handles' values) ----
  // Refused on views and, outside NoGradGuard, on leaves that require grad.
  Tensor& add_(const Tensor& o);
  Tensor& add_(double s);
  Tensor& sub_(const Tensor& o);
  Tensor& sub_(double s);
  Tensor& mul_(const Tensor& o);
  Tensor& mul_(double s);
  Tensor& div_(const Tensor& o);
  Tensor& div_(double s);
  Tensor& operator+=(const Tensor& o) { return add_(o); }
  Tensor& operator+=(double s) { return add_(s); }
  Tensor& operator-=(const Tensor& o) { return sub_(o); }
  Tensor& operator-=(double s) { return sub_(s); }
  Tensor& operator*=(const Tensor& o) { return mul_(o); }
  Tensor& operator*=(double s) { return mul_(s); }
  Tensor& operator/=(const Tensor& o) { return div_(o); }
  Tensor& operator/=(double s) { return div_(s); }
  Tensor& copy_(const Tensor& src);  // src is broadcast and cast to this tensor's shape/dtype
  Tensor& fill_(double value);
  Tensor& zero_();
  // Python's x[...] = value: index_put (below) in place.
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, const Tensor& value);
  Tensor& index_put_(const std::vector<indexing::TensorIndex>& indices, double value);

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

namespace indexing {
// Python's slice: absent bounds take the whole dimension (start 0, stop its extent, step 1);
// negative bounds count from the end and are clamped like Python's.
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : start(start), stop(stop), step(step) {}
  std::optional<int64_t> start, stop, step;
};
inline constexpr std::nullopt_t None = std::nullopt;  // a bound that is absent; as an index, a new dim
struct EllipsisIndexType {
  explicit EllipsisIndexType() = default;
};
inline constexpr EllipsisIndexType Ellipsis{};

// One entry of Tensor::index: an integer, a Slice, None, Ellipsis or an integer Tensor.
class TensorIndex {
 public:
  enum class Kind { Integer, Slice, None, Ellipsis, Tensor };
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  TensorIndex(I i) : kind_(Kind::Integer), integer_(int64_t(i)) {}  // NOLINT: implicit, as in libtorch
  TensorIndex(Slice s) : kind_(Kind::Slice), slice_(s) {}            // NOLINT
  TensorIndex(std::nullopt_t) : kind_(Kind::None) {}                 // NOLINT
  TensorIndex(EllipsisIndexType) : kind_(Kind::Ellipsis) {}          // NOLINT
  TensorIndex(Tensor t) : kind_(Kind::Tensor), tensor_(std::move(t)) {}  // NOLINT

  Kind kind() const { return kind_; }
  int64_t integer() const { return integer_; }
  const Slice& slice() const { return slice_; }
  const Tensor& tensor() const { return tensor_; }

 private:
  Kind kind_;
  int64_t integer_ = 0;
  Slice slice_;
  Tensor tensor_;
};
}  // namespace indexing

// x.index(indices) and its functional write: a copy of x with `value` (cast to x's dtype and
// broadcast to x.index(indices).shape()) written where x.index(indices) reads. index_put takes
// integer and Slice indices (with None and Ellipsis), not tensor ones.
Tensor index(const Tensor& a, const std::vector<indexing::TensorIndex>& indices);
Tensor index_put(const Tensor& a, const std::vector<indexing::TensorIndex>& indices, const Tensor& value);

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
Tensor reshape(const Tensor& a, Shape s);  // one entry may be -1
Tensor permute(const Tensor& a, std::vector<int64_t> perm);
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1);
Tensor expand(const Tensor& a, Shape s);  // -1 keeps a dimension
// Elements start, start+step, ... below stop along `dim` (PyTorch slicing; step >= 1;
// start/stop may be negative and are clamped like Python's).
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t stop, int64_t step = 1);
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
// Switches recording on or off for the calling thread (torch.set_grad_enabled; NoGradGuard and
// Python's no_grad/enable_grad save and restore it).
void set_grad_enabled(bool on);

// Realizes every pending tensor still referenced by a live handle (one graph per device). When a
// graph fails while running, it throws that error once, after confining it: the tensors that
// depended on the failure become failed() (using or reading one throws it again), tensors updated
// in place by the failed step get their values from before it back, the rest are computed.
void sync();
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// The global random generator: a seed and an offset that advances per executed graph that
// draws. Saving and restoring both (checkpoints) reproduces every later draw. manual_seed first
// realizes the random tensors still pending (sync()), so that, as in PyTorch, a tensor drawn
// before it keeps the numbers of the seed it was drawn under.
void manual_seed(uint64_t seed);
struct RngState {
  uint64_t seed = 0, offset = 0;
  // Draws traced since the last sync (numbered from the offset when it runs). Restoring a state
  // taken before a trace that is then discarded takes its draws back.
  uint32_t draws = 0;
};
RngState rng_state();
void set_rng_state(const RngState& s);
// A batch slice being traced (gradient accumulation over micro-batches, optim::accumulate_gradients):
// while in force, a random tensor whose leading extent is `rows` draws rows [start, start + rows)
// of the numbers the whole batch's tensor would draw (its element indices start at
// start * numel / rows), so dropout gives the same mask sliced or not; and batch_norm in training
// mode, whose statistics couple the batch, is refused. Scopes nest; the previous one returns.
class BatchSliceScope {
 public:
  BatchSliceScope(int64_t start, int64_t rows);
  ~BatchSliceScope();
  BatchSliceScope(const BatchSliceScope&) = delete;
  BatchSliceScope& operator=(const BatchSliceScope&) = delete;

 private:
  int64_t prev_start_, prev_rows_;
};

}  // namespace tessera
#pragma GCC visibility pop
