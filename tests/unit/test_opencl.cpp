// The OpenCL backend (PoCL here) and the shared C renderer: every Step kind renders and runs
// against the float64 reference and the CPU; one source serves several shapes; device selection
// and its errors; the benchmark GPT trains to the CPU's losses. With CI=true a missing OpenCL
// device is a failure, elsewhere a skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "../../bench/bench_common.h"
#include "backends/backend.h"
#include "backends/render/c_render.h"
#include "tensor/tensor_impl.h"
#include "compiler/lower.h"
#include "runtime/realize.h"
#include "tessera/nn.h"
#include "tessera/optim.h"
#include "test_util.h"

using namespace tessera;
namespace tt = tessera::testing;
using tt::random_tensor;

namespace {

bool have_opencl() {
  for (const DeviceInfo& d : devices())
    if (d.device.kind == "opencl") return true;
  return false;
}

#define NEED_OPENCL()                                                                                 \
  do {                                                                                                \
    if (!have_opencl()) {                                                                             \
      if (tt::in_ci()) FAIL() << "no OpenCL device (CI=true requires one: scripts/run installs pocl-opencl-icd)"; \
      GTEST_SKIP() << "no OpenCL device";                                                             \
    }                                                                                                 \
  } while (0)

const Device kCL("opencl");

// The Steps the runtime would run for these pending tensors (compiled, not run).
std::vector<kir::Step> steps_of(const std::vector<Tensor>& ts) {
  std::vector<runtime::Request> req;
  for (const Tensor& t : ts) req.push_back({detail::node_of(t), {}});
  return runtime::compile_only(req)->steps;
}

// The kinds of the Steps the last executed graph ran.
std::vector<kir::StepKind> last_kinds() {
  std::vector<kir::StepKind> k;
  for (const kir::Step& s : runtime::last_executed_plan()->steps) k.push_back(s.kind);
  return k;
}
bool ran(kir::StepKind k) {
  auto v = last_kinds();
  return std::find(v.begin(), v.end(), k) != v.end();
}

// Realizes `f(device)` on the cpu (against the float64 reference, whose evaluator reads host
// memory) and on opencl: opencl must match the reference within its tolerance and the cpu within
// `tol` (normalized; 0: bit-identical), and must have run a Step of `kind`.
void same_on_both(const std::function<std::vector<Tensor>(Device)>& f, double tol, kir::StepKind kind) {
  std::vector<Tensor> c = f(Device("cpu"));
  tt::Evaluated e = tt::evaluate_both(c);
  std::vector<Tensor> outs = f(kCL);
  tessera::sync();
  EXPECT_TRUE(ran(kind)) << "expected a " << kir::step_kind_name(kind) << " Step";
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<double> got = outs[i].to_vector<double>();
    EXPECT_EQ(outs[i].shape(), c[i].shape());
    EXPECT_TRUE(tt::all_close(got, e.ref[i].data, tt::tolerance(e.ref[i].dtype, 1000))) << "output " << i << " vs reference";
    if (tol == 0) EXPECT_EQ(got, e.got[i]) << "output " << i << " vs cpu";
    else EXPECT_TRUE(tt::all_close(got, e.got[i], tol)) << "output " << i << " vs cpu";
  }
}

}  // namespace

TEST(Render, OneSourceServesEveryShape) {
  // Elementwise with a broadcast, a masked pad, a constant and a row reduction (softmax).
  auto build = [](int64_t n, int64_t m) {
    Tensor a = random_tensor({n, m}, DType::Float32, 1), b = random_tensor({m}, DType::Float32, 2);
    Tensor x = softmax(pad(a * 0.5 + b, {0, 0, 1, 2}), 1);
    return steps_of({x});
  };
  std::vector<kir::Step> s1 = build(3, 5), s2 = build(997, 33);
  ASSERT_EQ(s1.size(), s2.size());
  for (size_t i = 0; i < s1.size(); ++i) {
    auto k1 = render::render(s1[i]), k2 = render::render(s2[i]);
    ASSERT_EQ(k1.size(), k2.size());
    for (size_t j = 0; j < k1.size(); ++j) {
      EXPECT_EQ(k1[j].source, k2[j].source) << s1[i].str();
      EXPECT_EQ(k1[j].name, k2[j].name);
      EXPECT_NE(k1[j].params, k2[j].params) << "shapes must travel as parameters";
      EXPECT_EQ(k1[j].source.find("997"), std::string::npos) << "a shape leaked into the source:\n" << k2[j].source;
    }
  }
  // A different constant changes the parameters only.
  Tensor a = random_tensor({4, 4});
  auto c1 = render::render(steps_of({a * 0.25}).back()), c2 = render::render(steps_of({a * 3.0}).back());
  EXPECT_EQ(c1[0].source, c2[0].source);
  EXPECT_NE(c1[0].params, c2[0].params);
}

