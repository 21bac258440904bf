// `exatrain export CKPT --format safetensors|hf [--dtype fp32|bf16] --out DIR`.
#include <fmt/format.h>

#include "checkpoint/export.hpp"
#include "cli/commands.hpp"

namespace exatrain::cli {
void add_export_command(CLI::App& app) {
  auto o = std::make_shared<checkpoint::ExportOptions>();
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("export", "write a checkpoint's consolidated weights (safetensors or Hugging Face)");
  cmd->add_option("checkpoint", *dir, "a checkpoint directory")->required();
  cmd->add_option("--format", o->format, "safetensors | hf")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "fp32 | bf16")->capture_default_str();
  cmd->add_option("--out", o->out_dir, "output directory")->required();
  cmd->add_flag("--allow-nonfinite", o->allow_nonfinite,
                "export even when the weights hold NaN or Inf (a loud warning instead of an error)");
  cmd->callback([o, dir] { fmt::print("{}\n", checkpoint::export_checkpoint(*dir, *o)); });
}
}  // namespace exatrain::cli
