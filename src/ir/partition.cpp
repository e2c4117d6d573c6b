// The partitioner (partition.h): sharding propagation, forward through a topologically ordered
// graph, one rule per op category; each node is rebuilt on its inputs' local values with its
// local shape, and collectives are inserted where layouts meet. Partial sums (a contraction or
// a reduction over a split dimension) are all-reduced right where they arise, so no value ever
// carries a "partial" state.
#include "ir/partition.h"

#include <unordered_map>

#include "core/fail.h"
#include "core/scope_impl.h"
#include "ir/build.h"
#include "ir/collectives.h"
#include "ir/graph.h"

namespace tessera::ir {

std::string sharding_str(const Sharding& s, const MeshAxes& mesh) {
  std::string o = "{";
  for (size_t d = 0; d < s.size(); ++d) {
    if (d) o += ", ";
    if (!s[d].sharded()) {
      o += "none";
      continue;
    }
    if (size_t(s[d].axis) < mesh.names.size()) {
      o += mesh.names[size_t(s[d].axis)];
    } else {
      o += "axis";
      o += std::to_string(s[d].axis);
    }
    if (s[d].groups > 1) {
      o += '/';
      o += std::to_string(s[d].groups);
    }
  }
  return o + "}";
}

std::map<std::string, int> count_collectives(const std::vector<NodePtr>& outputs) {
  std::map<std::string, int> c;
  for (const NodePtr& n : build_graph(outputs).nodes)
    if (is_collective(n->op)) c[op_name(n->op)]++;
  return c;
}

namespace {

struct Val {
  NodePtr local;
  Sharding s;
};

bool any_sharded(const Sharding& s) {
  for (const DimSharding& d : s)
    if (d.sharded()) return true;
  return false;
}

const char* kSupported =
    "supported: elementwise ops on agreeing or replicated operands, reductions, reshapes that split or merge a split "
    "dimension evenly, permutes, expands, slices and pads of whole groups, matmuls split on one of batch, rows, columns "
    "or the contraction, gather/scatter_add over split rows";

class Partitioner {
 public:
  Partitioner(const MeshAxes& mesh, const PartitionHooks& hooks) : mesh_(mesh), hooks_(hooks), ranks_(mesh.ranks()) {}

  Val run(const Node& f, const Sharding* leaf_s) {
    ScopeAs in(*f.scope);
    switch (info(f.op).category) {
      case Category::Source:
        if (f.op == Op::Leaf && leaf_s && any_sharded(*leaf_s)) return {hooks_.shard_leaf(f, *leaf_s), *leaf_s};
        return {self(f), Sharding(f.shape.size())};
      case Category::Elementwise: return elementwise(f);
      case Category::Reduce: return reduce(f);
      case Category::Movement: return movement(f);
      case Category::Contraction:
        if (f.op == Op::Matmul) return matmul(f);
        return replicated_only(f, "a convolution takes replicated operands only");
      case Category::Indexing:
        if (f.op == Op::Gather) return gather(f);
        if (f.op == Op::ScatterAdd) return scatter_add(f);
        return replicated_only(f, "this op takes replicated operands only");
      case Category::Collective: refuse(f, "the graph already has collectives (partition a single-device graph)");
    }
    refuse(f, "unknown op");
  }

  std::unordered_map<const Node*, Val> vals;
  NodePtr replicated(const NodePtr& f) {
    ScopeAs in(*f->scope);
    return as(f, Sharding(f->shape.size()));
  }

 private:
  const MeshAxes& mesh_;
  const PartitionHooks& hooks_;
  int64_t ranks_ = 1;  // every rank of the mesh
  std::map<std::pair<const Node*, std::string>, NodePtr> localized_;

  NodePtr self(const Node& f) { return f.shared_from_this(); }
  const Val& val(const NodePtr& n) { return vals.at(n.get()); }
  int64_t size(int axis) const { return mesh_.sizes[size_t(axis)]; }
  int64_t size(const DimSharding& d) const { return size(d.axis); }

