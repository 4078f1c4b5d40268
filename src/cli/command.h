// Subcommand registry: each src/cli/<name>.cpp registers itself with SPARKSERVE_COMMAND, so adding a
// subcommand never touches main.cpp. The cli sources are compiled straight into the executable
// (not a static library), so the registrars' static initialisers are always linked in.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace sparkserve::cli {

// Adds a subcommand to `root`; the subcommand's callback runs it and sets `exit_code`.
using RegisterFn = void (*)(CLI::App& root, int& exit_code);

std::vector<RegisterFn>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(RegisterFn fn) { command_registry().push_back(fn); }
};

}  // namespace sparkserve::cli

#define SPARKSERVE_COMMAND(fn) \
  static ::sparkserve::cli::CommandRegistrar SS_CLI_CONCAT(ss_registrar_, __LINE__)(fn)
#define SS_CLI_CONCAT_INNER(a, b) a##b
#define SS_CLI_CONCAT(a, b) SS_CLI_CONCAT_INNER(a, b)
