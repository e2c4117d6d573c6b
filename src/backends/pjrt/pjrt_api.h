// The part of the PJRT C API (OpenXLA's plugin interface, API major version 0) that the pjrt
// backend calls, declared here from the public specification: no header of another project is
// copied. A plugin exports `GetPjrtApi`, returning a table: a header (struct_size, an extension
// chain, the API version the plugin was built with) and then function pointers in a fixed order
// that new versions only append to. Every function takes one argument struct whose first field is
// its struct_size, the bytes of the fields the caller knows (through the last one it sets): the
// plugin reads no field beyond it, so each struct below stops at the last field this backend uses
// or needs in order to reach a later one. The layout is that of minor version 115 and later.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera::pjrt::api {

struct Error;
struct Event;
struct Client;
struct Device;
struct DeviceDescription;
struct Executable;
struct LoadedExecutable;
struct Buffer;

// Element types of buffers (the specification's numbering; the ones Tessera uses, and their kin).
enum class ElementType : int32_t {
  Invalid = 0, Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, F32, F64, BF16,
};

// struct_size of an argument struct: through the end of its last field.
#define TESSERA_PJRT_SIZE(T, last) \
  inline constexpr size_t struct_size_of(const T*) { return offsetof(T, last) + sizeof(T::last); }

// Every argument struct opens with these two fields.
#define TESSERA_PJRT_HEAD \
  size_t struct_size;     \
  void* extension_start

struct ErrorDestroyArgs { TESSERA_PJRT_HEAD; Error* error; };
TESSERA_PJRT_SIZE(ErrorDestroyArgs, error)
struct ErrorMessageArgs { TESSERA_PJRT_HEAD; const Error* error; const char* message; size_t message_size; };
TESSERA_PJRT_SIZE(ErrorMessageArgs, message_size)
struct PluginInitializeArgs { TESSERA_PJRT_HEAD; };
TESSERA_PJRT_SIZE(PluginInitializeArgs, extension_start)
struct EventDestroyArgs { TESSERA_PJRT_HEAD; Event* event; };
TESSERA_PJRT_SIZE(EventDestroyArgs, event)
struct EventAwaitArgs { TESSERA_PJRT_HEAD; Event* event; };
TESSERA_PJRT_SIZE(EventAwaitArgs, event)

// A named option (PJRT_NamedValue): client-creation options such as XLA's CPU plugin's
// "cpu_device_count" (int64). Only the int64 kind is used here.
enum class NamedValueType : int32_t { String = 0, Int64, Int64List, Float, Bool };
struct NamedValue {
  TESSERA_PJRT_HEAD;
  const char* name;
  size_t name_size;
  NamedValueType type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;  // 1 for a scalar
};
TESSERA_PJRT_SIZE(NamedValue, value_size)

struct ClientCreateArgs {
  TESSERA_PJRT_HEAD;
  const NamedValue* create_options;  // named values (none, or the CPU plugin's device count)
  size_t num_options;
  void* kv_get_callback;
  void* kv_get_user_arg;
  void* kv_put_callback;
  void* kv_put_user_arg;
  Client* client;  // out
  void* kv_try_get_callback;
  void* kv_try_get_user_arg;
};
TESSERA_PJRT_SIZE(ClientCreateArgs, kv_try_get_user_arg)
struct ClientDestroyArgs { TESSERA_PJRT_HEAD; Client* client; };
TESSERA_PJRT_SIZE(ClientDestroyArgs, client)
// PlatformName and PlatformVersion share this shape.
struct ClientStringArgs { TESSERA_PJRT_HEAD; Client* client; const char* text; size_t text_size; };
TESSERA_PJRT_SIZE(ClientStringArgs, text_size)
struct ClientDevicesArgs { TESSERA_PJRT_HEAD; Client* client; Device* const* devices; size_t num_devices; };
TESSERA_PJRT_SIZE(ClientDevicesArgs, num_devices)

struct Program {
  TESSERA_PJRT_HEAD;
  const char* code;
  size_t code_size;
  const char* format;  // "mlir": MLIR text or bytecode
  size_t format_size;
};
TESSERA_PJRT_SIZE(Program, format_size)
struct ClientCompileArgs {
  TESSERA_PJRT_HEAD;
  Client* client;
  const Program* program;
  const char* compile_options;  // a serialized xla.CompileOptionsProto
  size_t compile_options_size;
  LoadedExecutable* executable;  // out
};
TESSERA_PJRT_SIZE(ClientCompileArgs, executable)

