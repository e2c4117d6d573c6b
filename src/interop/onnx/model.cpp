// Loading a ModelProto (checked before anything runs) and running its graph: each call traces
// the nodes in order onto Tessera's ops; initializers are the module's parameters and buffers.
#include <algorithm>
#include <filesystem>
#include <set>

#include "interop/onnx/graph.h"

namespace tessera::onnx {
namespace {
using detail::fail;

// The newest default-domain opset Debian's ONNX 1.12 defines; older models (down to 7, the
// first one its node tests use) run with each op's semantics at their version.
constexpr int64_t kMinOpset = 7, kMaxOpset = 17;

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

::onnx::ModelProto parse_model(const std::string& path) {
  std::string bytes = detail::read_file(path, "ONNX model");
  ::onnx::ModelProto m;
  if (!detail::parse_quietly(m, bytes)) fail(path, "not an ONNX model (malformed or truncated protobuf)");
  if (!m.has_graph()) fail(path, "the model has no graph");
  return m;
}

int64_t model_opset(const ::onnx::ModelProto& m, const std::string& path) {
  int64_t opset = 0;
  for (const auto& o : m.opset_import())
    if (default_domain(o.domain())) opset = o.version();
  if (opset == 0) fail(path, "the model imports no default-domain opset");
  if (opset < kMinOpset || opset > kMaxOpset)
    fail(path, "opset " + std::to_string(opset) + " is outside the supported " + std::to_string(kMinOpset) + ".." + std::to_string(kMaxOpset));
  return opset;
}

std::vector<UnsupportedOp> check_nodes(const ::onnx::GraphProto& g, int64_t opset) {
  std::vector<UnsupportedOp> out;
  const auto& table = detail::op_table();
  const auto& refused = detail::refused_ops();
  for (int k = 0; k < g.node_size(); ++k) {
    const auto& n = g.node(k);
    std::string op = default_domain(n.domain()) ? n.op_type() : n.domain() + "." + n.op_type();
    std::string reason;
    if (!default_domain(n.domain())) reason = "not in the default domain";
    else if (auto r = refused.find(n.op_type()); r != refused.end()) reason = r->second;
    else if (!table.count(n.op_type())) reason = "not implemented";
    for (const auto& a : n.attribute())
      if (reason.empty() && (a.has_g() || a.graphs_size() > 0)) reason = "subgraphs (If, Loop, Scan) are not supported";
    if (!reason.empty()) out.push_back({op, detail::node_label(n, k), opset, reason});
  }
  return out;
}

std::string describe(const std::vector<UnsupportedOp>& ops) {
  std::string s;
  for (const auto& u : ops)
    s += (s.empty() ? "" : "; ") + u.op_type + " (node " + u.node_name + ", opset " + std::to_string(u.opset) + ": " + u.reason + ")";
  return s;
}

std::string shapes(const std::vector<Tensor>& in) {
  std::string s;
  for (const Tensor& t : in)
    s += (s.empty() ? "" : ", ") + (t.defined() ? std::string(dtype_name(t.dtype())) + shape_str(t.shape()) : std::string("absent"));
  return "[" + s + "]";
}

}  // namespace

std::vector<std::string> supported_ops() {
  std::vector<std::string> v;
  for (const auto& [name, fn] : detail::op_table()) v.push_back(name);
  return v;
}

std::vector<UnsupportedOp> unsupported_ops(const std::string& path) {
  ::onnx::ModelProto m = parse_model(path);
  return check_nodes(m.graph(), model_opset(m, path));
}

std::shared_ptr<Model> load(const std::string& path, const LoadOptions& o) {
  ::onnx::ModelProto m = parse_model(path);
  auto g = std::make_shared<detail::Graph>();
  g->opset = model_opset(m, path);
  if (auto bad = check_nodes(m.graph(), g->opset); !bad.empty())
    fail(path, std::to_string(bad.size()) + " unsupported node" + (bad.size() > 1 ? "s" : "") + ": " + describe(bad));
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::string dir = parent.empty() ? std::string(".") : parent.string();
  std::set<std::string> init_names;
  for (const auto& t : m.graph().initializer()) {
    if (!init_names.insert(t.name()).second) fail(path, "initializer '" + t.name() + "' is defined twice");
    g->initializers.push_back({t.name(), detail::to_tensor(t, dir, o.device, path + ": initializer")});
  }
  if (m.graph().sparse_initializer_size() > 0) fail(path, "sparse initializers are not supported");
  for (const auto& v : m.graph().input()) {
    if (init_names.count(v.name())) continue;
    g->inputs.push_back(v.name());
    const auto& tt = v.type().tensor_type();
    Shape dims;
    std::vector<std::string> names;
    bool ranked = tt.has_shape();
    for (const auto& d : tt.shape().dim()) {
      dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      names.push_back(d.has_dim_value() ? "" : d.dim_param());
    }
    g->declared.push_back({tt.elem_type(), ranked ? dims : Shape{-2}});  // -2: rank unknown
    g->dim_names.push_back(std::move(names));
  }
  for (const auto& v : m.graph().output()) g->outputs.push_back(v.name());
  m.mutable_graph()->clear_initializer();
  g->graph = std::move(*m.mutable_graph());
  return std::make_shared<Model>(std::move(g));
}

// Floating-point initializers are parameters, except statistics: those only ever read as
// BatchNormalization's running mean and variance are buffers (no gradient, as in PyTorch).
Model::Model(std::shared_ptr<detail::Graph> g) : nn::Module("onnx.Model"), g_(std::move(g)) {
  std::set<std::string> stats, other;
  for (const auto& n : g_->graph.node())
    for (int k = 0; k < n.input_size(); ++k)
      (n.op_type() == "BatchNormalization" && (k == 3 || k == 4) ? stats : other).insert(n.input(k));
  for (auto& [name, t] : g_->initializers) {
    bool statistic = stats.count(name) && !other.count(name);
    t = is_floating(t.dtype()) && !statistic ? register_parameter(name, t) : register_buffer(name, t);
  }
}

const std::vector<std::string>& Model::input_names() const { return g_->inputs; }
const std::vector<std::string>& Model::output_names() const { return g_->outputs; }
std::vector<InputSpec> Model::input_specs() const {
  std::vector<InputSpec> specs;
  for (size_t k = 0; k < g_->inputs.size(); ++k) {
    const auto& [elem, dims] = g_->declared[k];
    InputSpec s{.name = g_->inputs[k]};
    if (elem != 0) s.dtype = detail::to_dtype(elem, "input '" + s.name + "'");
    s.ranked = dims.size() != 1 || dims[0] != -2;
    if (s.ranked) s.dims = dims, s.dim_names = g_->dim_names[k];
    specs.push_back(std::move(s));
  }
  return specs;
}
int64_t Model::opset() const { return g_->opset; }

std::map<std::string, Tensor> Model::run_named(const std::map<std::string, Tensor>& inputs) {
  nn::ModuleScope scope(*this);
  std::map<std::string, Tensor> env;
  for (const auto& [name, t] : g_->initializers) env[name] = t;
  for (size_t k = 0; k < g_->inputs.size(); ++k) {
    const std::string& name = g_->inputs[k];
    auto it = inputs.find(name);
    if (it == inputs.end() || !it->second.defined()) fail("run", "input '" + name + "' is not given");
    const Tensor& t = it->second;
    const auto& [elem, dims] = g_->declared[k];
    if (elem != 0 && detail::to_dtype(elem, "run: input '" + name + "'") != t.dtype())
      fail("run", "input '" + name + "' is " + dtype_name(t.dtype()) + ", the model declares " + detail::onnx_type_name(elem));
    bool rank_known = dims.size() != 1 || dims[0] != -2;
    bool fits = !rank_known || int64_t(dims.size()) == t.dim();
    for (size_t d = 0; fits && rank_known && d < dims.size(); ++d) fits = dims[d] < 0 || dims[d] == t.size(int64_t(d));
    if (!fits)
      fail("run", "input '" + name + "' has shape " + shape_str(t.shape()) + ", the model declares " + shape_str(dims) + " (-1: any extent)");
    env[name] = t;
  }
  for (const auto& [name, t] : inputs)
    if (std::find(g_->inputs.begin(), g_->inputs.end(), name) == g_->inputs.end())
      fail("run", "'" + name + "' is not an input of the model");
  Device device = g_->inputs.empty() ? (g_->initializers.empty() ? Device("cpu") : g_->initializers[0].second.device())
                                     : env[g_->inputs[0]].device();
  const auto& table = detail::op_table();
  for (int k = 0; k < g_->graph.node_size(); ++k) {
    const auto& n = g_->graph.node(k);
    detail::Ctx c{n, k, g_->opset, device, {}};
    for (const std::string& name : n.input()) {
      if (name.empty()) {
        c.in.emplace_back();
        continue;
      }
      auto it = env.find(name);
      if (it == env.end()) c.fail("its input '" + name + "' is produced by no earlier node, initializer or graph input");
      c.in.push_back(it->second);
    }
    std::vector<Tensor> out;
    try {
      out = table.at(n.op_type())(c);
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind("onnx: ", 0) == 0) throw;
      c.fail(std::string(msg) + " (inputs " + shapes(c.in) + ")");
    }
    for (int k = 0; k < n.output_size(); ++k) {
      if (n.output(k).empty()) continue;
      if (size_t(k) >= out.size() || !out[k].defined()) c.fail("output " + std::to_string(k) + " ('" + n.output(k) + "') is not supported");
      env[n.output(k)] = out[k];
    }
  }
  std::map<std::string, Tensor> result;
  for (const std::string& name : g_->outputs) {
    auto it = env.find(name);
    if (it == env.end()) fail("run", "graph output '" + name + "' is produced by no node");
    result[name] = it->second;
  }
  return result;
}

std::vector<Tensor> Model::run(const std::vector<Tensor>& inputs) {
  if (inputs.size() != g_->inputs.size())
    fail("run", "the model takes " + std::to_string(g_->inputs.size()) + " inputs, got " + std::to_string(inputs.size()));
  std::map<std::string, Tensor> named;
  for (size_t k = 0; k < inputs.size(); ++k) named[g_->inputs[k]] = inputs[k];
  std::map<std::string, Tensor> out = run_named(named);
  std::vector<Tensor> v;
  for (const std::string& name : g_->outputs) v.push_back(out.at(name));
  return v;
}

Tensor Model::forward(const Tensor& x) {
  if (g_->inputs.size() != 1 || g_->outputs.size() != 1)
    fail("forward", "forward(x) needs a model with one input and one output; this one has " + std::to_string(g_->inputs.size()) +
                        " and " + std::to_string(g_->outputs.size()) + " (use run)");
  return run(std::vector<Tensor>{x})[0];
}

}  // namespace tessera::onnx
