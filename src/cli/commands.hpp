// Each subcommand lives in its own file in src/cli/ and registers itself on the app here.
// A command parses arguments only, then makes one call into a room (plan/, train/, data/, ...).
#pragma once
#include <CLI/CLI.hpp>

namespace exatrain::cli {
// Each add_* registers one subcommand; the callback runs it. Declare new ones here.
void add_version_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_checkpoint_command(CLI::App& app);
void add_validate_command(CLI::App& app);
void add_predict_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_pipeline_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
}  // namespace exatrain::cli
