#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

#include "compiler/passes/passes.h"
#include "core/fail.h"

namespace tessera::compiler {
namespace {

std::mutex g_mu;
std::set<std::string>& disabled() {
  static std::set<std::string>* s = [] {
    auto* r = new std::set<std::string>();
    if (const char* env = std::getenv("TESSERA_DISABLE_PASSES")) {
      std::string list = env;
      std::stringstream ss(list);
      std::string name;
      while (std::getline(ss, name, ',')) {
        if (name == "all") r->insert(pass_names().begin(), pass_names().end());
        else if (!name.empty()) r->insert(name);  // unknown names are reported at first use
      }
    }
    return r;
  }();
  return *s;
}

void check_names(const std::set<std::string>& s) {
  for (auto& n : s) {
    bool known = false;
    for (auto& p : pass_names()) known |= p == n;
    if (!known) {
      std::string all;
      for (auto& p : pass_names()) all += (all.empty() ? "" : ", ") + p;
      fail("compile", "unknown pass '" + n + "' in the disabled list; passes are: " + all + " (or all)");
    }
  }
}

}  // namespace

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"simplify", "cse", "dce", "fuse", "schedule", "epilogue", "merge", "memplan"};
  return names;
}

bool pass_enabled(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  static bool checked = (check_names(disabled()), true);
  (void)checked;
  return !disabled().count(name);
}

void set_disabled_passes(const std::string& list) {
  std::set<std::string> s;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ','))
    if (name == "all") s.insert(pass_names().begin(), pass_names().end());
    else if (!name.empty()) s.insert(name);
  check_names(s);
  std::lock_guard<std::mutex> lock(g_mu);
  disabled() = s;
}

std::string disabled_passes_key() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::string k;
  for (auto& n : disabled()) k += n + ",";
  return k;
}

}  // namespace tessera::compiler
