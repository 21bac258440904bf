// The [comm] table (job/job.hpp CommSpec, docs/job-file.md): defaults, every compressor's keys,
// the round trip through job_to_toml, and the refusals naming file, key and value: unknown keys,
// keys of another compressor, values out of range, role densities, DGC with an optimizer that has
// its own momentum; and the plan rules (ZeRO 3, ZeRO 1 with an optimizer that needs whole tensors).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/plan.hpp"
#include "plan/comm.hpp"
#include "plan/resolve.hpp"
#include "job_errors.hpp"

using namespace exatrain;

using job_test::contains;
using job_test::parse_error;

TEST(JobComm, DefaultsAreNoCompressionAndNoTable) {
  const Job j = parse_job("", "job.toml");
  EXPECT_EQ(j.train.comm, CommSpec{});
  EXPECT_FALSE(j.train.comm.active());
  EXPECT_FALSE(contains(job_to_toml(j), "[comm]"));
}

TEST(JobComm, EveryCompressorReadsItsKeysAndRoundTrips) {
  const std::vector<std::string> jobs = {
      "[comm]\ncompressor = \"topk\"\ndensity = 0.001\nwarmup_steps = 5\nwarmup = \"exponential\"\nerror_feedback = false\n"
      "selection = \"sample\"\nsample_fraction = 0.05\ncollective = \"split_reduce\"\nscope = \"entry\"\n"
      "min_compress = 64\nrole_density = { embedding = 0.0001, norm = 1 }\n",
      "[train]\noptimizer = \"sgd\"\n[optimizer]\nmomentum = 0\n[comm]\ncompressor = \"dgc\"\nmomentum = 0.8\n"
      "density = 0.001\nwarmup_steps = 100\nwarmup = \"exponential\"\n",
      "[comm]\ncompressor = \"blocktopk\"\nblock_size = 64\nscope = \"bucket\"\n",
      "[comm]\ncompressor = \"topk\"\nvalues = \"sign\"\nindices = \"golomb\"\nsmall_pieces = \"sign\"\n",
      "[comm]\ncompressor = \"temporal\"\nrefresh_every = 20\ndensity = 0.01\n",
      "[comm]\ncompressor = \"powersgd\"\nrank = 8\nwarmup_steps = 10\nmin_compress = 0\n",
      "[comm]\ncompressor = \"sign\"\nerror_feedback = true\n"};
  for (const std::string& text : jobs) {
    const Job a = parse_job(text, "job.toml");
    const Job b = parse_job(job_to_toml(a), "roundtrip.toml");
    EXPECT_EQ(b.train.comm, a.train.comm) << text;
    EXPECT_TRUE(same_settings(a, b)) << text;
    EXPECT_TRUE(contains(job_to_toml(a), "[comm]\ncompressor = \"" + a.train.comm.compressor + "\"")) << job_to_toml(a);
  }
  const Job t = parse_job(jobs[0], "job.toml");
  EXPECT_EQ(t.train.comm.collective, "split_reduce");
  EXPECT_DOUBLE_EQ(t.train.comm.role_density.at("embedding"), 0.0001);
  EXPECT_DOUBLE_EQ(t.train.comm.sample_fraction, 0.05);
  EXPECT_EQ(parse_job(jobs[5], "job.toml").train.comm.rank, 8);
  const CommSpec packed = parse_job(jobs[3], "job.toml").train.comm;
  EXPECT_EQ(packed.values, "sign");
  EXPECT_EQ(packed.indices, "golomb");
  EXPECT_EQ(packed.small_pieces, "sign");
  // --set reaches the table.
  EXPECT_DOUBLE_EQ(parse_job("[comm]\ncompressor = \"topk\"\n", "job.toml", {"comm.density=0.25"}).train.comm.density, 0.25);
}

