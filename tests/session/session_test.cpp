// `exatrain train` end to end on a tiny model and dataset: exact resume, the NaN policy,
// checkpoints of another model, a full disk during a save, corrupted checkpoints, bad jobs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>

#include "checkpoint/checkpoint.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "data/prepare.hpp"
#include "job/parse.hpp"
#include "report/metrics.hpp"
#include "report/report.hpp"
#include "train/sample.hpp"
#include "train/session.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
namespace fs = std::filesystem;

namespace {

// A byte-tokenised dataset from a deterministic text, made once for all tests.
const std::string& dataset() {
  static std::string dir = [] {
    // Per process: ctest runs each test in its own process, possibly several at once.
    std::string root = testing::TempDir() + "/session_data_" + std::to_string(getpid());
    fs::remove_all(root);
    fs::create_directories(root);
    std::ofstream text(root + "/text.txt");
    for (int i = 0; i < 400; ++i) text << "line " << i << ": the quick brown fox jumps over the lazy dog " << i * 7 % 13 << "\n";
    text.close();
    data::PrepareOptions po;
    po.inputs = {root + "/text.txt"};
    po.out_dir = root + "/bytes";
    po.tokenizer = "byte";
    po.progress = false;
    data::prepare_dataset(po);
    return po.out_dir;
  }();
  return dir;
}

Job tiny_job(const std::string& run_dir, std::vector<std::string> sets = {}) {
  std::string text = fmt::format(R"([model]
layers = 2
hidden = 32
heads = 4
seq_len = 16
[parallel]
gpus = 1
global_batch = 4
micro_batch = 2
[train]
steps = 6
seed = 7
lr = 3e-3
warmup_steps = 2
threads = 1
eval_every = 3
eval_batches = 2
checkpoint_every = 3
keep_checkpoints = 5
data = "{}"
run_dir = "{}"
)", dataset(), run_dir);
  return parse_job(text, "tiny.toml", sets);
}

std::string fresh(const std::string& name) {
  std::string d = testing::TempDir() + "/session_" + name;
  fs::remove_all(d);
  return d;
}

TrainRunOptions quiet() {
  TrainRunOptions o;
  o.interactive = 0;
  o.out = std::fopen("/dev/null", "w");
  return o;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& r : report::read_metrics(run_dir + "/metrics.jsonl"))
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Session, TrainsAndLowersTheLoss) {
  std::string run = fresh("basic");
  TrainRunResult r = run_training(tiny_job(run, {"train.steps=60", "train.checkpoint_every=0"}), quiet());
  EXPECT_EQ(r.final_step, 60);
  auto l = losses(run);
  ASSERT_EQ(l.size(), 60u);
  EXPECT_NEAR(l.front(), std::log(256.0), 0.3);  // uniform over the byte vocabulary at the start
  EXPECT_LT(l.back(), 3.2);                       // this text is very repetitive
  EXPECT_TRUE(fs::exists(r.last_checkpoint + "/COMPLETE"));
}

// Every step record counts the preconditioners that fell back (optim/: Shampoo's and SOAP's
// failed eigendecompositions, summed over the ranks); none on a healthy SOAP run.
TEST(Session, StepRecordsCountOptimizerFallbacks) {
  std::string run = fresh("fallbacks");
  run_training(tiny_job(run, {"train.steps=3", "train.checkpoint_every=0", "train.optimizer=soap",
                              "optimizer.precondition_frequency=1"}), quiet());
  int records = 0;
  for (const auto& r : report::read_metrics(run + "/metrics.jsonl"))
    if (r.contains("loss")) {
      records++;
      ASSERT_TRUE(r.contains("optimizer_fallbacks")) << r.dump();
      EXPECT_EQ(r["optimizer_fallbacks"].get<int64_t>(), 0) << r.dump();
    }
  EXPECT_EQ(records, 3);
}

