// The checks of a checkpoint's trainer state before a run continues from it (docs/security.md:
// a checkpoint may come from someone else). trainer_state.json is parsed with every field of the
// type and range expected (parse_trainer_state); the step, the data cursor and the counters that
// go with them are then checked against the job that resumes and the dataset it reads, in one
// function (check_and_restore_cursor), which the training session's resume reaches on every rank
// through restore_trainer_state; only then is the loader's cursor restored.
#pragma once
#include <cstdint>
#include <string>

#include "data/loader.hpp"
#include "job/job.hpp"
#include "train/state_io.hpp"

namespace exatrain {

// trainer_state.json: {"step": int in [0, 2^40], "seed", "data_cursor": object, "tokenizer_type":
// "byte" | "sentencepiece-bpe", fp16 runs: "loss_scaler": {"format": 2, "scale", "good_steps",
// "skipped_steps", "hysteresis_left"} (format 1, without hysteresis_left, is read too)}. `where` names the file in errors. Fills data_cursor_json and
// tokenizer_type of the result and *step.
TrainerExtras parse_trainer_state(const std::string& text, const std::string& where, int64_t* step);

// The checks, each an error naming the checkpoint (`where`), the value and what was expected:
//   - step <= [train] steps (a step beyond the job would train nothing: 2^62 "resumes" no more);
//   - the steps recorded by the manifest and by optimizer.safetensors ("" when it records none)
//     equal it;
//   - the data cursor (TokenLoader::restore_cursor: same dataset and settings; a position inside
//     the epoch and at a step boundary of this job's global batch);
//   - the cursor agrees with the step: no more epochs than steps (plus the fp16 loss scaler's
//     skipped steps, which read batches too), nothing consumed at step 0.
// Then the cursor is restored into `loader`.
void check_and_restore_cursor(const std::string& where, int64_t step, int64_t manifest_step,
                              const std::string& optimizer_step, const std::string& cursor_json, const Job& job,
                              data::TokenLoader& loader, int64_t skipped_steps = 0);

// The same for a checkpoint directory (the manifest's and optimizer's steps read from it, sizes
// only: the caller has verified its checksums).
void restore_trainer_state(const std::string& checkpoint_dir, int64_t step, const TrainerExtras& saved,
                           const Job& job, data::TokenLoader& loader);

}  // namespace exatrain
