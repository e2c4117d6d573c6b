// Small builders over ir::make for code that writes IR directly (VJP rules, decompositions).
// Operands must already agree in shape and dtype, as the primitives require.
#pragma once
#include "ir/conv.h"
#include "ir/node.h"

namespace tessera::ir::build {

NodePtr full(double v, const Shape& s, DType t, const Device& d);
NodePtr full_like(const NodePtr& n, double v);
NodePtr cast(const NodePtr& n, DType t);
NodePtr unary(Op op, const NodePtr& a);
NodePtr binary(Op op, const NodePtr& a, const NodePtr& b);
NodePtr add(const NodePtr& a, const NodePtr& b);
NodePtr sub(const NodePtr& a, const NodePtr& b);
NodePtr mul(const NodePtr& a, const NodePtr& b);
NodePtr div(const NodePtr& a, const NodePtr& b);
NodePtr neg(const NodePtr& a);
NodePtr where(const NodePtr& c, const NodePtr& a, const NodePtr& b);
NodePtr reshape(const NodePtr& n, const Shape& s);
NodePtr expand(const NodePtr& n, const Shape& s);  // same rank
NodePtr permute(const NodePtr& n, const std::vector<int64_t>& perm);
NodePtr reduce_sum(const NodePtr& n, const std::vector<int64_t>& axes);  // keeps dims
NodePtr reduce_max(const NodePtr& n, const std::vector<int64_t>& axes);  // keeps dims
// Sums n down to `shape` (same rank, each dim equal or 1): the VJP of an expand.
NodePtr sum_to(const NodePtr& n, const Shape& shape);
NodePtr slice(const NodePtr& n, const std::vector<int64_t>& start_stop_step);
NodePtr pad(const NodePtr& n, const std::vector<int64_t>& lo_hi_interior, double value = 0);
NodePtr matmul(const NodePtr& a, const NodePtr& b);
NodePtr transpose_last2(const NodePtr& n);
NodePtr iota(const Shape& s, int64_t axis, const Device& d);
NodePtr gather(const NodePtr& src, int64_t axis, const NodePtr& index);
NodePtr scatter_add(const NodePtr& base, int64_t axis, const NodePtr& index, const NodePtr& src);
NodePtr dynamic_update_slice(const NodePtr& base, const NodePtr& update, const NodePtr& offsets);
NodePtr reverse(const NodePtr& n, const std::vector<int64_t>& axes);  // sorted axes
NodePtr conv(const NodePtr& lhs, const NodePtr& rhs, const ConvAttrs& a);

}  // namespace tessera::ir::build