enum class HostBufferSemantics : int32_t { ImmutableOnlyDuringCall = 0 };
struct ClientBufferFromHostArgs {
  TESSERA_PJRT_HEAD;
  Client* client;
  const void* data;
  ElementType type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;  // null: dense, major to minor
  size_t num_byte_strides;
  HostBufferSemantics semantics;
  Device* device;
  void* memory;         // null: the device's default memory
  void* device_layout;  // null: dense, major to minor
  Event* done_with_host_buffer;  // out
  Buffer* buffer;                // out
};
TESSERA_PJRT_SIZE(ClientBufferFromHostArgs, buffer)

struct DeviceGetDescriptionArgs { TESSERA_PJRT_HEAD; Device* device; DeviceDescription* description; };
TESSERA_PJRT_SIZE(DeviceGetDescriptionArgs, description)
// DeviceDescription Kind and DebugString share this shape.
struct DescriptionStringArgs { TESSERA_PJRT_HEAD; DeviceDescription* description; const char* text; size_t text_size; };
TESSERA_PJRT_SIZE(DescriptionStringArgs, text_size)

struct ExecutableDestroyArgs { TESSERA_PJRT_HEAD; Executable* executable; };
TESSERA_PJRT_SIZE(ExecutableDestroyArgs, executable)
struct ExecutableNumOutputsArgs { TESSERA_PJRT_HEAD; Executable* executable; size_t num_outputs; };
TESSERA_PJRT_SIZE(ExecutableNumOutputsArgs, num_outputs)
struct LoadedExecutableDestroyArgs { TESSERA_PJRT_HEAD; LoadedExecutable* executable; };
TESSERA_PJRT_SIZE(LoadedExecutableDestroyArgs, executable)
struct LoadedExecutableGetExecutableArgs { TESSERA_PJRT_HEAD; LoadedExecutable* loaded; Executable* executable; };
TESSERA_PJRT_SIZE(LoadedExecutableGetExecutableArgs, executable)

struct ExecuteOptions {
  TESSERA_PJRT_HEAD;
  void* send_callbacks;
  void* recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  void* context;  // an execute context (none)
  const char* call_location;
  size_t num_tasks;  // multi-task launches (none)
  int* task_ids;
  int64_t* incarnation_ids;
};
TESSERA_PJRT_SIZE(ExecuteOptions, incarnation_ids)
struct LoadedExecutableExecuteArgs {
  TESSERA_PJRT_HEAD;
  LoadedExecutable* executable;
  ExecuteOptions* options;
  Buffer* const* const* argument_lists;  // [devices][arguments]
  size_t num_devices;
  size_t num_args;
  Buffer** const* output_lists;  // [devices][outputs], filled by the plugin
  Event** device_complete_events;  // optional, [devices]
  Device* execute_device;          // null: the compiled device assignment
};
TESSERA_PJRT_SIZE(LoadedExecutableExecuteArgs, execute_device)

struct BufferDestroyArgs { TESSERA_PJRT_HEAD; Buffer* buffer; };
TESSERA_PJRT_SIZE(BufferDestroyArgs, buffer)
struct BufferToHostArgs {
  TESSERA_PJRT_HEAD;
  Buffer* src;
  void* host_layout;  // null: the buffer's own
  void* dst;
  size_t dst_size;
  Event* event;  // out: the copy is done
};
TESSERA_PJRT_SIZE(BufferToHostArgs, event)
struct BufferCopyToDeviceArgs { TESSERA_PJRT_HEAD; Buffer* buffer; Device* dst_device; Buffer* dst_buffer; };
TESSERA_PJRT_SIZE(BufferCopyToDeviceArgs, dst_buffer)

struct CompiledMemoryStatsArgs {
  TESSERA_PJRT_HEAD;
  Executable* executable;
  int64_t generated_code_bytes, argument_bytes, output_bytes, alias_bytes, temp_bytes;  // device memory
  int64_t host_generated_code_bytes, host_argument_bytes, host_output_bytes, host_alias_bytes, host_temp_bytes;
  int64_t peak_bytes;  // the most device memory the program holds at once
};
TESSERA_PJRT_SIZE(CompiledMemoryStatsArgs, peak_bytes)

