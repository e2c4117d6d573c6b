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
// One more integer than max_ints is the sub-group's stride (CollectiveAttrs::stride), >= 1.
int64_t check_ranks(const char* op, const Attrs& a, size_t min_ints, size_t max_ints, const NodePtr& x) {
  const auto& k = a.ints;
  if (k.size() < min_ints || (max_ints != size_t(-1) && k.size() > max_ints + 1))
    fail(op, "bad attributes (" + num(int64_t(k.size())) + " integers) for " + desc(x));
  if (k[0] < 1 || k[0] > (1 << 20)) fail(op, "the group size (ranks) must be in [1, 2^20], got " + num(k[0]) + " for " + desc(x));
  if (max_ints != size_t(-1) && k.size() == max_ints + 1 && (k.back() < 1 || k.back() > (1 << 20)))
    fail(op, "the sub-group's stride must be in [1, 2^20], got " + num(k.back()) + " for " + desc(x));
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

namespace {
// The op's own integer count (a permute: odd), so that one more is the sub-group's stride.
size_t own_ints(Op op, size_t n) {
  switch (op) {
    case Op::AllToAll: return 3;
    case Op::CollectivePermute: return n % 2 == 1 ? n : n - 1;
    default: return 2;
  }
}
}  // namespace

CollectiveAttrs CollectiveAttrs::from(Op op, const Attrs& a) {
  CollectiveAttrs c;
  const auto& k = a.ints;
  c.ranks = k.empty() ? 1 : k[0];
  if (!k.empty() && k.size() > own_ints(op, k.size())) c.stride = k.back();
  switch (op) {
    case Op::AllReduce: c.kind = ReduceKind(k[1]); break;
    case Op::AllGather: case Op::ReduceScatter: c.axis = k[1]; break;
    case Op::AllToAll: c.axis = k[1], c.concat_axis = k[2]; break;
    case Op::Broadcast: case Op::Reduce: c.root = k[1]; break;
    case Op::CollectivePermute:
      for (size_t i = 1; i + 1 < own_ints(op, k.size()); i += 2) c.pairs.push_back({k[i], k[i + 1]});
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
std::vector<int64_t> CollectiveAttrs::group_of(int64_t r, int64_t world, const char* op) const {
  const int64_t s = stride > 0 ? stride : 1;
  if (stride == 0 ? ranks != world : world % (ranks * s) != 0)
    fail(op, "a group of " + num(ranks) + " ranks" + (stride ? " at stride " + num(stride) : std::string()) +
                 " does not tile a communicator of " + num(world) + " ranks");
  if (r < 0 || r >= world) fail(op, "rank " + num(r) + " out of range for " + num(world) + " ranks");
  const int64_t base = r - ((r / s) % ranks) * s;
  std::vector<int64_t> m;
  for (int64_t i = 0; i < ranks; ++i) m.push_back(base + i * s);
  return m;
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
      // (source, destination) pairs after the group size; an even count ends with the stride.
      const size_t own = k.size() % 2 == 1 ? k.size() : k.size() - 1;
      if (own < k.size() && (k.back() < 1 || k.back() > (1 << 20)))
        fail(name, "the sub-group's stride must be in [1, 2^20], got " + num(k.back()) + " for " + desc(x));
      std::vector<bool> sends(size_t(n), false), receives(size_t(n), false);
      for (size_t i = 1; i + 1 < own; i += 2) {
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
namespace {
Attrs with_stride(std::vector<int64_t> k, int64_t stride) {
  if (stride > 0) k.push_back(stride);
  return Attrs{std::move(k), 0};
}
}  // namespace
NodePtr all_reduce(const NodePtr& x, int64_t ranks, ReduceKind kind, int64_t stride) {
  return make(Op::AllReduce, {x}, with_stride({ranks, int64_t(kind)}, stride));
}
NodePtr all_gather(const NodePtr& x, int64_t ranks, int64_t axis, int64_t stride) {
  return make(Op::AllGather, {x}, with_stride({ranks, axis}, stride));
}
NodePtr reduce_scatter(const NodePtr& x, int64_t ranks, int64_t axis, int64_t stride) {
  return make(Op::ReduceScatter, {x}, with_stride({ranks, axis}, stride));
}
NodePtr all_to_all(const NodePtr& x, int64_t ranks, int64_t split_axis, int64_t concat_axis, int64_t stride) {
  return make(Op::AllToAll, {x}, with_stride({ranks, split_axis, concat_axis}, stride));
}
NodePtr broadcast(const NodePtr& x, int64_t ranks, int64_t root, int64_t stride) {
  return make(Op::Broadcast, {x}, with_stride({ranks, root}, stride));
}
NodePtr reduce_to_root(const NodePtr& x, int64_t ranks, int64_t root, int64_t stride) {
  return make(Op::Reduce, {x}, with_stride({ranks, root}, stride));
}
NodePtr collective_permute(const NodePtr& x, int64_t ranks, const std::vector<std::pair<int64_t, int64_t>>& pairs, int64_t stride) {
  std::vector<int64_t> k{ranks};
  for (auto [s, d] : pairs) k.insert(k.end(), {s, d});
  return make(Op::CollectivePermute, {x}, with_stride(std::move(k), stride));
}
}  // namespace build

namespace {

using namespace build;
using Grads = std::vector<NodePtr>;

Grads vjp_all_reduce(const Node& n, const NodePtr& self, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  if (c.kind != ReduceKind::Max) return {all_reduce(g, c.ranks, c.kind, c.stride)};
  const NodePtr& x = n.inputs[0];
  NodePtr is_max = binary(Op::Eq, x, self);
  NodePtr ties = all_reduce(cast(is_max, g->dtype), c.ranks, ReduceKind::Sum, c.stride);
  NodePtr total = all_reduce(g, c.ranks, ReduceKind::Sum, c.stride);
  // Where no rank holds the maximum (NaN), `ties` is 0: the gradient is 0 there, not 0/0.
  return {where(is_max, div(total, where(is_max, ties, full_like(ties, 1))), full_like(g, 0))};
}
// Each VJP's collective is over the forward's group (the same sub-group stride).
Grads vjp_all_gather(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  return {reduce_scatter(g, c.ranks, c.axis, c.stride)};
}
Grads vjp_reduce_scatter(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  return {all_gather(g, c.ranks, c.axis, c.stride)};
}
Grads vjp_all_to_all(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  return {all_to_all(g, c.ranks, c.concat_axis, c.axis, c.stride)};
}
Grads vjp_broadcast(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  return {reduce_to_root(g, c.ranks, c.root, c.stride)};
}
Grads vjp_reduce(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  return {broadcast(g, c.ranks, c.root, c.stride)};
}
Grads vjp_permute(const Node& n, const NodePtr&, const NodePtr& g) {
  CollectiveAttrs c = CollectiveAttrs::from(n.op, n.attrs);
  for (auto& [s, d] : c.pairs) std::swap(s, d);
  return {collective_permute(g, c.ranks, c.pairs, c.stride)};
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