TEST(Render, NullBackendCompilesEveryKindWithoutADevice) {
  const Device null("null");
  Tensor a = rand({4, 6}, {DType::Float32, null}), w = rand({6, 3}, {DType::Float32, null});
  Tensor idx = arange(0, 3, 1, TensorOptions{DType::Int64, null}), off = arange(1, 3, 1, TensorOptions{DType::Int64, null});
  std::vector<Tensor> outs = {gelu(matmul(a, w)), a.sum({0}), softmax(a, 1), index_select(a, 0, idx),
                              scatter_add(a, 0, idx.reshape({3, 1}).expand({3, 6}), rand({3, 6}, {DType::Float32, null})),
                              dynamic_update_slice(a, rand({2, 2}, {DType::Float32, null}), off)};
  std::vector<kir::Step> st = steps_of(outs);
  std::set<kir::StepKind> kinds;
  for (auto& s : st) {
    kinds.insert(s.kind);
    for (auto& k : render::render(s)) {
      EXPECT_NE(k.source.find("KERNEL void " + k.name), std::string::npos);
      EXPECT_GT(k.work_items, 0);
    }
  }
  for (auto k : {kir::StepKind::Gemm, kir::StepKind::Reduce, kir::StepKind::Row, kir::StepKind::Gather,
                 kir::StepKind::ScatterAdd, kir::StepKind::DynamicUpdateSlice})
    EXPECT_TRUE(kinds.count(k)) << kir::step_kind_name(k);
  EXPECT_THROW(tessera::sync(), Error);  // null compiles but never runs
}

TEST(OpenCL, ElementwiseWithSeveralOutputs) {
  NEED_OPENCL();
  same_on_both([](Device d) {
    Tensor a = random_tensor({37, 19}, DType::Float32, 1, -2, 2, d), b = random_tensor({19}, DType::Float32, 2, -2, 2, d);
    Tensor x = a * b + 1.5, y = exp(x) - tanh(a), z = where(a > b, erf(a), sqrt(abs(b) + 0.1));
    return std::vector<Tensor>{x, y, z, pad(a, {1, 2, 0, 3}, -7.0), a.permute({1, 0}).reshape({19 * 37})};
  }, 1e-6, kir::StepKind::Elementwise);
}

TEST(OpenCL, RowAndReduceOverAnyAxes) {
  NEED_OPENCL();
  same_on_both([](Device d) {
    Tensor a = random_tensor({5, 7, 9}, DType::Float32, 3, -3, 3, d);
    return std::vector<Tensor>{softmax(a, 2), layer_norm(a, {9}), a.sum({0, 2}), a.amax({1}), a.sum({0}), a.sum()};
  }, 1e-6, kir::StepKind::Reduce);
  same_on_both([](Device d) { return std::vector<Tensor>{softmax(random_tensor({4, 300}, DType::Float32, 4, -5, 5, d), 1)}; },
               1e-6, kir::StepKind::Row);
  // A statistic read twice: stored once per row by the Row Step that normalizes with it.
  same_on_both([](Device d) {
    Tensor x = random_tensor({6, 5, 40}, DType::Float32, 5, -3, 3, d);
    Tensor sd = sqrt(var(x, {2}, 0, true) + 1e-5);
    return std::vector<Tensor>{(x - mean(x, {2}, true)) / sd, sd * 2.0};
  }, 1e-6, kir::StepKind::Row);
  bool stored_by_row = false;
  for (const kir::Step& st : runtime::last_executed_plan()->steps)
    stored_by_row |= st.kind == kir::StepKind::Row && !st.more_outputs.empty();
  EXPECT_TRUE(stored_by_row);
}

