// Loading a ModelProto (checked before anything runs) and running its graph: each call traces
// the nodes in order onto Tessera's ops; initializers are the module's parameters and buffers.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <set>

#include "interop/onnx/graph.h"
#include "tessera/autocast.h"

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

// Numbers every value (slots), so a run indexes vectors instead of looking names up. A node's
// input that no earlier node, initializer or graph input produces is kNoSlot (its error is raised
// when the node runs, as before).
constexpr int kEmpty = -1, kNoSlot = -2;
void number_slots(detail::Graph& g) {
  std::map<std::string, int> slot;
  for (const auto& [name, t] : g.initializers) slot[name] = g.nslots++;
  for (const std::string& name : g.inputs)
    if (!slot.count(name)) slot[name] = g.nslots++;
  for (const auto& n : g.graph.node()) {
    std::vector<int> in, out;
    for (const std::string& name : n.input()) {
      auto it = slot.find(name);
      in.push_back(name.empty() ? kEmpty : it == slot.end() ? kNoSlot : it->second);
    }
    for (const std::string& name : n.output()) {
      if (name.empty()) {
        out.push_back(kEmpty);
        continue;
      }
      auto it = slot.find(name);
      out.push_back(it != slot.end() ? it->second : (slot[name] = g.nslots++));
    }
    g.node_in.push_back(std::move(in));
    g.node_out.push_back(std::move(out));
    auto fn = detail::op_table().find(n.op_type());
    g.node_fn.push_back(fn == detail::op_table().end() ? nullptr : &fn->second);
  }
  for (const auto& [elem, dims] : g.declared) {
    int dt = -1;
    try {
      if (elem != 0) dt = int(detail::to_dtype(elem, ""));
    } catch (const Error&) {  // reported, naming the input, when the model runs
    }
    g.declared_dtype.push_back(dt);
  }
  for (const std::string& name : g.outputs) {
    auto it = slot.find(name);
    g.output_slot.push_back(it == slot.end() ? kNoSlot : it->second);
  }
  for (const std::string& name : g.inputs) g.input_slot.push_back(slot.at(name));
}

}  // namespace

