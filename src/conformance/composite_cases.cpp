// Cases of the composite ops of tessera/ops.h, one row per function in declaration order (the
// functions named like a primitive are that primitive's row). tests/conformance checks that
// every function ops.h declares has a row.
#include <cmath>
#include <optional>

#include "conformance/suite.h"
#include "tessera/autocast.h"

namespace tessera::conformance {
namespace {

using L = Layout;
constexpr DType F32 = DType::Float32, F64 = DType::Float64, F16 = DType::Float16, BF16 = DType::BFloat16,
                I32 = DType::Int32, I64 = DType::Int64, B = DType::Bool;
using Unary = std::function<Tensor(const Tensor&)>;
using Many = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

Case of(std::string v, std::vector<Input> in, Many f, double tol = -1, double grad_tol = -1) {
  return {std::move(v), std::move(in), [f](const std::vector<Tensor>& x, const Context&) { return f(x); }, tol, grad_tol};
}
Case one(std::string v, Input in, Unary f, double tol = -1, double grad_tol = -1) {
  return of(std::move(v), {std::move(in)}, [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0])}; }, tol, grad_tol);
}
Case made(std::string v, std::function<Tensor(const Context&)> f, double tol = -1) {
  return {std::move(v), {}, [f](const std::vector<Tensor>&, const Context& c) { return std::vector<Tensor>{f(c)}; }, tol};
}

// Elementwise composites: float32 plain, permuted (gradient), float64 strided (gradient),
// empty, long, and NaN/infinities (their primitives have the float16 cases).
std::vector<Case> elementwise(Unary f, Gen g) {
  return {
      one("f32[3,5,7]", input({3, 5, 7}, F32, g), f),
      one("f32[4,6,3] permuted grad", input({4, 6, 3}, F32, g, L::Permuted, true), f),
      one("f32[5,3,2] strided grad", input({5, 3, 2}, F32, g, L::Strided, true), f),
      one("f32[0,3,2]", input({0, 3, 2}, F32, g), f),
      one("f32[2,5,520]", input({2, 5, 520}, F32, g), f),
      one("f32[6,3,2] nan/inf", input({6, 3, 2}, F32, with_specials(g)), f),
  };
}

// Reductions over dims: float32 over the last dim, several dims with keepdim on a strided view,
// all dims; float64 permuted; a long row; gradients in float32 and float64.
using Reduce = std::function<Tensor(const Tensor&, std::vector<int64_t>, bool)>;
std::vector<Case> reduction(Reduce f, Gen g, bool grad = true) {
  auto by = [f](std::vector<int64_t> d, bool k) { return [f, d, k](const Tensor& x) { return f(x, d, k); }; };
  std::vector<Case> c = {
      one("f32[4,5,6] dim -1", input({4, 5, 6}, F32, g), by({-1}, false)),
      one("f32[4,5,6] strided dims 0,2 keepdim", input({4, 5, 6}, F32, g, L::Strided), by({0, 2}, true)),
      one("f32[3,7] all", input({3, 7}, F32, g), by({}, false)),
      one("f64[5,4,3] permuted dim 1", input({5, 4, 3}, F64, g, L::Permuted), by({1}, false)),
      one("f32[3,3001] dim 1", input({3, 3001}, F32, g), by({1}, false), 1e-4),
      one("f32[4,7] nan/inf dim 1", input({4, 7}, F32, with_specials(g)), by({1}, false)),
  };
  if (grad) {
    c.push_back(one("f32[4,6] strided dim 1 grad", input({4, 6}, F32, g, L::Strided, true), by({1}, false)));
    c.push_back(one("f32[3,4,5] dims 0,2 grad", input({3, 4, 5}, F32, g, L::Contiguous, true), by({0, 2}, true)));
  }
  return c;
}

std::vector<Case> logical(std::function<Tensor(const Tensor&, const Tensor&)> f) {
  auto two = [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0], x[1])}; };
  return {
      of("bool[4,5] and bool[4,5]", {input({4, 5}, B, integers(0, 1)), input({4, 5}, B, integers(0, 1))}, two),
      of("f32[3,4] strided and i64[4]", {input({3, 4}, F32, integers(-1, 1), L::Strided), input({4}, I64, integers(-1, 1))}, two),
      of("bool[2,0] and bool[1]", {input({2, 0}, B, integers(0, 1)), input({1}, B, integers(0, 1))}, two),
  };
}

// Views and copies: float32, int64 and bool on a permuted or strided input; gradients.
std::vector<Case> view(Unary f, const Shape& s) {
  Gen g = uniform(-2, 2);
  return {
      one(variant_name(F32, s), input(s, F32, g), f, 0),
      one(variant_name(I64, s, "permuted"), input(s, I64, integers(-5, 5), L::Permuted), f, 0),
      one(variant_name(B, s, "strided"), input(s, B, integers(0, 1), L::Strided), f, 0),
      one(variant_name(F32, s, "permuted grad"), input(s, F32, g, L::Permuted, true), f),
      one(variant_name(F32, s, "strided grad"), input(s, F32, g, L::Strided, true), f),
  };
}
std::vector<Case> views(Many f, const Shape& s) {
  Gen g = uniform(-2, 2);
  return {
      of(variant_name(F32, s), {input(s, F32, g)}, f, 0),
      of(variant_name(I64, s, "permuted"), {input(s, I64, integers(-5, 5), L::Permuted)}, f, 0),
      of(variant_name(F32, s, "strided grad"), {input(s, F32, g, L::Strided, true)}, f),
      of(variant_name(F32, s, "grad"), {input(s, F32, g, L::Contiguous, true)}, f),
  };
}

