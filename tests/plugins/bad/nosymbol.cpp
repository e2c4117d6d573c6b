// A shared library named like a plugin that does not export tessera_backend_plugin.
extern "C" __attribute__((visibility("default"))) int not_a_tessera_backend() { return 1; }
