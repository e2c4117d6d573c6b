// The StableHLO emitter against an independent engine: every case of the conformance suite's
// primitive and composite rows and its random graphs, forward and gradient, plus the benchmark
// GPT's training step, is traced on the cpu backend, emitted as StableHLO, run under jax
// (XLA's CPU compiler, build/pyenv from scripts/pyenv) with the same inputs and RNG state, and
// compared with the cpu backend's results: within twice the suite's tolerances against the
// float64 reference (both sides err), exactly for integers, bools, movement ops and RNG.
// Out-of-range gather/scatter indices: the check results raise the cpu backend's error.
// All cases run in one Python process (run_cases.py). Under CI=true a missing jax fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backends/stablehlo/emit.h"
#include "conformance/suite.h"
#include "ir/build.h"
#include "tensor/tensor_impl.h"
#include "test_util.h"
#include "tessera/nn.h"
#include "tessera/optim.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using conformance::Case;

void write_file(const fs::path& p, const void* data, size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(n));
}

// Cases written to a directory for run_cases.py: per case the module, the parameters' bytes,
// the RNG state and the cpu backend's results (float64), with their tolerances.
class Dump {
 public:
  explicit Dump(fs::path dir) : dir_(std::move(dir)) {}

  // Emits the graph of `results` (traced, not yet run), then syncs and records the cpu values.
  void add(const std::string& name, const std::vector<Tensor>& results, const std::vector<double>& tols,
           bool expect_index_error = false) {
    std::vector<ir::NodePtr> nodes;
    for (const Tensor& t : results) nodes.push_back(detail::node_of(t));
    ir::Graph g = ir::build_graph(nodes);
    stablehlo::Program p = stablehlo::emit(g);
    const std::string id = "c" + std::to_string(cases_.size());
    write_file(dir_ / (id + ".mlir"), p.text.data(), p.text.size());
    json c{{"id", id}, {"name", name}, {"outputs", json::array()}, {"params", json::array()}, {"checks", p.index_checks.size()}};
    for (size_t k = 0; k < g.params.size(); ++k) {
      const ir::Node& n = *g.nodes[size_t(g.params[k])];
      std::string f = id + ".p" + std::to_string(k);
      write_file(dir_ / f, n.buffer->data, size_t(n.numel()) * itemsize(n.dtype));
      c["params"].push_back({{"file", f}, {"dtype", dtype_name(n.dtype)}, {"shape", n.shape}});
    }
    RngState rs = detail::rng_state();
    if (p.rng) c["rng"] = {rs.seed, rs.offset};
    g = ir::Graph{};
    nodes.clear();
    programs_.push_back(p);
    if (expect_index_error) {
      expected_errors_[id] = testing::error_message([] { sync(); });
      c["outputs_skipped"] = true;
    } else {
      sync();
      for (size_t k = 0; k < results.size(); ++k) {
        std::vector<double> v = results[k].to_vector<double>();
        std::string f = id + ".o" + std::to_string(k);
        write_file(dir_ / f, v.data(), v.size() * sizeof(double));
        c["outputs"].push_back({{"file", f}, {"dtype", dtype_name(results[k].dtype())}, {"shape", results[k].shape()}, {"tol", tols[k]}});
      }
    }
    cases_.push_back(c);
  }
  void finish() const { std::ofstream(dir_ / "cases.json") << cases_.dump(); }
  size_t size() const { return cases_.size(); }
  const json& at(size_t i) const { return cases_[i]; }
  const stablehlo::Program& program(size_t i) const { return programs_[i]; }
  const std::map<std::string, std::string>& expected_errors() const { return expected_errors_; }

 private:
  fs::path dir_;
  json cases_ = json::array();
  std::vector<stablehlo::Program> programs_;
  std::map<std::string, std::string> expected_errors_;
};

// Traces one conformance case on the cpu (inputs as the suite draws them, a random cotangent
// for the gradients) and adds it to the dump.
void add_case(Dump& d, const std::string& row, const Case& c) {
  uint32_t seed = 2166136261u;
  for (char ch : row + "/" + c.variant) seed = (seed ^ uint8_t(ch)) * 16777619u;
  conformance::Rng rng(seed);
  conformance::Context ctx{Device("cpu"), [](const std::vector<double>& v, const Shape& s, DType t) {
                             return testing::make_tensor(v, s, t);
                           }};
  auto [leaves, viewed] = conformance::make_inputs(c, ctx, rng);
  std::vector<Tensor> results = c.fn(viewed, ctx);
  std::vector<double> tols;
  auto tol_of = [&](DType t, bool grad) {
    if (!is_floating(t)) return 0.0;
    double given = grad ? c.grad_tol : c.tol;
    return given >= 0 ? 2 * given : 2 * conformance::default_tolerance(t, grad);
  };
  const bool bit_exact = row == "rng";  // the generator written out in integer ops
  for (const Tensor& r : results) tols.push_back(bit_exact ? 0 : tol_of(r.dtype(), false));
  const size_t n_out = results.size();
  for (size_t k = 0; k < n_out; ++k)
    if (results[k].requires_grad()) {
      std::vector<double> w(size_t(results[k].numel()));
      for (double& x : w) x = std::uniform_real_distribution<double>(-1, 1)(rng);
      results[k].backward(ctx.leaf(w, results[k].shape(), results[k].dtype()));
    }
  for (size_t k = 0; k < c.inputs.size(); ++k)
    if (c.inputs[k].grad && leaves[k].grad().defined()) {
      results.push_back(leaves[k].grad());
      tols.push_back(tol_of(results.back().dtype(), true));
    }
  d.add(row + " / " + c.variant, results, tols);
}

