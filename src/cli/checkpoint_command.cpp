// `exatrain checkpoint verify DIR` (checks one checkpoint: marker, manifest, every file's size
// and SHA-256, every safetensors layout) and `exatrain checkpoint list ROOT` (which checkpoints
// `--resume auto` would consider, newest valid one marked).
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint.hpp"
#include "cli/commands.hpp"
#include "core/check.hpp"

namespace exatrain::cli {

void add_checkpoint_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "verify and list checkpoints");
  cmd->require_subcommand(1);

  auto dir = std::make_shared<std::string>();
  CLI::App* v = cmd->add_subcommand("verify", "verify one checkpoint directory");
  v->add_option("DIR", *dir, "a checkpoint directory (RUN_DIR/checkpoints/step_NNNNNNNN)")
      ->required();
  v->callback([dir] {
    checkpoint::CheckpointReader reader(*dir);  // throws with the reason when it fails
    for (const auto& [name, entry] : reader.files()) {
      std::string what;
      if (name.size() > 12 && name.ends_with(".safetensors")) {
        auto st = reader.safetensors(name);  // validates the layout too
        what = fmt::format("{} tensors", st->tensors().size());
      }
      fmt::print("  {:<28} {:>12} bytes  sha256 {}  {}\n", name, entry.bytes, entry.sha256, what);
    }
    fmt::print("{}: OK (step {}, {} files verified)\n", *dir, reader.step(),
               reader.files().size());
  });

  auto root = std::make_shared<std::string>();
  CLI::App* l = cmd->add_subcommand("list", "list the checkpoints under a directory");
  l->add_option("ROOT", *root, "the checkpoints directory (RUN_DIR/checkpoints)")->required();
  l->callback([root] {
    EXA_CHECK(std::filesystem::is_directory(*root), "checkpoint list: {} does not exist or is not a directory "
              "(expected RUN_DIR/checkpoints)", *root);
    auto all = checkpoint::list_checkpoints(*root);
    auto latest = checkpoint::find_latest_valid(*root, stderr);
    for (const auto& c : all) {
      bool chosen = latest && latest->dir == c.dir;
      fmt::print("{} step {:>10}  {}\n", chosen ? "*" : " ", c.step, c.dir);
    }
    if (latest) {
      fmt::print("--resume auto would take step {} ({})\n", latest->step, latest->dir);
    } else {
      fmt::print("no complete checkpoint in {}: --resume auto would start from step 0\n", *root);
    }
  });
}

}  // namespace exatrain::cli
