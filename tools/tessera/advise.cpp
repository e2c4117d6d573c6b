// `tessera advise gpt`: predicted training-step time and memory of a GPT on accelerators that
// are not here (and on this host), from the compiled step's Steps and its static memory plan.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tessera/advise.h>
#include <tessera/profiler.h>
#include <tessera/tessera.h>

#include "commands.h"
#include "session.h"

namespace tessera::cli {
namespace {

struct AdviseOptions {
  int64_t batch = 16, block = 64, layers = 4, heads = 4, embd = 128, vocab = 114;
  std::string preset;
  std::string devices = "t4,p100,v100-16,a100-40,a100-80,h100,h200,tpu-v3-8,tpu-v4-8";
  std::string device_file;
  std::string dtype = "float32";
  std::string memory_budget;  // "auto": each device's usable memory; bytes: at most that much
  int64_t data_parallel = 1;
  int64_t tensor_parallel = 1;
  bool zero1 = false;
  bool json = false, validate = false, validate_steps = false, no_max_batch = false, recalibrate = false;
};

// What the memory budget's rewrites reach on one device (--memory-budget).
struct Rewrites {
  int64_t max_remat = 0;     // global batch: one graph, rematerialized
  double remat_slowdown = 0; // at max_remat
  int64_t max_slice = 0;     // the most rows a micro-batch slice may have (all replicas)
  advise::Fit at;            // the requested batch (per replica)
};

struct Row {
  advise::DeviceSpec dev;
  advise::Prediction p;
  int64_t per_replica = 0, replicas = 1;  // per data-parallel replica; devices (all of the mesh)
  double grad_bytes = 0;  // all-reduced per step
  int64_t layers = 0;     // blocks (tensor parallel: 4 activation all-reduces each)
  std::optional<Rewrites> rw;
};

std::string ratio(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", x);
  return buf;
}

// The searches stop at 65536 per replica: "at least" there.
std::string at_least(int64_t global, int64_t replicas) {
  return (global >= (int64_t(1) << 16) * replicas ? ">=" : "") + std::to_string(global);
}

std::string how_it_fits(const advise::Fit& f) {
  if (!f.fits) return "does not fit";
  if (f.micro_batches > 1) return std::to_string(f.micro_batches) + " micro-batches, " + ratio(f.slowdown());
  std::string how;
  if (f.unstacked_slices > 0) how = "unstacked in " + std::to_string(f.unstacked_slices) + " slices";
  if (f.recomputed_steps > 0) how += (how.empty() ? "" : " + ") + std::string("remat (") + std::to_string(f.recomputed_steps) + " Steps)";
  return how.empty() ? "one graph" : how + ", " + ratio(f.slowdown());
}

Rewrites rewrites_on(advise::GptWorkloads& works, const advise::DeviceSpec& d, const Row& r, DType dtype,
                     const advise::Options& opts) {
  Rewrites rw;
  const int64_t remat = works.max_batch_remat(d, dtype);
  rw.max_remat = remat * r.replicas;
  if (remat > 0) rw.remat_slowdown = works.fit(remat, d, dtype, opts).slowdown();
  rw.max_slice = works.max_slice_rows(d, dtype) * r.replicas;
  rw.at = works.fit(r.per_replica, d, dtype, opts);
  return rw;
}

// --memory-budget: none; 0 for auto (each device's usable memory); else bytes.
std::optional<size_t> budget_of(const AdviseOptions& o) {
  if (o.memory_budget.empty()) return std::nullopt;
  if (o.memory_budget == "auto") return size_t(0);
  MemoryBudget b = MemoryBudget::parse(o.memory_budget);
  if (!b.bytes) fail("advise", "--memory-budget takes auto or bytes (200MB, 12GiB), not '" + o.memory_budget + "'", "");
  return b.bytes;
}

// Each device with more than one replica: what the all-reduce costs and the scaling it leaves.
void print_data_parallel(const std::vector<Row>& rows, const AdviseOptions& o) {
  if (std::none_of(rows.begin(), rows.end(), [](const Row& r) { return r.replicas > 1; })) return;
  std::printf("\nData parallel: the gradients ring-all-reduced once per step over each device's interconnect, not overlapped "
              "with the backward pass (an upper bound)%s.\nSCALING: one replica's step at the same per-replica batch over this "
              "step (tokens/s = replicas x scaling x one replica's).\n",
              o.zero1 ? "; ZeRO-1: reduce-scatter + all-gather (the same bytes), each replica holding 1/R of AdamW's moments" : "");
  std::printf("%-12s %8s %-40s %10s %11s %6s %8s\n", "DEVICE", "REPLICAS", "LINK (PER DIRECTION, ACHIEVABLE)", "GRADIENTS",
              "ALL-REDUCE", "SHARE", "SCALING");
  for (auto& r : rows) {
    if (r.replicas < 2) continue;
    char link[96], share[16], scaling[16];
    std::snprintf(link, sizeof link, "%s %s/s x %.2f", r.dev.link.empty() ? "link" : r.dev.link.c_str(),
                  human_bytes(r.dev.link_bw).c_str(), r.dev.link_eff);
    std::snprintf(share, sizeof share, "%.0f%%", r.p.step_s > 0 ? 100 * r.p.comm_s / r.p.step_s : 0.0);
    std::snprintf(scaling, sizeof scaling, "%.0f%%", 100 * r.p.scaling);
    std::printf("%-12s %8lld %-40s %10s %11s %6s %8s\n", r.dev.name.c_str(), (long long)r.replicas, link,
                human_bytes(r.grad_bytes).c_str(), human_time(r.p.comm_s).c_str(), share, scaling);
  }
}

// Tensor parallel: the blocks' activation all-reduces, the gradient all-reduce left, the scaling.
void print_tensor_parallel(const std::vector<Row>& rows, const AdviseOptions& o) {
  if (o.tensor_parallel < 2) return;
  std::printf("\nTensor parallel over %lld devices (Megatron: attention and MLP split column-then-row), a mesh of devices / %lld "
              "data-parallel replicas x %lld: per block 2 all-reduces of the B x T x C activations (float32) in the forward and 2 in "
              "the backward, ring over the link, not overlapped; the split matrices' time, weights and moments / %lld.\n"
              "SCALING: one device's whole step at the same per-replica batch over %lld x this step.\n",
              (long long)o.tensor_parallel, (long long)o.tensor_parallel, (long long)o.tensor_parallel, (long long)o.tensor_parallel,
              (long long)o.tensor_parallel);
  std::printf("%-12s %9s %-40s %12s %11s %11s %6s %8s\n", "DEVICE", "DP x TP", "LINK (PER DIRECTION, ACHIEVABLE)", "ALL-REDUCE",
              "TP COMM", "DP COMM", "SHARE", "SCALING");
  for (auto& r : rows) {
    char mesh[32], link[96], share[16], scaling[16];
    std::snprintf(mesh, sizeof mesh, "%lld x %lld", (long long)(r.replicas / o.tensor_parallel), (long long)o.tensor_parallel);
    std::snprintf(link, sizeof link, "%s %s/s x %.2f", r.dev.link.empty() ? "link" : r.dev.link.c_str(),
                  human_bytes(r.dev.link_bw).c_str(), r.dev.link_eff);
    std::snprintf(share, sizeof share, "%.0f%%", r.p.step_s > 0 ? 100 * r.p.comm_s / r.p.step_s : 0.0);
    std::snprintf(scaling, sizeof scaling, "%.0f%%", 100 * r.p.scaling);
    std::printf("%-12s %9s %-40s %12s %11s %11s %6s %8s\n", r.dev.name.c_str(), mesh, link,
                (std::to_string(4 * r.layers) + " x " + human_bytes(r.p.tp_allreduce_bytes)).c_str(), human_time(r.p.tp_comm_s).c_str(),
                human_time(r.p.dp_comm_s).c_str(), share, scaling);
  }
}

void print_rewrites(const std::vector<Row>& rows, size_t budget, const AdviseOptions& o) {
  std::printf("\nWith the memory budget's rewrites (budget: %s):\n"
              "REMAT MAX: the largest batch run as one graph under the budget (batch unstacking, rematerialization; slowdown against that batch unbudgeted);\n"
              "SLICE ROWS: the most rows per micro-batch (--micro-batches auto runs any batch in slices of up to that many);\n"
              "AT BATCH %lld: how it fits (slowdown against it as one graph unbudgeted).\n",
              budget ? human_bytes(double(budget)).c_str() : "each device's usable memory", (long long)o.batch);
  std::printf("%-12s %9s %20s %10s  %s\n", "DEVICE", "MAX BATCH", "REMAT MAX (SLOWDOWN)", "SLICE ROWS", "AT BATCH");
  for (auto& r : rows) {
    const Rewrites& rw = *r.rw;
    std::string remat = at_least(rw.max_remat, r.replicas) + (rw.max_remat ? " (" + ratio(rw.remat_slowdown) + ")" : "");
    std::printf("%-12s %9s %20s %10s  %s\n", r.dev.name.c_str(), o.no_max_batch ? "-" : at_least(r.p.max_batch, r.replicas).c_str(),
                remat.c_str(), at_least(rw.max_slice, r.replicas).c_str(), how_it_fits(rw.at).c_str());
  }
}

// The recommendation: the fastest device that fits, the most tokens per joule, what doesn't fit.
std::string recommendation(const std::vector<Row>& rows, const AdviseOptions& o, DType dtype) {
  const Row* fastest = nullptr;
  const Row* thrifty = nullptr;
  std::vector<const Row*> misfits;
  for (auto& r : rows) {
    if (!r.p.fits) {
      misfits.push_back(&r);
      continue;
    }
    if (!fastest || r.p.tokens_per_s > fastest->p.tokens_per_s) fastest = &r;
    if (r.p.tokens_per_joule > 0 && (!thrifty || r.p.tokens_per_joule > thrifty->p.tokens_per_joule)) thrifty = &r;
  }
  std::ostringstream rec;
  if (!fastest) {
    rec << "No device fits batch " << o.batch << ".";
    const Row* most = nullptr;
    for (auto& r : rows)
      if (!most || r.p.max_batch > most->p.max_batch) most = &r;
    if (most && most->p.max_batch > 0)
      rec << " The largest batch fits on " << most->dev.name << " (" << most->p.max_batch << "); lower --batch, use "
          << "--dtype bfloat16 or more data-parallel devices.";
  } else {
    rec << "Fastest: " << fastest->dev.name << " at " << human_rate(fastest->p.tokens_per_s) << " tokens/s ("
        << human_time(fastest->p.step_s) << " per step, bound by " << advise::bottleneck_name(fastest->p.bottleneck) << ").";
    if (thrifty && thrifty != fastest)
      rec << " Most tokens per joule: " << thrifty->dev.name << " (" << human_rate(thrifty->p.tokens_per_joule) << "/J vs "
          << human_rate(fastest->p.tokens_per_joule) << "/J).";
    for (auto& r : rows)
      if (r.p.fits && r.p.bottleneck == advise::Bottleneck::Launch) {
        rec << " This model is small: launch overhead dominates on " << r.dev.name << " and the like, so a larger batch is nearly free there.";
        break;
      }
    if (dtype == DType::Float32)
      rec << " Tensor cores and TPU matrix units need bfloat16/float16 to reach their peak: try --dtype bfloat16.";
  }
  if (!misfits.empty()) {
    rec << " Does not fit at batch " << o.batch << ":";
    for (auto* r : misfits) rec << " " << r->dev.name << " (max batch " << r->p.max_batch << ")";
    rec << ".";
    std::string rewritten;
    for (auto* r : misfits)
      if (r->rw && r->rw->at.fits) rewritten += (rewritten.empty() ? " " : "; ") + r->dev.name + ": " + how_it_fits(r->rw->at);
    if (!rewritten.empty())
      rec << " With the rewrites (train with --memory-budget, and --micro-batches auto where it says micro-batches):" << rewritten << ".";
  }

  return rec.str();
}

// --validate-steps: per Step of the host's plan, the model's time against the median of the
// profiled runs of that Step (the measured step runs the same plan: the same Step indices).
void print_validate_steps(const advise::DeviceSpec& host, const advise::Workload& w, const Profiler& prof) {
  std::map<int, std::vector<double>> runs;
  std::map<int, std::string> names;
  std::map<int, int> graph_steps;  // graph run -> its Steps (only runs of the step's whole plan count)
  const std::vector<ProfileEvent> events = prof.events();
  for (const ProfileEvent& e : events)
    if (e.type == "step") graph_steps[e.graph] += 1;
  for (const ProfileEvent& e : events)
    if (e.type == "step" && e.step >= 0 && graph_steps[e.graph] == int(w.steps.size()))
      runs[e.step].push_back(e.dur_us / 1e6), names[e.step] = e.name;
  std::printf("%5s %-12s %10s %10s %10s %12s %8s  %s\n", "step", "kind", "flops", "bytes", "predicted", "measured", "error", "name");
  for (size_t i = 0; i < w.steps.size(); ++i) {
    const advise::StepCost& s = w.steps[i];
    auto it = runs.find(int(i));
    double mt = 0;
    if (it != runs.end()) {
      std::vector<double>& v = it->second;
      std::sort(v.begin(), v.end());
      mt = v[v.size() / 2];
    }
    const double pt = advise::step_seconds(host, s);
    std::printf("%5zu %-12s %10.3g %10.3g %10s %12s %+7.1f%%  %s\n", i, s.kind.c_str(), s.flops, s.bytes, human_time(pt).c_str(),
                human_time(mt).c_str(), mt > 0 ? 100 * (pt - mt) / mt : 0.0, names[int(i)].c_str());
    std::printf("RESULT advise_validate_step step=%zu kind=%s flops=%.0f bytes=%.0f transcendental=%.0f epilogue=%.0f elements=%.0f "
                "batch=%lld m=%lld n=%lld k=%lld predicted_s=%.9f measured_s=%.9f\n", i, s.kind.c_str(), s.flops, s.bytes,
                s.transcendental_flops, s.epilogue_flops, s.elements, (long long)s.batch, (long long)s.m, (long long)s.n,
                (long long)s.k, pt, mt);
  }
}

void run_advise(const AdviseOptions& o) {
  nn::GPTConfig cfg{.vocab = o.vocab, .block = o.block, .embd = o.embd, .heads = o.heads, .layers = o.layers,
                    .dropout = 0.0, .bias = true, .tied_head = false};
  if (o.preset == "gpt2-small") cfg = {.vocab = 50257, .block = 1024, .embd = 768, .heads = 12, .layers = 12,
                                       .dropout = 0.0, .bias = true, .tied_head = true};
  else if (!o.preset.empty() && o.preset != "demo") fail("advise", "unknown --preset '" + o.preset + "' (presets: demo, gpt2-small)", "");
  if (cfg.embd % cfg.heads) fail("advise", "--embd must be a multiple of --heads", "");
  DType dtype = o.dtype == "bfloat16" ? DType::BFloat16 : DType::Float32;

  std::vector<advise::DeviceSpec> table = advise::builtin_devices();
  if (!o.device_file.empty())
    for (auto& d : advise::load_devices_json(o.device_file)) table.push_back(d);
  std::vector<advise::DeviceSpec> devs;
  for (auto& name : split_commas(o.devices)) devs.push_back(name == "host" ? advise::host_device(o.recalibrate) : advise::find_device(table, name));
  if (devs.empty()) fail("advise", "--devices names no device", "");

  const std::optional<size_t> budget = budget_of(o);

  advise::GptWorkloads works(cfg);
  advise::Options opts{.data_parallel = int(o.data_parallel), .zero1 = o.zero1, .tensor_parallel = int(o.tensor_parallel)};
  if (o.tensor_parallel > 1 && budget)
    fail("advise", "--tensor-parallel with --memory-budget is not modelled yet (the rewrites are priced for whole replicas)", "");
  if (o.zero1 && std::all_of(devs.begin(), devs.end(), [&](auto& d) { return o.data_parallel * d.replicas == 1; }))
    fail("advise", "--zero1 shards the optimizer state over data-parallel replicas: give --data-parallel N (N > 1) or a board "
         "such as tpu-v3-8 or t4x2", "");
  std::vector<Row> rows;
  for (auto& d : devs) {
    Row r;
    r.dev = d;
    if (budget && *budget && *budget < d.capacity_bytes()) r.dev.usable_bytes = double(*budget);
    r.replicas = o.data_parallel * d.replicas;
    const int64_t dp = r.replicas / o.tensor_parallel;  // predict() refuses a split that does not divide
    r.per_replica = (o.batch + std::max<int64_t>(dp, 1) - 1) / std::max<int64_t>(dp, 1);
    r.layers = cfg.layers;
    const advise::Workload& w = works.at(r.per_replica, r.dev, dtype);  // the device's own plan
    r.p = advise::predict(r.dev, w, opts);
    r.grad_bytes = w.grad_bytes;
    // ZeRO-1 frees (R-1)/R of the optimizer state whatever the batch: the searches see it as room.
    advise::DeviceSpec room = r.dev;
    // Tensor parallel frees (M-1)/M of the split matrices' weights and moments, ZeRO-1 (R-1)/R of
    // the state left: the searches see it as room.
    const double M = double(o.tensor_parallel), tp_freed = 3 * w.tp_split_param_bytes * (M - 1) / M;
    const double state = w.state_bytes - 2 * w.tp_split_param_bytes * (M - 1) / M;
    room.usable_bytes = r.dev.capacity_bytes() + tp_freed + (o.zero1 ? state * double(dp - 1) / double(dp) : 0);
    if (!o.no_max_batch) r.p.max_batch = works.max_batch(room, dtype) * dp;
    if (budget) r.rw = rewrites_on(works, room, r, dtype, opts);
    rows.push_back(r);
  }

  const std::string rec = recommendation(rows, o, dtype);

  if (o.json) {
    nlohmann::json j;
    j["model"] = {{"vocab", cfg.vocab}, {"block", cfg.block}, {"embd", cfg.embd}, {"heads", cfg.heads}, {"layers", cfg.layers}};
    j["batch"] = o.batch;
    j["dtype"] = o.dtype;
    j["data_parallel"] = o.data_parallel;
    j["zero1"] = o.zero1;
    j["tensor_parallel"] = o.tensor_parallel;
    j["devices"] = nlohmann::json::array();
    for (auto& r : rows)
      j["devices"].push_back({{"device", r.dev.name}, {"description", r.dev.description}, {"replicas", r.replicas},
                              {"per_replica_batch", r.per_replica}, {"step_s", r.p.step_s}, {"tokens_per_s", r.p.tokens_per_s},
                              {"peak_bytes", r.p.peak_bytes}, {"capacity_bytes", r.p.capacity_bytes}, {"fits", r.p.fits},
                              {"max_batch", r.p.max_batch}, {"tokens_per_joule", r.p.tokens_per_joule},
                              {"bottleneck", advise::bottleneck_name(r.p.bottleneck)}, {"compute_s", r.p.compute_s},
                              {"memory_s", r.p.memory_s}, {"launch_s", r.p.launch_s}, {"communication_s", r.p.comm_s},
                              {"link", r.dev.link}, {"gradient_bytes", r.grad_bytes}, {"scaling_efficiency", r.p.scaling},
                              {"tensor_parallel_communication_s", r.p.tp_comm_s}, {"tensor_parallel_allreduce_bytes", r.p.tp_allreduce_bytes},
                              {"data_parallel_communication_s", r.p.dp_comm_s}});
    for (size_t i = 0; i < rows.size(); ++i)
      if (const auto& rw = rows[i].rw)
        j["devices"][i]["rewrites"] = {{"max_batch_remat", rw->max_remat}, {"remat_slowdown", rw->remat_slowdown},
                                       {"max_slice_rows", rw->max_slice},
                                       {"at_batch", {{"fits", rw->at.fits}, {"micro_batches", rw->at.micro_batches},
                                                     {"recomputed_steps", rw->at.recomputed_steps}, {"unstacked_slices", rw->at.unstacked_slices}, {"peak_bytes", rw->at.peak_bytes},
                                                     {"step_s", rw->at.step_s}, {"slowdown", rw->at.slowdown()}}}};
    j["recommendation"] = rec;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("GPT %lld layers, %lld heads, embd %lld, block %lld, vocab %lld; AdamW training step at batch %lld, %s%s\n",
                (long long)cfg.layers, (long long)cfg.heads, (long long)cfg.embd, (long long)cfg.block, (long long)cfg.vocab,
                (long long)o.batch, o.dtype.c_str(),
                ((o.data_parallel > 1 ? ", data parallel over " + std::to_string(o.data_parallel) : std::string()) +
                 (o.tensor_parallel > 1 ? ", tensor parallel over " + std::to_string(o.tensor_parallel) : std::string())).c_str());
    std::printf("%-12s %10s %10s %21s %5s %9s %9s %13s\n", "DEVICE", "STEP", "TOKENS/S", "PEAK / CAPACITY", "FITS", "MAX BATCH",
                "TOKENS/J", "BOTTLENECK");
    for (auto& r : rows) {
      std::string mem = human_bytes(r.p.peak_bytes) + " / " + human_bytes(r.p.capacity_bytes);
      std::string mb = o.no_max_batch ? "-" : at_least(r.p.max_batch, r.replicas);
      std::string tpj = r.p.tokens_per_joule > 0 ? human_rate(r.p.tokens_per_joule) : "n/a";
      std::printf("%-12s %10s %10s %21s %5s %9s %9s %13s\n", r.dev.name.c_str(), human_time(r.p.step_s).c_str(),
                  human_rate(r.p.tokens_per_s).c_str(), mem.c_str(), r.p.fits ? "yes" : "NO", mb.c_str(), tpj.c_str(),
                  advise::bottleneck_name(r.p.bottleneck));
    }
    if (o.tensor_parallel > 1)
      std::printf("Memory is per device; a board's cores (a TPU v3-8's 8) form the mesh with the other boards' (batch split over "
                  "the data-parallel replicas, each replica's blocks over %lld devices).\n", (long long)o.tensor_parallel);
    else
      std::printf("Memory is per device (replica); TPU boards run their cores data parallel (batch split across them).\n");
    if (o.tensor_parallel > 1) print_tensor_parallel(rows, o);
    else print_data_parallel(rows, o);
    if (budget) print_rewrites(rows, *budget, o);
    std::printf("\n%s\n", rec.c_str());
  }

  if (o.validate) {
    advise::DeviceSpec host = advise::host_device(o.recalibrate);
    const advise::Workload& w = works.at(o.batch);
    advise::Prediction p = advise::predict(host, w, {});
    // The timed steps run under a Profiler (on the cpu it adds a clock reading per Step: its
    // synchronize is a no-op), for the per-kind comparison below.
    const int steps = 10;  // the median of 10 after 2 warm-up steps (5 was at the mercy of one slow step)
    Profiler prof(false);
    advise::Measured m = advise::measure_gpt_on_host(cfg, o.batch, steps, 2, [&] { prof.start(); });
    prof.stop();
    std::printf("\nvalidate on host (float32, batch %lld): step predicted %s, measured %s (%+.1f%%); peak predicted %s, "
                "allocator high-water %s (%+.2f%%)\n",
                (long long)o.batch, human_time(p.step_s).c_str(), human_time(m.step_s).c_str(),
                100 * (p.step_s - m.step_s) / m.step_s, human_bytes(p.peak_bytes).c_str(),
                human_bytes(m.high_water_bytes).c_str(), 100 * (p.peak_bytes - m.high_water_bytes) / m.high_water_bytes);
    std::printf("RESULT advise_validate batch=%lld predicted_s=%.6f measured_s=%.6f fastest_s=%.6f predicted_peak=%.0f "
                "measured_peak=%.0f\n",
                (long long)o.batch, p.step_s, m.step_s, m.fastest_step_s, p.peak_bytes, m.high_water_bytes);
    // Per Step kind: the model's time of its Steps against the profiler's mean per step;
    // <runtime> is the host's time outside Steps (predicted: the trace and graph-preparation time).
    std::map<std::string, std::pair<double, int>> pred;
    for (const advise::StepCost& s : w.steps) {
      auto& [t, n] = pred[s.kind];
      t += advise::step_seconds(host, s), n += 1;
    }
    pred["<runtime>"] = {p.trace_s, 0};
    std::printf("%-14s %6s %12s %12s %8s\n", "kind", "Steps", "predicted", "measured", "error");
    for (const OpTableRow& r : prof.op_table("kind")) {
      if (r.name == "<compile>") continue;
      auto it = pred.find(r.name);
      const double pt = it == pred.end() ? 0 : it->second.first, mt = r.ms / 1e3 / steps;
      std::printf("%-14s %6d %12s %12s %+7.1f%%\n", r.name.c_str(), it == pred.end() ? 0 : it->second.second,
                  human_time(pt).c_str(), human_time(mt).c_str(), mt > 0 ? 100 * (pt - mt) / mt : 0.0);
      std::printf("RESULT advise_validate_kind kind=%s predicted_s=%.6f measured_s=%.6f\n", r.name.c_str(), pt, mt);
    }
    if (o.validate_steps) print_validate_steps(host, w, prof);
  }
}

}  // namespace

void add_advise(CLI::App& app) {
  CLI::App* adv = app.add_subcommand("advise", "Predict step time and memory on accelerators: the GPT's training step, or an ONNX model's inference (compiles, does not run)");
  adv->require_subcommand(1);
  auto o = std::make_shared<AdviseOptions>();
  CLI::App* gpt = adv->add_subcommand("gpt", "Advice for the character GPT's AdamW training step");
  gpt->add_option("--preset", o->preset, "model preset: demo, gpt2-small (12 layers, 12 heads, embd 768, block 1024, vocab 50257)");
  gpt->add_option("--batch", o->batch, "sequences per step (over all devices)")->capture_default_str()->check(positive());
  gpt->add_option("--block", o->block, "context length")->capture_default_str()->check(CLI::Range(2, 65536));
  gpt->add_option("--layers", o->layers, "transformer blocks")->capture_default_str()->check(positive());
  gpt->add_option("--heads", o->heads, "attention heads")->capture_default_str()->check(positive());
  gpt->add_option("--embd", o->embd, "embedding width")->capture_default_str()->check(positive());
  gpt->add_option("--vocab", o->vocab, "vocabulary size")->capture_default_str()->check(positive());
  gpt->add_option("--devices", o->devices, "comma-separated devices (t4, t4x2, p100, v100-16, v100-32, a100-40, a100-80, h100, h200, "
                                           "tpu-v3-core, tpu-v3-8, tpu-v4-chip, tpu-v4-8, host, or from --device-file)")
      ->capture_default_str();
  gpt->add_option("--device-file", o->device_file, "JSON file of more devices (see src/advise/devices.cpp for the keys)");
  gpt->add_option("--dtype", o->dtype, "float32 or bfloat16")->capture_default_str()->check(CLI::IsMember({"float32", "bfloat16"}));
  gpt->add_option("--memory-budget", o->memory_budget,
                  "auto (each device's usable memory) or bytes (12GB): also report what rematerialization and micro-batches "
                  "fit under it and their predicted slowdown");
  gpt->add_option("--data-parallel", o->data_parallel, "devices (boards) in data parallel")->capture_default_str()->check(positive());
  gpt->add_option("--tensor-parallel", o->tensor_parallel,
                  "devices per tensor-parallel group (Megatron split of attention and MLP); the devices form a mesh of "
                  "devices/M data-parallel replicas x M")
      ->capture_default_str()
      ->check(positive());
  gpt->add_flag("--zero1", o->zero1, "ZeRO-1: shard AdamW's moments over the data-parallel replicas (less memory per replica, same traffic)");
  gpt->add_flag("--json", o->json, "print JSON instead of a table");
  gpt->add_flag("--validate", o->validate, "also run the step on this host and print predicted vs measured time and peak memory");
  gpt->add_flag("--validate-steps", o->validate_steps, "with --validate: also print each Step's predicted and measured (median) time");
  gpt->add_flag("--no-max-batch", o->no_max_batch, "skip the search for the largest batch that fits");
  gpt->add_flag("--recalibrate", o->recalibrate, "re-run the host microbenchmarks instead of using the cached calibration");
  gpt->callback([o] { run_advise(*o); });
#ifdef TESSERA_HAVE_ONNX
  add_advise_onnx(*adv);  // tessera advise model.onnx --batch N
#endif
}

}  // namespace tessera::cli