std::vector<Case> softmax_like(std::function<Tensor(const Tensor&, int64_t)> f) {
  auto at = [f](int64_t d) { return [f, d](const Tensor& x) { return f(x, d); }; };
  // Attention-style masking: some -inf entries (never a whole row).
  Gen masked = [](Rng& r) { return std::uniform_int_distribution<int>(0, 4)(r) ? std::uniform_real_distribution<double>(-4, 4)(r) : -INFINITY; };
  Gen g = uniform(-4, 4);
  Input mrow = input({6, 9}, F32, masked);
  return {
      one("f32[4,5,7] dim -1", input({4, 5, 7}, F32, g), at(-1)),
      one("f32[4,5,7] dim 0", input({4, 5, 7}, F32, g), at(0)),
      one("f32[5,6] strided dim 1 grad", input({5, 6}, F32, g, L::Strided, true), at(1)),
      one("f64[3,4,5] permuted dim 1 grad", input({3, 4, 5}, F64, g, L::Permuted, true), at(1)),
      one("f16[6,9] dim 1", input({6, 9}, F16, g), at(1), 1e-2),
      one("bf16[6,9] dim 1", input({6, 9}, BF16, g), at(1), 6e-2),
      one("f32[6,9] with -inf dim 1", mrow, at(1)),
      one("f32[3,3000] dim 1", input({3, 3000}, F32, g), at(1)),
      one("f32[0,5] dim 1", input({0, 5}, F32, g), at(1)),
  };
}

// Appends a row (its name and the function making its cases) to the table being built.
struct AddRow {
  std::vector<Row>& rows;
  void operator()(std::string name, std::function<std::vector<Case>()> f) const { rows.push_back({std::move(name), std::move(f)}); }
};

void add_factories_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- factories ----
  add("linspace", [] {
    return std::vector<Case>{
        made("f32 (-1, 2, 7)", [](const Context& c) { return linspace(-1, 2, 7, c.opts(F32)); }),
        made("f64 (0, 1, 1000)", [](const Context& c) { return linspace(0, 1, 1000, c.opts(F64)); }),
        made("f32 (3, 3, 1)", [](const Context& c) { return linspace(3, 3, 1, c.opts(F32)); }),
        made("f32 (0, 1, 0)", [](const Context& c) { return linspace(0, 1, 0, c.opts(F32)); }),
    };
  });
  add("eye", [] {
    return std::vector<Case>{
        made("f32 5", [](const Context& c) { return eye(5, -1, c.opts(F32)); }, 0),
        made("i64 3x7", [](const Context& c) { return eye(3, 7, c.opts(I64)); }, 0),
        made("bool 4x2", [](const Context& c) { return eye(4, 2, c.opts(B)); }, 0),
        made("f32 0", [](const Context& c) { return eye(0, -1, c.opts(F32)); }, 0),
    };
  });
  add("randint", [] {
    return std::vector<Case>{
        made("i64[5,7] [-3, 9)", [](const Context& c) { return randint(-3, 9, {5, 7}, c.opts(I64)); }),
        made("i32[1000] [0, 2)", [](const Context& c) { return randint(0, 2, {1000}, c.opts(I32)); }),
    };
  });
  add("rand_like", [g] {
    return std::vector<Case>{one("f32[4,5]", input({4, 5}, F32, g), [](const Tensor& x) { return rand_like(x); }),
                             one("f64[3,2] strided", input({3, 2}, F64, g, L::Strided), [](const Tensor& x) { return rand_like(x); }),
                             one("f16[6]", input({6}, F16, g), [](const Tensor& x) { return rand_like(x); })};
  });
  add("randn_like", [g] {
    return std::vector<Case>{one("f32[4,5]", input({4, 5}, F32, g), [](const Tensor& x) { return randn_like(x); }),
                             one("f64[3,2] permuted", input({3, 2}, F64, g, L::Permuted), [](const Tensor& x) { return randn_like(x); }),
                             one("bf16[6]", input({6}, BF16, g), [](const Tensor& x) { return randn_like(x); })};
  });
}