  // ---- collectives over one mesh axis ----
  // Where the axis holds every rank they are over the whole communicator; on a mesh of several
  // axes (a data x model grid) over the sub-group of the ranks that differ only along the axis:
  // size(axis) ranks at the stride of the axes after it (CollectiveAttrs::stride), so each rank
  // moves its group's bytes only.
  int64_t stride(int axis) const {
    if (size(axis) == ranks_) return 0;
    int64_t s = 1;
    for (size_t i = size_t(axis) + 1; i < mesh_.sizes.size(); ++i) s *= mesh_.sizes[i];
    return s;
  }
  NodePtr reduce_over(const NodePtr& x, int axis, ReduceKind k) { return build::all_reduce(x, size(axis), k, stride(axis)); }
  NodePtr gather_over(const NodePtr& x, int axis, size_t d) { return build::all_gather(x, size(axis), int64_t(d), stride(axis)); }

  Shape local_shape(const Shape& full, const Sharding& s) const {
    Shape o = full;
    for (size_t d = 0; d < s.size(); ++d)
      if (s[d].sharded()) o[d] /= size(s[d]);
    return o;
  }

  [[noreturn]] void refuse(const Node& f, const std::string& why) {
    std::string m = std::string(op_name(f.op)) + (f.scope->empty() ? std::string(" at the top level") : " in '" + *f.scope + "'") + ": ";
    for (size_t i = 0; i < f.inputs.size(); ++i) {
      const NodePtr& x = f.inputs[i];
      auto it = vals.find(x.get());
      if (i) m += " meets ";
      m += std::string(dtype_name(x->dtype)) + shape_str(x->shape) + " sharded " +
           sharding_str(it == vals.end() ? Sharding(x->shape.size()) : it->second.s, mesh_);
    }
    fail("partition", m + ": " + why + " (" + kSupported + ")", "");
  }

  // f rebuilt on local inputs with a local shape (for the ops that take one) and its attributes.
  NodePtr rebuild(const Node& f, std::vector<NodePtr> ins, const Shape& local, Attrs attrs) {
    const bool takes_shape = f.op == Op::Reshape || f.op == Op::Expand || f.op == Op::Full || f.op == Op::Iota || f.op == Op::Rng;
    NodePtr n = make(f.op, std::move(ins), std::move(attrs), takes_shape ? &local : nullptr, f.dtype, f.device);
    if (n->shape != local)
      fail("partition", std::string("internal: ") + op_name(f.op) + " rebuilt as " + shape_str(n->shape) + ", expected " + shape_str(local), "");
    return n;
  }
  NodePtr rebuild(const Node& f, std::vector<NodePtr> ins, const Shape& local) { return rebuild(f, std::move(ins), local, f.attrs); }

  // ---- changing a value's layout ----
  // x (local, laid out as `from`) all-gathered along dimension d.
  NodePtr gather_dim(NodePtr x, size_t d, const DimSharding& from) {
    x = gather_over(x, from.axis, d);
    if (from.groups > 1) {  // rank-major [N, g, s] -> group-major [g, N, s]
      const Shape full = x->shape;
      const int64_t n = size(from), g = from.groups, s = full[d] / (n * g);
      Shape split(full.begin(), full.begin() + int64_t(d));
      split.insert(split.end(), {n, g, s});
      split.insert(split.end(), full.begin() + int64_t(d) + 1, full.end());
      std::vector<int64_t> perm;
      for (size_t i = 0; i < split.size(); ++i) perm.push_back(int64_t(i));
      std::swap(perm[d], perm[d + 1]);
      x = build::reshape(build::permute(build::reshape(x, split), perm), full);
    }
    return x;
  }

  // The value of full node f laid out as `want` (f's value already partitioned).
  NodePtr as(const NodePtr& f, const Sharding& want) {
    const Val& v = val(f);
    if (v.s == want) return v.local;
    NodePtr x = v.local;
    Sharding cur = v.s;
    for (size_t d = 0; d < cur.size(); ++d)
      if (cur[d].sharded() && cur[d] != want[d]) {
        x = gather_dim(x, d, cur[d]);
        cur[d] = DimSharding{};
      }
    if (cur == want) return x;
    if (!any_sharded(cur)) return localize(*f, x, want);
    return cut(x, cur, want);
  }

