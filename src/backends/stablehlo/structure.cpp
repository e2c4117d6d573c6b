// StableHLO lowerings of movement ops, matmul and convolution (lower.h).
#include "backends/stablehlo/lower.h"

#include <array>

#include "core/fail.h"
#include "ir/conv.h"

namespace tessera::stablehlo {
namespace {

using ir::Op;

// Slice and pad attributes: three ints per dimension, as three lists (start/limit/step, low/high/interior).
std::array<std::vector<int64_t>, 3> per_dim_triples(const ir::Node& n) {
  std::array<std::vector<int64_t>, 3> t;
  for (size_t d = 0; d < n.shape.size(); ++d)
    for (size_t k = 0; k < 3; ++k) t[k].push_back(n.attrs.ints[3 * d + k]);
  return t;
}

V lower_slice(Writer& w, const ir::Node& n, const V& x) {
  auto [start, limit, step] = per_dim_triples(n);
  return w.slice(x, start, limit, step);
}

V lower_pad(Writer& w, const ir::Node& n, const V& x) {
  auto [lo, hi, interior] = per_dim_triples(n);
  V value = w.constant(n.attrs.f, {}, x.elem);
  return w.op("stablehlo.pad", {x, value}, n.shape, x.elem,
              "edge_padding_low = " + i64_array(lo) + ", edge_padding_high = " + i64_array(hi) +
                  ", interior_padding = " + i64_array(interior));
}

// [..., M, K] x [..., K, N]: the leading dims are batch dims of a dot_general.
V lower_matmul(Writer& w, const ir::Node& n, const V& a, const V& b) {
  int64_t r = int64_t(n.shape.size());
  std::vector<int64_t> batch = iota_vec(r - 2);
  std::string dims = "#stablehlo.dot<";
  if (!batch.empty()) dims += "lhs_batching_dimensions = " + int_list(batch) + ", rhs_batching_dimensions = " + int_list(batch) + ", ";
  dims += "lhs_contracting_dimensions = [" + std::to_string(r - 1) + "], rhs_contracting_dimensions = [" +
          std::to_string(r - 2) + "]>";
  return w.op("stablehlo.dot_general", {a, b}, n.shape, elem_of(n.dtype), "dot_dimension_numbers = " + dims);
}

// Op::Conv's layout is StableHLO's [b, f, spatial...] x [o, i, spatial...] -> [b, f, spatial...].
V lower_conv(Writer& w, const ir::Node& n, const V& x, const V& k) {
  ir::ConvAttrs c = ir::ConvAttrs::from(n.attrs);
  std::string sp, pad;
  std::vector<int64_t> stride, lhs_dil, rhs_dil;
  for (size_t d = 0; d < c.axes.size(); ++d) {
    const ir::ConvAxis& a = c.axes[d];
    sp += ", " + std::to_string(d);
    pad += std::string(d ? ", " : "") + "[" + std::to_string(a.lo) + ", " + std::to_string(a.hi) + "]";
    stride.push_back(a.stride);
    lhs_dil.push_back(a.lhs_dilation);
    rhs_dil.push_back(a.rhs_dilation);
  }
  std::string attrs = "dimension_numbers = #stablehlo.conv<[b, f" + sp + "]x[o, i" + sp + "]->[b, f" + sp + "]>";
  attrs += ", window_strides = " + i64_array(stride) + ", padding = dense<[" + pad + "]> : tensor<" +
           std::to_string(c.axes.size()) + "x2xi64>";
  attrs += ", lhs_dilation = " + i64_array(lhs_dil) + ", rhs_dilation = " + i64_array(rhs_dil);
  attrs += ", feature_group_count = " + std::to_string(c.groups) + " : i64, batch_group_count = 1 : i64";
  return w.op("stablehlo.convolution", {x, k}, n.shape, elem_of(n.dtype), attrs);
}

}  // namespace

V lower_structure(Lowering& L, const ir::Node& n, const std::vector<V>& in) {
  Writer& w = L.w;
  const auto& ints = n.attrs.ints;
  switch (n.op) {
    case Op::Reshape: return w.reshape(in[0], n.shape);
    case Op::Permute: return w.op("stablehlo.transpose", {in[0]}, n.shape, in[0].elem, "permutation = " + i64_array(ints));
    case Op::Expand: return w.broadcast(in[0], n.shape, iota_vec(int64_t(n.shape.size())));
    case Op::Slice: return lower_slice(w, n, in[0]);
    case Op::Pad: return lower_pad(w, n, in[0]);
    case Op::Concat: return w.concat(in, ints.at(0));
    case Op::Reverse:
      if (ints.empty()) return in[0];
      return w.op("stablehlo.reverse", {in[0]}, n.shape, in[0].elem, "dimensions = " + i64_array(ints));
    case Op::Matmul: return lower_matmul(w, n, in[0], in[1]);
    case Op::Conv: return lower_conv(w, n, in[0], in[1]);
    default: break;
  }
  fail("stablehlo", std::string("no lowering for ") + ir::op_name(n.op));
}

}  // namespace tessera::stablehlo
