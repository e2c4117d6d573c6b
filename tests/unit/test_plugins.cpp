// Backend plugins and interface v3: the loader reports and skips broken plugins, and the
// v3test plugin (tests/plugins/v3test_backend.cpp) claims GEMMs for its library, runs whole
// executables (replaying them while the slot pointers stay), copies asynchronously with events,
// copies device to device, and computes what the cpu computes.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/backend.h"
#include "compiler/lower.h"
#include "runtime/realize.h"
#include "tensor/tensor_impl.h"
#include "tessera/tessera.h"
#include "test_util.h"

namespace ts = tessera;
namespace tt = tessera::testing;
using ts::Device;
using ts::DType;
using ts::Tensor;

namespace {

// Plugins load at the first device query, which no test makes before main.
const bool kPathSet = [] {
  setenv("TESSERA_PLUGIN_PATH", TESSERA_TEST_PLUGIN_PATH, 1);
  return true;
}();

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += x + "\n";
  return s;
}

// The count before `what` in the v3test device's description ("3 replays").
int64_t v3_count(const std::string& what) {
  for (const ts::DeviceInfo& d : ts::devices())
    if (d.device == Device("v3test:0")) {
      // "... (3 replays, ...": the digits right before " <what>".
      size_t at = d.description.find(" " + what), start = at;
      while (start != std::string::npos && start > 0 && std::isdigit(static_cast<unsigned char>(d.description[start - 1]))) --start;
      if (at != std::string::npos && start < at) return std::stoll(d.description.substr(start, at - start));
      ADD_FAILURE() << "no '" << what << "' in: " << d.description;
    }
  return -1;
}

const ts::DeviceMetrics& v3_metrics(const ts::Metrics& m) {
  static const ts::DeviceMetrics none;
  auto it = m.devices.find("v3test");
  return it == m.devices.end() ? none : it->second;
}

}  // namespace

TEST(Plugins, BrokenOnesAreReportedAndSkipped) {
  ASSERT_TRUE(kPathSet);
  std::string errors = joined(ts::plugin_errors());
  const int v = tessera::backends::kInterfaceVersion;
  EXPECT_NE(errors.find("libtessera-backend-badversion.so: built for backend interface version " + std::to_string(v - 1) +
                        "; this libtessera speaks version " + std::to_string(v)),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find("libtessera-backend-nosymbol.so: it does not export tessera_backend_plugin"), std::string::npos) << errors;
  EXPECT_NE(errors.find("libtessera-backend-unresolved.so: cannot load it:"), std::string::npos) << errors;
  EXPECT_NE(errors.find("tessera_test_symbol_nobody_defines"), std::string::npos) << errors;
  // A backend that cannot run here (no driver) is no broken plugin: it is listed apart, by kind.
  EXPECT_EQ(errors.find("nodriver"), std::string::npos) << errors;
  std::string unavailable = joined(ts::unavailable_backends());
  EXPECT_NE(unavailable.find("nodriver: not available (no device driver found (a test plugin that never starts))\n"), std::string::npos)
      << unavailable;
  EXPECT_NE(errors.find("libtessera-backend-dupname.so: a backend named 'cpu' is already registered"), std::string::npos) << errors;
  // Everything else still runs: the built-in cpu, and the plugin that did load.
  EXPECT_EQ((ts::ones({3}) * 2).sum().item(), 6.0);
  std::string names;
  for (auto& d : ts::devices()) names += d.device.str() + " ";
  EXPECT_NE(names.find("v3test:0 v3test:1"), std::string::npos) << names;
  EXPECT_EQ(names.find("dupname"), std::string::npos) << names;
}

