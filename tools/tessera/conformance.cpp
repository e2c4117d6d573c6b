// `tessera conformance [--backend B] [--op NAME] [--passes-on-only]`: runs the conformance suite
// (every primitive and composite op, forward and gradient, against the float64 reference, passes
// off and on) and prints the op x backend support matrix. Exit status 1 when a case fails.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "conformance/conformance.h"
#include <tessera/error.h>

#include "commands.h"

namespace tessera::cli {

namespace {

struct ConformanceArgs {
  std::vector<std::string> backends, ops;
  bool list = false, passes_on_only = false;
};

void run_conformance(const ConformanceArgs& a) {
  if (a.list) {
    for (const std::string& r : conformance::rows())
      std::printf("%s%s\n", r.c_str(), conformance::is_primitive(r) ? " (primitive)" : "");
    return;
  }
  conformance::Options o;
  o.backends = a.backends;
  o.ops = a.ops;
  o.passes_off = !a.passes_on_only;
  // Progress on stderr, one line per finished cell, so a long run shows where it is.
  o.on_cell = [](const conformance::Cell& c) {
    std::fprintf(stderr, "%-22s %-8s %-16s %6.2f s\n", c.op.c_str(), c.backend.c_str(), c.text().c_str(), c.seconds);
  };
  conformance::Report r = conformance::run(o);
  std::fputs(r.matrix().c_str(), stdout);
  std::fflush(stdout);
  if (!r.ok()) throw Error("[conformance] some cases failed (listed above)");
}

}  // namespace

void add_conformance(CLI::App& app) {
  auto a = std::make_shared<ConformanceArgs>();
  CLI::App* sub = app.add_subcommand(
      "conformance", "Run every op on every backend against the float64 reference and print the support matrix");
  sub->add_option("--backend", a->backends, "device kind to test (repeat or comma-separate; default: every registered one)")
      ->delimiter(',');
  sub->add_option("--op", a->ops, "op (row) to test (repeat or comma-separate; default: all; --list shows them)")
      ->delimiter(',');
  sub->add_flag("--list", a->list, "list the ops (rows) and exit");
  sub->add_flag("--passes-on-only", a->passes_on_only, "run each case with the compiler's passes on only (pjrt: each is an XLA compile)");
  sub->callback([a] { run_conformance(*a); });
}

}  // namespace tessera::cli
