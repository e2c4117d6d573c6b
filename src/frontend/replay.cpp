// Recording a trace and replaying it on new arguments (include/tessera/replay.h). In the frontend
// layer: whether gradients would be recorded (grad mode, requires_grad) is the frontend's.
#include "tessera/replay.h"

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "ir/remake.h"
#include "tessera/error.h"
#include "tensor/tensor_impl.h"

namespace tessera {

namespace detail {
std::atomic<uint64_t>& realize_epoch();  // tensor.cpp: counts TensorImpl::realize_to
}

// What a replay rebuilds. Values are numbered: the arguments first, then the constants (realized
// tensors the trace read that are not arguments, kept by their leaf nodes), then the recorded
// nodes in topological order. Recorded nodes hold no node pointers, so the arguments' buffers at
// recording time are not kept alive (an optimizer can still donate them).
struct Replay::Impl {
  struct Arg {
    Shape shape;
    DType dtype;
    Device device;
  };
  struct Rec {
    ir::Op op;
    ir::Attrs attrs;
    Shape shape;
    DType dtype;
    Device device;
    const std::string* scope;
    std::vector<int> in;
  };
  struct Out {
    enum Kind { ArgHandle, Value, SameAs } kind;
    int index;  // the argument, the value, or the earlier output
    bool is_view;
  };
  std::vector<Arg> args;
  std::vector<ir::NodePtr> consts;
  std::vector<Rec> recs;
  // Per recorded node: the node itself where it depends on constants only (scalars broadcast, a
  // mask from iotas): kept alive, so every replay gets this same node, as interning gives tracing.
  std::vector<ir::NodePtr> fixed;
  std::vector<Out> outs;
  std::vector<int> order;  // outputs' impls are made in the order tracing made them pending
};

uint64_t Replay::epoch() { return detail::realize_epoch().load(std::memory_order_relaxed); }

size_t Replay::nodes() const { return impl_->recs.size(); }

std::shared_ptr<const Replay> Replay::record(const std::vector<Tensor>& args, const std::vector<Tensor>& outputs, uint64_t since) {
  if (epoch() != since) return nullptr;
  bool grad = grad_enabled();
  for (const Tensor& a : args)
    if (!a.defined() || (grad && a.requires_grad())) return nullptr;
  auto impl = std::make_shared<Impl>();
  std::unordered_map<const ir::Node*, int> index;  // node -> value number
  std::vector<ir::NodePtr> arg_nodes;
  try {
    for (const Tensor& a : args) {
      impl->args.push_back({a.shape(), a.dtype(), a.device()});
      arg_nodes.push_back(detail::node_of(a));
    }
  } catch (const Error&) {  // an argument the trace did not read has failed: trace every call
    return nullptr;
  }
  // Two arguments with one value (one tensor passed twice): the trace cannot tell which one each
  // use read, so a replay on different tensors could take the wrong one.
  for (size_t k = 0; k < arg_nodes.size(); ++k)
    if (!index.emplace(arg_nodes[k].get(), int(k)).second) return nullptr;
  // Constants and recorded nodes get their final numbers once the constants are all known.
  std::vector<const ir::Node*> consts, recs;
  std::unordered_map<const ir::Node*, int> local;  // node -> -(const + 1) or rec index
  auto ref_of = [&](const ir::Node* n) -> std::pair<int, int> {  // (kind 0 arg / 1 const / 2 rec, index)
    if (auto it = index.find(n); it != index.end()) return {0, it->second};
    int v = local.at(n);
    return v < 0 ? std::pair{1, -v - 1} : std::pair{2, v};
  };
  // Iterative post-order walk from the outputs' nodes, stopping at arguments and leaves.
  bool ok = true;
  auto visit = [&](const ir::Node* root) {
    std::vector<std::pair<const ir::Node*, size_t>> stack{{root, 0}};
    while (!stack.empty() && ok) {
      auto& [n, next] = stack.back();
      if (next == 0 && (index.count(n) || local.count(n))) {
        stack.pop_back();
        continue;
      }
      if (n->op == ir::Op::Leaf) {
        local[n] = -int(consts.size()) - 1;
        consts.push_back(n);
        stack.pop_back();
        continue;
      }
      if (n->op == ir::Op::Rng) {  // draw numbers follow the trace order since the last sync
        ok = false;
        break;
      }
      if (next < n->inputs.size()) {
        const ir::Node* in = n->inputs[next++].get();
        if (!index.count(in) && !local.count(in)) stack.push_back({in, 0});
        continue;
      }
      local[n] = int(recs.size());
      recs.push_back(n);
      stack.pop_back();
    }
  };
  std::vector<std::shared_ptr<TensorImpl>> out_impls;
  for (size_t k = 0; k < outputs.size() && ok; ++k) {
    const Tensor& t = outputs[k];
    if (!t.defined() || t.requires_grad()) return nullptr;
    const auto& oi = detail::impl_of(t);
    out_impls.push_back(oi);
    Impl::Out o{Impl::Out::Value, -1, oi->is_view};
    for (size_t a = 0; a < args.size() && o.index < 0; ++a)
      if (t.is_same(args[a])) o = {Impl::Out::ArgHandle, int(a), false};
    for (size_t j = 0; j < k && o.index < 0; ++j)
      if (t.is_same(outputs[j])) o = {Impl::Out::SameAs, int(j), false};
    if (o.index < 0) {
      ir::NodePtr n = oi->node;  // a pending value whose node the trace made
      if (!n || n->op == ir::Op::Leaf || index.count(n.get())) return nullptr;
      visit(n.get());
      if (!ok) return nullptr;
      o.index = local.at(n.get());  // a recorded node's number; offset below
      impl->outs.push_back(o);
      continue;
    }
    impl->outs.push_back(o);
  }
  if (!ok) return nullptr;
  const int nargs = int(args.size()), nconst = int(consts.size());
  for (const ir::Node* c : consts) impl->consts.push_back(c->shared_from_this());
  for (const ir::Node* n : recs) {
    Impl::Rec r{n->op, n->attrs, n->shape, n->dtype, n->device, n->scope, {}};
    bool fixed = true;
    for (const auto& in : n->inputs) {
      auto [kind, i] = ref_of(in.get());
      r.in.push_back(kind == 0 ? i : kind == 1 ? nargs + i : nargs + nconst + i);
      fixed = fixed && (kind == 1 || (kind == 2 && impl->fixed[size_t(i)]));
    }
    impl->fixed.push_back(fixed ? n->shared_from_this() : nullptr);
    impl->recs.push_back(std::move(r));
  }
  for (auto& o : impl->outs)
    if (o.kind == Impl::Out::Value) o.index += nargs + nconst;
  // The order in which the outputs became pending (sync() builds the graph in that order, so the
  // replayed outputs give the same graph and cache key).
  std::vector<std::pair<size_t, int>> pos;
  {
    auto pending = detail::pending_impls();
    for (size_t k = 0; k < impl->outs.size(); ++k) {
      if (impl->outs[k].kind != Impl::Out::Value) continue;
      auto it = std::find(pending.begin(), pending.end(), out_impls[k]);
      pos.push_back({it == pending.end() ? pending.size() + k : size_t(it - pending.begin()), int(k)});
    }
  }
  std::sort(pos.begin(), pos.end());
  for (auto& [p, k] : pos) impl->order.push_back(k);
  return std::make_shared<const Replay>(std::move(impl));
}

std::vector<Tensor> Replay::run(const std::vector<Tensor>& args) const {
  const Impl& m = *impl_;
  if (args.size() != m.args.size()) return {};
  bool grad = grad_enabled();
  for (size_t k = 0; k < args.size(); ++k) {
    const Tensor& a = args[k];
    if (!a.defined() || a.dtype() != m.args[k].dtype || a.shape() != m.args[k].shape || a.device() != m.args[k].device ||
        (grad && a.requires_grad()))
      return {};
  }
  std::vector<ir::NodePtr> val;
  val.reserve(m.args.size() + m.consts.size() + m.recs.size());
  try {
    for (const Tensor& a : args) val.push_back(detail::node_of(a));
  } catch (const Error&) {  // a failed argument: tracing raises its error if it reads it
    return {};
  }
  for (const auto& c : m.consts) val.push_back(c);
  for (size_t k = 0; k < m.recs.size(); ++k) {
    if (m.fixed[k]) {
      val.push_back(m.fixed[k]);
      continue;
    }
    const Impl::Rec& r = m.recs[k];
    std::vector<ir::NodePtr> in;
    in.reserve(r.in.size());
    for (int i : r.in) in.push_back(val[size_t(i)]);
    val.push_back(ir::remake(r.op, std::move(in), r.attrs, r.shape, r.dtype, r.device, r.scope));
  }
  std::vector<Tensor> out(m.outs.size());
  for (int k : m.order) {
    out[size_t(k)] = detail::from_node(val[size_t(m.outs[size_t(k)].index)]);
    detail::impl_of(out[size_t(k)])->is_view = m.outs[size_t(k)].is_view;
  }
  for (size_t k = 0; k < m.outs.size(); ++k) {
    const auto& o = m.outs[k];
    if (o.kind == Impl::Out::ArgHandle) out[k] = args[size_t(o.index)];
    else if (o.kind == Impl::Out::SameAs) out[k] = out[size_t(o.index)];
  }
  return out;
}

}  // namespace tessera
