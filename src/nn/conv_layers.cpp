// Convolutional layers, batch norm and the image classifiers (SmallCNN, ResNet).
#include <cmath>

#include "core/fail.h"
#include "tessera/nn.h"

namespace tessera::nn {

namespace {
// PyTorch's default for conv weights and biases: kaiming_uniform(a=sqrt(5)) gives U(-b, b)
// with b = 1/sqrt(fan_in), and the bias the same bound.
Tensor uniform(const Shape& s, int64_t fan_in) {
  double b = 1.0 / std::sqrt(double(fan_in));
  return rand(s) * (2 * b) - b;
}
void check_channels(const char* type, int64_t in, int64_t out, int64_t groups) {
  if (in <= 0 || out <= 0 || groups <= 0 || in % groups || out % groups)
    fail(type, "channels must be positive and divisible by groups, got in=" + std::to_string(in) + " out=" + std::to_string(out) +
                   " groups=" + std::to_string(groups));
}
Shape with_kernel(Shape lead, const std::vector<int64_t>& k, size_t dims, const char* type) {
  if (k.size() != 1 && k.size() != dims) fail(type, "kernel needs 1 or " + std::to_string(dims) + " sizes, got " + shape_str(k));
  for (size_t d = 0; d < dims; ++d) {
    int64_t e = k.size() == 1 ? k[0] : k[d];
    if (e < 1) fail(type, "kernel sizes must be positive, got " + shape_str(k));
    lead.push_back(e);
  }
  return lead;
}
int64_t fan(const Shape& w) {
  int64_t f = 1;
  for (size_t d = 1; d < w.size(); ++d) f *= w[d];
  return f;
}
}  // namespace

Conv1d::Conv1d(int64_t in, int64_t out, int64_t kernel, ConvOptions o) : Module("Conv1d"), options(std::move(o)) {
  check_channels("Conv1d", in, out, options.groups);
  Shape ws = with_kernel({out, in / options.groups}, {kernel}, 1, "Conv1d");
  weight = register_parameter("weight", uniform(ws, fan(ws)));
  if (options.bias) bias = register_parameter("bias", uniform({out}, fan(ws)));
}
Tensor Conv1d::forward(const Tensor& x) {
  const ConvOptions& o = options;
  if (o.stride.size() != 1 || o.padding.size() != 1 || o.dilation.size() != 1) fail("Conv1d", "stride, padding and dilation take one value each");
  return conv1d(x, weight, bias, o.stride[0], o.padding[0], o.dilation[0], o.groups);
}

Conv2d::Conv2d(int64_t in, int64_t out, std::vector<int64_t> kernel, ConvOptions o) : Module("Conv2d"), options(std::move(o)) {
  check_channels("Conv2d", in, out, options.groups);
  Shape ws = with_kernel({out, in / options.groups}, kernel, 2, "Conv2d");
  weight = register_parameter("weight", uniform(ws, fan(ws)));
  if (options.bias) bias = register_parameter("bias", uniform({out}, fan(ws)));
}
Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, std::vector<int64_t> kernel, ConvOptions o)
    : Module("ConvTranspose2d"), options(std::move(o)) {
  check_channels("ConvTranspose2d", in, out, options.groups);
  Shape ws = with_kernel({in, out / options.groups}, kernel, 2, "ConvTranspose2d");
  weight = register_parameter("weight", uniform(ws, fan(ws)));
  if (options.bias) bias = register_parameter("bias", uniform({out}, fan(ws)));
}
Tensor ConvTranspose2d::forward(const Tensor& x) {
  const ConvOptions& o = options;
  return conv_transpose2d(x, weight, bias, o.stride, o.padding, o.output_padding, o.groups, o.dilation);
}

BatchNorm::BatchNorm(const char* type, int64_t features, double eps_, double momentum_, bool affine, bool track)
    : Module(type), eps(eps_), momentum(momentum_) {
  if (features <= 0) fail(type, "num_features must be positive, got " + std::to_string(features));
  if (affine) {
    weight = register_parameter("weight", ones({features}));
    bias = register_parameter("bias", zeros({features}));
  }
  if (track) {
    running_mean = register_buffer("running_mean", zeros({features}));
    running_var = register_buffer("running_var", ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, {DType::Int64}));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  check_input(x);
  bool batch_stats = is_training() || !running_mean.defined();
  if (is_training() && num_batches_tracked.defined()) {
    NoGradGuard ng;
    num_batches_tracked.add_(1.0);
  }
  return batch_norm(x, running_mean, running_var, weight, bias, batch_stats, momentum, eps);
}

