// Tensor's op methods: each forwards to the free function of the same name (tensor.h states the
// rule), so an op is written, checked and documented once.
#include "tessera/ops.h"

namespace tessera {

Tensor Tensor::operator-() const { return tessera::neg(*this); }
Tensor Tensor::neg() const { return tessera::neg(*this); }
Tensor Tensor::abs() const { return tessera::abs(*this); }
Tensor Tensor::sign() const { return tessera::sign(*this); }
Tensor Tensor::sqrt() const { return tessera::sqrt(*this); }
Tensor Tensor::rsqrt() const { return tessera::rsqrt(*this); }
Tensor Tensor::square() const { return tessera::square(*this); }
Tensor Tensor::reciprocal() const { return tessera::reciprocal(*this); }
Tensor Tensor::exp() const { return tessera::exp(*this); }
Tensor Tensor::log() const { return tessera::log(*this); }
Tensor Tensor::sin() const { return tessera::sin(*this); }
Tensor Tensor::cos() const { return tessera::cos(*this); }
Tensor Tensor::tanh() const { return tessera::tanh(*this); }
Tensor Tensor::sigmoid() const { return tessera::sigmoid(*this); }
Tensor Tensor::relu() const { return tessera::relu(*this); }
Tensor Tensor::floor() const { return tessera::floor(*this); }
Tensor Tensor::ceil() const { return tessera::ceil(*this); }
Tensor Tensor::round() const { return tessera::round(*this); }
Tensor Tensor::pow(const Tensor& exponent) const { return tessera::pow(*this, exponent); }
Tensor Tensor::pow(double exponent) const { return tessera::pow(*this, exponent); }
Tensor Tensor::clamp(std::optional<double> min, std::optional<double> max) const { return tessera::clamp(*this, min, max); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const { return tessera::masked_fill(*this, mask, value); }

Tensor Tensor::sum(std::vector<int64_t> dims, bool keepdim) const { return tessera::sum(*this, std::move(dims), keepdim); }
Tensor Tensor::mean(std::vector<int64_t> dims, bool keepdim) const { return tessera::mean(*this, std::move(dims), keepdim); }
Tensor Tensor::amax(std::vector<int64_t> dims, bool keepdim) const { return tessera::amax(*this, std::move(dims), keepdim); }
Tensor Tensor::amin(std::vector<int64_t> dims, bool keepdim) const { return tessera::amin(*this, std::move(dims), keepdim); }
Tensor Tensor::max() const { return tessera::max(*this); }
Tensor Tensor::min() const { return tessera::min(*this); }
std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const { return tessera::max(*this, dim, keepdim); }
std::tuple<Tensor, Tensor> Tensor::min(int64_t dim, bool keepdim) const { return tessera::min(*this, dim, keepdim); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const { return tessera::argmax(*this, dim, keepdim); }
Tensor Tensor::argmin(std::optional<int64_t> dim, bool keepdim) const { return tessera::argmin(*this, dim, keepdim); }
Tensor Tensor::logsumexp(std::vector<int64_t> dims, bool keepdim) const { return tessera::logsumexp(*this, std::move(dims), keepdim); }
Tensor Tensor::softmax(int64_t dim) const { return tessera::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return tessera::log_softmax(*this, dim); }

Tensor Tensor::reshape(Shape s) const { return tessera::reshape(*this, std::move(s)); }
Tensor Tensor::view(Shape s) const { return tessera::reshape(*this, std::move(s)); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return tessera::flatten(*this, start_dim, end_dim); }
Tensor Tensor::squeeze() const { return tessera::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return tessera::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return tessera::unsqueeze(*this, dim); }
Tensor Tensor::permute(std::vector<int64_t> perm) const { return tessera::permute(*this, std::move(perm)); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return tessera::transpose(*this, a, b); }
Tensor Tensor::expand(Shape s) const { return tessera::expand(*this, std::move(s)); }
Tensor Tensor::repeat(const std::vector<int64_t>& repeats) const { return tessera::repeat(*this, repeats); }
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t stop, int64_t step) const {
  return tessera::slice(*this, dim, start, stop, step);
}
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const { return tessera::narrow(*this, dim, start, length); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return tessera::gather(*this, dim, index); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return tessera::index_select(*this, dim, index); }
Tensor Tensor::matmul(const Tensor& other) const { return tessera::matmul(*this, other); }

}  // namespace tessera
