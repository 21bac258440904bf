// Each subcommand lives in its own file in src/cli/ and registers itself on the app here.
// A command parses arguments only, then makes one call into a room (plan/, train/, data/, ...).
//
// Owns (room cli/): the subcommands' arguments and output, job_plan.hpp (a job's [parallel] as the
// planner's Plan for predict and check). May use: every room (core/, job/, catalog/, plan/,
// backend/, model/, optim/, parallel/, data/, checkpoint/, report/, profile/, train/).
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
void add_profile_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
}  // namespace exatrain::cli