TEST(Session, ExactResumeIsBitForBit) {
  // N+M steps straight through ...
  std::string a = fresh("straight");
  TrainRunResult ra = run_training(tiny_job(a), quiet());
  // ... equals N steps, stop, resume, M steps.
  std::string b = fresh("resumed");
  TrainRunOptions stop = quiet();
  stop.stop_after_steps = 3;
  TrainRunResult rb1 = run_training(tiny_job(b), stop);
  EXPECT_EQ(rb1.final_step, 3);
  TrainRunOptions resume = quiet();
  resume.resume = "auto";
  TrainRunResult rb2 = run_training(tiny_job(b), resume);
  EXPECT_EQ(rb2.first_step, 3);
  EXPECT_EQ(rb2.final_step, 6);
  EXPECT_EQ(losses(a), losses(b));  // exact equality of every step's loss
  EXPECT_EQ(read_file_bytes(ra.last_checkpoint + "/model.safetensors"),
            read_file_bytes(rb2.last_checkpoint + "/model.safetensors"));
  EXPECT_EQ(read_file_bytes(ra.last_checkpoint + "/optimizer.safetensors"),
            read_file_bytes(rb2.last_checkpoint + "/optimizer.safetensors"));
}

// Mixed precision (docs/precision.md): bf16 follows fp32's loss curve closely without equalling it
// (the GEMMs really round), and the checkpoint keeps the fp32 masters, so a bf16 run stopped and
// resumed equals the straight run bit for bit.
TEST(Session, Bf16TrainsCloseToFp32AndResumesBitForBit) {
  const std::string f32 = fresh("fp32_ref");
  run_training(tiny_job(f32), quiet());
  const std::string a = fresh("bf16_straight");
  TrainRunResult ra = run_training(tiny_job(a, {"train.precision=bf16"}), quiet());
  const std::vector<double> la = losses(a), l32 = losses(f32);
  ASSERT_EQ(la.size(), l32.size());
  EXPECT_NE(la, l32);  // bf16 GEMMs: not the fp32 curve
  for (size_t i = 0; i < la.size(); i++)
    EXPECT_NEAR(la[i], l32[i], 0.01 * l32[i]) << "step " << i + 1;  // within 1%
  const std::string b = fresh("bf16_resumed");
  TrainRunOptions stop = quiet();
  stop.stop_after_steps = 3;
  run_training(tiny_job(b, {"train.precision=bf16"}), stop);
  TrainRunOptions resume = quiet();
  resume.resume = "auto";
  TrainRunResult rb = run_training(tiny_job(b, {"train.precision=bf16"}), resume);
  EXPECT_EQ(rb.first_step, 3);
  EXPECT_EQ(losses(a), losses(b));
  EXPECT_EQ(read_file_bytes(ra.last_checkpoint + "/model.safetensors"),
            read_file_bytes(rb.last_checkpoint + "/model.safetensors"));
  EXPECT_EQ(read_file_bytes(ra.last_checkpoint + "/optimizer.safetensors"),
            read_file_bytes(rb.last_checkpoint + "/optimizer.safetensors"));
  // The masters are what the checkpoint keeps: float32 tensors.
  const std::string model = read_file_bytes(ra.last_checkpoint + "/model.safetensors");
  EXPECT_TRUE(has(model, "\"dtype\":\"F32\"")) << model.substr(0, 200);
  EXPECT_FALSE(has(model.substr(0, 4096), "BF16"));
}

namespace {
// The fp16 records of a run: per metrics line with "loss_scale", (step, skipped, loss_scale, skipped_steps).
struct ScaleRecord {
  int64_t step;
  bool skipped;
  double scale;
  int64_t skipped_steps;
  bool operator==(const ScaleRecord&) const = default;
};
std::vector<ScaleRecord> scale_records(const std::string& run_dir) {
  std::vector<ScaleRecord> out;
  for (const auto& r : report::read_metrics(run_dir + "/metrics.jsonl"))
    if (r.contains("loss_scale"))
      out.push_back({r["step"].get<int64_t>(), r["skipped"].get<bool>(), r["loss_scale"].get<double>(),
                     r["skipped_steps"].get<int64_t>()});
  return out;
}
}  // namespace

// fp16 (docs/precision.md "Loss scaling") at the default scale (2^16) learns like fp32 on the tiny
// job: every step applied, each loss within 1% of fp32's, not equal to it (fp16 GEMM operands), the
// checkpoint's tensors F32 masters.
TEST(Session, Fp16TrainsCloseToFp32) {
  const std::string f32 = fresh("fp16_fp32_ref");
  run_training(tiny_job(f32), quiet());
  const std::string a = fresh("fp16_straight");
  TrainRunResult ra = run_training(tiny_job(a, {"train.precision=fp16"}), quiet());
  const std::vector<double> la = losses(a), l32 = losses(f32);
  ASSERT_EQ(la.size(), l32.size());
  EXPECT_NE(la, l32);
  for (size_t i = 0; i < la.size(); i++) EXPECT_NEAR(la[i], l32[i], 0.01 * l32[i]) << "step " << i + 1;
  EXPECT_LT(la.back(), la.front());
  EXPECT_EQ(ra.overflow_skipped_steps, 0);
  EXPECT_EQ(ra.loss_scale, 65536);
  for (const ScaleRecord& r : scale_records(a)) EXPECT_EQ(r, (ScaleRecord{r.step, false, 65536, 0}));
  EXPECT_EQ(scale_records(a).size(), 6u);
  const std::string model = read_file_bytes(ra.last_checkpoint + "/model.safetensors");
  EXPECT_TRUE(has(model, "\"dtype\":\"F32\"")) << model.substr(0, 200);
  EXPECT_FALSE(has(model.substr(0, 4096), "F16"));
}

