// The collective primitives' shape/dtype, cost and VJP rules.
//
// VJPs follow the SPMD convention (docs/architecture.md "Parallelism"): the loss being
// differentiated is the SUM of every rank's loss, L = sum_r L_r(y_r), and each rank holds the
// cotangent g_r = dL_r/dy_r of its own output. Then for x_s on rank s:
//   all_reduce(sum):  y_r = sum_s x_s            -> dL/dx_s = sum_r g_r     = all_reduce(sum)(g)
//   all_reduce(mean): y_r = (1/N) sum_s x_s      -> dL/dx_s = (1/N) sum_r g_r = all_reduce(mean)(g)
//   all_reduce(max):  y_r = max_s x_s            -> sum_r g_r on the ranks holding the maximum,
//                     split evenly between tied ranks (like maximum's VJP), 0 elsewhere
//   all_gather(a):    y_r = concat_s x_s         -> block s of sum_r g_r     = reduce_scatter(a)(g)
//   reduce_scatter(a): y_r = block r of sum_s x_s -> concat_r g_r            = all_gather(a)(g)
//   all_to_all(a, c): a block permutation        -> its inverse             = all_to_all(c, a)(g)
//   broadcast(root):  y_r = x_root               -> sum_r g_r on the root, 0 elsewhere = reduce(root)(g)
//   reduce(root):     y_root = sum_s x_s         -> g_root on every rank    = broadcast(root)(g)
//   permute(pairs):   y_d = x_s per pair (s, d)  -> g_d back to s           = permute(inverse pairs)(g)
// So a data-parallel step whose loss is each rank's mean over its own batch shard gets the
// gradient of the SUM of the ranks' losses; dividing by N (all_reduce mean) gives the global
// batch's mean. tests/unit/test_collectives.cpp checks each rule by finite differences of the
// total loss, perturbing one element on one rank at a time.
#include "ir/collectives.h"

#include <string>

#include "core/fail.h"
#include "ir/build.h"