  // x (replicated at every dim `want` splits that `cur` does not) cut to its block: a gather of
  // the rank's indices along each such dimension.
  NodePtr cut(NodePtr x, const Sharding& cur, const Sharding& want) {
    for (size_t d = 0; d < want.size(); ++d) {
      if (!want[d].sharded() || cur[d] == want[d]) continue;
      const int64_t extent = x->shape[d];
      NodePtr idx = hooks_.block_index(extent, want[d]);
      Shape unit(x->shape.size(), 1), local = x->shape;
      unit[d] = local[d] = extent / size(want[d]);
      x = build::gather(x, int64_t(d), build::expand(build::reshape(idx, unit), local));
    }
    return x;
  }

  // f's replicated value x cut to `want` without communication: leaves are sliced by the caller,
  // constants made at the local shape, expands and elementwise chains of those rebuilt locally;
  // anything else is cut by a gather of the rank's indices.
  NodePtr localize(const Node& f, const NodePtr& x, const Sharding& want) {
    auto key = std::make_pair(&f, sharding_str(want, mesh_));
    if (auto it = localized_.find(key); it != localized_.end()) return it->second;
    ScopeAs in(*f.scope);
    const Shape local = local_shape(f.shape, want);
    NodePtr r;
    bool iota_ok = f.op == Op::Iota && !want[size_t(f.attrs.ints[0])].sharded();
    if (f.op == Op::Leaf) {
      r = hooks_.shard_leaf(f, want);
    } else if (f.op == Op::Full || iota_ok) {
      r = rebuild(f, {}, local);
    } else if (f.op == Op::Expand) {
      const NodePtr& in0 = f.inputs[0];
      Sharding w = want;
      for (size_t d = 0; d < w.size(); ++d)
        if (in0->shape[d] == 1) w[d] = DimSharding{};
      r = rebuild(f, {as(in0, w)}, local);
    } else if (info(f.op).category == Category::Elementwise && f.op != Op::Rng) {
      std::vector<NodePtr> ins;
      for (const NodePtr& i : f.inputs) ins.push_back(as(i, want));
      r = rebuild(f, std::move(ins), local);
    } else {
      r = cut(x, Sharding(want.size()), want);
    }
    localized_[key] = r;
    return r;
  }

  // ---- rules ----
  // The layout of operands of one shape: per dim, the first operand's split there (an axis
  // taken by an earlier dim is skipped: an axis splits one dim).
  Sharding merge(const std::vector<NodePtr>& ins) {
    Sharding out(ins[0]->shape.size());
    for (const NodePtr& i : ins)
      for (size_t d = 0; d < out.size(); ++d) {
        const DimSharding& x = val(i).s[d];
        if (!x.sharded() || out[d].sharded()) continue;
        bool used = false;
        for (const DimSharding& o : out) used |= o.axis == x.axis;
        if (!used) out[d] = x;
      }
    return out;
  }

  Val elementwise(const Node& f) {
    Sharding out = merge(f.inputs);
    std::vector<NodePtr> ins;
    for (const NodePtr& i : f.inputs) ins.push_back(as(i, out));
    return {rebuild(f, std::move(ins), local_shape(f.shape, out)), out};
  }

  Val reduce(const Node& f) {
    const Sharding& s = val(f.inputs[0]).s;
    Sharding out = s;
    std::vector<int> partial;  // the axes of the split dims reduced
    for (int64_t ax : f.attrs.ints) {
      if (s[size_t(ax)].sharded()) partial.push_back(s[size_t(ax)].axis);
      out[size_t(ax)] = DimSharding{};
    }
    NodePtr r = rebuild(f, {val(f.inputs[0]).local}, local_shape(f.shape, out));
    for (int a : partial) r = reduce_over(r, a, f.op == Op::ReduceMax ? ReduceKind::Max : ReduceKind::Sum);
    return {r, out};
  }

  Val replicated_only(const Node& f, const std::string& why) {
    std::vector<NodePtr> ins;
    for (const NodePtr& i : f.inputs) {
      if (any_sharded(val(i).s)) refuse(f, why);
      ins.push_back(val(i).local);
    }
    return {rebuild(f, std::move(ins), f.shape), Sharding(f.shape.size())};
  }

