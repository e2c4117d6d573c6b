// The runtime around tensors: grad mode, module scopes, sync, seeds, metrics, devices, the
// profiler and the memory plan; plus the functional ops tessera.nn builds on (_C._nn).
#include <memory>

#include "common.h"

namespace tpy {
namespace {

// Module scopes pushed from Python (tessera.nn.Module.__call__), popped in reverse order.
thread_local std::vector<std::unique_ptr<tessera::Scope>> t_scopes;
// tessera.autocast's settings (tessera/autocast.h), pushed by __enter__ and popped by __exit__.
thread_local std::vector<std::unique_ptr<tessera::Autocast>> t_autocasts;

std::optional<Tensor> opt(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }
Tensor def(const std::optional<Tensor>& t) { return t ? *t : Tensor(); }
std::vector<int64_t> ints(nb::handle h) {
  if (h.is_none()) return {};
  return PyLong_Check(h.ptr()) ? std::vector<int64_t>{nb::cast<int64_t>(h)} : to_shape(h);
}
tessera::Reduction reduction(const std::string& r) {
  if (r == "mean") return tessera::Reduction::Mean;
  if (r == "sum") return tessera::Reduction::Sum;
  if (r == "none") return tessera::Reduction::None;
  throw nb::value_error(("reduction must be 'mean', 'sum' or 'none', got '" + r + "'").c_str());
}

void bind_nn_ops(nb::module_& m) {
  nb::module_ f = m.def_submodule("_nn", "C++ ops behind tessera.nn.functional");
  auto none = nb::none();
  f.def("layer_norm", [](const Tensor& x, nb::handle shape, std::optional<Tensor> w, std::optional<Tensor> b, double eps) {
    return tessera::layer_norm(x, ints(shape), def(w), def(b), eps);
  }, nb::arg("input"), nb::arg("normalized_shape"), nb::arg("weight").none() = none, nb::arg("bias").none() = none,
     nb::arg("eps") = 1e-5);
  f.def("embedding", [](const Tensor& idx, const Tensor& w) { return tessera::embedding(w, idx); }, nb::arg("input"), nb::arg("weight"));
  f.def("cross_entropy", [](const Tensor& x, const Tensor& t, int64_t ignore_index, const std::string& red, double ls) {
    return tessera::cross_entropy(x, t, {reduction(red), ignore_index, ls});
  }, nb::arg("input"), nb::arg("target"), nb::arg("ignore_index") = -100, nb::arg("reduction") = "mean",
     nb::arg("label_smoothing") = 0.0);
  f.def("nll_loss", [](const Tensor& x, const Tensor& t, int64_t ignore_index, const std::string& red) {
    return tessera::nll_loss(x, t, {reduction(red), ignore_index});
  }, nb::arg("input"), nb::arg("target"), nb::arg("ignore_index") = -100, nb::arg("reduction") = "mean");
  f.def("mse_loss", [](const Tensor& x, const Tensor& t, const std::string& red) { return tessera::mse_loss(x, t, reduction(red)); },
        nb::arg("input"), nb::arg("target"), nb::arg("reduction") = "mean");
  f.def("gelu", [](const Tensor& x, bool tanh) { return tessera::gelu(x, tanh); }, nb::arg("input"), nb::arg("tanh") = false);
  f.def("silu", [](const Tensor& x) { return tessera::silu(x); });
  f.def("softplus", [](const Tensor& x, double beta, double th) { return tessera::softplus(x, beta, th); },
        nb::arg("input"), nb::arg("beta") = 1.0, nb::arg("threshold") = 20.0);
  f.def("conv1d", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, int64_t s, int64_t p, int64_t d, int64_t g) {
    return tessera::conv1d(x, w, def(b), s, p, d, g);
  }, nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = none, nb::arg("stride") = 1, nb::arg("padding") = 0,
     nb::arg("dilation") = 1, nb::arg("groups") = 1);
  f.def("conv2d", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle s, nb::handle p, nb::handle d, int64_t g) {
    return tessera::conv2d(x, w, def(b), ints(s), ints(p), ints(d), g);
  }, nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = none, nb::arg("stride") = 1, nb::arg("padding") = 0,
     nb::arg("dilation") = 1, nb::arg("groups") = 1);
  f.def("conv_transpose2d", [](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle s, nb::handle p,
                               nb::handle op, int64_t g, nb::handle d) {
    return tessera::conv_transpose2d(x, w, def(b), ints(s), ints(p), ints(op), g, ints(d));
  }, nb::arg("input"), nb::arg("weight"), nb::arg("bias").none() = none, nb::arg("stride") = 1, nb::arg("padding") = 0,
     nb::arg("output_padding") = 0, nb::arg("groups") = 1, nb::arg("dilation") = 1);
  f.def("max_pool2d", [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p) {
    return tessera::max_pool2d(x, ints(k), ints(s), ints(p));
  }, nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = none, nb::arg("padding") = 0);
  f.def("avg_pool2d", [](const Tensor& x, nb::handle k, nb::handle s, nb::handle p, bool cip) {
    return tessera::avg_pool2d(x, ints(k), ints(s), ints(p), cip);
  }, nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = none, nb::arg("padding") = 0,
     nb::arg("count_include_pad") = true);
  f.def("adaptive_avg_pool2d", [](const Tensor& x, nb::handle s) { return tessera::adaptive_avg_pool2d(x, ints(s)); });
  f.def("batch_norm", [](const Tensor& x, std::optional<Tensor> rm, std::optional<Tensor> rv, std::optional<Tensor> w,
                         std::optional<Tensor> b, bool training, double momentum, double eps) {
    return tessera::batch_norm(x, def(rm), def(rv), def(w), def(b), training, momentum, eps);
  }, nb::arg("input"), nb::arg("running_mean").none(), nb::arg("running_var").none(), nb::arg("weight").none() = none,
     nb::arg("bias").none() = none, nb::arg("training") = false, nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5);
  // pads in tessera's order: {lo0, hi0, lo1, hi1, ...} from the first dim (F.pad's is reversed).
  f.def("pad", [](const Tensor& x, const std::vector<int64_t>& pads, double v) { return tessera::pad(x, pads, v); },
        nb::arg("input"), nb::arg("pads"), nb::arg("value") = 0.0);
}