namespace tessera::ir {
namespace {

std::string desc(const NodePtr& n) { return std::string(dtype_name(n->dtype)) + shape_str(n->shape); }
std::string num(int64_t v) { return std::to_string(v); }

// Checks the attribute count and the group size; returns the ranks.
int64_t check_ranks(const char* op, const Attrs& a, size_t min_ints, size_t max_ints, const NodePtr& x) {
  const auto& k = a.ints;
  if (k.size() < min_ints || k.size() > max_ints)
    fail(op, "bad attributes (" + num(int64_t(k.size())) + " integers) for " + desc(x));
  if (k[0] < 1 || k[0] > (1 << 20)) fail(op, "the group size (ranks) must be >= 1, got " + num(k[0]) + " for " + desc(x));
  return k[0];
}
void check_axis(const char* op, int64_t axis, const NodePtr& x, const char* what = "axis") {
  if (axis < 0 || axis >= int64_t(x->shape.size()))
    fail(op, std::string(what) + " " + num(axis) + " out of range for " + desc(x));
}
void check_divides(const char* op, int64_t ranks, int64_t axis, const NodePtr& x) {
  if (x->shape[size_t(axis)] % ranks != 0)
    fail(op, "uneven split: dimension " + num(axis) + " of " + desc(x) + " (extent " + num(x->shape[size_t(axis)]) +
                 ") does not divide into " + num(ranks) + " ranks");
}
void check_summable(const char* op, const NodePtr& x) {
  if (x->dtype == DType::Bool) fail(op, "cannot sum bool tensors (cast first), got " + desc(x));
}

double bytes_of(const Node& n) { return double(n.numel()) * double(itemsize(n.dtype)); }

}  // namespace

CollectiveAttrs CollectiveAttrs::from(Op op, const Attrs& a) {
  CollectiveAttrs c;
  const auto& k = a.ints;
  c.ranks = k.empty() ? 1 : k[0];
  switch (op) {
    case Op::AllReduce: c.kind = ReduceKind(k[1]); break;
    case Op::AllGather: case Op::ReduceScatter: c.axis = k[1]; break;
    case Op::AllToAll: c.axis = k[1], c.concat_axis = k[2]; break;
    case Op::Broadcast: case Op::Reduce: c.root = k[1]; break;
    case Op::CollectivePermute:
      for (size_t i = 1; i + 1 < k.size(); i += 2) c.pairs.push_back({k[i], k[i + 1]});
      break;
    default: break;
  }
  return c;
}
int64_t CollectiveAttrs::source_of(int64_t r) const {
  for (auto [s, d] : pairs)
    if (d == r) return s;
  return -1;
}
int64_t CollectiveAttrs::destination_of(int64_t r) const {
  for (auto [s, d] : pairs)
    if (s == r) return d;
  return -1;
}

TypeShape infer_collective(Op op, const InferArgs& a) {
  const NodePtr& x = a.inputs[0];
  const char* name = op_name(op);
  const auto& k = a.attrs.ints;
  Shape s = x->shape;
  switch (op) {
    case Op::AllReduce: {
      check_ranks(name, a.attrs, 2, 2, x);
      if (k[1] < 0 || k[1] > 2) fail(name, "reduction must be 0 (sum), 1 (mean) or 2 (max), got " + num(k[1]));
      if (ReduceKind(k[1]) == ReduceKind::Mean && !is_floating(x->dtype)) fail(name, "mean needs a floating tensor, got " + desc(x));
      if (ReduceKind(k[1]) == ReduceKind::Sum) check_summable(name, x);
      break;
    }
    case Op::AllGather: {
      int64_t n = check_ranks(name, a.attrs, 2, 2, x);
      check_axis(name, k[1], x);
      if (__builtin_mul_overflow(s[size_t(k[1])], n, &s[size_t(k[1])])) fail(name, "extent overflows 64 bits: " + desc(x));
      break;
    }
    case Op::ReduceScatter: {
      int64_t n = check_ranks(name, a.attrs, 2, 2, x);
      check_axis(name, k[1], x);
      check_summable(name, x);
      check_divides(name, n, k[1], x);
      s[size_t(k[1])] /= n;
      break;
    }
    case Op::AllToAll: {
      int64_t n = check_ranks(name, a.attrs, 3, 3, x);
      check_axis(name, k[1], x, "split axis");
      check_axis(name, k[2], x, "concat axis");
      check_divides(name, n, k[1], x);
      s[size_t(k[1])] /= n;
      if (__builtin_mul_overflow(s[size_t(k[2])], n, &s[size_t(k[2])])) fail(name, "extent overflows 64 bits: " + desc(x));
      break;
    }
    case Op::Broadcast: case Op::Reduce: {
      int64_t n = check_ranks(name, a.attrs, 2, 2, x);
      if (k[1] < 0 || k[1] >= n) fail(name, "root " + num(k[1]) + " out of range for " + num(n) + " ranks");
      if (op == Op::Reduce) check_summable(name, x);
      break;
    }
    case Op::CollectivePermute: {
      int64_t n = check_ranks(name, a.attrs, 1, size_t(-1), x);
      if (k.size() % 2 != 1) fail(name, "needs (source, destination) pairs, got " + num(int64_t(k.size()) - 1) + " integers");
      std::vector<bool> sends(size_t(n), false), receives(size_t(n), false);
      for (size_t i = 1; i + 1 < k.size(); i += 2) {
        int64_t src = k[i], dst = k[i + 1];
        if (src < 0 || src >= n || dst < 0 || dst >= n)
          fail(name, "pair (" + num(src) + ", " + num(dst) + ") out of range for " + num(n) + " ranks");
        if (sends[size_t(src)] || receives[size_t(dst)])
          fail(name, "rank " + num(sends[size_t(src)] ? src : dst) + " appears twice as a " +
                         (sends[size_t(src)] ? "source" : "destination") + " in its pairs");
        sends[size_t(src)] = receives[size_t(dst)] = true;
      }
      break;
    }
    default: fail(name, "not a collective");
  }
  return {s, x->dtype};
}

Cost cost_collective(const Node& n) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  const double N = double(c.ranks), in = bytes_of(*n.inputs[0]), out = bytes_of(n), frac = (N - 1) / N;
  Cost r{0, in + out, 0};
  switch (n.op) {
    case Op::AllReduce: r.flops = double(n.numel()) * (N - 1), r.comm_bytes = 2 * frac * in; break;
    case Op::AllGather: r.comm_bytes = frac * out; break;
    case Op::ReduceScatter: r.flops = double(n.numel()) * (N - 1), r.comm_bytes = frac * in; break;
    case Op::AllToAll: r.comm_bytes = frac * in; break;
    case Op::Broadcast: r.comm_bytes = N > 1 ? in : 0; break;
    case Op::Reduce: r.flops = double(n.numel()) * (N - 1), r.comm_bytes = N > 1 ? in : 0; break;
    case Op::CollectivePermute: r.comm_bytes = c.pairs.empty() ? 0 : in; break;
    default: break;
  }
  return r;
}