  Val movement(const Node& f) {
    switch (f.op) {
      case Op::Reshape: return reshape(f);
      case Op::Permute: {
        const Sharding& s = val(f.inputs[0]).s;
        Sharding out;
        for (int64_t p : f.attrs.ints) out.push_back(s[size_t(p)]);
        return {rebuild(f, {val(f.inputs[0]).local}, local_shape(f.shape, out)), out};
      }
      case Op::Expand: {
        const Sharding out = val(f.inputs[0]).s;  // a split dim has extent > 1: never grown
        return {rebuild(f, {val(f.inputs[0]).local}, local_shape(f.shape, out)), out};
      }
      case Op::Slice: return slice_or_pad(f, true);
      case Op::Pad: return slice_or_pad(f, false);
      case Op::Concat: return concat(f);
      case Op::Reverse: {
        for (int64_t ax : f.attrs.ints)
          if (val(f.inputs[0]).s[size_t(ax)].sharded()) refuse(f, "reversing a split dimension is not supported");
        const Sharding out = val(f.inputs[0]).s;
        return {rebuild(f, {val(f.inputs[0]).local}, local_shape(f.shape, out)), out};
      }
      default: return replicated_only(f, "this op takes replicated operands only");
    }
  }

  // Reshape: the input's dims and the output's fall into runs of equal products; a split
  // dimension keeps its split where its run is one input dim split into several (the outermost
  // non-unit one takes it, if it divides) or several merged into one (the merged dim is split,
  // with groups = the product of the dims outside the split one times its groups).
  Val reshape(const Node& f) {
    const Val& v = val(f.inputs[0]);
    const Shape &is = f.inputs[0]->shape, &os = f.shape;
    Sharding out(os.size());
    Sharding need = v.s;  // the input's layout the reshape can take
    size_t i = 0, o = 0;
    while (i < is.size() || o < os.size()) {
      // one run: [i0, i) and [o0, o) with equal products (unit dims join the current run)
      size_t i0 = i, o0 = o;
      int64_t pi = 1, po = 1;
      if (i < is.size()) pi *= is[i++];
      if (o < os.size()) po *= os[o++];
      while (pi != po) {
        if (pi < po && i < is.size()) pi *= is[i++];
        else if (o < os.size()) po *= os[o++];
        else break;
      }
      std::vector<size_t> split_dims;
      for (size_t d = i0; d < i; ++d)
        if (v.s[d].sharded()) split_dims.push_back(d);
      if (split_dims.empty()) continue;
      const size_t d = split_dims[0];
      const int64_t n = size(v.s[d]);
      std::vector<size_t> in_nonunit, out_nonunit;
      for (size_t k = i0; k < i; ++k)
        if (is[k] != 1) in_nonunit.push_back(k);
      for (size_t k = o0; k < o; ++k)
        if (os[k] != 1) out_nonunit.push_back(k);
      bool ok = false;
      if (split_dims.size() > 1) {
        // two axes in one run: gathered below
      } else if (in_nonunit.size() == 1 && !out_nonunit.empty()) {  // one dim split into several
        const size_t od = out_nonunit[0];
        const int64_t g = v.s[d].groups;
        if (out_nonunit.size() == 1) {
          out[od] = v.s[d];
          ok = true;
        } else if (os[od] % (g * n) == 0) {
          out[od] = v.s[d];
          ok = true;
        } else if (os[od] == g && out_nonunit.size() >= 2 && os[out_nonunit[1]] % n == 0) {
          out[out_nonunit[1]] = DimSharding{v.s[d].axis, 1};  // [g groups, ...] -> the groups become their own dim
          ok = true;
        }
      } else if (out_nonunit.size() == 1 && !in_nonunit.empty()) {  // several merged into one
        int64_t outer = 1;
        for (size_t k = i0; k < d; ++k) outer *= is[k];
        out[out_nonunit[0]] = DimSharding{v.s[d].axis, outer * v.s[d].groups};
        ok = true;
      }
      if (!ok)
        for (size_t k = i0; k < i; ++k) need[k] = DimSharding{};  // gathered first: replicated here
    }
    NodePtr x = need == v.s ? v.local : as(f.inputs[0], need);
    return {rebuild(f, {x}, local_shape(os, out)), out};
  }

