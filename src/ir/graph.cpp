#include "ir/graph.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "core/fail.h"

namespace tessera::ir {

size_t NodeIndex::slot_of(const Node* n) const {
  const size_t mask = slots_.size() - 1;
  size_t i = table_slot(reinterpret_cast<uintptr_t>(n), shift_);
  while (slots_[i].node && slots_[i].node != n) i = (i + 1) & mask;
  return i;
}

bool NodeIndex::emplace(const Node* n, int v) {
  if ((used_ + 1) * 2 > slots_.size()) {  // at most half full
    std::vector<Slot> old(std::max<size_t>(256, slots_.size() * 2));
    old.swap(slots_);
    shift_ = 64 - std::countr_zero(slots_.size());
    for (const Slot& s : old)
      if (s.node) slots_[slot_of(s.node)] = s;
  }
  Slot& s = slots_[slot_of(n)];
  if (s.node) return false;
  s = {n, v};
  ++used_;
  return true;
}

void NodeIndex::set(const Node* n, int v) { slots_[slot_of(n)].value = v; }

const int* NodeIndex::find(const Node* n) const {
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[slot_of(n)];
  return s.node ? &s.value : nullptr;
}

int NodeIndex::at(const Node* n) const {
  const int* v = find(n);
  if (!v) throw std::out_of_range("NodeIndex::at: node not in the graph");
  return *v;
}

Graph build_graph(const std::vector<NodePtr>& outputs) {
  Graph g;
  // Iterative post-order DFS; inputs are visited in order, so the order is deterministic. A
  // node is entered in the index (-1) when first pushed and numbered when its inputs are done.
  std::vector<std::pair<const NodePtr*, size_t>> stack;
  for (const NodePtr& out : outputs) {
    if (!g.index.emplace(out.get(), -1)) continue;
    stack.push_back({&out, 0});
    while (!stack.empty()) {
      auto& [np, next] = stack.back();
      const Node& n = **np;
      if (next < n.inputs.size()) {
        const NodePtr* child = &n.inputs[next++];
        if (g.index.emplace(child->get(), -1)) stack.push_back({child, 0});
        continue;
      }
      g.index.set(&n, int(g.nodes.size()));
      if (n.op == Op::Leaf) g.params.push_back(int(g.nodes.size()));
      g.nodes.push_back(*np);
      stack.pop_back();
    }
  }
  for (const NodePtr& out : outputs) g.outputs.push_back(g.index.at(out.get()));

  // Canonical key: a flat sequence of 64-bit words (built in a buffer kept across calls: the
  // GPT step's key is ~170 KB, and fresh blocks that size cost a malloc consolidation each).
  thread_local std::vector<int64_t> w;
  w.clear();
  for (const NodePtr& p : g.nodes) {
    const Node& n = *p;
    w.push_back(int64_t(n.op) << 8 | int64_t(n.dtype));
    w.push_back(int64_t(n.shape.size()));
    w.insert(w.end(), n.shape.begin(), n.shape.end());
    if (n.op == Op::Leaf) continue;
    w.push_back(int64_t(n.inputs.size()));
    for (auto& i : n.inputs) w.push_back(g.index.at(i.get()));
    w.push_back(int64_t(n.attrs.ints.size()));
    w.insert(w.end(), n.attrs.ints.begin(), n.attrs.ints.end());
    int64_t fb;
    std::memcpy(&fb, &n.attrs.f, 8);
    w.push_back(fb);
    w.push_back(reinterpret_cast<int64_t>(n.scope));  // scopes are interned for the process
  }
  w.push_back(-1);
  w.insert(w.end(), g.outputs.begin(), g.outputs.end());
  g.key.assign(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(int64_t));
  return g;
}

static std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string node_text(const Graph& g, int i) {
  const Node& n = *g.nodes[i];
  std::ostringstream os;
  os << "%" << i << " = " << dtype_short(n.dtype) << shape_str(n.shape) << " ";
  if (n.op == Op::Leaf) {
    int p = 0;
    while (g.params[p] != i) ++p;
    os << "parameter(" << p << ")";
    return os.str();
  }
  os << op_name(n.op) << "(";
  for (size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << "%" << g.index.at(n.inputs[k].get());
  os << ")";
  if (!n.attrs.ints.empty()) {
    os << " ints={";
    for (size_t k = 0; k < n.attrs.ints.size(); ++k) os << (k ? "," : "") << n.attrs.ints[k];
    os << "}";
  }
  if (n.op == Op::Full || n.op == Op::Pad) os << " value=" << fmt_double(n.attrs.f);
  if (!n.scope->empty()) os << "  # " << *n.scope;
  return os.str();
}

std::string to_text(const Graph& g) {
  std::ostringstream os;
  os << "graph {\n";
  for (size_t i = 0; i < g.nodes.size(); ++i) os << "  " << node_text(g, int(i)) << "\n";
  os << "  ROOT (";
  for (size_t k = 0; k < g.outputs.size(); ++k) os << (k ? ", " : "") << "%" << g.outputs[k];
  os << ")\n}\n";
  return os.str();
}

void verify(const Graph& g) {
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = *g.nodes[i];
    const PrimitiveInfo& pi = info(n.op);
    auto bad = [&](const std::string& why) { fail("verify", node_text(g, int(i)) + ": " + why, *n.scope); };
    for (auto& in : n.inputs) {
      const int* at = g.index.find(in.get());
      if (!at || *at >= int(i)) bad("input not defined before use");
    }
    if (n.op == Op::Leaf) {
      if (!n.buffer || n.buffer->nbytes < size_t(n.numel()) * itemsize(n.dtype)) bad("leaf without a large enough buffer");
      continue;
    }
    if (pi.arity >= 0 ? int(n.inputs.size()) != pi.arity : n.inputs.empty()) bad("wrong number of inputs");
    TypeShape ts = pi.infer(InferArgs{n.inputs, n.attrs, &n.shape, n.dtype});
    if (ts.shape != n.shape || ts.dtype != n.dtype)
      bad(std::string("rule gives ") + dtype_short(ts.dtype) + shape_str(ts.shape));
  }
}

}  // namespace tessera::ir
