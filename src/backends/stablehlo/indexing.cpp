// StableHLO lowerings of gather, scatter-add and dynamic_update_slice (lower.h). Tessera's
// gather/scatter index one axis elementwise (out[i] = src[i with i_axis := index[i]]); StableHLO
// gathers whole index vectors, so each element's full index is built from iotas and the index.
// XLA clamps (gather) or drops (scatter) out-of-range indices where Tessera raises: each op adds
// a check value, {lowest out-of-range position or -1, the index there}, to @main's results.
#include <limits>

#include "backends/stablehlo/lower.h"
#include "core/fail.h"

namespace tessera::stablehlo {
namespace {

using ir::Op;

// index (shape I, rank r) -> I + [r]: position i holds i with i_axis := index[i].
V full_indices(Writer& w, const V& idx, int64_t axis) {
  Shape s = idx.shape;
  const int64_t r = int64_t(s.size());
  s.push_back(1);
  std::vector<V> parts;
  for (int64_t d = 0; d < r; ++d) parts.push_back(d == axis ? w.reshape(idx, s) : w.iota(s, d, "i64"));
  return w.concat(parts, r);
}

// {lowest row-major position of idx outside [0, extent), or -1; the index value there}.
V check_value(Writer& w, const V& idx, int64_t extent) {
  const int64_t n = numel(idx.shape);
  if (n == 0) return w.op("stablehlo.constant", {}, {2}, "i64", "value = dense<[-1, 0]> : tensor<2xi64>");
  const Shape flat{n};
  V v = w.reshape(idx, flat);
  V bad = w.binary("stablehlo.or", w.compare("LT", v, w.constant(0, flat, "i64")),
                   w.compare("GE", v, w.constant(double(extent), flat, "i64")));
  const double none = double(std::numeric_limits<int64_t>::max());
  V cand = w.select(bad, w.iota(flat, 0, "i64"), w.constant(none, flat, "i64"));
  V pos = w.reduce(cand, w.constant(none, {}, "i64"), {0}, "stablehlo.minimum");
  V at = w.op("stablehlo.dynamic_slice", {v, pos}, {1}, "i64", "slice_sizes = array<i64: 1>");  // clamped when none
  V found = w.compare("NE", pos, w.constant(none, {}, "i64"));
  V p = w.reshape(w.select(found, pos, w.constant(-1, {}, "i64")), {1});
  return w.concat({p, at}, 0);
}

std::string dims_all(int64_t r) { return int_list(iota_vec(r)); }

V lower_gather(Lowering& L, const ir::Node& n, const V& src, const V& idx) {
  Writer& w = L.w;
  const int64_t r = int64_t(n.shape.size()), axis = n.attrs.ints.at(0);
  V full = full_indices(w, idx, axis);
  std::string attrs = "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = " + dims_all(r) +
                      ", start_index_map = " + dims_all(r) + ", index_vector_dim = " + std::to_string(r) +
                      ">, indices_are_sorted = false, slice_sizes = " + i64_array(std::vector<int64_t>(size_t(r), 1));
  return w.op("stablehlo.gather", {src, full}, n.shape, src.elem, attrs);
}

V lower_scatter_add(Lowering& L, const ir::Node& n, const V& base, const V& idx, const V& upd) {
  Writer& w = L.w;
  const int64_t r = int64_t(n.shape.size()), axis = n.attrs.ints.at(0);
  V full = full_indices(w, idx, axis);
  V cb = compute(w, base), cu = compute(w, upd);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = " + dims_all(r) +
                      ", scatter_dims_to_operand_dims = " + dims_all(r) + ", index_vector_dim = " + std::to_string(r) +
                      ">, indices_are_sorted = false, unique_indices = false";
  V out = w.op("stablehlo.scatter", {cb, full, cu}, n.shape, cb.elem, attrs, w.binary_region("stablehlo.add", cb.elem));
  return w.convert(out, base.elem);
}

V lower_dus(Writer& w, const V& base, const V& upd, const V& offsets) {
  std::vector<V> args{base, upd};
  for (size_t d = 0; d < base.shape.size(); ++d) args.push_back(w.element(offsets, int64_t(d)));
  return w.op("stablehlo.dynamic_update_slice", args, base.shape, base.elem);  // clamps like Tessera
}

}  // namespace

V lower_indexing(Lowering& L, const ir::Node& n, const std::vector<V>& in) {
  Writer& w = L.w;
  if (n.op == Op::DynamicUpdateSlice) return lower_dus(w, in[0], in[1], in[2]);
  if (n.op != Op::Gather && n.op != Op::ScatterAdd) fail("stablehlo", std::string("no lowering for ") + ir::op_name(n.op));
  const int64_t axis = n.attrs.ints.at(0);
  const ir::Node& target = *n.inputs[0];
  V idx = w.convert(in[1], "i64");
  IndexCheck c{ir::op_name(n.op), *n.scope, shape_str(target.shape), axis, target.shape[size_t(axis)]};
  L.checks.emplace_back(c, check_value(w, idx, c.extent));
  return n.op == Op::Gather ? lower_gather(L, n, in[0], idx) : lower_scatter_add(L, n, in[0], idx, in[2]);
}

}  // namespace tessera::stablehlo
