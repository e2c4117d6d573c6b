// The op surface beyond tensor.h: math, reductions, views, indexing and the composites that
// networks are built from. Primitives are marked (P); everything else is a decomposition into
// primitives, so every backend runs it and autodiff differentiates it.
#pragma once
#include <optional>
#include <tuple>
#include <vector>

#include "tessera/tensor.h"

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

// ---- factories ----
Tensor linspace(double start, double end, int64_t steps, TensorOptions o = {});
Tensor eye(int64_t n, int64_t m = -1, TensorOptions o = {});
// Integers uniform in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& s, TensorOptions o = {DType::Int64, Device("cpu")});
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);

// ---- elementwise math (integers promote to float32 where the result is fractional) ----
Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);    // (P)
Tensor sign(const Tensor& a);   // (P) non-differentiable: zero gradient
Tensor sqrt(const Tensor& a);   // (P)
Tensor rsqrt(const Tensor& a);
Tensor reciprocal(const Tensor& a);
Tensor square(const Tensor& a);
Tensor sin(const Tensor& a);    // (P)
Tensor cos(const Tensor& a);    // (P)
Tensor erf(const Tensor& a);    // (P)
Tensor floor(const Tensor& a);  // (P) non-differentiable
Tensor ceil(const Tensor& a);   // (P) non-differentiable
Tensor round(const Tensor& a);  // (P) half to even; non-differentiable
Tensor pow(const Tensor& a, const Tensor& b);  // (P)
Tensor pow(const Tensor& a, double exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approximation = false);
Tensor silu(const Tensor& a);
Tensor softplus(const Tensor& a, double beta = 1, double threshold = 20);
// Bounds may be absent; the gradient passes where lo <= a <= hi (PyTorch's rule).
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi);

// ---- logical (bool in, bool out; other dtypes compare with zero) ----
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);

// ---- reductions (dims may be negative; empty dims = all) ----
Tensor sum(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);  // max values
Tensor amin(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor max(const Tensor& a);  // of every element (amax over all dims)
Tensor min(const Tensor& a);
// Values and indices (int64) of the first maximum/minimum along dim, as libtorch's max(dim):
// auto [values, indices] = max(x, 1). The values' gradient goes to that first extreme.
std::tuple<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
// Index of the first maximum/minimum along dim (int64); dim absent: over the flattened tensor.
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor argmin(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// correction = 1 is the unbiased estimator (PyTorch's default).
Tensor var(const Tensor& a, std::vector<int64_t> dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& a, std::vector<int64_t> dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim = false);

// Running sums along dim (torch.cumsum): a product with a triangular matrix of ones, so every
// backend runs it and autodiff differentiates it (O(n^2) in the dim's extent; integers and bool
// sum as int64, exact up to 2^53).
Tensor cumsum(const Tensor& a, int64_t dim);
// The k largest (largest = false: smallest) elements along dim and their int64 indices, in
// order (ties: the lower index first). The values' gradient goes to the elements picked.
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
// num_samples int64 category indices per row of the non-negative weights [C] or [N, C] (rows
// need not sum to 1), drawn from the global generator (Gumbel-max: exact draws, a different
// stream than PyTorch's). Without replacement each row's indices differ (num_samples <= C).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

// ---- views and reshaping ----
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor squeeze(const Tensor& a);  // every extent-1 dimension
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor repeat(const Tensor& a, const std::vector<int64_t>& repeats);  // torch.Tensor.repeat

// ---- selection and indexing ----
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
Tensor tril(const Tensor& a, int64_t diagonal = 0);  // last two dims
Tensor triu(const Tensor& a, int64_t diagonal = 0);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);  // index: 1-D integers
Tensor embedding(const Tensor& weight, const Tensor& indices);  // weight [V, D] -> indices.shape + [D]
// out = a; out[i with i_dim := index[i]] += src[i] (index and src of one shape)  (P)
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// a with `update` written at `offsets` (int64 [rank], a runtime value), each clamped so the
// update fits (XLA semantics)  (P)
Tensor dynamic_update_slice(const Tensor& a, const Tensor& update, const Tensor& offsets);

// ---- convolution and pooling (channels first: [batch, channels, spatial...]) ----
Tensor flip(const Tensor& a, std::vector<int64_t> dims);  // (P) reverses the given dims
// The general convolution (P): input [B, C, X...], weight [O, C/groups, K...]. Each per-dim
// vector has one entry per spatial dim, or one entry for all, or is empty (the default).
// lhs_dilation inserts zeros between input elements (transposed convolutions); padding is
// applied after it and may be negative (crops); rhs_dilation spaces the kernel taps.
struct ConvGeneralOptions {
  std::vector<int64_t> stride, pad_lo, pad_hi, lhs_dilation, rhs_dilation;
  int64_t groups = 1;
};
Tensor conv_general(const Tensor& input, const Tensor& weight, const ConvGeneralOptions& o = {});
// PyTorch's conv1d/conv2d/conv_transpose2d (symmetric padding; bias optional). Per-dim
// vectors may hold one value for every spatial dim.
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1);
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), std::vector<int64_t> stride = {1},
              std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1}, int64_t groups = 1);
// weight [C_in, C_out/groups, kH, kW]; output extent (in-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                        std::vector<int64_t> stride = {1}, std::vector<int64_t> padding = {0},
                        std::vector<int64_t> output_padding = {0}, int64_t groups = 1, std::vector<int64_t> dilation = {1});
// Pooling over the last two dims of [N, C, H, W] (or [C, H, W]); stride defaults to the kernel;
// padding at most half the kernel. Max pooling pads with -inf and its gradient goes to the
// first maximum of each window (row-major); average pooling pads with zeros.
Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0});
Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0}, bool count_include_pad = true);
// PyTorch's adaptive windows: output cell i covers [floor(i*H/OH), ceil((i+1)*H/OH)).
Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size);
// Batch normalization over every dim but 1 of [N, C, ...]. In training it normalizes with the
// batch statistics and, when running_mean/running_var are defined, updates them in place
// (r = (1 - momentum) * r + momentum * batch statistic; the variance unbiased), without
// autodiff history; in eval it normalizes with the running statistics. weight/bias optional.
Tensor batch_norm(const Tensor& input, Tensor running_mean, Tensor running_var, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), bool training = true, double momentum = 0.1, double eps = 1e-5);

// ---- composites for networks ----
Tensor softmax(const Tensor& a, int64_t dim);      // numerically stable
Tensor log_softmax(const Tensor& a, int64_t dim);
// Normalizes over the trailing dims given by normalized_shape; weight/bias optional.
Tensor layer_norm(const Tensor& a, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// ---- losses (libtorch's semantics and defaults) ----
enum class Reduction { None, Mean, Sum };
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;  // Mean: over targets != ignore_index
  int64_t ignore_index = -100;            // targets equal to it add nothing (0 under None)
  double label_smoothing = 0;             // in [0, 1]: mixes the one-hot target with uniform
};
// Cross entropy of logits [N, C] against integer class targets [N]; also logits [C] with a
// scalar target, and [N, C, d1, ...] with targets [N, d1, ...] (classes along dim 1).
// Reduction::None gives one loss per target, shaped like the targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o = {});
struct NLLLossOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
};
// Negative log likelihood of log-probabilities [N, C] at integer targets [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& o = {});
// Squared error of two tensors of one shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace tessera
#pragma GCC visibility pop
