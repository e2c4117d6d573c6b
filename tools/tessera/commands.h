// Subcommands of the `tessera` tool: each adds itself to the app and runs when selected.
#pragma once
#include <CLI/CLI.hpp>

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

// `tessera devices`: lists every registered device, whether it can execute, and a description.
void add_devices(CLI::App& app);
void add_train(CLI::App& app);   // train gpt
void add_sample(CLI::App& app);
void add_demo(CLI::App& app);

}  // namespace tessera::cli
