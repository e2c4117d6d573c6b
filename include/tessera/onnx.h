// ONNX import (src/interop/onnx/, built where Debian's libonnx-dev and libprotobuf-dev are found):
// a ModelProto becomes a module whose floating-point initializers are trainable parameters
// (integer ones are buffers), whose graph inputs are the runtime inputs, and whose nodes are
// traced onto Tessera's ops when it runs. docs/architecture.md, "ONNX import", lists what is
// supported and what is refused.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessera/nn.h"
#include "tessera/tensor.h"

namespace tessera::onnx::detail {
struct Graph;  // internal (src/interop/onnx/graph.h)
}

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera::onnx {

// A node the importer cannot run: its op (with domain when not the default one), node name
// ('name' quoted, or #k, its index, when unnamed), the opset it was imported at, and why (not
// implemented, data-dependent output shape, ...).
struct UnsupportedOp {
  std::string op_type, node_name;
  int64_t opset = 0;
  std::string reason;
};

// A runtime input as the file declares it: element type (float32 when it declares none) and
// dims, -1 for a dynamic one with the name the file gives it ("batch") in dim_names ("" where
// fixed or unnamed); ranked is false when the file declares no shape.
struct InputSpec {
  std::string name;
  DType dtype = DType::Float32;
  bool ranked = true;
  Shape dims;
  std::vector<std::string> dim_names;
};

class Model : public nn::Module {
 public:
  explicit Model(std::shared_ptr<detail::Graph> g);
  // Runtime inputs (graph inputs that are not initializers) and outputs, in the graph's order.
  const std::vector<std::string>& input_names() const;
  std::vector<InputSpec> input_specs() const;  // in input_names() order
  const std::vector<std::string>& output_names() const;
  int64_t opset() const;  // the default domain's version the model was exported at
  // Runs the graph: inputs in input_names() order (or by name); outputs in output_names() order.
  // Shape operands (Reshape's shape, Slice's starts, ...) computed from the input shapes and
  // constants are folded on the host (no graph run); ones computed from input values are read
  // back from the device here, before the rest is traced.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);
  std::map<std::string, Tensor> run_named(const std::map<std::string, Tensor>& inputs);
  Tensor forward(const Tensor& x) override;  // models with one input and one output
  // Input signatures (dtypes, shapes, device) kept (the latest 256): each has a plan of the
  // shape arithmetic folded on the host, so a repeated signature only traces the tensor nodes.
  size_t cached_signatures() const;
  // Signatures whose trace is kept for replay (tessera/replay.h): a call with grad off (or no
  // input or parameter requiring grad), outside autocast or under the same autocast dtype, in
  // the same module scope, rebuilds the recorded graph on the current parameters and inputs
  // instead of tracing the nodes again. Not kept: traces that read values back from the device
  // (shape operands computed from input values) or draw random numbers.
  size_t cached_traces() const;

 private:
  std::shared_ptr<detail::Graph> g_;
};

struct LoadOptions {
  Device device = Device("cpu");  // where the initializers are placed
};

// Reads and checks a model: a malformed or truncated file, a size beyond the file's length, an
// external-data path leaving the model's folder, an unsupported opset or op all throw one
// tessera::Error before anything is allocated or run (for ops: every unsupported node listed).
std::shared_ptr<Model> load(const std::string& path, const LoadOptions& o = {});
// The nodes of the model at `path` that load() would refuse (empty: every op is supported).
std::vector<UnsupportedOp> unsupported_ops(const std::string& path);
// Default-domain op types the importer maps, sorted.
std::vector<std::string> supported_ops();

// A serialized TensorProto (.pb, as in ONNX's test data) and back. `name` receives its name.
Tensor load_tensor(const std::string& path, std::string* name = nullptr, const Device& device = Device("cpu"));
void save_tensor(const std::string& path, const Tensor& t, const std::string& name = "");

}  // namespace tessera::onnx
#pragma GCC visibility pop
