// [parallel] of a parsed job file -> the plan `train` runs (plan/resolve.hpp), and the start-up
// errors for bad combinations.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "parallel/mesh.hpp"
#include "parallel/schedule.hpp"
#include "plan/resolve.hpp"
#include "plan/search.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

static Job job_with(const std::string& parallel) {
  std::string toml =
      "[model]\nlayers = 8\nhidden = 64\nheads = 8\nkv_heads = 2\nffn_hidden = 256\n"
      "seq_len = 32\nvocab = 100\n[parallel]\n" + parallel;
  return parse_job(toml, "test.toml");
}

static std::string plan_error_of(const Job& job, int world) {
  return error_of([&] { plan::plan_from_job(job, world); });
}

static const char* kFull =
    "tp = 2\npp = 2\ncp = 1\nvp = 2\nzero = 1\nmicro_batch = 2\nrecompute = \"none\"\n"
    "seq_parallel = true\nschedule = \"1f1b\"\n";

TEST(Setup, ResolvesDpMicroBatchesAndTheInterleavedSchedule) {
  const plan::Plan p = plan::plan_from_job(job_with(std::string("gpus = 8\nglobal_batch = 16\n") + kFull), 8);
  struct {
    MeshShape mesh;
    int64_t micro_batches;
    PipelinePlan pipeline;
    bool seq_parallel;
  } r{{int(p.tp), int(p.cp), int(p.dp), int(p.pp)}, p.micro_batches(), pipeline_plan(p), p.seq_parallel};
  EXPECT_EQ(r.mesh.dp, 2);
  EXPECT_EQ(r.micro_batches, 4);  // 16 / (2 * 2)
  EXPECT_EQ(r.pipeline.schedule, PipeSchedule::interleaved);
  EXPECT_EQ(r.pipeline.vp, 2);
  EXPECT_TRUE(r.seq_parallel);
}

TEST(Setup, BadCombinationsPrintTheEquation) {
  std::string base = std::string("gpus = 8\nglobal_batch = 16\n") + kFull;
  EXPECT_NE(plan_error_of(job_with(base), 4).find("gpus = 8 but the job runs on 4 MPI ranks"),
            std::string::npos);
  EXPECT_NE(plan_error_of(job_with(std::string("gpus = 8\nglobal_batch = 10\n") + kFull), 8)
                .find("global_batch 10 is not divisible by micro_batch 2 * dp 2 = 4"),
            std::string::npos);
  EXPECT_NE(plan_error_of(job_with("gpus = 6\nglobal_batch = 12\ntp = 4\npp = 1\ncp = 1\nvp = 1\n"
                              "zero = 0\nmicro_batch = 1\nrecompute = \"none\"\n"
                              "seq_parallel = false\nschedule = \"1f1b\"\n"),
                     6)
                .find("cannot infer dp: world 6 is not divisible by tp 4 * cp 1 * pp 1 = 4"),
            std::string::npos);
  EXPECT_NE(plan_error_of(job_with("gpus = 3\nglobal_batch = 12\ntp = 3\npp = 1\ncp = 1\nvp = 1\n"
                              "zero = 0\nmicro_batch = 1\nrecompute = \"none\"\n"
                              "seq_parallel = false\nschedule = \"1f1b\"\n"),
                     3)
                .find("tp 3 must divide heads 8: 8 % 3 = 2"),
            std::string::npos);
  // global_batch 4 / (micro_batch 1 * dp 1) = 4 micro-batches cannot fill 8 pipeline stages.
  EXPECT_NE(plan_error_of(job_with("gpus = 8\nglobal_batch = 4\ntp = 1\npp = 8\ncp = 1\nvp = 1\n"
                              "zero = 0\nmicro_batch = 1\nrecompute = \"none\"\n"
                              "seq_parallel = false\nschedule = \"1f1b\"\n"),
                     8)
                .find("micro_batches 4 < pp 8"),
            std::string::npos);
  EXPECT_NE(plan_error_of(job_with("gpus = 8\nglobal_batch = 16\ntp = 2\npp = 2\nvp = 2\n"), 8)
                .find("is \"auto\""),
            std::string::npos);
}

