#include "pjrt_client.h"

#include <dlfcn.h>

#include <cstdio>

#include "core/fail.h"

namespace tessera::pjrt {
namespace {

std::string text(const char* s, size_t n) { return s ? std::string(s, n) : std::string(); }

// A serialized xla.CompileOptionsProto: executable_build_options (field 3, length-delimited)
// holding num_replicas (4) = R and num_partitions (5) = 1. The least XLA accepts: with an empty
// one its CPU client aborts on a replica count of 0. Everything else keeps XLA's defaults (the
// default device assignment: replica r on device r).
std::string compile_options(int64_t replicas) {
  std::string varint;
  for (uint64_t v = uint64_t(replicas); ; v >>= 7) {
    if (v < 0x80) { varint += char(v); break; }
    varint += char((v & 0x7f) | 0x80);
  }
  std::string inner = std::string(1, 0x20) + varint + std::string{0x28, 0x01};
  return std::string(1, 0x1a) + char(inner.size()) + inner;
}

}  // namespace

TensorType tensor_type(DType t, const std::vector<int64_t>& dims) {
  static const api::ElementType of[] = {api::ElementType::Pred, api::ElementType::S32, api::ElementType::S64, api::ElementType::F16,
                                        api::ElementType::BF16, api::ElementType::F32, api::ElementType::F64};
  return {of[size_t(t)], dims};  // DType's order: Bool, Int32, Int64, Float16, BFloat16, Float32, Float64
}

size_t TensorType::nbytes() const {
  size_t n = 1;
  for (int64_t d : dims) n *= size_t(d);
  switch (element) {
    case api::ElementType::Pred: case api::ElementType::S8: case api::ElementType::U8: return n;
    case api::ElementType::S16: case api::ElementType::U16: case api::ElementType::F16: case api::ElementType::BF16: return 2 * n;
    case api::ElementType::S32: case api::ElementType::U32: case api::ElementType::F32: return 4 * n;
    default: return 8 * n;  // S64, U64, F64
  }
}

// ---- errors and events ----

void Plugin::check(api::Error* e, const char* what) const {
  if (!e) return;
  auto m = api::args<api::ErrorMessageArgs>();
  m.error = e;
  api_->error_message(&m);
  std::string msg = text(m.message, m.message_size);
  discard(e);
  fail("pjrt", std::string(what) + ": " + msg, "");
}

bool Plugin::discard(api::Error* e) const {
  if (!e) return false;
  auto d = api::args<api::ErrorDestroyArgs>();
  d.error = e;
  api_->error_destroy(&d);
  return true;
}

void Plugin::await(api::Event* ev, const char* what) const {
  if (!ev) return;
  auto a = api::args<api::EventAwaitArgs>();
  a.event = ev;
  api::Error* e = api_->event_await(&a);
  auto d = api::args<api::EventDestroyArgs>();
  d.event = ev;
  api::Error* de = api_->event_destroy(&d);
  check(e, what);
  check(de, what);
}

// ---- loading ----

std::unique_ptr<Plugin> Plugin::load(const std::string& path, int64_t cpu_device_count) {
  auto bad = [&](const std::string& why) { fail("pjrt", "plugin " + path + ": " + why, ""); };
  // Never unloaded: a PJRT plugin's threads and static state outlive any client.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) bad(std::string("cannot load it: ") + dlerror());
  auto get = reinterpret_cast<const api::Api* (*)()>(dlsym(lib, "GetPjrtApi"));
  if (!get) bad("no GetPjrtApi symbol: not a PJRT plugin");
  const api::Api* a = get();
  if (!a) bad("GetPjrtApi returned no API table");
  const size_t version_end = offsetof(api::Api, version) + sizeof(api::Api::Version);
  if (a->struct_size < version_end) bad("its API table is too small (" + std::to_string(a->struct_size) + " bytes) to hold a version");
  const std::string v = std::to_string(a->version.major) + "." + std::to_string(a->version.minor);
  if (a->version.major != api::kMajor || a->version.minor < api::kMinMinor)
    bad("PJRT API version " + v + " is not supported: this backend speaks " + std::to_string(api::kMajor) + "." +
        std::to_string(api::kMinMinor) + " and later minors of major " + std::to_string(api::kMajor));
  if (a->struct_size < api::kApiBytesNeeded)
    bad("its API table (" + std::to_string(a->struct_size) + " bytes, version " + v + ") lacks functions this backend calls (" +
        std::to_string(api::kApiBytesNeeded) + " bytes needed)");

  // A table may hold null slots for functions a plugin leaves out; these it must have.
  for (const void* f : {(const void*)a->error_destroy, (const void*)a->error_message, (const void*)a->plugin_initialize,
                        (const void*)a->event_destroy, (const void*)a->event_await, (const void*)a->client_create,
                        (const void*)a->client_platform_name, (const void*)a->client_platform_version,
                        (const void*)a->client_addressable_devices, (const void*)a->client_compile,
                        (const void*)a->client_buffer_from_host, (const void*)a->description_kind,
                        (const void*)a->device_get_description, (const void*)a->executable_destroy,
                        (const void*)a->executable_num_outputs, (const void*)a->loaded_executable_destroy,
                        (const void*)a->loaded_executable_get_executable, (const void*)a->loaded_executable_execute,
                        (const void*)a->buffer_destroy, (const void*)a->buffer_to_host})
    if (!f) bad("its API table (version " + v + ") lacks a function this backend calls");

  std::unique_ptr<Plugin> p(new Plugin());
  p->path_ = path;
  p->api_ = a;
  auto init = api::args<api::PluginInitializeArgs>();
  p->check(a->plugin_initialize(&init), ("plugin " + path + ": initialization failed").c_str());
  auto cc = api::args<api::ClientCreateArgs>();
  auto count = api::args<api::NamedValue>();
  static const char kCount[] = "cpu_device_count";
  count.name = kCount;
  count.name_size = sizeof kCount - 1;
  count.type = api::NamedValueType::Int64;
  count.int64_value = cpu_device_count;
  count.value_size = 1;
  if (cpu_device_count > 0) {
    cc.create_options = &count;
    cc.num_options = 1;
  }
  p->check(a->client_create(&cc), ("plugin " + path + ": creating a client failed").c_str());
  p->client_ = cc.client;
  auto name = api::args<api::ClientStringArgs>();
  name.client = p->client_;
  p->check(a->client_platform_name(&name), "platform name");
  p->platform_ = text(name.text, name.text_size);
  auto ver = api::args<api::ClientStringArgs>();
  ver.client = p->client_;
  p->check(a->client_platform_version(&ver), "platform version");
  p->platform_version_ = text(ver.text, ver.text_size);
  auto devs = api::args<api::ClientDevicesArgs>();
  devs.client = p->client_;
  p->check(a->client_addressable_devices(&devs), "addressable devices");
  for (size_t i = 0; i < devs.num_devices; ++i) {
    p->devices_.push_back(devs.devices[i]);
    auto gd = api::args<api::DeviceGetDescriptionArgs>();
    gd.device = devs.devices[i];
    p->check(a->device_get_description(&gd), "device description");
    auto kind = api::args<api::DescriptionStringArgs>();
    kind.description = gd.description;
    p->check(a->description_kind(&kind), "device kind");
    p->device_kinds_.push_back(text(kind.text, kind.text_size));
  }
  return p;
}

std::string Plugin::api_version() const { return std::to_string(api_->version.major) + "." + std::to_string(api_->version.minor); }

// ---- programs ----

std::unique_ptr<LoadedProgram> Plugin::compile(const std::string& mlir, int64_t replicas) const {
  if (replicas < 1 || replicas > int64_t(devices_.size()))
    fail("pjrt", "a program for " + std::to_string(replicas) + " replicas cannot run on the " + std::to_string(devices_.size()) +
                     " devices of plugin " + path_, "");
  const std::string options = compile_options(replicas);
  auto prog = api::args<api::Program>();
  prog.code = mlir.data();
  prog.code_size = mlir.size();
  prog.format = "mlir";
  prog.format_size = 4;
  auto c = api::args<api::ClientCompileArgs>();
  c.client = client_;
  c.program = &prog;
  c.compile_options = options.data();
  c.compile_options_size = options.size();
  check(api_->client_compile(&c), "compile failed");
  auto p = std::make_unique<LoadedProgram>(*this, c.executable);
  p->replicas_ = replicas;
  p->describe();
  return p;
}

LoadedProgram::~LoadedProgram() {
  auto d = api::args<api::LoadedExecutableDestroyArgs>();
  d.executable = exe_;
  plugin_.discard(plugin_.api().loaded_executable_destroy(&d));
}

// The number of results and XLA's memory figures, from the executable behind the loaded one.
void LoadedProgram::describe() {
  const api::Api& a = plugin_.api();
  auto g = api::args<api::LoadedExecutableGetExecutableArgs>();
  g.loaded = exe_;
  plugin_.check(a.loaded_executable_get_executable(&g), "executable");
  auto n = api::args<api::ExecutableNumOutputsArgs>();
  n.executable = g.executable;
  api::Error* e = a.executable_num_outputs(&n);
  auto s = api::args<api::CompiledMemoryStatsArgs>();
  s.executable = g.executable;
  // Optional: a plugin may lack it, or refuse a struct of another version's size.
  if (a.executable_compiled_memory_stats && !plugin_.discard(a.executable_compiled_memory_stats(&s)))
    stats_ = {true, s.generated_code_bytes, s.argument_bytes, s.output_bytes, s.alias_bytes, s.temp_bytes, s.peak_bytes};
  auto d = api::args<api::ExecutableDestroyArgs>();
  d.executable = g.executable;
  plugin_.check(e, "number of outputs");
  plugin_.check(a.executable_destroy(&d), "executable");
  num_outputs_ = n.num_outputs;
}

std::string MemoryStats::text() const {
  auto mib = [](int64_t b) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f MiB", double(b) / (1 << 20));
    return std::string(t);
  };
  return "XLA: peak " + mib(peak) + " (arguments " + mib(arguments) + ", outputs " + mib(outputs) + ", aliased " + mib(aliased) +
         ", temporaries " + mib(temporaries) + "), code " + mib(code);
}

