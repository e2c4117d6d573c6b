// StableHLO lowerings of the collectives (lower.h; semantics in ir/primitives.h and
// docs/architecture.md "Parallelism"). A graph is one rank's program; as StableHLO it is one
// replica's, compiled for the module's replicas (mhlo.num_replicas, emit.cpp); replica r is
// Tessera's rank r. A collective over every rank has the one replica group {0, ..., ranks-1}; one
// over sub-groups (CollectiveAttrs::stride > 0) lists every group of the world, each in its group
// order (ir::CollectiveAttrs::group_of), so the ops below need nothing more: a root and a
// permute's pairs, which are positions in a group, become each group's replicas.
// - all_reduce sum / max: stablehlo.all_reduce with an add / maximum region (bool max: or); max's
//   NaN (the reference propagates it, XLA's CPU maximum drops it, and XLA's CPU plugin refuses a
//   region selecting it) is a second all_reduce of "is NaN" flags selecting NaN;
//   mean is the sum divided by the rank count. float16/bfloat16 reduce in float32 and round once
//   at the end, as the reference does (the in-process communicator rounds per add).
// - all_gather, reduce_scatter (add region), all_to_all (split_count = ranks): one op each, with
//   the same block order as Tessera's (rank-major along the axis).
// - collective_permute: stablehlo.collective_permute with the pairs as source_target_pairs (a
//   replica nobody sends to gets zeros in both); no pairs at all is zeros.
// - broadcast (y_r = x_root): an all_reduce sum of x on the root and zeros elsewhere, summed as
//   integers of the element's width (bitcast), so the root's bits arrive exactly (-0.0, NaN
//   payloads included) whatever the dtype.
// - reduce (sum to the root, zeros elsewhere): the all_reduce sum, kept on the root only.
// - a zero-size result is an empty constant (no exchange).
#include "backends/stablehlo/lower.h"

#include <cmath>
#include <vector>

#include "core/fail.h"
#include "ir/collectives.h"