namespace detail {
// What tracing needs for one input signature (dtypes, shapes, device), made by its first call:
// the values folded on the host, the tensors made once (host values an op takes as a tensor,
// Constant nodes' outputs), and the nodes a call skips because their outputs are all there.
// Only the call that builds a plan writes it, before publishing it under Graph::plans_mu; a
// published plan is read-only, so calls on other threads read it without a lock.
struct Plan {
  std::vector<std::shared_ptr<const HostVal>> host;  // per slot
  std::vector<Tensor> made;                          // per slot
  std::vector<char> skip;                            // per node
};
}  // namespace detail

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
  number_slots(*g);
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
  // Host values for shape arithmetic: small integer initializers (read once, here) and the
  // Constant nodes' values (a Constant the tracer refuses is left to fail when it runs).
  for (size_t k = 0; k < g_->initializers.size(); ++k) {
    const Tensor& t = g_->initializers[k].second;
    if (!is_floating(t.dtype()) && detail::host_dtype(t.dtype()) && t.numel() <= 64)
      g_->constants[int(k)] = std::make_shared<const detail::HostVal>(detail::host_of(t));
  }
  const auto& table = detail::op_table();
  for (int k = 0; k < g_->graph.node_size(); ++k) {
    const auto& n = g_->graph.node(k);
    if (n.op_type() != "Constant" || n.output_size() != 1 || g_->node_out[size_t(k)][0] < 0) continue;
    try {
      detail::Ctx c{n, k, g_->opset, Device("cpu"), {}, {}, {}};
      Tensor t = table.at("Constant")(c).at(0);
      if (detail::host_dtype(t.dtype()) && t.numel() <= detail::kHostMax)
        g_->constants[g_->node_out[size_t(k)][0]] = std::make_shared<const detail::HostVal>(detail::host_of(t));
    } catch (const Error&) {
    }
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

namespace {
// While a plan is made: whether node `c` folds on the host (its outputs' values into `hv`, or
// already in the plan): Shape/Size of a value whose shape the signature fixes (`in_fixed`), a
// Constant read at load, and shape arithmetic on host values (fold.cpp).
bool fold_node(detail::Ctx& c, const std::vector<int>& ins, const std::vector<int>& outs, bool in_fixed, const detail::Plan& p,
               std::vector<detail::HostVal>& hv) {
  const std::string& op = c.node.op_type();
  if ((op == "Shape" || op == "Size") && in_fixed && !ins.empty() && ins[0] >= 0) {
    const Shape& s = c.hin[0] ? c.hin[0]->shape : c.in[0].shape();
    if (op == "Size") {
      hv.push_back({DType::Int64, {}, {std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<>())}, {}});
      return true;
    }
    int64_t r = int64_t(s.size()), b = c.i("start", 0), e = c.i("end", r);
    b = std::clamp<int64_t>(b < 0 ? b + r : b, 0, r);
    e = std::clamp<int64_t>(e < 0 ? e + r : e, 0, r);
    std::vector<int64_t> v(s.begin() + b, s.begin() + std::max(b, e));
    hv.push_back({DType::Int64, {int64_t(v.size())}, v, {}});
    return true;
  }
  if (op == "Constant") return outs.size() == 1 && outs[0] >= 0 && p.host[size_t(outs[0])];  // its value was read at load
  return detail::fold(c, hv);
}

// What a replay (tessera/replay.h) substitutes: the initializers, then the runtime inputs.
std::vector<Tensor> replay_args(const detail::Graph& g, const std::vector<Tensor>& val) {
  std::vector<Tensor> args;
  args.reserve(g.initializers.size() + g.inputs.size());
  for (const auto& [name, t] : g.initializers) args.push_back(t);
  for (int slot : g.input_slot) args.push_back(val[size_t(slot)]);
  return args;
}
// A recorded trace is replayed only where no gradient would be recorded (grad mode off, or no
// parameter or input requires grad), under the same module scope and autocast dtype (both steer
// tracing): its key, or "" where it is not replayed.
std::string replay_key(const std::string& key, const std::vector<Tensor>& args) {
  static const bool off = [] {  // TESSERA_ONNX_REPLAY=0: every call traces (measuring)
    const char* e = std::getenv("TESSERA_ONNX_REPLAY");
    return e && std::string(e) == "0";
  }();
  if (off) return "";
  if (grad_enabled())
    for (const Tensor& t : args)
      if (t.requires_grad()) return "";
  std::optional<DType> ac = autocast_dtype();
  return key + '|' + current_scope() + '|' + (ac ? dtype_name(*ac) : "-");
}
// The outputs of the recorded trace replayed on `args`; empty where there is none to replay (or
// the replay refused: trace instead).
std::vector<Tensor> replayed(detail::Graph& g, const std::string& rkey, const std::vector<Tensor>& args) {
  if (rkey.empty()) return {};
  std::shared_ptr<const Replay> rec;
  {
    std::lock_guard<std::mutex> lock(g.plans_mu);
    auto it = g.replays.find(rkey);
    if (it == g.replays.end()) return {};
    rec = it->second;
  }
  return rec->run(args);
}
std::shared_ptr<detail::Plan> find_plan(detail::Graph& g, const std::string& key) {
  std::lock_guard<std::mutex> lock(g.plans_mu);
  auto it = g.plans.find(key);
  return it == g.plans.end() ? nullptr : it->second;
}
// Keeps a record (replacing one a replay refused), at most kMaxPlans, the oldest dropped first.
void keep_replay(detail::Graph& g, const std::string& rkey, std::shared_ptr<const Replay> rec) {
  if (!rec) return;
  std::lock_guard<std::mutex> lock(g.plans_mu);
  if (!g.replays.insert_or_assign(rkey, std::move(rec)).second) return;
  g.replay_order.push_back(rkey);
  if (g.replay_order.size() > detail::Graph::kMaxPlans) {
    g.replays.erase(g.replay_order.front());
    g.replay_order.erase(g.replay_order.begin());
  }
}

// Runs the graph on the runtime inputs (in the graph's order; null or undefined: not given) and
// returns the outputs in the graph's order.
std::vector<Tensor> run_graph(detail::Graph& g, nn::Module& self, const std::vector<const Tensor*>& given) {
  nn::ModuleScope scope(self);
  std::vector<Tensor> val(size_t(g.nslots));
  for (size_t k = 0; k < g.initializers.size(); ++k) val[k] = g.initializers[k].second;
  // The input signature: each input's dtype and shape, and the device (the plan's key).
  std::string key;
  key.reserve(64);
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    const std::string& name = g.inputs[k];
    if (!given[k] || !given[k]->defined()) fail("run", "input '" + name + "' is not given");
    const Tensor& t = *given[k];
    const auto& [elem, dims] = g.declared[k];
    if (elem != 0 && (g.declared_dtype[k] < 0 ? detail::to_dtype(elem, "run: input '" + name + "'") : DType(g.declared_dtype[k])) != t.dtype())
      fail("run", "input '" + name + "' is " + dtype_name(t.dtype()) + ", the model declares " + detail::onnx_type_name(elem));
    bool rank_known = dims.size() != 1 || dims[0] != -2;
    bool fits = !rank_known || int64_t(dims.size()) == t.dim();
    for (size_t d = 0; fits && rank_known && d < dims.size(); ++d) fits = dims[d] < 0 || dims[d] == t.size(int64_t(d));
    if (!fits)
      fail("run", "input '" + name + "' has shape " + shape_str(t.shape()) + ", the model declares " + shape_str(dims) + " (-1: any extent)");
    val[size_t(g.input_slot[k])] = t;
    key += dtype_name(t.dtype());
    for (int64_t d : t.shape()) {
      char buf[24];
      auto end = std::to_chars(buf, buf + sizeof buf, d).ptr;
      key += ',';
      key.append(buf, end);
    }
    key += ';';
  }
  Device device = g.inputs.empty() ? (g.initializers.empty() ? Device("cpu") : g.initializers[0].second.device())
                                   : val[size_t(g.input_slot[0])].device();
  key += device.str();

  // A recorded trace of this signature is replayed on the current parameters and inputs.
  std::vector<Tensor> args = replay_args(g, val);
  std::string rkey = replay_key(key, args);
  if (std::vector<Tensor> out = replayed(g, rkey, args); !out.empty()) return out;
  const uint64_t epoch = Replay::epoch();
  bool read_back = false;  // a node read a value back from the device: its trace is not kept
  std::shared_ptr<detail::Plan> plan = find_plan(g, key);
  bool building = !plan;
  std::vector<char> fixed;  // while building: values whose shape the signature fixes
  if (building) {
    plan = std::make_shared<detail::Plan>();
    plan->host.resize(size_t(g.nslots));
    plan->made.resize(size_t(g.nslots));
    plan->skip.assign(size_t(g.graph.node_size()), 0);
    for (const auto& [slot, h] : g.constants) plan->host[size_t(slot)] = h;
    fixed.assign(size_t(g.nslots), 0);
    for (size_t k = 0; k < g.initializers.size(); ++k) fixed[k] = 1;
    for (int slot : g.input_slot) fixed[size_t(slot)] = 1;
  }
  detail::Plan& p = *plan;
  // A host value as a tensor on the device: made once per plan by the call that builds it. A
  // later call never writes the published plan (another thread may be reading it): a tensor the
  // first call did not make (an op whose path depends on values read from the device) is made
  // for this call only.
  std::vector<Tensor> own;
  auto made = [&](int slot) -> Tensor {
    if (p.made[size_t(slot)].defined()) return p.made[size_t(slot)];
    std::vector<Tensor>& to = building ? p.made : own;
    to.resize(size_t(g.nslots));
    Tensor& t = to[size_t(slot)];
    if (!t.defined()) t = detail::to_device(*p.host[size_t(slot)], device);
    return t;
  };

  for (int k = 0; k < g.graph.node_size(); ++k) {
    if (p.skip[size_t(k)]) continue;
    const auto& n = g.graph.node(k);
    const std::vector<int>& ins = g.node_in[size_t(k)];
    const std::vector<int>& outs = g.node_out[size_t(k)];
    detail::Ctx c{n, k, g.opset, device, {}, {}, {}};
    c.in.resize(ins.size());
    c.hin.resize(ins.size(), nullptr);
    bool in_fixed = true;
    for (size_t j = 0; j < ins.size(); ++j) {
      int slot = ins[j];
      if (slot == kEmpty) continue;
      if (slot != kNoSlot) {
        c.hin[j] = p.host[size_t(slot)].get();
        c.in[j] = val[size_t(slot)].defined() ? val[size_t(slot)] : p.made[size_t(slot)];
      }
      if (slot == kNoSlot || (!c.in[j].defined() && !c.hin[j]))
        c.fail("its input '" + n.input(int(j)) + "' is produced by no earlier node, initializer or graph input");
      if (building) in_fixed = in_fixed && (c.hin[j] || fixed[size_t(slot)]);
    }
    c.materialize = [&](size_t j) { return made(ins[j]); };
    std::vector<Tensor> out;
    try {
      if (building) {
        // Fold on the host: Shape/Size of a value whose shape the signature fixes, and shape
        // arithmetic on host values (fold.cpp). Its outputs are host values from now on.
        std::vector<detail::HostVal> hv;
        if (fold_node(c, ins, outs, in_fixed, p, hv)) {
          for (size_t j = 0; j < hv.size() && j < outs.size(); ++j)
            if (outs[j] >= 0) p.host[size_t(outs[j])] = std::make_shared<const detail::HostVal>(std::move(hv[j]));
          for (int slot : outs)
            if (slot >= 0) fixed[size_t(slot)] = 1, val[size_t(slot)] = Tensor();
          p.skip[size_t(k)] = 1;
          continue;
        }
      }
      out = (*g.node_fn[size_t(k)])(c);
      read_back = read_back || c.device_read;
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind("onnx: ", 0) == 0) throw;
      std::vector<Tensor> shown = c.in;
      for (size_t j = 0; j < shown.size(); ++j)
        if (!shown[j].defined() && c.hin[j]) shown[j] = zeros(c.hin[j]->shape, {c.hin[j]->dtype, Device("cpu")});
      c.fail(std::string(msg) + " (inputs " + shapes(shown) + ")");
    }
    for (size_t j = 0; j < outs.size(); ++j) {
      if (outs[j] < 0) continue;
      if (j >= out.size() || !out[j].defined()) c.fail("output " + std::to_string(j) + " ('" + n.output(int(j)) + "') is not supported");
      val[size_t(outs[j])] = out[j];
      if (building) {
        fixed[size_t(outs[j])] = in_fixed && !c.device_read;
        if (n.op_type() == "Constant") p.made[size_t(outs[j])] = out[j];  // made once: later calls skip the node
      }
    }
    if (building && n.op_type() == "Constant") p.skip[size_t(k)] = 1;
  }
  std::vector<Tensor> result;
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int slot = g.output_slot[k];
    // An output the plan made once (a constant, a folded value) is returned as a copy, so that
    // in-place changes to it cannot reach later calls.
    if (slot >= 0 && (p.made[size_t(slot)].defined() || (!val[size_t(slot)].defined() && p.host[size_t(slot)])))
      val[size_t(slot)] = made(slot).clone();
    if (slot < 0 || !val[size_t(slot)].defined()) fail("run", "graph output '" + g.outputs[k] + "' is produced by no node");
    result.push_back(val[size_t(slot)]);
  }
  if (!rkey.empty() && !read_back && own.empty()) keep_replay(g, rkey, Replay::record(args, result, epoch));
  if (building) {
    std::lock_guard<std::mutex> lock(g.plans_mu);
    if (g.plans.emplace(key, plan).second) {
      g.plan_order.push_back(key);
      if (g.plan_order.size() > detail::Graph::kMaxPlans) {
        g.plans.erase(g.plan_order.front());
        g.plan_order.erase(g.plan_order.begin());
      }
    }
  }
  return result;
}
}  // namespace