// An initial loss scale of 2^40 overflows fp16 (the head's dlogits alone are ~2^40 / 64): those
// steps are skipped and the scale halves each time until the backward fits; metrics.jsonl has one
// skipped line per overflow (the scale it overflowed at, the running count), the applied steps
// 1..6 in order, and the count agrees everywhere (the result, the lines, the summary).
TEST(Session, Fp16OverflowsAreSkippedAndCountedInMetrics) {
  const std::string run = fresh("fp16_overflow");
  TrainRunResult r = run_training(tiny_job(run, {"train.precision=fp16", "train.initial_loss_scale=1099511627776",
                                                  "train.loss_scale_hysteresis=1"}),
                                  quiet());
  EXPECT_EQ(r.final_step, 6);
  const std::vector<ScaleRecord> recs = scale_records(run);
  ASSERT_FALSE(recs.empty());
  int64_t first_run = 0;  // the overflows before step 1 was applied
  while (first_run < int64_t(recs.size()) && recs[size_t(first_run)].skipped) first_run++;
  EXPECT_GT(first_run, 3);  // several halvings were needed
  EXPECT_EQ(recs[0], (ScaleRecord{1, true, std::ldexp(1.0, 40), 1}));
  // Every line against the one before: an overflow halves the scale and counts, a good step keeps
  // both (growth_interval 1000), the applied steps go 1..6.
  double scale = std::ldexp(1.0, 40);
  int64_t skipped = 0, applied = 0;
  for (const ScaleRecord& x : recs) {
    EXPECT_EQ(x.scale, scale) << "step " << x.step;
    if (x.skipped) scale /= 2, skipped++;
    else applied++;
    EXPECT_EQ(x.step, applied + (x.skipped ? 1 : 0));
    EXPECT_EQ(x.skipped_steps, skipped) << "step " << x.step;
  }
  EXPECT_EQ(applied, 6);
  EXPECT_EQ(r.overflow_skipped_steps, skipped);
  EXPECT_EQ(r.loss_scale, scale);
  EXPECT_EQ(losses(run).size(), 6u);  // the skipped lines carry no loss: readers of steps pass over them
  for (double l : losses(run)) EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(report::summarize(report::read_metrics(run + "/metrics.jsonl")).skipped_steps, skipped);
}

// fp16 stopped and resumed equals the straight run bit for bit, with the scaler's state in the
// checkpoint: a growth interval of 2 from 2^40 makes the scale back off, grow and back off again
// around the stop, so a resume that lost the scale, the counter or the skipped batches would differ.
TEST(Session, Fp16ResumesBitForBitWithTheScalerState) {
  const std::vector<std::string> fp16 = {"train.precision=fp16", "train.initial_loss_scale=1099511627776",
                                         "train.loss_scale_growth_interval=2"};
  const std::string a = fresh("fp16_resume_straight");
  TrainRunResult ra = run_training(tiny_job(a, fp16), quiet());
  const std::string b = fresh("fp16_resume_resumed");
  TrainRunOptions stop = quiet();
  stop.stop_after_steps = 3;
  run_training(tiny_job(b, fp16), stop);
  TrainRunOptions resume = quiet();
  resume.resume = "auto";
  TrainRunResult rb = run_training(tiny_job(b, fp16), resume);
  EXPECT_EQ(rb.first_step, 3);
  EXPECT_EQ(losses(a), losses(b));
  EXPECT_EQ(scale_records(a), scale_records(b));
  EXPECT_EQ(ra.overflow_skipped_steps, rb.overflow_skipped_steps);
  EXPECT_EQ(ra.loss_scale, rb.loss_scale);
  int grown = 0;  // the scale grew at least once after an overflow: the counter mattered
  const std::vector<ScaleRecord> recs = scale_records(a);
  for (size_t i = 1; i < recs.size(); i++) grown += recs[i].scale > recs[i - 1].scale;
  EXPECT_GT(grown, 0);
  for (const char* f : {"/model.safetensors", "/optimizer.safetensors", "/trainer_state.json"})
    EXPECT_EQ(read_file_bytes(ra.last_checkpoint + f), read_file_bytes(rb.last_checkpoint + f)) << f;
  EXPECT_TRUE(has(read_file_bytes(ra.last_checkpoint + "/trainer_state.json"), "\"loss_scaler\"")) << ra.last_checkpoint;
}