// A value given by --set is named by that --set, the others by the job file.
TEST(Setup, ErrorsNameTheSetThatGaveTheValue) {
  const std::string toml = "[model]\nlayers = 8\nhidden = 64\nheads = 8\nkv_heads = 2\nffn_hidden = 256\n"
                           "seq_len = 32\nvocab = 100\n[parallel]\ngpus = 3\nglobal_batch = 12\npp = 1\ncp = 1\n"
                           "vp = 1\nzero = 0\nmicro_batch = 1\nrecompute = \"none\"\nseq_parallel = false\n"
                           "schedule = \"1f1b\"\n";
  std::string e = plan_error_of(parse_job(toml, "test.toml", {"parallel.tp=3"}), 3);
  EXPECT_NE(e.find("--set parallel.tp=3 and test.toml: [parallel] tp 3 must divide heads 8: 8 % 3 = 2"),
            std::string::npos) << e;
  e = plan_error_of(parse_job(toml, "test.toml", {"parallel.tp=1", "parallel.gpus=4"}), 2);
  EXPECT_NE(e.find("--set parallel.gpus=4: [parallel] gpus = 4 but the job runs on 2 MPI ranks"), std::string::npos)
      << e;
  e = plan_error_of(parse_job(toml, "test.toml", {"parallel.tp=1", "parallel.pp=3", "parallel.global_batch=2"}), 3);
  EXPECT_NE(e.find("--set parallel.pp=3 and test.toml and --set parallel.global_batch=2: [parallel] a pipeline needs "
                   "at least as many micro-batches as stages: micro_batches 2 < pp 3"),
            std::string::npos) << e;
}

// Refusals the trainer would otherwise raise without the origins: cp > 1 and a layers_per_stage
// list that does not add up.
TEST(Setup, CpAndLayersPerStageErrorsNameTheirOrigin) {
  const std::string toml = "[model]\nlayers = 8\nhidden = 64\nheads = 8\nkv_heads = 2\nffn_hidden = 256\n"
                           "seq_len = 32\nvocab = 100\n[parallel]\ngpus = 4\nglobal_batch = 16\ntp = 1\npp = 2\n"
                           "cp = 1\nvp = 1\nzero = 0\nmicro_batch = 1\nrecompute = \"none\"\nseq_parallel = false\n"
                           "schedule = \"1f1b\"\n";
  std::string e = plan_error_of(parse_job(toml, "test.toml", {"parallel.cp=2"}), 4);
  EXPECT_NE(e.find("--set parallel.cp=2: [parallel] cp = 2: context parallelism is planned but not run by the "
                   "trainer (expected cp = 1)"),
            std::string::npos) << e;
  // Planned, not run: the trainer re-runs every fully recomputed layer whole.
  e = plan_error_of(parse_job(toml, "test.toml", {"parallel.recompute=full", "parallel.recompute_early_stop=true"}), 4);
  EXPECT_NE(e.find("[parallel] recompute_early_stop = true: the trainer re-runs every fully recomputed layer whole"),
            std::string::npos) << e;
  e = plan_error_of(parse_job(toml + "layers_per_stage = [3, 4]\n", "test.toml"), 4);
  EXPECT_NE(e.find("test.toml: [parallel] layers_per_stage sums to 7 but the model has layers = 8"), std::string::npos)
      << e;
  e = plan_error_of(parse_job(toml + "layers_per_stage = [8, 0]\n", "test.toml"), 4);
  EXPECT_NE(e.find("test.toml: [parallel] layers_per_stage[1] = 0: every stage needs >= 1 layer"), std::string::npos)
      << e;
}

TEST(Setup, EveryPlanOfAJobCarriesItsFrameworkBehaviours) {
  // `predict`'s resolve_plan and the search's candidates copy [parallel]'s framework behaviours
  // and stage split through one Plan::set_framework: each non-default value here reaches both
  // (tp_comm_overlap stays none at tp = 1). The trainer's plan_from_job takes the stage split and
  // recompute_early_stop, not the overlaps, which this runtime does not run.
  auto par = [](int tp, const char* zero) {
    return fmt::format("gpus = 8\nglobal_batch = 16\ntp = {}\npp = 2\ncp = 1\nvp = 1\nzero = {}\nmicro_batch = 2\n"
                       "recompute = \"none\"\nseq_parallel = true\nschedule = \"1f1b\"\noverlap_grad_reduce = false\n"
                       "overlap_param_gather = true\ntp_comm_overlap = true\nrecompute_early_stop = true\n"
                       "layers_per_stage = [3, 5]\n", tp, zero);
  };
  const Job job = job_with(par(2, "1"));
  const plan::Plan predicted = plan::resolve_plan(job), trained = plan::plan_from_job(job, 8);
  const plan::SearchResult searched = plan::search_plans(job.model, job.machine, job.parallel, job.train, 1);
  ASSERT_FALSE(searched.top.empty());
  for (const plan::Plan* p : {&predicted, &searched.top.front().plan}) {
    EXPECT_FALSE(p->overlap_grad_reduce);
    EXPECT_TRUE(p->overlap_param_gather);
    EXPECT_EQ(p->tp_comm_overlap, TpCommOverlap::all);
  }
  for (const plan::Plan* p : {&predicted, &trained, &searched.top.front().plan}) {
    EXPECT_TRUE(p->recompute_early_stop);
    EXPECT_EQ(p->layers_per_stage, (std::vector<int64_t>{3, 5}));
  }
  EXPECT_EQ(trained.tp_comm_overlap, TpCommOverlap::none);
  EXPECT_FALSE(trained.overlap_param_gather);
  EXPECT_EQ(plan::resolve_plan(job_with(par(1, "1"))).tp_comm_overlap, TpCommOverlap::none);
  // The search leaves overlap_param_gather out of its ZeRO-0 candidates (no parameter gather to
  // overlap) where `predict` of that plan refuses it; the trainer runs such a plan.
  const Job zero0 = job_with(par(2, "0"));
  const plan::SearchResult s0 = plan::search_plans(zero0.model, zero0.machine, zero0.parallel, zero0.train, 1);
  ASSERT_FALSE(s0.top.empty());
  EXPECT_FALSE(s0.top.front().plan.overlap_param_gather);
  EXPECT_NE(plan::plan_error(zero0.model, plan::resolve_plan(zero0)).find("overlap_param_gather = true needs zero >= 1"),
            std::string::npos);
  EXPECT_EQ(plan::plan_from_job(zero0, 8).zero, 0);
}

