// Shared by the distributed-trainer tests: a tiny GPT, a synthetic token source that splits the
// data over dp ranks exactly like data::TokenLoader, a job per parallel configuration, and the
// single-rank reference run every configuration is compared with.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "job/job.hpp"
#include "model/gpt.hpp"
#include "data/token_source.hpp"
#include "parallel/runtime.hpp"
#include "train/trainer.hpp"

namespace dist_test {

// MPI_Init_thread (FUNNELED, checked) and one OpenMP thread per rank; returns {world, rank}.
struct World {
  int size = 0, rank = 0;
};
World start_mpi(int& argc, char**& argv);

// The backend the test runs on: `--backend NAME` on the command line ("cpu" when absent; the
// equivalence suite also runs on "cpu-guarded"), one thread.
std::unique_ptr<exatrain::Backend> test_backend(int argc, char** argv);

// Sequence w of the synthetic corpus: token i = hash(w, i) % vocab. Each next_batch takes the next
// B * dp_size sequences and this rank reads [dp_rank * B, (dp_rank + 1) * B) of them, as the loader.
class SyntheticSource final : public exatrain::TokenSource {
 public:
  SyntheticSource(int64_t vocab, int64_t dp_rank, int64_t dp_size)
      : vocab_(vocab), dp_rank_(dp_rank), dp_size_(dp_size) {}
  void next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) override;
  uint64_t position() const override { return pos_; }
  void seek(uint64_t p) override { pos_ = p; }

 private:
  int64_t vocab_, dp_rank_, dp_size_;
  uint64_t pos_ = 0;  // sequences consumed by all replicas together
};

struct Config {
  int dp = 1, tp = 1, pp = 1, vp = 1, zero = 0;
  bool sp = false;
  exatrain::Recompute recompute = exatrain::Recompute::none;
  exatrain::Schedule schedule = exatrain::Schedule::one_f_one_b;
  int64_t micro_batch = 1, micro_batches = 4;  // per pipeline per step
  bool llama = false;  // swiglu + rmsnorm + rope + untied head (else GPT-2 style, tied)
  bool untied = false; // GPT-2 style with a separate lm_head
  bool nobias = false; // [model] bias = false: no linear-layer biases (Llama's own setting)
  std::vector<int64_t> layers_per_stage;  // empty: balanced
  std::string name() const;
};

exatrain::ModelSpec tiny_model(bool llama);
exatrain::Job job_for(const Config& c, int steps);

// One distributed run of a job on MPI_COMM_WORLD: the runtime (watchdog after 60 s), a synthetic
// source reading this rank's dp replica, and the trainer with the job's options; `tweak` adjusts
// the options (bucket size, NaN injection) before the trainer is built. Members go in reverse.
struct DistRun {
  exatrain::Job job;
  std::unique_ptr<exatrain::parallel::ParallelRuntime> rt;
  std::unique_ptr<SyntheticSource> src;
  std::unique_ptr<exatrain::Trainer> trainer;
};
DistRun make_run(exatrain::Backend& backend, const exatrain::Job& job,
                 const std::function<void(exatrain::TrainerOptions&)>& tweak = {});

// `job` run for `steps` steps on every rank, with a checkpoint saved into `dir` before step
// `save_at` (0-based; the data cursor in its extras): every step's loss and the checkpoint's
// directory (the same on every rank). For the resume tests of the optimizers.
struct SavedRun {
  DistRun run;
  std::vector<double> losses;
  std::string checkpoint;
};
SavedRun run_saving_at(exatrain::Backend& backend, const exatrain::Job& job, int steps, int save_at,
                       const std::string& dir);
// A run of `job` resumed from `checkpoint` (weights, optimizer state, data cursor), not stepped.
DistRun resumed_run(exatrain::Backend& backend, const exatrain::Job& job, const std::string& checkpoint);

// Validation batch i of the synthetic corpus (sequences 1e9 + i*B ..., disjoint from training).
void val_batch(int64_t vocab, int64_t i, int64_t B, int64_t T, int32_t* inputs, int32_t* targets);
constexpr int64_t kValBatches = 3;

