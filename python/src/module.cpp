// The extension module tessera._C; tessera/__init__.py re-exports it with the Python-only parts.
#include "common.h"

NB_MODULE(_C, m) {
  m.doc() = "Tessera's C++ API bound with nanobind (import tessera, not tessera._C)";
  // dtype objects, exception types and namedtuple types live as long as the process (see
  // types.cpp): not leaks to report at exit.
  nanobind::set_leak_warnings(false);
  tpy::register_errors(m);
  tpy::bind_types(m);
  tpy::bind_tensor(m);
  tpy::bind_factories(m);
  tpy::bind_runtime(m);
  tpy::bind_optim(m);
  tpy::bind_onnx(m);
  m.attr("__version__") = tessera::version();
}