TEST(Session, NanLossStopsOrSkipsByPolicy) {
  std::string run = fresh("nan_stop");
  TrainRunOptions o = quiet();
  o.inject_nan_at_step = 2;
  std::string e = error_of([&] { run_training(tiny_job(run), o); });
  EXPECT_TRUE(has(e, "step 2: the loss is nan")) << e;
  EXPECT_TRUE(has(e, "nan_policy = \"stop\"")) << e;

  run = fresh("nan_skip");
  TrainRunResult r = run_training(tiny_job(run, {"train.nan_policy=skip"}), o);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.final_step, 6);
  for (double l : losses(run)) EXPECT_TRUE(std::isfinite(l));
}

TEST(Session, CheckpointOfAnotherModelIsRejected) {
  std::string run = fresh("other_model");
  run_training(tiny_job(run, {"train.steps=3"}), quiet());
  TrainRunOptions o = quiet();
  o.resume = "auto";
  std::string e = error_of([&] { run_training(tiny_job(run, {"model.hidden=64"}), o); });
  EXPECT_TRUE(has(e, "different model")) << e;
  EXPECT_TRUE(has(e, "[model] hidden: the checkpoint has 32, this job has 64")) << e;
  // Same shapes, different function: still another model.
  e = error_of([&] { run_training(tiny_job(run, {"model.norm=rmsnorm"}), o); });
  EXPECT_TRUE(has(e, "[model] norm: the checkpoint has \"layernorm\", this job has \"rmsnorm\"")) << e;
}

TEST(Session, FullDiskDuringSaveKeepsThePreviousCheckpoint) {
  std::string run = fresh("full_disk");
  TrainRunOptions o = quiet();
  o.stop_after_steps = 3;
  TrainRunResult first = run_training(tiny_job(run), o);
  // The next save runs out of space part-way through.
  o.resume = "auto";
  // Past the run's job.toml (about 1 kB), inside the checkpoint's model.safetensors (~150 kB).
  inject_write_failure_after(20000);
  std::string e = error_of([&] { run_training(tiny_job(run), o); });
  inject_write_failure_after(-1);
  EXPECT_TRUE(has(e, "No space left on device")) << e;
  EXPECT_TRUE(has(e, ".tmp-step_00000006")) << e;  // it failed while writing the new checkpoint
  auto latest = checkpoint::find_latest_valid(run + "/checkpoints", nullptr);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 3);
  // ... and training resumes from it.
  o.stop_after_steps = -1;
  TrainRunResult r = run_training(tiny_job(run), o);
  EXPECT_EQ(r.first_step, 3);
  EXPECT_EQ(r.final_step, 6);
}

