// Internal to the ONNX importer: the checked ModelProto, its tensors, and the op table.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "tessera/onnx.h"
#include "tessera/replay.h"
#include "tessera/tensor.h"

namespace tessera::onnx::detail {

// Errors of the importer: one line, "onnx: <where>: <what>".
[[noreturn]] void fail(const std::string& where, const std::string& what);

// The bytes of a file, refused beyond protobuf's own 2 GiB limit.
std::string read_file(const std::string& path, const std::string& what);
// Parses a message with protobuf's own logging held back (the caller raises one error line).
bool parse_quietly(google::protobuf::MessageLite& m, const std::string& bytes);
// TensorProto -> Tensor. `dir` is the model's folder for external data ("" refuses external
// data); every size is checked against the bytes present before anything is allocated.
Tensor to_tensor(const ::onnx::TensorProto& t, const std::string& dir, const Device& device, const std::string& where);
DType to_dtype(int32_t onnx_type, const std::string& where);  // fails for types Tessera lacks
const char* onnx_type_name(int32_t onnx_type);

// A value known on the host: a constant, a small integer initializer, or shape arithmetic folded
// from the input shapes (fold.cpp). Int32/int64/bool elements are kept in `i`, float32/float64
// ones in `f` (each already rounded to its dtype).
struct HostVal {
  DType dtype = DType::Int64;
  Shape shape;
  std::vector<int64_t> i;
  std::vector<double> f;
  bool floating() const { return dtype == DType::Float32 || dtype == DType::Float64; }
  size_t numel() const { return floating() ? f.size() : i.size(); }
};
constexpr int64_t kHostMax = 1 << 14;  // the most elements a host-known value holds
bool host_dtype(DType d);              // int32, int64, bool, float32, float64
HostVal host_of(const Tensor& t);      // reads t (a host sync)
Tensor to_device(const HostVal& h, const Device& device);

struct Plan;  // model.cpp: what tracing needs for one input signature
struct Ctx;

struct Graph {
  ::onnx::GraphProto graph;  // nodes and value names (the initializers moved to `initializers`)
  int64_t opset = 0;
  std::vector<std::string> inputs, outputs;
  // Each runtime input's declared element type (0: none) and dims (-1: dynamic, such as
  // `batch`; the single entry -2: no shape declared).
  std::vector<std::pair<int32_t, Shape>> declared;
  std::vector<std::vector<std::string>> dim_names;  // each input's dims' names ("" where none)
  std::vector<std::pair<std::string, Tensor>> initializers;
  // Every value name numbered (slots): the initializers first, then the runtime inputs, then the
  // nodes' outputs; each node's inputs and outputs as slots (-1: an empty name).
  int nslots = 0;
  std::vector<std::vector<int>> node_in, node_out;
  std::vector<const std::function<std::vector<Tensor>(Ctx&)>*> node_fn;  // each node's op
  std::vector<int> declared_dtype;  // each input's declared dtype as int(DType); -1: none or not one Tessera has
  std::vector<int> input_slot, output_slot;
  // Host values known at load: Constant nodes' outputs and small integer initializers (these
  // are read once at load: shape arithmetic treats them as constants).
  std::map<int, std::shared_ptr<const HostVal>> constants;
  // One plan per input signature (dtypes, shapes, device), made on its first call; at most
  // kMaxPlans are kept, the oldest dropped first (`plan_order`: keys in the order made).
  static constexpr size_t kMaxPlans = 256;
  std::mutex plans_mu;
  std::map<std::string, std::shared_ptr<Plan>> plans;
  std::vector<std::string> plan_order;
  // Recorded traces for replay (tessera/replay.h), per signature, module scope and autocast
  // dtype; at most kMaxPlans, the oldest dropped first.
  std::map<std::string, std::shared_ptr<const Replay>> replays;
  std::vector<std::string> replay_order;
};

// How errors name a node: 'name', or #k (its index in the graph) when it has no name.
std::string node_label(const ::onnx::NodeProto& n, int index);

// One node being traced: its inputs (undefined where the name is empty) and attribute readers.
struct Ctx {
  const ::onnx::NodeProto& node;
  int index;  // in the graph's node list
  int64_t opset;
  Device device;  // where constants are made: the inputs' device
  std::vector<Tensor> in;
  // Inputs known on the host (nullptr where not): shape operands are read from these with no
  // device read; `materialize` makes an input's tensor from its host value when an op needs it.
  std::vector<const HostVal*> hin;
  std::function<Tensor(size_t)> materialize;
  bool device_read = false;  // set when a shape operand was read back from the device

  [[noreturn]] void fail(const std::string& what) const;
  const ::onnx::AttributeProto* attr(const std::string& name) const;
  bool has(const std::string& name) const { return attr(name) != nullptr; }
  int64_t i(const std::string& name, int64_t def) const;
  double f(const std::string& name, double def) const;
  std::string s(const std::string& name, const std::string& def) const;
  std::vector<int64_t> ints(const std::string& name, std::vector<int64_t> def = {}) const;
  std::vector<double> floats(const std::string& name, std::vector<double> def = {}) const;
  bool has_input(size_t k) const { return (k < in.size() && in[k].defined()) || (k < hin.size() && hin[k]); }
  const Tensor& input(size_t k);  // fails when absent
  // A shape operand (Reshape's shape, Slice's starts...) read on the host before tracing goes on.
  std::vector<int64_t> ints_input(size_t k);
  std::vector<double> doubles_input(size_t k);
};

// Evaluates node `c` on the host when it is shape arithmetic on host-known inputs (fold.cpp);
// false: trace it.
bool fold(Ctx& c, std::vector<HostVal>& out);

using OpFn = std::function<std::vector<Tensor>(Ctx&)>;
// The default-domain op table (ops.cpp); `refused` holds ops refused with a reason.
const std::map<std::string, OpFn>& op_table();
const std::map<std::string, std::string>& refused_ops();

}  // namespace tessera::onnx::detail
