// The advisor's device table, user devices from JSON, and the calibrated host.
//
// Every figure carries its source. "[V]" marks a figure checked against a public page (the page
// is named); "[S]" one checked only against secondary spec pages that agree with each other;
// "[A]" an assumption or estimate of this project, not a published figure. Figures are dense
// peaks (NVIDIA pages often print the 2:4-sparse tensor figure, twice these).
// Achievable fractions per class, applied to the peaks by the cost model [A], calibrated where a
// device was at hand:
//   gpu-tc / gpu:  matrix 0.75 of the tensor-core peak on large GEMMs (measured on this project's
//                  lent H200: ~790 of 989 TFLOP/s at 8192^3 bf16 through PyTorch, 0.80; smaller
//                  training GEMMs do worse), vector 0.8, memory 0.85 (same H200: device copy
//                  ~4.3 of 4.8 TB/s, 0.9), interconnect 0.8 (NVIDIA/nccl issue #1264: H100 NVLink
//                  p2p 376-380 of 450 GB/s per direction, 0.84), 5 us per Step (kernel launch +
//                  dispatch of an eager runtime; CUDA graphs would be ~2 us).
//   tpu:           matrix 0.8 (XLA fuses and tiles for the 128x128 MXU), memory 0.85, 1 us per
//                  Step (one compiled XLA program: no per-op host launch).
//   cpu (host):    calibrated, not assumed (host_device()).
// Padding [A, after NVIDIA's "Matrix Multiplication Background User's Guide", tile
// quantization]: tensor cores run M,N in 64-wide tiles and K in multiples of 16 (bf16/fp16) or
// 8; a TPU MXU is 128x128 (cloud.google.com/tpu/docs/performance-guide: "128 x 128 matrix unit"),
// so M,N,K are padded to 128. float32 on a TPU's MXU is emulated by bf16 passes: we model
// "HIGHEST" precision, 6 passes (XLA's bf16_6x), as float32 semantics. Float32 matmuls on NVIDIA
// parts run on the CUDA cores at the fp32 rate (PyTorch's default since 1.12: TF32 off for
// matmul); tf32_flops is recorded but not used.
// NVIDIA's memory sizes are binary: an "A100 40 GB" reports 42,405,855,232 B (> 40e9) to CUDA,
// so mem_bytes is the printed figure in GiB. Usable memory of an NVIDIA GPU: what CUDA reports as
// total (deviceQuery) less 0.6 GB [A] for the CUDA context, cuBLAS workspace and allocator slack.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "tessera/advise.h"
#include "tessera/autocast.h"
#include "backends/backend.h"
#include "core/fail.h"
#include "tessera/metrics.h"
#include "tessera/ops.h"
#include "tessera/profiler.h"

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
  d.link_latency_s = 10e-6;  // [A] NCCL ring step latency, order of 10 us
  d.tile_mn = 64, d.tile_k = 16;
  // cudaMalloc returns 256-byte aligned memory (CUDA C Best Practices Guide, "Device memory
  // allocation"; RAPIDS rmm's CUDA_ALLOCATION_ALIGNMENT is 256): the arena aligns temporaries so.
  d.alignment = 256;
  return d;
}

// Usable bytes from what CUDA reports as the device's total memory (see the header).
double cuda_usable(double visible) { return visible - 0.6 * G; }
// Visible bytes of an HBM part of `gib` nominal GiB where no deviceQuery was found [A]: the A100
// 40 GB's measured ratio (42,405,855,232 B of 40 GiB, 0.987; the smallest of the parts checked),
// which also gives the ~139 GiB the H200 lent to this project reports for "141 GB".
double hbm_visible(double gib) { return 0.987 * gib * GiB; }