TEST(OpenCL, GemmWithEpilogueBatchedAndTransposed) {
  NEED_OPENCL();
  same_on_both([](Device d) {
    Tensor a = random_tensor({3, 13, 22}, DType::Float32, 5, -1, 1, d), b = random_tensor({3, 22, 9}, DType::Float32, 6, -1, 1, d);
    Tensor bias = random_tensor({9}, DType::Float32, 7, -1, 1, d);
    return std::vector<Tensor>{gelu(matmul(a, b) + bias), matmul(b.permute({0, 2, 1}), a.permute({0, 2, 1}))};
  }, 1e-5, kir::StepKind::Gemm);
  // Integers and float64 too.
  same_on_both([](Device d) {
    Tensor ia = tt::random_int({4, 5}, -3, 3, DType::Int32, 1).to(d), ib = tt::random_int({5, 2}, -3, 3, DType::Int32, 2).to(d);
    Tensor da = random_tensor({6, 7}, DType::Float64, 3, -1, 1, d);
    return std::vector<Tensor>{matmul(ia, ib), matmul(da, da.permute({1, 0}))};
  }, 1e-14, kir::StepKind::Gemm);
}

// Convolutions run as the Steps every backend has (im2col copies, GEMMs): forward and both
// gradients for strides, negative padding, lhs/rhs dilation and groups, and pooling.
TEST(OpenCL, ConvolutionsPoolingAndTheirGradients) {
  NEED_OPENCL();
  same_on_both([](Device d) {
    Tensor x = random_tensor({2, 4, 7, 6}, DType::Float32, 8, -1, 1, d).requires_grad_();
    Tensor w = random_tensor({6, 2, 3, 2}, DType::Float32, 9, -1, 1, d).requires_grad_();
    Tensor y = conv_general(x, w, {{2, 1}, {1, 2}, {2, -1}, {2, 1}, {1, 2}, 2});
    Tensor p = max_pool2d(relu(conv2d(x, random_tensor({3, 4, 3, 3}, DType::Float32, 10, -1, 1, d), Tensor(), {1}, {1})), {2});
    ((y * y).sum() + p.sum()).backward();
    return std::vector<Tensor>{y, p, x.grad(), w.grad()};
  }, 1e-5, kir::StepKind::Gemm);
}

TEST(OpenCL, GatherScatterAndDynamicUpdateSlice) {
  NEED_OPENCL();
  same_on_both([](Device d) {
    Tensor w = random_tensor({10, 6}, DType::Float32, 8, -1, 1, d);
    Tensor idx = tt::make_tensor({3, 0, 9, 3, 3, 7}, {6}, DType::Int64).to(d);
    Tensor src = random_tensor({6, 6}, DType::Float32, 9, -1, 1, d);
    Tensor offs = tt::make_tensor({8, 3}, {2}, DType::Int64).to(d);
    Tensor sa = scatter_add(w, 0, idx.reshape({6, 1}).expand({6, 6}), src);  // repeated rows add in order
    Tensor upd = dynamic_update_slice(w, src.slice(0, 0, 2), offs);
    return std::vector<Tensor>{index_select(w, 0, idx), sa, upd};
  }, 0, kir::StepKind::ScatterAdd);
}