TEST(JobComm, BadValuesAreNamedWithWhatWasExpected) {
  std::string e = parse_error("[comm]\ncompressor = \"gzip\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] compressor = \"gzip\": expected one of \"none\" \"topk\" \"dgc\" "
                          "\"blocktopk\" \"temporal\" \"powersgd\" \"sign\"")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\ndensity = 0\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] density = 0: expected a number in (0, 1]")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\ndensity = 1.5\ncollective = \"ring\"\nscope = \"layer\"\n");
  EXPECT_TRUE(contains(e, "[comm] density = 1.5: expected a number in (0, 1]")) << e;
  EXPECT_TRUE(contains(e, "[comm] collective = \"ring\": expected one of \"allgather\" \"split_reduce\"")) << e;
  EXPECT_TRUE(contains(e, "[comm] scope = \"layer\": expected one of \"entry\" \"bucket\"")) << e;
  e = parse_error("[comm]\ncompressor = \"powersgd\"\nrank = 0\n");
  EXPECT_TRUE(contains(e, "[comm] rank = 0: expected an integer in [1, 1024]")) << e;
  e = parse_error("[comm]\ncompressor = \"temporal\"\nrefresh_every = 0\n");
  EXPECT_TRUE(contains(e, "[comm] refresh_every = 0: expected an integer in [1, 1000000]")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nrole_density = { layer = 0.1 }\n");
  EXPECT_TRUE(contains(e, "[comm] role_density = { layer = 0.1 }: expected an inline table of numbers in (0, 1] named "
                          "matrix, embedding, head, norm, bias")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nrole_density = { norm = 2 }\n");
  EXPECT_TRUE(contains(e, "[comm] role_density")) << e;
}

TEST(JobComm, KeysTheCompressorDoesNotTakeAreRefused) {
  std::string e = parse_error("[comm]\ndensity = 0.01\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] density = 0.01: not a key of [comm] compressor = \"none\" (which takes no "
                          "other key)")) << e;
  e = parse_error("[comm]\ncompressor = \"powersgd\"\ndensity = 0.01\nrefresh_every = 3\n");
  EXPECT_TRUE(contains(e, "[comm] density = 0.01: not a key of [comm] compressor = \"powersgd\" (whose keys are rank, "
                          "warmup_steps, error_feedback, min_compress, adam_variance, compress)")) << e;
  EXPECT_TRUE(contains(e, "[comm] refresh_every = 3: not a key")) << e;
  e = parse_error("[train]\noptimizer = \"sgd\"\n[optimizer]\nmomentum = 0\n[comm]\ncompressor = \"dgc\"\nerror_feedback = false\n");
  EXPECT_TRUE(contains(e, "[comm] error_feedback = false: not a key of [comm] compressor = \"dgc\"")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nsample_fraction = 0.1\n");
  EXPECT_TRUE(contains(e, "[comm] sample_fraction = 0.1: the fraction of elements DGC's sampled threshold reads, which "
                          "needs [comm] selection = \"sample\"")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nscope = \"bucket\"\nrole_density = { norm = 1 }\n");
  EXPECT_TRUE(contains(e, "[comm] role_density = { norm = 1 }: densities per parameter role need the selection per entry ([comm] scope = \"entry\")")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\ndensty = 0.1\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] unknown key \"densty\" (did you mean \"density\"?)")) << e;
  e = parse_error("[compression]\ncompressor = \"topk\"\n");
  EXPECT_TRUE(contains(e, "unknown section [compression]; expected [model], [machine], [parallel], [train], [optimizer], "
                          "[comm]")) << e;
}