DeviceSpec tpu_core(std::string name, std::string desc) {
  DeviceSpec d;
  d.name = std::move(name);
  d.description = std::move(desc);
  d.cls = "tpu";
  d.matrix_eff = 0.8, d.vector_eff = 0.8, d.bw_eff = 0.85, d.link_eff = 0.8;
  d.launch_s = 1e-6;
  d.link_latency_s = 5e-6;   // [A] ICI hop latency
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

// The NVIDIA GPUs of the table, oldest first.
std::vector<DeviceSpec> nvidia_devices() {
  std::vector<DeviceSpec> v;
  {
    // NVIDIA T4 (Turing, PCIe). [S] sysrqmts.com/en/gpus/nvidia/tesla/t4 (FP32 8.141, FP16 65.13
    // TFLOPS, 16 GB GDDR6, 320.0 GB/s, 70 W) and archive-lib.hpctech.co.jp/gpuproduct/tesla-t4
    // agree with NVIDIA's T4 datasheet figures (8.1 / 65 / 320+ GB/s / 70 W), which could not be
    // opened here.
    DeviceSpec d = gpu("t4", "NVIDIA T4 16 GB (Turing, PCIe)");
    d.fp32_flops = 8.1 * T;          // [S] 8.1 TFLOPS FP32
    d.bf16_flops = 65 * T;           // [S] 65 TFLOPS FP16 tensor, FP32 accumulate (Turing has no bf16: fp16 stands in)
    d.vec16_flops = 16.2 * T;        // [A] FP16 on the CUDA cores at 2x FP32 (Turing)
    d.mem_bytes = 16 * GiB;          // [S] 16 GB GDDR6 (NVIDIA's memory "GB" are GiB: see the header)
    d.usable_bytes = cuda_usable(15835660288.0);  // [V] deviceQuery of a T4: 15,835,660,288 B (ECC on), gist.github.com/Terminus-IMRC/5e4b7782c27106dec287050b323cd059
    d.mem_bw = 320 * G;              // [S] 320 GB/s
    d.link_bw = 15.75 * G;           // [A] PCIe 3.0 x16 per direction (8 GT/s x 16 x 128/130); no NVLink
    d.link = "PCIe 3.0 x16";
    d.power_w = 70;                  // [S] 70 W
    d.source = "T4 figures as NVIDIA's datasheet prints them, checked on secondary spec pages";
    v.push_back(d);
    // Two T4s in one machine, data parallel (Kaggle's "GPU T4 x2"). No NVLink; in a cloud VM the
    // pair usually has no peer-to-peer path either, so NCCL stages the ring through host memory
    // (its SHM transport): each byte crosses a PCIe link out and another in, and the copies through
    // host memory cost besides [A: half of PCIe's achievable rate, link_eff 0.4; not measured].
    d.name = "t4x2";
    d.description = "2 x NVIDIA T4 16 GB in one machine (Kaggle's T4 x2), data parallel over PCIe";
    d.replicas = 2;
    d.link_eff = 0.4;
    d.link = "PCIe 3.0 x16 via host";
    v.push_back(d);
  }
  {
    // NVIDIA Tesla P100 PCIe 16 GB (Pascal, no tensor cores). [S] tech4gamers.com and the
    // Tesla-series table there (PCIe: 9.3 TFLOPS single, 18.7 half, 250 W); 732 GB/s for the 16 GB
    // PCIe part as announced (techrival.com, techwormam: "732GB/s and 549GB/s"); NVIDIA's P100
    // whitepaper prints 720 GB/s for the SXM2 part.
    DeviceSpec d = gpu("p100", "NVIDIA P100 PCIe 16 GB (Pascal, no tensor cores)");
    d.cls = "gpu";
    d.fp32_flops = 9.3 * T;          // [S] 9.3 TFLOPS single precision (PCIe)
    d.bf16_flops = 0;                // no tensor cores
    d.vec16_flops = 18.7 * T;        // [S] 18.7 TFLOPS half precision (no bf16 at all: fp16 stands in)
    d.mem_bytes = 16 * GiB;          // [S] 16 GB CoWoS HBM2
    d.usable_bytes = cuda_usable(hbm_visible(16));
    d.mem_bw = 732 * G;              // [S] 732 GB/s (16 GB PCIe)
    d.link_bw = 15.75 * G;           // [A] PCIe 3.0 x16 per direction
    d.link = "PCIe 3.0 x16";
    d.power_w = 250;                 // [S] 250 W
    d.tile_mn = 32, d.tile_k = 1;    // [A] SIMT sgemm tiles
    d.source = "P100 PCIe figures from launch coverage of NVIDIA's announcement (secondary)";
    v.push_back(d);
  }
  for (double gb : {16.0, 32.0}) {
    // NVIDIA V100 SXM2 16/32 GB. [S] huggingface.co/RajBhope/gpu-runtime-predictor gpu_catalog
    // (15.7 FP32, 125 FP16 tensor, 900 GB/s, 300 W) and the V100 spec summary at
    // grokipedia.opelly.me (15.7 TFLOPS FP32, 125 TFLOPS tensor, 16/32 GB HBM2); NVIDIA's V100
    // datasheet could not be opened here. Pre-launch figures (15 / 120 TFLOPS at 1455 MHz,
    // techrival.com) are superseded.
    DeviceSpec d = gpu(gb == 16 ? "v100-16" : "v100-32", gb == 16 ? "NVIDIA V100 SXM2 16 GB" : "NVIDIA V100 SXM2 32 GB");
    d.fp32_flops = 15.7 * T;         // [S] 15.7 TFLOPS single precision (SXM2)
    d.bf16_flops = 125 * T;          // [S] 125 TFLOPS tensor (fp16; Volta has no bf16: fp16 stands in)
    d.vec16_flops = 31.4 * T;        // [A] 2x FP32 on the CUDA cores
    d.mem_bytes = gb * GiB;          // [S] 16 or 32 GB HBM2
    d.usable_bytes = cuda_usable(hbm_visible(gb));
    d.mem_bw = 900 * G;              // [S] 900 GB/s
    d.link_bw = 150 * G;             // [S] NVLink 300 GB/s both directions (NVIDIA's figure), 150 per direction
    d.link = "NVLink 2";
    d.power_w = 300;                 // [S] 300 W
    d.tile_k = 8;
    d.source = "V100 SXM2 figures as NVIDIA's datasheet prints them, checked on secondary pages";
    v.push_back(d);
  }
  for (double gb : {40.0, 80.0}) {
    // NVIDIA A100 SXM4 40/80 GB. [V] glennklockwood.com/garden/processors/A100 (tabulated from
    // NVIDIA's A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: FP32 19.5,
    // TF32 156, BF16/FP16 312 dense; 1.555 TB/s (40 GB), 2.039 TB/s (80 GB); 300+300 GB/s
    // NVLink; 400 W), agreeing with the Paderborn PC2 system page and thundercompute.com.
    DeviceSpec d = gpu(gb == 40 ? "a100-40" : "a100-80", gb == 40 ? "NVIDIA A100 SXM4 40 GB" : "NVIDIA A100 SXM4 80 GB");
    d.fp32_flops = 19.5 * T;         // [V] FP32 19.5 TFLOPS
    d.tf32_flops = 156 * T;          // [V] TF32 156 TFLOPS dense (312 with sparsity)
    d.bf16_flops = 312 * T;          // [V] BF16/FP16 tensor 312 TFLOPS dense (624 sparse)
    d.vec16_flops = 39 * T;          // [V] BF16 non-tensor 39 TFLOPS (NVIDIA's Hopper in-depth blog, table 3, quoted on forums.developer.nvidia.com/t/218102; FP16 non-tensor is 78)
    d.mem_bytes = gb * GiB;          // [V] 40 GB HBM2 / 80 GB HBM2e
    // [V] 40 GB: deviceQuery 42,405,855,232 B (upb-pc2.atlassian.net, "NVIDIA A100 40GB with NVLINK").
    d.usable_bytes = cuda_usable(gb == 40 ? 42405855232.0 : hbm_visible(80));
    d.mem_bw = (gb == 40 ? 1555 : 2039) * G;  // [V] 1,555 GB/s (40 GB), 2,039 GB/s (80 GB SXM)
    d.link_bw = 300 * G;             // [V] NVLink 300 GB/s per direction (600 both)
    d.link = "NVLink 3";
    d.power_w = 400;                 // [V] 400 W (SXM)
    d.source = "NVIDIA A100 datasheet (as tabulated by glennklockwood.com)";
    v.push_back(d);
  }
  {
    // NVIDIA H100 SXM5 80 GB. [V] archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100 (NVIDIA's H100
    // table: FP32 67, TF32 989*, BF16 1,979* TFLOPS, "* with sparsity, 1/2 lower without";
    // 3,350 GB/s; 700 W; NVLink 900 GB/s) and glennklockwood.com/garden/processors/h100 (dense:
    // FP32 66.9, TF32 494.7, BF16 989.4, FP16/BF16 vector 133.8).
    DeviceSpec d = gpu("h100", "NVIDIA H100 SXM5 80 GB");
    d.fp32_flops = 67 * T;           // [V] FP32 67 TFLOPS
    d.tf32_flops = 494.7 * T;        // [V] TF32 989 TFLOPS with sparsity -> 494.7 dense
    d.bf16_flops = 989.4 * T;        // [V] BF16 1,979 TFLOPS with sparsity -> 989.4 dense
    d.vec16_flops = 133.8 * T;       // [V] non-tensor FP16/BF16 (2x FP32, Klockwood's VFMA column)
    d.mem_bytes = 80 * GiB;          // [V] 80 GB HBM3
    d.usable_bytes = cuda_usable(hbm_visible(80));
    d.mem_bw = 3350 * G;             // [V] 3.35 TB/s
    d.link_bw = 450 * G;             // [V] NVLink 900 GB/s both directions, 450 per direction
    d.link = "NVLink 4";
    d.power_w = 700;                 // [V] up to 700 W
    d.matrix_eff = 0.8;              // measured on an H200 (same SMs): 790/989 at 8192^3 bf16
    d.source = "NVIDIA H100 SXM table (hpctech.co.jp), dense figures from glennklockwood.com";
    v.push_back(d);
  }
  {
    // NVIDIA H200 SXM 141 GB: the H100's GH100 with HBM3e. [V] MLPerf Inference v4.1 system
    // description H200-SXM-141GBx8 (141 GB HBM3e, "18x 4th Gen NVLink, 900GB/s", "H200 TGP
    // 700W"); 4.8 TB/s [S] (openmetal.io, aiminingco.com, geektopia.es on NVIDIA's SC23
    // announcement); compute as the H100 SXM (same die and clocks class).
    DeviceSpec d = gpu("h200", "NVIDIA H200 SXM 141 GB");
    d.fp32_flops = 67 * T;           // [S] as H100 SXM
    d.tf32_flops = 494.7 * T;        // [S] as H100 SXM (dense)
    d.bf16_flops = 989.4 * T;        // [S] BF16 1,979 TFLOPS with sparsity, as H100 SXM
    d.vec16_flops = 133.8 * T;
    d.mem_bytes = 141 * GiB;         // [V] 141 GB HBM3e
    d.usable_bytes = cuda_usable(hbm_visible(141));  // ~139 GiB, as the H200 lent to this project reports
    d.mem_bw = 4800 * G;             // [S] 4.8 TB/s
    d.link_bw = 450 * G;             // [V] NVLink 900 GB/s both directions
    d.link = "NVLink 4";
    d.power_w = 700;                 // [V] 700 W TGP
    d.matrix_eff = 0.8;              // measured: ~790 TFLOP/s on 8192^3 bf16 (shared/accelerators.md)
    d.bw_eff = 0.9;                  // measured: ~4.3 TB/s device-to-device copy
    d.source = "MLPerf H200 system description; bandwidth from NVIDIA's announcement (secondary)";
    v.push_back(d);
  }
  return v;
}

// Google's TPUs: a v3 core and board, a v4 chip and board.
std::vector<DeviceSpec> tpu_devices() {
  std::vector<DeviceSpec> v;
  // Google TPU v3. [V] cloud.google.com/tpu/docs/v3: per chip (2 TensorCores) 123 TFLOP/s bf16,
  // 32 GiB HBM2 at 900 GBps, measured power 123/220/262 W (min/mean/max), all-reduce bandwidth
  // per 1024-chip pod 340 TB/s (-> ~332 GB/s per chip, 166 GB/s per core). [V] A v3-8 is 8 cores
  // (cloud.google.com/tpu/docs/performance-guide: "all 8 cores of a TPU device (for example v2-8
  // or v3-8)"). A v3 core sees 16 GiB; XLA's out-of-memory reports give programs "15.48G"
  // (16 GiB less 530 MiB reserved; e.g. "Used 19.46G of 15.48G hbm" in public logs);
  // practitioners report running out near 14.5 GB [A: not found in a public source here], which
  // is the usable figure (XLA's own scoped buffers and fragmentation; tiling padding is modelled
  // separately in the plan).
  for (int cores : {1, 8}) {
    DeviceSpec d = tpu_core(cores == 1 ? "tpu-v3-core" : "tpu-v3-8",
                            cores == 1 ? "Google TPU v3, one TensorCore (16 GiB)" : "Google TPU v3-8 board (4 chips, 8 cores, data parallel)");
    d.replicas = cores;
    d.bf16_flops = 123 * T / 2;      // [V] 123 TFLOP/s per chip, 2 cores
    d.fp32_flops = 123 * T / 2 / 16; // [A] vector unit: not published; 1/16 of the MXU (elementwise is bandwidth-bound anyway)
    d.vec16_flops = d.fp32_flops;
    d.mem_bytes = 16 * GiB;          // [V] 32 GiB per chip
    d.usable_bytes = 14.5 * G;       // see above
    d.mem_bw = 900 * G / 2;          // [V] 900 GBps per chip
    d.link_bw = 340e12 / 1024 / 2;   // [V] pod all-reduce bandwidth per core
    d.link = "ICI (v3)";
    d.power_w = 220.0 / 2;           // [V] mean measured power per chip, per core
    d.source = "cloud.google.com/tpu/docs/v3";
    v.push_back(d);
  }
  // Google TPU v4. [V] cloud.google.com/tpu/docs/v4: per chip (2 TensorCores, one device):
  // 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GBps, measured power 90/170/192 W, all-reduce
  // bandwidth per 4096-chip pod 1.1 PB/s (-> ~268 GB/s per chip). [V] A v4-8 is 8 TensorCores =
  // 4 chips (cloud.google.com/tpu/docs/types-topologies: "v4-128 ... 128 TensorCores"). Usable:
  // [V] XLA reports "Used 63.80G of 30.75G hbm" with "reserved 1.25G" on a v4 chip (public
  // EasyDeL issue #166): 30.75 GiB.
  for (int chips : {1, 4}) {
    DeviceSpec d = tpu_core(chips == 1 ? "tpu-v4-chip" : "tpu-v4-8",
                            chips == 1 ? "Google TPU v4, one chip (32 GiB)" : "Google TPU v4-8 board (4 chips, data parallel)");
    d.replicas = chips;
    d.bf16_flops = 275 * T;          // [V]
    d.fp32_flops = 275 * T / 16;     // [A] vector unit: not published; estimate as for v3
    d.vec16_flops = d.fp32_flops;
    d.mem_bytes = 32 * GiB;          // [V]
    d.usable_bytes = 30.75 * GiB;    // [V] XLA's capacity figure
    d.mem_bw = 1200 * G;             // [V]
    d.link_bw = 1.1e15 / 4096;       // [V] pod all-reduce bandwidth per chip
    d.link = "ICI (v4)";
    d.power_w = 170;                 // [V] mean measured power
    d.source = "cloud.google.com/tpu/docs/v4";
    v.push_back(d);
  }
  return v;
}

}  // namespace