TEST(Setup, ARunIsPredictedWithTheFrameworkBehavioursThisTrainerRuns) {
  // `report` (and `calibrate` of run directories) predict a run with as_run_here: ZeRO 0 and 2
  // reduce under the backward, ZeRO 1 after it, ZeRO 3 without prefetch; no parameter-gather,
  // tensor-parallel or pipeline overlap, whole pipeline messages, whole recomputed layers.
  // framework_not_run_here names each difference that acts on the plan; `train` says those the
  // job sets, `report` the defaults and ZeRO 3's prefetch too.
  auto par = [](const char* zero, int vp, const std::string& extra) {
    return fmt::format("gpus = 8\nglobal_batch = 16\ntp = 2\npp = 2\ncp = 1\nvp = {}\nzero = {}\nmicro_batch = 2\n"
                       "recompute = \"full\"\nseq_parallel = true\nschedule = \"1f1b\"\n{}", vp, zero, extra);
  };
  const std::string overlaps = "overlap_param_gather = true\ntp_comm_overlap = \"forward\"\noverlap_p2p_comm = true\n"
                               "recompute_early_stop = true\n";
  const Job job = job_with(par("1", 2, overlaps));
  const plan::Plan planned = plan::resolve_plan(job), here = plan::as_run_here(planned);
  ASSERT_TRUE(planned.overlap_grad_reduce && planned.zero3_prefetch && planned.pp_scatter_gather);
  ASSERT_TRUE(planned.recompute_early_stop);
  EXPECT_FALSE(here.overlap_grad_reduce);  // ZeRO 1: one reduce-scatter after the last backward
  EXPECT_FALSE(here.overlap_param_gather);
  EXPECT_EQ(here.tp_comm_overlap, TpCommOverlap::none);
  EXPECT_FALSE(here.overlap_p2p_comm);
  EXPECT_FALSE(here.recompute_early_stop);
  EXPECT_FALSE(here.zero3_prefetch);
  EXPECT_FALSE(here.pp_scatter_gather);
  EXPECT_EQ(here.vp, 2);  // the degrees are the job's
  const std::string p2p = "overlap_p2p_comm = true: this trainer's pipeline messages are non-blocking MPI sends and "
                          "receives, which MPI moves only inside its calls (weak progress, no progress thread): "
                          "counted exposed";
  const std::string early = "recompute_early_stop = true: this trainer re-runs every recomputed layer whole";
  Job no_early = job;
  no_early.parallel.recompute_early_stop = false;  // plan_from_job refuses it at recompute = full
  const plan::Plan trained = plan::plan_from_job(no_early, 8);
  const std::vector<std::string> set = plan::framework_not_run_here(job, trained, true);
  ASSERT_EQ(set.size(), 4u) << fmt::format("{}", fmt::join(set, "\n"));
  EXPECT_EQ(set[0], "overlap_param_gather = true: this trainer all-gathers the updated weights after the optimizer "
                    "step, before the next forward");
  EXPECT_EQ(set[1], "tp_comm_overlap = \"forward\": this trainer's tensor-parallel collectives block");
  EXPECT_EQ(set[2], p2p);
  EXPECT_EQ(set[3], early);
  std::vector<std::string> all = plan::framework_not_run_here(job, trained, false);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0], "overlap_grad_reduce = true: this trainer's ZeRO 1 reduce-scatters the gradients once, after the "
                    "last micro-batch's backward");
  // Without sequence parallelism at tp > 1, report says the pipeline's messages are whole.
  Job no_sp = job;
  no_sp.parallel.seq_parallel = false, no_sp.parallel.tp_comm_overlap = TpCommOverlap::none;
  no_sp.parallel.recompute_early_stop = false;
  all = plan::framework_not_run_here(no_sp, plan::plan_from_job(no_sp, 8), false);
  ASSERT_EQ(all.size(), 4u) << fmt::format("{}", fmt::join(all, "\n"));
  EXPECT_EQ(all[3], "pp > 1 at tp > 1: this trainer sends every tensor-parallel rank's whole activation between "
                    "stages, without Megatron's scatter/gather across nodes");
  // ZeRO 0 and 2 reduce under the backward whatever the job says; without interleaving there are
  // no overlapped sends to refuse (plan_notes says it has no effect).
  for (const char* zero : {"0", "2"}) {
    const Job j = job_with(par(zero, 1, "overlap_grad_reduce = false\noverlap_p2p_comm = true\n"));
    EXPECT_TRUE(plan::as_run_here(plan::resolve_plan(j)).overlap_grad_reduce);
    EXPECT_EQ(plan::framework_not_run_here(j, plan::plan_from_job(j, 8), true),
              std::vector<std::string>{fmt::format("overlap_grad_reduce = false: this trainer's ZeRO {} reduces the "
                                                   "gradients bucket by bucket under the backward", zero)});
  }
  // ZeRO 3: no overlap_grad_reduce (its per-layer model has none); report says the prefetch is not run.
  const Job zero3 = job_with(par("3", 1, "overlap_grad_reduce = false\n"));
  EXPECT_TRUE(plan::framework_not_run_here(zero3, plan::plan_from_job(zero3, 8), true).empty());
  EXPECT_EQ(plan::framework_not_run_here(zero3, plan::plan_from_job(zero3, 8), false),
            std::vector<std::string>{"zero = 3: this trainer gathers each layer's weights and reduce-scatters its "
                                     "gradients blocking, without the prefetch of FSDP and DeepSpeed"});
  // Compressed reductions block whatever overlap_grad_reduce says: nothing to tell.
  Job compressed = job_with(par("1", 1, ""));
  compressed.train.comm.compressor = "powersgd";
  plan::Plan pc = plan::plan_from_job(compressed, 8);
  pc.set_optimizer(compressed.train);
  ASSERT_TRUE(pc.comm.active());
  EXPECT_TRUE(plan::framework_not_run_here(compressed, pc, false).empty());
  // A job that plans what this trainer runs: nothing to say.
  const Job plain = job_with(par("0", 2, ""));
  EXPECT_TRUE(plan::framework_not_run_here(plain, plan::plan_from_job(plain, 8), false).empty());
}

