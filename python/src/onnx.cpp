// tessera._C._onnx: the C++ ONNX importer (tessera/onnx.h) for tessera.onnx, which wraps the
// imported model in a tessera.nn.Module whose Parameters are handles on the C++ model's own
// parameter tensors (so tessera.optim's in-place updates are what the model runs with). Empty
// where the library was built without ONNX import: tessera.onnx.load then says so.
#include "common.h"

#ifdef TESSERA_PY_ONNX
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>

#include "tessera/onnx.h"

namespace tpy {

void bind_onnx(nb::module_& parent) {
  using tessera::onnx::Model;
  nb::module_ m = parent.def_submodule("_onnx", "the ONNX importer behind tessera.onnx");
  nb::class_<Model>(m, "Model")
      .def_prop_ro("input_names", &Model::input_names)
      .def_prop_ro("output_names", &Model::output_names)
      .def_prop_ro("opset", &Model::opset)
      .def("run", &Model::run, nb::arg("inputs"))
      .def("named_parameters", &Model::named_parameters)
      .def("named_buffers", &Model::named_buffers)
      .def("train", &Model::train, nb::arg("mode") = true);
  m.def(
      "load",
      [](const std::string& path, nb::handle device) {
        tessera::onnx::LoadOptions o;
        if (!device.is_none()) o.device = to_device(device);
        return tessera::onnx::load(path, o);
      },
      nb::arg("path"), nb::arg("device") = nb::none());
  m.def("supported_ops", &tessera::onnx::supported_ops);
}

}  // namespace tpy
#else
namespace tpy {
void bind_onnx(nb::module_&) {}
}  // namespace tpy
#endif