std::vector<DeviceSpec> builtin_devices() {
  std::vector<DeviceSpec> v = nvidia_devices();
  for (DeviceSpec& d : tpu_devices()) v.push_back(std::move(d));
  return v;
}

namespace {

void set_from_json(DeviceSpec& d, const nlohmann::json& j) {
  auto num = [&](const char* key, double& out, double scale) {
    if (j.contains(key)) out = j.at(key).get<double>() * scale;
  };
  if (j.contains("description")) d.description = j.at("description").get<std::string>();
  if (j.contains("source")) d.source = j.at("source").get<std::string>();
  if (j.contains("link")) d.link = j.at("link").get<std::string>();
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
  d.backend = "cpu";         // its plan is the cpu's own (the fused attention Steps, ...)
  return d;
}

// Row loops: layer norms (with weight and bias, one Row Step each) of [256, 64] and [1024, 128]
// (the GPT's at batch 4 and 16), each less its flops and bytes at d's rates (step_seconds' other
// terms): the rest is a line in its output elements, row_element_s per element + row_s.
// `vector_time` times a kernel as calibrate() does: {seconds less launch, flops, bytes}.
void calibrate_rows(DeviceSpec& d, const std::function<std::tuple<double, double, double>(const std::function<Tensor()>&)>& vector_time) {
  TensorOptions f32{DType::Float32, Device("cpu")};
  std::vector<std::pair<double, double>> pts;  // {elements, seconds beyond the flops and bytes}
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 64}, {1024, 128}}) {
    const int64_t R = rows, C = cols;  // a lambda may not capture a structured binding (clang 14)
    Tensor x = randn({R, C}, f32), w = randn({C}, f32), b = randn({C}, f32);
    sync();
    auto [t, flops, bytes] = vector_time([&] { return layer_norm(x, {C}, w, b); });
    StepCost fl, by;  // its flops and its bytes, each priced alone (a Row Step pays both)
    fl.kind = by.kind = "elementwise";
    fl.flops = flops, by.bytes = bytes;
    pts.push_back({double(R * C), t - (step_seconds(d, fl) - d.launch_s) - (step_seconds(d, by) - d.launch_s)});
  }
  const auto [el, c] = row_line(pts[0], pts[1]);
  d.row_element_s = el, d.row_s = c;
}