  Val slice_or_pad(const Node& f, bool slice) {
    const Sharding& s = val(f.inputs[0]).s;
    Sharding need = s, out = s;
    Attrs at = f.attrs;
    const Shape& is = f.inputs[0]->shape;
    for (size_t d = 0; d < s.size(); ++d) {
      if (!s[d].sharded()) continue;
      const int64_t g = s[d].groups, gs = is[d] / g;  // one group's extent
      int64_t &a = at.ints[3 * d], &b = at.ints[3 * d + 1], c = at.ints[3 * d + 2];
      // Whole groups (an empty slice or a zero extent is not: no zero-group layouts).
      bool whole = gs > 0 && (slice ? c == 1 && b > a : c == 0) && a % gs == 0 && b % gs == 0;
      if (!whole) {
        need[d] = out[d] = DimSharding{};
        continue;
      }
      out[d] = DimSharding{s[d].axis, slice ? (b - a) / gs : g + a / gs + b / gs};
      a /= size(s[d]);
      b /= size(s[d]);
    }
    if (need != s) {  // some split dims gathered: slice or pad them as they are
      for (size_t d = 0; d < s.size(); ++d)
        if (s[d].sharded() && !need[d].sharded())
          for (int k = 0; k < 3; ++k) at.ints[3 * d + size_t(k)] = f.attrs.ints[3 * d + size_t(k)];
    }
    return {rebuild(f, {as(f.inputs[0], need)}, local_shape(f.shape, out), at), out};
  }

  Val concat(const Node& f) {
    const size_t ax = size_t(f.attrs.ints[0]);
    Sharding out(f.shape.size());
    bool along = false;
    int64_t gs = 0, groups = 0;
    for (const NodePtr& i : f.inputs)
      if (any_sharded(val(i).s)) {
        out = val(i).s;
        gs = i->shape[ax] / out[ax].groups;
        break;
      }
    if (out[ax].sharded()) {  // every input split along the axis with groups of one size
      along = true;
      for (const NodePtr& i : f.inputs) {
        const DimSharding& d = val(i).s[ax];
        along &= d.sharded() && d.axis == out[ax].axis && i->shape[ax] / d.groups == gs;
        groups += d.sharded() ? d.groups : 0;
      }
      out[ax] = along ? DimSharding{out[ax].axis, groups} : DimSharding{};
    }
    std::vector<NodePtr> ins;
    for (const NodePtr& i : f.inputs) {
      Sharding w = out;
      if (along) w[ax] = val(i).s[ax];
      ins.push_back(as(i, w));
    }
    return {rebuild(f, std::move(ins), local_shape(f.shape, out)), out};
  }

  Val matmul(const Node& f) {
    const NodePtr &a = f.inputs[0], &b = f.inputs[1];
    const Sharding &sa = val(a).s, &sb = val(b).s;
    const size_t r = sa.size();
    Sharding out(r), na = sa, nb = sb;
    for (size_t d = 0; d + 2 < r; ++d) out[d] = sa[d].sharded() ? sa[d] : sb[d];
    const DimSharding m = sa[r - 2], n = sb[r - 1], k = sa[r - 1].sharded() ? sa[r - 1] : sb[r - 2];
    std::vector<int> roles(mesh_.sizes.size(), 0);  // per axis: how many of batch dims, rows, columns, contraction it splits
    for (size_t d = 0; d + 2 < r; ++d)
      if (out[d].sharded()) roles[size_t(out[d].axis)]++;
    for (const DimSharding* x : {&m, &n, &k})
      if (x->sharded()) roles[size_t(x->axis)]++;
    for (int c : roles)
      if (c > 1) refuse(f, "the operands split more than one of batch, rows, columns and the contraction over one mesh axis");
    if (sa[r - 1].sharded() && sb[r - 2].sharded() && sa[r - 1] != sb[r - 2])
      refuse(f, "the contraction dimension is split in two different layouts");
    out[r - 2] = m;
    out[r - 1] = n;
    for (size_t d = 0; d + 2 < r; ++d) na[d] = nb[d] = out[d];
    na[r - 1] = nb[r - 2] = k;
    NodePtr y = rebuild(f, {as(a, na), as(b, nb)}, local_shape(f.shape, out));
    if (k.sharded()) y = reduce_over(y, k.axis, ReduceKind::Sum);  // partial sums over the split contraction
    return {y, out};
  }

