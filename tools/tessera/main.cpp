// The `tessera` command-line tool. Errors are one line on stderr and a non-zero exit status.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>
#include <tessera/tessera.h>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Tessera: a portable deep-learning runtime", "tessera"};
  app.set_version_flag("--version", std::string("tessera ") + tessera::version());
  app.require_subcommand(1);
  tessera::cli::add_devices(app);
  tessera::cli::add_train(app);
  tessera::cli::add_sample(app);
  tessera::cli::add_demo(app);
  tessera::cli::add_profile(app);
  tessera::cli::add_advise(app);
  tessera::cli::add_conformance(app);
  tessera::cli::add_export(app);
#ifdef TESSERA_HAVE_ONNX
  tessera::cli::add_run(app);
#endif
  tessera::cli::check_every_value(app);
  try {
    // Without TESSERA_MEMORY_LIMIT, the machine's memory is the limit: a run too large for it is a
    // [memory] error before it starts, not the kernel's out-of-memory kill halfway.
    const char* limit = std::getenv("TESSERA_MEMORY_LIMIT");
    if (!limit || !*limit) tessera::set_memory_limit(size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE)));
    // An unknown word where a subcommand belongs gets a direct message (CLI11 would only say
    // that a subcommand is required).
    if (argc > 1 && argv[1][0] != '-') {
      bool known = false;
      for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(argv[1]);
      if (!known) {
        std::string names;
        for (const CLI::App* sub : app.get_subcommands({}))
          names += (names.empty() ? "" : ", ") + sub->get_name();
        std::fprintf(stderr, "tessera: error: unknown command '%s' (commands: %s)\n", argv[1],
                     names.c_str());
        return 2;
      }
    }
    app.parse(argc, argv);  // runs the selected subcommand's callback
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    if (argc == 1) {  // no subcommand at all: show what exists
      std::fputs(app.help().c_str(), stderr);
      return e.get_exit_code();
    }
    std::fprintf(stderr, "tessera: error: %s (see tessera --help)\n", e.what());
    return e.get_exit_code();
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "tessera: internal error: unknown exception\n");
  }
  return 1;
}
