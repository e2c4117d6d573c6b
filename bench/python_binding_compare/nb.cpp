#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>
#include <tessera/tensor.h>
namespace nb = nanobind;
struct Obj { int v = 0; int f() const { return v; } };
NB_MODULE(cmp_nb, m) {
  nb::class_<Obj>(m, "Obj").def(nb::init<>()).def("f", &Obj::f);
  nb::class_<tessera::Tensor>(m, "Tensor")
    .def("__add__", [](const tessera::Tensor& a, const tessera::Tensor& b) { return a + b; });
  m.def("randn", [](std::vector<int64_t> s) { return tessera::randn(s); });
}
