#include <fmt/format.h>

#include "cli/commands.hpp"

namespace exatrain::cli {
void add_version_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "print the exatrain version");
  cmd->callback([] { fmt::print("exatrain 0.1.0\n"); });
}
}  // namespace exatrain::cli
