#include "autodiff/autograd.h"

#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "core/scope_impl.h"
#include "ir/build.h"
#include "ir/saved.h"
#include "core/fail.h"

namespace tessera::autodiff {
namespace {

thread_local bool t_grad_enabled = true;

using NodeMap = std::unordered_map<const ir::Node*, ir::NodePtr>;

const ir::NodePtr& rebuild(const ir::NodePtr& n, NodeMap& memo);

// n over the values of its inputs (the same node when none of them changed). Nothing is
// allocated or reference-counted while the inputs are unchanged (the usual case: a history with
// no realized values in it), which is most of backward()'s walk over the forward history.
ir::NodePtr with_input_values(const ir::NodePtr& n, NodeMap& memo) {
  std::vector<ir::NodePtr> ins;  // filled from the first changed input on
  const size_t count = n->inputs.size();
  for (size_t i = 0; i < count; ++i) {
    const ir::NodePtr& v = rebuild(n->inputs[i], memo);
    if (ins.empty()) {
      if (v == n->inputs[i]) continue;
      ins.reserve(count);
      ins.assign(n->inputs.begin(), n->inputs.begin() + i);
    }
    ins.push_back(v);
  }
  if (ins.empty()) return n;
  ScopeAs s(*n->scope);
  return ir::make(n->op, std::move(ins), n->attrs, &n->shape, n->dtype, n->device);
}

// The node standing for `n`'s value: a realized leaf where one is known (seeded in memo), else
// n over its inputs' values. The reference stays valid while memo lives (unordered_map keeps
// its elements in place).
const ir::NodePtr& rebuild(const ir::NodePtr& n, NodeMap& memo) {
  auto it = memo.find(n.get());
  if (it != memo.end()) return it->second;
  ir::NodePtr r = with_input_values(n, memo);
  return memo.emplace(n.get(), std::move(r)).first->second;
}

ir::NodePtr accumulate(const ir::NodePtr& a, const ir::NodePtr& b) { return a ? ir::build::add(a, b) : b; }

// A realized leaf for the tensor's value if it still holds exactly `node`'s value.
ir::NodePtr realized_value(const std::weak_ptr<TensorImpl>& t, const ir::NodePtr& node) {
  auto impl = t.lock();
  if (!impl || !impl->buffer || impl->realized_from.lock() != node) return nullptr;
  if (auto* rec = detail::capture_recorder()) rec->note_read(impl, impl->buffer.get());
  return ir::leaf(impl->buffer, impl->shape, impl->dtype);
}

}  // namespace

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }

bool requires_grad(const Tensor& t) { return t.defined() && detail::impl_of(t)->grad_meta && detail::impl_of(t)->grad_meta->requires_grad; }

void record(const Tensor& out, const std::vector<const Tensor*>& inputs) {
  if (!t_grad_enabled || !is_floating(out.dtype())) return;
  bool any = false;
  for (const Tensor* t : inputs) any |= requires_grad(*t);
  if (!any) return;
  auto fn = std::make_shared<GradFn>();
  fn->out = detail::node_of(out);
  fn->out_tensor = detail::impl_of(out);
  for (const Tensor* t : inputs)
    fn->inputs.push_back({detail::node_of(*t), requires_grad(*t) ? detail::impl_of(*t)->grad_meta : nullptr, detail::impl_of(*t)});
  auto meta = std::make_shared<Meta>();
  meta->requires_grad = true;
  meta->grad_fn = std::move(fn);
  detail::impl_of(out)->grad_meta = std::move(meta);
}

void record_custom(const Tensor& out, const std::vector<const Tensor*>& inputs, std::vector<ir::NodePtr> saved, CustomVjp vjp) {
  record(out, inputs);
  auto& meta = detail::impl_of(out)->grad_meta;
  if (!meta || !meta->grad_fn || meta->grad_fn->out != detail::node_of(out)) return;
  for (const ir::NodePtr& n : saved) ir::mark_saved(n);
  meta->grad_fn->saved = std::move(saved);
  meta->grad_fn->vjp = std::move(vjp);
}