void add_elementwise_rows(AddRow add) {
  Gen g = uniform(-2, 2), pos = uniform(0.1, 4), nz = away_from_zero(-3, 3);
  // ---- elementwise ----
  add("rsqrt", [pos] { return elementwise([](const Tensor& x) { return rsqrt(x); }, pos); });
  add("reciprocal", [nz] { return elementwise([](const Tensor& x) { return reciprocal(x); }, nz); });
  add("square", [g] { return elementwise([](const Tensor& x) { return square(x); }, g); });
  add("sigmoid", [] { return elementwise([](const Tensor& x) { return sigmoid(x); }, uniform(-6, 6)); });
  add("relu", [nz] { return elementwise([](const Tensor& x) { return relu(x); }, nz); });
  add("gelu", [] {
    std::vector<Case> c = elementwise([](const Tensor& x) { return gelu(x); }, uniform(-4, 4));
    c.push_back(one("f16[9,5]", input({9, 5}, F16, uniform(-4, 4)), [](const Tensor& x) { return gelu(x); }, 1e-2));
    for (Case& k : elementwise([](const Tensor& x) { return gelu(x, true); }, uniform(-4, 4))) {
      k.variant += " tanh";
      c.push_back(k);
    }
    return c;
  });
  add("silu", [] { return elementwise([](const Tensor& x) { return silu(x); }, uniform(-6, 6)); });
  add("softplus", [] {
    std::vector<Case> c = elementwise([](const Tensor& x) { return softplus(x); }, uniform(-30, 30));
    c.push_back(one("f32[5,8] beta 2 threshold 5 grad", input({5, 8}, F32, uniform(-6, 6), L::Contiguous, true),
                    [](const Tensor& x) { return softplus(x, 2, 5); }));
    return c;
  });
  add("clamp", [] {
    Gen g = away_from_zero(-3, 3);  // |x| >= 0.05: away from the bounds below
    std::vector<Case> c = elementwise([](const Tensor& x) { return clamp(x, -1.0, 1.5); }, g);
    c.push_back(one("f32[4,5] min only grad", input({4, 5}, F32, g, L::Strided, true), [](const Tensor& x) { return clamp(x, 0.5, std::nullopt); }));
    c.push_back(one("i64[4,5] max only", input({4, 5}, I64, integers(-9, 9)), [](const Tensor& x) { return clamp(x, std::nullopt, 3.0); }, 0));
    return c;
  });
}

void add_logical_rows(AddRow add) {
  // ---- logical ----
  add("logical_and", [] { return logical([](const Tensor& a, const Tensor& b) { return logical_and(a, b); }); });
  add("logical_or", [] { return logical([](const Tensor& a, const Tensor& b) { return logical_or(a, b); }); });
  add("logical_xor", [] { return logical([](const Tensor& a, const Tensor& b) { return logical_xor(a, b); }); });
  add("logical_not", [] {
    return std::vector<Case>{one("bool[4,5]", input({4, 5}, B, integers(0, 1)), [](const Tensor& x) { return logical_not(x); }),
                             one("f32[3,4] strided nan/inf", input({3, 4}, F32, with_specials(integers(-1, 1)), L::Strided),
                                 [](const Tensor& x) { return logical_not(x); })};
  });
}