TEST(JobComm, PackedPairsAreCheckedAndNeedTheAllGather) {
  std::string e = parse_error("[comm]\ncompressor = \"topk\"\nvalues = \"int8\"\nindices = \"elias\"\nsmall_pieces = \"bf16\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] values = \"int8\": expected one of \"fp32\" \"bf16\" \"sign\"")) << e;
  EXPECT_TRUE(contains(e, "[comm] indices = \"elias\": expected one of \"int32\" \"golomb\"")) << e;
  EXPECT_TRUE(contains(e, "[comm] small_pieces = \"bf16\": expected one of \"fp32\" \"sign\"")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\ncollective = \"split_reduce\"\nindices = \"golomb\"\n");
  EXPECT_TRUE(contains(e, "[comm] indices = \"golomb\": packed pairs travel by the all-gather of pairs")) << e;
  EXPECT_EQ(parse_job("[comm]\ncompressor = \"topk\"\ncollective = \"split_reduce\"\nvalues = \"fp32\"\n", "job.toml").train.comm.values,
            "fp32");  // the default is no packing
  e = parse_error("[comm]\ncompressor = \"topk\"\nvalues = \"sign\"\nerror_feedback = false\n");
  EXPECT_TRUE(contains(e, "[comm] error_feedback = false: rounded values (values = \"bf16\" or \"sign\", small_pieces = "
                          "\"sign\") keep their rounding error in the error-feedback residual")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nsmall_pieces = \"sign\"\nmin_compress = 0\n");
  EXPECT_TRUE(contains(e, "[comm] small_pieces = \"sign\": the small pieces are the entries' pieces below min_compress")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nsmall_pieces = \"sign\"\nscope = \"bucket\"\n");
  EXPECT_TRUE(contains(e, "which needs scope = \"entry\" and min_compress > 0")) << e;
  e = parse_error("[comm]\ncompressor = \"temporal\"\nvalues = \"sign\"\n");
  EXPECT_TRUE(contains(e, "[comm] values = \"sign\": not a key of [comm] compressor = \"temporal\"")) << e;
}

TEST(JobComm, DgcNeedsPlainSgdBecauseItsMomentumCorrectionIsTheMomentum) {
  std::string e = parse_error("[comm]\ncompressor = \"dgc\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] compressor = \"dgc\" with [train] optimizer = \"adamw\": DGC's momentum "
                          "correction accumulates the velocity before the selection ([comm] momentum = 0.9), so it "
                          "replaces the optimizer's momentum; expected optimizer = \"sgd\" with [optimizer] momentum = 0"))
      << e;
  EXPECT_TRUE(contains(e, "or [comm] compress = \"momentum\" with optimizer = \"adamw\"")) << e;  // the other way
  e = parse_error("[train]\noptimizer = \"sgd\"\n[comm]\ncompressor = \"dgc\"\n");
  EXPECT_TRUE(contains(e, "with [train] optimizer = \"sgd\" and [optimizer] momentum = 0.9: DGC's")) << e;
  EXPECT_EQ(parse_error("[train]\noptimizer = \"sgd\"\n[optimizer]\nmomentum = 0\n[comm]\ncompressor = \"dgc\"\n"), "");
}

TEST(JobComm, FrozenAdamVarianceNeedsAdamWAndADenseWarmUp) {
  const Job j = parse_job("[comm]\ncompressor = \"topk\"\nwarmup_steps = 20\nadam_variance = \"freeze\"\n", "job.toml");
  EXPECT_EQ(j.train.comm.adam_variance, "freeze");
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.comm, j.train.comm);
  std::string e = parse_error("[comm]\ncompressor = \"topk\"\nadam_variance = \"freeze\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] adam_variance = \"freeze\" with [train] optimizer = \"adamw\" and [comm] "
                          "warmup_steps = 0: the second moment is frozen after the dense warm-up steps, which measure it "
                          "(1-bit Adam); expected optimizer = \"adamw\" and warmup_steps > 0 with warmup = \"dense\"")) << e;
  e = parse_error("[train]\noptimizer = \"lion\"\n[comm]\ncompressor = \"sign\"\nwarmup_steps = 5\nadam_variance = \"freeze\"\n");
  EXPECT_TRUE(contains(e, "with [train] optimizer = \"lion\" and [comm] warmup_steps = 5: the second moment")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\nadam_variance = \"fixed\"\n");
  EXPECT_TRUE(contains(e, "[comm] adam_variance = \"fixed\": expected one of \"update\" \"freeze\"")) << e;
}

