// The advisor's device table, user devices from JSON, and the calibrated host.
//
// Figures are dense peaks (NVIDIA pages often print the 2:4-sparse tensor figure, twice these).
// Achievable fractions per class, applied to the peaks by the cost model:
//   gpu-tc / gpu:  matrix 0.75 of the tensor-core peak on large GEMMs (measured on one H200:
//                  ~790 of 989 TFLOP/s at 8192^3 bf16 through PyTorch, 0.80; smaller training
//                  GEMMs do worse), vector 0.8, memory 0.85 (measured H200 device copy ~4.3 of
//                  4.8 TB/s, 0.9), interconnect 0.8, 5 us per Step (kernel launch + dispatch of
//                  an eager runtime; CUDA graphs would be ~2 us).
//   tpu:           matrix 0.8 (XLA fuses and tiles for the 128x128 MXU), memory 0.85, 1 us per
//                  Step (one compiled XLA program: no per-op host launch).
//   cpu (host):    calibrated, not assumed (host_device()).
// Padding: tensor cores run M,N in 64-wide tiles and K in multiples of 16 (bf16/fp16) or 8;
// a TPU MXU is 128x128 (M,N,K padded to 128). float32 on a TPU's MXU is emulated by bf16 passes:
// we model "HIGHEST" precision, 6 passes (JAX/XLA precision docs: bf16_6x), as float32 semantics.
// Float32 matmuls on NVIDIA parts run on the CUDA cores at the fp32 rate (PyTorch's default
// since 1.12: TF32 off for matmul); tf32_flops is recorded but not used.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tessera/advise.h"
#include "tessera/error.h"
#include "tessera/metrics.h"
#include "tessera/ops.h"

