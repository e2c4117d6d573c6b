#include "ir/build.h"

namespace tessera::ir::build {

NodePtr full(double v, const Shape& s, DType t, const Device& d) { return make(Op::Full, {}, Attrs{{}, v}, &s, t, d); }
NodePtr full_like(const NodePtr& n, double v) { return full(v, n->shape, n->dtype, n->device); }
NodePtr cast(const NodePtr& n, DType t) { return n->dtype == t ? n : make(Op::Cast, {n}, {}, nullptr, t); }
NodePtr unary(Op op, const NodePtr& a) { return make(op, {a}); }
NodePtr binary(Op op, const NodePtr& a, const NodePtr& b) { return make(op, {a, b}); }
NodePtr add(const NodePtr& a, const NodePtr& b) { return make(Op::Add, {a, b}); }
NodePtr sub(const NodePtr& a, const NodePtr& b) { return make(Op::Sub, {a, b}); }
NodePtr mul(const NodePtr& a, const NodePtr& b) { return make(Op::Mul, {a, b}); }
NodePtr div(const NodePtr& a, const NodePtr& b) { return make(Op::Div, {a, b}); }
NodePtr neg(const NodePtr& a) { return make(Op::Neg, {a}); }
NodePtr where(const NodePtr& c, const NodePtr& a, const NodePtr& b) { return make(Op::Where, {c, a, b}); }
NodePtr reshape(const NodePtr& n, const Shape& s) { return n->shape == s ? n : make(Op::Reshape, {n}, {}, &s); }
NodePtr expand(const NodePtr& n, const Shape& s) { return n->shape == s ? n : make(Op::Expand, {n}, {}, &s); }
NodePtr permute(const NodePtr& n, const std::vector<int64_t>& perm) { return make(Op::Permute, {n}, Attrs{perm, 0}); }
NodePtr reduce_sum(const NodePtr& n, const std::vector<int64_t>& axes) {
  return axes.empty() ? n : make(Op::ReduceSum, {n}, Attrs{axes, 0});
}
NodePtr reduce_max(const NodePtr& n, const std::vector<int64_t>& axes) {
  return axes.empty() ? n : make(Op::ReduceMax, {n}, Attrs{axes, 0});
}
NodePtr sum_to(const NodePtr& n, const Shape& shape) {
  std::vector<int64_t> axes;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != n->shape[d]) axes.push_back(int64_t(d));
  return reduce_sum(n, axes);
}
NodePtr slice(const NodePtr& n, const std::vector<int64_t>& v) { return make(Op::Slice, {n}, Attrs{v, 0}); }
NodePtr pad(const NodePtr& n, const std::vector<int64_t>& v, double value) { return make(Op::Pad, {n}, Attrs{v, value}); }
NodePtr matmul(const NodePtr& a, const NodePtr& b) { return make(Op::Matmul, {a, b}); }
NodePtr transpose_last2(const NodePtr& n) {
  std::vector<int64_t> p(n->shape.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = int64_t(i);
  std::swap(p[p.size() - 1], p[p.size() - 2]);
  return permute(n, p);
}
NodePtr iota(const Shape& s, int64_t axis, const Device& d) {
  return make(Op::Iota, {}, Attrs{{axis}, 0}, &s, DType::Int64, d);
}
NodePtr gather(const NodePtr& src, int64_t axis, const NodePtr& index) {
  return make(Op::Gather, {src, index}, Attrs{{axis}, 0});
}
NodePtr scatter_add(const NodePtr& base, int64_t axis, const NodePtr& index, const NodePtr& src) {
  return make(Op::ScatterAdd, {base, index, src}, Attrs{{axis}, 0});
}
NodePtr dynamic_update_slice(const NodePtr& base, const NodePtr& update, const NodePtr& offsets) {
  return make(Op::DynamicUpdateSlice, {base, update, offsets});
}

NodePtr reverse(const NodePtr& n, const std::vector<int64_t>& axes) {
  return axes.empty() ? n : make(Op::Reverse, {n}, Attrs{axes, 0});
}
NodePtr conv(const NodePtr& lhs, const NodePtr& rhs, const ConvAttrs& a) { return make(Op::Conv, {lhs, rhs}, a.to_attrs()); }

}  // namespace tessera::ir::build
