// The library's version.
#pragma once

#pragma GCC visibility push(default)  // the public API: exported (cmake/libtessera.map)
namespace tessera {

// "0.1.0": the version libtessera was built as (CMake's project version).
const char* version();

}  // namespace tessera
#pragma GCC visibility pop
