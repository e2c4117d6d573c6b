// `tessera run model.onnx --input name=file.npy ... --device D`: runs an imported ONNX model on
// NumPy .npy (or ONNX TensorProto .pb) inputs and writes each output as <name>.npy (or .pb) in
// --output-dir, printing one line per output (name, dtype, shape).
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <tessera/io.h>
#include <tessera/onnx.h>
#include <tessera/tessera.h>

#include "commands.h"

namespace tessera::cli {
namespace {

struct RunOptions {
  std::string model, device = "cpu", output_dir, format = "npy";
  std::vector<std::string> inputs;
  bool metrics = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Tensor read_input(const std::string& file, const Device& d) {
  if (ends_with(file, ".npy")) return io::load_npy(file, d);
  if (ends_with(file, ".pb")) return onnx::load_tensor(file, nullptr, d);
  throw Error("input file '" + file + "' is neither .npy nor .pb (an ONNX TensorProto)");
}

// A file name for an output: ONNX names may hold '/' or ':'.
std::string file_name(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) c = '_';
  return s.empty() || s[0] == '.' ? "output" + s : s;
}

void run_model(const RunOptions& o) {
  Device device(o.device);
  auto model = onnx::load(o.model, {device});
  model->eval();
  NoGradGuard no_grad;
  const auto& names = model->input_names();
  std::map<std::string, Tensor> inputs;
  size_t positional = 0;
  for (const std::string& spec : o.inputs) {
    size_t eq = spec.find('=');
    std::string name, file = spec;
    if (eq != std::string::npos) {
      name = spec.substr(0, eq);
      file = spec.substr(eq + 1);
    } else {
      if (positional >= names.size()) throw Error("more --input files than the model's " + std::to_string(names.size()) + " inputs");
      name = names[positional++];
    }
    if (inputs.count(name)) throw Error("input '" + name + "' is given twice");
    inputs[name] = read_input(file, device);
  }
  for (const std::string& n : names)
    if (!inputs.count(n)) {
      std::string all;
      for (const std::string& m : names) all += (all.empty() ? "" : ", ") + m;
      throw Error("input '" + n + "' is not given (the model's inputs: " + all + "; use --input NAME=FILE.npy)");
    }
  std::map<std::string, Tensor> out = model->run_named(inputs);
  if (!o.output_dir.empty()) std::filesystem::create_directories(o.output_dir);
  for (const std::string& name : model->output_names()) {
    const Tensor& t = out.at(name);
    std::string line = name + ": " + dtype_name(t.dtype()) + shape_str(t.shape());
    if (!o.output_dir.empty()) {
      std::string path = (std::filesystem::path(o.output_dir) / (file_name(name) + "." + o.format)).string();
      if (o.format == "npy") io::save_npy(path, t);
      else onnx::save_tensor(path, t, name);
      line += " -> " + path;
    }
    std::printf("%s\n", line.c_str());
  }
  print_metrics(o.metrics);
}

}  // namespace

void add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "Run an ONNX model on .npy or .pb inputs, writing its outputs");
  sub->add_option("model", o->model, "the model (.onnx)")->required()->check(CLI::ExistingFile);
  sub->add_option("--input,-i", o->inputs, "NAME=FILE (.npy or TensorProto .pb), or FILE for the next input in order");
  sub->add_option("--device", o->device, "where the model runs (see `tessera devices`)");
  sub->add_option("--output-dir,-o", o->output_dir, "write each output to DIR/<name>.npy (or .pb)");
  sub->add_option("--format", o->format, "output file format")->check(CLI::IsMember({"npy", "pb"}));
  auto metrics = add_metrics_flag(*sub);
  sub->callback([o, metrics] {
    o->metrics = *metrics;
    run_model(*o);
  });
}

}  // namespace tessera::cli
