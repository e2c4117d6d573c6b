// A graph: the nodes reachable from a set of outputs, in a deterministic topological order.
// Its structural key is what the compile cache matches: realized leaves appear in it only as
// numbered parameters (shape, dtype), never by identity or contents.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/node.h"

namespace tessera::ir {

struct Graph {
  std::vector<NodePtr> nodes;         // topological order (inputs before users)
  std::vector<int> outputs;           // indices into nodes, one per requested output
  std::vector<int> params;            // indices of Leaf nodes, numbered by first appearance
  std::unordered_map<const Node*, int> index;  // node -> position in nodes
  std::string key;                    // canonical serialization (structure, shapes, dtypes)
};

Graph build_graph(const std::vector<NodePtr>& outputs);
// One line per node, in the spirit of XLA's HLO text.
std::string to_text(const Graph& g);
std::string node_text(const Graph& g, int i);
// Checks order, arities and that every node's shape/dtype matches its rule; throws tessera::Error.
void verify(const Graph& g);

}  // namespace tessera::ir
