// The float64 reference's collectives: one node evaluated for every rank at once, from every
// rank's input (ir/collectives.h gives the semantics). Plain loops, shared with no backend.
#include <cmath>
#include <limits>
#include <string>

#include "core/fail.h"
#include "ir/collectives.h"
#include "reference/evaluator.h"

namespace tessera::reference {

using ir::Op;

namespace {

// One group's collective: x holds the group's ranks, in group order.
std::vector<Value> evaluate_group(const ir::Node& n, const ir::CollectiveAttrs& c, const std::vector<const Value*>& x) {
  const int64_t N = int64_t(x.size());
  const Shape& xs = x[0]->shape;
  const int64_t total = numel(n.shape), in_total = numel(xs);
  std::vector<Value> out(size_t(N), Value{n.shape, n.dtype, std::vector<double>(size_t(total), 0.0)});
  Index idx;
  switch (n.op) {
    case Op::AllReduce: {
      for (int64_t i = 0; i < total; ++i) {
        double acc = x[0]->data[size_t(i)];
        for (int64_t s = 1; s < N; ++s) {
          double v = x[size_t(s)]->data[size_t(i)];
          if (c.kind == ir::ReduceKind::Max)
            acc = std::isnan(acc) || std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : std::max(acc, v);
          else
            acc += v;
        }
        if (c.kind == ir::ReduceKind::Mean) acc /= double(N);
        for (auto& o : out) o.data[size_t(i)] = acc;
      }
      break;
    }
    case Op::AllGather: {
      const int64_t m = xs[size_t(c.axis)];
      for (int64_t i = 0; i < total; ++i) {
        unravel(i, n.shape, idx);
        int64_t s = idx[size_t(c.axis)] / m;
        idx[size_t(c.axis)] %= m;
        double v = x[size_t(s)]->data[size_t(ravel(idx, xs))];
        for (auto& o : out) o.data[size_t(i)] = v;
      }
      break;
    }
    case Op::ReduceScatter: {
      const int64_t m = n.shape[size_t(c.axis)];
      for (int64_t r = 0; r < N; ++r)
        for (int64_t i = 0; i < total; ++i) {
          unravel(i, n.shape, idx);
          idx[size_t(c.axis)] += r * m;
          int64_t j = ravel(idx, xs);
          double acc = 0;
          for (int64_t s = 0; s < N; ++s) acc += x[size_t(s)]->data[size_t(j)];
          out[size_t(r)].data[size_t(i)] = acc;
        }
      break;
    }
    case Op::AllToAll: {
      const size_t a = size_t(c.axis), cc = size_t(c.concat_axis);
      const int64_t m = xs[a] / N;  // the block each rank receives along the split axis
      for (int64_t r = 0; r < N; ++r)
        for (int64_t i = 0; i < total; ++i) {
          unravel(i, n.shape, idx);
          int64_t s;
          if (a != cc) {
            s = idx[cc] / xs[cc];
            idx[cc] %= xs[cc];
            idx[a] += r * m;
          } else {
            s = idx[a] / m;
            idx[a] = r * m + idx[a] % m;
          }
          out[size_t(r)].data[size_t(i)] = x[size_t(s)]->data[size_t(ravel(idx, xs))];
        }
      break;
    }
    case Op::Broadcast:
      for (auto& o : out) o.data = x[size_t(c.root)]->data;
      break;
    case Op::Reduce:
      for (int64_t i = 0; i < in_total; ++i) {
        double acc = 0;
        for (int64_t s = 0; s < N; ++s) acc += x[size_t(s)]->data[size_t(i)];
        out[size_t(c.root)].data[size_t(i)] = acc;
      }
      break;
    case Op::CollectivePermute:
      for (int64_t r = 0; r < N; ++r)
        if (int64_t s = c.source_of(r); s >= 0) out[size_t(r)].data = x[size_t(s)]->data;
      break;
    default: fail("reference", std::string("not a collective: ") + ir::op_name(n.op));
  }
  return out;
}

}  // namespace

std::vector<Value> evaluate_collective(const ir::Node& n, const std::vector<const Value*>& x) {
  const ir::CollectiveAttrs c = ir::CollectiveAttrs::from(n.op, n.attrs);
  const int64_t N = int64_t(x.size());
  if (c.stride == 0) {
    if (c.ranks != N)
      fail(ir::op_name(n.op), "the graph is for " + std::to_string(c.ranks) + " ranks but runs on " + std::to_string(N), *n.scope);
    return evaluate_group(n, c, x);
  }
  // Sub-groups: each group evaluated on its members' inputs (every rank in exactly one group).
  std::vector<Value> out(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) {
    const std::vector<int64_t> m = c.group_of(r, N, ir::op_name(n.op));
    if (m[0] != r) continue;  // the group's first member evaluates it
    std::vector<const Value*> xs;
    for (int64_t s : m) xs.push_back(x[size_t(s)]);
    std::vector<Value> got = evaluate_group(n, c, xs);
    for (size_t i = 0; i < m.size(); ++i) out[size_t(m[i])] = std::move(got[i]);
  }
  return out;
}

}  // namespace tessera::reference
