// BENCH_PROFILE for the training-step benchmarks (bench_gpt_step, bench_cnn_step): the timed steps
// under a tessera::Profiler, then its table and machine-readable PROFILE lines per timed step.
//   BENCH_PROFILE=1      the profiler's table, then the lines
//   BENCH_PROFILE=lines  the lines only: each Step kind's time (mean and median over the timed
//                        steps), flops and bytes; the runtime's host regions; the products' flops
//   BENCH_PROFILE=steps  the lines, and one per Step of the plan (its kind, median time over the
//                        timed steps, flops, GFLOP/s, output shape and name)
// Profiling waits for each Step, so the step is slower under it.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "tessera/profiler.h"

namespace bench {

class StepProfile {
 public:
  // At the first timed step: starts the profiler when BENCH_PROFILE is set.
  void start_if_asked() {
    if (std::getenv("BENCH_PROFILE")) prof_ = std::make_unique<tessera::Profiler>();
  }
  bool active() const { return prof_ != nullptr; }
  // At the start of each timed step (outside its timed region): marks where the step begins.
  void step_begins() {
    if (prof_) step_start_us_.push_back(prof_->wall_ms() * 1e3);
  }
  // After the timed steps: stops the profiler and prints what BENCH_PROFILE asked for.
  void report(int64_t steps) {
    if (!prof_) return;
    prof_->stop();
    const std::string how = std::getenv("BENCH_PROFILE");
    if (how != "lines" && how != "steps") std::printf("%s", prof_->table_text().c_str());
    // Per timed step (bench/gpt_floor.sh reads these): each Step kind's time, flops and bytes (the
    // cost rules'), the runtime's host regions, and the flops of the products alone (the matmul
    // source ops' 2mnk, without the epilogues fused into their Gemm Steps). ms: the mean per step;
    // med_ms: the median over the timed steps of each step's sum (a loaded machine's preemptions
    // land in a few steps).
    const double n = double(steps);
    std::map<std::string, std::vector<double>> per_step;  // kind or "region:NAME" or "host" -> ms in each step
    auto step_of = [&](double start_us) {
      size_t i = size_t(std::upper_bound(step_start_us_.begin(), step_start_us_.end(), start_us) - step_start_us_.begin());
      return i == 0 ? size_t(0) : i - 1;
    };
    auto add = [&](const std::string& key, size_t i, double ms) {
      auto& v = per_step[key];
      v.resize(step_start_us_.size(), 0.0);
      v[i] += ms;
    };
    std::map<std::string, double> regions;
    // Each Step of the plan, by its graph run within the step and its index: its times.
    std::map<std::pair<int, int>, std::vector<double>> step_ms;  // (graph run in its step, plan index) -> ms
    std::map<std::pair<int, int>, tessera::ProfileEvent> step_ev;
    int first_graph_of_step = -1;
    size_t last_step = size_t(-1);
    double product_flops = 0;
    for (const tessera::ProfileEvent& e : prof_->events()) {
      const size_t i = step_of(e.start_us);
      if (e.type == "runtime") {
        regions[e.name] += e.dur_us / 1e3;
        add("region:" + e.name, i, e.dur_us / 1e3);
        add("host", i, e.dur_us / 1e3);
      }
      if (e.type == "step") {
        add(e.kind, i, e.dur_us / 1e3);
        if (i != last_step) last_step = i, first_graph_of_step = e.graph;
        const std::pair<int, int> key{e.graph - first_graph_of_step, e.step};
        step_ms[key].push_back(e.dur_us / 1e3);
        step_ev.emplace(key, e);
        for (const tessera::ProfiledOp& o : e.ops)
          if (o.op == "matmul") product_flops += e.flops * o.share;
      }
    }
    auto med = [&](const std::string& key) { return per_step.count(key) ? percentile(per_step[key], 0.5) : 0.0; };
    for (const tessera::OpTableRow& r : prof_->op_table("kind"))
      std::printf("PROFILE kind=%s ms=%.4f med_ms=%.4f calls=%.2f flops=%.6g bytes=%.6g\n", r.name.c_str(), r.ms / n,
                  r.name == "<runtime>" ? med("host") : med(r.name), double(r.calls) / n, r.flops / n, r.bytes / n);
    for (const auto& [name, ms_total] : regions)
      std::printf("PROFILE region=%s ms=%.4f med_ms=%.4f\n", name.c_str(), ms_total / n, med("region:" + name));
    std::printf("PROFILE products flops=%.6g wall_ms=%.4f\n", product_flops / n, prof_->wall_ms() / n);
    if (how == "steps")
      for (const auto& [key, v] : step_ms) {
        const tessera::ProfileEvent& e = step_ev[key];
        const double m = percentile(v, 0.5);
        std::printf("PROFILE step kind=%s graph=%d step=%d med_ms=%.4f runs=%zu gflop=%.5f gflops=%.1f shape=%s name=\"%s\"\n",
                    e.kind.c_str(), key.first, key.second, m, v.size(), e.flops / 1e9, e.flops / m / 1e6, e.shape.c_str(),
                    e.name.c_str());
      }
  }

 private:
  std::unique_ptr<tessera::Profiler> prof_;
  std::vector<double> step_start_us_;  // each timed step's start on the profile's clock
};

}  // namespace bench