  // gather(src, idx) along ax: out[i] = src[i with i_ax := idx[i]]; the output takes the index's
  // layout; src must be whole along ax, and split like the output where their extents agree.
  Val gather(const Node& f) {
    const NodePtr &src = f.inputs[0], &idx = f.inputs[1];
    const size_t ax = size_t(f.attrs.ints[0]);
    Sharding out = val(idx).s;
    if (!any_sharded(out))
      for (size_t d = 0; d < out.size(); ++d)
        if (d != ax && val(src).s[d].sharded() && src->shape[d] == idx->shape[d]) out[d] = val(src).s[d];
    Sharding ns = out;
    ns[ax] = DimSharding{};
    for (size_t d = 0; d < out.size(); ++d)
      if (d != ax && src->shape[d] != idx->shape[d]) {
        if (out[d].sharded()) refuse(f, "an index split along a dimension shorter than the source's");
        ns[d] = DimSharding{};
      }
    return {rebuild(f, {as(src, ns), as(idx, out)}, local_shape(f.shape, out)), out};
  }

  // scatter_add(base, idx, src) along ax: split index rows along ax scatter partial sums (each
  // rank its rows), all-reduced, then added to the base; split elsewhere, a local scatter.
  Val scatter_add(const Node& f) {
    const NodePtr &base = f.inputs[0], &idx = f.inputs[1], &src = f.inputs[2];
    const size_t ax = size_t(f.attrs.ints[0]);
    Sharding s = merge({idx, src});
    Sharding out(f.shape.size());
    for (size_t d = 0; d < s.size(); ++d) {
      if (!s[d].sharded() || d == ax) continue;
      if (base->shape[d] != idx->shape[d]) refuse(f, "an index split along a dimension shorter than the base's");
      out[d] = s[d];
    }
    const bool partial = s[ax].sharded();
    NodePtr i = as(idx, s), x = as(src, s);
    const Shape local = local_shape(f.shape, out);
    if (!partial) return {rebuild(f, {as(base, out), i, x}, local), out};
    NodePtr zero = build::full(0, local, f.dtype, f.device);
    NodePtr y = reduce_over(rebuild(f, {zero, i, x}, local), s[ax].axis, ReduceKind::Sum);
    const bool zero_base = base->op == Op::Full && base->attrs.f == 0;
    if (!zero_base) y = build::add(as(base, out), y);
    return {y, out};
  }
};

}  // namespace

Partitioned partition(const std::vector<NodePtr>& outputs, const std::function<const Sharding*(const Node& leaf)>& leaf_sharding,
                      const MeshAxes& mesh, const PartitionHooks& hooks, bool gather_outputs) {
  const int64_t n = mesh.ranks();
  Partitioner p(mesh, hooks);
  const Graph g = build_graph(outputs);
  for (const NodePtr& node : g.nodes) {
    const Sharding* s = node->op == Op::Leaf ? leaf_sharding(*node) : nullptr;
    if (s && s->size() != node->shape.size())
      fail("partition", "a sharding of " + std::to_string(s->size()) + " dims for a leaf " + dtype_name(node->dtype) + shape_str(node->shape), "");
    Sharding norm;
    if (s) {  // axes of one rank are replicated
      norm = *s;
      for (DimSharding& d : norm)
        if (d.sharded() && mesh.sizes.at(size_t(d.axis)) == 1) d = DimSharding{};
    }
    p.vals[node.get()] = n > 1 ? p.run(*node, s ? &norm : nullptr) : Val{node, Sharding(node->shape.size())};
  }
  Partitioned r;
  r.ranks = n;
  for (const NodePtr& o : outputs) {
    const bool keep = n == 1 || !gather_outputs;
    r.outputs.push_back(keep ? p.vals.at(o.get()).local : p.replicated(o));
    r.shardings.push_back(keep ? p.vals.at(o.get()).s : Sharding(o->shape.size()));
  }
  return r;
}

}  // namespace tessera::ir
