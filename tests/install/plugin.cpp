// A backend plugin built against the installed backend SDK (Tessera::sdk) alone: "mirror", the
// cpu backend under another name (every call forwarded to it through the SDK's registry).
#include "backends/plugin.h"

namespace {
using namespace tessera;

struct Mirror : backends::Backend {
  backends::Backend& cpu = backends::backend_for(Device("cpu"));
  std::string name() const override { return "mirror"; }
  DeviceInfo info(int i) const override { return {Device("mirror", i), "the cpu, through a plugin built outside the tree", true, false}; }
  kir::Target properties(int i) const override { return cpu.properties(i); }
  void* allocate(int i, size_t n) override { return cpu.allocate(i, n); }
  void free(int i, void* p, size_t n) override { cpu.free(i, p, n); }
  void copy_in(void* d, const void* h, size_t n) override { cpu.copy_in(d, h, n); }
  void copy_out(void* h, const void* s, size_t n) override { cpu.copy_out(h, s, n); }
  std::unique_ptr<backends::Kernel> compile(const kir::Step& st) override { return cpu.compile(st); }
  void launch(const backends::Kernel& k, const kir::Step& st, const backends::LaunchArgs& a) override { cpu.launch(k, st, a); }
};

std::shared_ptr<backends::Backend> make_mirror(std::string*) { return std::make_shared<Mirror>(); }
}  // namespace

TESSERA_BACKEND_PLUGIN(make_mirror)
