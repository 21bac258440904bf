#include "train/state_io.hpp"

#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "train/resume_check.hpp"

namespace exatrain {
namespace {

// Offset of a shard inside its global tensor, per dimension.
std::vector<int64_t> slice_offset(const ParamInfo& p) {
  std::vector<int64_t> off(p.global_shape.size(), 0);
  if (p.split_dim >= 0) off[size_t(p.split_dim)] = p.shard_start;
  return off;
}

// Reads every parameter's slice (prefix + name) into a host arena, checking shapes.
void read_arena(const checkpoint::SafetensorsReader& r, const ParamLayout& layout, std::vector<float>& host,
                const std::string& prefix) {
  for (const ParamInfo& p : layout.entries()) {
    const std::string name = prefix + p.name;
    EXA_CHECK(r.has(name), "{}: has no tensor \"{}\" (a checkpoint of a different model? this model needs it "
                           "with global shape {})", r.path(), name, checkpoint::shape_string(p.global_shape));
    const checkpoint::TensorInfo& t = r.info(name);
    EXA_CHECK(t.global_shape == p.global_shape && t.shape == p.shard_shape && t.offset == slice_offset(p),
              "{}: tensor \"{}\" has global shape {} (slice {} at {}), but this model needs global shape {} "
              "(slice {} at {}): the checkpoint is of a different model or split",
              r.path(), name, checkpoint::shape_string(t.global_shape), checkpoint::shape_string(t.shape),
              checkpoint::shape_string(t.offset), checkpoint::shape_string(p.global_shape),
              checkpoint::shape_string(p.shard_shape), checkpoint::shape_string(slice_offset(p)));
    r.read_f32(name, host.data() + p.offset, p.numel);
  }
}

}  // namespace

void add_trainer_blobs(checkpoint::CheckpointWriter& w, int64_t step, uint64_t seed, const TrainerExtras& extras) {
  nlohmann::json state = {{"step", step},
                          {"seed", seed},
                          {"data_cursor", nlohmann::json::parse(extras.data_cursor_json)},
                          {"tokenizer_type", extras.tokenizer_type}};
  // fp16's loss scaler, versioned on its own (train/resume_check.cpp reads formats 1 and 2; 2 adds
  // hysteresis_left): the scale written as a JSON number with 17 significant digits, so it reads
  // back exactly.
  if (const auto& ls = extras.loss_scaler)
    state["loss_scaler"] = {{"format", 2}, {"scale", ls->scale}, {"good_steps", ls->good_steps},
                            {"skipped_steps", ls->skipped_steps}, {"hysteresis_left", ls->hysteresis_left}};
  w.add_blob("trainer_state.json", state.dump(2) + "\n");
  w.add_blob("job.toml", extras.job_toml);
  if (!extras.tokenizer_model.empty()) w.add_blob("tokenizer.model", extras.tokenizer_model);
}

TrainerExtras read_trainer_blobs(const checkpoint::CheckpointReader& r, int64_t* step) {
  // Untrusted input (docs/security.md): sizes bounded, every field checked (train/resume_check.hpp).
  TrainerExtras extras = parse_trainer_state(r.blob("trainer_state.json", kMaxTrainerStateBytes),
                                             r.dir() + "/trainer_state.json", step);
  extras.job_toml = r.blob("job.toml", kMaxJobFileBytes);
  if (r.has("tokenizer.model")) extras.tokenizer_model = r.blob("tokenizer.model", kMaxTokenizerModelBytes);
  return extras;
}

namespace {
// The [model] keys that define the weights, as text for comparison and messages.
std::vector<std::pair<std::string, std::string>> model_fields(const ModelSpec& m) {
  return {{"layers", std::to_string(m.layers)},
          {"hidden", std::to_string(m.hidden)},
          {"heads", std::to_string(m.heads)},
          {"kv_heads", std::to_string(m.kv_heads)},
          {"ffn_hidden", std::to_string(m.ffn_hidden)},
          {"seq_len", std::to_string(m.seq_len)},
          {"vocab", std::to_string(m.vocab)},
          {"activation", fmt::format("\"{}\"", to_string(m.activation))},
          {"norm", fmt::format("\"{}\"", to_string(m.norm))},
          {"position", fmt::format("\"{}\"", to_string(m.position))},
          {"tie_embeddings", m.tie_embeddings ? "true" : "false"},
          {"bias", m.bias ? "true" : "false"},
          {"norm_eps", fmt::format("{}", m.norm_eps)},
          {"rope_theta", fmt::format("{}", m.rope_theta)}};
}
}  // namespace

void check_same_model(const checkpoint::CheckpointReader& r, const ModelSpec& model) {
  const Job saved = parse_job(r.blob("job.toml", kMaxJobFileBytes), r.dir() + "/job.toml");
  const auto was = model_fields(saved.model), now = model_fields(model);
  std::string diffs;
  for (size_t i = 0; i < was.size(); ++i)
    if (was[i].second != now[i].second)
      diffs += fmt::format("\n  [model] {}: the checkpoint has {}, this job has {}", was[i].first, was[i].second,
                           now[i].second);
  EXA_CHECK(diffs.empty(), "checkpoint {} is of a different model than this job (expected the same [model]):{}",
            r.dir(), diffs);
}

void load_model_params(const checkpoint::CheckpointReader& r, Backend& be, Gpt& model) {
  std::vector<float> host(static_cast<size_t>(model.num_params()));
  auto weights = r.safetensors("model.safetensors");
  read_arena(*weights, model.layout(), host, "");
  be.upload(model.params(), host.data(), host.size() * sizeof(float));
}

}  // namespace exatrain