// compress = "momentum" (1-bit Adam's compressed momentum): AdamW with its variance frozen after the
// dense warm-up, under ZeRO 0; "none" does not take the key.
TEST(JobComm, CompressedMomentumNeedsAdamWAFrozenVarianceAndZero0) {
  const std::string ok = "[comm]\ncompressor = \"topk\"\nwarmup_steps = 30\nadam_variance = \"freeze\"\n"
                         "compress = \"momentum\"\n";
  const Job j = parse_job(ok, "job.toml");
  EXPECT_EQ(j.train.comm.compress, "momentum");
  EXPECT_EQ(parse_job("[comm]\ncompressor = \"topk\"\n", "job.toml").train.comm.compress, "gradient");
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.comm, j.train.comm);
  EXPECT_TRUE(contains(job_to_toml(j), "compress = \"momentum\"")) << job_to_toml(j);
  for (const char* c : {"temporal", "blocktopk", "powersgd", "sign"})
    EXPECT_EQ(parse_error(std::string("[comm]\ncompressor = \"") + c + "\"\nwarmup_steps = 3\nadam_variance = \"freeze\"\n"
                          "compress = \"momentum\"\n"), "") << c;
  std::string e = parse_error("[comm]\ncompressor = \"topk\"\nwarmup_steps = 30\ncompress = \"momentum\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [comm] compress = \"momentum\" with [train] optimizer = \"adamw\" and [comm] "
                          "adam_variance = \"update\": the compressed momentum replaces AdamW's first moment, and its "
                          "second moment cannot be measured from compressed momenta, so it is frozen after the dense "
                          "warm-up (1-bit Adam); expected optimizer = \"adamw\" (no [optimizer] others) and "
                          "adam_variance = \"freeze\" (with warmup_steps > 0)")) << e;
  e = parse_error("[train]\noptimizer = \"lion\"\n[comm]\ncompressor = \"topk\"\ncompress = \"momentum\"\n");
  EXPECT_TRUE(contains(e, "[comm] compress = \"momentum\" with [train] optimizer = \"lion\" and [comm] adam_variance")) << e;
  e = parse_error("[parallel]\nzero = 1\n" + ok);
  EXPECT_TRUE(contains(e, "[comm] compress = \"momentum\" with [parallel] zero = 1: each rank forms its local momentum "
                          "from the synchronised one, which ZeRO 1 and 2 keep only as this rank's shard; expected zero = 0"))
      << e;
  // DGC: its velocity becomes AdamW's momentum (rate [train] beta1; [comm] momentum refused), not SGD's.
  EXPECT_EQ(parse_error("[comm]\ncompressor = \"dgc\"\nwarmup_steps = 30\nadam_variance = \"freeze\"\ncompress = \"momentum\"\n"), "");
  e = parse_error("[comm]\ncompressor = \"dgc\"\nwarmup_steps = 30\nadam_variance = \"freeze\"\ncompress = \"momentum\"\nmomentum = 0.8\n");
  EXPECT_TRUE(contains(e, "[comm] momentum = 0.8: with [comm] compress = \"momentum\" DGC's velocity is AdamW's first "
                          "moment, whose rate is [train] beta1")) << e;
  e = parse_error("[train]\noptimizer = \"sgd\"\n[optimizer]\nmomentum = 0\n[comm]\ncompressor = \"dgc\"\ncompress = \"momentum\"\n");
  EXPECT_TRUE(contains(e, "[comm] compress = \"momentum\" with [train] optimizer = \"sgd\"")) << e;
  e = parse_error("[comm]\ncompressor = \"topk\"\ncompress = \"moment\"\n");
  EXPECT_TRUE(contains(e, "[comm] compress = \"moment\": expected one of \"gradient\" \"momentum\"")) << e;
}

