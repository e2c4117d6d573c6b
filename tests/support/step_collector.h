// A compile-only backend that hands every Step planned for it to a callback: tests that render
// what the conformance suite plans (compiled for it, never run) without a device.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "core/fail.h"

namespace tessera::testing {

class StepCollector : public backends::Backend {
 public:
  StepCollector(std::string name, kir::Target target, std::function<void(const kir::Step&)> on_step)
      : name_(std::move(name)), target_(std::move(target)), on_step_(std::move(on_step)) {}
  std::string name() const override { return name_; }
  kir::Target properties(int) const override { return target_; }
  DeviceInfo info(int i) const override { return {Device(name_, i), "collects the Steps planned for it", false}; }
  bool can_execute() const override { return false; }
  void* allocate(int, size_t) override { fail(name_, "holds no memory", ""); }
  void free(int, void*, size_t) override {}
  void copy_in(void*, const void*, size_t) override { fail(name_, "holds no data", ""); }
  void copy_out(void*, const void*, size_t) override { fail(name_, "holds no data", ""); }
  std::unique_ptr<backends::Kernel> compile(const kir::Step& st) override {
    on_step_(st);
    return std::make_unique<backends::Kernel>();
  }
  void launch(const backends::Kernel&, const kir::Step&, const backends::LaunchArgs&) override {
    fail(name_, "runs nothing", "");
  }

 private:
  std::string name_;
  kir::Target target_;
  std::function<void(const kir::Step&)> on_step_;
};

}  // namespace tessera::testing
