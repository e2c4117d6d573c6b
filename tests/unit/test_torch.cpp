// Composite expressions compared with PyTorch: values and the gradients of sum(out * w) for a
// fixed weight w. Inputs are generated here (float32), written with their shapes to a temporary
// directory, recomputed by tests/torch/compare.py under /usr/bin/python3 (Debian's
// python3-torch) in float64, and compared with normalized error <= 1e-5 (DESIGN.md "Testing").
// Without torch the test skips, unless CI=true, where it fails.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "test_util.h"
#include "tessera/ops.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::make_tensor;
using testing::normalized_error;
using testing::random_values;
using V = std::vector<double>;
using Ts = std::vector<Tensor>;

constexpr DType kF32 = DType::Float32, kI64 = DType::Int64, kBool = DType::Bool;
constexpr double kTol = 1e-5;

struct In {
  Shape shape;
  DType dtype = kF32;
  double lo = -1, hi = 1;  // floats: uniform [lo, hi); integers: [lo, hi]
  V values = {};           // explicit values instead of random ones
};
In f(Shape s, double lo = -1, double hi = 1) { return {std::move(s), kF32, lo, hi}; }
In pos(Shape s) { return {std::move(s), kF32, 0.5, 2}; }
In ints(Shape s, int64_t lo, int64_t hi) { return {std::move(s), kI64, double(lo), double(hi)}; }
In fixed(Shape s, V v) { return {std::move(s), kI64, 0, 0, std::move(v)}; }

struct Case {
  std::string name;  // the key of EXPRS in compare.py
  std::vector<In> inputs;
  std::function<Tensor(const Ts&)> fn;
};

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  int64_t t = q.shape()[q.shape().size() - 2];  // sequence length
  Tensor s = matmul(q, k.transpose(-2, -1)) / std::sqrt(double(q.shape().back()));
  Tensor mask = eq(tril(ones({t, t})), zeros({t, t}));
  return matmul(softmax(masked_fill(s, mask, -INFINITY), -1), v);
}