TEST(JobComm, ThePlanRefusesZero3AndZero1WithWholeTensorOptimizers) {
  const std::string base = "[model]\nlayers = 2\nhidden = 32\nheads = 2\nseq_len = 16\nvocab = 64\n"
                           "[parallel]\ngpus = 2\ntp = 1\npp = 1\nmicro_batch = 1\nglobal_batch = 2\nrecompute = \"none\"\n";
  const auto problem = [&](const std::string& extra) {
    const Job j = parse_job(base + extra, "job.toml");
    plan::Plan p = plan::resolve_plan(j.parallel, j.train.precision);
    p.dp = 2;
    p.set_optimizer(j.train);
    const auto pr = plan::plan_problem(j.model, p, plan::Purpose::train);
    return pr ? pr->job_text : std::string();
  };
  std::string e = problem("zero = 3\n[comm]\ncompressor = \"topk\"\n");
  EXPECT_TRUE(contains(e, "[comm] compressor = \"topk\" with [parallel] zero = 3: ZeRO 3 reduce-scatters every unit's "
                          "gradients as backward makes them, outside the compressor slot")) << e;
  e = problem("zero = 1\n[train]\noptimizer = \"muon\"\n[comm]\ncompressor = \"powersgd\"\n");
  EXPECT_TRUE(contains(e, "[comm] compressor = \"powersgd\" with [parallel] zero = 1 and [train] optimizer = \"muon\"")) << e;
  EXPECT_EQ(problem("zero = 0\n[train]\noptimizer = \"muon\"\n[comm]\ncompressor = \"powersgd\"\n"), "");
  EXPECT_EQ(problem("zero = 2\n[comm]\ncompressor = \"sign\"\n"), "");
  EXPECT_EQ(problem("zero = 1\n[comm]\ncompressor = \"temporal\"\n"), "");
  // K-FAC gives every layer one owner under ZeRO 1 (KAISA's MEM-OPT): refused with a compressor;
  // under ZeRO 0 it takes the compressed sum (tests/dist/dist_compression.cpp trains it).
  e = problem("zero = 1\n[train]\noptimizer = \"kfac\"\n[comm]\ncompressor = \"topk\"\n");
  EXPECT_TRUE(contains(e, "[comm] compressor = \"topk\" with [parallel] zero = 1 and [train] optimizer = \"kfac\"")) << e;
  EXPECT_EQ(problem("zero = 0\n[train]\noptimizer = \"kfac\"\n[comm]\ncompressor = \"topk\"\n"), "");
  // Compressed momentum with zero left to the planner ("auto"): the parser can refuse only an
  // explicit zero, so the plan rule refuses ZeRO 1 and 2 and a search never picks them (it did,
  // and the run then died in the runtime with a message naming a source file).
  const Job m = parse_job(base + "[comm]\ncompressor = \"topk\"\nwarmup_steps = 2\nadam_variance = \"freeze\"\n"
                                 "compress = \"momentum\"\n", "job.toml");
  EXPECT_FALSE(m.parallel.zero.has_value());
  ParallelSpec candidate = m.parallel;  // what a search tries: every zero
  candidate.zero = 0;
  plan::Plan mp = plan::resolve_plan(candidate, m.train.precision);
  mp.dp = 2;
  mp.set_optimizer(m.train);
  for (int zero : {1, 2}) {
    mp.zero = zero;
    const auto pr = plan::plan_problem(m.model, mp, plan::Purpose::train);
    ASSERT_TRUE(pr.has_value()) << zero;
    EXPECT_TRUE(contains(pr->job_text, "[comm] compress = \"momentum\" with [parallel] zero = " + std::to_string(zero)))
        << pr->job_text;
  }
  mp.zero = 0;
  EXPECT_FALSE(plan::plan_problem(m.model, mp, plan::Purpose::train).has_value());
}

// [train] pipeline_dtype and tp_comm_dtype: read, round-tripped, "auto" by default, anything else
// refused by name.
TEST(JobComm, PipelineAndTpCommDtypesAreReadAndChecked) {
  const Job j = parse_job("[train]\npipeline_dtype = \"fp32\"\n", "job.toml");
  EXPECT_EQ(j.train.pipeline_dtype, "fp32");
  EXPECT_EQ(j.train.tp_comm_dtype, "auto");
  EXPECT_EQ(parse_job("", "job.toml").train.pipeline_dtype, "auto");
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.pipeline_dtype, "fp32");
  std::string e = parse_error("[train]\npipeline_dtype = \"bf16\"\n");
  EXPECT_TRUE(contains(e, "[train] pipeline_dtype = \"bf16\": expected one of \"auto\" \"fp32\"")) << e;
  const Job t = parse_job("[train]\ntp_comm_dtype = \"fp32\"\n", "job.toml");
  EXPECT_EQ(t.train.tp_comm_dtype, "fp32");
  EXPECT_EQ(t.train.pipeline_dtype, "auto");
  EXPECT_EQ(parse_job(job_to_toml(t), "roundtrip.toml").train.tp_comm_dtype, "fp32");
  e = parse_error("[train]\ntp_comm_dtype = \"fp16\"\n");
  EXPECT_TRUE(contains(e, "[train] tp_comm_dtype = \"fp16\": expected one of \"auto\" \"fp32\"")) << e;
}

