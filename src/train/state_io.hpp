// A training checkpoint directory's files:
//   model.safetensors      every parameter under its layout name, float32, its global shape
//   optimizer.safetensors  the optimizer's state by name, "<state>.<parameter>"
//                          (the tensors of both: train/checkpoint_io.hpp, the one writer/reader)
//   trainer_state.json     optimizer step, data cursor, seed (the RNG state: training draws no
//                          random numbers after the seeded initialisation, so the seed is all),
//                          fp16 runs: the loss scaler's state ("loss_scaler", format 1)
//   job.toml               the resolved job (job_to_toml)
//   tokenizer.model        the dataset's tokenizer (so `sample` needs only the checkpoint)
// Here: the small files, the model check of a resume, and the weights alone for `sample`.
#pragma once
#include <optional>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "job/job.hpp"
#include "job/parse.hpp"
#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "train/loss_scaler.hpp"

namespace exatrain {

// Limits on the small files of a checkpoint (each is refused unread above its limit).
inline constexpr uint64_t kMaxTrainerStateBytes = uint64_t(1) << 20;
inline constexpr uint64_t kMaxTokenizerModelBytes = uint64_t(256) << 20;

struct TrainerExtras {
  std::string data_cursor_json;  // the loader's cursor (TokenLoader::cursor_json)
  std::string job_toml;
  std::string tokenizer_type;    // "sentencepiece-bpe" | "byte"
  std::string tokenizer_model;   // bytes of tokenizer.model ("" for byte)
  // fp16 runs: the loss scaler (scale, good-step counter, skipped steps); absent in fp32/bf16
  // checkpoints (an fp16 run resuming one starts the scaler afresh).
  std::optional<LossScalerState> loss_scaler;
};

// The small files of a checkpoint: trainer_state.json (step, seed, data cursor, tokenizer type),
// job.toml and tokenizer.model.
void add_trainer_blobs(checkpoint::CheckpointWriter& w, int64_t step, uint64_t seed, const TrainerExtras& extras);

// The small files back: the extras, and the optimizer step in *step.
TrainerExtras read_trainer_blobs(const checkpoint::CheckpointReader& r, int64_t* step);

// The checkpoint's job.toml must describe the same [model] as `model` (vocab included): a
// checkpoint of another model is an error listing every key that differs.
void check_same_model(const checkpoint::CheckpointReader& r, const ModelSpec& model);

// Parameters alone (for `sample`): the model must have the checkpoint's shapes.
void load_model_params(const checkpoint::CheckpointReader& r, Backend& be, Gpt& model);

}  // namespace exatrain