TEST(Setup, TrainChoosesItsAutoFieldsAsItRunsThem) {
  // `train`'s search ranks every candidate as this trainer runs it (search_runnable_plans): the
  // job's overlaps are not credited, so the predicted step of its choice is report's.
  const Job job = job_with("gpus = 8\nglobal_batch = 16\noverlap_param_gather = true\noverlap_p2p_comm = true\n"
                           "tp_comm_overlap = true\n");
  const plan::SearchResult res = plan::search_runnable_plans(job.model, job.machine, job.parallel, job.train, 20);
  ASSERT_FALSE(res.top.empty());
  for (const plan::Prediction& c : res.top) {
    EXPECT_EQ(c.plan.overlap_grad_reduce, c.plan.zero == 0 || c.plan.zero == 2) << plan::plan_summary(c.plan);
    EXPECT_FALSE(c.plan.overlap_param_gather || c.plan.overlap_p2p_comm || c.plan.zero3_prefetch);
    EXPECT_EQ(c.plan.tp_comm_overlap, TpCommOverlap::none);
    EXPECT_DOUBLE_EQ(c.step_time_s, plan::predict(job.model, job.machine, plan::as_run_here(c.plan)).step_time_s);
  }
  // The planner's own search keeps the job's behaviours.
  const plan::SearchResult planned = plan::search_plans(job.model, job.machine, job.parallel, job.train, 20);
  ASSERT_FALSE(planned.top.empty());
  EXPECT_TRUE(planned.top.front().plan.overlap_p2p_comm);
  // The job's recompute_early_stop stays on the candidates, so that `train` skips full
  // recomputation (which it refuses with the key) instead of choosing it and failing at start.
  Job early = job_with("gpus = 8\nglobal_batch = 16\nrecompute_early_stop = true\n");
  const plan::SearchResult with_early = plan::search_runnable_plans(early.model, early.machine, early.parallel,
                                                                    early.train, 200);
  bool full = false;
  for (const plan::Prediction& c : with_early.top) {
    EXPECT_TRUE(c.plan.recompute_early_stop);
    EXPECT_FALSE(c.plan.pp_scatter_gather);
    full |= c.plan.recompute == Recompute::full;
  }
  ASSERT_TRUE(full);  // there were full-recompute candidates to skip
  EXPECT_NE(plan::resolve_training_plan(early, 8, nullptr).recompute, Recompute::full);
}