// [train] residual_dtype likewise (the residual stream kept for the backward: plan.hpp
// Plan::residual_fp32, model/gpt.hpp GptOptions::fp32_residual).
TEST(JobComm, ResidualDtypeIsReadAndChecked) {
  EXPECT_EQ(parse_job("", "job.toml").train.residual_dtype, "auto");
  const Job j = parse_job("[train]\nresidual_dtype = \"fp32\"\n", "job.toml");
  EXPECT_EQ(j.train.residual_dtype, "fp32");
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.residual_dtype, "fp32");
  EXPECT_EQ(parse_job(job_to_toml(parse_job("", "job.toml")), "roundtrip.toml").train.residual_dtype, "auto");
  const std::string e = parse_error("[train]\nresidual_dtype = \"bf16\"\n");
  EXPECT_TRUE(contains(e, "[train] residual_dtype = \"bf16\": expected one of \"auto\" \"fp32\"")) << e;
}

// [parallel] tp_comm_overlap: false (the default), true (every pass's collectives: Megatron) or
// "forward" (the forward's only: PyTorch's async TP); read, round-tripped, anything else refused.
TEST(JobComm, TpCommOverlapIsABoolOrForward) {
  EXPECT_EQ(parse_job("", "job.toml").parallel.tp_comm_overlap, TpCommOverlap::none);
  for (const auto& [text, want] : {std::pair{"false", TpCommOverlap::none}, std::pair{"true", TpCommOverlap::all},
                                   std::pair{"\"forward\"", TpCommOverlap::forward}}) {
    const Job j = parse_job(std::string("[parallel]\ntp_comm_overlap = ") + text + "\n", "job.toml");
    EXPECT_EQ(j.parallel.tp_comm_overlap, want) << text;
    EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").parallel.tp_comm_overlap, want) << text;
  }
  const std::string e = parse_error("[parallel]\ntp_comm_overlap = \"backward\"\n");
  EXPECT_TRUE(contains(e, "[parallel] tp_comm_overlap = \"backward\": expected true, false or \"forward\"")) << e;
}

// [parallel] recompute_early_stop and overlap_p2p_comm: false by default (Megatron, DeepSpeed and
// this trainer re-run whole layers; this trainer's pipeline sends block); read and round-tripped;
// bools only.
TEST(JobComm, RecomputeEarlyStopAndOverlapP2pCommAreBools) {
  for (auto [key, field] : {std::pair{"recompute_early_stop", &ParallelSpec::recompute_early_stop},
                            std::pair{"overlap_p2p_comm", &ParallelSpec::overlap_p2p_comm}}) {
    SCOPED_TRACE(key);
    EXPECT_FALSE(parse_job("", "job.toml").parallel.*field);
    const Job j = parse_job(fmt::format("[parallel]\n{} = true\n", key), "job.toml");
    EXPECT_TRUE(j.parallel.*field);
    EXPECT_TRUE(parse_job(job_to_toml(j), "roundtrip.toml").parallel.*field);
    const std::string e = parse_error(fmt::format("[parallel]\n{} = \"yes\"\n", key));
    EXPECT_TRUE(contains(e, fmt::format("[parallel] {}", key))) << e;
  }
}

// [train] fp8_param_gather: false by default; read and round-tripped; a bool only.
TEST(JobComm, Fp8ParamGatherIsABool) {
  EXPECT_FALSE(parse_job("", "job.toml").train.fp8_param_gather);
  const Job j = parse_job("[train]\nfp8_param_gather = true\n", "job.toml");
  EXPECT_TRUE(j.train.fp8_param_gather);
  EXPECT_TRUE(parse_job(job_to_toml(j), "roundtrip.toml").train.fp8_param_gather);
  const std::string e = parse_error("[train]\nfp8_param_gather = 1\n");
  EXPECT_TRUE(contains(e, "[train] fp8_param_gather")) << e;
}

