// sparkserve: one binary, many subcommands (see src/cli/*.cpp).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "cli/version.h"

namespace sparkserve::cli {
std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> registry;
  return registry;
}
}  // namespace sparkserve::cli

int main(int argc, char** argv) {
  CLI::App app{"sparkserve: serves Qwen3.5 hybrid models over an OpenAI-compatible API"};
  app.require_subcommand(1);
  app.set_version_flag("--version", sparkserve::cli::version_line());
  int exit_code = 0;
  for (auto fn : sparkserve::cli::command_registry()) fn(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