// The fused attention kernels, forward and backward, on the GPT's attention as the benchmark runs
// it (batch 16 x 4 heads, 64 positions, causal) at head dimensions 32 and 64 (the accuracy
// script's models'): each Step's own time, the median of 10 profiled runs (the fastest, as the other
// figures take, priced the step's attention Steps 6-17% under their median there, against -7 to
// +11% for the median, 2 x 2 alternating runs at L4 H4 E128 batch 16), less its bytes at the
// bandwidth curve's rate and the per-Step overhead, per (query, key) pair of its causal range
// against its products' flops per pair; the line through the two dimensions is {s per flop, s per
// pair} (row_line). Left 0 (attention then priced as any Step) when the pattern does not fuse or
// another Profiler is recording.
void calibrate_attention(DeviceSpec& d) {
  TensorOptions f32{DType::Float32, Device("cpu")}, i64{DType::Int64, Device("cpu")};
  const int64_t B = 16, H = 4, P = 64;
  std::vector<std::pair<double, double>> fwd, bwd;  // {flops per pair, seconds per pair}
  for (int64_t D : {32, 64}) {
    const int64_t C = H * D;
    Tensor qkv0 = randn({B, P, 3 * C}, f32), dy = randn({B, P, C}, f32);
    sync();
    // The pattern as nn::CausalSelfAttention traces it: Q, K, V the heads of one [B, T, 3C] product
    // (strided views), the output read as [B, T, C], the gradients written into one [B, T, 3C].
    auto make = [&] {
      Tensor qkv = qkv0.detach().requires_grad_();
      auto heads = [&](int64_t at) { return narrow(qkv, 2, at, C).reshape({B, P, H, D}).transpose(1, 2); };
      Tensor att = matmul(heads(0), heads(C).transpose(-2, -1)) * (1.0 / std::sqrt(double(D)));
      att = masked_fill(att, arange(0, double(P), 1, i64).reshape({1, P}) > arange(0, double(P), 1, i64).reshape({P, 1}), -INFINITY);
      Tensor y = matmul(softmax(att, -1), heads(2 * C)).transpose(1, 2).reshape({B, P, C});
      y.backward(dy);
      return std::vector<Tensor>{y, qkv.grad()};
    };
    std::vector<StepCost> attn;
    {
      std::vector<Tensor> probe = make();
      for (const StepCost& c : workload_of(probe).steps)
        if (c.kind == "attention" && c.attention_pairs > 0) attn.push_back(c);
      sync();
    }
    if (attn.size() != 2 || attn[0].attention_backward == attn[1].attention_backward) return;  // not fused both ways
    std::vector<double> runs[2];  // forward, backward
    try {
      Profiler prof(false);
      prof.start();
      for (int r = 0; r < 10; ++r) {
        std::vector<Tensor> out = make();
        sync();
      }
      prof.stop();
      for (const ProfileEvent& e : prof.events()) {
        if (e.type != "step" || e.kind != "attention") continue;
        const bool back = std::any_of(e.ops.begin(), e.ops.end(), [](const ProfiledOp& o) { return o.op == "attention_backward"; });
        runs[back].push_back(e.dur_us / 1e6);
      }
    } catch (const Error&) {
      return;  // another profiler records
    }
    for (const StepCost& c : attn) {
      std::vector<double>& v = runs[c.attention_backward];
      if (v.empty()) return;
      std::sort(v.begin(), v.end());
      const double t = v[v.size() / 2];
      double bw = d.mem_bw;
      for (const auto& [upto, r] : d.cache_bw)
        if (c.bytes <= upto) {
          bw = r;
          break;
        }
      const double rest = std::max(t - c.bytes / bw - d.launch_s, 1e-12);
      (c.attention_backward ? bwd : fwd).push_back({c.attention_flops / c.attention_pairs, rest / c.attention_pairs});
    }
  }
  const auto [f_s, f_pair] = row_line(fwd[0], fwd[1]);
  const auto [b_s, b_pair] = row_line(bwd[0], bwd[1]);
  if ((f_s <= 0 && f_pair <= 0) || (b_s <= 0 && b_pair <= 0)) return;
  d.attention_flops = f_s > 0 ? 1 / f_s : 1e30, d.attention_pair_s = f_pair;  // no slope: all per pair
  d.attention_bwd_flops = b_s > 0 ? 1 / b_s : 1e30, d.attention_bwd_pair_s = b_pair;
}