TEST(Plugins, NamingAFailedPluginsDeviceSaysWhy) {
  try {
    ts::ones({2}, {DType::Float32, Device("nodriver")}).sum().item();
    FAIL() << "no error";
  } catch (const ts::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[device] nodriver: not available (no device driver found (a test plugin that never starts); plugin ", 0), 0u)
        << msg;
    EXPECT_NE(msg.find("libtessera-backend-nodriver.so); available: cpu, "), std::string::npos) << msg;
  }
}

TEST(Plugins, TheCliListsWhatDidNotLoad) {
  std::string cmd = std::string("TESSERA_PLUGIN_PATH=") + TESSERA_TEST_PLUGIN_PATH + " " + TESSERA_CLI + " devices 2>&1";
  int status = 0;
  std::string out = tt::run_command(cmd, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("v3test:1"), std::string::npos) << out;
  EXPECT_NE(out.find("plugin not loaded: "), std::string::npos) << out;
  EXPECT_NE(out.find("libtessera-backend-badversion.so: built for backend interface version " +
                     std::to_string(tessera::backends::kInterfaceVersion - 1)), std::string::npos) << out;
  EXPECT_NE(out.find("\nnodriver: not available (no device driver found (a test plugin that never starts))\n"), std::string::npos) << out;
}

// A small GPT with dropout, trained with AdamW under a changing learning rate: the same losses on
// v3test as on the cpu (its library GEMMs accumulate in double, so not bit for bit).
TEST(InterfaceV3, TrainsLikeTheCpuThroughLibraryCallsAndWholeExecutables) {
  auto train = [](const Device& dev) {
    ts::manual_seed(7);
    ts::nn::GPT gpt({.vocab = 12, .block = 8, .embd = 16, .heads = 2, .layers = 1, .dropout = 0.1});
    gpt.to(dev);
    ts::optim::AdamW opt(gpt.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
    std::vector<double> losses;
    for (int step = 0; step < 6; ++step) {
      opt.set_lr(3e-3 * (1 + step));  // a new value each step: a graph input, never a constant
      std::vector<int64_t> ids(2 * 8), next(2 * 8);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t((i * 5 + size_t(step)) % 12), next[i] = int64_t((i * 5 + 1) % 12);
      Tensor x = ts::from_vector(ids, {2, 8}, {DType::Int64, dev}), y = ts::from_vector(next, {2, 8}, {DType::Int64, dev});
      Tensor loss = gpt.loss(x, y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss.item());
    }
    return losses;
  };
  ts::Metrics before = ts::metrics();
  int64_t replays = v3_count("replays"), async = v3_count("async copies"), events = v3_count("events");
  std::vector<double> cpu = train(Device("cpu")), v3 = train(Device("v3test"));
  ts::Metrics after = ts::metrics();
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(v3[i], cpu[i], 1e-5 * std::abs(cpu[i])) << "step " << i;
  EXPECT_GT(v3_metrics(after).library_calls_compiled, v3_metrics(before).library_calls_compiled);
  EXPECT_GT(v3_metrics(after).executables_run, v3_metrics(before).executables_run + 5);
  EXPECT_GT(v3_count("replays"), replays);  // the steps' buffers recur: replayed, new lr and RNG offsets read from the scalars
  EXPECT_GT(v3_count("async copies"), async);
  EXPECT_GT(v3_count("events"), events);
}

// A 0-d input whose buffer changes every run is staged into the executable's scalars buffer, so a
// replay reads the new value; rand() draws at the run's RNG offset, read from there too.
TEST(InterfaceV3, ReplaysReadNewScalarsAndRandomState) {
  Device v3("v3test");
  Tensor x = ts::from_vector<float>({1, 2, 3, 4}, {4}, {DType::Float32, v3});
  int64_t replays = v3_count("replays");
  for (int i = 0; i < 4; ++i) {
    Tensor lr = ts::from_vector<float>({float(0.5 * (i + 1))}, {}, {DType::Float32, v3});  // a graph input
    ts::manual_seed(11 + i);
    Tensor noise = ts::rand({4}, {DType::Float32, v3});
    std::vector<float> got = (x * lr + noise * 0).to_vector<float>();
    std::vector<float> drawn = noise.to_vector<float>();
    ts::manual_seed(11 + i);
    std::vector<float> want_noise = ts::rand({4}).to_vector<float>();
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(got[k], float(k + 1) * float(0.5 * (i + 1))) << "run " << i;
      EXPECT_EQ(drawn[k], want_noise[k]) << "run " << i;
    }
  }
  EXPECT_GT(v3_count("replays"), replays);
}

TEST(InterfaceV3, CopiesDeviceToDeviceAndReportsErrorsAtSync) {
  int64_t copies = v3_count("device copies");
  Tensor a = ts::from_vector<float>({1, 2, 3}, {3}, {DType::Float32, Device("v3test:0")});
  Tensor b = (a * 2).to(Device("v3test:1"));
  EXPECT_EQ(b.device(), Device("v3test:1"));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_GT(v3_count("device copies"), copies);
  // An out-of-range index found on the worker thread is thrown by the sync, naming the op.
  Tensor idx = ts::from_vector<int64_t>({0, 5}, {2}, {DType::Int64, Device("v3test:0")});
  try {
    ts::gather(a, 0, idx).to_vector<float>();
    FAIL() << "no error";
  } catch (const ts::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gather] index 5 out of range [0, 3)"), std::string::npos) << e.what();
  }
  EXPECT_EQ((a + 1).to_vector<float>(), (std::vector<float>{2, 3, 4}));  // the device runs on
}

// A conv product carries the conv itself (kir::Step::conv) for backends whose library runs convs:
// the input as the GEMM reads it (padded by the lowering: [1, 2, 7, 8] -> [1, 2, 9, 10]), the
// kernel, the stride, and no padding left to apply.
TEST(InterfaceV3, ConvProductsCarryTheirConv) {
  Tensor x = ts::randn({1, 2, 7, 8}), w = ts::randn({4, 2, 3, 3});
  Tensor y = ts::conv2d(x, w, Tensor(), {2, 2}, {1, 1});
  auto plan = ts::runtime::compile_only(ts::detail::pending_requests({y}));
  int convs = 0;
  for (const ts::kir::Step& st : plan->steps) {
    if (!st.conv) continue;
    ++convs;
    EXPECT_EQ(st.kind, ts::kir::StepKind::Gemm);
    EXPECT_EQ(st.conv->lhs, (ts::Shape{1, 2, 9, 10}));
    EXPECT_EQ(st.conv->rhs, (ts::Shape{4, 2, 3, 3}));
    ASSERT_EQ(st.conv->attrs.axes.size(), 2u);
    for (const auto& a : st.conv->attrs.axes) {
      EXPECT_EQ(a.stride, 2);
      EXPECT_EQ(a.lo + a.hi, 0);
      EXPECT_EQ(a.lhs_dilation, 1);
    }
  }
  EXPECT_EQ(convs, 1);
}
