// Property test of the compiler's optimizations: random small graphs must compute the same
// values with every pass on (the default) and with every pass off (set_disabled_passes("all")):
// normalized error ||on - off||_max / max(||off||_max, tiny) <= 1e-6, NaN and infinities at the
// same places. That covers the IR passes (simplify, cse, dce) now and operator fusion, epilogues
// and scheduling as they land, since "all" switches every pass in passes.h off. Float64 graphs
// are also checked against the float64 reference evaluator.
//
// Graphs: kGraphs graphs, graph i drawn from std::mt19937(kSeed + i). Each starts from 1-3
// realized inputs (rank 1-3, extents 1-4, float32 or, one graph in five, float64; values in
// [-2, 2] with exact 0, -0 and 1 mixed in), then applies 3-12 ops, each reading random earlier
// values and drawn with these weights:
//
//   weight  kind           ops
//   ------  -------------  -----------------------------------------------------------------
//     16    unary          neg abs exp tanh sqrt sign floor sin relu square
//     18    binary         add sub mul div maximum minimum; second operand broadcast against
//                          the first (an earlier value if compatible, else a new input or full
//                          of a broadcastable shape)
//     10    scalar         x+s x-s x*s x/s s-x with s in {0, -0, 1, 2, 0.5, -1} (identities)
//      8    compare/where  lt gt le eq -> where(cond, a, b) with broadcasts, or cast to float
//     10    reduce         sum / max over a random non-empty set of axes, keepdim random
//     22    movement       reshape (random factorization), permute, transpose, expand
//                          (unit dims, or a new leading one), slice (random start/stop/step),
//                          pad (lo/hi 0-2, value 0/1/-1.5), concat (with itself or a new input)
//      6    constants      full of the value's shape (0, 1, -0, 2) combined with it, movement
//                          of a full, full op full
//      4    cast           to float64 and back, to float16 and back, bool -> float
//      3    matmul         [.., M, K] x new input [K, N]
//      5    scoped copy    the previous op traced again in another Scope, added to its first
//                          result (cse merges the two)
//
// Outputs: the last value and up to two other random values. On failure the message gives the
// graph index, its seed, both graphs (ir::to_text, before and after the IR passes) and the
// worst element. TESSERA_PROPERTY_GRAPH=i runs graph i alone and prints it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "compiler/passes/passes.h"
#include "frontend/tensor_impl.h"
#include "ir/graph.h"
#include "reference/evaluator.h"
#include "test_util.h"
#include "tessera/tessera.h"

namespace tessera {
namespace {

constexpr uint32_t kSeed = 20240611;
constexpr int kGraphs = 1200;
constexpr double kTol = 1e-6;

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
  std::vector<Tensor> pool;
  std::function<Tensor()> last_op;
  Tensor last_result;
  int scopes = 0;
  size_t visible = 0;  // partners come from pool[0, visible): what existed when the op was drawn

  Builder(Rng& rng, DType t) : r(rng), dt(t) {}

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
    return testing::make_tensor(v, s, dt);
  }
  Tensor constant(const Shape& s) {
    static const std::vector<double> vals = {0.0, 1.0, -0.0, 2.0, 0.5};
    TensorOptions o;
    o.dtype = dt;
    return full(s, pick(r, vals), o);
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
    Tensor y = uni(r, 0, 1) ? a.sum(dims, keep) : a.max(dims, keep);
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

struct Case {
  std::vector<ir::NodePtr> outputs;
};

Case make_case(int i) {
  Rng r(kSeed + uint32_t(i));
  DType dt = uni(r, 0, 4) == 0 ? DType::Float64 : DType::Float32;
  Builder b(r, dt);
  int n_in = int(uni(r, 1, 3));
  for (int k = 0; k < n_in; ++k) b.pool.push_back(b.input(b.random_shape()));
  int n_ops = int(uni(r, 3, 12));
  for (int k = 0; k < n_ops; ++k) b.step();
  Case c;
  c.outputs.push_back(detail::node_of(b.pool.back()));
  int extra = int(uni(r, 0, 2));
  for (int k = 0; k < extra; ++k) c.outputs.push_back(detail::node_of(pick(r, b.pool)));
  return c;
}

std::vector<std::vector<double>> run(const std::vector<ir::NodePtr>& nodes, const std::string& disabled) {
  compiler::set_disabled_passes(disabled);
  std::vector<Tensor> ts;
  for (auto& n : nodes) ts.push_back(detail::from_node(n));
  sync();
  std::vector<std::vector<double>> v;
  for (auto& t : ts) v.push_back(t.to_vector<double>());
  compiler::set_disabled_passes("");
  return v;
}

std::string describe(int i, const std::vector<ir::NodePtr>& nodes) {
  ir::Graph g = ir::build_graph(nodes);
  ir::Graph h = compiler::dce(compiler::cse(compiler::simplify(g)));
  std::ostringstream os;
  os << "graph " << i << " (std::mt19937 seed " << kSeed + uint32_t(i) << ")\n"
     << ir::to_text(g) << "after the IR passes:\n"
     << ir::to_text(h);
  return os.str();
}

TEST(FusionProperty, PassesOnAndOffAgreeOnRandomGraphs) {
  auto t0 = std::chrono::steady_clock::now();
  int simplified = 0, merged = 0, ref_checked = 0, failures = 0, first = 0, last = kGraphs;
  const char* only = std::getenv("TESSERA_PROPERTY_GRAPH");
  if (only) first = std::atoi(only), last = first + 1;
  std::map<std::string, int> ops;
  for (int i = first; i < last && failures < 3; ++i) {
    Case c = make_case(i);
    if (only) std::printf("%s", describe(i, c.outputs).c_str());
    ir::Graph g = ir::build_graph(c.outputs);
    for (auto& n : g.nodes) ops[ir::op_name(n->op)]++;
    ir::Graph s = compiler::simplify(g);
    simplified += s.key != g.key;
    merged += compiler::cse(s).nodes.size() < s.nodes.size();
    std::vector<reference::Value> ref;
    bool f64 = true;
    for (auto& n : g.nodes) f64 &= n->dtype != DType::Float32;
    if (f64) ref = reference::evaluate(g, 0, 0);

    auto on = run(c.outputs, ""), off = run(c.outputs, "all");
    for (size_t k = 0; k < c.outputs.size(); ++k) {
      double err = testing::normalized_error(on[k], off[k]);
      if (!(err <= kTol)) {
        ++failures;
        ADD_FAILURE() << "output " << k << ": passes on vs off, normalized error " << err << "\n  on:  "
                      << testing::values_str(on[k], 64) << "\n  off: " << testing::values_str(off[k], 64) << "\n"
                      << describe(i, c.outputs);
        break;
      }
      if (f64) {
        ++ref_checked;
        auto res = testing::all_close(on[k], ref[k].data, 1e-9);
        if (!res) {
          ++failures;
          ADD_FAILURE() << "output " << k << ": passes on vs the float64 reference: " << res.message() << "\n"
                        << describe(i, c.outputs);
          break;
        }
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ property ] %d graphs in %.2f s: simplify changed %d, cse merged in %d, %d outputs checked "
              "against the float64 reference\n",
              last - first, secs, simplified, merged, ref_checked);
  std::string hist;
  for (auto& [name, n] : ops) hist += " " + name + ":" + std::to_string(n);
  std::printf("[ property ] nodes by op:%s\n", hist.c_str());
  if (only) return;
  // The mix must keep exercising the passes.
  EXPECT_GT(simplified, kGraphs / 4);
  EXPECT_GT(merged, kGraphs / 100);
}

}  // namespace
}  // namespace tessera
