// Compile-pipeline dumps (TESSERA_DUMP, TESSERA_DUMP_DIR, read by runtime/compile_options.cpp;
// compiler/dump.h writes them). The environment is read once, at the first compile, so this
// binary sets it during static initialization, before any test runs: every stage, into a
// directory that does not exist yet.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "compiler/dump.h"
#include "runtime/compile_options.h"
#include "test_util.h"
#include "tessera/tessera.h"

namespace ts = tessera;
namespace fs = std::filesystem;

namespace {

fs::path scratch_root() {
  static const fs::path p = fs::temp_directory_path() / ("tessera-dump-test." + std::to_string(getpid()));
  return p;
}
fs::path dump_dir() { return scratch_root() / "dumps" / "nested"; }

// Nothing is created here (test discovery runs this binary too); the dump creates the directory.
const bool g_env_set = [] {
  setenv("TESSERA_DUMP", "ir,fused,plan", 1);
  setenv("TESSERA_DUMP_DIR", dump_dir().c_str(), 1);
  return true;
}();

class RemoveScratch : public ::testing::Environment {
 public:
  void TearDown() override {
    if (std::getenv("TESSERA_DUMP_TEST_KEEP")) return;
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
};
const auto* g_cleanup = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

std::set<std::string> files_in(const fs::path& d) {
  std::set<std::string> r;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(d, ec)) r.insert(e.path().filename().string());
  return r;
}
std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// exp(x) + 1 summed, in scope "probe": an elementwise part and a reduction.
double run_probe(float scale = 1) {
  ts::Tensor x = ts::from_vector<float>({0.f, 1.f * scale, 2.f, 3.f, 4.f, 5.f}, {2, 3});
  ts::Tensor total;
  {
    ts::Scope s("probe");
    total = (x.exp() + 1).sum({1}).sum();  // the intermediates die here: one graph output
  }
  return total.item();
}

}  // namespace

TEST(DumpEnv, EveryStageOfEachCompiledGraphGoesToItsOwnNumberedFiles) {
  ASSERT_TRUE(g_env_set);
  std::set<std::string> before = files_in(dump_dir());
  run_probe();
  std::set<std::string> after = files_in(dump_dir());
  ASSERT_TRUE(fs::is_directory(dump_dir())) << "TESSERA_DUMP_DIR should be created";
  std::set<std::string> added;
  for (auto& f : after)
    if (!before.count(f)) added.insert(f);
  ASSERT_EQ(added.size(), 4u) << "one graph compiled: ir, ir-opt, fused, plan";
  std::string stem = added.begin()->substr(0, std::string("graph-0000").size());
  ASSERT_EQ(stem.rfind("graph-", 0), 0u) << stem;
  for (const char* stage : {"ir", "ir-opt", "fused", "plan"})
    EXPECT_TRUE(added.count(stem + "." + stage + ".txt")) << stem << "." << stage << ".txt missing";

  std::string ir = read(dump_dir() / (stem + ".ir.txt"));
  EXPECT_TRUE(contains(ir, "exp(")) << ir;
  EXPECT_TRUE(contains(ir, "reduce_sum(")) << ir;
  EXPECT_TRUE(contains(ir, "# probe")) << ir;
  EXPECT_TRUE(contains(read(dump_dir() / (stem + ".ir-opt.txt")), "exp("));

  std::string fused = read(dump_dir() / (stem + ".fused.txt"));
  EXPECT_TRUE(contains(fused, "step 0: ")) << fused;
  EXPECT_TRUE(contains(fused, "exp@probe")) << fused;
  EXPECT_TRUE(contains(fused, "reduce_sum@probe")) << fused;
  EXPECT_TRUE(contains(fused, "sources (")) << fused;
  EXPECT_TRUE(contains(fused, "program (")) << fused;
  EXPECT_TRUE(contains(fused, " load ")) << fused;
  EXPECT_TRUE(contains(fused, " exp %")) << fused;
  EXPECT_TRUE(contains(fused, "map view(")) << fused;
  // The fused row reduction (with fusion off: a Reduce Step).
  EXPECT_TRUE(contains(fused, "rows of 3 positions") || contains(fused, "reduce reduce_sum over axes")) << fused;
  EXPECT_TRUE(contains(fused, " row_sum %") || contains(fused, "reduce reduce_sum over axes")) << fused;

  std::string plan = read(dump_dir() / (stem + ".plan.txt"));
  EXPECT_TRUE(contains(plan, "slot 0: param 0 f32[2, 3] 24 B from parameter")) << plan;
  EXPECT_TRUE(contains(plan, "output 0 f32[] ")) << plan;
  EXPECT_TRUE(contains(plan, "@probe")) << plan;
  EXPECT_TRUE(contains(plan, "arena: ")) << plan;
  EXPECT_TRUE(contains(plan, "memory peak: ")) << plan;
  EXPECT_TRUE(contains(plan, "live slots:")) << plan;

  // The next compiled graph gets the next number; a cache hit writes nothing.
  run_probe(2);  // same structure: a hit
  EXPECT_EQ(files_in(dump_dir()).size(), after.size());
  ts::Tensor y = ts::from_vector<float>({1, 2, 3}, {3});
  (y * 2).to_vector<float>();
  int next = std::stoi(stem.substr(6)) + 1;
  char buf[32];
  std::snprintf(buf, sizeof buf, "graph-%04d", next);
  EXPECT_TRUE(fs::exists(dump_dir() / (std::string(buf) + ".plan.txt"))) << buf;
}