// The benchmark GPT's steady-state training step (bench/gpt_step.cpp's model and optimizer):
// one step realizes AdamW's moments, the second is the case (loss and updated parameters).
void add_gpt_step(Dump& d) {
  manual_seed(0);
  nn::GPT model({.vocab = 114, .block = 64, .embd = 128, .heads = 4, .layers = 4, .dropout = 0.0, .bias = true, .tied_head = false});
  model.train();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  std::mt19937 r(7);
  for (int step = 0; step < 2; ++step) {
    std::vector<int64_t> x(16 * 64), y(16 * 64);
    for (auto& v : x) v = int64_t(r() % 114);
    for (auto& v : y) v = int64_t(r() % 114);
    TensorOptions ids{DType::Int64, Device("cpu")};
    Tensor loss = model.loss(from_vector(x, {16, 64}, ids), from_vector(y, {16, 64}, ids));
    loss.backward();
    opt.step();
    opt.zero_grad();
    if (step == 0) {
      loss.item();
      continue;
    }
    std::vector<Tensor> outs{loss};
    std::vector<double> tols{1e-4};
    for (const Tensor& p : model.parameters()) outs.push_back(p), tols.push_back(1e-4);
    d.add("gpt training step", outs, tols);
  }
}

// Without jax: what the text says about scopes, donations, the RNG argument and index checks.
TEST(StableHLO, TextCarriesScopesAliasesAndTheRngArgument) {
  Tensor a = testing::make_tensor({1, 2, 3, 4}, {2, 2});
  Tensor b = testing::make_tensor({0, 1, 1, 0}, {2, 2}, DType::Int64);
  Tensor y, z;
  {
    Scope s("blocks.0.mlp");
    y = exp(a) + rand({2, 2});
    z = gather(a, 1, b);
  }
  ir::Graph g = ir::build_graph({detail::node_of(y), detail::node_of(z)});
  stablehlo::Program p = stablehlo::emit(g, {{{0, 1}}});
  EXPECT_NE(p.text.find("loc(\"blocks.0.mlp\")"), std::string::npos) << p.text;
  EXPECT_NE(p.text.find("func.func public @main(%arg0: tensor<2x2xf32> {tf.aliasing_output = 1 : i32}, %arg1: tensor<2x2xi64>, %rng: tensor<2xui64>)"),
            std::string::npos) << p.text;
  EXPECT_TRUE(p.rng);
  EXPECT_EQ(p.outputs, 2);
  ASSERT_EQ(p.index_checks.size(), 1u);
  EXPECT_EQ(p.index_checks[0].scope, "blocks.0.mlp");
  EXPECT_NO_THROW(stablehlo::raise_index_errors(p, {-1, 0}));
  EXPECT_EQ(testing::error_message([&] { stablehlo::raise_index_errors(p, {3, 7}); }),
            "[gather] index 7 out of range [0, 2) along dimension 1 of a tensor of shape [2, 2] (in scope 'blocks.0.mlp')");
  EXPECT_THROW(stablehlo::emit(g, {{{1, 0}}}), Error);  // int64[2, 2] cannot alias float32[2, 2]
  EXPECT_THROW(stablehlo::emit(g, {{{0, 5}}}), Error);
  EXPECT_THROW(stablehlo::emit(g, {{{0, 0}, {0, 1}}}), Error);  // one buffer donated twice
}

