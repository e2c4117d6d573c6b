#include "ir/node.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "core/fail.h"
#include "tessera/scope.h"
#include "ir/remake.h"

namespace tessera::ir {
namespace {

// The intern table: live interned nodes by hash, open addressing with linear probing (no
// allocation per node; each slot keeps its node's hash, so probes compare without touching
// nodes); weak: nodes remove themselves when they die (backward-shift deletion, so probes never
// need tombstones). Guarded by g_mu.
class Table {
 public:
  // Starts loading h's home slot into the cache (a hint: may race with a rehash, never faults).
  void prefetch(size_t h) const {
    const Slot* base = base_.load(std::memory_order_relaxed);
    if (base) __builtin_prefetch(base + table_slot(h, shift_hint_.load(std::memory_order_relaxed)));
  }
  // Calls f on each node with hash h until f returns true.
  template <class F> void for_each(size_t h, F f) const {
    if (slots_.empty()) return;
    for (size_t i = home(h); slots_[i].node; i = (i + 1) & mask_)
      if (slots_[i].hash == h && f(slots_[i].node)) return;
  }
  void insert(Node* n) {
    if ((used_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(1024, slots_.size() * 2));
    size_t i = home(n->hash);
    while (slots_[i].node) i = (i + 1) & mask_;
    slots_[i] = {n->hash, n};
    ++used_;
  }
  bool erase(const Node* n) {
    if (slots_.empty()) return false;
    size_t i = home(n->hash);
    while (slots_[i].node != n)
      if (!slots_[i = (i + 1) & mask_].node) return false;
    for (size_t j = i;;) {  // shift later members of the probe run back into the hole
      j = (j + 1) & mask_;
      if (!slots_[j].node) break;
      size_t k = home(slots_[j].hash);
      if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;  // its home is after the hole
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = {};
    --used_;
    return true;
  }

 private:
  struct Slot {
    size_t hash = 0;
    Node* node = nullptr;
  };
  size_t home(size_t h) const { return table_slot(h, shift_); }
  void rehash(size_t n) {
    std::vector<Slot> old(n);
    old.swap(slots_);
    mask_ = n - 1;
    shift_ = 64 - std::countr_zero(n);
    used_ = 0;
    base_.store(slots_.data(), std::memory_order_relaxed);
    shift_hint_.store(shift_, std::memory_order_relaxed);
    for (const Slot& x : old)
      if (x.node) insert(x.node);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, used_ = 0;
  int shift_ = 64;
  std::atomic<const Slot*> base_{nullptr};  // for prefetch(), read without the lock
  std::atomic<int> shift_hint_{64};
};

std::mutex g_mu;
Table g_table;
std::atomic<int64_t> g_live{0};

inline size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

// A node's hash over everything but its shape and dtype, which make() may infer or be given
// (equal nodes must hash alike however they were made): known before shape inference, so the
// table slot is fetched meanwhile. Nodes differing only in shape or dtype (one constant at
// several shapes) share a hash; same() tells them apart.
size_t hash_parts(Op op, const std::vector<NodePtr>& inputs, const Attrs& attrs, const Device& dev,
                  const std::string* scope, const Buffer* buffer) {
  size_t h = static_cast<size_t>(op);
  h = mix(h, std::hash<std::string>()(dev.kind));
  h = mix(h, size_t(dev.index));
  for (auto& i : inputs) h = mix(h, reinterpret_cast<size_t>(i.get()));
  for (int64_t v : attrs.ints) h = mix(h, size_t(v));
  uint64_t fb;
  std::memcpy(&fb, &attrs.f, 8);
  h = mix(h, fb);
  h = mix(h, reinterpret_cast<size_t>(scope));
  h = mix(h, reinterpret_cast<size_t>(buffer));
  return h;
}

bool same(const Node& a, const Node& b) {
  if (a.op != b.op || a.dtype != b.dtype || a.shape != b.shape || a.device != b.device ||
      a.scope != b.scope || a.buffer != b.buffer || a.attrs.ints != b.attrs.ints ||
      std::memcmp(&a.attrs.f, &b.attrs.f, 8) != 0 || a.inputs.size() != b.inputs.size())
    return false;
  for (size_t i = 0; i < a.inputs.size(); ++i)
    if (a.inputs[i] != b.inputs[i]) return false;
  return true;
}

// The candidate `n` (its hash set) is destroyed, when an equal node exists, only after the lock
// is released.
NodePtr intern(std::shared_ptr<Node> n) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    NodePtr existing;
    g_table.for_each(n->hash, [&](Node* m) { return same(*m, *n) && (existing = m->weak_from_this().lock()); });
    if (existing) return existing;
    g_table.insert(n.get());
    n->interned = true;
  }
  g_live.fetch_add(1, std::memory_order_relaxed);
  return n;
}

}  // namespace

Node::~Node() {
  if (!interned) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_table.erase(this)) g_live.fetch_sub(1, std::memory_order_relaxed);
}

const std::string* intern_scope(const std::string& s) {
  static std::mutex mu;
  static std::unordered_set<std::string> scopes;
  thread_local const std::string* last = nullptr;  // consecutive nodes mostly share a scope
  if (last && *last == s) return last;
  std::lock_guard<std::mutex> lock(mu);
  return last = &*scopes.insert(s).first;
}

NodePtr make(Op op, std::vector<NodePtr> inputs, Attrs attrs, const Shape* shape, std::optional<DType> dtype,
             std::optional<Device> device) {
  const PrimitiveInfo& pi = info(op);
  if (pi.arity >= 0 ? int(inputs.size()) != pi.arity : inputs.empty())
    fail(pi.name, "expects " + std::to_string(pi.arity) + " inputs, got " + std::to_string(inputs.size()));
  for (auto& i : inputs)
    if (!i) fail(pi.name, "undefined input tensor");
  Device dev = device ? *device : inputs.empty() ? Device("cpu") : inputs[0]->device;
  for (auto& i : inputs)
    if (i->device != dev)
      fail(pi.name, "tensors on different devices: " + dev.str() + " and " + i->device.str() +
                        "; move one with .to(device)");
  const std::string* scope = intern_scope(current_scope());
  const size_t hash = hash_parts(op, inputs, attrs, dev, scope, nullptr);
  g_table.prefetch(hash);
  TypeShape ts = pi.infer(InferArgs{inputs, attrs, shape, dtype});
  if (ts.shape.size() > 16) fail(pi.name, "tensors of rank " + std::to_string(ts.shape.size()) + " (over 16) are not supported");
  int64_t count = 1;
  for (int64_t d : ts.shape)
    if (__builtin_mul_overflow(count, d, &count)) fail(pi.name, "a result of shape " + shape_str(ts.shape) + " has over 2^63 elements");
  auto n = std::make_shared<Node>();
  n->op = op;
  n->dtype = ts.dtype;
  n->shape = std::move(ts.shape);
  n->device = std::move(dev);
  n->inputs = std::move(inputs);
  n->attrs = std::move(attrs);
  n->scope = scope;
  n->hash = hash;
  return intern(std::move(n));
}

NodePtr remake(Op op, std::vector<NodePtr> inputs, const Attrs& attrs, const Shape& shape, DType dtype, const Device& device,
               const std::string* scope) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->dtype = dtype;
  n->shape = shape;
  n->device = device;
  n->inputs = std::move(inputs);
  n->attrs = attrs;
  n->scope = scope;
  n->hash = hash_parts(op, n->inputs, n->attrs, device, scope, nullptr);
  return intern(std::move(n));
}