std::vector<BufferPtr> LoadedProgram::execute(int device, const std::vector<api::Buffer*>& args,
                                              const std::vector<int64_t>& non_donatable,
                                              const std::vector<TensorType>& outputs) const {
  const api::Api& a = plugin_.api();
  if (outputs.size() != num_outputs_)  // the plugin writes num_outputs_ of them
    fail("pjrt", "the program has " + std::to_string(num_outputs_) + " results, " + std::to_string(outputs.size()) + " types given", "");
  if (replicas_ != 1) fail("pjrt", "a program compiled for " + std::to_string(replicas_) + " replicas runs through execute_replicas", "");
  auto opts = api::args<api::ExecuteOptions>();
  opts.non_donatable_input_indices = non_donatable.data();
  opts.num_non_donatable_input_indices = non_donatable.size();
  std::vector<api::Buffer*> outs(outputs.size(), nullptr);
  api::Buffer* const* arg_list = args.data();
  api::Buffer** out_list = outs.data();
  api::Event* done = nullptr;
  auto x = api::args<api::LoadedExecutableExecuteArgs>();
  x.executable = exe_;
  x.options = &opts;
  x.argument_lists = &arg_list;
  x.num_devices = 1;
  x.num_args = args.size();
  x.output_lists = &out_list;
  x.device_complete_events = &done;
  x.execute_device = plugin_.device(device);
  plugin_.check(a.loaded_executable_execute(&x), "execute failed");
  std::vector<BufferPtr> result;
  for (size_t k = 0; k < outs.size(); ++k) {  // owned from here on, whatever happens next
    auto b = std::make_shared<DeviceBuffer>();
    b->plugin = &plugin_;
    b->buffer = outs[k];
    b->type = outputs[k];
    b->device = device;
    result.push_back(std::move(b));
  }
  plugin_.await(done, "execute failed");
  return result;
}