namespace tessera::advise {
namespace {

constexpr double T = 1e12, G = 1e9, GiB = 1073741824.0;

DeviceSpec gpu(std::string name, std::string desc) {
  DeviceSpec d;
  d.name = std::move(name);
  d.description = std::move(desc);
  d.cls = "gpu-tc";
  d.matrix_eff = 0.75, d.vector_eff = 0.8, d.bw_eff = 0.85, d.link_eff = 0.8;
  d.launch_s = 5e-6;
  d.link_latency_s = 10e-6;  // NCCL ring step latency, order of 10 us
  d.tile_mn = 64, d.tile_k = 16;
  // cudaMalloc returns 256-byte aligned memory (CUDA C Best Practices Guide, "Device memory
  // allocation"; RAPIDS rmm's CUDA_ALLOCATION_ALIGNMENT is 256): the arena aligns temporaries so.
  d.alignment = 256;
  return d;
}

// Usable memory of an NVIDIA GPU: nominal less ~0.6 GB of CUDA context, cuBLAS workspace and
// allocator slack (what torch.cuda.mem_get_info reports free on an idle GPU is about this).
double cuda_usable(double nominal) { return nominal - 0.6 * G; }

DeviceSpec tpu_core(std::string name, std::string desc) {
  DeviceSpec d;
  d.name = std::move(name);
  d.description = std::move(desc);
  d.cls = "tpu";
  d.matrix_eff = 0.8, d.vector_eff = 0.8, d.bw_eff = 0.85, d.link_eff = 0.8;
  d.launch_s = 1e-6;
  d.link_latency_s = 5e-6;
  d.tile_mn = 128, d.tile_k = 128;
  d.fp32_matmul_passes = 6;
  // Arrays in TPU HBM are tiled: one dimension padded to a multiple of 8, another to 128
  // (cloud.google.com/tpu/docs/performance-guide, "Consequences of tiling"); XLA's default for a
  // row-major array is T(8,128) on the two minor dimensions, T(8,128)(2,1) (16 rows) for bf16 and
  // T(1024) for vectors (as TPU HLO dumps print layouts). No float64: the TPU has no float64
  // arithmetic (XLA emulates part of it and rejects the rest).
  d.layout_tile_rows = 8, d.layout_tile_cols = 128;
  d.dtypes = {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32};
  return d;
}

}  // namespace

std::vector<DeviceSpec> builtin_devices() {
  std::vector<DeviceSpec> v;
  {
    // NVIDIA T4 datasheet: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
    // (checked against https://sysrqmts.com/en/gpus/nvidia/tesla/t4: FP32 8.141 TFLOPS, FP16 65.13, 320 GB/s, 70 W)
    DeviceSpec d = gpu("t4", "NVIDIA T4 16 GB (Turing, PCIe)");
    d.fp32_flops = 8.1 * T;          // datasheet: 8.1 TFLOPS FP32
    d.bf16_flops = 65 * T;           // datasheet: 65 TFLOPS mixed FP16/FP32 tensor (no bf16: fp16 rate)
    d.vec16_flops = 16.2 * T;        // FP16 on the CUDA cores runs at 2x FP32 (Turing)
    d.mem_bytes = 16 * G;            // datasheet: 16 GB GDDR6
    d.usable_bytes = cuda_usable(15.0 * G);  // 15 GB visible (ECC on), as nvidia-smi shows 15360 MiB
    d.mem_bw = 320 * G;              // datasheet: 320+ GB/s
    d.link_bw = 16 * G;              // PCIe Gen3 x16: 15.75 GB/s per direction (no NVLink)
    d.power_w = 70;                  // datasheet: 70 W
    d.source = "nvidia.com T4 datasheet";
    v.push_back(d);
  }
  {
    // NVIDIA Tesla P100 PCIe datasheet: https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf
    DeviceSpec d = gpu("p100", "NVIDIA P100 PCIe 16 GB (Pascal, no tensor cores)");
    d.cls = "gpu";
    d.fp32_flops = 9.3 * T;          // datasheet: 9.3 TFLOPS single precision
    d.bf16_flops = 0;                // no tensor cores
    d.vec16_flops = 18.7 * T;        // datasheet: 18.7 TFLOPS half precision (no bf16 at all)
    d.mem_bytes = 16 * G;            // datasheet: 16 GB CoWoS HBM2
    d.usable_bytes = cuda_usable(16 * G);
    d.mem_bw = 732 * G;              // datasheet: 732 GB/s (16 GB part)
    d.link_bw = 16 * G;              // PCIe Gen3 x16, 32 GB/s bidirectional
    d.power_w = 250;                 // datasheet: 250 W
    d.tile_mn = 32, d.tile_k = 1;    // SIMT sgemm tiles
    d.source = "nvidia.com P100 PCIe datasheet";
    v.push_back(d);
  }
  for (double gb : {16.0, 32.0}) {
    // NVIDIA V100 datasheet: https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
    DeviceSpec d = gpu(gb == 16 ? "v100-16" : "v100-32", gb == 16 ? "NVIDIA V100 SXM2 16 GB" : "NVIDIA V100 SXM2 32 GB");
    d.fp32_flops = 15.7 * T;         // datasheet (SXM2): 15.7 TFLOPS single precision
    d.bf16_flops = 125 * T;          // datasheet: 125 TFLOPS tensor (fp16; Volta has no bf16)
    d.vec16_flops = 31.4 * T;        // 2x FP32 on the CUDA cores
    d.mem_bytes = gb * G;            // datasheet: 16 or 32 GB HBM2
    d.usable_bytes = cuda_usable(gb * G);
    d.mem_bw = 900 * G;              // datasheet: 900 GB/s
    d.link_bw = 150 * G;             // datasheet: NVLink 300 GB/s (both directions)
    d.power_w = 300;                 // datasheet: 300 W
    d.tile_k = 8;
    d.source = "nvidia.com V100 datasheet";
    v.push_back(d);
  }
  for (double gb : {40.0, 80.0}) {
    // NVIDIA A100 datasheet: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    DeviceSpec d = gpu(gb == 40 ? "a100-40" : "a100-80", gb == 40 ? "NVIDIA A100 SXM4 40 GB" : "NVIDIA A100 SXM4 80 GB");
    d.fp32_flops = 19.5 * T;         // datasheet: FP32 19.5 TFLOPS
    d.tf32_flops = 156 * T;          // datasheet: TF32 156 TFLOPS dense (312 with sparsity)
    d.bf16_flops = 312 * T;          // datasheet: BF16/FP16 tensor 312 TFLOPS dense (624 sparse)
    d.vec16_flops = 39 * T;          // datasheet: FP16/BF16 non-tensor 78 TFLOPS is with FMA packing; use 2x FP32
    d.mem_bytes = gb * G;            // datasheet: 40 GB HBM2 / 80 GB HBM2e
    d.usable_bytes = cuda_usable(gb * G);
    d.mem_bw = (gb == 40 ? 1555 : 2039) * G;  // datasheet: 1,555 GB/s (40 GB), 2,039 GB/s (80 GB SXM)
    d.link_bw = 300 * G;             // datasheet: NVLink 600 GB/s (both directions)
    d.power_w = 400;                 // datasheet: 400 W (SXM)
    d.source = "nvidia.com A100 datasheet";
    v.push_back(d);
  }
  {
    // NVIDIA H100 datasheet: https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    // dense figures checked at https://glennklockwood.com/garden/processors/h100 (FP32 66.9, TF32 494.7,
    // BF16 989.4 dense) and https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html (sparse 1,979; 3,350 GB/s; 700 W)
    DeviceSpec d = gpu("h100", "NVIDIA H100 SXM5 80 GB");
    d.fp32_flops = 67 * T;           // datasheet: FP32 67 TFLOPS
    d.tf32_flops = 494.7 * T;        // datasheet: TF32 989 TFLOPS with sparsity -> 494.7 dense
    d.bf16_flops = 989.4 * T;        // datasheet: BF16 1,979 TFLOPS with sparsity -> 989.4 dense
    d.vec16_flops = 133.8 * T;       // non-tensor FP16/BF16 (Klockwood's table, VFMA column)
    d.mem_bytes = 80 * G;            // datasheet: 80 GB HBM3
    d.usable_bytes = cuda_usable(80 * G);
    d.mem_bw = 3350 * G;             // datasheet: 3.35 TB/s
    d.link_bw = 450 * G;             // datasheet: NVLink 900 GB/s (both directions)
    d.power_w = 700;                 // datasheet: up to 700 W
    d.matrix_eff = 0.8;              // measured on an H200 (same SMs): 790/989 at 8192^3 bf16
    d.source = "nvidia.com H100 datasheet";
    v.push_back(d);
  }
  {
    // NVIDIA H200 datasheet: https://www.nvidia.com/en-us/data-center/h200/ (same compute as H100 SXM)
    DeviceSpec d = gpu("h200", "NVIDIA H200 SXM 141 GB");
    d.fp32_flops = 67 * T;           // datasheet: FP32 67 TFLOPS
    d.tf32_flops = 494.7 * T;        // datasheet: TF32 989 TFLOPS with sparsity
    d.bf16_flops = 989.4 * T;        // datasheet: BF16 1,979 TFLOPS with sparsity
    d.vec16_flops = 133.8 * T;
    d.mem_bytes = 141 * G;           // datasheet: 141 GB HBM3e
    d.usable_bytes = cuda_usable(141 * G);
    d.mem_bw = 4800 * G;             // datasheet: 4.8 TB/s
    d.link_bw = 450 * G;             // datasheet: NVLink 900 GB/s
    d.power_w = 700;                 // datasheet: up to 700 W
    d.matrix_eff = 0.8;              // measured: ~790 TFLOP/s on 8192^3 bf16 (shared/accelerators.md)
    d.bw_eff = 0.9;                  // measured: ~4.3 TB/s device-to-device copy
    d.source = "nvidia.com H200 page";
    v.push_back(d);
  }
  // Google TPU v3: https://cloud.google.com/tpu/docs/v3 — per chip (2 TensorCores): 123 TFLOP/s
  // bf16, 32 GiB HBM2 at 900 GB/s, measured power 123/220/262 W (min/mean/max), all-reduce
  // bandwidth per 1024-chip pod 340 TB/s (-> ~332 GB/s per chip, 166 GB/s per core).
  // A v3 core sees 16 GiB; programs run out near 14.5 GB (reported by practitioners; XLA keeps
  // program, infeed and scratch buffers there), so 14.5 GB is the usable figure.
  for (int cores : {1, 8}) {
    DeviceSpec d = tpu_core(cores == 1 ? "tpu-v3-core" : "tpu-v3-8",
                            cores == 1 ? "Google TPU v3, one TensorCore (16 GiB)" : "Google TPU v3-8 board (4 chips, 8 cores, data parallel)");
    d.replicas = cores;
    d.bf16_flops = 123 * T / 2;      // 123 TFLOP/s per chip, 2 cores
    d.fp32_flops = 123 * T / 2 / 16; // vector unit: not published; estimate 1/16 of the MXU (elementwise is bandwidth-bound anyway)
    d.vec16_flops = d.fp32_flops;
    d.mem_bytes = 16 * GiB;          // 32 GiB per chip
    d.usable_bytes = 14.5 * G;
    d.mem_bw = 900 * G / 2;          // 900 GB/s per chip
    d.link_bw = 340e12 / 1024 / 2;   // pod all-reduce bandwidth per core
    d.power_w = 220.0 / 2;           // mean measured power per chip, per core
    d.source = "cloud.google.com/tpu/docs/v3";
    v.push_back(d);
  }
  // Google TPU v4: https://cloud.google.com/tpu/docs/v4 — per chip (2 TensorCores as one
  // "megacore" device): 275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s, measured power 90/170/192 W,
  // all-reduce bandwidth per 4096-chip pod 1.1 PB/s (-> ~268 GB/s per chip). A v4-8 is 4 chips.
  for (int chips : {1, 4}) {
    DeviceSpec d = tpu_core(chips == 1 ? "tpu-v4-chip" : "tpu-v4-8",
                            chips == 1 ? "Google TPU v4, one chip (32 GiB)" : "Google TPU v4-8 board (4 chips, data parallel)");
    d.replicas = chips;
    d.bf16_flops = 275 * T;
    d.fp32_flops = 275 * T / 16;     // vector unit: not published; estimate as for v3
    d.vec16_flops = d.fp32_flops;
    d.mem_bytes = 32 * GiB;
    d.usable_bytes = 30 * G;         // assumption: same ~10% reserve as a v3 core
    d.mem_bw = 1200 * G;
    d.link_bw = 1.1e15 / 4096;
    d.power_w = 170;
    d.source = "cloud.google.com/tpu/docs/v4";
    v.push_back(d);
  }
  return v;
}

namespace {

void set_from_json(DeviceSpec& d, const nlohmann::json& j) {
  auto num = [&](const char* key, double& out, double scale) {
    if (j.contains(key)) out = j.at(key).get<double>() * scale;
  };
  if (j.contains("description")) d.description = j.at("description").get<std::string>();
  if (j.contains("source")) d.source = j.at("source").get<std::string>();
  if (j.contains("replicas")) d.replicas = j.at("replicas").get<int>();
  num("fp32_tflops", d.fp32_flops, T);
  num("tf32_tflops", d.tf32_flops, T);
  num("bf16_tflops", d.bf16_flops, T);
  num("vec16_tflops", d.vec16_flops, T);
  num("mem_gb", d.mem_bytes, G);
  num("usable_gb", d.usable_bytes, G);
  num("mem_bw_gbs", d.mem_bw, G);
  num("link_bw_gbs", d.link_bw, G);
  num("link_latency_us", d.link_latency_s, 1e-6);
  num("power_w", d.power_w, 1);
  num("matrix_eff", d.matrix_eff, 1);
  num("vector_eff", d.vector_eff, 1);
  num("bw_eff", d.bw_eff, 1);
  num("link_eff", d.link_eff, 1);
  num("launch_us", d.launch_s, 1e-6);
  num("fp32_matmul_passes", d.fp32_matmul_passes, 1);
  if (j.contains("tile_mn")) d.tile_mn = j.at("tile_mn").get<int64_t>();
  if (j.contains("tile_k")) d.tile_k = j.at("tile_k").get<int64_t>();
  // What changes the plan: "alignment" (bytes), "layout_tile": [rows, cols], "dtypes": ["float32", ...].
  if (j.contains("alignment")) d.alignment = j.at("alignment").get<size_t>();
  if (j.contains("layout_tile")) {
    auto t = j.at("layout_tile").get<std::vector<int64_t>>();
    if (t.size() != 2 || t[0] < 1 || t[1] < 1) fail("advise", "device '" + d.name + "': layout_tile must be [rows, cols], both positive", "");
    d.layout_tile_rows = t[0], d.layout_tile_cols = t[1];
  }
  if (j.contains("dtypes")) {
    d.dtypes.clear();
    for (auto& name : j.at("dtypes").get<std::vector<std::string>>()) {
      bool known = false;
      for (DType t : {DType::Bool, DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64})
        if (name == dtype_name(t)) d.dtypes.push_back(t), known = true;
      if (!known) fail("advise", "device '" + d.name + "': unknown dtype '" + name + "'", "");
    }
  }
}

}  // namespace

std::vector<DeviceSpec> load_devices_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("advise", "cannot read the device file '" + path + "'", "");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    fail("advise", "device file '" + path + "' is not valid JSON: " + e.what(), "");
  }
  if (j.is_object()) j = nlohmann::json::array({j});
  if (!j.is_array()) fail("advise", "device file '" + path + "' must hold a JSON array of devices", "");
  std::vector<DeviceSpec> out;
  for (auto& e : j) {
    try {
      if (!e.contains("name")) fail("advise", "a device in '" + path + "' has no \"name\"", "");
      std::string cls = e.value("cls", std::string("gpu-tc"));
      DeviceSpec d = cls == "tpu" ? tpu_core("", "") : gpu("", "");
      d.cls = cls;
      d.name = e.at("name").get<std::string>();
      d.description = d.name + " (from " + path + ")";
      d.source = path;
      set_from_json(d, e);
      if (d.usable_bytes <= 0) d.usable_bytes = d.mem_bytes;
      if (d.alignment < 64 || (d.alignment & (d.alignment - 1)))
        fail("advise", "device '" + d.name + "' in '" + path + "': alignment must be a power of two of at least 64 bytes", "");
      if (d.fp32_flops <= 0 || d.mem_bytes <= 0 || d.mem_bw <= 0)
        fail("advise", "device '" + d.name + "' in '" + path + "' needs fp32_tflops, mem_gb and mem_bw_gbs (all positive)", "");
      out.push_back(d);
    } catch (const nlohmann::json::exception& ex) {
      fail("advise", "device file '" + path + "': " + ex.what(), "");
    }
  }
  return out;
}

