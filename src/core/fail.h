// Internal: throws tessera::Error with the message laid out as documented in tessera/error.h
// ("[op] detail (in scope 'a.b')"). Not part of the installed API.
#pragma once
#include <string>

#include "tessera/error.h"

#pragma GCC visibility push(default)  // the backend SDK: exported for plugins
namespace tessera {

// `scope` may be empty; the two-argument form uses the calling thread's current scope.
[[noreturn]] void fail(const std::string& op, const std::string& detail, const std::string& scope);
[[noreturn]] void fail(const std::string& op, const std::string& detail);

}  // namespace tessera
#pragma GCC visibility pop