std::vector<std::vector<BufferPtr>> LoadedProgram::execute_replicas(const std::vector<std::vector<api::Buffer*>>& args,
                                                                    const std::vector<TensorType>& outputs) const {
  const api::Api& a = plugin_.api();
  const size_t n = args.size();
  if (outputs.size() != num_outputs_)  // the plugin writes num_outputs_ per replica
    fail("pjrt", "the program has " + std::to_string(num_outputs_) + " results, " + std::to_string(outputs.size()) + " types given", "");
  if (int64_t(n) != replicas_)
    fail("pjrt", "a program compiled for " + std::to_string(replicas_) + " replicas given " + std::to_string(n) + " argument lists", "");
  auto opts = api::args<api::ExecuteOptions>();
  std::vector<api::Buffer* const*> arg_lists;
  std::vector<std::vector<api::Buffer*>> outs(n, std::vector<api::Buffer*>(outputs.size(), nullptr));
  std::vector<api::Buffer**> out_lists;
  for (size_t r = 0; r < n; ++r) {
    if (args[r].size() != args[0].size()) fail("pjrt", "replicas given different numbers of arguments", "");
    arg_lists.push_back(args[r].data());
    out_lists.push_back(outs[r].data());
  }
  std::vector<api::Event*> done(n, nullptr);
  auto x = api::args<api::LoadedExecutableExecuteArgs>();
  x.executable = exe_;
  x.options = &opts;
  x.argument_lists = arg_lists.data();
  x.num_devices = n;
  x.num_args = args.empty() ? 0 : args[0].size();
  x.output_lists = out_lists.data();
  x.device_complete_events = done.data();
  x.execute_device = nullptr;  // the compiled device assignment: replica r on device r
  plugin_.check(a.loaded_executable_execute(&x), "execute failed");
  std::vector<std::vector<BufferPtr>> result(n);
  for (size_t r = 0; r < n; ++r)
    for (size_t k = 0; k < outputs.size(); ++k) {  // owned from here on, whatever happens next
      auto b = std::make_shared<DeviceBuffer>();
      b->plugin = &plugin_;
      b->buffer = outs[r][k];
      b->type = outputs[k];
      b->device = int(r);
      result[r].push_back(std::move(b));
    }
  for (api::Event* ev : done) plugin_.await(ev, "execute failed");
  return result;
}