namespace build {
NodePtr all_reduce(const NodePtr& x, int64_t ranks, ReduceKind kind) { return make(Op::AllReduce, {x}, Attrs{{ranks, int64_t(kind)}, 0}); }
NodePtr all_gather(const NodePtr& x, int64_t ranks, int64_t axis) { return make(Op::AllGather, {x}, Attrs{{ranks, axis}, 0}); }
NodePtr reduce_scatter(const NodePtr& x, int64_t ranks, int64_t axis) { return make(Op::ReduceScatter, {x}, Attrs{{ranks, axis}, 0}); }
NodePtr all_to_all(const NodePtr& x, int64_t ranks, int64_t split_axis, int64_t concat_axis) {
  return make(Op::AllToAll, {x}, Attrs{{ranks, split_axis, concat_axis}, 0});
}
NodePtr broadcast(const NodePtr& x, int64_t ranks, int64_t root) { return make(Op::Broadcast, {x}, Attrs{{ranks, root}, 0}); }
NodePtr reduce_to_root(const NodePtr& x, int64_t ranks, int64_t root) { return make(Op::Reduce, {x}, Attrs{{ranks, root}, 0}); }
NodePtr collective_permute(const NodePtr& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  std::vector<int64_t> k{ranks};
  for (auto [s, d] : pairs) k.insert(k.end(), {s, d});
  return make(Op::CollectivePermute, {x}, Attrs{k, 0});
}
}  // namespace build

namespace {

using namespace build;
using Grads = std::vector<NodePtr>;

Grads vjp_all_reduce(const Node& n, const NodePtr& self, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  if (c.kind != ReduceKind::Max) return {all_reduce(g, c.ranks, c.kind)};
  const NodePtr& x = n.inputs[0];
  NodePtr is_max = binary(Op::Eq, x, self);
  NodePtr ties = all_reduce(cast(is_max, g->dtype), c.ranks, ReduceKind::Sum);
  NodePtr total = all_reduce(g, c.ranks, ReduceKind::Sum);
  // Where no rank holds the maximum (NaN), `ties` is 0: the gradient is 0 there, not 0/0.
  return {where(is_max, div(total, where(is_max, ties, full_like(ties, 1))), full_like(g, 0))};
}
Grads vjp_all_gather(const Node& n, const NodePtr&, const NodePtr& g) { return {reduce_scatter(g, n.attrs.ints[0], n.attrs.ints[1])}; }
Grads vjp_reduce_scatter(const Node& n, const NodePtr&, const NodePtr& g) { return {all_gather(g, n.attrs.ints[0], n.attrs.ints[1])}; }
Grads vjp_all_to_all(const Node& n, const NodePtr&, const NodePtr& g) {
  return {all_to_all(g, n.attrs.ints[0], n.attrs.ints[2], n.attrs.ints[1])};
}
Grads vjp_broadcast(const Node& n, const NodePtr&, const NodePtr& g) { return {reduce_to_root(g, n.attrs.ints[0], n.attrs.ints[1])}; }
Grads vjp_reduce(const Node& n, const NodePtr&, const NodePtr& g) { return {broadcast(g, n.attrs.ints[0], n.attrs.ints[1])}; }
Grads vjp_permute(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  for (auto& [s, d] : c.pairs) std::swap(s, d);
  return {collective_permute(g, c.ranks, c.pairs)};
}

}  // namespace

VjpRule collective_vjp_rule(Op op) {
  switch (op) {
    case Op::AllReduce: return vjp_all_reduce;
    case Op::AllGather: return vjp_all_gather;
    case Op::ReduceScatter: return vjp_reduce_scatter;
    case Op::AllToAll: return vjp_all_to_all;
    case Op::Broadcast: return vjp_broadcast;
    case Op::Reduce: return vjp_reduce;
    case Op::CollectivePermute: return vjp_permute;
    default: return nullptr;
  }
}

}  // namespace tessera::ir
