// Subcommands of the `tessera` tool: each adds itself to the app and runs when selected.
#pragma once
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>
#include <tessera/memory.h>
#include <tessera/metrics.h>

namespace tessera::cli {

// Flag checks with plain messages ("must be positive, got -3").
inline std::string check_number(const std::string& v, bool zero_ok) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size()) return "is not a number: '" + v + "'";
    if (zero_ok ? d >= 0 : d > 0) return "";
    return std::string(zero_ok ? "must not be negative" : "must be positive") + ", got " + v;
  } catch (const std::exception&) {
    return "is not a number: '" + v + "'";
  }
}
inline CLI::Validator positive() {
  return CLI::Validator([](std::string& v) { return check_number(v, false); }, "POSITIVE");
}
inline CLI::Validator non_negative() {
  return CLI::Validator([](std::string& v) { return check_number(v, true); }, "NON-NEGATIVE");
}

// --metrics: commands that run work print tessera::metrics().report() on stdout when they end.
// Returns the flag's storage (shared with the command's callback).
inline std::shared_ptr<bool> add_metrics_flag(CLI::App& cmd) {
  auto on = std::make_shared<bool>(false);
  cmd.add_flag("--metrics", *on, "print the runtime's metrics (graphs compiled and why, cache hits, time, "
                                 "host syncs, bytes moved, memory) at the end");
  return on;
}
inline void print_metrics(bool on) {
  if (!on) return;
  std::fflush(stdout);
  std::printf("\n%s", metrics().report().c_str());
  std::fflush(stdout);
}

// --memory-budget 200MB|0.5: each training step must fit in that many bytes or that fraction of
// its natural peak (tessera::MemoryBudget::parse), or the step fails before running, naming the
// buffers at its peak. --micro-batches N|auto: gradient accumulation over N slices of the batch
// (optim::accumulate_gradients; auto, stored as 0: the fewest that fit the budget).
inline void add_memory_flags(CLI::App& cmd, MemoryBudget& budget, int64_t& micro_batches) {
  cmd.add_option_function<std::string>("--memory-budget", [&budget](const std::string& v) { budget = MemoryBudget::parse(v); },
                                       "fit each training step's memory in BYTES (200MB, 1.5GiB) or a FRACTION of its natural "
                                       "peak (0.5), or fail before it runs, naming the buffers at the peak")
      ->check(CLI::Validator([](std::string& v) {
        try {
          MemoryBudget::parse(v);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      }, "BYTES|FRACTION"));
  cmd.add_option_function<std::string>("--micro-batches", [&micro_batches](const std::string& v) {
        micro_batches = v == "auto" ? 0 : std::stoll(v);
      }, "accumulate gradients over N slices of each batch, or 'auto': the fewest that fit --memory-budget (default 1)")
      ->check(CLI::Validator([](std::string& v) { return v == "auto" ? std::string() : check_number(v, false); }, "N|auto"));
}

// `tessera devices`: lists every registered device, whether it can execute, and a description.
void add_devices(CLI::App& app);
void add_train(CLI::App& app);   // train gpt, train cnn
void add_train_cnn(CLI::App& train);  // train_cnn.cpp
void add_sample(CLI::App& app);
void add_demo(CLI::App& app);
void add_profile(CLI::App& app);  // profile gpt: Chrome trace, op table, memory viewer
void add_advise(CLI::App& app);  // advise gpt
void add_conformance(CLI::App& app);  // the op x backend support matrix
void add_export(CLI::App& app);  // export --stablehlo gpt
void add_run(CLI::App& app);  // run model.onnx (built where ONNX import is)

}  // namespace tessera::cli