void add_reductions_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- reductions ----
  add("sum", [g] {
    std::vector<Case> c = reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return sum(x, d, k); }, g);
    c.push_back(one("i32[4,6] dim 0", input({4, 6}, I32, integers(-100, 100)), [](const Tensor& x) { return sum(x, {0}); }));
    c.push_back(one("f32[3,0,2] dim 1", input({3, 0, 2}, F32, g), [](const Tensor& x) { return sum(x, {1}); }));
    return c;
  });
  add("mean", [g] {
    std::vector<Case> c = reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return mean(x, d, k); }, g);
    c.push_back(one("f32[3,0,2] dim 1 (nan)", input({3, 0, 2}, F32, g), [](const Tensor& x) { return mean(x, {1}); }));
    return c;
  });
  add("amax", [g] { return reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return amax(x, d, k); }, g); });
  add("amin", [g] { return reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return amin(x, d, k); }, g); });
  // max(x) / min(x) over everything, and max(x, dim) / min(x, dim): values and indices.
  auto extreme = [g](bool is_max) {
    auto all = [is_max](const Tensor& x) { return is_max ? max(x) : min(x); };
    auto along = [is_max](int64_t d, bool k) {
      return [is_max, d, k](const std::vector<Tensor>& x) {
        auto [v, i] = is_max ? max(x[0], d, k) : min(x[0], d, k);
        return std::vector<Tensor>{v, i};
      };
    };
    auto values = [is_max](const Tensor& x) { return std::get<0>(is_max ? max(x, 1) : min(x, 1)); };
    return std::vector<Case>{
        one("f32[3,7] all", input({3, 7}, F32, g), all),
        one("i64[4,5] strided all", input({4, 5}, I64, integers(-9, 9), L::Strided), all, 0),
        of("f32[4,7] dim 1", {input({4, 7}, F32, g)}, along(1, false)),
        of("f32[4,7] ties dim 0 keepdim", {input({4, 7}, F32, integers(-1, 1))}, along(0, true)),
        of("f64[5,6] permuted dim -1", {input({5, 6}, F64, g, L::Permuted)}, along(-1, false)),
        of("f32[4,7] nan/inf dim 1", {input({4, 7}, F32, with_specials(g))}, along(1, false)),
        one("f32[4,6] ties dim 1 grad", input({4, 6}, F32, integers(-1, 1), L::Strided, true), values),
    };
  };
  add("max", [extreme] { return extreme(true); });
  add("min", [extreme] { return extreme(false); });
  auto arg = [](bool is_max) {
    auto f = [is_max](std::optional<int64_t> d, bool k) {
      return [is_max, d, k](const Tensor& x) { return is_max ? argmax(x, d, k) : argmin(x, d, k); };
    };
    return std::vector<Case>{
        one("f32[4,7] dim 1", input({4, 7}, F32, uniform(-2, 2)), f(1, false)),
        one("f32[4,7] ties dim 0 keepdim", input({4, 7}, F32, integers(-1, 1)), f(0, true)),
        one("i64[3,4,5] strided flat", input({3, 4, 5}, I64, integers(-9, 9), L::Strided), f(std::nullopt, false)),
        one("f64[5,6] permuted dim -1", input({5, 6}, F64, uniform(-2, 2), L::Permuted), f(-1, false)),
        one("f32[2,3000] dim 1", input({2, 3000}, F32, uniform(-2, 2)), f(1, false)),
    };
  };
  add("argmax", [arg] { return arg(true); });
  add("argmin", [arg] { return arg(false); });
  // sort/argsort/topk: a bitonic network over the primitives (ties keep their order);
  // cumsum: a triangular product; multinomial: Gumbel-max over the generator's draws.
  auto pair = [](std::tuple<Tensor, Tensor> t) { return std::vector<Tensor>{std::get<0>(t), std::get<1>(t)}; };
  add("sort", [g, pair] {
    return std::vector<Case>{
        of("f32[4,7] dim 1", {input({4, 7}, F32, g)}, [pair](const std::vector<Tensor>& x) { return pair(sort(x[0], 1)); }),
        of("f32[3,6] ties dim 0 descending", {input({3, 6}, F32, integers(-1, 1))},
           [pair](const std::vector<Tensor>& x) { return pair(sort(x[0], 0, true)); }),
        one("f64[5,9] permuted values grad", input({5, 9}, F64, g, L::Permuted, true), [](const Tensor& x) { return std::get<0>(sort(x)); }),
    };
  });
  add("argsort", [g] {
    return std::vector<Case>{
        one("f32[4,13] dim -1", input({4, 13}, F32, g), [](const Tensor& x) { return argsort(x); }),
        one("i64[6,5] ties strided dim 0 descending", input({6, 5}, I64, integers(-2, 2), L::Strided),
            [](const Tensor& x) { return argsort(x, 0, true); }),
        one("f32[2,300] dim 1", input({2, 300}, F32, g), [](const Tensor& x) { return argsort(x, 1); }),
    };
  });
  add("cumsum", [g] {
    return std::vector<Case>{
        one("f32[4,7] dim 1", input({4, 7}, F32, g), [](const Tensor& x) { return cumsum(x, 1); }),
        one("f64[5,3,4] permuted dim 0 grad", input({5, 3, 4}, F64, g, L::Permuted, true), [](const Tensor& x) { return cumsum(x, 0); }),
        one("f32[3,6] strided dim -1 grad", input({3, 6}, F32, g, L::Strided, true), [](const Tensor& x) { return cumsum(x, -1); }),
        one("i32[4,9] dim 1", input({4, 9}, I32, integers(-9, 9)), [](const Tensor& x) { return cumsum(x, 1); }),
        one("f32[2,700] dim 1", input({2, 700}, F32, g), [](const Tensor& x) { return cumsum(x, 1); }, 1e-4),
    };
  });
  add("topk", [g, pair] {
    return std::vector<Case>{
        of("f32[4,9] k 3 dim 1", {input({4, 9}, F32, g)}, [pair](const std::vector<Tensor>& x) { return pair(topk(x[0], 3, 1)); }),
        of("f32[6,4] ties k 2 smallest dim 0", {input({6, 4}, F32, integers(-1, 1))},
           [pair](const std::vector<Tensor>& x) { return pair(topk(x[0], 2, 0, false)); }),
        one("f32[3,8] strided values grad", input({3, 8}, F32, g, L::Strided, true), [](const Tensor& x) { return std::get<0>(topk(x, 4)); }),
    };
  });
  add("multinomial", [] {
    return std::vector<Case>{
        one("f32[3,6] 4 samples", input({3, 6}, F32, uniform(0.1, 2)), [](const Tensor& p) { return multinomial(p, 4); }),
        one("f32[5] 8 samples with replacement", input({5}, F32, uniform(0.1, 2)), [](const Tensor& p) { return multinomial(p, 8, true); }),
    };
  });
  add("var", [g] {
    std::vector<Case> c = reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return var(x, d, 1, k); }, g);
    c.push_back(one("f32[5,6] correction 0 grad", input({5, 6}, F32, g, L::Contiguous, true), [](const Tensor& x) { return var(x, {1}, 0); }));
    return c;
  });
  add("std", [g] { return reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return tessera::std(x, d, 1, k); }, g); });
  add("logsumexp", [g] {
    std::vector<Case> c = reduction([](const Tensor& x, std::vector<int64_t> d, bool k) { return logsumexp(x, d.empty() ? std::vector<int64_t>{0, 1} : d, k); }, uniform(-20, 20));
    c.push_back(one("f32[0,4] dim 0", input({0, 4}, F32, g), [](const Tensor& x) { return logsumexp(x, {0}); }));
    return c;
  });
}

void add_views_and_reshaping_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- views and reshaping ----
  add("narrow", [] { return view([](const Tensor& x) { return narrow(x, 1, 2, 3); }, {4, 6, 3}); });
  add("squeeze", [] {
    std::vector<Case> c = view([](const Tensor& x) { return squeeze(x); }, {3, 1, 4, 1});
    c.push_back(one("f32[3,1,4] dim 1 grad", input({3, 1, 4}, F32, uniform(-1, 1), L::Strided, true), [](const Tensor& x) { return squeeze(x, 1); }));
    return c;
  });
  add("unsqueeze", [] { return view([](const Tensor& x) { return unsqueeze(x, -1); }, {3, 4}); });
  add("flatten", [] { return view([](const Tensor& x) { return flatten(x, 1); }, {2, 3, 4}); });
  add("split", [] { return views([](const std::vector<Tensor>& x) { return split(x[0], 2, 1); }, {3, 5}); });
  add("chunk", [] { return views([](const std::vector<Tensor>& x) { return chunk(x[0], 3, 0); }, {7, 2}); });
  add("stack", [g] {
    Many f = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{stack(x, 1)}; };
    return std::vector<Case>{
        of("f32[3,4] x3 dim 1", {input({3, 4}, F32, g), input({3, 4}, F32, g, L::Permuted), input({3, 4}, F32, g, L::Strided)}, f, 0),
        of("bool[2,5] x2 dim 1", {input({2, 5}, B, integers(0, 1)), input({2, 5}, B, integers(0, 1))}, f, 0),
        of("f32[3,2] x2 grad", {input({3, 2}, F32, g, L::Contiguous, true), input({3, 2}, F32, g, L::Strided, true)}, f),
        of("f32[2,3] x2 grad", {input({2, 3}, F32, g, L::Contiguous, true), input({2, 3}, F32, g, L::Contiguous, true)}, f),
    };
  });
  add("repeat", [] { return view([](const Tensor& x) { return repeat(x, {2, 1, 3}); }, {3, 2}); });
}