TEST(DumpConfig, WithoutADirectoryStagesGoToStandardError) {
  ts::runtime::set_dump_config("fused", "");
  ::testing::internal::CaptureStderr();
  ts::Tensor x = ts::from_vector<float>({1, 2, 3, 4}, {4});
  (x.tanh() * 3).to_vector<float>();
  std::string err = ::testing::internal::GetCapturedStderr();
  ts::runtime::clear_dump_config();
  EXPECT_TRUE(contains(err, "==== tessera dump: graph 1, fused ====")) << err;
  EXPECT_TRUE(contains(err, " tanh %")) << err;
  EXPECT_FALSE(contains(err, ", ir ====")) << err;
  EXPECT_FALSE(contains(err, ", plan ====")) << err;
}

TEST(DumpConfig, NoStagesWriteNothing) {
  fs::path d = scratch_root() / "none";
  ts::runtime::set_dump_config("0", d.string());
  ts::Tensor x = ts::from_vector<float>({1, 2}, {2});
  (x - 7).to_vector<float>();
  ts::runtime::clear_dump_config();
  EXPECT_FALSE(fs::exists(d));
}

TEST(DumpConfig, AWriteErrorNamesThePath) {
  fs::create_directories(scratch_root());
  fs::path blocker = scratch_root() / "a-file";
  std::ofstream(blocker) << "not a directory";
  std::string dir = (blocker / "sub").string();
  ts::runtime::set_dump_config("plan", dir);
  ts::Tensor x = ts::from_vector<float>({1, 2}, {2});
  ts::Tensor y = x * 11;
  std::string msg = ts::testing::error_message([&] { ts::sync(); });
  ts::runtime::clear_dump_config();
  EXPECT_TRUE(contains(msg, dir)) << msg;
  EXPECT_TRUE(contains(msg, "[dump]")) << msg;
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{11, 22})) << "the graph runs once dumps work again";
}

TEST(DumpConfig, UnknownStageIsAnError) {
  std::string msg = ts::testing::error_message([] { ts::runtime::set_dump_config("ir,fusd", ""); });
  EXPECT_TRUE(contains(msg, "unknown stage 'fusd'")) << msg;
  ts::runtime::clear_dump_config();
}

TEST(DumpFormat, CodesAndKindsNewerThanTheFormatterPrintTheirNumber) {
  ts::kir::Instr in{};
  in.code = static_cast<ts::kir::Code>(200);
  in.dtype = ts::DType::Float32;
  in.a = 3;
  EXPECT_EQ(ts::compiler::instr_text(in), "f32 code#200 %3");
  ts::kir::Step st{};
  st.kind = static_cast<ts::kir::StepKind>(99);
  st.dtype = ts::DType::Float32;
  st.shape = {2};
  st.output = 1;
  st.inputs = {0};
  st.sources = {{"add", "a.b"}, {"mul", ""}};
  st.program.push_back(in);
  std::string text = ts::compiler::step_text(st);
  EXPECT_TRUE(contains(text, "kind#99 f32[2] -> slot 1")) << text;
  EXPECT_TRUE(contains(text, "sources (2): add@a.b mul")) << text;
  EXPECT_TRUE(contains(text, "%0 = f32 code#200 %3")) << text;
}
