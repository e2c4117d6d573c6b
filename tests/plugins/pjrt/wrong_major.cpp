// A fake PJRT plugin for test_pjrt: exports GetPjrtApi, whose table reports API version 1.0 (a
// major version the pjrt backend does not speak) and holds no functions the backend may call.
#include <cstddef>

struct version { size_t struct_size; void* extension_start; int major, minor; };
struct table { size_t struct_size; void* extension_start; struct version version; void* functions[160]; };

static table api = {sizeof(table), nullptr, {sizeof(version), nullptr, 1, 0}, {}};

extern "C" __attribute__((visibility("default"))) const table* GetPjrtApi() { return &api; }