namespace {

// A map keyed by node, searched linearly while small: a region is usually one recorded op's few
// nodes (a composite's tens), where hashing and a heap node per entry cost more than the scan.
// Past kLinear entries it keeps a hash index, so large regions stay linear overall.
template <class V> class SmallMap {
 public:
  V* find(const ir::Node* k) {
    if (!index_.empty()) {
      auto it = index_.find(k);
      return it == index_.end() ? nullptr : &kv_[it->second].second;
    }
    for (auto& [key, v] : kv_)
      if (key == k) return &v;
    return nullptr;
  }
  V& operator[](const ir::Node* k) {
    if (V* v = find(k)) return *v;
    kv_.emplace_back(k, V{});
    if (kv_.size() > kLinear) {
      if (index_.empty())
        for (size_t i = 0; i < kv_.size(); ++i) index_.emplace(kv_[i].first, i);
      else
        index_.emplace(k, kv_.size() - 1);
    }
    return kv_.back().second;
  }

 private:
  static constexpr size_t kLinear = 32;
  std::vector<std::pair<const ir::Node*, V>> kv_;
  std::unordered_map<const ir::Node*, size_t> index_;
};

// "<scope>.backward" ("backward" at top level) for an interned forward scope; consecutive nodes
// mostly share a scope, so the last one's string is kept instead of built per node.
const std::string& backward_scope(const std::string* scope) {
  thread_local const std::string* last = nullptr;
  thread_local std::string path;
  if (scope != last) {
    path = scope->empty() ? std::string("backward") : *scope + ".backward";
    last = scope;
  }
  return path;
}

// vjp_region over `memo`: the nodes already rebuilt over realized values (shared by every region
// of one backward(), so each node of the history is rebuilt once, not once per op above it).
std::vector<ir::NodePtr> vjp_region(const ir::NodePtr& out, const std::vector<ir::NodePtr>& boundary,
                                    const ir::NodePtr& g, NodeMap& memo) {
  auto stop = [&](const ir::Node* n) {
    for (auto& b : boundary)
      if (b.get() == n) return true;
    return false;
  };
  // Nodes between out and the boundary, in post-order; `reaches` marks those leading to it.
  SmallMap<bool> reaches;
  std::vector<const ir::NodePtr*> order;
  auto visit = [&](auto& self, const ir::NodePtr& n) -> bool {
    if (bool* seen = reaches.find(n.get())) return *seen;
    bool r = stop(n.get());
    if (!r) {
      reaches[n.get()] = false;
      for (auto& i : n->inputs) r |= self(self, i);
    }
    reaches[n.get()] = r;
    if (r && !stop(n.get())) order.push_back(&n);
    return r;
  };
  visit(visit, out);
  SmallMap<ir::NodePtr> cot;
  cot[out.get()] = g;
  for (size_t k = order.size(); k-- > 0;) {
    const ir::NodePtr& n = *order[k];
    ir::NodePtr* c = cot.find(n.get());
    if (!c || !is_floating(n->dtype)) continue;
    ir::VjpRule rule = ir::info(n->op).vjp;
    if (!rule) continue;
    ir::NodePtr self = rebuild(n, memo), node = with_input_values(n, memo);
    ScopeAs s(backward_scope(n->scope));
    std::vector<ir::NodePtr> grads = rule(*node, self, *c);
    for (size_t i = 0; i < grads.size() && i < n->inputs.size(); ++i) {
      const ir::NodePtr& x = n->inputs[i];
      if (!grads[i] || !reaches[x.get()] || !is_floating(x->dtype)) continue;
      ir::NodePtr& acc = cot[x.get()];
      acc = accumulate(acc, grads[i]);
    }
  }
  std::vector<ir::NodePtr> r;
  for (auto& b : boundary) {
    ir::NodePtr* it = cot.find(b.get());
    r.push_back(it ? *it : nullptr);
  }
  return r;
}

}  // namespace

std::vector<ir::NodePtr> vjp_region(const ir::NodePtr& out, const std::vector<ir::NodePtr>& boundary,
                                    const ir::NodePtr& g,
                                    const std::vector<std::pair<ir::NodePtr, ir::NodePtr>>& values) {
  NodeMap memo;
  for (auto& [node, leaf] : values) memo.emplace(node.get(), leaf);
  return vjp_region(out, boundary, g, memo);
}

