// Ctx: attribute and operand readers for the node being traced; errors name op, node and opset.
#include "interop/onnx/graph.h"

namespace tessera::onnx::detail {

std::string node_label(const ::onnx::NodeProto& n, int index) {
  // append(), not "#" + std::string: GCC 12 warns (-Wrestrict) about the latter's insert.
  return n.name().empty() ? std::string("#").append(std::to_string(index)) : std::string("'").append(n.name()).append("'");
}

void Ctx::fail(const std::string& what) const {
  throw Error("onnx: " + node.op_type() + " node " + node_label(node, index) + " (opset " + std::to_string(opset) + "): " + what);
}

const ::onnx::AttributeProto* Ctx::attr(const std::string& name) const {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t Ctx::i(const std::string& name, int64_t def) const {
  const auto* a = attr(name);
  return a ? a->i() : def;
}
double Ctx::f(const std::string& name, double def) const {
  const auto* a = attr(name);
  return a ? a->f() : def;
}
std::string Ctx::s(const std::string& name, const std::string& def) const {
  const auto* a = attr(name);
  return a ? a->s() : def;
}
std::vector<int64_t> Ctx::ints(const std::string& name, std::vector<int64_t> def) const {
  const auto* a = attr(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : def;
}
std::vector<double> Ctx::floats(const std::string& name, std::vector<double> def) const {
  const auto* a = attr(name);
  return a ? std::vector<double>(a->floats().begin(), a->floats().end()) : def;
}

const Tensor& Ctx::input(size_t k) {
  if (!has_input(k)) fail("input " + std::to_string(k) + " is required");
  if (in.size() <= k) in.resize(k + 1);
  if (!in[k].defined()) in[k] = materialize ? materialize(k) : to_device(*hin[k], device);
  return in[k];
}

std::vector<int64_t> Ctx::ints_input(size_t k) {
  if (k < hin.size() && hin[k]) {  // known on the host: no device read
    const HostVal& h = *hin[k];
    if (h.floating() || h.dtype == DType::Bool) fail("shape operand " + std::to_string(k) + " must be int32/int64, got " + dtype_name(h.dtype));
    if (h.shape.size() > 1) fail("shape operand " + std::to_string(k) + " must be a scalar or 1-D, got " + shape_str(h.shape));
    return h.i;
  }
  const Tensor& t = input(k);
  if (!is_integral(t.dtype())) fail("shape operand " + std::to_string(k) + " must be int32/int64, got " + dtype_name(t.dtype()));
  if (t.dim() > 1) fail("shape operand " + std::to_string(k) + " must be a scalar or 1-D, got " + shape_str(t.shape()));
  device_read = true;
  return t.to(DType::Int64).to_vector<int64_t>();
}

std::vector<double> Ctx::doubles_input(size_t k) {
  if (k < hin.size() && hin[k]) {
    const HostVal& h = *hin[k];
    return h.floating() ? h.f : std::vector<double>(h.i.begin(), h.i.end());
  }
  const Tensor& t = input(k);
  device_read = true;
  return t.to(DType::Float64).to_vector<double>();
}

}  // namespace tessera::onnx::detail
