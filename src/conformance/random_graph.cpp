#include "conformance/random_graph.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "tensor/tensor_impl.h"
#include "tessera/ops.h"
#include "tessera/scope.h"
#include "tessera/tensor.h"

namespace tessera::conformance {
namespace {

using Rng = std::mt19937;


int64_t uni(Rng& r, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(r); }
template <class T> const T& pick(Rng& r, const std::vector<T>& v) { return v[size_t(uni(r, 0, int64_t(v.size()) - 1))]; }

bool broadcastable(const Shape& a, const Shape& b) {
  for (size_t i = 1; i <= std::min(a.size(), b.size()); ++i) {
    int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

struct Builder {
  Rng& r;
  DType dt;
  Device dev;
  LeafMaker leaf;
  std::vector<Tensor> pool;
  std::function<Tensor()> last_op;
  Tensor last_result;
  int scopes = 0;
  size_t visible = 0;  // partners come from pool[0, visible): what existed when the op was drawn

  Builder(Rng& rng, DType t, Device d, LeafMaker l) : r(rng), dt(t), dev(std::move(d)), leaf(std::move(l)) {}

  Shape random_shape(int max_rank = 3) {
    Shape s(size_t(uni(r, 1, max_rank)));
    for (auto& d : s) d = uni(r, 1, 4);
    return s;
  }
  Tensor input(const Shape& s) {
    std::vector<double> v(size_t(numel(s)));
    std::uniform_real_distribution<double> u(-2, 2);
    for (auto& x : v) {
      int k = int(uni(r, 0, 15));
      x = k == 0 ? 0.0 : k == 1 ? -0.0 : k == 2 ? 1.0 : u(r);
    }
    return leaf ? leaf(v, s, dt) : from_vector<double>(v, s, TensorOptions{dt, dev});
  }
  Tensor constant(const Shape& s) {
    static const std::vector<double> vals = {0.0, 1.0, -0.0, 2.0, 0.5};
    return full(s, pick(r, vals), TensorOptions{dt, dev});
  }
  // A shape broadcastable against s: some extents set to 1, maybe leading dims dropped.
  Shape partner_shape(const Shape& s) {
    Shape p = s;
    for (auto& d : p)
      if (uni(r, 0, 2) == 0) d = 1;
    while (p.size() > 1 && uni(r, 0, 3) == 0) p.erase(p.begin());
    return p;
  }
  Tensor partner(const Tensor& a) {
    std::vector<Tensor> ok;
    for (size_t i = 0; i < visible && i < pool.size(); ++i)
      if (const Tensor& t = pool[i]; t.dtype() == a.dtype() && broadcastable(t.shape(), a.shape()) && t.dim() <= a.dim()) ok.push_back(t);
    int k = int(uni(r, 0, 3));
    if (!ok.empty() && k <= 1) return pick(r, ok);
    Shape s = partner_shape(a.shape());
    return k == 2 ? constant(s) : input(s);
  }
  Tensor floating(const Tensor& t) { return is_floating(t.dtype()) ? t : t.to(dt); }

  // Factorizes n into `rank` extents at random.
  Shape random_factorization(int64_t n) {
    std::vector<int64_t> primes;
    for (int64_t p = 2; n > 1; ++p)
      while (n % p == 0) primes.push_back(p), n /= p;
    Shape s(size_t(uni(r, 1, 4)), 1);
    for (int64_t p : primes) s[size_t(uni(r, 0, int64_t(s.size()) - 1))] *= p;
    return s;
  }

  Tensor movement(const Tensor& a) {
    int64_t rank = a.dim();
    switch (uni(r, 0, 7)) {
      case 0: return a.reshape(random_factorization(a.numel()));
      case 1: {
        auto p = std::vector<int64_t>(size_t(rank));
        for (int64_t i = 0; i < rank; ++i) p[size_t(i)] = i;
        std::shuffle(p.begin(), p.end(), r);
        return a.permute(p);
      }
      case 2: return rank >= 2 ? a.transpose(uni(r, 0, rank - 1), uni(r, 0, rank - 1)) : a.reshape({a.numel(), 1});
      case 3: {
        Shape s = a.shape();
        bool any = false;
        for (auto& d : s)
          if (d == 1 && uni(r, 0, 1)) d = uni(r, 2, 3), any = true;
        if (any) return a.expand(s);
        Shape u = a.shape();
        u.insert(u.begin(), 1);
        Shape e = u;
        e[0] = uni(r, 2, 3);
        return a.reshape(u).expand(e);
      }
      case 4: {
        int64_t d = uni(r, 0, rank - 1), n = a.size(d);
        int64_t start = uni(r, 0, n - 1), stop = uni(r, start + 1, n);
        return a.slice(d, start, stop, uni(r, 1, 2));
      }
      case 5: {
        std::vector<int64_t> pads(size_t(2 * rank), 0);
        int64_t d = uni(r, 0, rank - 1);
        pads[size_t(2 * d)] = uni(r, 0, 2);
        pads[size_t(2 * d + 1)] = uni(r, 0, 2);
        static const std::vector<double> vals = {0.0, 1.0, -1.5};
        return pad(a, pads, pick(r, vals));
      }
      case 6: {
        int64_t d = uni(r, 0, rank - 1);
        if (uni(r, 0, 1)) return cat({a, a}, d);
        Shape s = a.shape();
        s[size_t(d)] = uni(r, 1, 3);
        return cat({input(s), a}, d);
      }
      default: {  // a chain of two, so movement-of-movement rules fire
        Tensor b = a.reshape(random_factorization(a.numel()));
        return b.dim() >= 2 ? b.transpose(0, b.dim() - 1) : b.reshape(a.shape());
      }
    }
  }

  Tensor unary(const Tensor& x) {
    Tensor a = floating(x);
    switch (uni(r, 0, 9)) {
      case 0: return -a;
      case 1: return abs(a);
      case 2: return a.exp();
      case 3: return a.tanh();
      case 4: return sqrt(a);
      case 5: return sign(a);
      case 6: return floor(a);
      case 7: return sin(a);
      case 8: return relu(a);
      default: return square(a);
    }
  }

  Tensor binary(const Tensor& x) {
    Tensor a = floating(x), b = partner(a);
    if (uni(r, 0, 1)) std::swap(a, b);
    switch (uni(r, 0, 5)) {
      case 0: return a + b;
      case 1: return a - b;
      case 2: return a * b;
      case 3: return a / b;
      case 4: return maximum(a, b);
      default: return minimum(a, b);
    }
  }

  Tensor scalar(const Tensor& x) {
    static const std::vector<double> vals = {0.0, -0.0, 1.0, 2.0, 0.5, -1.0};
    Tensor a = floating(x);
    double s = pick(r, vals);
    switch (uni(r, 0, 4)) {
      case 0: return a + s;
      case 1: return a - s;
      case 2: return a * s;
      case 3: return a / s;
      default: return s - a;
    }
  }

  Tensor compare(const Tensor& x) {
    Tensor a = floating(x), b = partner(a);
    Tensor c;
    switch (uni(r, 0, 3)) {
      case 0: c = a < b; break;
      case 1: c = a > b; break;
      case 2: c = a <= b; break;
      default: c = eq(a, b);
    }
    if (uni(r, 0, 2) == 0) return c.to(dt);
    return where(c, a, partner(a));
  }

  Tensor reduce(const Tensor& x) {
    Tensor a = floating(x);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < a.dim(); ++d)
      if (uni(r, 0, 1)) dims.push_back(d);
    if (dims.empty()) dims.push_back(uni(r, 0, a.dim() - 1));
    bool keep = uni(r, 0, 1);
    Tensor y = uni(r, 0, 1) ? a.sum(dims, keep) : a.amax(dims, keep);
    return y.dim() == 0 ? y.reshape({1}) : y;
  }

  Tensor constants(const Tensor& x) {
    Tensor a = floating(x);
    switch (uni(r, 0, 2)) {
      case 0: return a * constant(a.shape()) + constant(a.shape());
      case 1: return a + movement(constant(random_shape())).sum().reshape({1});
      default: return constant(a.shape()) * constant(a.shape()) - a;
    }
  }

  Tensor cast(const Tensor& x) {
    Tensor a = floating(x);
    switch (uni(r, 0, 2)) {
      case 0: return a.to(dt == DType::Float64 ? DType::Float32 : DType::Float64).to(dt);
      case 1: return a.to(DType::Float16).to(dt);
      default: return (a > 0.0).to(dt);
    }
  }

  Tensor matmul_op(const Tensor& x) {
    Tensor a = floating(x);
    if (a.dim() == 1) a = a.reshape({1, a.numel()});
    return a.matmul(input({a.size(a.dim() - 1), uni(r, 1, 3)}));
  }

  // One random op on random earlier values; remembered so a scoped copy can trace it again.
  void step() {
    const Tensor x = pick(r, pool);
    static const std::vector<std::pair<int, int>> weights = {{0, 16}, {1, 18}, {2, 10}, {3, 8}, {4, 10},
                                                             {5, 22}, {6, 6},  {7, 4},  {8, 3}, {9, 5}};
    int total = 0;
    for (auto& w : weights) total += w.second;
    int k = int(uni(r, 0, total - 1)), kind = 0;
    for (auto& w : weights) {
      if (k < w.second) {
        kind = w.first;
        break;
      }
      k -= w.second;
    }
    if (kind == 9 && last_op) {
      Tensor copy;
      {
        Scope s("copy" + std::to_string(scopes++));
        copy = last_op();
      }
      pool.push_back(last_result + copy);  // both reachable
      return;
    }
    // The op's own random choices are drawn now, once, so a scoped copy repeats them exactly.
    uint32_t op_seed = uint32_t(uni(r, 0, 1 << 30));
    auto op = [this, x, kind, op_seed, n = pool.size()]() {
      Rng saved = r;
      r.seed(op_seed);
      visible = n;
      Tensor y;
      switch (kind) {
        case 0: y = unary(x); break;
        case 1: y = binary(x); break;
        case 2: y = scalar(x); break;
        case 3: y = compare(x); break;
        case 4: y = reduce(x); break;
        case 5: y = movement(x); break;
        case 6: y = constants(x); break;
        case 7: y = cast(x); break;
        default: y = matmul_op(x); break;
      }
      r = saved;
      return y;
    };
    pool.push_back(op());
    last_op = op;
    last_result = pool.back();
  }
};

}  // namespace

std::vector<ir::NodePtr> random_graph(int i, const Device& device, const LeafMaker& leaf) {
  Rng r(kRandomGraphSeed + uint32_t(i));
  DType dt = uni(r, 0, 4) == 0 ? DType::Float64 : DType::Float32;
  Builder b(r, dt, device, leaf);
  int n_in = int(uni(r, 1, 3));
  for (int k = 0; k < n_in; ++k) b.pool.push_back(b.input(b.random_shape()));
  int n_ops = int(uni(r, 3, 12));
  for (int k = 0; k < n_ops; ++k) b.step();
  std::vector<ir::NodePtr> outputs{detail::node_of(b.pool.back())};
  int extra = int(uni(r, 0, 2));
  for (int k = 0; k < extra; ++k) outputs.push_back(detail::node_of(pick(r, b.pool)));
  return outputs;
}

std::vector<ir::NodePtr> random_training_graph(int i, const Device& device) {
  Rng r(kRandomTrainingGraphSeed + uint32_t(i));
  const TensorOptions f32{DType::Float32, device};
  auto values = [&](const Shape& s, double scale) {
    std::vector<float> v(size_t(numel(s)));
    std::uniform_real_distribution<double> u(-scale, scale);
    for (auto& x : v) x = float(u(r));
    return from_vector(v, s, f32);
  };
  const int64_t batch = pick(r, std::vector<int64_t>{32, 64, 128, 256});
  int64_t width = uni(r, 2, 16);
  const bool seq = uni(r, 0, 2) == 0;
  const int64_t rows = seq ? batch * uni(r, 2, 8) : batch;
  Tensor h = values(seq ? Shape{batch, rows / batch, width} : Shape{batch, width}, 1.0);
  std::vector<Tensor> params;
  auto param = [&](const Shape& s, double scale) {
    params.push_back(values(s, scale).requires_grad_());
    return params.back();
  };
  const int layers = int(uni(r, 1, 3));
  for (int l = 0; l < layers; ++l) {
    const int64_t out = uni(r, 4, 48);
    Tensor y = h.matmul(param({width, out}, 1.0 / std::sqrt(double(width))));
    if (uni(r, 0, 1)) y = y + param({out}, 0.1);
    switch (uni(r, 0, 5)) {
      case 0: y = relu(y); break;
      case 1: y = tanh(y); break;
      case 2: y = gelu(y); break;
      case 3: y = sigmoid(y); break;
      case 4: y = silu(y); break;
      default: y = square(y) * 0.5; break;
    }
    if (uni(r, 0, 3) == 0) y = layer_norm(y, {out});
    if (uni(r, 0, 3) == 0) y = where(rand_like(y) >= 0.1, y / 0.9, zeros_like(y));
    if (out == width && uni(r, 0, 1)) y = y + h;
    h = y, width = out;
  }
  const int64_t classes = uni(r, 2, 64);
  Tensor logits = h.matmul(param({width, classes}, 1.0 / std::sqrt(double(width)))).reshape({rows, classes});
  Tensor loss;
  if (uni(r, 0, 1)) {
    std::vector<int64_t> target(static_cast<size_t>(rows));
    for (auto& c : target) c = uni(r, 0, classes - 1);
    loss = cross_entropy(logits, from_vector(target, {rows}, TensorOptions{DType::Int64, device}));
  } else {
    loss = mse_loss(logits, values({rows, classes}, 1.0));
  }
  loss.backward();
  std::vector<ir::NodePtr> outputs{detail::node_of(loss)};
  for (const Tensor& p : params) outputs.push_back(detail::node_of(p.grad()));
  return outputs;
}

}  // namespace tessera::conformance