std::vector<Case> cases() {
  return {
      {"softmax_affine", {f({4, 6}), f({6, 5}), f({5})}, [](const Ts& x) { return softmax(matmul(x[0], x[1]) + x[2], -1); }},
      {"gelu_x_sigmoid", {f({3, 7}, -3, 3), f({3, 7}, -3, 3)}, [](const Ts& x) { return gelu(x[0]) * sigmoid(x[1]); }},
      {"gelu_tanh_silu", {f({20}, -4, 4)}, [](const Ts& x) { return gelu(x[0], true) + silu(x[0]); }},
      {"layer_norm_affine", {f({5, 8}, -2, 2), f({8}, 0.5, 1.5), f({8})},
       [](const Ts& x) { return layer_norm(x[0], {8}, x[1], x[2]); }},
      {"layer_norm_2d", {f({2, 3, 4}, -2, 2)}, [](const Ts& x) { return layer_norm(x[0], {3, 4}); }},
      {"cross_entropy", {f({6, 5}, -3, 3), ints({6}, 0, 4)}, [](const Ts& x) { return cross_entropy(x[0], x[1]); }},
      {"logsumexp", {f({4, 9}, -5, 5)}, [](const Ts& x) { return logsumexp(x[0], {1}); }},
      {"var_std", {f({4, 6})}, [](const Ts& x) { return var(x[0], {1}, 1, true) * std(x[0], {0}, 0, true); }},
      {"causal_attention", {f({2, 4, 8}), f({2, 4, 8}), f({2, 4, 8})},
       [](const Ts& x) { return causal_attention(x[0], x[1], x[2]); }},
      {"embedding_mean", {f({10, 4}), ints({3, 5}, 0, 9)}, [](const Ts& x) { return mean(embedding(x[0], x[1]), {1}); }},
      {"log_softmax_dim0", {f({5, 3}, -2, 2)}, [](const Ts& x) { return log_softmax(x[0], 0); }},
      {"softplus_beta", {f({16}, -3, 3)}, [](const Ts& x) { return softplus(x[0], 2, 3); }},
      {"relu_clamp", {f({12}), f({12})}, [](const Ts& x) { return relu(x[0]) + clamp(x[1], -0.3, 0.4); }},
      {"pow_sqrt", {f({8}), f({8}), pos({8})}, [](const Ts& x) { return pow(abs(x[0]) + 0.5, x[1]) + sqrt(x[2]); }},
      {"trig_erf", {f({10}, -2, 2), f({10}, -2, 2)}, [](const Ts& x) { return sin(x[0]) * cos(x[1]) + erf(x[0] * x[1]); }},
      {"mlp", {f({4, 6}), f({6, 8}), f({8}), f({8, 3}), f({3})},
       [](const Ts& x) { return matmul(gelu(matmul(x[0], x[1]) + x[2]), x[3]) + x[4]; }},
      {"matmul_broadcast", {f({2, 1, 3, 4}), f({5, 4, 2})}, [](const Ts& x) { return matmul(x[0], x[1]); }},
      {"gather_exp", {f({3, 4}), ints({3, 5}, 0, 3)}, [](const Ts& x) { return gather(x[0].exp(), 1, x[1]); }},
      {"scatter_add", {f({4, 4}), ints({3, 4}, 0, 3), f({3, 4})},
       [](const Ts& x) { return scatter_add(x[0] * 2.0, 0, x[1], sin(x[2])); }},
      {"index_select_repeat", {f({5, 3}), ints({4}, 0, 4)},
       [](const Ts& x) { return repeat(index_select(x[0], 0, x[1]), {2, 1}); }},
      {"cat_stack", {f({2, 3}), f({2, 2})},
       [](const Ts& x) {
         Tensor c = cat({x[0], x[1].exp()}, 1);
         return stack({c, c * c}, 0);
       }},
      {"strided_slice", {f({7, 9})}, [](const Ts& x) { return x[0].slice(0, 0, 7, 2).slice(1, 1, 9, 3) * 2.0; }},
      {"pad_tanh", {f({2, 3})}, [](const Ts& x) { return pad(x[0].tanh(), {1, 0, 2, 1}, 0.5); }},
      {"where_compare", {f({10}), f({10})}, [](const Ts& x) { return where(x[0] > x[1], x[0] * x[1], x[0] - x[1]); }},
      {"max_amin", {f({4, 5}), f({4, 5})}, [](const Ts& x) { return x[0].amax({1}) + amin(x[1], {1}); }},
      {"manual_softmax", {f({3, 6}, -3, 3)},
       [](const Ts& x) {
         Tensor e = exp(x[0] - amax(x[0], {1}, true));
         return e / e.sum({1}, true);
       }},
      {"batchnorm_like", {f({8, 3}, -2, 2)},
       [](const Ts& x) { return (x[0] - mean(x[0], {0}, true)) / sqrt(var(x[0], {0}, 0, true) + 1e-5); }},
      {"tril_triu", {f({4, 4}), f({4, 4})}, [](const Ts& x) { return triu(x[0], 1) + tril(x[1], -1) * x[0]; }},
      {"chunk_mix", {f({4, 9})},
       [](const Ts& x) {
         auto p = chunk(x[0], 3, 1);
         return p[0] * p[1] + sin(p[2]);
       }},
      {"split_mix", {f({3, 5})},
       [](const Ts& x) {
         auto p = split(x[0], 2, 1);
         return cat({p[0] * p[1], p[2] * p[2]}, 1);
       }},
      {"permute_reshape", {f({2, 3, 4}), f({6, 4})},
       [](const Ts& x) { return x[0].permute({2, 0, 1}).reshape({4, 6}).transpose(0, 1) * x[1]; }},
      {"narrow_squeeze", {f({3, 4}), f({1, 3, 1})},
       [](const Ts& x) { return flatten(unsqueeze(squeeze(narrow(x[0], 1, 1, 1), 1), 0)) * squeeze(x[1]); }},
      {"dynamic_update_slice", {f({4, 5}), f({2, 3}), fixed({2}, {1, 4})},
       [](const Ts& x) { return dynamic_update_slice(x[0] * x[0], x[1].exp(), x[2]); }},
      {"cross_entropy_linear", {f({6, 4}), f({4, 5}), ints({6}, 0, 4)},
       [](const Ts& x) { return cross_entropy(matmul(x[0], x[1]), x[2]); }},
      {"tanh_exp_log", {f({8}), f({8}), pos({8})}, [](const Ts& x) { return tanh(x[0]) * exp(x[1]) + log(x[2]); }},
      {"reciprocal_rsqrt_square", {pos({8}), f({8})},
       [](const Ts& x) { return reciprocal(x[0]) + rsqrt(x[0]) + square(x[1]); }},
      {"masked_logical", {f({10}), f({10})},
       [](const Ts& x) { return masked_fill(x[0] * x[1], logical_and(x[0] > 0.0, x[1] < 0.0), 0.0) + x[0]; }},
      {"broadcast3", {f({3, 1}), f({1, 4}), f({4})},
       [](const Ts& x) { return x[0] * x[1] + x[2].expand({3, 4}) * x[0]; }},
      {"normalize_rows", {pos({3, 5})}, [](const Ts& x) { return x[0] / x[0].sum({1}, true); }},
      {"transformer_block", {f({2, 4, 8}), f({8}, 0.5, 1.5), f({8}), f({8, 8})},
       [](const Ts& x) {
         Tensor h = layer_norm(x[0], {8}, x[1], x[2]);
         Tensor s = matmul(h, h.transpose(-2, -1)) / std::sqrt(8.0);
         return x[0] + matmul(softmax(s, -1), matmul(h, x[3]));
       }},
      {"scalar_stats", {f({3, 4})}, [](const Ts& x) { return std(x[0]) * mean(x[0]) + var(x[0]); }},
      {"pow_scalar", {pos({5}), f({5})}, [](const Ts& x) { return pow(x[0], 2.5) + pow(3.0, x[1]); }},
      {"argmax_gather", {f({4, 5})}, [](const Ts& x) { return gather(x[0], 1, argmax(x[0], 1, true)); }},
      {"minimum_maximum", {f({9}), f({9}), f({9})},
       [](const Ts& x) { return maximum(x[0], x[1]) * minimum(x[0], x[2]); }},
      {"abs_sign_floor", {f({9}), f({9})},
       [](const Ts& x) { return abs(x[0]) * sign(x[1]) + floor(x[0] * 3.0) * x[1]; }},
      {"cast_roundtrip", {f({6}), f({6})},
       [](const Ts& x) { return (x[0].to(DType::Float64) * x[1].to(DType::Float64)).to(kF32) * x[0]; }},
      {"logsumexp_keepdim_sub", {f({2, 3, 4}, -3, 3)},
       [](const Ts& x) { return x[0] - logsumexp(x[0], {0, 2}, true); }},
      // Convolutions, pooling and batch norm (issue 9): a grid of options.
      {"conv2d_bias", {f({2, 3, 7, 6}), f({4, 3, 3, 3}), f({4})}, [](const Ts& x) { return conv2d(x[0], x[1], x[2]); }},
      {"conv2d_stride_pad", {f({2, 2, 9, 8}), f({3, 2, 3, 2})},
       [](const Ts& x) { return conv2d(x[0], x[1], Tensor(), {2, 1}, {1, 2}); }},
      {"conv2d_dilation_groups", {f({2, 4, 9, 9}), f({6, 2, 3, 3}), f({6})},
       [](const Ts& x) { return conv2d(x[0], x[1], x[2], {1}, {2}, {2}, 2); }},
      {"conv2d_depthwise_stride", {f({1, 4, 8, 8}), f({4, 1, 3, 3})},
       [](const Ts& x) { return conv2d(x[0], x[1], Tensor(), {2}, {1}, {1}, 4); }},
      {"conv1d_stride_dilation", {f({2, 3, 10}), f({5, 3, 4}), f({5})},
       [](const Ts& x) { return conv1d(x[0], x[1], x[2], 2, 1, 2); }},
      {"conv_transpose2d_stride", {f({2, 3, 4, 5}), f({3, 2, 3, 3}), f({2})},
       [](const Ts& x) { return conv_transpose2d(x[0], x[1], x[2], {2}, {1}, {1}); }},
      {"conv_transpose2d_groups_dilation", {f({1, 4, 5, 4}), f({4, 3, 2, 3})},
       [](const Ts& x) { return conv_transpose2d(x[0], x[1], Tensor(), {1, 2}, {0, 1}, {0}, 2, {2, 1}); }},
      {"max_pool2d_2", {f({2, 3, 8, 8})}, [](const Ts& x) { return max_pool2d(x[0], {2}); }},
      {"max_pool2d_3s2p1", {f({2, 2, 9, 7})}, [](const Ts& x) { return max_pool2d(x[0], {3}, {2}, {1}); }},
      {"avg_pool2d_pad", {f({2, 2, 7, 7})}, [](const Ts& x) { return avg_pool2d(x[0], {3}, {2}, {1}); }},
      {"avg_pool2d_exclude_pad", {f({2, 2, 6, 5})}, [](const Ts& x) { return avg_pool2d(x[0], {2, 3}, {1, 2}, {1}, false); }},
      {"adaptive_avg_pool2d", {f({2, 3, 7, 5})}, [](const Ts& x) { return adaptive_avg_pool2d(x[0], {3, 2}); }},
      {"batch_norm2d_train", {f({4, 3, 5, 5}, -2, 3), f({3}, 0.5, 1.5), f({3})},
       [](const Ts& x) {
         Tensor rm = zeros({3}), rv = ones({3});
         Tensor y = batch_norm(x[0], rm, rv, x[1], x[2], true, 0.1, 1e-5);
         return cat({y.reshape({-1}), rm, rv}, 0);
       }},
      {"batch_norm2d_eval", {f({4, 3, 5, 5}, -2, 3), f({3}, 0.5, 1.5), f({3})},
       [](const Ts& x) {
         Tensor rm = make_tensor({0.1, -0.2, 0.3}, {3}), rv = make_tensor({0.5, 1.5, 2.0}, {3});
         return batch_norm(x[0], rm, rv, x[1], x[2], false, 0.1, 1e-5);
       }},
      {"conv_bn_relu_pool", {f({2, 2, 8, 8}), f({4, 2, 3, 3}), f({4}, 0.5, 1.5), f({4})},
       [](const Ts& x) {
         Tensor y = batch_norm(conv2d(x[0], x[1], Tensor(), {1}, {1}), Tensor(), Tensor(), x[2], x[3], true);
         return max_pool2d(relu(y), {2});
       }},
      // The libtorch-shaped API (issue 20): indexing, index_put, max/min(dim), the losses' options.
      {"index_slices", {f({3, 4, 5})},
       [](const Ts& x) {
         using namespace indexing;
         return cat({x[0].index({Slice(1, None), Slice(None, None, 2), 3}).reshape({-1}), x[0].index({Ellipsis, -1}).reshape({-1}),
                     x[0].index({None, 0, Slice(-2, None)}).reshape({-1})});
       }},
      {"index_tensor", {f({5, 3}), fixed({2, 3}, {4, 0, -1, 2, 2, -5})},
       [](const Ts& x) { return x[0].index({x[1], indexing::Slice(1, indexing::None)}) * 2.0; }},
      {"index_put_strided", {f({4, 6}), f({2})},
       [](const Ts& x) { return index_put(x[0], {indexing::Slice(1, indexing::None, 2), indexing::Slice(indexing::None, 5, 3)}, x[1]); }},
      {"max_min_dim", {f({4, 5})},
       [](const Ts& x) {
         auto [mx, imx] = x[0].max(1);
         auto [mn, imn] = x[0].min(1);
         return mx * 2.0 + imn.to(kF32) + std::get<0>(x[0].min(0, true)).sum();
       }},
      {"cross_entropy_smoothing_ignore", {f({6, 5}, -3, 3), fixed({6}, {1, -100, 0, 4, 4, 2})},
       [](const Ts& x) { return cross_entropy(x[0], x[1], {.label_smoothing = 0.1}); }},
      {"cross_entropy_none_ignore", {f({6, 5}, -3, 3), fixed({6}, {1, 3, 0, 4, 4, 2})},
       [](const Ts& x) { return cross_entropy(x[0], x[1], {.reduction = Reduction::None, .ignore_index = 4}); }},
      {"cross_entropy_nd_sum", {f({2, 3, 4}, -3, 3), ints({2, 4}, 0, 2)},
       [](const Ts& x) { return cross_entropy(x[0], x[1], {.reduction = Reduction::Sum}); }},
      {"nll_mse", {f({5, 4}, -2, 2), ints({5}, 0, 3), f({5, 4})},
       [](const Ts& x) {
         return nll_loss(log_softmax(x[0], 1), x[1], {.reduction = Reduction::Sum}) + mse_loss(x[0], x[2], Reduction::Sum);
       }},
  };
}