// ---- the host: microbenchmarks through Tessera's own cpu device -----------------------------
namespace {

using clk = std::chrono::steady_clock;

// Fastest of `reps` runs of make().item() (the first compiles; the rest hit the cache). The
// fastest, not the median: the achievable rate, robust to other work on shared cores.
template <class F>
double best_time(int reps, F make) {
  make().item();  // compile + warm the allocator
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    Tensor x = make();
    auto t0 = clk::now();
    x.item();
    t.push_back(std::chrono::duration<double>(clk::now() - t0).count());
  }
  return *std::min_element(t.begin(), t.end());
}

std::string cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tessera";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tessera";
  return "";
}

std::string threads_key() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  return omp && *omp ? omp : std::to_string(std::thread::hardware_concurrency());
}

DeviceSpec host_base() {
  DeviceSpec d;
  d.name = "host";
  d.cls = "cpu";
  d.matrix_eff = d.vector_eff = d.bw_eff = 1;  // calibrated rates are achieved rates
  d.link_eff = 1;
  d.link_bw = 0;
  double pages = double(sysconf(_SC_PHYS_PAGES)), page = double(sysconf(_SC_PAGESIZE));
  d.mem_bytes = d.usable_bytes = pages * page;
  d.power_w = 0;  // unknown
  d.tile_mn = d.tile_k = 1;
  d.add_trace_time = true;  // the cpu runtime traces, compiles (cache hit) and runs synchronously
  return d;
}