DeviceSpec calibrate_once() {
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
  // GEMM: t = f / peak + outputs * out_s + c per product (gemm_line, advise.h), fitted on the
  // products a training step runs: a linear layer's three, x[T, C] @ w[C, C] (forward),
  // dy @ w^T (the input's gradient) and x^T @ dy (the weight's: a transposed operand and a long K),
  // at three sizes, realized by sync() as the graph's outputs; their time less the graph's
  // per-Step overhead. The intercept c is per product (a group's is three products').
  // The bfloat16 line under Autocast, as the runtime runs it: the operands' rounding included.
  auto gemm_time = [&](int64_t T, int64_t C, int64_t N, bool bf16) {  // w: [C, N]
    Tensor x = randn({T, C}, f32), w = randn({C, N}, f32), dy = randn({T, N}, f32);
    sync();
    auto make = [&] {  // the three products, each an output (no reduction Steps to time besides)
      std::optional<Autocast> ac;
      if (bf16) ac.emplace(DType::BFloat16);
      return std::vector<Tensor>{matmul(x, w), matmul(dy, w.transpose(0, 1)), matmul(x.transpose(0, 1), dy)};
    };
    {
      auto warm = make();
      sync();
    }
    // Fastest of 25 at the small size (~0.15 ms a run: its time sets the line's intercept, which
    // a few slow runs on a shared machine moved by 5x with 5), of 5 at the large (~20 ms).
    const int reps = T * C * N < (int64_t(1) << 26) ? 25 : 5;
    const int64_t s1 = metrics().steps_launched;
    std::vector<double> ts;
    for (int r = 0; r < reps; ++r) {
      auto out = make();
      auto t0 = clk::now();
      sync();
      ts.push_back(std::chrono::duration<double>(clk::now() - t0).count());
    }
    const double steps = double(metrics().steps_launched - s1) / reps;
    return std::max(*std::min_element(ts.begin(), ts.end()) - steps * d.launch_s, 1e-9);
  };
  // Two layers {T, C, N} (w: [C, N]): T = 256, C = N = 128 and T = 2048, C = N = 512: the line
  // through them, its intercept shared by each group's three products. (A third layer, the GPT's
  // MLP fc at batch 16, T = 1024, C = 128, N = 512, for a per-output term ran at or above the
  // line in every calibration: the fit dropped the term and the intercept with it, leaving small
  // products 13-22% under-predicted.)
  for (bool bf16 : {false, true}) {
    std::vector<GemmSample> groups;
    for (auto [T, C, N] : {std::tuple<int64_t, int64_t, int64_t>{256, 128, 128}, {2048, 512, 512}}) {
      GemmSample g;
      g.flops = 3 * 2 * double(T) * double(C) * double(N);
      g.outputs = double(T) * double(N) + double(T) * double(C) + double(C) * double(N);  // x @ w, dy @ w^T, x^T @ dy
      g.products = 3;
      g.seconds = gemm_time(T, C, N, bf16);
      groups.push_back(g);
    }
    const GemmLine line = gemm_line(groups);
    (bf16 ? d.gemm_bf16_flops : d.gemm_flops) = line.peak_flops;
    (bf16 ? d.gemm_bf16_half_flops : d.gemm_half_flops) = line.half_flops;
    (bf16 ? d.gemm_bf16_out_s : d.gemm_out_s) = line.out_s;
  }
  // The vector rates as the cost model counts them (one flop per op per element), each from a
  // fused chain whose flops and bytes are what the compiler's cost rules give its plan (the same
  // rules that price the priced Steps), over operands that stay in the caches.
  // Arithmetic: 9 multiplies and adds with tensor operands (as most of a model's elementwise
  // operands are; a scalar constant is cheaper on the cpu backend) over 256K floats.
  auto plan_cost = [](const Tensor& t) {
    double flops = 0, bytes = 0;
    for (const StepCost& c : workload_of({t}).steps) flops += c.flops, bytes += c.bytes;
    return std::make_pair(flops, bytes);
  };
  // Fastest of 10 runs of make() realized by sync() (its result written, as a model's Steps
  // write theirs), less the per-Step overhead of its Steps; with its plan's flops and bytes.
  auto vector_time = [&](const std::function<Tensor()>& make) {
    Tensor probe = make();
    auto [flops, bytes] = plan_cost(probe);
    sync();
    std::vector<double> ts;
    const int64_t s1 = metrics().steps_launched;
    for (int r = 0; r < 10; ++r) {
      Tensor out = make();
      auto t0 = clk::now();
      sync();
      ts.push_back(std::chrono::duration<double>(clk::now() - t0).count());
    }
    const double steps = double(metrics().steps_launched - s1) / 10;
    const double t = *std::min_element(ts.begin(), ts.end());
    return std::make_tuple(std::max(t - steps * d.launch_s, 1e-9), flops, bytes);
  };
  const int64_t ne = int64_t(1) << 18;
  {
    Tensor x = randn({ne}, f32), a = randn({ne}, f32), b = randn({ne}, f32);
    sync();
    auto [t_ar, f_ar, b_ar] = vector_time([&] { return (((x * a + b) * x - a) * b + x) * a - b; });
    d.fp32_flops = f_ar / t_ar;
    // Transcendental: erf and exp of the same operands (GELU's and softmax's, which the cpu's
    // native loops compute inline; a tanh would send the whole Step to the interpreter, ~3x
    // slower, which the GPT's step never runs); their time less the chain's arithmetic flops (a
    // multiply and an add) at the arithmetic rate.
    auto [t_tr, f_tr, b_tr] = vector_time([&] { return erf(x) * exp(a) + b; });
    const double f_trans = 2.0 * double(ne);
    d.transcendental_flops = f_trans / std::max(t_tr - (f_tr - f_trans) / d.fp32_flops, 1e-9);
  }
  // Bandwidth: out = x + y * 1.5 (its plan's bytes: 12 per element), over sizes from what stays
  // in a core's cache to what fills the last level's (a model's Steps span them) and over 8M
  // floats (the DRAM stream, mem_bw).
  auto stream = [&](int64_t n) {
    Tensor x = randn({n}, f32), y = randn({n}, f32);
    sync();
    auto [t, flops, bytes] = vector_time([&] { return x + y * 1.5; });
    return std::make_pair(bytes, bytes / t);
  };
  d.cache_bw.clear();
  for (int64_t n : {int64_t(1) << 16, int64_t(1) << 18, int64_t(1) << 20, int64_t(1) << 21, int64_t(1) << 22})
    d.cache_bw.push_back(stream(n));
  d.mem_bw = stream(int64_t(8) << 20).second;
  // A column sum, as the backward pass reduces a bias's gradient: [2048, 256] over its rows (2 MB).
  {
    Tensor x = randn({2048, 256}, f32);
    sync();
    auto [t, flops, bytes] = vector_time([&] { return x.sum({0}); });
    d.reduce_bw = bytes / t;
  }
  calibrate_rows(d, vector_time);
  calibrate_attention(d);
  d.vec16_flops = 0;
  d.description = "this machine's CPU (" + threads_key() + " threads), calibrated";
  d.source = "microbenchmarks";
  return d;
}