namespace tessera::stablehlo {
namespace {

using ir::Op;

// Every group of the `world` replicas, each in group order.
std::vector<std::vector<int64_t>> groups_of(const ir::CollectiveAttrs& c, int64_t world, const char* op) {
  std::vector<std::vector<int64_t>> groups;
  for (int64_t r = 0; r < world; ++r)
    if (std::vector<int64_t> m = c.group_of(r, world, op); m[0] == r) groups.push_back(std::move(m));
  return groups;
}

std::string replica_groups(const std::vector<std::vector<int64_t>>& groups) {
  std::string g = "replica_groups = dense<[";
  for (size_t k = 0; k < groups.size(); ++k) {
    g += k ? ", [" : "[";
    for (size_t i = 0; i < groups[k].size(); ++i) g += (i ? ", " : "") + std::to_string(groups[k][i]);
    g += "]";
  }
  return g + "]> : tensor<" + std::to_string(groups.size()) + "x" + std::to_string(groups[0].size()) + "xi64>";
}

// A reduction region over scalars of `elem`: add, or maximum (or for bool). XLA's CPU plugin
// takes only plain regions (one add / maximum / ...: "Unsupported reduction computation" for a
// region selecting NaN), so max's NaN is a second all_reduce (all_reduce_max).
std::string reduction_region(Writer& w, const std::string& elem, bool max) {
  if (!max) return w.binary_region("stablehlo.add", elem);
  return w.binary_region(elem == "i1" ? "stablehlo.or" : "stablehlo.maximum", elem);
}

V all_reduce(Writer& w, const V& x, const std::string& groups, bool max) {
  return w.op("stablehlo.all_reduce", {x}, x.shape, x.elem, groups, reduction_region(w, x.elem, max));
}

// The maximum over the ranks, NaN wherever any rank holds one (the reference's rule; XLA's CPU
// maximum drops NaN): the plain maximum, and a maximum of "is NaN" flags (as int32) selecting NaN.
V all_reduce_max(Writer& w, const V& x, const std::string& groups) {
  V m = all_reduce(w, x, groups, true);
  if (x.elem[0] != 'f' && x.elem != "bf16") return m;
  V flag = w.convert(w.compare("NE", x, x), "i32");
  V any = all_reduce(w, flag, groups, true);
  return w.select(w.compare("NE", any, w.constant(0, any.shape, "i32")), w.constant(std::nan(""), x.shape, x.elem), m);
}

// Whether this replica is its group's `root` (a position in the group), as an i1 tensor of
// `shape`: replica id r is at position (r / stride) % ranks of its group (r with every rank).
V is_root(Writer& w, const ir::CollectiveAttrs& c, const Shape& shape) {
  V pos = w.op("stablehlo.replica_id", {}, {}, "ui32");
  if (c.stride > 0) {
    if (c.stride > 1) pos = w.binary("stablehlo.divide", pos, w.constant(double(c.stride), {}, "ui32"));
    pos = w.binary("stablehlo.remainder", pos, w.constant(double(c.ranks), {}, "ui32"));
  }
  return w.splat(w.compare("EQ", pos, w.constant(double(c.root), {}, "ui32")), shape);
}

// The integer type of x's element width (bool as i32: XLA has no i1 addition).
std::string bits_of(const std::string& elem) {
  if (elem == "f64" || elem == "i64") return "i64";
  if (elem == "f32" || elem == "i32" || elem == "i1") return "i32";
  return "i16";  // f16, bf16
}

V lower_broadcast(Writer& w, const V& x, const ir::CollectiveAttrs& c, const std::string& groups) {
  const std::string ie = bits_of(x.elem);
  V bits = x.elem == "i1" ? w.convert(x, ie) : x.elem == ie ? x : w.op("stablehlo.bitcast_convert", {x}, x.shape, ie);
  V masked = w.select(is_root(w, c, x.shape), bits, w.constant(0, x.shape, ie));
  V sum = all_reduce(w, masked, groups, false);
  if (x.elem == "i1") return w.compare("NE", sum, w.constant(0, x.shape, ie));
  return x.elem == ie ? sum : w.op("stablehlo.bitcast_convert", {sum}, x.shape, x.elem);
}

}  // namespace

V lower_collective(Lowering& L, const ir::Node& n, const std::vector<V>& in) {
  Writer& w = L.w;
  const V& x = in[0];
  const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(n.op, n.attrs);
  const std::vector<std::vector<int64_t>> members = groups_of(c, L.replicas, ir::op_name(n.op));
  const std::string groups = replica_groups(members);
  // Zero elements in, zero out: nothing to exchange (StableHLO refuses an all_gather along an
  // axis of extent 0).
  if (numel(n.shape) == 0) return w.constant(0, n.shape, elem_of(n.dtype));
  switch (n.op) {
    case Op::AllReduce: {
      V v = compute(w, x);
      V r = c.kind == ir::ReduceKind::Max ? all_reduce_max(w, v, groups) : all_reduce(w, v, groups, false);
      if (c.kind == ir::ReduceKind::Mean) r = w.binary("stablehlo.divide", r, w.constant(double(c.ranks), r.shape, r.elem));
      return r.elem == x.elem ? r : cast(w, r, DType::Float32, n.dtype);
    }
    case Op::AllGather:
      return w.op("stablehlo.all_gather", {x}, n.shape, x.elem, "all_gather_dim = " + std::to_string(c.axis) + " : i64, " + groups);
    case Op::ReduceScatter: {
      V v = compute(w, x);
      V r = w.op("stablehlo.reduce_scatter", {v}, n.shape, v.elem, "scatter_dimension = " + std::to_string(c.axis) + " : i64, " + groups,
                 reduction_region(w, v.elem, false));
      return r.elem == x.elem ? r : cast(w, r, DType::Float32, n.dtype);
    }
    case Op::AllToAll:
      return w.op("stablehlo.all_to_all", {x}, n.shape, x.elem,
                  "split_dimension = " + std::to_string(c.axis) + " : i64, concat_dimension = " + std::to_string(c.concat_axis) +
                      " : i64, split_count = " + std::to_string(c.ranks) + " : i64, " + groups);
    case Op::Broadcast: return lower_broadcast(w, x, c, groups);
    case Op::Reduce: {
      V v = compute(w, x);
      V r = all_reduce(w, v, groups, false);
      r = w.select(is_root(w, c, r.shape), r, w.constant(0, r.shape, r.elem));
      return r.elem == x.elem ? r : cast(w, r, DType::Float32, n.dtype);
    }
    case Op::CollectivePermute: {
      if (c.pairs.empty()) return w.constant(0, x.shape, x.elem);
      std::string p;  // each group's pairs, as replicas
      for (const std::vector<int64_t>& m : members)
        for (auto [from, to] : c.pairs)
          p += (p.empty() ? "[" : ", [") + std::to_string(m[size_t(from)]) + ", " + std::to_string(m[size_t(to)]) + "]";
      return w.op("stablehlo.collective_permute", {x}, x.shape, x.elem,
                  "source_target_pairs = dense<[" + p + "]> : tensor<" + std::to_string(c.pairs.size() * members.size()) + "x2xi64>");
    }
    default: break;
  }
  fail("stablehlo", std::string("no lowering for ") + ir::op_name(n.op));
}

}  // namespace tessera::stablehlo
