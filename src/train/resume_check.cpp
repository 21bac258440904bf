#include "train/resume_check.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "core/check.hpp"
#include "core/json_fields.hpp"
#include "job/parse.hpp"

namespace exatrain {

namespace {
// "loss_scaler": {"format": 2, "scale": number in (0, 2^64], "good_steps": int, "skipped_steps": int,
// "hysteresis_left": int} (train/loss_scaler.hpp's state; LossScaler::restore checks the scale
// against the job's minimum and caps hysteresis_left at the job's hysteresis). Format 1 (before
// hysteresis) has no hysteresis_left: kHysteresisNotSaved.
LossScalerState parse_loss_scaler(const nlohmann::json& j, const std::string& where) {
  const std::string w = where + ": \"loss_scaler\"";
  const int64_t format = json_to_int(json_member(j, "format", w), w + ".format", 0, INT64_MAX);
  EXA_CHECK(format == 1 || format == 2, "{}.format = {}: expected 1 or 2 (the loss scaler states this exatrain reads)",
            w, format);
  const nlohmann::json& scale = json_member(j, "scale", w);
  LossScalerState st;
  EXA_CHECK(scale.is_number() && scale.get<double>() > 0 && scale.get<double>() <= kMaxLossScale,
            "{}.scale = {}: expected a number in (0, 2^64]", w, json_shown(scale));
  st.scale = scale.get<double>();
  st.good_steps = json_to_int(json_member(j, "good_steps", w), w + ".good_steps", 0, checkpoint::kMaxStep);
  st.skipped_steps = json_to_int(json_member(j, "skipped_steps", w), w + ".skipped_steps", 0, checkpoint::kMaxStep);
  st.hysteresis_left = format == 1 ? kHysteresisNotSaved
                                   : json_to_int(json_member(j, "hysteresis_left", w), w + ".hysteresis_left", 0,
                                                 (int64_t(1) << 31) - 1);
  return st;
}
}  // namespace

TrainerExtras parse_trainer_state(const std::string& text, const std::string& where, int64_t* step) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    EXA_FAIL("{}: not valid JSON ({})", where, e.what());
  }
  *step = json_to_int(json_member(state, "step", where), where + ": \"step\"", 0, checkpoint::kMaxStep);
  const nlohmann::json& cursor = json_member(state, "data_cursor", where);
  EXA_CHECK(cursor.is_object(), "{}: \"data_cursor\" = {}: expected a JSON object", where, json_shown(cursor));
  TrainerExtras extras;
  extras.data_cursor_json = cursor.dump();
  if (state.contains("tokenizer_type"))
    extras.tokenizer_type = json_to_string(state["tokenizer_type"], where + ": \"tokenizer_type\"");
  EXA_CHECK(extras.tokenizer_type.empty() || extras.tokenizer_type == "byte" ||
                extras.tokenizer_type == "sentencepiece-bpe",
            "{}: \"tokenizer_type\" = {}: expected \"byte\" or \"sentencepiece-bpe\"", where,
            json_shown(nlohmann::json(extras.tokenizer_type)));
  if (state.contains("loss_scaler")) extras.loss_scaler = parse_loss_scaler(state["loss_scaler"], where);
  return extras;
}

void check_and_restore_cursor(const std::string& where, int64_t step, int64_t manifest_step,
                              const std::string& optimizer_step, const std::string& cursor_json, const Job& job,
                              data::TokenLoader& loader, int64_t skipped_steps) {
  EXA_CHECK(step >= 0 && step <= job.train.steps,
            "checkpoint {}: trainer_state.json step = {}, beyond {}: [train] steps = {} (expected a checkpoint of "
            "step <= {}; to train further, raise steps)", where, step, job_origin(job, {"train.steps"}),
            job.train.steps, job.train.steps);
  EXA_CHECK(manifest_step == step, "checkpoint {}: trainer_state.json says step {} but manifest.json says step {}",
            where, step, manifest_step);
  EXA_CHECK(optimizer_step.empty() || optimizer_step == std::to_string(step),
            "checkpoint {}: optimizer.safetensors records step \"{}\" but trainer_state.json says step {}", where,
            optimizer_step, step);
  loader.restore_cursor(cursor_json);
  const data::DataCursor c = loader.cursor();
  // An epoch begins only at the start of a step, so a run of `step` steps has begun at most `step`
  // epochs after the first, and at step 0 it has read nothing. fp16's skipped steps read their
  // batches too (train/loss_scaler.hpp): `skipped_steps` more.
  const int64_t read = step + skipped_steps;
  EXA_CHECK(c.epoch <= uint64_t(read) && (read > 0 || c.position == 0),
            "checkpoint {}: the data cursor (epoch {}, position {}) does not fit step {}{}: expected at most {} "
            "epoch(s) and, at step 0, position 0", where, c.epoch, c.position, step,
            skipped_steps ? fmt::format(" and {} skipped step(s)", skipped_steps) : "", read);
}

void restore_trainer_state(const std::string& dir, int64_t step, const TrainerExtras& saved, const Job& job,
                           data::TokenLoader& loader) {
  const checkpoint::CheckpointReader reader(dir, checkpoint::Verify::sizes);
  std::string optimizer_step;
  if (reader.has("optimizer.safetensors")) {
    const auto opt = reader.safetensors("optimizer.safetensors");
    if (auto it = opt->metadata().find("step"); it != opt->metadata().end()) optimizer_step = it->second;
  }
  check_and_restore_cursor(dir, step, reader.step(), optimizer_step, saved.data_cursor_json, job, loader,
                           saved.loss_scaler ? saved.loss_scaler->skipped_steps : 0);
}

}  // namespace exatrain
