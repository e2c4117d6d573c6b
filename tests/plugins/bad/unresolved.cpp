// A plugin that needs a symbol no process provides: dlopen fails, the loader reports dlerror.
extern "C" void tessera_test_symbol_nobody_defines();
extern "C" __attribute__((visibility("default"))) void tessera_backend_plugin() { tessera_test_symbol_nobody_defines(); }