void add_selection_and_indexing_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- selection and indexing ----
  add("masked_fill", [g] {
    auto mf = [](double v) { return [v](const std::vector<Tensor>& x) { return std::vector<Tensor>{masked_fill(x[0], x[1], v)}; }; };
    return std::vector<Case>{
        of("f32[4,5] mask[4,5] -inf", {input({4, 5}, F32, g), input({4, 5}, B, integers(0, 1))}, mf(-INFINITY), 0),
        of("f32[3,4,5] strided mask[4,1]", {input({3, 4, 5}, F32, g, L::Strided), input({4, 1}, B, integers(0, 1))}, mf(2.5), 0),
        of("i64[3,4] mask[4] 7", {input({3, 4}, I64, integers(-5, 5)), input({4}, B, integers(0, 1))}, mf(7), 0),
        of("f32[4,6] permuted grad", {input({4, 6}, F32, g, L::Permuted, true), input({4, 6}, B, integers(0, 1))}, mf(0)),
        of("f32[3,5] grad", {input({3, 5}, F32, g, L::Contiguous, true), input({1, 5}, B, integers(0, 1))}, mf(-1)),
    };
  });
  auto tri = [](bool lower) {
    auto f = [lower](int64_t k) { return [lower, k](const Tensor& x) { return lower ? tril(x, k) : triu(x, k); }; };
    return std::vector<Case>{
        one("f32[5,5] k 0", input({5, 5}, F32, uniform(-2, 2)), f(0), 0),
        one("f32[2,4,6] permuted k -1", input({2, 4, 6}, F32, uniform(-2, 2), L::Permuted), f(-1), 0),
        one("i64[6,3] k 2", input({6, 3}, I64, integers(-5, 5)), f(2), 0),
        one("f32[4,5] strided k 1 grad", input({4, 5}, F32, uniform(-2, 2), L::Strided, true), f(1)),
        one("f32[3,3] grad", input({3, 3}, F32, uniform(-2, 2), L::Contiguous, true), f(0)),
    };
  };
  add("tril", [tri] { return tri(true); });
  add("triu", [tri] { return tri(false); });
  add("index_select", [g] {
    auto is = [](int64_t d) { return [d](const std::vector<Tensor>& x) { return std::vector<Tensor>{index_select(x[0], d, x[1])}; }; };
    return std::vector<Case>{
        of("f32[5,4] dim 0 index[7]", {input({5, 4}, F32, g), input({7}, I64, integers(0, 4))}, is(0), 0),
        of("i64[3,6] strided dim 1 index i32[4]", {input({3, 6}, I64, integers(-9, 9), L::Strided), input({4}, I32, integers(0, 5))}, is(1), 0),
        of("f32[4,5] dim 1 index[0]", {input({4, 5}, F32, g), input({0}, I64, integers(0, 4))}, is(1), 0),
        of("f32[6,3] permuted dim 0 grad", {input({6, 3}, F32, g, L::Permuted, true), input({8}, I64, integers(0, 5))}, is(0)),
        of("f32[4,5] dim 1 grad", {input({4, 5}, F32, g, L::Contiguous, true), input({3}, I64, integers(0, 4))}, is(1)),
    };
  });
  add("embedding", [g] {
    Many f = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding(x[0], x[1])}; };
    return std::vector<Case>{
        of("f32[10,4] indices[3,5]", {input({10, 4}, F32, g), input({3, 5}, I64, integers(0, 9))}, f, 0),
        of("f32[50,8] strided indices i32[2,3]", {input({50, 8}, F32, g, L::Strided), input({2, 3}, I32, integers(0, 49))}, f, 0),
        of("f32[7,3] indices[4,6] grad", {input({7, 3}, F32, g, L::Contiguous, true), input({4, 6}, I64, integers(0, 6))}, f),
        of("f32[5,2] indices[9] grad", {input({5, 2}, F32, g, L::Permuted, true), input({9}, I64, integers(0, 4))}, f),
    };
  });
}

