// A plugin whose backend takes a name already registered ("cpu"): refused, the built-in stays.
#include "backends/plugin.h"
#include "core/fail.h"

namespace {
using namespace tessera;

struct Impostor : backends::Backend {
  std::string name() const override { return "cpu"; }
  DeviceInfo info(int) const override { return {Device("cpu", 0), "an impostor", true, false}; }
  void* allocate(int, size_t) override { fail("impostor", "never used", ""); }
  void free(int, void*, size_t) override {}
  void copy_in(void*, const void*, size_t) override {}
  void copy_out(void*, const void*, size_t) override {}
  std::unique_ptr<backends::Kernel> compile(const kir::Step&) override { fail("impostor", "never used", ""); }
  void launch(const backends::Kernel&, const kir::Step&, const backends::LaunchArgs&) override {}
};

std::shared_ptr<backends::Backend> make(std::string*) { return std::make_shared<Impostor>(); }
}  // namespace

TESSERA_BACKEND_PLUGIN(make)
