#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <tessera/tensor.h>
namespace py = pybind11;
struct Obj { int v = 0; int f() const { return v; } };
PYBIND11_MODULE(cmp_pb, m) {
  py::class_<Obj>(m, "Obj").def(py::init<>()).def("f", &Obj::f);
  py::class_<tessera::Tensor>(m, "Tensor")
    .def("__add__", [](const tessera::Tensor& a, const tessera::Tensor& b) { return a + b; });
  m.def("randn", [](std::vector<int64_t> s) { return tessera::randn(s); });
}