NodePtr rng_from(const Node& rng, int64_t elements, const Shape& shape) {
  Attrs at = rng.attrs;
  const int64_t first = (at.ints.size() > 2 ? at.ints[2] : 0) + elements;
  at.ints.resize(2);
  if (first) at.ints.push_back(first);
  return make(Op::Rng, {}, std::move(at), &shape, rng.dtype, rng.device);
}

NodePtr leaf(std::shared_ptr<Buffer> buf, const Shape& shape, DType dtype) {
  // A realized tensor is read by every op on it (a parameter by the forward pass and several
  // times by the optimizer's update): its live leaf is found without making a candidate node.
  const std::string* scope = intern_scope("");
  const size_t hash = hash_parts(Op::Leaf, {}, {}, buf->device, scope, buf.get());
  {
    std::lock_guard<std::mutex> lock(g_mu);
    NodePtr existing;
    g_table.for_each(hash, [&](Node* m) {
      return m->op == Op::Leaf && m->buffer == buf && m->dtype == dtype && m->shape == shape && m->scope == scope &&
             m->device == buf->device && m->inputs.empty() && m->attrs.ints.empty() && m->attrs.f == 0 &&
             (existing = m->weak_from_this().lock());
    });
    if (existing) return existing;
  }
  auto n = std::make_shared<Node>();
  n->op = Op::Leaf;
  n->dtype = dtype;
  n->shape = shape;
  n->device = buf->device;
  n->scope = scope;
  n->buffer = std::move(buf);
  n->hash = hash;
  return intern(std::move(n));
}

int64_t live_node_count() { return g_live.load(); }

}  // namespace tessera::ir