void BatchNorm1d::check_input(const Tensor& x) const {
  if (!x.defined() || (x.dim() != 2 && x.dim() != 3)) fail("BatchNorm1d", "expects [N, C] or [N, C, L], got " + (x.defined() ? shape_str(x.shape()) : "undefined"));
}
void BatchNorm2d::check_input(const Tensor& x) const {
  if (!x.defined() || x.dim() != 4) fail("BatchNorm2d", "expects [N, C, H, W], got " + (x.defined() ? shape_str(x.shape()) : "undefined"));
}

SmallCNN::SmallCNN(int64_t channels, int64_t classes, int64_t h, int64_t w) : Module("SmallCNN") {
  if (h < 4 || w < 4) fail("SmallCNN", "images must be at least 4x4, got " + std::to_string(h) + "x" + std::to_string(w));
  conv1 = register_module("conv1", std::make_shared<Conv2d>(channels, 32, std::vector<int64_t>{3}, ConvOptions{.padding = {1}}));
  pool = register_module("pool", std::make_shared<MaxPool2d>(std::vector<int64_t>{2}));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(32, 64, std::vector<int64_t>{3}, ConvOptions{.padding = {1}}));
  fc1 = register_module("fc1", std::make_shared<Linear>(64 * (h / 4) * (w / 4), 128));
  fc2 = register_module("fc2", std::make_shared<Linear>(128, classes));
}
Tensor SmallCNN::forward(const Tensor& x) {
  Tensor h = (*pool)(relu((*conv1)(x)));
  h = (*pool)(relu((*conv2)(h)));
  return (*fc2)(relu((*fc1)(flatten(h, 1))));
}

BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t stride) : Module("BasicBlock") {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in, out, std::vector<int64_t>{3},
                                                            ConvOptions{.stride = {stride}, .padding = {1}, .bias = false}));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(out));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(out, out, std::vector<int64_t>{3}, ConvOptions{.padding = {1}, .bias = false}));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(out));
  if (stride != 1 || in != out) {
    down = register_module("down", std::make_shared<Conv2d>(in, out, std::vector<int64_t>{1},
                                                            ConvOptions{.stride = {stride}, .bias = false}));
    down_bn = register_module("down_bn", std::make_shared<BatchNorm2d>(out));
  }
}
Tensor BasicBlock::forward(const Tensor& x) {
  Tensor h = relu((*bn1)((*conv1)(x)));
  h = (*bn2)((*conv2)(h));
  return relu(h + (down ? (*down_bn)((*down)(x)) : x));
}

ResNet::ResNet(const ResNetConfig& c) : Module("ResNet") {
  if (c.widths.empty() || c.blocks < 1) fail("ResNet", "needs at least one stage and one block per stage");
  stem = register_module("stem", std::make_shared<Conv2d>(c.channels, c.widths[0], std::vector<int64_t>{3},
                                                          ConvOptions{.padding = {1}, .bias = false}));
  stem_bn = register_module("stem_bn", std::make_shared<BatchNorm2d>(c.widths[0]));
  stages = register_module("stages", std::make_shared<Sequential>());
  int64_t in = c.widths[0];
  for (size_t s = 0; s < c.widths.size(); ++s)
    for (int64_t b = 0; b < c.blocks; ++b) {
      stages->add(std::make_shared<BasicBlock>(in, c.widths[s], s > 0 && b == 0 ? 2 : 1));
      in = c.widths[s];
    }
  head = register_module("head", std::make_shared<Linear>(in, c.classes));
}
Tensor ResNet::forward(const Tensor& x) {
  Tensor h = (*stages)(relu((*stem_bn)((*stem)(x))));
  return (*head)(flatten(adaptive_avg_pool2d(h, {1}), 1));
}

}  // namespace tessera::nn
