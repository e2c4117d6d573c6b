// Subcommands of the `tessera` tool: each adds itself to the app and runs when selected.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <tessera/memory.h>
#include <tessera/metrics.h>

namespace tessera::cli {

// v as a number (strtod's reading, nothing left over), or nullopt.
inline std::optional<double> parse_number(const std::string& v) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size()) return d;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// Flag checks with plain messages ("must be positive, got -3").
inline std::string check_number(const std::string& v, bool zero_ok) {
  std::optional<double> d = parse_number(v);
  if (!d) return "is not a number: '" + v + "'";
  if (zero_ok ? *d >= 0 : *d > 0) return "";
  return std::string(zero_ok ? "must not be negative" : "must be positive") + ", got " + v;
}
inline CLI::Validator positive() {
  return CLI::Validator([](std::string& v) { return check_number(v, false); }, "POSITIVE");
}
inline CLI::Validator non_negative() {
  return CLI::Validator([](std::string& v) { return check_number(v, true); }, "NON-NEGATIVE");
}

// Every option of every command, whatever its own checks: an INT or UINT value is a whole number
// between 0 or -2^40 and 2^40 (so products of flags such as epochs x batches cannot overflow), a
// FLOAT is finite, a TEXT value is not empty (unless the option lists itself in `may_be_empty`).
// A UINT never takes a sign (CLI11 would wrap -1 around). main() applies it once to the whole app.
inline std::string check_value(const std::string& v, const std::string& type) {
  constexpr double kMaxWhole = double(int64_t(1) << 40);
  if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) {
    const bool sign_ok = type[0] == 'I';
    size_t i = v.size() > 1 && (v[0] == '-' || v[0] == '+') && sign_ok ? 1 : 0;
    if (i == v.size() || v.find_first_not_of("0123456789", i) != std::string::npos)
      return "is not a whole number" + std::string(sign_ok ? "" : " of at least 0") + ": '" + v + "'";
    if (v.size() - i > 13 || std::abs(std::stod(v)) > kMaxWhole) return "is out of range (at most 2^40): " + v;
  } else if (type.rfind("FLOAT", 0) == 0) {
    std::optional<double> d = parse_number(v);
    if (!d) return "is not a number: '" + v + "'";
    if (!std::isfinite(*d)) return "must be a finite number, got " + v;
  } else if (type.rfind("TEXT", 0) == 0 && v.empty()) {
    return "must not be empty";
  }
  return "";
}
inline void check_every_value(CLI::App& app, const std::vector<std::string>& may_be_empty = {"--prompt"}) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a switch
    const std::string type = opt->get_type_name();
    const bool empty_ok = std::find(may_be_empty.begin(), may_be_empty.end(), opt->get_name()) != may_be_empty.end();
    opt->check(CLI::Validator([type, empty_ok](std::string& v) { return empty_ok && v.empty() ? std::string() : check_value(v, type); }, ""));
  }
  for (CLI::App* sub : app.get_subcommands({})) check_every_value(*sub, may_be_empty);
}

// Sizes, times and rates as the advisor prints them: "1.2 MB", "3.40 ms", "12.3k".
inline std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  return buf;
}
inline std::string human_time(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}
inline std::string human_rate(double r) {
  char buf[32];
  if (r >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  else if (r >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", r);
  return buf;
}

// "a,b,,c" -> {a, b, c} (empty items dropped).
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Writes `text` to `path` (profile.cpp), or fails naming the file.
void write_text(const std::string& path, const std::string& text);

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
// `tessera advise model.onnx` and `tessera profile model.onnx` (onnx_tools.cpp, built where ONNX
// import is): a model file as the command's argument besides its subcommands.
void add_advise_onnx(CLI::App& advise);
void add_profile_onnx(CLI::App& profile);

}  // namespace tessera::cli