const char* kind(DType t) {
  switch (t) {
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
    case DType::Int64: return "i64";
    case DType::Bool: return "bool";
    default: return "?";
  }
}

void write_f64(const fs::path& p, const V& v) {
  std::ofstream o(p, std::ios::binary);
  o.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(double)));  // little-endian hosts
}
bool read_f64(const fs::path& p, size_t n, V& v) {
  std::ifstream i(p, std::ios::binary);
  if (!i) return false;
  v.assign(n, 0);
  i.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(double)));
  return size_t(i.gcount()) == n * sizeof(double);
}
void write_shape(std::ostream& o, const Shape& s) {
  o << s.size();
  for (auto d : s) o << " " << d;
}

// The repository root: three levels above this file (tests/unit/test_torch.cpp).
fs::path repo_root() { return testing::repo_root(); }

struct Computed {
  V out;
  Shape out_shape;
  std::vector<V> grads;  // per input; empty for non-floating ones
  std::string error;     // a Tessera exception, if any
};

TEST(Torch, CompositeExpressionsMatchPyTorch) {
  auto t0 = std::chrono::steady_clock::now();
  const bool ci = testing::in_ci();
  const fs::path script = repo_root() / "tests" / "torch" / "compare.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  if (!fs::exists("/usr/bin/python3")) {
    if (ci) FAIL() << "/usr/bin/python3 is missing (CI=true)";
    GTEST_SKIP() << "/usr/bin/python3 is missing";
  }

  fs::path dir = fs::temp_directory_path() / ("tessera_torch_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  // 1. Inputs, Tessera's values and gradients, and the manifest.
  std::vector<Case> cs = cases();
  ASSERT_GE(cs.size(), 30u);
  std::vector<Computed> got(cs.size());
  std::ofstream man(dir / "manifest.txt");
  uint32_t seed = 1000;
  for (size_t c = 0; c < cs.size(); ++c) {
    const Case& k = cs[c];
    Ts xs;
    std::vector<V> host;
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      const In& in = k.inputs[i];
      V v = in.values.empty() ? random_values(numel(in.shape), in.dtype, ++seed, in.lo, in.hi) : in.values;
      host.push_back(v);
      xs.push_back(make_tensor(v, in.shape, in.dtype));
      if (is_floating(in.dtype)) xs.back().requires_grad_();
    }
    Computed& g = got[c];
    try {
      Tensor out = k.fn(xs);
      g.out_shape = out.shape();
      V w = random_values(out.numel(), kF32, ++seed, -1, 1);
      write_f64(dir / (k.name + ".w.bin"), w);
      (out * make_tensor(w, out.shape(), kF32)).sum().backward();
      g.out = out.to_vector<double>();
      for (size_t i = 0; i < xs.size(); ++i) {
        if (!is_floating(k.inputs[i].dtype)) {
          g.grads.emplace_back();
          continue;
        }
        Tensor gr = xs[i].grad();
        g.grads.push_back(gr.defined() ? gr.to_vector<double>() : V(host[i].size(), 0.0));
      }
    } catch (const std::exception& e) {
      g.error = e.what();
      continue;  // not written to the manifest
    }
    man << "case " << k.name << " " << k.inputs.size() << "\n";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      const In& in = k.inputs[i];
      write_f64(dir / (k.name + ".in" + std::to_string(i) + ".bin"), host[i]);
      man << "in " << kind(in.dtype) << " " << (is_floating(in.dtype) ? 1 : 0) << " ";
      write_shape(man, in.shape);
      man << "\n";
    }
    man << "out ";
    write_shape(man, g.out_shape);
    man << "\n";
  }
  man.close();
  auto t1 = std::chrono::steady_clock::now();

  // 2. One PyTorch process for every expression.
  testing::ScriptRun run = testing::run_python(script.string(), dir.string());
  auto t2 = std::chrono::steady_clock::now();
  if (run.torch_missing()) {
    fs::remove_all(dir);
    if (ci) FAIL() << "PyTorch is not available under /usr/bin/python3 (CI=true): " << run.log;
    GTEST_SKIP() << "PyTorch is not available under /usr/bin/python3: " << run.log;
  }
  ASSERT_EQ(run.rc, 0) << "compare.py failed:\n" << run.log;

  // 3. Compare.
  std::ifstream res(dir / "results.txt");
  std::map<std::string, std::string> status;
  for (std::string line; std::getline(res, line);) {
    std::istringstream ls(line);
    std::string word, name;
    ls >> word >> name;
    std::string rest;
    std::getline(ls, rest);
    status[name] = word == "ok" ? "" : rest.empty() ? "failed" : rest;
  }
  double worst = 0;
  std::string worst_name;
  int compared = 0;
  for (size_t c = 0; c < cs.size(); ++c) {
    const Case& k = cs[c];
    const Computed& g = got[c];
    SCOPED_TRACE(k.name);
    if (!g.error.empty()) {
      ADD_FAILURE() << k.name << ": Tessera threw: " << g.error;
      continue;
    }
    if (!status.count(k.name) || !status[k.name].empty()) {
      ADD_FAILURE() << k.name << ": PyTorch side: " << (status.count(k.name) ? status[k.name] : "no result");
      continue;
    }
    V want;
    ASSERT_TRUE(read_f64(dir / (k.name + ".out.bin"), g.out.size(), want)) << k.name;
    double e = normalized_error(g.out, want);
    std::string where_ = "value";
    EXPECT_TRUE(testing::all_close(g.out, want, kTol)) << k.name << " value";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      if (!is_floating(k.inputs[i].dtype)) continue;
      V wg;
      ASSERT_TRUE(read_f64(dir / (k.name + ".grad" + std::to_string(i) + ".bin"), g.grads[i].size(), wg)) << k.name;
      double eg = normalized_error(g.grads[i], wg);
      EXPECT_TRUE(testing::all_close(g.grads[i], wg, kTol)) << k.name << " gradient of input " << i << " "
                                                               << shape_str(k.inputs[i].shape);
      if (eg > e) e = eg, where_ = "grad" + std::to_string(i);
    }
    ++compared;
    std::printf("[torch] %-26s worst normalized error %.3g (%s)\n", k.name.c_str(), e, where_.c_str());
    if (e > worst) worst = e, worst_name = k.name;
  }
  auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("[torch] %d of %zu expressions compared with PyTorch (values and gradients); worst normalized error %.3g "
              "(%s); tessera %.0f ms, python %.0f ms, compare %.0f ms\n",
              compared, cs.size(), worst, worst_name.c_str(), ms(t0, t1), ms(t1, t2), ms(t2, t3));
  RecordProperty("worst_error", std::to_string(worst));
  if (!HasFailure())
    fs::remove_all(dir);
  else
    std::printf("[torch] inputs and PyTorch results kept in %s\n", dir.string().c_str());
}

}  // namespace
}  // namespace tessera