DeviceSpec calibrate() {
  DeviceSpec d = host_base();
  TensorOptions f32{DType::Float32, Device("cpu")};
  // Per-Step overhead: a chain of 64 tiny matmuls (Gemm Steps cannot fuse).
  Tensor a = randn({4, 4}, f32);
  sync();
  const int chain = 64;
  int64_t s0 = metrics().steps_launched;
  double t_chain = best_time(7, [&] {
    Tensor x = a;
    for (int i = 0; i < chain; ++i) x = matmul(x, a) * 0.5;
    return x.sum();
  });
  int64_t steps_per_run = (metrics().steps_launched - s0) / 8;
  d.launch_s = t_chain / double(std::max<int64_t>(steps_per_run, 1));
  // GEMM: t(f) = f / peak + c at two sizes; gemm_half_flops = c * peak (see advise.h).
  auto gemm_time = [&](int64_t n) {
    Tensor x = randn({n, n}, f32), y = randn({n, n}, f32);
    sync();
    return best_time(5, [&] { return matmul(x, y).sum(); }) - 2 * d.launch_s;
  };
  const double n1 = 128, n2 = 1024;
  double f1 = 2 * n1 * n1 * n1, f2 = 2 * n2 * n2 * n2;
  double t1 = gemm_time(int64_t(n1)), t2 = gemm_time(int64_t(n2));
  double peak = (f2 - f1) / std::max(t2 - t1, 1e-9);
  double c = std::max(0.0, t1 - f1 / peak);
  d.gemm_flops = peak;
  d.gemm_half_flops = c * peak;
  // Elementwise rate as the cost model counts it (one flop per op per element): a fused chain of
  // 9 ops with tanh and exp over 256K floats (cache-resident: compute, not bandwidth).
  {
    const int64_t ne = int64_t(1) << 18;
    Tensor x = randn({ne}, f32);
    sync();
    double t_vec = best_time(5, [&] { return (tanh(x * 1.1 + 0.3) * exp(x * x * -1.0) + x * 0.5).sum(); }) - 2 * d.launch_s;
    d.fp32_flops = 10.0 * double(ne) / std::max(t_vec, 1e-9);  // 9 elementwise ops + the sum's add
  }
  // Bandwidth: out = x + y over 8M floats (96 MB moved), less the overhead of its Steps.
  const int64_t n = int64_t(8) << 20;
  Tensor x = randn({n}, f32), y = randn({n}, f32);
  sync();
  double t_add = best_time(5, [&] { return (x + y * 1.5).sum(); }) - 2 * d.launch_s;
  d.mem_bw = 3.0 * 4 * double(n) / std::max(t_add, 1e-9);
  d.vec16_flops = 0;
  d.description = "this machine's CPU (" + threads_key() + " threads), calibrated";
  d.source = "microbenchmarks";
  return d;
}

}  // namespace

