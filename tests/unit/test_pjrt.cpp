// The pjrt backend (src/backends/pjrt/): its PJRT loader against broken plugins and XLA's CPU
// plugin on hand-written StableHLO, then whole programs through the backend plugin against the
// cpu backend. XLA's CPU plugin is the one scripts/run unpacks into the build folder; without it
// these tests skip, and fail when CI=true.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "pjrt_client.h"
#include "backends/backend.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace tessera {
namespace {

bool in_ci() {
  const char* c = std::getenv("CI");
  return c && std::string(c) == "true";
}

const char* kCpuPlugin = TESSERA_PJRT_CPU_PLUGIN;

#define REQUIRE_CPU_PLUGIN()                                                                   \
  do {                                                                                         \
    if (!std::ifstream(kCpuPlugin).good()) {                                                   \
      if (in_ci()) FAIL() << "XLA's CPU PJRT plugin is missing (CI=true): " << kCpuPlugin;     \
      GTEST_SKIP() << "no XLA CPU PJRT plugin at " << kCpuPlugin << " (scripts/run fetches it)"; \
    }                                                                                          \
  } while (0)

std::string load_error(const std::string& path) {
  try {
    pjrt::Plugin::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

// ---- the loader refuses what is not a compatible plugin, with the reason ----

TEST(PjrtLoader, RefusesAFileThatIsNotASharedLibrary) {
  std::string path = ::testing::TempDir() + "/not_a_plugin.so";
  std::ofstream(path) << "this is a text file, not a PJRT plugin\n";
  std::string e = load_error(path);
  EXPECT_NE(e.find("[pjrt] plugin " + path + ": cannot load it:"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesAMissingFile) {
  std::string e = load_error("/nonexistent/pjrt_plugin.so");
  EXPECT_NE(e.find("[pjrt] plugin /nonexistent/pjrt_plugin.so: cannot load it"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesALibraryWithoutGetPjrtApi) {
  std::string e = load_error(TESSERA_PJRT_NO_SYMBOL_LIBRARY);
  EXPECT_NE(e.find("no GetPjrtApi symbol: not a PJRT plugin"), std::string::npos) << e;
}

TEST(PjrtLoader, RefusesAnIncompatibleMajorVersion) {
  std::string e = load_error(TESSERA_PJRT_WRONG_MAJOR);
  EXPECT_NE(e.find("PJRT API version 1.0 is not supported: this backend speaks 0.115 and later minors of major 0"),
            std::string::npos)
      << e;
}

// ---- XLA's CPU plugin on hand-written StableHLO ----

const pjrt::Plugin& cpu_plugin() {
  static std::unique_ptr<pjrt::Plugin> p = pjrt::Plugin::load(kCpuPlugin);
  return *p;
}

TEST(PjrtCpuPlugin, ReportsItsPlatformAndDevices) {
  REQUIRE_CPU_PLUGIN();
  const pjrt::Plugin& p = cpu_plugin();
  EXPECT_EQ(p.platform(), "cpu");
  EXPECT_GE(p.device_count(), 1);
  EXPECT_EQ(p.api_version(), "0.115");
}

TEST(PjrtCpuPlugin, CompilesAndRunsStableHLOText) {
  REQUIRE_CPU_PLUGIN();
  const pjrt::Plugin& p = cpu_plugin();
  // (x + y) * x and the sum of y: two results.
  const std::string mlir = R"(module @t {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>) {
    %s = stablehlo.add %x, %y : tensor<3xf32>
    %m = stablehlo.multiply %s, %x : tensor<3xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %r = stablehlo.reduce(%y init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
    return %m, %r : tensor<3xf32>, tensor<f32>
  }
})";
  auto prog = p.compile(mlir);
  EXPECT_EQ(prog->num_outputs(), 2u);
  float x[3] = {1, 2, 3}, y[3] = {10, 20, 30};
  auto bx = p.upload(0, x, DType::Float32, {3});
  auto by = p.upload(0, y, DType::Float32, {3});
  auto out = prog->execute(0, {bx->buffer, by->buffer}, {}, {{DType::Float32, {3}}, {DType::Float32, {}}});
  float m[3], r;
  out[0]->to_host(m);
  out[1]->to_host(&r);
  EXPECT_EQ(m[0], 11.f);
  EXPECT_EQ(m[1], 44.f);
  EXPECT_EQ(m[2], 99.f);
  EXPECT_EQ(r, 60.f);
  pjrt::MemoryStats s = prog->memory_stats();
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.arguments, 24);
  EXPECT_GE(s.outputs, 16);  // 12 + 4 bytes, and XLA may count its table of the two results
  EXPECT_GE(s.peak, 16) << "temporaries " << s.temporaries;
  EXPECT_LE(s.peak, s.arguments + s.outputs + s.temporaries + 4096) << "temporaries " << s.temporaries;
}

TEST(PjrtCpuPlugin, AProgramWithATypeErrorIsRefusedWithXLAsMessage) {
  REQUIRE_CPU_PLUGIN();
  const std::string mlir = R"(module @bad {
  func.func public @main(%x: tensor<3xf32>, %y: tensor<4xi32>) -> tensor<3xf32> {
    %s = stablehlo.add %x, %y : (tensor<3xf32>, tensor<4xi32>) -> tensor<3xf32>
    return %s : tensor<3xf32>
  }
})";
  try {
    cpu_plugin().compile(mlir);
    FAIL() << "a mistyped program compiled";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("[pjrt] compile failed: ", 0), 0u) << m;
    EXPECT_GT(m.size(), std::string("[pjrt] compile failed: ").size() + 10) << m;
  }
}

}  // namespace
}  // namespace tessera
