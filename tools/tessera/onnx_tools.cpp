// `tessera advise model.onnx` and `tessera profile model.onnx`: the advisor's and the profiler's
// view of an imported ONNX model running inference on one batch (advise --train: forward and
// backward of a stand-in loss). The inputs are made from the model's declared inputs: a dynamic
// first dimension takes --batch, other dynamic dimensions --dim NAME=N (NAME as the file names
// it); floating-point inputs are standard normal (seed 0), integer and bool ones zeros.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tessera/advise.h>
#include <tessera/onnx.h>
#include <tessera/profiler.h>
#include <tessera/tessera.h>

#include "commands.h"
#include "session.h"

namespace tessera::cli {
namespace {

struct ModelInputs {
  std::string model;
  int64_t batch = 1;
  const CLI::Option* batch_flag = nullptr;  // given or not
  std::vector<std::string> dims;            // NAME=N
};

void add_input_flags(CLI::App& cmd, ModelInputs& o, const std::string& what) {
  cmd.add_option("model", o.model, "an ONNX model (.onnx): " + what)->check(CLI::ExistingFile);
  o.batch_flag = cmd.add_option("--batch", o.batch, "with a model: the extent of the inputs' dynamic first dimension (default 1)")
                     ->check(positive());
  cmd.add_option("--dim", o.dims, "with a model: NAME=N, the extent of the inputs' dynamic dimension NAME (as the file names it)");
}

// The inputs of one batch; `samples` receives the first input's first extent.
std::vector<Tensor> example_inputs(const onnx::Model& m, const ModelInputs& o, const Device& device, int64_t* samples) {
  std::map<std::string, int64_t> named;
  for (const std::string& spec : o.dims) {
    size_t eq = spec.find('=');
    int64_t n = 0;
    if (eq != std::string::npos && eq > 0) n = std::atoll(spec.c_str() + eq + 1);
    if (eq == std::string::npos || eq == 0 || !check_number(spec.substr(eq + 1), false).empty() || n < 1 || n > (int64_t(1) << 40))
      throw Error("--dim takes NAME=N with N a positive whole number, not '" + spec + "'");
    named[spec.substr(0, eq)] = n;
  }
  std::map<std::string, bool> used;
  std::vector<Tensor> inputs;
  const bool batch_given = o.batch_flag && o.batch_flag->count() > 0;
  for (const onnx::InputSpec& s : m.input_specs()) {
    if (!s.ranked) throw Error("input '" + s.name + "' declares no shape: no example input can be made for it");
    Shape shape;
    for (size_t d = 0; d < s.dims.size(); ++d) {
      const std::string& name = s.dim_names[d];
      if (s.dims[d] >= 0) {
        if (d == 0 && batch_given && s.dims[0] != o.batch)
          throw Error("input '" + s.name + "' fixes its first dimension at " + std::to_string(s.dims[0]) + ": --batch " +
                      std::to_string(o.batch) + " cannot apply (export the model with a dynamic batch dimension)");
        shape.push_back(s.dims[d]);
      } else if (!name.empty() && named.count(name)) {
        shape.push_back(named[name]);
        used[name] = true;
      } else if (d == 0) {
        shape.push_back(o.batch);
      } else {
        throw Error("input '" + s.name + "' dimension " + std::to_string(d) + (name.empty() ? "" : " ('" + name + "')") +
                    " is dynamic: give its extent with --dim " + (name.empty() ? "NAME" : name) + "=N" +
                    (name.empty() ? " (the file leaves it unnamed, so it cannot be set)" : ""));
      }
    }
    TensorOptions opts{s.dtype, device};
    inputs.push_back(is_floating(s.dtype) ? randn(shape, opts) : zeros(shape, opts));
  }
  for (const auto& [name, n] : named)
    if (!used.count(name)) throw Error("--dim " + name + "=" + std::to_string(n) + ": no input has a dynamic dimension named '" + name + "'");
  *samples = inputs.empty() || inputs[0].dim() == 0 ? 1 : inputs[0].size(0);
  return inputs;
}

std::string describe_inputs(const onnx::Model& m, const std::vector<Tensor>& inputs) {
  std::string s;
  for (size_t k = 0; k < inputs.size(); ++k)
    s += (k ? ", " : "") + m.input_names()[k] + " " + dtype_name(inputs[k].dtype()) + shape_str(inputs[k].shape());
  return s.empty() ? "none" : s;
}

// ---- advise ----------------------------------------------------------------------------------

struct AdviseOnnx {
  ModelInputs in;
  std::string devices = "t4,v100-16,a100-80,h100,tpu-v4-chip,host", device_file;
  bool train = false, json = false;
};

void advise_onnx(const AdviseOnnx& o) {
  std::vector<advise::DeviceSpec> table = advise::builtin_devices();
  if (!o.device_file.empty())
    for (auto& d : advise::load_devices_json(o.device_file)) table.push_back(d);
  std::vector<advise::DeviceSpec> devs;
  for (auto& name : split_commas(o.devices)) devs.push_back(name == "host" ? advise::host_device() : advise::find_device(table, name));
  if (devs.empty()) fail("advise", "--devices names no device", "");

  auto model = onnx::load(o.in.model);  // traced on the cpu, compiled for each device below
  manual_seed(0);
  int64_t samples = 1;
  std::vector<Tensor> inputs = example_inputs(*model, o.in, Device("cpu"), &samples);
  sync();  // the inputs are data, not part of the traced work
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> outs;
  if (o.train) {
    // The training step's forward and backward; the stand-in loss (the sum of the floating-point
    // outputs' means) costs one reduction per output; no optimizer update.
    model->train();
    Tensor loss;
    for (const Tensor& y : model->run(inputs))
      if (is_floating(y.dtype())) loss = loss.defined() ? loss + y.mean() : y.mean();
    if (!loss.defined()) throw Error("--train: the model has no floating-point output to make a loss of");
    loss.backward();
    for (const Tensor& p : model->parameters())
      if (p.grad().defined()) outs.push_back(p.grad());
  } else {
    model->eval();
    NoGradGuard no_grad;
    outs = model->run(inputs);
  }
  const double trace_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<advise::Prediction> preds;
  for (const auto& d : devs) {
    advise::Workload w = advise::workload_of(outs, &d, DType::Float32);
    w.batch = samples;
    w.tokens = double(samples);
    w.trace_s = trace_s;
    preds.push_back(advise::predict(d, w, {}));
  }
  const std::string what = o.train ? "forward and backward (training, no optimizer update)" : "inference";
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.in.model;
    j["opset"] = model->opset();
    j["inputs"] = describe_inputs(*model, inputs);
    j["samples"] = samples;
    j["workload"] = o.train ? "train" : "inference";
    j["devices"] = nlohmann::json::array();
    for (size_t i = 0; i < devs.size(); ++i) {
      const auto& p = preds[i];
      j["devices"].push_back({{"device", devs[i].name}, {"step_s", p.step_s}, {"samples_per_s", p.tokens_per_s},
                              {"peak_bytes", p.peak_bytes}, {"capacity_bytes", p.capacity_bytes}, {"fits", p.fits},
                              {"bottleneck", advise::bottleneck_name(p.bottleneck)}, {"compute_s", p.compute_s},
                              {"memory_s", p.memory_s}, {"launch_s", p.launch_s}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("ONNX model %s (opset %lld): %s of one batch, float32; inputs %s\n", o.in.model.c_str(),
              (long long)model->opset(), what.c_str(), describe_inputs(*model, inputs).c_str());
  std::printf("%-12s %10s %10s %21s %5s %13s\n", "DEVICE", "TIME", "SAMPLES/S", "PEAK / CAPACITY", "FITS", "BOTTLENECK");
  const advise::Prediction* fastest = nullptr;
  for (size_t i = 0; i < devs.size(); ++i) {
    const auto& p = preds[i];
    std::printf("%-12s %10s %10s %21s %5s %13s\n", devs[i].name.c_str(), human_time(p.step_s).c_str(),
                human_rate(p.tokens_per_s).c_str(), (human_bytes(p.peak_bytes) + " / " + human_bytes(p.capacity_bytes)).c_str(),
                p.fits ? "yes" : "NO", advise::bottleneck_name(p.bottleneck));
    if (p.fits && (!fastest || p.step_s < fastest->step_s)) fastest = &p;
  }
  std::printf("Memory: the model's weights, the batch and what the graph allocates, on one device.\n");
  if (fastest)
    std::printf("\nFastest: %s at %s samples/s (%s per batch, bound by %s).\n", fastest->device.c_str(),
                human_rate(fastest->tokens_per_s).c_str(), human_time(fastest->step_s).c_str(),
                advise::bottleneck_name(fastest->bottleneck));
  else
    std::printf("\nNo device fits this batch: lower --batch.\n");
}

// ---- profile ---------------------------------------------------------------------------------

struct ProfileOnnx {
  ModelInputs in;
  std::string device = "cpu", trace, table, text, memory;
  int64_t runs = 3, skip = 1;
};

void profile_onnx(const ProfileOnnx& o) {
  Device device(o.device);
  auto model = onnx::load(o.in.model, {device});
  model->eval();
  NoGradGuard no_grad;
  manual_seed(0);
  int64_t samples = 1;
  std::vector<Tensor> inputs = example_inputs(*model, o.in, device, &samples);
  sync();
  auto once = [&] {
    std::vector<Tensor> ys = model->run(inputs);
    sync();
  };
  for (int64_t i = 0; i < o.skip; ++i) once();  // the first run compiles
  Profiler prof(false);
  prof.start();
  for (int64_t i = 0; i < o.runs; ++i) once();
  prof.stop();
  MemoryPlan plan = last_memory_plan();
  if (!o.trace.empty()) prof.write_chrome_trace(o.trace);
  if (!o.table.empty()) prof.write_table_csv(o.table);
  std::string text = prof.table_text();
  if (!o.text.empty()) write_text(o.text, text);
  if (!o.memory.empty()) write_memory_viewer(o.memory, plan, "tessera memory plan: " + o.in.model + " inference");
  std::printf("ONNX model %s (opset %lld) on %s: inference, inputs %s\n\n%s\n", o.in.model.c_str(), (long long)model->opset(),
              o.device.c_str(), describe_inputs(*model, inputs).c_str(), text.c_str());
  std::printf("profiled runs %lld-%lld: %.3f ms wall (%.3f ms per run, %s samples/s)\n\n", (long long)(o.skip + 1),
              (long long)(o.skip + o.runs), prof.wall_ms(), prof.wall_ms() / double(o.runs),
              human_rate(double(samples * o.runs) / (prof.wall_ms() / 1e3)).c_str());
  std::printf("memory plan of the inference graph:\n%s", plan.report().c_str());
  for (auto& [what, path] : {std::pair<const char*, std::string>{"trace", o.trace}, {"op table (CSV)", o.table},
                             {"op table (text)", o.text}, {"memory viewer", o.memory}})
    if (!path.empty()) std::printf("%s: %s\n", what, path.c_str());
  std::fflush(stdout);
}

}  // namespace

void add_advise_onnx(CLI::App& adv) {
  auto o = std::make_shared<AdviseOnnx>();
  adv.require_subcommand(0, 1);
  add_input_flags(adv, o->in, "predicted time and memory of one batch's inference");
  adv.add_option("--devices", o->devices, "with a model: comma-separated devices (as for `advise gpt`, host included)")
      ->capture_default_str();
  adv.add_option("--device-file", o->device_file, "with a model: JSON file of more devices");
  adv.add_flag("--train", o->train, "with a model: the training step's forward and backward instead (stand-in loss: the "
                                    "sum of the outputs' means; no optimizer update)");
  adv.add_flag("--json", o->json, "with a model: print JSON instead of a table");
  adv.callback([o, &adv] {
    if (!adv.get_subcommands().empty()) return;  // `advise gpt` ran
    if (o->in.model.empty()) throw Error("advise: give a model: gpt, or an ONNX file (tessera advise model.onnx --batch N)");
    advise_onnx(*o);
  });
}

void add_profile_onnx(CLI::App& profile) {
  auto o = std::make_shared<ProfileOnnx>();
  profile.require_subcommand(0, 1);
  add_input_flags(profile, o->in, "profile its inference on one batch");
  profile.add_option("--device", o->device, "with a model: where it runs (see `tessera devices`)")->capture_default_str();
  profile.add_option("--runs", o->runs, "with a model: inference runs profiled")->capture_default_str()->check(positive());
  profile.add_option("--skip", o->skip, "with a model: runs before profiling starts (1 leaves the compile out)")
      ->capture_default_str()
      ->check(non_negative());
  profile.add_option("--trace", o->trace, "with a model: write the Chrome trace to FILE");
  profile.add_option("--table", o->table, "with a model: write the op table as CSV to FILE");
  profile.add_option("--table-text", o->text, "with a model: write the op table as text to FILE");
  profile.add_option("--memory", o->memory, "with a model: write the memory viewer of the inference graph to FILE");
  auto metrics = add_metrics_flag(profile);
  profile.callback([o, metrics, &profile] {
    if (!profile.get_subcommands().empty()) return;  // `profile gpt` ran
    if (o->in.model.empty()) throw Error("profile: give a model: gpt, or an ONNX file (tessera profile model.onnx)");
    profile_onnx(*o);
    print_metrics(*metrics);
  });
}

}  // namespace tessera::cli