struct Reference {
  std::vector<double> losses;
  double val_loss = 0;  // after the last step, kValBatches batches of micro_batch
  exatrain::ParamLayout layout;
  std::vector<float> params;
};
// The options of `job`'s model and batch on one rank (every degree 1, ZeRO 0).
exatrain::TrainerOptions single_rank_options(const exatrain::Job& job);

// The Trainer on the same job on one rank (a local runtime): global_batch / micro_batch
// micro-batches per step. inject_nan_at_step / skip: as TrainerOptions (skipped steps record a NaN
// loss). backend: the kind to run it on (make_backend).
Reference run_single_rank(const exatrain::Job& job, int64_t inject_nan_at_step = -1, bool skip = false,
                          const std::string& backend = "cpu");

// NaN-safe comparisons. std::max(worst, NaN) keeps `worst` and `NaN > x` is false, so a run whose
// losses or weights are NaN would pass a tolerance; these turn anything not finite into +inf
// (which also survives MPI_MAX, whose treatment of NaN is unspecified).
// |a - b| / |b| (|a - b| when b == 0); +inf when a or b is not finite.
double rel_diff(double a, double b);
// max(worst, x); +inf when either is NaN.
double worst_of(double worst, double x);

// The worst rel_diff of a[i] against b[i], the maximum over every rank (each rank has every loss).
double worst_over_ranks(const std::vector<double>& a, const std::vector<double>& b);
// Prints "OK   line" or "FAIL line" on rank 0; returns the failure count (0 or 1).
int report(bool ok, const std::string& line, int rank);

// A fresh directory /tmp/exatrain-<name>-XXXXXX made by rank 0, its path on every rank (every rank
// writes its slices of a checkpoint there, and reads them). The caller removes it on rank 0.
std::string shared_temp_dir(const std::string& name);

// The message of the error that building `job`'s run threw; "" when it was not refused.
std::string refusal(exatrain::Backend& backend, const exatrain::Job& job);

// The parameters of a model shard, downloaded (the arena is device memory).
std::vector<float> host_params(const exatrain::Gpt& model);

// Bytes of [p, p + bytes) resident in memory (mincore over the pages it touches).
int64_t resident_bytes(const void* p, int64_t bytes);

// True when `ok` on every rank of MPI_COMM_WORLD.
bool all_ok(bool ok);

// The step's data-parallel gradient bytes from a ledger's per-kind counts: every dp kind but
// ZeRO's weight all-gather and K-FAC's own exchanges (dp_kfac_factors, _eigen, _grad: the
// optimizer's, the same with or without [comm]).
int64_t dp_gradient_bytes(const std::map<std::string, int64_t>& bytes);

// Largest |local - reference slice| / (1 + |reference|) over every element of a model shard.
double max_weight_diff(const exatrain::Gpt& model, const Reference& ref);

// The final-weights criterion, per tensor (this rank's slice of it against the same slice of the
// single-rank model): norm_rel = ||w - w_ref|| / ||w_ref|| and max_rel = max |w - w_ref| / max
// |w_ref| (the absolute difference when w_ref is all zero); the worst of each over the tensors.
// Tensors whose exact gradient is 0 (the attention key bias without RoPE) hold only AdamW's
// normalisation of rounding noise: zero_grad_rel = max |w - w_ref| / max |w_ref| over the model.
struct WeightErrors {
  double norm_rel = 0, max_rel = 0, zero_grad_rel = 0;
  std::string norm_tensor, max_tensor;  // where the worst was
};
WeightErrors weight_errors(const exatrain::Gpt& model, const Reference& ref);

// The proof that the comparisons above are NaN-safe: on a copy of `model`'s trained state with one
// NaN weight, and for a NaN loss, every criterion must fail. Restores the weight. Returns "" when
// they all fail as they must, else which one passed wrongly.
std::string nan_comparison_problems(exatrain::Gpt& model, const Reference& ref);

}  // namespace dist_test
