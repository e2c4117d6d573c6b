// A graph: the nodes reachable from a set of outputs, in a deterministic topological order.
// Its structural key is what the compile cache matches: realized leaves appear in it only as
// numbered parameters (shape, dtype), never by identity or contents.
#pragma once
#include <string>
#include <vector>

#include "ir/node.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::ir {

// Node -> position: open addressing over the nodes' addresses (one array, no allocation per
// node; graphs are built on every sync).
class NodeIndex {
 public:
  // Adds n -> v; false (and no change) when n is already present.
  bool emplace(const Node* n, int v);
  void set(const Node* n, int v);  // n must be present
  const int* find(const Node* n) const;  // null when absent
  int at(const Node* n) const;           // throws std::out_of_range when absent

 private:
  struct Slot {
    const Node* node = nullptr;
    int value = 0;
  };
  size_t slot_of(const Node* n) const;  // n's slot, or the empty one where it would go
  std::vector<Slot> slots_;
  size_t used_ = 0;
  int shift_ = 64;
};

struct Graph {
  std::vector<NodePtr> nodes;         // topological order (inputs before users)
  std::vector<int> outputs;           // indices into nodes, one per requested output
  std::vector<int> params;            // indices of Leaf nodes, numbered by first appearance
  NodeIndex index;                    // node -> position in nodes
  std::string key;                    // canonical serialization (structure, shapes, dtypes)
};

Graph build_graph(const std::vector<NodePtr>& outputs);
// One line per node, in the spirit of XLA's HLO text.
std::string to_text(const Graph& g);
std::string node_text(const Graph& g, int i);
// Checks order, arities and that every node's shape/dtype matches its rule; throws tessera::Error.
void verify(const Graph& g);

}  // namespace tessera::ir
#pragma GCC visibility pop