// ---- buffers ----

BufferPtr Plugin::upload(int device, const void* data, const TensorType& t) const {
  auto u = api::args<api::ClientBufferFromHostArgs>();
  u.client = client_;
  u.data = data;
  u.type = t.element;
  u.dims = t.dims.data();
  u.num_dims = t.dims.size();
  u.semantics = api::HostBufferSemantics::ImmutableOnlyDuringCall;
  u.device = devices_[size_t(device)];
  check(api_->client_buffer_from_host(&u), "copy to the device");
  auto b = std::make_shared<DeviceBuffer>();
  b->plugin = this;
  b->buffer = u.buffer;
  b->type = t;
  b->device = device;
  await(u.done_with_host_buffer, "copy to the device");
  return b;
}

BufferPtr Plugin::copy_to_device(const DeviceBuffer& src, int device) const {
  if (!api_->buffer_copy_to_device) fail("pjrt", "plugin " + path_ + " cannot copy between its devices", "");
  auto c = api::args<api::BufferCopyToDeviceArgs>();
  c.buffer = src.buffer;
  c.dst_device = devices_[size_t(device)];
  check(api_->buffer_copy_to_device(&c), "copy between devices");
  auto b = std::make_shared<DeviceBuffer>();
  b->plugin = this;
  b->buffer = c.dst_buffer;
  b->type = src.type;
  b->device = device;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (!buffer) return;
  auto d = api::args<api::BufferDestroyArgs>();
  d.buffer = buffer;
  plugin->discard(plugin->api().buffer_destroy(&d));
}

void DeviceBuffer::to_host(void* dst) const {
  auto t = api::args<api::BufferToHostArgs>();
  t.src = buffer;
  t.dst = dst;
  t.dst_size = nbytes();
  plugin->check(plugin->api().buffer_to_host(&t), "copy to the host");
  plugin->await(t.event, "copy to the host");
}

}  // namespace tessera::pjrt