// `tessera export --stablehlo gpt`: the module and the files another engine runs it from
// (bench/stablehlo_vs_cpu.sh runs them under jax); an unknown model is a one-line error.
TEST(StableHLO, ExportCommandWritesTheGptStep) {
  fs::path dir = testing::scratch_dir("stablehlo_export");
  std::string out = (dir / "step.mlir").string();
  ASSERT_EQ(std::system((std::string(TESSERA_CLI) + " export --stablehlo gpt --out " + out + " --steps 2 > " +
                         (dir / "log.txt").string() + " 2>&1").c_str()), 0);
  std::ifstream f(out);
  std::string text((std::istreambuf_iterator<char>(f)), {});
  json meta = json::parse(std::ifstream(out + ".json"));
  const json& args = meta["arguments"];
  size_t fed = 0;
  int64_t bytes = 0;
  for (const json& a : args) {
    fed += a["fed_from_output"].get<int>() >= 0;
    bytes += a["initial"]["bytes"].get<int64_t>();
  }
  EXPECT_EQ(args.size(), 164u);  // 53 parameters, their 2 x 53 moments, 2 token batches, 3 AdamW scalars
  EXPECT_EQ(fed, 159u);
  EXPECT_EQ(meta["outputs"].get<int>(), 160);  // the loss, then the updated parameters and moments
  EXPECT_EQ(meta["steps"].size(), 2u);
  EXPECT_EQ(meta["steps"][1]["arguments"].size(), 5u);  // given per step: tokens and scalars
  EXPECT_GE(int64_t(fs::file_size(out + ".bin")), bytes);
  size_t aliased = 0;
  for (size_t at = text.find("tf.aliasing_output"); at != std::string::npos; at = text.find("tf.aliasing_output", at + 1)) ++aliased;
  EXPECT_EQ(aliased, 159u);
  EXPECT_NE(text.find("loc(\"GPT.blocks.3.attn\")"), std::string::npos);
  EXPECT_NE(std::system((std::string(TESSERA_CLI) + " export --stablehlo mlp --out " + out + " > " + (dir / "err.txt").string() + " 2>&1").c_str()), 0);
  std::ifstream ef(dir / "err.txt");
  std::string err((std::istreambuf_iterator<char>(ef)), {});
  EXPECT_NE(err.find("[export] unknown model 'mlp' (known: gpt)"), std::string::npos) << err;
  if (!HasFailure()) fs::remove_all(dir);
}

fs::path pyenv_python() { return fs::path(TESSERA_BUILD_DIR) / "pyenv" / "bin" / "python"; }

TEST(StableHLO, MatchesTheCpuBackendUnderJax) {
  fs::path py = pyenv_python();
  if (!fs::exists(py)) {
    if (testing::in_ci()) FAIL() << "jax is missing: " << py << " (scripts/pyenv installs it)";
    GTEST_SKIP() << "jax not installed (" << py << "; run scripts/pyenv)";
  }
  fs::path dir = testing::scratch_dir("stablehlo");
  Dump d(dir);
  for (int op = 0; op < ir::kNumOps; ++op) {
    // RNG with a seed and a stream (offset + draw) that use all 64 bits of their words.
    if (ir::Op(op) == ir::Op::Rng) set_rng_state({0x9E3779B97F4A7C15ull, (1ull << 32) - 3});
    // Collectives need several replicas: test_pjrt's PjrtCollectives runs their cases on XLA's CPU plugin.
    if (ir::is_collective(ir::Op(op))) continue;
    for (const Case& c : conformance::primitive_cases(ir::Op(op))) add_case(d, ir::op_name(ir::Op(op)), c);
  }
  const size_t primitive_count = d.size();
  for (const conformance::Row& row : conformance::composite_rows())
    for (const Case& c : row.cases()) add_case(d, row.name, c);
  for (const Case& c : conformance::random_graph_cases()) add_case(d, conformance::kRandomGraphsRow, c);
  add_gpt_step(d);
  // An out-of-range gather index: XLA clamps it; the check output raises the cpu's error.
  {
    Tensor src = testing::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor idx = testing::make_tensor({0, 2, 1, 0, 3, 1}, {2, 3}, DType::Int64);
    d.add("gather out of range", {gather(src, 1, idx)}, {0}, true);
  }
  d.finish();

  auto t0 = std::chrono::steady_clock::now();
  std::string cmd = py.string() + " " + TESSERA_SOURCE_DIR + "/tests/stablehlo/run_cases.py " + dir.string() + " > " +
                    (dir / "log.txt").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream lf(dir / "log.txt");
  std::string log((std::istreambuf_iterator<char>(lf)), {});
  ASSERT_EQ(rc, 0) << log;
  json results = json::parse(std::ifstream(dir / "results.json"));
  size_t passed = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    const json& c = d.at(i);
    const json& r = results.at(c["id"].get<std::string>());
    EXPECT_TRUE(r["ok"].get<bool>()) << c["name"].get<std::string>() << ": " << r["detail"].get<std::string>();
    passed += r["ok"].get<bool>();
    auto err = d.expected_errors().find(c["id"].get<std::string>());
    std::vector<int64_t> checks = r["checks"].get<std::vector<int64_t>>();
    if (err == d.expected_errors().end()) {
      EXPECT_NO_THROW(stablehlo::raise_index_errors(d.program(i), checks)) << c["name"].get<std::string>();
    } else {
      EXPECT_EQ(testing::error_message([&] { stablehlo::raise_index_errors(d.program(i), checks); }), err->second);
    }
  }
  std::printf("stablehlo: %zu cases (%zu primitive), %zu match the cpu backend under jax; jax ran them in %.1f s\n",
              d.size(), primitive_count, passed, secs);
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