// [train] grad_reduce_dtype (docs/precision.md): read, round-tripped, refused by name with a
// compressor, with ZeRO 3 and with ZeRO 1's unequal shards; it halves the planner's dp gradient
// reduction bytes and nothing else.
TEST(JobComm, GradReduceDtypeIsReadRefusedWhereTheSlotIsNotAndHalvesTheReductionBytes) {
  const Job j = parse_job("[train]\ngrad_reduce_dtype = \"bf16\"\n", "job.toml");
  EXPECT_EQ(j.train.grad_reduce_dtype, "bf16");
  EXPECT_EQ(parse_job("", "job.toml").train.grad_reduce_dtype, "fp32");
  EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train.grad_reduce_dtype, "bf16");
  std::string e = parse_error("[train]\ngrad_reduce_dtype = \"fp16\"\n");
  EXPECT_TRUE(contains(e, "[train] grad_reduce_dtype = \"fp16\": expected one of \"fp32\" \"bf16\"")) << e;
  e = parse_error("[train]\ngrad_reduce_dtype = \"bf16\"\n[comm]\ncompressor = \"topk\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] grad_reduce_dtype = \"bf16\" with [comm] compressor = \"topk\"")) << e;

  const std::string base = "[model]\nlayers = 2\nhidden = 32\nheads = 2\nseq_len = 16\nvocab = 64\n"
                           "[parallel]\ngpus = 2\ntp = 1\npp = 1\nmicro_batch = 1\nglobal_batch = 2\nrecompute = \"none\"\n";
  const auto plan_of = [&](const std::string& extra) {
    const Job job = parse_job(base + extra, "job.toml");
    plan::Plan p = plan::resolve_plan(job.parallel, job.train.precision);
    p.dp = 2;
    p.set_optimizer(job.train);
    return std::make_pair(job, p);
  };
  const auto problem = [&](const std::string& extra) {
    const auto [job, p] = plan_of(extra);
    const auto pr = plan::plan_problem(job.model, p, plan::Purpose::train);
    return pr ? pr->job_text : std::string();
  };
  e = problem("zero = 3\n[train]\ngrad_reduce_dtype = \"bf16\"\n");
  EXPECT_TRUE(contains(e, "[train] grad_reduce_dtype = \"bf16\" with [parallel] zero = 3")) << e;
  e = problem("zero = 1\n[train]\noptimizer = \"muon\"\ngrad_reduce_dtype = \"bf16\"\n");
  EXPECT_TRUE(contains(e, "[train] grad_reduce_dtype = \"bf16\" with [parallel] zero = 1 and [train] optimizer = \"muon\""))
      << e;
  for (const char* zero : {"zero = 0\n", "zero = 1\n", "zero = 2\n"}) {
    EXPECT_EQ(problem(std::string(zero) + "[train]\ngrad_reduce_dtype = \"bf16\"\n"), "") << zero;
    auto [job32, p32] = plan_of(std::string(zero) + "[train]\nprecision = \"fp32\"\n");
    auto [job16, p16] = plan_of(std::string(zero) + "[train]\nprecision = \"fp32\"\ngrad_reduce_dtype = \"bf16\"\n");
    EXPECT_TRUE(p16.grad_reduce_bf16);
    const plan::CommBytes b32 = plan::bytes_sent_per_step(job32.model, p32, plan::rank_position(p32, 1));
    const plan::CommBytes b16 = plan::bytes_sent_per_step(job16.model, p16, plan::rank_position(p16, 1));
    const plan::CommKind reduce = p32.zero == 0 ? plan::CommKind::dp_all_reduce : plan::CommKind::dp_reduce_scatter;
    EXPECT_GT(b32[reduce], 0) << zero;
    EXPECT_EQ(2 * b16[reduce], b32[reduce]) << zero;
    EXPECT_EQ(b16[plan::CommKind::dp_all_gather], b32[plan::CommKind::dp_all_gather]) << zero;  // fp32 weights
  }
}

