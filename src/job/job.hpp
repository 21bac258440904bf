// The job file as typed C++ values: everything downstream receives a validated Job, never TOML.
// Keys and meanings follow ../shared/contracts/job-file.md exactly (they may be extended, never
// renamed). Fields of [parallel] that may be "auto" or omitted are std::optional: `plan` fills
// them; `predict` and `train` require them resolved.
//
// Owns (room job/): the typed Job, its parsing with presets, --set and origins (parse.hpp),
// job_to_toml, the shape arithmetic model, planner and runtime share (model_shapes.hpp).
// May use: core/.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace exatrain {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope };
enum class Recompute { none, selective, full };
enum class Schedule { gpipe, one_f_one_b };  // 1f1b is interleaved when vp > 1
enum class Precision { fp32, fp16, bf16, fp8 };

// [model]
struct ModelSpec {
  std::string preset;            // "" when none
  std::string preset_file;       // a TOML file of the user's own, by path ("" when none)
  int64_t layers = 12;
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t kv_heads = 12;         // default: heads; fewer = grouped-query attention
  int64_t ffn_hidden = 3072;     // default: 4 * hidden
  int64_t seq_len = 1024;
  int64_t vocab = 50257;         // for `train`, default: the dataset tokenizer's vocabulary
  bool vocab_from_data = false;  // true when [model] did not set vocab (train takes the data's)
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  Position position = Position::learned;
  bool tie_embeddings = true;
  // Linear layers carry biases (QKV, out-projection, MLP), as GPT-2; false = none (Llama, MPT).
  bool bias = true;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden / heads; }
  bool operator==(const ModelSpec&) const = default;
};

// [machine]
struct MachineSpec {
  std::string preset;                 // named cluster, "" when none
  std::string preset_file;            // a TOML file of the user's own, by path ("" when none)
  std::string device = "cpu-local";   // catalog device name
  int64_t gpus_per_node = 1;
  double intra_node_bw_gbs = 0;       // GB/s per device, one direction, inside a node
  double inter_node_bw_gbs = 0;       // GB/s per NODE, one direction, all NICs together
  double intra_node_latency_us = 0;
  double inter_node_latency_us = 0;
  double storage_bw_gbs = 0;          // aggregate file-system bandwidth
  std::optional<double> node_mtbf_hours;
  bool operator==(const MachineSpec&) const = default;
};

// [parallel]: std::nullopt = omitted or "auto".
struct ParallelSpec {
  int64_t gpus = 1;
  std::optional<int64_t> tp, pp, dp, cp, vp, zero, micro_batch;
  int64_t global_batch = 1;
  std::optional<Recompute> recompute;
  std::optional<bool> seq_parallel;
  std::optional<Schedule> schedule;
  std::vector<int64_t> layers_per_stage;  // optional explicit pipeline balance (extension)
  // `train` on several ranks: a rank inside one collective for longer than this reports
  // "rank r waits in op k of group g" and aborts the job (parallel/watchdog.hpp); 0 = off.
  double watchdog_timeout_s = 300;
  bool operator==(const ParallelSpec&) const = default;
};

// [train]
// [optimizer] keys of train.optimizer = "muon" (docs/job-file.md and docs/optimizers.md give each
// default's source). The entries Muon does not take use AdamW with [train]'s beta1, beta2, eps and
// weight_decay.
struct MuonSpec {
  double momentum = 0.95;       // Keller Jordan's Muon and Moonlight both use 0.95
  bool nesterov = true;         // likewise
  int64_t ns_steps = 5;         // quintic Newton-Schulz iterations
  std::string scale = "rms_match";  // "rms_match": 0.2 sqrt(max(m, n)) (Moonlight); "shape": sqrt(max(1, m/n))
  bool operator==(const MuonSpec&) const = default;
};

struct TrainSpec {
  Precision precision = Precision::fp32;
  std::string optimizer = "adamw";
  int64_t steps = 100;
  uint64_t seed = 1234;
  double lr = 6e-4;
  double min_lr = 0.0;          // cosine decays to this
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;       // global-norm clip; 0 = off
  std::string data;             // "" = bundled corpus
  std::string run_dir = "runs/default";
  int64_t checkpoint_every = 0; // 0 = only at the end
  int64_t keep_checkpoints = 3;  // 0 = keep all
  int64_t eval_every = 0;
  int64_t eval_batches = 4;
  int64_t log_every = 1;
  int64_t threads = 0;          // 0 = all cores
  std::string nan_policy = "stop";  // stop | skip
  // The compute backend: "cpu" (OpenBLAS + OpenMP) or "cpu-guarded" (the same with device memory
  // the host cannot touch outside an op: the proof of the device boundary, for tests).
  std::string backend = "cpu";
  MuonSpec muon;                // [optimizer] when optimizer = "muon"
  bool operator==(const TrainSpec&) const = default;
};

struct Job {
  std::string source;  // the file it came from, for error messages
  ModelSpec model;
  MachineSpec machine;
  ParallelSpec parallel;
  TrainSpec train;
  // Where each key's value came from ("section.key" -> the job file, a preset file, or
  // "--set section.key=value"; keys at their defaults are absent), so that a check between keys
  // names the --set that broke it (job_origin() in job/parse.hpp).
  std::map<std::string, std::string> origins;
};

// Text names for the enums, as spelt in the job file.
const char* to_string(Activation);
const char* to_string(Norm);
const char* to_string(Position);
const char* to_string(Recompute);
const char* to_string(Schedule);
const char* to_string(Precision);

}  // namespace exatrain