// The median of three calibrations, figure by figure (a line's two terms from the same
// calibration: the one whose line prices the GPT's typical Step at the median): one calibration
// disturbed by other work on a shared machine (a burst in one of its timings) moves none of them.
DeviceSpec calibrate() {
  std::vector<DeviceSpec> runs;
  for (int i = 0; i < 3; ++i) runs.push_back(calibrate_once());
  DeviceSpec d = runs[1];
  auto median = [&](auto get) {
    std::vector<double> v;
    for (const DeviceSpec& r : runs) v.push_back(get(r));
    std::sort(v.begin(), v.end());
    return v[1];
  };
  // The run whose price is the median, among the runs `good` accepts (all by default; the
  // attention terms: the runs that calibrated them, so a failed one, left 0, is not "cheapest").
  auto median_run = [&](auto price, auto good) -> const DeviceSpec& {
    std::vector<size_t> i;
    for (size_t k = 0; k < runs.size(); ++k)
      if (good(runs[k])) i.push_back(k);
    if (i.empty()) return runs[1];
    std::sort(i.begin(), i.end(), [&](size_t a, size_t b) { return price(runs[a]) < price(runs[b]); });
    return runs[i[(i.size() - 1) / 2]];
  };
  auto any = [](const DeviceSpec&) { return true; };
  d.launch_s = median([](const DeviceSpec& r) { return r.launch_s; });
  d.fp32_flops = median([](const DeviceSpec& r) { return r.fp32_flops; });
  d.transcendental_flops = median([](const DeviceSpec& r) { return r.transcendental_flops; });
  d.mem_bw = median([](const DeviceSpec& r) { return r.mem_bw; });
  d.reduce_bw = median([](const DeviceSpec& r) { return r.reduce_bw; });
  for (size_t k = 0; k < d.cache_bw.size(); ++k)
    d.cache_bw[k].second = median([&](const DeviceSpec& r) { return k < r.cache_bw.size() ? r.cache_bw[k].second : 0.0; });
  // The lines, at the GPT's (L4 H4 E128, batch 16) typical shapes: a [1024, 128] x [128, 128]
  // product, a layer norm of [1024, 128], its attention (64 x 2080 pairs, head dimension 32).
  const double f = 2.0 * 1024 * 128 * 128;
  const DeviceSpec& g32 = median_run([&](const DeviceSpec& r) { return (f + r.gemm_half_flops) / r.gemm_flops; }, any);
  d.gemm_flops = g32.gemm_flops, d.gemm_half_flops = g32.gemm_half_flops, d.gemm_out_s = g32.gemm_out_s;
  const DeviceSpec& g16 = median_run([&](const DeviceSpec& r) { return (f + r.gemm_bf16_half_flops) / r.gemm_bf16_flops; }, any);
  d.gemm_bf16_flops = g16.gemm_bf16_flops, d.gemm_bf16_half_flops = g16.gemm_bf16_half_flops, d.gemm_bf16_out_s = g16.gemm_bf16_out_s;
  const DeviceSpec& row = median_run([](const DeviceSpec& r) { return r.row_element_s * 131072 + r.row_s; }, any);
  d.row_element_s = row.row_element_s, d.row_s = row.row_s;
  const double pairs = 64.0 * 2080;
  auto attn = [&](double rate, double pair, double per_pair_flops) { return rate > 0 ? pairs * (per_pair_flops / rate + pair) : 0.0; };
  const DeviceSpec& af = median_run([&](const DeviceSpec& r) { return attn(r.attention_flops, r.attention_pair_s, 128); },
                                     [](const DeviceSpec& r) { return r.attention_flops > 0; });
  d.attention_flops = af.attention_flops, d.attention_pair_s = af.attention_pair_s;
  const DeviceSpec& ab = median_run([&](const DeviceSpec& r) { return attn(r.attention_bwd_flops, r.attention_bwd_pair_s, 320); },
                                     [](const DeviceSpec& r) { return r.attention_bwd_flops > 0; });
  d.attention_bwd_flops = ab.attention_bwd_flops, d.attention_bwd_pair_s = ab.attention_bwd_pair_s;
  return d;
}

}  // namespace