std::map<std::string, Tensor> Model::run_named(const std::map<std::string, Tensor>& inputs) {
  for (const auto& [name, t] : inputs)
    if (std::find(g_->inputs.begin(), g_->inputs.end(), name) == g_->inputs.end())
      fail("run", "'" + name + "' is not an input of the model");
  std::vector<const Tensor*> given;
  for (const std::string& name : g_->inputs) {
    auto it = inputs.find(name);
    given.push_back(it == inputs.end() ? nullptr : &it->second);
  }
  std::vector<Tensor> out = run_graph(*g_, *this, given);
  std::map<std::string, Tensor> result;
  for (size_t k = 0; k < out.size(); ++k) result[g_->outputs[k]] = out[k];
  return result;
}

size_t Model::cached_signatures() const {
  std::lock_guard<std::mutex> lock(g_->plans_mu);
  return g_->plans.size();
}

size_t Model::cached_traces() const {
  std::lock_guard<std::mutex> lock(g_->plans_mu);
  return g_->replays.size();
}

std::vector<Tensor> Model::run(const std::vector<Tensor>& inputs) {
  if (inputs.size() != g_->inputs.size())
    fail("run", "the model takes " + std::to_string(g_->inputs.size()) + " inputs, got " + std::to_string(inputs.size()));
  std::vector<const Tensor*> given;
  for (const Tensor& t : inputs) given.push_back(&t);
  return run_graph(*g_, *this, given);
}

Tensor Model::forward(const Tensor& x) {
  if (g_->inputs.size() != 1 || g_->outputs.size() != 1)
    fail("forward", "forward(x) needs a model with one input and one output; this one has " + std::to_string(g_->inputs.size()) +
                        " and " + std::to_string(g_->outputs.size()) + " (use run)");
  return run(std::vector<Tensor>{x})[0];
}

}  // namespace tessera::onnx
