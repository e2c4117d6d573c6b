// IR nodes: immutable and weakly interned (hash-consed). Building the same op on the same inputs
// with the same attributes twice returns the same node while the first is alive.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "ir/primitives.h"
#include "tessera/device.h"
#include "tessera/dtype.h"
#include "tessera/shape.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera::ir {

struct Node;
using NodePtr = std::shared_ptr<const Node>;

// Op-specific attributes; each primitive documents its layout in primitives.h.
struct Attrs {
  std::vector<int64_t> ints;
  double f = 0;
};

struct Node : std::enable_shared_from_this<Node> {
  Op op;
  DType dtype;
  Shape shape;
  Device device;
  std::vector<NodePtr> inputs;
  Attrs attrs;
  const std::string* scope;        // interned; never null ("" at top level)
  std::shared_ptr<Buffer> buffer;  // Op::Leaf only: the realized value
  size_t hash = 0;                 // of everything above (leaves: of the buffer's identity)
  bool interned = false;           // registered in the intern table

  ~Node();
  int64_t numel() const { return tessera::numel(shape); }
};

// Interns a node: runs the primitive's shape/dtype rule (which throws tessera::Error on bad
// input), then returns the existing equal node or a new one. `scope` defaults to the current one.
NodePtr make(Op op, std::vector<NodePtr> inputs, Attrs attrs = {}, const Shape* shape = nullptr,
             std::optional<DType> dtype = std::nullopt, std::optional<Device> device = std::nullopt);
// The node standing for a realized buffer (one per buffer while alive).
NodePtr leaf(std::shared_ptr<Buffer> buf, const Shape& shape, DType dtype);
// The same random draw as the Rng node `rng`, of `shape`, its elements starting `elements`
// further into the draw (ints[2], the first element index: a batch slice's rows of the whole
// batch's draw, BatchSliceScope's rule), on the device of `rng`, in the current scope.
NodePtr rng_from(const Node& rng, int64_t elements, const Shape& shape);

const std::string* intern_scope(const std::string& s);
// The home slot of hash h in an open-addressing table of 2^(64 - shift) slots (Fibonacci
// hashing: the top bits of h times 2^64 / phi), shared by the intern table and NodeIndex.
inline size_t table_slot(uint64_t h, int shift) { return size_t((h * 0x9e3779b97f4a7c15ULL) >> shift); }
int64_t live_node_count();

}  // namespace tessera::ir
#pragma GCC visibility pop