std::pair<double, double> row_line(std::pair<double, double> a, std::pair<double, double> b) {
  if (b.first == a.first) return {0, std::max(0.0, (a.second + b.second) / 2)};
  double slope = (b.second - a.second) / (b.first - a.first);
  double c = a.second - slope * a.first;
  if (slope < 0) slope = 0, c = (a.second + b.second) / 2;            // no per-element part
  if (c < 0) c = 0, slope = (a.first * a.second + b.first * b.second) /  // through the origin (least squares)
                              (a.first * a.first + b.first * b.first);
  return {std::max(0.0, slope), std::max(0.0, c)};
}

GemmLine gemm_line(const std::vector<GemmSample>& samples) {
  // Least squares over the terms in use (x: 1/peak, out_s, c); a negative out_s or c drops its term.
  auto solve = [&](bool use_out, bool use_c) {
    std::vector<int> terms = {0};
    if (use_out) terms.push_back(1);
    if (use_c) terms.push_back(2);
    const size_t n = terms.size();
    double A[3][4] = {};
    for (const GemmSample& g : samples) {
      const double row[3] = {g.flops, g.outputs, g.products};
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) A[i][j] += row[terms[i]] * row[terms[j]];
        A[i][n] += row[terms[i]] * g.seconds;
      }
    }
    for (size_t c = 0; c < n; ++c) {  // Gauss-Jordan with partial pivoting
      size_t p = c;
      for (size_t r = c + 1; r < n; ++r)
        if (std::abs(A[r][c]) > std::abs(A[p][c])) p = r;
      std::swap(A[c], A[p]);
      if (A[c][c] == 0) return std::array<double, 3>{-1, -1, -1};
      for (size_t r = 0; r < n; ++r) {
        if (r == c) continue;
        const double f = A[r][c] / A[c][c];
        for (size_t k = c; k <= n; ++k) A[r][k] -= f * A[c][k];
      }
    }
    std::array<double, 3> x = {0, 0, 0};
    for (size_t i = 0; i < n; ++i) x[size_t(terms[i])] = A[i][n] / A[i][i];
    return x;
  };
  const bool out_term = samples.size() >= 3;  // two samples: no output term, whatever the fit gives
  std::array<double, 3> x = solve(out_term, true);
  if (x[1] < 0 && x[2] < 0) x = solve(false, false);
  else if (x[1] < 0) x = solve(false, true);
  else if (x[2] < 0) x = solve(out_term, false);
  if (x[1] < 0 || x[2] < 0) x = solve(false, false);
  GemmLine l;
  if (x[0] <= 0) return l;  // no line: the caller's samples were degenerate
  l.peak_flops = 1 / x[0];
  l.out_s = x[1];
  l.half_flops = x[2] * l.peak_flops;
  return l;
}