void bind_profiler(nb::module_& m) {
  nb::class_<tessera::OpTableRow>(m, "OpTableRow")
      .def_ro("group", &tessera::OpTableRow::group).def_ro("name", &tessera::OpTableRow::name)
      .def_ro("ms", &tessera::OpTableRow::ms).def_ro("calls", &tessera::OpTableRow::calls)
      .def_ro("flops", &tessera::OpTableRow::flops).def_ro("bytes", &tessera::OpTableRow::bytes)
      .def_ro("percent", &tessera::OpTableRow::percent)
      .def("__repr__", [](const tessera::OpTableRow& r) { return "OpTableRow(" + r.group + ", '" + r.name + "', " + std::to_string(r.ms) + " ms)"; });
  nb::class_<tessera::Profiler>(m, "Profiler")
      .def(nb::init<bool>(), nb::arg("start_now") = false)
      .def("start", &tessera::Profiler::start)
      .def("stop", &tessera::Profiler::stop)
      .def_prop_ro("recording", &tessera::Profiler::recording)
      .def("wall_ms", &tessera::Profiler::wall_ms)
      .def("op_table", &tessera::Profiler::op_table, nb::arg("group") = "op")
      .def("table", &tessera::Profiler::table_text)
      .def("table_csv", &tessera::Profiler::table_csv)
      .def("chrome_trace", &tessera::Profiler::chrome_trace)
      .def("export_chrome_trace", &tessera::Profiler::write_chrome_trace, nb::arg("path"))
      .def("__enter__", [](nb::handle self) { nb::cast<tessera::Profiler&>(self).start(); return nb::borrow(self); })
      .def("__exit__", [](tessera::Profiler& p, nb::args) { p.stop(); return false; });

  nb::class_<tessera::PlannedBuffer>(m, "PlannedBuffer")
      .def_ro("kind", &tessera::PlannedBuffer::kind).def_prop_ro("shape", [](const tessera::PlannedBuffer& b) { return shape_tuple(b.shape); })
      .def_ro("bytes", &tessera::PlannedBuffer::bytes).def_ro("op", &tessera::PlannedBuffer::op)
      .def_ro("scope", &tessera::PlannedBuffer::scope);
  nb::class_<tessera::MemoryPlan>(m, "MemoryPlan")
      .def_ro("peak_bytes", &tessera::MemoryPlan::peak_bytes).def_ro("peak_step", &tessera::MemoryPlan::peak_step)
      .def_ro("peak_step_text", &tessera::MemoryPlan::peak_step_text)
      .def_ro("live_at_peak", &tessera::MemoryPlan::live_at_peak).def_ro("buffers", &tessera::MemoryPlan::buffers)
      .def_ro("arena_bytes", &tessera::MemoryPlan::arena_bytes).def_ro("param_bytes", &tessera::MemoryPlan::param_bytes)
      .def_ro("num_steps", &tessera::MemoryPlan::num_steps)
      .def("report", &tessera::MemoryPlan::report, nb::arg("max_buffers") = 5)
      .def("__repr__", [](const tessera::MemoryPlan& p) { return p.report(); });
  m.def("plan_memory", &tessera::plan_memory, nb::arg("outputs"));
  m.def("pending_memory_plan", &tessera::pending_memory_plan);
  m.def("last_memory_plan", &tessera::last_memory_plan);
  m.def("write_memory_viewer", &tessera::write_memory_viewer, nb::arg("path"), nb::arg("plan"),
        nb::arg("title") = "tessera memory plan");
}

