// The compiler's numbers, in one run:
//   1. an 8-op elementwise chain over 64 MiB of float32, fused into one Step, against std::memcpy
//      of 64 MiB (effective bandwidth = bytes read + bytes written over time), and the same chain
//      with every pass disabled (8 Steps);
//   2. cold compile time of the benchmark GPT's steady-state training-step graph (the model and
//      AdamW of bench/gpt_step.cpp), the compile cache cleared before each compile;
//   3. per-step overhead of that step on a cache hit: wall time of trace + sync minus the time
//      the runtime spends executing the Steps, split into tracing and sync outside execution.
//
//   OMP_NUM_THREADS=2 bench_compiler [--reps N] [--cold N] [--steps N] [--only chain|gpt]
//       (defaults 9, 7, 15; at least 7, 5 and 10; --only runs part 1, or parts 2 and 3, e.g. under perf)
//
// Every figure is a median over repetitions after a warm-up. The last line is machine-readable:
// RESULT bench_compiler threads=... fused_gbs=... memcpy_gbs=... ratio=... compile_ms=... ...
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tessera/tessera.h>

#include "bench_common.h"
#include "compiler/lower.h"
#include "runtime/compile_options.h"
#include "runtime/realize.h"

namespace ts = tessera;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Minor page faults of this process so far: a fresh 64 MiB output would fault in 16,384 pages.
int64_t minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_minflt);
}


[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_compiler: %s\n", what.c_str());
  std::exit(1);
}

// ---------------------------------------------------------------- 1. the 8-op chain vs memcpy

constexpr int64_t kElems = int64_t(16) << 20;           // 16 Mi float32 = 64 MiB
constexpr double kBytes = double(kElems) * sizeof(float);  // one pass over the array
constexpr double kMiB = 1024.0 * 1024.0;

// Exactly 8 elementwise ops, scalar constants only: mul, add, abs, add, mul, sub, maximum, mul.
ts::Tensor chain(const ts::Tensor& x) {
  ts::Tensor y = x * 1.5 + 0.25;   // 1 mul, 2 add
  y = ts::abs(y);                  // 3 abs
  y = (y + 0.5) * 0.75;            // 4 add, 5 mul
  y = ts::maximum(y - 0.125, ts::scalar_tensor(0.5));  // 6 sub, 7 maximum (a constant, broadcast)
  return y * 2.0;                  // 8 mul
}
float chain_ref(float x) {  // the same arithmetic in float32
  float y = std::fabs(x * 1.5f + 0.25f);
  y = (y + 0.5f) * 0.75f;
  y = std::max(y - 0.125f, 0.5f);
  return y * 2.0f;
}

struct ChainResult {
  double memcpy_ms, memcpy_par_ms, fused_sync_ms, fused_exec_ms, fused_trace_us, unfused_sync_ms, unfused_exec_ms;
  int64_t fused_steps, unfused_steps, fused_faults, unfused_faults;
};

