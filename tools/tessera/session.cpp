#include "session.h"

#include <sstream>

namespace tessera::cli {

using json = nlohmann::json;

Device pick_device(const std::string& name) {
  Device d = name == "best" ? Device::best() : Device(name);
  for (auto& info : devices())
    if (info.device == d) {
      if (!info.can_execute) fail("device", "'" + d.str() + "' cannot run programs (it only compiles)", "");
      return d;
    }
  from_vector<float>({0.0f}, {1}, {DType::Float32, d});  // the registry's own error ("no OpenCL device found ...")
  std::string names;
  for (auto& info : devices()) names += (names.empty() ? "" : ", ") + info.device.str();
  fail("device", "unknown device '" + name + "'; available: " + names, "");
}

std::string fmt_time(double s) {
  char buf[32];
  int t = int(s + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

std::string join(const std::vector<int64_t>& v) {
  std::string r;
  for (int64_t x : v) r += (r.empty() ? "" : ",") + std::to_string(x);
  return r;
}
std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) r.push_back(std::stoll(item));
  return r;
}

const std::string& Metadata::at(const char* key) const {
  auto it = meta.find(key);
  if (it == meta.end()) fail("load", path + ": not a tessera " + kind + " checkpoint (no '" + key + "' metadata)", "");
  return it->second;
}
int64_t Metadata::integer(const char* key) const {
  return parse(key, [](const std::string& v) {
    size_t used = 0;
    int64_t x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  });
}
std::vector<int64_t> Metadata::ints(const char* key) const { return parse(key, split_ints); }
json Metadata::json_of(const char* key) const { return parse(key, [](const std::string& v) { return json::parse(v); }); }

void save_training(const std::string& path, const nn::Module& model, const optim::Optimizer& opt, int64_t step,
                   const std::vector<int64_t>& loader, io::Metadata meta) {
  save_training(path, model, opt.state_dict(), step, loader, std::move(meta));
}

void save_training(const std::string& path, const nn::Module& model, const std::map<std::string, Tensor>& optim_state, int64_t step,
                   const std::vector<int64_t>& loader, io::Metadata meta) {
  io::TensorMap t;
  for (auto& [k, v] : model.state_dict()) t["model." + k] = v;
  for (auto& [k, v] : optim_state) t["optim." + k] = v;
  RngState rs = rng_state();
  meta["step"] = std::to_string(step);
  meta["rng_seed"] = std::to_string(rs.seed);
  meta["rng_offset"] = std::to_string(rs.offset);
  meta["loader"] = join(loader);
  io::save_safetensors(path, t, meta);
}

std::map<std::string, Tensor> model_tensors(const io::TensorMap& t) {
  std::map<std::string, Tensor> ms;
  for (auto& [k, v] : t)
    if (k.rfind("model.", 0) == 0) ms[k.substr(6)] = v;
  return ms;
}

io::Metadata load_training(const std::string& path, const Device& dev, const json& config, nn::Module& model,
                           optim::Optimizer& opt) {
  return load_training(path, dev, config, model, [&](const std::map<std::string, Tensor>& os) { opt.load_state_dict(os); });
}

io::Metadata load_training(const std::string& path, const Device& dev, const json& config, nn::Module& model,
                           const std::function<void(const std::map<std::string, Tensor>&)>& load_optim) {
  io::Metadata meta;
  io::TensorMap t = io::load_safetensors(path, &meta, dev);
  Metadata m{path, meta, "training"};
  if (m.json_of("config") != config) fail("train", "--resume: the checkpoint's model configuration differs from the flags", "");
  std::map<std::string, Tensor> os;
  for (auto& [k, v] : t)
    if (k.rfind("optim.", 0) == 0) os[k.substr(6)] = v;
  model.load_state_dict(model_tensors(t));
  load_optim(os);
  set_rng_state({uint64_t(m.integer("rng_seed")), uint64_t(m.integer("rng_offset"))});
  return meta;
}

std::FILE* open_log(const std::string& path, bool append) {
  if (path.empty()) return nullptr;
  std::FILE* f = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f) fail("train", "cannot write --log-json file '" + path + "'", "");
  return f;
}

void check_micro_batches(int64_t micro_batches, const MemoryBudget& budget) {
  if (micro_batches == 0 && budget.none())
    fail("train", "--micro-batches auto needs --memory-budget (the budget the fewest micro-batches must fit)", "");
}

double train_step(const std::vector<Tensor>& params, const std::vector<Tensor>& batch,
                  const std::function<Tensor(const std::vector<Tensor>&)>& loss_fn, const std::function<void()>& update,
                  const MemoryBudget& budget, int64_t micro_batches) {
  MemoryBudgetScope in_force(budget);
  if (micro_batches == 1) {
    Tensor loss = loss_fn(batch);
    loss.backward();
    update();
    return loss.item();  // runs the step's graph: forward, backward and update together
  }
  optim::AccumulateResult r = optim::accumulate_gradients(params, batch, loss_fn, micro_batches);
  MemoryBudgetScope update_budget(MemoryBudget{r.budget_bytes, 0});
  update();
  sync();
  return r.loss;
}

}  // namespace tessera::cli