TEST(Session, CorruptedCheckpointIsNamedAndSkippedByAuto) {
  std::string run = fresh("corrupt");
  TrainRunResult r = run_training(tiny_job(run), quiet());  // checkpoints at 3 and 6
  {
    std::fstream f(r.last_checkpoint + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x55');
  }
  TrainRunOptions o = quiet();
  o.resume = r.last_checkpoint;
  std::string e = error_of([&] { run_training(tiny_job(run), o); });
  EXPECT_TRUE(has(e, "model.safetensors")) << e;
  o.resume = "auto";
  TrainRunResult again = run_training(tiny_job(run), o);
  EXPECT_EQ(again.first_step, 3);  // the corrupted step-6 checkpoint was skipped
}

TEST(Session, ResumingAnEarlierCheckpointKeepsOneRecordPerStep) {
  std::string run = fresh("rewind");
  run_training(tiny_job(run), quiet());  // steps 1..6, checkpoints at 3 and 6
  TrainRunOptions o = quiet();
  o.resume = run + "/checkpoints/step_00000003";
  run_training(tiny_job(run), o);  // steps 4..6 again
  std::vector<int64_t> steps;
  for (const auto& r : report::read_metrics(run + "/metrics.jsonl"))
    if (r.contains("loss")) steps.push_back(r["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

TEST(Session, SampleIsSeededGreedyIsTopOneAndOptionsAreChecked) {
  std::string run = fresh("sample");
  TrainRunResult r = run_training(tiny_job(run, {"train.steps=20"}), quiet());
  SampleOptions so;
  so.prompt = "line 1";
  so.max_new_tokens = 12;
  so.threads = 1;
  SampleResult a = sample_from_checkpoint(r.last_checkpoint, so), b = sample_from_checkpoint(r.last_checkpoint, so);
  EXPECT_EQ(a.text, b.text);  // same seed, same text
  EXPECT_EQ(a.new_tokens, 12);
  EXPECT_EQ(a.text.rfind("line 1", 0), 0u);
  SampleOptions greedy = so, top1 = so;
  greedy.temperature = 0;
  top1.temperature = 1.0;
  top1.top_k = 1;
  top1.seed = 99;
  EXPECT_EQ(sample_from_checkpoint(r.last_checkpoint, greedy).text, sample_from_checkpoint(r.last_checkpoint, top1).text);
  SampleOptions bad = so;
  bad.temperature = -1;
  EXPECT_TRUE(has(error_of([&] { sample_from_checkpoint(r.last_checkpoint, bad); }), "--temperature -1: expected a number >= 0"));
  bad = so;
  bad.top_k = -2;
  EXPECT_TRUE(has(error_of([&] { sample_from_checkpoint(r.last_checkpoint, bad); }), "--top-k -2"));
}

TEST(Session, TrainerChecksAreReportedWithTheFilesProblems) {
  std::string e = error_of([&] {
    parse_job("[model]\nhiden = 3\n[train]\nprecision = \"fp8\"\nsteps = 0\n", "both.toml", {}, check_training_job);
  });
  EXPECT_TRUE(has(e, "3 problems in job both.toml")) << e;
  EXPECT_TRUE(has(e, "unknown key \"hiden\"")) << e;
  EXPECT_TRUE(has(e, "[train] precision = \"fp8\": this trainer trains in \"fp32\", \"bf16\" or \"fp16\"")) << e;
  EXPECT_TRUE(has(e, "[train] steps = 0: expected at least 1")) << e;
  // A value that came from --set is named by its --set, the file's own by the file.
  e = error_of([&] {
    parse_job("[parallel]\ngpus = 1\n[train]\nsteps = 0\n", "both.toml", {"parallel.tp=2"}, check_training_job);
  });
  EXPECT_TRUE(has(e, "\n  --set parallel.tp=2: [parallel] tp = 2: this trainer runs on one rank")) << e;
  EXPECT_TRUE(has(e, "\n  both.toml: [train] steps = 0: expected at least 1")) << e;
}

TEST(Session, BadJobsAreRejectedUpFront) {
  std::string run = fresh("bad");
  std::string e = error_of([&] { run_training(tiny_job(run, {"model.vocab=100"}), quiet()); });
  EXPECT_TRUE(has(e, "[model] vocab = 100 is smaller than the vocabulary of the dataset's tokenizer (256")) << e;
  e = error_of([&] { run_training(tiny_job(run, {"parallel.gpus=2", "train.precision=fp8"}), quiet()); });
  EXPECT_TRUE(has(e, "2 problems")) << e;
  EXPECT_TRUE(has(e, "[parallel] gpus = 2")) << e;
  EXPECT_TRUE(has(e, "[train] precision = \"fp8\"")) << e;
  e = error_of([&] { run_training(tiny_job(run, {"parallel.micro_batch=3"}), quiet()); });
  // The one batch rule of plan/plan.hpp in the trainer's wording (see trainer_test OptionsFromJob).
  EXPECT_TRUE(has(e, "global_batch 4 is not divisible by micro_batch 3 * dp 1 = 3")) << e;
  e = error_of([&] { run_training(tiny_job(run, {"train.data=\"/nonexistent\""}), quiet()); });
  EXPECT_TRUE(has(e, "[train] data = \"/nonexistent\": expected a directory written by `exatrain data prepare`")) << e;
  run_training(tiny_job(run, {"train.steps=1"}), quiet());
  e = error_of([&] { run_training(tiny_job(run, {"train.steps=1"}), quiet()); });
  EXPECT_TRUE(has(e, "already holds a run (metrics.jsonl)")) << e;
}