#undef TESSERA_PJRT_HEAD
#undef TESSERA_PJRT_SIZE

// An argument struct with its struct_size set and every other field zero.
template <class T>
T args() {
  T t{};
  t.struct_size = struct_size_of(&t);
  return t;
}

using Fn = Error* (*)(void*);  // a slot of the table whose call this backend never makes

// The table, through the last function this backend calls (GetCompiledMemoryStats: slot 96).
struct Api {
  size_t struct_size;
  void* extension_start;
  struct Version {
    size_t struct_size;
    void* extension_start;
    int major, minor;
  } version;

  void (*error_destroy)(ErrorDestroyArgs*);        // 0
  void (*error_message)(ErrorMessageArgs*);        // 1
  Fn error_get_code;                               // 2
  Error* (*plugin_initialize)(PluginInitializeArgs*);  // 3
  Fn plugin_attributes;                            // 4
  Error* (*event_destroy)(EventDestroyArgs*);      // 5
  Fn event_is_ready, event_error;                  // 6, 7
  Error* (*event_await)(EventAwaitArgs*);          // 8
  Fn event_on_ready;                               // 9
  Error* (*client_create)(ClientCreateArgs*);      // 10
  Error* (*client_destroy)(ClientDestroyArgs*);    // 11
  Error* (*client_platform_name)(ClientStringArgs*);     // 12
  Fn client_process_index;                               // 13
  Error* (*client_platform_version)(ClientStringArgs*);  // 14
  Fn client_devices;                                     // 15
  Error* (*client_addressable_devices)(ClientDevicesArgs*);  // 16
  Fn client_lookup_device, client_lookup_addressable_device, client_addressable_memories;  // 17-19
  Error* (*client_compile)(ClientCompileArgs*);    // 20
  Fn client_default_device_assignment;             // 21
  Error* (*client_buffer_from_host)(ClientBufferFromHostArgs*);  // 22
  Fn description_id, description_process_index, description_attributes;  // 23-25
  Error* (*description_kind)(DescriptionStringArgs*);          // 26
  Error* (*description_debug_string)(DescriptionStringArgs*);  // 27
  Fn description_to_string;                                    // 28
  Error* (*device_get_description)(DeviceGetDescriptionArgs*); // 29
  Fn device_slots_30_39[10];  // IsAddressable .. MemoryStats, the five Memory functions
  Error* (*executable_destroy)(ExecutableDestroyArgs*);        // 40
  Fn executable_name, executable_num_replicas, executable_num_partitions;  // 41-43
  Error* (*executable_num_outputs)(ExecutableNumOutputsArgs*); // 44
  Fn executable_slots_45_49[5];  // code size, cost analysis, output memory kinds, optimized program, serialize
  Error* (*loaded_executable_destroy)(LoadedExecutableDestroyArgs*);              // 50
  Error* (*loaded_executable_get_executable)(LoadedExecutableGetExecutableArgs*); // 51
  Fn loaded_executable_slots_52_54[3];  // AddressableDevices, Delete, IsDeleted
  Error* (*loaded_executable_execute)(LoadedExecutableExecuteArgs*);  // 55
  Fn executable_deserialize_and_load, loaded_executable_fingerprint;  // 56, 57
  Error* (*buffer_destroy)(BufferDestroyArgs*);    // 58
  Fn buffer_slots_59_68[10];  // ElementType .. IsDeleted
  Error* (*buffer_copy_to_device)(BufferCopyToDeviceArgs*);  // 69
  Error* (*buffer_to_host)(BufferToHostArgs*);     // 70
  Fn buffer_slots_71_76[6];   // IsOnCpu .. OpaqueDeviceMemoryDataPointer
  Fn stream_and_topology_slots_77_88[12];
  Fn compile, executable_output_element_types, executable_output_dimensions, buffer_copy_to_memory;  // 89-92
  Fn client_create_view_of_device_buffer, executable_fingerprint, client_topology_description;       // 93-95
  Error* (*executable_compiled_memory_stats)(CompiledMemoryStatsArgs*);  // 96
};

// The table's bytes through the last function called: a plugin reporting less is too old.
inline constexpr size_t kApiBytesNeeded = offsetof(Api, executable_compiled_memory_stats) + sizeof(void*);
inline constexpr int kMajor = 0, kMinMinor = 115;

}  // namespace tessera::pjrt::api