ChainResult bench_chain(int reps) {
  std::vector<float> host(kElems);
  {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (float& v : host) v = dist(rng);
  }
  std::vector<float> dst(kElems, 0.f);  // touched, so memcpy never page-faults in the timed runs
  ts::Tensor x = ts::from_vector<float>(host, {kElems});
  ts::sync();  // x realized before anything is timed

  // One chain, fused or with every pass disabled: sync ms (-1 if it compiled), execute ms, trace us,
  // Steps launched and page faults during the sync.
  struct One { double sync_ms, exec_ms, trace_us; int64_t steps, faults; };
  ts::Tensor y;  // reassigned each time: the previous 64 MiB result goes back to the allocator's cache
  auto run_chain = [&](bool fused) -> One {
    ts::runtime::set_disabled_passes(fused ? "" : "all");
    y = ts::Tensor();  // free the previous result before tracing, so the output reuses its block
    auto t0 = Clock::now();
    y = chain(x);
    auto t1 = Clock::now();
    const ts::Metrics m0 = ts::metrics();
    const int64_t f0 = minor_faults();
    ts::sync();
    auto t2 = Clock::now();
    const int64_t faults = minor_faults() - f0;
    const ts::Metrics m1 = ts::metrics();
    ts::runtime::set_disabled_passes("");
    if (m1.graphs_compiled != m0.graphs_compiled) {
      // A compile inside a timed run (only expected in the warm-up).
      return {-1, -1, ms_between(t0, t1) * 1e3, m1.steps_launched - m0.steps_launched, faults};
    }
    return {ms_between(t1, t2), m1.execute_ms - m0.execute_ms, ms_between(t0, t1) * 1e3,
            m1.steps_launched - m0.steps_launched, faults};
  };
  auto run_memcpy = [&]() -> double {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), host.data(), size_t(kBytes));
    auto t1 = Clock::now();
    if (dst[kElems / 3] != host[kElems / 3]) die("memcpy check failed");
    return ms_between(t0, t1);
  };
  // The same bytes copied by every OpenMP thread, one contiguous chunk each (what the chain's
  // parallel loop can get from the memory system).
  auto run_memcpy_par = [&]() -> double {
    auto t0 = Clock::now();
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t chunk = (kElems + nt - 1) / nt, lo = std::min<int64_t>(kElems, chunk * t),
              hi = std::min<int64_t>(kElems, lo + chunk);
      std::memcpy(dst.data() + lo, host.data() + lo, size_t(hi - lo) * sizeof(float));
    }
    auto t1 = Clock::now();
    return ms_between(t0, t1);
  };

  // Warm-up: compiles both graphs, sizes the allocator's cache, and checks the values.
  One wf = run_chain(true);
  {
    std::vector<float> got = y.to_vector<float>();
    for (int64_t i = 0; i < kElems; ++i)
      if (std::fabs(got[i] - chain_ref(host[i])) > 1e-6f * std::max(1.f, std::fabs(got[i])))
        die("fused chain differs at " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " +
            std::to_string(chain_ref(host[i])));
  }
  One wu = run_chain(false);
  run_chain(true);
  run_chain(false);
  run_memcpy();
  run_memcpy_par();

  std::vector<double> mc, mcp, fs, fe, ft, us, ue;
  ChainResult r{};
  r.fused_steps = wf.steps;
  r.unfused_steps = wu.steps;
  for (int i = 0; i < reps; ++i) {  // interleaved, so every kind sees the same machine state
    mc.push_back(run_memcpy());
    mcp.push_back(run_memcpy_par());
    One f = run_chain(true);
    One u = run_chain(false);
    if (f.sync_ms < 0 || u.sync_ms < 0) die("a timed chain run compiled (the cache should hit)");
    if (f.steps != 1) die("the fused chain launched " + std::to_string(f.steps) + " Steps, expected 1");
    fs.push_back(f.sync_ms);
    fe.push_back(f.exec_ms);
    ft.push_back(f.trace_us);
    us.push_back(u.sync_ms);
    ue.push_back(u.exec_ms);
    r.fused_steps = f.steps;
    r.unfused_steps = u.steps;
    r.fused_faults = std::max(r.fused_faults, f.faults);
    r.unfused_faults = std::max(r.unfused_faults, u.faults);
  }
  y = ts::Tensor();
  r.memcpy_ms = median(mc);
  r.memcpy_par_ms = median(mcp);
  r.fused_sync_ms = median(fs);
  r.fused_exec_ms = median(fe);
  r.fused_trace_us = median(ft);
  r.unfused_sync_ms = median(us);
  r.unfused_exec_ms = median(ue);
  return r;
}

// ---------------------------------------------------------------- 2 and 3. the GPT training step

using namespace bench;

struct GptResult {
  double first_compile_ms = 0, cold_compile_ms = 0, cold_compile_min = 0, cold_compile_max = 0;
  int cold_n = 0;
  int64_t steps_in_plan = 0;
  std::string graph_nodes = "?";
  double total_ms = 0, exec_ms = 0, overhead_ms = 0, trace_ms = 0, sync_overhead_ms = 0;
  int warm_n = 0;
  double last_loss = 0;
};

