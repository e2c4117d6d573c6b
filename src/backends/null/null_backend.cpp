// The null backend: compiles every Step like a real device and refuses to run or hold data.
// It proves the compile path needs no hardware, and lets the advisor plan for absent devices:
// device null:K poses as the K-th target registered by null_device_for (null:0 is a plain host-like
// target), so a graph compiled for it gets that device's plan.
#include <mutex>

#include "backends/backend.h"
#include "backends/render/c_render.h"
#include "core/fail.h"

namespace tessera::backends {
namespace {

std::mutex g_pose_mu;
std::vector<kir::Target>& poses() {
  static auto* p = new std::vector<kir::Target>{kir::Target{}};
  return *p;
}

class NullBackend : public Backend {
 public:
  std::string name() const override { return "null"; }
  int device_count() const override {
    std::lock_guard<std::mutex> lock(g_pose_mu);
    return int(poses().size());
  }
  kir::Target properties(int index) const override {
    std::lock_guard<std::mutex> lock(g_pose_mu);
    return poses().at(size_t(index));
  }
  DeviceInfo info(int index) const override {
    return {Device("null", index), "compiles graphs without running them (no memory, no execution)", false};
  }
  bool can_execute() const override { return false; }
  void* allocate(int, size_t nbytes) override {
    fail("null", "device 'null' holds no memory (asked for " + std::to_string(nbytes) + " bytes); it only compiles", "");
  }
  void free(int, void*, size_t) override {}
  void copy_in(void*, const void*, size_t) override { fail("null", "device 'null' cannot receive data", ""); }
  void copy_out(void*, const void*, size_t) override { fail("null", "device 'null' cannot return data", ""); }
  std::unique_ptr<Kernel> compile(const kir::Step& st) override {
    // The OpenCL backend's compile path (a Step it cannot render fails here), without building.
    // Collectives are no kernel: a device that runs them calls its communicator.
    // The fused attention Step (a pose declaring Target::attention) is no rendered kernel either.
    // A Step of parts (a pose declaring Target::elementwise_parts): each part is rendered.
    for (const kir::Step& part : st.parts) render::render(part);
    if (st.kind != kir::StepKind::Collective && st.kind != kir::StepKind::Attention && st.parts.empty()) render::render(st);
    return std::make_unique<Kernel>();
  }
  void launch(const Kernel&, const kir::Step& st, const LaunchArgs&) override {
    const kir::Source& s = st.sources.front();
    fail(s.op, "device 'null' compiles but cannot execute (step: " + std::string(kir::step_kind_name(st.kind)) + ")", s.scope);
  }
};

}  // namespace

Device null_device_for(const kir::Target& target) {
  std::lock_guard<std::mutex> lock(g_pose_mu);
  auto& p = poses();
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] == target) return Device("null", int(i));
  p.push_back(target);
  return Device("null", int(p.size()) - 1);
}

std::shared_ptr<Backend> make_null_backend() { return std::make_shared<NullBackend>(); }

}  // namespace tessera::backends
