#include "core/fail.h"

#include "tessera/scope.h"

namespace tessera {

void fail(const std::string& op, const std::string& detail, const std::string& scope) {
  std::string msg = "[" + op + "] " + detail;
  if (!scope.empty()) msg += " (in scope '" + scope + "')";
  throw Error(msg);
}

void fail(const std::string& op, const std::string& detail) { fail(op, detail, current_scope()); }

}  // namespace tessera
