// `tessera export --stablehlo gpt --out step.mlir [--steps N]`: the benchmark GPT's training step
// (bench/gpt_step.cpp's model: vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16, AdamW)
// as a StableHLO module. One step runs first on the cpu so AdamW's moments exist: the module is
// the steady-state step, whose results are the loss, then the parameters and moments it updates
// in place (their old buffers donated: tf.aliasing_output). Beside it, <out>.json describes the
// arguments and <out>.bin holds their values, so another engine can run N steps
// (bench/stablehlo_jax.py): the aliased arguments are fed back from their outputs, the others
// (token batches, AdamW's step-dependent scalars) are given per step, with the cpu's losses.
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <tessera/export.h>
#include <tessera/tessera.h>

#include "commands.h"

namespace tessera::cli {
namespace {

struct ExportOptions {
  bool stablehlo = false;
  std::string model, out;
  int64_t steps = 1;
};

// A realized tensor's bytes as stored (row-major, the dtype's width).
std::string raw_bytes(const Tensor& t) {
  auto pack = [](const auto& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])); };
  switch (t.dtype()) {
    case DType::Float32: return pack(t.to_vector<float>());
    case DType::Float64: return pack(t.to_vector<double>());
    case DType::Int64: return pack(t.to_vector<int64_t>());
    case DType::Int32: return pack(t.to_vector<int32_t>());
    default: throw Error(std::string("[export] arguments of dtype ") + dtype_name(t.dtype()) + " are not written");
  }
}

uint64_t next_random(uint64_t& s) {  // splitmix64: the token batches
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void run_export(const ExportOptions& o) {
  if (!o.stablehlo) throw Error("[export] give the format: --stablehlo");
  if (o.model != "gpt") throw Error("[export] unknown model '" + o.model + "' (known: gpt)");
  manual_seed(0);
  nn::GPT model({.vocab = 114, .block = 64, .embd = 128, .heads = 4, .layers = 4, .dropout = 0.0, .bias = true, .tied_head = false});
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  uint64_t seed = 1234;
  nlohmann::json meta{{"model", "gpt"}, {"arguments", nlohmann::json::array()}, {"steps", nlohmann::json::array()}};
  std::ofstream bin(o.out + ".bin", std::ios::binary);
  int64_t offset = 0;
  auto put = [&](const Tensor& t) {
    std::string b = raw_bytes(t);
    bin.write(b.data(), std::streamsize(b.size()));
    nlohmann::json at{{"offset", offset}, {"bytes", b.size()}};
    offset += int64_t(b.size());
    return at;
  };
  for (int64_t step = 0; step <= o.steps; ++step) {
    std::vector<int64_t> x, y;
    for (int64_t i = 0; i < 16 * 64; ++i) x.push_back(int64_t(next_random(seed) % 114));
    for (int64_t i = 0; i < 16 * 64; ++i) y.push_back(int64_t(next_random(seed) % 114));
    TensorOptions ids{DType::Int64, Device("cpu")};
    Tensor loss = model.loss(from_vector(x, {16, 64}, ids), from_vector(y, {16, 64}, ids));
    loss.backward();
    opt.step();
    opt.zero_grad();
    if (step == 0) {  // realizes AdamW's moments: the later steps are the steady state
      loss.item();
      continue;
    }
    std::vector<Tensor> outs{loss};
    for (const Tensor& p : model.parameters()) outs.push_back(p);
    for (auto& [name, t] : opt.state_dict())
      if (!t.is_realized()) outs.push_back(t);
    StableHLOModule m = export_stablehlo(outs);
    std::vector<int> fed(m.arguments.size(), -1);
    for (auto [a, out] : m.aliases) fed[size_t(a)] = out;
    nlohmann::json given = nlohmann::json::object();
    for (size_t a = 0; a < m.arguments.size(); ++a) {
      const Tensor& t = m.arguments[a];
      if (step == 1) {
        meta["arguments"].push_back({{"shape", t.shape()}, {"dtype", dtype_name(t.dtype())}, {"fed_from_output", fed[a]}, {"initial", put(t)}});
      } else if (fed[a] < 0) {
        given[std::to_string(a)] = put(t);
      }
    }
    if (step == 1) {
      std::ofstream(o.out) << m.text;
      meta["outputs"] = m.outputs;
      meta["rng"] = m.rng;
      meta["index_checks"] = m.index_checks;
    }
    meta["steps"].push_back({{"arguments", given}, {"cpu_loss", loss.item()}});
    m = StableHLOModule{};
  }
  std::ofstream(o.out + ".json") << meta.dump(1);
  std::printf("wrote %s (@main: %zu arguments, %d outputs), %s.json and %s.bin (%lld steps' inputs and cpu losses)\n",
              o.out.c_str(), meta["arguments"].size(), int(meta["outputs"]), o.out.c_str(), o.out.c_str(), (long long)o.steps);
}

}  // namespace

void add_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  CLI::App* sub = app.add_subcommand("export", "Write a model's training step as a program for another compiler");
  sub->add_flag("--stablehlo", o->stablehlo, "as a StableHLO module (MLIR text) that XLA's PJRT plugins and jax compile")->required();
  sub->add_option("model", o->model, "the model: gpt (the benchmark GPT's training step with AdamW)")->required();
  sub->add_option("--out", o->out, "the .mlir file to write (also <out>.json and <out>.bin)")->required();
  sub->add_option("--steps", o->steps, "steps whose inputs and cpu losses go into <out>.json/.bin")->check(positive());
  sub->callback([o] { run_export(*o); });
}

}  // namespace tessera::cli
