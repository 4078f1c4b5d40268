// `sparkserve version`: prints the version.
#include <cstdio>

#include "cli/command.h"
#include "cli/version.h"

namespace {
void register_version(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("version", "Print the sparkserve version");
  cmd->callback([&exit_code] {
    std::printf("%s\n", sparkserve::cli::version_line().c_str());
    exit_code = 0;
  });
}
SPARKSERVE_COMMAND(register_version);
}  // namespace