void bind_metrics(nb::module_& m) {
  nb::class_<tessera::DeviceMetrics>(m, "DeviceMetrics")
      .def_ro("steps_launched", &tessera::DeviceMetrics::steps_launched)
      .def_ro("kernels_compiled", &tessera::DeviceMetrics::kernels_compiled)
      .def_ro("bytes_to_device", &tessera::DeviceMetrics::bytes_to_device)
      .def_ro("bytes_to_host", &tessera::DeviceMetrics::bytes_to_host);
  nb::class_<tessera::Metrics>(m, "Metrics")
      .def_ro("graphs_compiled", &tessera::Metrics::graphs_compiled).def_ro("cache_hits", &tessera::Metrics::cache_hits)
      .def_ro("host_syncs", &tessera::Metrics::host_syncs).def_ro("steps_launched", &tessera::Metrics::steps_launched)
      .def_ro("live_bytes", &tessera::Metrics::live_bytes).def_ro("peak_bytes", &tessera::Metrics::peak_bytes)
      .def_ro("bytes_to_device", &tessera::Metrics::bytes_to_device).def_ro("bytes_to_host", &tessera::Metrics::bytes_to_host)
      .def_ro("compile_ms", &tessera::Metrics::compile_ms).def_ro("execute_ms", &tessera::Metrics::execute_ms)
      .def_ro("devices", &tessera::Metrics::devices).def_ro("compile_reasons", &tessera::Metrics::compile_reasons)
      .def("report", &tessera::Metrics::report)
      .def("__repr__", &tessera::Metrics::report);
  m.def("metrics", &tessera::metrics);
  m.def("reset_peak_bytes", &tessera::reset_peak_bytes);
}

}  // namespace

void bind_runtime(nb::module_& m) {
  m.def("is_grad_enabled", &tessera::grad_enabled);
  m.def("_set_grad_enabled", &tessera::set_grad_enabled);
  m.def("push_scope", [](const std::string& name) { t_scopes.push_back(std::make_unique<tessera::Scope>(name)); });
  m.def("pop_scope", [] {
    if (t_scopes.empty()) throw nb::index_error("pop_scope: no scope was pushed");
    t_scopes.pop_back();
  });
  m.def("current_scope", &tessera::current_scope);
  m.def("_push_autocast", [](nb::handle dtype, bool enabled) {
    t_autocasts.push_back(std::make_unique<tessera::Autocast>(to_dtype(dtype), enabled));
  }, nb::arg("dtype"), nb::arg("enabled"));
  m.def("_pop_autocast", [] {
    if (t_autocasts.empty()) throw nb::index_error("_pop_autocast: no autocast was entered");
    t_autocasts.pop_back();
  });
  m.def("get_autocast_dtype", [] {
    std::optional<DType> d = tessera::autocast_dtype();
    return d ? dtype_object(*d) : nb::none();
  }, "The dtype products take their float32 operands in on this thread (None outside autocast)");
  m.def("sync", &tessera::sync);
  m.def("manual_seed", [](uint64_t seed) { tessera::manual_seed(seed); }, nb::arg("seed"));
  // Python's state is the position after every draw traced so far, pending ones too (torch's
  // state after creating a random tensor is past its numbers); setting it realizes pending draws
  // first, so they keep the numbers they were drawn with.
  m.def("get_rng_state", [] {
    auto s = tessera::rng_state();
    return nb::make_tuple(s.seed, s.offset + s.draws);
  });
  m.def("set_rng_state", [](std::tuple<uint64_t, uint64_t> s) {
    if (tessera::rng_state().draws) tessera::sync();
    tessera::set_rng_state({std::get<0>(s), std::get<1>(s)});
  });
  m.def("devices", [] {
    nb::list out;
    for (const tessera::DeviceInfo& d : tessera::devices())
      out.append(nb::make_tuple(d.device, d.description, d.can_execute, d.accelerator));
    return out;
  }, "Every registered device: (device, description, can_execute, accelerator)");
  m.def("unavailable_backends", &tessera::unavailable_backends);
  m.def("plugin_errors", &tessera::plugin_errors);
  m.def("best_device", &tessera::Device::best);
  m.def("cat", [](const std::vector<Tensor>& ts, int64_t dim) { return tessera::cat(ts, dim); }, nb::arg("tensors"), nb::arg("dim") = 0);
  m.def("stack", [](const std::vector<Tensor>& ts, int64_t dim) { return tessera::stack(ts, dim); }, nb::arg("tensors"), nb::arg("dim") = 0);
  m.def("where", [](const Tensor& c, nb::handle a, nb::handle b) {
    if (!is_tensor(a) && !is_tensor(b)) {
      Tensor x = from_python(a, std::nullopt, c.device());
      Tensor y = operand(x, b, "where");
      weak_zero_dim(x, y);
      return tessera::where(c, x, y);
    }
    Tensor x = is_tensor(a) ? as_tensor(a) : operand(as_tensor(b), a, "where");
    Tensor y = is_tensor(b) ? as_tensor(b) : operand(x, b, "where");
    weak_zero_dim(x, y);
    return tessera::where(c, x, y);
  }, nb::arg("condition"), nb::arg("input"), nb::arg("other"));
  bind_metrics(m);
  bind_profiler(m);
  bind_nn_ops(m);
}

}  // namespace tpy
