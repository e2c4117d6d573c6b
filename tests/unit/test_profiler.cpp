// The profiler: the Chrome trace is well formed (required fields, nested slices, every Step's
// fused ops naming real primitives and module paths), the op table's rows (with <runtime>) add
// up to the wall time measured outside the profiler, fused Steps are apportioned to their ops by
// the stated rule, and the memory viewer draws every buffer of a plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ir/primitives.h"
#include "runtime/profiler_impl.h"
#include "tessera/memory.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "tessera/profiler.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using clk = std::chrono::steady_clock;

Tensor ids(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s, {DType::Int64, Device("cpu")}); }

// A small GPT training loop: forward, loss, backward, AdamW, one loss.item() per step.
struct Trainer {
  static constexpr int64_t V = 16, T = 16, B = 4;
  nn::GPT gpt;
  optim::AdamW opt;
  int64_t n = 0;
  static nn::GPTConfig config() {
    nn::GPTConfig c;
    c.vocab = V, c.block = T, c.embd = 32, c.heads = 2, c.layers = 2;
    return c;
  }
  Trainer() : gpt((manual_seed(7), config())), opt(gpt.parameters(), {.lr = 1e-2, .weight_decay = 0.1}) {}
  double step() {
    std::vector<int64_t> x(size_t(B * T)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t((i + size_t(n)) % 12), y[i] = int64_t((i + size_t(n) + 1) % 12);
    ++n;
    Tensor loss = gpt.loss(ids(x, {B, T}), ids(y, {B, T}));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss.item();
  }
  // Module paths of the model: every prefix of a parameter's name without its last component.
  std::set<std::string> module_paths() const {
    std::set<std::string> m{""};
    for (auto& [name, t] : gpt.named_parameters()) {
      for (size_t p = name.find('.'); p != std::string::npos; p = name.find('.', p + 1)) m.insert(name.substr(0, p));
    }
    return m;
  }
};

std::set<std::string> primitive_names() {
  std::set<std::string> s;
  for (int i = 0; i < ir::kNumOps; ++i) s.insert(ir::info(ir::Op(i)).name);
  return s;
}

// A scope names a real module when, without its autodiff ".backward" suffixes, it is the root
// module ("GPT"), "GPT." + one of the model's module paths, one of the user scopes the GPT's
// code opens ("loss", "head"), or top level (the optimizer's update).
bool real_scope(const std::string& scope, const std::set<std::string>& modules) {
  std::string s = scope;
  const std::string suffix = ".backward";
  while (s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) s.resize(s.size() - suffix.size());
  if (s.empty() || s == "GPT" || s == "loss" || s == "head" || s == "GPT.head") return true;
  return s.rfind("GPT.", 0) == 0 && modules.count(s.substr(4)) > 0;
}

// Checks that the slices of each track nest: sorted by start (longest first), each slice lies
// inside the open slice on top of the stack or starts after it ends.
::testing::AssertionResult well_nested(const json& events) {
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<double, double>>> tracks;
  for (auto& e : events)
    if (e["ph"] == "X") tracks[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].push_back({e["ts"].get<double>(), e["dur"].get<double>()});
  for (auto& [tid, v] : tracks) {
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> ends;  // open slices' end times
    for (auto& [ts, dur] : v) {
      while (!ends.empty() && ts >= ends.back() - 1e-6) ends.pop_back();
      if (!ends.empty() && ts + dur > ends.back() + 1e-6)
        return ::testing::AssertionFailure() << "track " << tid.second << ": slice [" << ts << ", " << ts + dur
                                             << "] overlaps the end of its parent at " << ends.back();
      ends.push_back(ts + dur);
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(Profiler, ChromeTraceIsWellFormedAndNamesRealOps) {
  Trainer tr;
  Profiler prof;  // from before the first step: the compile shows up too
  for (int i = 0; i < 3; ++i) tr.step();
  prof.stop();
  json trace = json::parse(prof.chrome_trace());
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  const json& events = trace["traceEvents"];
  std::set<std::string> prims = primitive_names(), modules = tr.module_paths();
  int steps = 0, compiles = 0, syncs = 0, runtime = 0, scopes = 0;
  std::set<std::string> seen_scopes;
  for (auto& e : events) {
    SCOPED_TRACE(e.dump());
    for (const char* k : {"name", "ph", "pid", "tid"}) ASSERT_TRUE(e.contains(k)) << "missing " << k;
    ASSERT_TRUE(e["name"].is_string());
    std::string ph = e["ph"];
    ASSERT_TRUE(ph == "X" || ph == "M") << ph;
    if (ph == "M") continue;
    for (const char* k : {"ts", "dur"}) ASSERT_TRUE(e.contains(k) && e[k].is_number() && e[k].get<double>() >= 0) << k;
    ASSERT_TRUE(e.contains("cat"));
    std::string cat = e["cat"];
    if (cat == "compile") {
      ++compiles;
      EXPECT_FALSE(e["args"]["reason"].get<std::string>().empty());
    }
    if (cat == "sync") ++syncs;
    if (cat == "runtime") ++runtime;
    if (cat == "module") {
      ++scopes;
      EXPECT_TRUE(real_scope(e["name"], modules)) << "module slice names no module";
    }
    if (cat != "step") continue;
    ++steps;
    const json& args = e["args"];
    for (const char* k : {"kind", "shape", "graph", "step", "flops", "bytes", "ops"}) ASSERT_TRUE(args.contains(k)) << k;
    ASSERT_TRUE(args["ops"].is_array());
    ASSERT_FALSE(args["ops"].empty()) << "a Step with no fused ops";
    double share = 0;
    for (auto& o : args["ops"]) {
      EXPECT_TRUE(prims.count(o["op"].get<std::string>())) << "not a primitive: " << o["op"];
      EXPECT_TRUE(real_scope(o["scope"], modules)) << "not a module path: " << o["scope"];
      seen_scopes.insert(o["scope"]);
      share += o["share"].get<double>();
    }
    EXPECT_NEAR(share, 1.0, 1e-4);
    // "blocks.1.mlp: matmul+add": the dominant scope, then its ops.
    std::string name = e["name"];
    ASSERT_NE(name.find(": "), std::string::npos);
  }
  EXPECT_GT(steps, 3 * 50) << "three training steps of a 2-layer GPT";
  EXPECT_GE(compiles, 1) << "the first step compiles";
  EXPECT_EQ(syncs, 3) << "one loss.item() per step";
  EXPECT_GT(runtime, 0);
  EXPECT_GT(scopes, 0);
  EXPECT_TRUE(seen_scopes.count("GPT.blocks.1.mlp") && seen_scopes.count("GPT.blocks.1.mlp.fc")) << "scopes should reach into the blocks";
  EXPECT_TRUE(well_nested(events));
}

TEST(Profiler, OpTableRowsAddUpToTheWallTimeMeasuredOutside) {
  Trainer tr;
  tr.step();  // compile outside the profile
  for (int i = 0; i < 3; ++i) {
    auto t0 = clk::now();
    Profiler prof;
    tr.step();
    prof.stop();
    double outside = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    for (const char* g : {"kind", "module", "op"}) {
      SCOPED_TRACE(g);
      std::vector<OpTableRow> rows = prof.op_table(g);
      double sum = 0;
      bool has_runtime = false;
      for (size_t k = 0; k < rows.size(); ++k) {
        sum += rows[k].ms;
        if (k) {
          EXPECT_GE(rows[k - 1].ms, rows[k].ms) << "sorted by time";
        }
        if (rows[k].name == "<runtime>") {
          has_runtime = true;
          EXPECT_GT(rows[k].ms, 0);
          EXPECT_GT(rows[k].calls, 0);
        }
      }
      EXPECT_TRUE(has_runtime);
      EXPECT_NEAR(sum, prof.wall_ms(), 1e-3 * prof.wall_ms()) << "rows cover the profile exactly";
      EXPECT_NEAR(sum, outside, 0.05 * outside) << "the step's wall time measured outside the profiler";
    }
    std::string csv = prof.table_csv();
    EXPECT_EQ(csv.rfind("group,name,ms,calls,flops,bytes,gflops_per_s,gbytes_per_s,percent\n", 0), 0u);
    EXPECT_NE(csv.find("kind,<runtime>,"), std::string::npos);
    EXPECT_NE(csv.find("kind,gemm,"), std::string::npos);
    std::string text = prof.table_text();
    EXPECT_NE(text.find("<runtime> breakdown:"), std::string::npos);
    EXPECT_NE(text.find("by module path"), std::string::npos);
  }
}

// A fused Step's shares are its source ops' flops by their own cost rules: exact for a GEMM with
// an elementwise epilogue (matmul 2mnk, tanh and mul one flop per element each).
TEST(Profiler, FusedStepTimeIsSplitByEachOpsFlops) {
  Tensor x = testing::random_tensor({64, 32}, DType::Float32, 1), w = testing::random_tensor({32, 48}, DType::Float32, 2);
  Tensor y;
  {
    Scope s("mlp");
    y = tanh(matmul(x, w)) * 2.0;
  }
  Profiler prof;
  y.to_vector<float>();
  prof.stop();
  const double mm_flops = 2.0 * 64 * 32 * 48, ew_flops = 64.0 * 48;
  int found = 0;
  for (auto& e : prof.events()) {
    if (e.type != "step" || e.kind != "gemm") continue;
    ++found;
    std::map<std::string, double> share;
    for (auto& o : e.ops) share[o.op] += o.share;
    ASSERT_EQ(share.size(), 3u) << e.name << ": the epilogue's ops are fused into the GEMM";
    EXPECT_DOUBLE_EQ(e.flops, mm_flops + 2 * ew_flops);
    EXPECT_DOUBLE_EQ(share["matmul"], mm_flops / e.flops);
    EXPECT_DOUBLE_EQ(share["tanh"], ew_flops / e.flops);
    EXPECT_DOUBLE_EQ(share["mul"], ew_flops / e.flops);
    EXPECT_EQ(e.scope, "mlp");
    EXPECT_EQ(e.name.rfind("mlp: matmul", 0), 0u) << e.name;
  }
  EXPECT_EQ(found, 1);
  // The op table gives each op exactly its own flops.
  for (const OpTableRow& r : prof.op_table("op")) {
    if (r.name == "matmul @ mlp") {
      EXPECT_DOUBLE_EQ(r.flops, mm_flops);
    } else if (r.name == "tanh @ mlp") {
      EXPECT_DOUBLE_EQ(r.flops, ew_flops);
    }
  }
}

TEST(Profiler, OneAtATimeAndQuietWhenOff) {
  Profiler a;
  EXPECT_TRUE(a.recording());
  EXPECT_TRUE(runtime::prof::on());
  EXPECT_NE(testing::error_message([] { Profiler b; }).find("another tessera::Profiler"), std::string::npos);
  a.stop();
  EXPECT_FALSE(runtime::prof::on());
  size_t n = a.events().size();
  Tensor t = testing::random_tensor({8}) * 3.0;
  t.to_vector<float>();
  EXPECT_EQ(a.events().size(), n) << "nothing is recorded after stop()";
  a.start();  // restart clears
  EXPECT_TRUE(a.events().empty() || a.events().size() < n + 1);
}

TEST(Profiler, MemoryViewerDrawsEveryBuffer) {
  Tensor x = testing::random_tensor({32, 64}, DType::Float32, 1);
  Tensor out;
  {
    Scope s("tower");
    Tensor a = exp(x), b = a * 2.0, c = matmul(b, a.transpose(0, 1));
    out = c.sum();
  }
  MemoryPlan plan = plan_memory({out});
  ASSERT_GT(plan.buffers.size(), 1u);
  std::string html = memory_viewer_html(plan, "test plan");
  size_t rects = 0;
  for (size_t p = 0; (p = html.find("<rect class=\"buf", p)) != std::string::npos; ++p) ++rects;
  EXPECT_EQ(rects, plan.buffers.size()) << "one rect per buffer";
  EXPECT_NE(html.find("id=\"peak\""), std::string::npos) << "the peak is marked";
  EXPECT_NE(html.find("tower"), std::string::npos) << "module paths are in the hover data";
  EXPECT_NE(html.find(plan.report(10).substr(0, 20)), std::string::npos) << "the peak report is on the page";
  EXPECT_EQ(html.find("src=\"http"), std::string::npos) << "self-contained";
  EXPECT_EQ(html.find("href=\"http"), std::string::npos) << "self-contained";
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  out.item();
}

// A hand-built tower: three 128x128 matmuls, each in its own scope; the third runs while the first
// two are still live, so the peak is there and the report names it and its buffers.
TEST(Profiler, PeakReportOfAHandBuiltGraphNamesTheOpAndBuffers) {
  Tensor x = testing::random_tensor({128, 128}, DType::Float32, 3), w = testing::random_tensor({128, 128}, DType::Float32, 4);
  Tensor out;
  {
    Scope tower("tower");
    Tensor a, b, c;
    {
      Scope s("first");
      a = matmul(x, w);
    }
    {
      Scope s("second");
      b = matmul(a, w);
    }
    {
      Scope s("third");
      c = matmul(a, b);
    }
    out = c.sum();
  }
  MemoryPlan plan = plan_memory({out});
  std::string report = plan.report();
  EXPECT_NE(report.find("gemm f32[128, 128]: matmul in tower.third"), std::string::npos) << report;
  for (const char* s : {"temp f32[128, 128] 64.0 KiB matmul in tower.first", "temp f32[128, 128] 64.0 KiB matmul in tower.second",
                        "temp f32[128, 128] 64.0 KiB matmul in tower.third"})
    EXPECT_NE(report.find(s), std::string::npos) << s << "\n" << report;
  std::string html = memory_viewer_html(plan);
  EXPECT_NE(html.find("tower.third"), std::string::npos);
  out.item();
}

}  // namespace
}  // namespace tessera