DeviceSpec host_device(bool recalibrate) {
  std::string dir = cache_dir();
  std::string path = dir.empty() ? "" : dir + "/host-" + threads_key() + ".json";
  if (!recalibrate && !path.empty()) {
    std::ifstream f(path);
    if (f) {
      try {
        nlohmann::json j;
        f >> j;
        DeviceSpec d = host_base();
        d.fp32_flops = j.at("fp32_flops").get<double>();
        d.gemm_flops = j.at("gemm_flops").get<double>();
        d.gemm_half_flops = j.at("gemm_half_flops").get<double>();
        d.mem_bw = j.at("mem_bw").get<double>();
        d.launch_s = j.at("launch_s").get<double>();
        d.description = j.at("description").get<std::string>();
        d.source = "microbenchmarks cached in " + path;
        return d;
      } catch (const std::exception&) {
        // unreadable cache: calibrate again
      }
    }
  }
  DeviceSpec d = calibrate();
  if (!path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream f(path);
    if (f) {
      nlohmann::json j = {{"fp32_flops", d.fp32_flops}, {"gemm_flops", d.gemm_flops}, {"gemm_half_flops", d.gemm_half_flops},
                          {"mem_bw", d.mem_bw}, {"launch_s", d.launch_s}, {"description", d.description}};
      f << j.dump(2) << "\n";
    }
  }
  return d;
}

DeviceSpec find_device(const std::vector<DeviceSpec>& devs, const std::string& name) {
  if (name == "host") return host_device();
  std::string names;
  for (auto& d : devs) {
    if (d.name == name) return d;
    names += (names.empty() ? "" : ", ") + d.name;
  }
  fail("advise", "unknown device '" + name + "' (devices: " + names + ", host)", "");
}

}  // namespace tessera::advise