GptResult bench_gpt(int cold, int steps) {
  ts::manual_seed(0);
  ts::nn::GPTConfig cfg{.vocab = kVocab, .block = kBlock, .embd = kEmbd, .heads = kHeads, .layers = kLayers,
                        .dropout = 0.0, .bias = true, .tied_head = false};
  ts::nn::GPT model(cfg);
  model.train();
  ts::optim::AdamW opt(model.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto batches = make_batches();
  ts::TensorOptions ids{ts::DType::Int64, ts::Device("cpu")};
  ts::sync();  // the parameters' initial values are realized before the first step

  int64_t step = 0;
  ts::Tensor loss;
  // One training step as bench/gpt_step.cpp runs it; returns the time stamps before the trace,
  // before loss.item() and after it.
  auto run_step = [&](bool clear_cache, Clock::time_point* t_trace_end) -> Clock::time_point {
    auto& [hx, hy] = batches[size_t(step % kBatches)];
    ++step;
    ts::Tensor x = ts::from_vector(hx, {kBatch, kBlock}, ids);
    ts::Tensor y = ts::from_vector(hy, {kBatch, kBlock}, ids);
    loss = model.loss(x, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    *t_trace_end = Clock::now();
    if (clear_cache) ts::runtime::clear_compile_cache();
    double l = loss.item();  // runs forward, backward and the update as one graph
    if (!std::isfinite(l)) die("loss became " + std::to_string(l));
    return Clock::now();
  };

  GptResult r;
  Clock::time_point te;
  // Steps 1 and 2 compile two graphs (no optimizer state yet, then the steady state).
  double c0 = ts::metrics().compile_ms;
  run_step(false, &te);
  r.first_compile_ms = ts::metrics().compile_ms - c0;
  run_step(false, &te);
  run_step(false, &te);  // a cache hit: the steady state exists

  // 2. Cold compiles: the cache is cleared after tracing each step, so its sync compiles the
  // steady-state graph afresh (build graph + passes + lowering + backend kernels: compile_ms).
  std::vector<double> cms;
  for (int i = 0; i < cold; ++i) {
    const ts::Metrics m0 = ts::metrics();
    run_step(true, &te);
    const ts::Metrics m1 = ts::metrics();
    if (m1.graphs_compiled - m0.graphs_compiled != 1) die("a cold step did not compile exactly one graph");
    cms.push_back(m1.compile_ms - m0.compile_ms);
    if (!m1.compile_reasons.empty()) {
      const std::string& why = m1.compile_reasons.back();  // "new graph structure (N nodes)"
      size_t a = why.find('('), b = why.find(" nodes");
      if (a != std::string::npos && b != std::string::npos && b > a) r.graph_nodes = why.substr(a + 1, b - a - 1);
    }
  }
  r.cold_n = cold;
  r.cold_compile_ms = median(cms);
  r.cold_compile_min = *std::min_element(cms.begin(), cms.end());
  r.cold_compile_max = *std::max_element(cms.begin(), cms.end());
  r.steps_in_plan = int64_t(ts::last_memory_plan().num_steps);

  // 3. Warm steps (cache hits): wall = trace + item(); overhead = wall - execute_ms delta.
  run_step(false, &te);  // one more warm-up hit after the cold compiles
  std::vector<double> tot, ex, ov, tr, so;
  for (int i = 0; i < steps; ++i) {
    const ts::Metrics m0 = ts::metrics();
    auto t0 = Clock::now();
    auto t2 = run_step(false, &te);
    const ts::Metrics m1 = ts::metrics();
    if (m1.graphs_compiled != m0.graphs_compiled || m1.cache_hits - m0.cache_hits != 1)
      die("a warm step did not hit the compile cache exactly once");
    const double total = ms_between(t0, t2), exec = m1.execute_ms - m0.execute_ms;
    tot.push_back(total);
    ex.push_back(exec);
    ov.push_back(total - exec);
    tr.push_back(ms_between(t0, te));
    so.push_back(ms_between(te, t2) - exec);
  }
  r.warm_n = steps;
  r.total_ms = median(tot);
  r.exec_ms = median(ex);
  r.overhead_ms = median(ov);
  r.trace_ms = median(tr);
  r.sync_overhead_ms = median(so);
  r.last_loss = loss.item();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9, cold = 7, steps = 15;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--only" && i + 1 < argc && (std::string(argv[i + 1]) == "chain" || std::string(argv[i + 1]) == "gpt")) {
      only = argv[++i];
    } else if ((a == "--reps" || a == "--cold" || a == "--steps") && i + 1 < argc) {
      int v = std::atoi(argv[++i]);
      (a == "--reps" ? reps : a == "--cold" ? cold : steps) = v;
    } else {
      std::fprintf(stderr, "usage: %s [--reps N>=7] [--cold N>=5] [--steps N>=10] [--only chain|gpt]   (threads: OMP_NUM_THREADS)\n",
                   argv[0]);
      return 2;
    }
  }
  if (reps < 7 || cold < 5 || steps < 10) {
    std::fprintf(stderr, "bench_compiler: needs --reps >= 7, --cold >= 5, --steps >= 10\n");
    return 2;
  }
  try {
    const char* omp_env = std::getenv("OMP_NUM_THREADS");
    const int threads = omp_get_max_threads();
    const double load0 = load_average();
    std::printf("bench_compiler: tessera %s, %s, %d OpenMP threads (OMP_NUM_THREADS=%s), load average %.2f at start\n\n",
                ts::version(), ts::Device::best().str().c_str(), threads, omp_env ? omp_env : "(unset)", load0);

    ChainResult c{};
    if (only != "gpt") c = bench_chain(reps);
    const double gbs = 1e-9 * 1e3;  // bytes per ms -> GB/s
    const double moved = 2 * kBytes;  // read 64 MiB + write 64 MiB, for the chain and for memcpy
    const double bw_memcpy = moved / c.memcpy_ms * gbs, bw_memcpy_par = moved / c.memcpy_par_ms * gbs;
    const double bw_fused = moved / c.fused_sync_ms * gbs, bw_fused_exec = moved / c.fused_exec_ms * gbs;
    const double bw_unfused = moved / c.unfused_sync_ms * gbs;
    const double ratio = bw_fused / bw_memcpy;
    if (only != "gpt") {
      std::printf("1. 8-op elementwise chain on f32[%lld] (64 MiB in, 64 MiB out), medians of %d interleaved runs\n",
                  (long long)kElems, reps);
      std::printf("   timed: sync() alone (graph build, cache lookup, output allocation, the Steps); tracing (%.1f us) "
                  "is outside\n", c.fused_trace_us);
      std::printf("   %-34s %8.2f ms  %6.2f GB/s  (2 x 64 MiB / time)\n", "std::memcpy 64 MiB (1 thread)", c.memcpy_ms, bw_memcpy);
      std::printf("   %-34s %8.2f ms  %6.2f GB/s\n", "memcpy 64 MiB split over threads", c.memcpy_par_ms, bw_memcpy_par);
      std::printf("   %-34s %8.2f ms  %6.2f GB/s  = %.1f%% of memcpy, %.1f%% of threaded memcpy (goal >= 80%%: %s)\n",
                  "fused chain, sync()", c.fused_sync_ms, bw_fused, 100 * ratio, 100 * bw_fused / bw_memcpy_par,
                  ratio >= 0.8 ? "met" : "NOT met");
      std::printf("   %-34s %8.2f ms  %6.2f GB/s  (metrics().execute_ms: output allocation + launch)\n",
                  "  of which executing", c.fused_exec_ms, bw_fused_exec);
      std::printf("   %-34s %8.2f ms  %6.2f GB/s effective (%lld Steps; %.0f MiB really moved)\n",
                  "all passes disabled, sync()", c.unfused_sync_ms, bw_unfused, (long long)c.unfused_steps,
                  double(c.unfused_steps) * moved / kMiB);
      std::printf("   Steps launched per sync: fused %lld (expected 1), unfused %lld; most page faults in one timed "
                  "sync: fused %lld, unfused %lld (0: the allocator's cache reuses the output and arena)\n",
                  (long long)c.fused_steps, (long long)c.unfused_steps, (long long)c.fused_faults,
                  (long long)c.unfused_faults);
      std::printf("   load average after part 1: %.2f\n\n", load_average());
    }

    GptResult g;
    if (only != "chain") g = bench_gpt(cold, steps);
    if (only != "chain") {
      std::printf("2. cold compile of the GPT training step (vocab %lld, block %lld, embd %lld, %lld heads, %lld layers, "
                  "batch %lld, AdamW)\n",
                  (long long)kVocab, (long long)kBlock, (long long)kEmbd, (long long)kHeads, (long long)kLayers,
                  (long long)kBatch);
      std::printf("   timed: metrics().compile_ms of the steady-state step's graph, compile cache cleared after tracing\n"
                  "   (passes + lowering + memory plan + backend kernels; not graph build/hash), %d cold compiles\n", g.cold_n);
      std::printf("   median %.2f ms (min %.2f, max %.2f; goal <= 50 ms: %s); first step's graph %.2f ms\n",
                  g.cold_compile_ms, g.cold_compile_min, g.cold_compile_max, g.cold_compile_ms <= 50 ? "met" : "NOT met",
                  g.first_compile_ms);
      std::printf("   graph %s IR nodes -> %lld Steps\n\n", g.graph_nodes.c_str(), (long long)g.steps_in_plan);

      std::printf("3. per-step overhead on a cache hit, medians of %d steps\n", g.warm_n);
      std::printf("   timed: wall of from_vector(x, y) + forward + loss + backward + AdamW step + zero_grad + loss.item(),\n"
                  "   minus metrics().execute_ms (output/arena allocation + launching and running the Steps)\n");
      std::printf("   step wall %.2f ms, executing %.2f ms -> overhead %.3f ms (goal <= 3 ms: %s)\n", g.total_ms, g.exec_ms,
                  g.overhead_ms, g.overhead_ms <= 3 ? "met" : "NOT met");
      std::printf("   of which tracing (until just before item()) %.3f ms, sync outside execution %.3f ms\n", g.trace_ms,
                  g.sync_overhead_ms);
      std::printf("   last loss %.4f; load average at end %.2f\n\n", g.last_loss, load_average());
    }

    std::printf("RESULT bench_compiler threads=%d load=%.2f memcpy_gbs=%.2f memcpy_par_gbs=%.2f fused_gbs=%.2f "
                "fused_ms=%.3f ratio=%.3f fused_steps=%lld unfused_gbs=%.2f unfused_ms=%.3f unfused_steps=%lld "
                "compile_ms=%.2f graph_nodes=%s plan_steps=%lld step_ms=%.3f exec_ms=%.3f overhead_ms=%.3f "
                "trace_ms=%.3f sync_overhead_ms=%.3f\n",
                threads, load0, bw_memcpy, bw_memcpy_par, bw_fused, c.fused_sync_ms, ratio, (long long)c.fused_steps,
                bw_unfused, c.unfused_sync_ms, (long long)c.unfused_steps, g.cold_compile_ms, g.graph_nodes.c_str(),
                (long long)g.steps_in_plan, g.total_ms, g.exec_ms, g.overhead_ms, g.trace_ms, g.sync_overhead_ms);
    return 0;
  } catch (const ts::Error& e) {
    std::fprintf(stderr, "bench_compiler: %s\n", e.what());
    return 1;
  }
}