void add_convolution_and_pooling_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- convolution and pooling (flip and conv_general are the reverse and conv rows) ----
  add("conv1d", [g] {
    Many f = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{conv1d(x[0], x[1], x[2], 2, 1, 1, 1)}; };
    return std::vector<Case>{
        of("f32 x[2,3,11] w[4,3,3] bias stride 2 pad 1", {input({2, 3, 11}, F32, g), input({4, 3, 3}, F32, g), input({4}, F32, g)}, f, 2e-5),
        of("f32 x[2,3,9] w[2,3,2] bias grad", {input({2, 3, 9}, F32, g, L::Strided, true), input({2, 3, 2}, F32, g, L::Contiguous, true),
                                              input({2}, F32, g, L::Contiguous, true)}, f),
    };
  });
  add("conv2d", [g] {
    auto f = [](std::vector<int64_t> st, std::vector<int64_t> pd, std::vector<int64_t> dl, int64_t gr) {
      return [=](const std::vector<Tensor>& x) { return std::vector<Tensor>{conv2d(x[0], x[1], x[2], st, pd, dl, gr)}; };
    };
    return std::vector<Case>{
        of("f32 x[2,4,9,8] w[6,4,3,3] bias pad 1", {input({2, 4, 9, 8}, F32, g), input({6, 4, 3, 3}, F32, g), input({6}, F32, g)}, f({1}, {1}, {1}, 1), 2e-5),
        of("f64 x[1,4,7,7] w[4,2,3,3] stride 2 groups 2 dilation (1,2)", {input({1, 4, 7, 7}, F64, g), input({4, 2, 3, 3}, F64, g), input({4}, F64, g)},
           f({2}, {1, 2}, {1, 2}, 2)),
        of("f32 x[2,3,6,6] permuted grad", {input({2, 3, 6, 6}, F32, g, L::Permuted, true), input({4, 3, 3, 3}, F32, g, L::Contiguous, true),
                                            input({4}, F32, g, L::Contiguous, true)}, f({1}, {1}, {1}, 1)),
    };
  });
  add("conv_transpose2d", [g] {
    Many f = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{conv_transpose2d(x[0], x[1], x[2], {2}, {1}, {1})}; };
    return std::vector<Case>{
        of("f32 x[2,4,5,4] w[4,3,3,3] stride 2 pad 1 output_padding 1", {input({2, 4, 5, 4}, F32, g), input({4, 3, 3, 3}, F32, g), input({3}, F32, g)}, f, 2e-5),
        of("f32 x[1,2,3,3] w[2,2,3,3] grad", {input({1, 2, 3, 3}, F32, g, L::Strided, true), input({2, 2, 3, 3}, F32, g, L::Contiguous, true),
                                              input({2}, F32, g, L::Contiguous, true)}, f),
    };
  });
  add("max_pool2d", [g] {
    auto mp = [](std::vector<int64_t> k, std::vector<int64_t> st, std::vector<int64_t> pd) {
      return [=](const Tensor& x) { return max_pool2d(x, k, st, pd); };
    };
    return std::vector<Case>{
        one("f32[2,3,8,8] 2x2", input({2, 3, 8, 8}, F32, g), mp({2}, {}, {0}), 0),
        one("f32[1,2,7,9] 3x3 stride 2 pad 1", input({1, 2, 7, 9}, F32, g, L::Permuted), mp({3}, {2}, {1}), 0),
        one("i32[1,2,6,6] 3x2", input({1, 2, 6, 6}, I32, integers(-9, 9)), mp({3, 2}, {}, {0}), 0),
        one("f32[2,2,6,6] nan/inf 2x2", input({2, 2, 6, 6}, F32, with_specials(g)), mp({2}, {}, {0}), 0),
        one("f32[1,2,6,6] ties grad", input({1, 2, 6, 6}, F32, integers(-1, 1), L::Strided, true), mp({2}, {}, {0})),
        one("f32[2,1,7,7] 3x3 stride 2 pad 1 grad", input({2, 1, 7, 7}, F32, g, L::Contiguous, true), mp({3}, {2}, {1})),
    };
  });
  add("avg_pool2d", [g] {
    auto ap = [](std::vector<int64_t> k, std::vector<int64_t> st, std::vector<int64_t> pd, bool inc) {
      return [=](const Tensor& x) { return avg_pool2d(x, k, st, pd, inc); };
    };
    return std::vector<Case>{
        one("f32[2,3,8,8] 2x2", input({2, 3, 8, 8}, F32, g), ap({2}, {}, {0}, true)),
        one("f32[1,2,7,9] 3x3 stride 2 pad 1 exclude pad", input({1, 2, 7, 9}, F32, g, L::Strided), ap({3}, {2}, {1}, false)),
        one("f64[1,2,6,5] 3x2 pad (1,1)", input({1, 2, 6, 5}, F64, g), ap({3, 2}, {1}, {1}, true)),
        one("f32[2,2,7,7] 3x3 stride 2 pad 1 grad", input({2, 2, 7, 7}, F32, g, L::Permuted, true), ap({3}, {2}, {1}, false)),
    };
  });
  add("adaptive_avg_pool2d", [g] {
    auto aa = [](std::vector<int64_t> o) { return [o](const Tensor& x) { return adaptive_avg_pool2d(x, o); }; };
    return std::vector<Case>{
        one("f32[2,3,7,9] -> [3,4]", input({2, 3, 7, 9}, F32, g), aa({3, 4})),
        one("f32[1,2,5,5] strided -> [1,1]", input({1, 2, 5, 5}, F32, g, L::Strided), aa({1, 1})),
        one("f32[2,2,6,7] -> [4,3] grad", input({2, 2, 6, 7}, F32, g, L::Permuted, true), aa({4, 3})),
    };
  });
  add("batch_norm", [g] {
    // Training with running statistics: the output and both updated statistics are checked.
    Many train = [](const std::vector<Tensor>& x) {
      Tensor rm = x[1], rv = x[2];
      Tensor y = batch_norm(x[0], rm, rv, x[3], x[4], true, 0.1);
      return std::vector<Tensor>{y, rm, rv};
    };
    Many eval = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{batch_norm(x[0], x[1], x[2], x[3], x[4], false)}; };
    Many plain = [](const std::vector<Tensor>& x) { return std::vector<Tensor>{batch_norm(x[0], Tensor(), Tensor())}; };
    Gen var = uniform(0.5, 2);
    return std::vector<Case>{
        of("f32 x[4,3,5,5] training, running stats", {input({4, 3, 5, 5}, F32, g), input({3}, F32, g), input({3}, F32, var), input({3}, F32, g), input({3}, F32, g)}, train),
        of("f32 x[3,4,6] strided eval", {input({3, 4, 6}, F32, g, L::Strided), input({4}, F32, g), input({4}, F32, var), input({4}, F32, g), input({4}, F32, g)}, eval),
        of("f64 x[5,2] no weight", {input({5, 2}, F64, g)}, plain),
        of("f32 x[3,2,4,4] permuted training grad", {input({3, 2, 4, 4}, F32, g, L::Permuted, true), input({2}, F32, g), input({2}, F32, var),
                                                     input({2}, F32, g, L::Contiguous, true), input({2}, F32, g, L::Contiguous, true)},
           [](const std::vector<Tensor>& x) { return std::vector<Tensor>{batch_norm(x[0], Tensor(), Tensor(), x[3], x[4])}; }, -1, 2e-4),
    };
  });
}

