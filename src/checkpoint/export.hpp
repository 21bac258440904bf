// `exatrain export CKPT --format safetensors|hf --dtype fp32|bf16 --out DIR`: consolidated
// weights for other tools.
//   safetensors: DIR/model.safetensors with our parameter names and global shapes (every
//                tensor-parallel / pipeline shard assembled), plus DIR/job.toml.
//   hf:          a Hugging Face model directory: config.json + model.safetensors with the
//                tensor names and layouts of transformers' GPT2LMHeadModel (learned positions,
//                layernorm, gelu, heads == kv_heads) or LlamaForCausalLM (rope, rmsnorm,
//                swiglu), plus tokenizer.model when the run used SentencePiece.
#pragma once
#include <string>

namespace exatrain::checkpoint {

struct ExportOptions {
  std::string format = "safetensors";  // safetensors | hf
  std::string dtype = "fp32";          // fp32 | bf16
  std::string out_dir;
  bool allow_nonfinite = false;        // NaN/Inf weights: a loud warning instead of an error
};

// Returns a one-line description of what was written.
std::string export_checkpoint(const std::string& checkpoint_dir, const ExportOptions& options);

}  // namespace exatrain::checkpoint