TEST(OpenCL, OutOfRangeIndexNamesOpAndScope) {
  NEED_OPENCL();
  Tensor w = random_tensor({4, 3}, DType::Float32, 1, -1, 1, kCL);
  Tensor idx = tt::make_tensor({1, 2, 7, 9}, {4}, DType::Int64).to(kCL);
  std::string msg;
  {
    Scope s{"lookup"};
    Tensor g = index_select(w, 0, idx);
    try {
      g.to_vector<double>();
    } catch (const Error& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("index 7 out of range [0, 4)"), std::string::npos) << msg;  // the first bad one
  EXPECT_NE(msg.find("lookup"), std::string::npos) << msg;
  // The device keeps working afterwards.
  Tensor ok = index_select(w, 0, tt::make_tensor({3, 0}, {2}, DType::Int64).to(kCL));
  EXPECT_EQ(ok.to_vector<double>(), index_select(w.to(Device("cpu")), 0, tt::make_tensor({3, 0}, {2}, DType::Int64)).to_vector<double>());
}

TEST(OpenCL, RngDrawsTheCpuNumbers) {
  NEED_OPENCL();
  auto draw = [](Device d) {
    manual_seed(11);
    Tensor u = rand({1000}, {DType::Float32, d}), n = randn({999}, {DType::Float32, d});
    Tensor h = rand({64}, {DType::Float16, d});
    return std::vector<std::vector<double>>{u.to_vector<double>(), n.to_vector<double>(), h.to_vector<double>()};
  };
  auto c = draw(Device("cpu")), o = draw(kCL);
  EXPECT_EQ(c[0], o[0]);
  EXPECT_TRUE(tt::all_close(o[1], c[1], 1e-7));
  EXPECT_EQ(c[2], o[2]);
}

TEST(OpenCL, EveryDtypeRoundsAsTheCpu) {
  NEED_OPENCL();
  for (DType t : {DType::Float16, DType::BFloat16, DType::Float64, DType::Int32, DType::Int64, DType::Bool}) {
    auto f = [&](Device d) {
      Tensor a = random_tensor({33, 5}, t, 12, -4, 4, d), b = random_tensor({33, 5}, t, 13, -4, 4, d);
      if (t == DType::Bool) return std::vector<Tensor>{logical_and(a, b), a == b, a.to(Device("cpu")).to(d)};
      return std::vector<Tensor>{a + b, a * b - a, maximum(a, b), a.sum({1}), (a > b).to(DType::Int32),
                                 a.to(DType::Float32) * 0.3};
    };
    std::vector<std::vector<double>> cpu;
    for (Tensor& x : f(Device("cpu"))) cpu.push_back(x.to_vector<double>());
    std::vector<Tensor> o = f(kCL);
    for (size_t i = 0; i < o.size(); ++i) {
      if (t == DType::Float64 && i == 3)  // float64 sums: the cpu adds in 8 interleaved partial sums
        EXPECT_TRUE(tt::all_close(o[i].to_vector<double>(), cpu[i], 1e-15));
      else
        EXPECT_EQ(o[i].to_vector<double>(), cpu[i]) << dtype_name(t) << " output " << i;
    }
  }
}

TEST(OpenCL, DeviceSelectionAndErrors) {
  NEED_OPENCL();
  int n = 0;
  for (const DeviceInfo& d : devices())
    if (d.device.kind == "opencl") {
      ++n;
      EXPECT_NE(d.description.find("compute units"), std::string::npos) << d.description;
      EXPECT_NE(d.description.find("fp64"), std::string::npos) << d.description;
    }
  EXPECT_GE(n, 1);
  EXPECT_EQ(ones({1}, {DType::Float32, Device("opencl:0")}).item(), 1.0);
  try {
    from_vector<float>({1.0f}, {1}, {DType::Float32, Device("opencl:" + std::to_string(n))});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[device] 'opencl:" + std::to_string(n) + "' does not exist"), std::string::npos) << e.what();
  }
  // PoCL runs on the host CPU: the native cpu backend ranks above it.
  bool accel = false;
  for (const DeviceInfo& d : devices()) accel |= d.accelerator;
  if (!accel) {
    EXPECT_EQ(Device::best(), Device("cpu"));
  }
  // An op across devices names both.
  EXPECT_THROW((ones({2}) + ones({2}, {DType::Float32, kCL})).item(), Error);
  // The interface's alignment: the device's base-address alignment.
  kir::Target t = backends::backend_for(kCL).properties(0);
  EXPECT_GE(t.alignment, 64u);
  EXPECT_EQ(t.alignment % 64, 0u);
}

// Convolutions lower to Steps every backend runs: conv (strided, dilated, grouped, transposed),
// pooling and their gradients match the cpu, and a SmallCNN trains to the cpu's losses.
TEST(OpenCL, ConvolutionsAndASmallCnnMatchTheCpu) {
  NEED_OPENCL();
  auto run = [](Device d) {
    std::vector<double> out;
    manual_seed(1);
    nn::SmallCNN m(1, 10, 12, 12);
    m.to(d);
    tessera::sync();  // the initial weights are drawn here on both devices (to(cpu) alone would not sync)
    optim::SGD opt(m.parameters(), {.lr = 0.05});
    for (int s = 0; s < 3; ++s) {
      Tensor x = randn({4, 1, 12, 12}, {DType::Float32, d});
      Tensor y = from_vector<int64_t>({s, 3, 7, 9}, {4}, {DType::Int64, d});
      opt.zero_grad();
      Tensor loss = nn::cross_entropy(m(x), y);
      loss.backward();
      opt.step();
      out.push_back(loss.item());
    }
    Tensor a = randn({2, 4, 9, 7}, {DType::Float32, d}).requires_grad_();
    Tensor w = randn({6, 2, 3, 3}, {DType::Float32, d}).requires_grad_();
    Tensor c = conv2d(a, w, Tensor(), {2, 1}, {1}, {1, 2}, 2);
    Tensor t = conv_transpose2d(a, randn({4, 3, 2, 2}, {DType::Float32, d}), Tensor(), {2});
    (c.sum() + (t * t).sum() + max_pool2d(a, {2}).sum() + avg_pool2d(a, {3}, {2}, {1}).sum()).backward();
    for (const Tensor& v : {c, t, a.grad(), w.grad()})
      for (double x : v.to_vector<double>()) out.push_back(x);
    return out;
  };
  std::vector<double> c = run(Device("cpu")), o = run(kCL);
  for (int s = 0; s < 3; ++s) EXPECT_NEAR(o[size_t(s)], c[size_t(s)], 1e-5 * std::abs(c[size_t(s)])) << "step " << s;
  EXPECT_TRUE(tt::all_close(o, c, 1e-5));
}

// The benchmark GPT (bench/bench_common.h) with dropout on, 50 AdamW steps: the loss on opencl
// equals the cpu's at every step to 1e-4 relative.
TEST(OpenCL, BenchmarkGptTrainsToTheCpuLosses) {
  NEED_OPENCL();
  auto train = [](Device dev) { return tt::bench_gpt_losses(dev, 50); };
  std::vector<double> cpu = train(Device("cpu")), cl = train(kCL);
  ASSERT_EQ(cpu.size(), cl.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cl[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i;
  EXPECT_LT(cpu.back(), cpu.front());
  std::printf("[opencl] gpt losses: step 0 %.6f / %.6f, step 49 %.6f / %.6f (cpu / opencl)\n", cpu[0], cl[0], cpu[49], cl[49]);
}

// With no OpenCL platform (the ICD loader pointed at an empty vendor folder) naming the device is
// a clear error and the cpu still works. The loader reads its vendors once per process, so the
// check runs in a child: this binary, filtered to OpenCLNoDevice.Child.
TEST(OpenCLNoDevice, Child) {
  if (!std::getenv("TESSERA_NO_DEVICE_CHILD")) GTEST_SKIP() << "runs as the child of OpenCL.NoDeviceIsAClearError";
  std::string msg;
  try {
    from_vector<float>({1.0f}, {1}, {DType::Float32, kCL});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg.rfind("[device] no OpenCL device found; install pocl-opencl-icd", 0), 0u) << msg;
  EXPECT_EQ((ones({1}) * 2.0).item(), 2.0);
}

TEST(OpenCL, NoDeviceIsAClearError) {
  NEED_OPENCL();
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string cmd = "TESSERA_NO_DEVICE_CHILD=1 OCL_ICD_VENDORS=/nonexistent-vendors '" + self +
                    "' --gtest_filter=OpenCLNoDevice.Child > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "the child failed: run " << cmd;
}
