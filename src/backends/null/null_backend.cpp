// The null backend: compiles every Step like a real device and refuses to run or hold data.
// It proves the compile path needs no hardware, and lets the advisor plan for absent devices.
#include "backends/backend.h"
#include "backends/render/c_render.h"
#include "tessera/error.h"

namespace tessera::backends {
namespace {

// The kernels the shared C renderer makes for the Step, as a source-compiling device gets them.
struct NullKernel : Kernel {
  std::vector<render::KernelCode> code;
};

class NullBackend : public Backend {
 public:
  std::string name() const override { return "null"; }
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
    auto k = std::make_unique<NullKernel>();
    k->code = render::render(st);  // the OpenCL backend's compile path, without building
    return k;
  }
  void launch(const Kernel&, const kir::Step& st, const LaunchArgs&) override {
    const kir::Source& s = st.sources.front();
    fail(s.op, "device 'null' compiles but cannot execute (step: " + std::string(kir::step_kind_name(st.kind)) + ")", s.scope);
  }
};

}  // namespace

std::shared_ptr<Backend> make_null_backend() { return std::make_shared<NullBackend>(); }

}  // namespace tessera::backends