void add_networks_rows(AddRow add) {
  Gen g = uniform(-2, 2);
  // ---- networks ----
  add("softmax", [] { return softmax_like([](const Tensor& x, int64_t d) { return softmax(x, d); }); });
  add("log_softmax", [] { return softmax_like([](const Tensor& x, int64_t d) { return log_softmax(x, d); }); });
  // Not an op of ops.h: the traced pattern softmax(where(causal, -inf, Q K^T * scale)) V that a
  // backend declaring Target::attention runs as one fused Step (the cpu; the others the
  // decomposition); the gradient case, over 128 keys, fuses the backward too (passes/fuse.h).
  // Under bfloat16 autocast (the products' operands rounded, float32 results and softmax) the
  // cpu fuses too (Target::attention_bf16); the reference evaluates the same roundings in
  // float64. The gradients are rounded to bfloat16 last (the products' VJPs): an element the
  // float32 and float64 sums place on either side of a rounding boundary moves by a bfloat16
  // step (2^-8 of itself), hence their 8e-3.
  add("attention", [] {
    auto attn = [](bool causal, bool bf16 = false) {
      return Many([causal, bf16](const std::vector<Tensor>& x) {
        std::optional<Autocast> ac;
        if (bf16) ac.emplace(DType::BFloat16);
        const int64_t tq = x[0].shape()[2], tk = x[1].shape()[2];
        Tensor att = matmul(x[0], x[1].transpose(-2, -1)) * (1.0 / std::sqrt(double(x[0].shape()[3])));
        if (causal) {
          TensorOptions i64{DType::Int64, x[0].device()};
          Tensor qpos = arange(0, double(tq), 1, i64).reshape({tq, 1}) + double(tk - tq);  // the last tq positions
          att = masked_fill(att, arange(0, double(tk), 1, i64).reshape({1, tk}) > qpos, -INFINITY);
        }
        return std::vector<Tensor>{matmul(softmax(att, -1), x[2])};
      });
    };
    Gen g = uniform(-2, 2);
    return std::vector<Case>{
        of("f32 q,k,v[2,3,67,32] causal", {input({2, 3, 67, 32}, F32, g), input({2, 3, 67, 32}, F32, g), input({2, 3, 67, 32}, F32, g)}, attn(true)),
        of("f32 q[1,2,20,32] k[1,2,90,32] v[1,2,90,16] permuted", {input({1, 2, 20, 32}, F32, g), input({1, 2, 90, 32}, F32, g, L::Permuted),
                                                                  input({1, 2, 90, 16}, F32, g, L::Strided)}, attn(false)),
        of("f32 q[1,2,20,32] k,v[1,2,90,32] causal over a cache", {input({1, 2, 20, 32}, F32, g), input({1, 2, 90, 32}, F32, g),
                                                                  input({1, 2, 90, 32}, F32, g)}, attn(true)),
        of("f32 q,k,v[1,2,130,32] causal grad", {input({1, 2, 130, 32}, F32, g, L::Contiguous, true), input({1, 2, 130, 32}, F32, g, L::Contiguous, true),
                                                 input({1, 2, 130, 32}, F32, g, L::Contiguous, true)}, attn(true)),
        of("f32 q,k,v[2,2,64,32] causal bf16 autocast", {input({2, 2, 64, 32}, F32, g), input({2, 2, 64, 32}, F32, g, L::Permuted),
                                                        input({2, 2, 64, 32}, F32, g, L::Strided)}, attn(true, true), 1e-4),
        of("f32 q,k,v[1,2,70,32] causal bf16 autocast grad", {input({1, 2, 70, 32}, F32, g, L::Contiguous, true), input({1, 2, 70, 32}, F32, g, L::Contiguous, true),
                                                             input({1, 2, 70, 32}, F32, g, L::Contiguous, true)}, attn(true, true), 1e-4, 8e-3),
    };
  });
  add("layer_norm", [g] {
    auto ln = [](Shape ns) { return [ns](const std::vector<Tensor>& x) { return std::vector<Tensor>{layer_norm(x[0], ns, x[1], x[2])}; }; };
    auto plain = [](Shape ns) { return [ns](const std::vector<Tensor>& x) { return std::vector<Tensor>{layer_norm(x[0], ns)}; }; };
    return std::vector<Case>{
        of("f32[4,6,8] over [8] weight bias", {input({4, 6, 8}, F32, g), input({8}, F32, g), input({8}, F32, g)}, ln({8})),
        of("f32[3,5,6] strided over [5,6]", {input({3, 5, 6}, F32, g, L::Strided)}, plain({5, 6})),
        of("f32[5,7] permuted grad (x, weight, bias)",
           {input({5, 7}, F32, g, L::Permuted, true), input({7}, F32, g, L::Contiguous, true), input({7}, F32, g, L::Contiguous, true)}, ln({7}),
           -1, 2e-4),
        of("f64[3,4,5] over [4,5] grad", {input({3, 4, 5}, F64, g, L::Contiguous, true), input({4, 5}, F64, g, L::Contiguous, true),
                                          input({4, 5}, F32, g, L::Strided, true)}, ln({4, 5})),
        of("f16[6,16]", {input({6, 16}, F16, g)}, plain({16}), 1e-2),
        of("f32[2,3000]", {input({2, 3000}, F32, g)}, plain({3000})),
        of("f32[0,4]", {input({0, 4}, F32, g)}, plain({4})),
    };
  });
  // ---- losses ----
  add("cross_entropy", [] {
    auto with = [](CrossEntropyOptions o) {
      return Many([o](const std::vector<Tensor>& x) { return std::vector<Tensor>{cross_entropy(x[0], x[1], o)}; });
    };
    Many ce = with({});
    Gen g = uniform(-5, 5);
    return std::vector<Case>{
        of("f32[8,5] targets i64", {input({8, 5}, F32, g), input({8}, I64, integers(0, 4))}, ce),
        of("f32[6,7] strided grad, targets i32", {input({6, 7}, F32, g, L::Strided, true), input({6}, I32, integers(0, 6))}, ce),
        of("f64[5,4] permuted grad", {input({5, 4}, F64, g, L::Permuted, true), input({5}, I64, integers(0, 3))}, ce),
        of("f32[4,1000] grad", {input({4, 1000}, F32, g, L::Contiguous, true), input({4}, I64, integers(0, 999))}, ce),
        of("f32[6,5] ignore 2, smoothing 0.1, grad", {input({6, 5}, F32, g, L::Contiguous, true), input({6}, I64, integers(0, 4))},
           with({.ignore_index = 2, .label_smoothing = 0.1})),
        of("f32[6,5] reduction none, ignore 1", {input({6, 5}, F32, g), input({6}, I64, integers(0, 4))},
           with({.reduction = Reduction::None, .ignore_index = 1})),
        of("f32[3,4,5] classes along dim 1, sum, grad", {input({3, 4, 5}, F32, g, L::Permuted, true), input({3, 5}, I64, integers(0, 3))},
           with({.reduction = Reduction::Sum})),
    };
  });
  add("nll_loss", [] {
    auto with = [](NLLLossOptions o) {
      return Many([o](const std::vector<Tensor>& x) { return std::vector<Tensor>{nll_loss(x[0], x[1], o)}; });
    };
    Gen g = uniform(-4, 0);
    return std::vector<Case>{
        of("f32[7,4] targets i64", {input({7, 4}, F32, g), input({7}, I64, integers(0, 3))}, with({})),
        of("f64[6,5] strided ignore 0 grad", {input({6, 5}, F64, g, L::Strided, true), input({6}, I64, integers(0, 4))},
           with({.ignore_index = 0})),
        of("f32[5,3] reduction none grad", {input({5, 3}, F32, g, L::Contiguous, true), input({5}, I32, integers(0, 2))},
           with({.reduction = Reduction::None})),
    };
  });
  add("mse_loss", [] {
    auto with = [](Reduction r) {
      return Many([r](const std::vector<Tensor>& x) { return std::vector<Tensor>{mse_loss(x[0], x[1], r)}; });
    };
    Gen g = uniform(-2, 2);
    return std::vector<Case>{
        of("f32[4,6] mean grad", {input({4, 6}, F32, g, L::Contiguous, true), input({4, 6}, F32, g, L::Permuted, true)},
           with(Reduction::Mean)),
        of("f64[3,5] sum", {input({3, 5}, F64, g), input({3, 5}, F64, g, L::Strided)}, with(Reduction::Sum)),
        of("f32[2,3,4] none grad", {input({2, 3, 4}, F32, g, L::Strided, true), input({2, 3, 4}, F32, g)}, with(Reduction::None)),
    };
  });
}

std::vector<Row> make_rows() {
  std::vector<Row> r;
  add_factories_rows({r});
  add_elementwise_rows({r});
  add_logical_rows({r});
  add_reductions_rows({r});
  add_views_and_reshaping_rows({r});
  add_selection_and_indexing_rows({r});
  add_convolution_and_pooling_rows({r});
  add_networks_rows({r});
  return r;
}

}  // namespace

const std::vector<Row>& composite_rows() {
  static const std::vector<Row> rows = make_rows();
  return rows;
}

}  // namespace tessera::conformance
