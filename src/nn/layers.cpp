#include <cmath>

#include "core/fail.h"
#include "tessera/nn.h"

namespace tessera::nn {

namespace {
Tensor uniform(const Shape& s, double bound) { return rand(s) * (2 * bound) - bound; }
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool has_bias) : Module("Linear") {
  if (in <= 0 || out <= 0) fail("Linear", "features must be positive, got in=" + std::to_string(in) + " out=" + std::to_string(out));
  double bound = 1.0 / std::sqrt(double(in));  // PyTorch: kaiming_uniform(a=sqrt(5)) and its bias rule
  weight = register_parameter("weight", uniform({out, in}, bound));
  if (has_bias) bias = register_parameter("bias", uniform({out}, bound));
}

Tensor Linear::forward(const Tensor& x) {
  int64_t in = weight.shape()[1];
  if (!x.defined() || x.dim() == 0 || x.shape().back() != in)
    fail("linear", "input " + (x.defined() ? shape_str(x.shape()) : std::string("undefined")) + " does not end in " +
                       std::to_string(in) + " features (weight " + shape_str(weight.shape()) + ")");
  Tensor y = matmul(x, weight.transpose(0, 1));
  return bias.defined() ? y + bias : y;
}

Embedding::Embedding(int64_t num, int64_t dim) : Module("Embedding") {
  if (num <= 0 || dim <= 0) fail("Embedding", "sizes must be positive, got " + std::to_string(num) + " x " + std::to_string(dim));
  weight = register_parameter("weight", randn({num, dim}));
}

Tensor Embedding::forward(const Tensor& idx) { return embedding(weight, idx); }

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine) : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  if (p < 0 || p >= 1) fail("Dropout", "probability must be in [0, 1), got " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0) return x;
  Tensor keep = rand(x.shape(), {x.dtype(), x.device()}) >= p;
  return where(keep, x * (1.0 / (1.0 - p)), zeros({}, {x.dtype(), x.device()}));
}

}  // namespace tessera::nn