void backward(const Tensor& root, const Tensor& grad) {
  if (!root.defined()) fail("backward", "called on an undefined tensor");
  if (!requires_grad(root))
    fail("backward", "tensor " + std::string(dtype_name(root.dtype())) + shape_str(root.shape()) +
                         " does not require grad (no input of its computation has requires_grad set)");
  ir::NodePtr seed;
  if (grad.defined()) {
    if (grad.shape() != root.shape())
      fail("backward", "gradient of shape " + shape_str(grad.shape()) + " for a tensor of shape " + shape_str(root.shape()));
    seed = ir::build::cast(detail::node_of(grad), root.dtype());
  } else {
    if (root.numel() != 1)
      fail("backward", "a gradient can be created implicitly only for one-element tensors, got shape " +
                           shape_str(root.shape()) + "; pass one to backward()");
    seed = ir::build::full(1, root.shape(), root.dtype(), root.device());
  }
  bool was = t_grad_enabled;
  t_grad_enabled = false;
  struct Restore {
    bool v;
    ~Restore() { t_grad_enabled = v; }
  } restore{was};

  // Metas in reverse topological order (each after every meta that consumes it).
  std::vector<Meta*> post;
  std::unordered_set<Meta*> seen;
  std::function<void(Meta*)> dfs = [&](Meta* m) {
    if (!seen.insert(m).second) return;
    if (m->grad_fn)
      for (auto& e : m->grad_fn->inputs)
        if (e.meta) dfs(e.meta.get());
    post.push_back(m);
  };
  Meta* root_meta = detail::impl_of(root)->grad_meta.get();
  dfs(root_meta);
  // Every value realized since the forward pass, read instead of recomputed wherever the
  // history uses it.
  NodeMap memo;
  for (Meta* m : post) {
    if (!m->grad_fn) continue;
    const GradFn& fn = *m->grad_fn;
    for (auto& e : fn.inputs)
      if (auto v = realized_value(e.tensor, e.node)) memo.emplace(e.node.get(), v);
    if (auto v = realized_value(fn.out_tensor, fn.out)) memo.emplace(fn.out.get(), v);
  }
  std::unordered_map<Meta*, ir::NodePtr> cot;
  cot[root_meta] = seed;
  for (size_t k = post.size(); k-- > 0;) {
    Meta* m = post[k];
    ir::NodePtr g = cot.count(m) ? cot[m] : nullptr;
    if (!m->grad_fn || !g) continue;  // leaves are accumulated below, once complete
    GradFn& fn = *m->grad_fn;
    std::vector<ir::NodePtr> boundary;
    for (auto& e : fn.inputs) boundary.push_back(e.node);
    std::vector<ir::NodePtr> grads;
    if (fn.vjp) {
      std::vector<ir::NodePtr> saved;
      for (const ir::NodePtr& n : fn.saved) saved.push_back(rebuild(n, memo));
      ScopeAs s(backward_scope(fn.out->scope));
      grads = fn.vjp(g, saved);
    } else {
      grads = vjp_region(fn.out, boundary, g, memo);
    }
    std::unordered_set<const ir::Node*> given;  // an input read twice gets its total once
    for (size_t i = 0; i < fn.inputs.size(); ++i) {
      const Edge& e = fn.inputs[i];
      if (!e.meta || !given.insert(e.node.get()).second) continue;
      // No gradient flows through non-differentiable ops: a leaf behind one gets zeros.
      if (!grads[i]) grads[i] = ir::build::full_like(e.node, 0);
      cot[e.meta.get()] = accumulate(cot[e.meta.get()], grads[i]);
    }
  }
  for (Meta* m : post) {
    if (m->grad_fn || !cot.count(m)) continue;
    const ir::NodePtr& g = cot[m];
    m->grad = detail::from_node(m->grad.defined() ? ir::build::add(detail::node_of(m->grad), g) : g);
  }
}

}  // namespace tessera::autodiff
