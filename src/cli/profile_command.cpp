// `exatrain profile [--out FILE] [--quick]`: measures this machine (src/profile/profile.hpp) and
// writes what it measured where the catalog reads it (core/profile_cache.hpp), or to --out. Under
// `mpirun -np N` it also measures the collectives over the N ranks.
#include <mpi.h>

#include <filesystem>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/fileio.hpp"
#include "core/profile_cache.hpp"
#include "profile/profile.hpp"

namespace exatrain::cli {
void add_profile_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("profile", "measure this machine (GEMM, attention, memory, MPI) for the planner's local machine");
  auto out = std::make_shared<std::string>();
  auto quick = std::make_shared<bool>(false);
  auto show = std::make_shared<bool>(false);
  cmd->add_option("--out", *out, "write the profile here instead of the cache the catalog reads ("
                  "$EXATRAIN_PROFILE_DIR, $XDG_CACHE_HOME/exatrain or ~/.cache/exatrain)");
  cmd->add_flag("--quick", *quick, "fewer shapes and repetitions (a few seconds; for tests)");
  cmd->add_flag("--status", *show, "say which profile the planner uses now, and why, without measuring");
  cmd->callback([out, quick, show] {
    if (*show) {
      std::string why;
      const auto active = active_profile(&why);
      fmt::print("{}\n", active ? "the planner's local machine is the profile " + *active
                                : "the planner's local machine is the shipped catalog entry: " + why);
      return;
    }
    int init = 0;
    MPI_Initialized(&init);
    if (!init) MPI_Init(nullptr, nullptr);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const profile::MachineProfile p = profile::profile_machine({.quick = *quick});
    if (rank == 0) {
      const std::string file = out->empty() ? profile_cache_file() : *out;
      const auto dir = std::filesystem::path(file).parent_path();
      if (!dir.empty()) std::filesystem::create_directories(dir);
      write_file_atomic(file, profile::profile_toml(p));
      fmt::print("{}wrote {}\n", profile::profile_summary(p), file);
      if (!out->empty()) fmt::print("(not the cache the catalog reads: {})\n", profile_cache_file());
    }
    MPI_Finalize();
  });
}
}  // namespace exatrain::cli
