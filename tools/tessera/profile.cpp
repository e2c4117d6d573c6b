// `tessera profile gpt`: trains the character GPT for a few steps under tessera::Profiler and writes
// the Chrome trace, the op table and the memory viewer of the training step's graph; and the
// `--profile DIR` option of `tessera train gpt`, which does the same for a whole training run.
#include <cstdio>
#include <filesystem>

#include <tessera/profiler.h>

#include "commands.h"
#include "gpt_session.h"

namespace tessera::cli {

namespace fs = std::filesystem;

void add_train_flags(CLI::App& cmd, TrainOptions& o);  // train.cpp
void add_parallel_flags(CLI::App& cmd, TrainOptions& o);  // train.cpp
TrainResult train_gpt_profiled(const TrainOptions& o, const std::string& dir);

namespace {

struct ProfileOptions {
  int64_t skip = 1;          // steps run before the profiler starts
  bool whole_run = false;    // keep recording after the last step (evaluation, checkpoint)
  std::string trace, memory, table, text;
};

std::string kib(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f KiB", double(b) / 1024);
  return s;
}

// "memory per rank (data 2 x model 2; rank 0): parameters 12.3 KiB of 24.6 KiB, ..." (on
// several ranks the plan is rank 0's per-rank graph; on one, the whole step's).
std::string rank_memory_text(const TrainResult::RankMemory& m, const MemoryPlan& plan) {
  return "memory per rank (data " + std::to_string(m.data) + " x model " + std::to_string(m.model) + "; rank 0): parameters " +
         kib(m.param_bytes) + " of " + kib(m.full_param_bytes) + ", optimizer state (AdamW moments) " + kib(m.optimizer_bytes) + " of " +
         kib(m.full_optimizer_bytes) + ", activations and temporaries " + kib(int64_t(plan.max_live_temp_bytes)) +
         " (the step graph's peak); bytes: parameters " + std::to_string(m.param_bytes) + "/" + std::to_string(m.full_param_bytes) +
         ", optimizer " + std::to_string(m.optimizer_bytes) + "/" + std::to_string(m.full_optimizer_bytes) + ", activations " +
         std::to_string(plan.max_live_temp_bytes);
}

// Runs train_gpt with the profiler recording steps skip+1 .. steps (or to the end of the run),
// writes the files asked for and prints the op table (print_table) and the peak report.
TrainResult profiled_train(TrainOptions o, const ProfileOptions& p, bool print_table) {
  const int64_t last = o.steps;
  if (p.skip >= last)
    fail("profile", "--skip " + std::to_string(p.skip) + " leaves no step to profile (--steps " + std::to_string(last) + ")", "");
  auto prof = std::make_shared<Profiler>(false);
  auto plan = std::make_shared<MemoryPlan>();
  auto wall_ms = std::make_shared<double>(0);
  auto t0 = std::make_shared<std::chrono::steady_clock::time_point>();
  auto begin = [prof, t0] {
    *t0 = std::chrono::steady_clock::now();
    prof->start();
  };
  if (p.skip == 0) begin();
  o.on_step = [=](int64_t step) {
    if (step == p.skip) begin();
    if (step == last) {
      *plan = last_memory_plan();  // the training step's graph (evaluation has not run yet)
      if (!p.whole_run) {
        prof->stop();
        *wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - *t0).count();
      }
    }
  };
  TrainResult r = train_gpt(o);
  prof->stop();
  const std::string per_rank = rank_memory_text(r.rank_memory, *plan);  // never empty
  if (!p.trace.empty()) prof->write_chrome_trace(p.trace);
  if (!p.table.empty()) prof->write_table_csv(p.table);
  std::string text = prof->table_text();
  if (!p.text.empty()) write_text(p.text, text);
  if (!p.memory.empty())
    write_memory_viewer(p.memory, *plan, "tessera memory plan: GPT training step; " + per_rank);
  if (print_table) {
    std::printf("%s\n", text.c_str());
    if (!p.whole_run)
      std::printf("profiled steps %lld-%lld: %.3f ms wall (%.3f ms per step)\n\n", (long long)(p.skip + 1), (long long)last,
                  *wall_ms, *wall_ms / double(last - p.skip));
  }
  std::printf("memory plan of the training step's graph%s:\n%s", r.rank_memory.data * r.rank_memory.model > 1 ? " (one rank's)" : "",
              plan->report().c_str());
  std::printf("%s\n", per_rank.c_str());
  for (auto& [what, path] : {std::pair<const char*, std::string>{"trace", p.trace}, {"op table (CSV)", p.table},
                             {"op table (text)", p.text}, {"memory viewer", p.memory}})
    if (!path.empty()) std::printf("%s: %s\n", what, path.c_str());
  std::fflush(stdout);
  return r;
}

}  // namespace

void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail("profile", "cannot write '" + path + "'", "");
  std::fputs(text.c_str(), f);
  if (std::fclose(f) != 0) fail("profile", "writing '" + path + "' failed", "");
}

void add_profile(CLI::App& app) {
  auto* profile = app.add_subcommand("profile", "profile a model: Chrome trace, op table and memory viewer");
  profile->require_subcommand(1);
  auto* gpt = profile->add_subcommand("gpt", "train the character GPT for a few steps under the profiler");
  auto o = std::make_shared<TrainOptions>();
  o->steps = 5;
  o->eval_every = 1000000;  // one evaluation, after the last step, outside the profile
  o->eval_batches = 1;
  auto p = std::make_shared<ProfileOptions>();
  add_train_flags(*gpt, *o);
  add_parallel_flags(*gpt, *o);  // the plan and the memory report are then one rank's
  gpt->add_option("--skip", p->skip, "steps run before profiling starts (1 leaves the first step's compile out)")
      ->capture_default_str()
      ->check(non_negative());
  gpt->add_option("--trace", p->trace, "write the Chrome trace (Perfetto, chrome://tracing) to FILE");
  gpt->add_option("--table", p->table, "write the op table as CSV to FILE");
  gpt->add_option("--table-text", p->text, "write the op table as text to FILE");
  gpt->add_option("--memory", p->memory, "write the memory viewer of the training step's graph (one HTML file) to FILE");
  auto show_metrics = add_metrics_flag(*gpt);
  gpt->callback([o, p, show_metrics] {
    o->quiet = true;
    profiled_train(*o, *p, true);
    print_metrics(*show_metrics);
  });
#ifdef TESSERA_HAVE_ONNX
  add_profile_onnx(*profile);  // tessera profile model.onnx
#endif
}

TrainResult train_gpt_profiled(const TrainOptions& o, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("train", "--profile: cannot create directory '" + dir + "': " + ec.message(), "");
  ProfileOptions p;
  p.skip = 0;
  p.whole_run = true;
  p.trace = (fs::path(dir) / "trace.json").string();
  p.table = (fs::path(dir) / "ops.csv").string();
  p.text = (fs::path(dir) / "ops.txt").string();
  p.memory = (fs::path(dir) / "memory.html").string();
  return profiled_train(o, p, false);
}

}  // namespace tessera::cli