DeviceSpec host_device(bool recalibrate) {
  std::string dir = cache_dir();
  // The version in the name is bumped when the cpu backend's speed changes (figures measured
  // on an older runtime would mispredict this one).
  std::string path = dir.empty() ? "" : dir + "/host-v6-" + threads_key() + ".json";
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
        d.gemm_bf16_flops = j.at("gemm_bf16_flops").get<double>();
        d.gemm_bf16_half_flops = j.at("gemm_bf16_half_flops").get<double>();
        d.gemm_out_s = j.at("gemm_out_s").get<double>();
        d.gemm_bf16_out_s = j.at("gemm_bf16_out_s").get<double>();
        d.mem_bw = j.at("mem_bw").get<double>();
        d.launch_s = j.at("launch_s").get<double>();
        d.transcendental_flops = j.at("transcendental_flops").get<double>();
        d.cache_bw = j.at("cache_bw").get<std::vector<std::pair<double, double>>>();
        d.reduce_bw = j.at("reduce_bw").get<double>();
        d.row_element_s = j.at("row_element_s").get<double>();
        d.row_s = j.at("row_s").get<double>();
        d.attention_flops = j.at("attention_flops").get<double>();
        d.attention_pair_s = j.at("attention_pair_s").get<double>();
        d.attention_bwd_flops = j.at("attention_bwd_flops").get<double>();
        d.attention_bwd_pair_s = j.at("attention_bwd_pair_s").get<double>();
        d.description = j.at("description").get<std::string>();
        d.source = "microbenchmarks cached in " + path;
        return d;
      } catch (const std::exception&) {
        // unreadable cache: calibrate again
      }
    }
  }
  DeviceSpec d = calibrate();
  // Not cached when the fused attention was not calibrated (another Profiler recording, the pass
  // switched off): this run prices it as any Step, the next calibrates again.
  if (!path.empty() && d.attention_flops > 0 && d.attention_bwd_flops > 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream f(path);
    if (f) {
      nlohmann::json j = {{"fp32_flops", d.fp32_flops}, {"gemm_flops", d.gemm_flops}, {"gemm_half_flops", d.gemm_half_flops},
                          {"gemm_bf16_flops", d.gemm_bf16_flops}, {"gemm_bf16_half_flops", d.gemm_bf16_half_flops},
                          {"gemm_out_s", d.gemm_out_s}, {"gemm_bf16_out_s", d.gemm_bf16_out_s},
                          {"mem_bw", d.mem_bw}, {"launch_s", d.launch_s}, {"description", d.description},
                          {"transcendental_flops", d.transcendental_flops}, {"cache_bw", d.cache_bw}, {"reduce_bw", d.reduce_bw},
                          {"row_element_s", d.row_element_s}, {"row_s", d.row_s},
                          {"attention_flops", d.attention_flops}, {"attention_pair_s", d.attention_pair_s},
                          {"attention_bwd_flops", d.attention_bwd_flops}, {"attention_bwd_pair_s", d.attention_bwd_pair_s}};
      f << j.dump(2) << "\n";
    }
  }
  return d;
}

namespace {
// "cuda" / "cuda:N": the table's spec of the GPU present there, matched by name ("NVIDIA H200" ->
// h200; between memory variants, the nearest in size), with the memory it reports. Read from the
// cuda backend's info line: "<name>, compute capability X.Y, N SMs, M GiB, ...".
DeviceSpec present_gpu(const std::vector<DeviceSpec>& devs, const Device& dev) {
  const std::string info = backends::backend_for(dev).info(dev.index).description;
  const std::string gpu = info.substr(0, info.find(", compute capability"));
  double bytes = 0;
  if (size_t at = info.find(" GiB"), from = info.rfind(", ", at); at != std::string::npos && from != std::string::npos)
    bytes = std::atof(info.substr(from + 2, at - from - 2).c_str()) * GiB;
  std::string lower = gpu;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  const DeviceSpec* best = nullptr;
  for (const DeviceSpec& d : devs)
    if (d.cls.rfind("gpu", 0) == 0 && lower.find(d.name.substr(0, d.name.find('-'))) != std::string::npos &&
        (!best || std::fabs(d.mem_bytes - bytes) < std::fabs(best->mem_bytes - bytes)))
      best = &d;
  if (!best)
    fail("advise", "the GPU at " + dev.str() + " (" + gpu + ") is not in the device table; describe it with --device-file", "");
  DeviceSpec d = *best;
  d.name = dev.str();
  d.description = gpu + " at " + dev.str() + ", modelled as " + best->name;
  if (bytes > 0) d.usable_bytes = cuda_usable(bytes);
  return d;
}
}  // namespace

DeviceSpec find_device(const std::vector<DeviceSpec>& devs, const std::string& name) {
  if (name == "host") return host_device();
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) return present_gpu(devs, Device(name));
  std::string names;
  for (auto& d : devs) {
    if (d.name == name) return d;
    names += (names.empty() ? "" : ", ") + d.name;
  }
  fail("advise", "unknown device '" + name + "' (devices: " + names + ", host)", "");
}

}  // namespace tessera::advise
