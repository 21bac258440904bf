// exatrain: the command-line entry point. Parses the subcommand and hands over; every error
// surfaces as one clear message (file, key, value, what was expected) and a non-zero exit.
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "core/check.hpp"
#include "train/every_rank.hpp"

int main(int argc, char** argv) {
  CLI::App app{"exatrain: plan, predict and train large models on supercomputers"};
  app.require_subcommand(1);
  exatrain::cli::add_version_command(app);
  exatrain::cli::add_check_command(app);
  exatrain::cli::add_report_command(app);
  exatrain::cli::add_train_command(app);
  exatrain::cli::add_sample_command(app);
  exatrain::cli::add_export_command(app);
  exatrain::cli::add_data_command(app);
  exatrain::cli::add_checkpoint_command(app);
  exatrain::cli::add_validate_command(app);
  exatrain::cli::add_predict_command(app);
  exatrain::cli::add_plan_command(app);
  exatrain::cli::add_pipeline_command(app);
  exatrain::cli::add_sweep_command(app);
  exatrain::cli::add_profile_command(app);
  exatrain::cli::add_calibrate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const exatrain::Error& e) {
    // A multi-rank job prints an error every rank hit once, and names the rank of any other.
    const std::string line = exatrain::error_line(e);
    if (!line.empty()) fmt::print(stderr, "{}\n", line);
    std::fflush(stderr);
    exatrain::leave_together(e);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "exatrain: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
