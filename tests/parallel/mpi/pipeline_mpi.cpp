// Under mpirun: the executor runs GPipe, 1F1B and interleaved 1F1B tables over real MPI
// messages for a toy model, and the gradients equal a single-process computation.
//
// Toy model: S = pp * vp stages, stage s maps x[n] -> tanh(w_s * x) element-wise (so backward
// needs the stashed input: a wrong stash or a mixed-up message changes the result); the loss of a
// micro-batch is the sum of the last stage's output. dL/dw_s summed over micro-batches is compared.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "parallel/comm.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/executor.hpp"
#include "parallel/mesh.hpp"
#include "parallel/zero.hpp"

#include "backend/backend.hpp"
#include "backend/half_convert.hpp"

using namespace exatrain::parallel;

static const int64_t kWidth = 5;
// Host-accessible memory for the messages and buckets (the CPU backend).
static exatrain::Backend& backend() {
  static std::unique_ptr<exatrain::Backend> be = exatrain::make_cpu_backend(1);
  return *be;
}
static double weight(int stage) { return 0.9 + 0.13 * stage; }
static double input(int mb, int64_t i) { return std::sin(1.7 * mb + 0.5 * i); }

// Single-process reference in double: dL/dw_s for every stage, and the total loss.
static std::vector<double> reference_grads(int S, int m, double* loss) {
  std::vector<double> dw(S, 0);
  *loss = 0;
  for (int mb = 0; mb < m; mb++) {
    std::vector<std::vector<double>> xs(S + 1, std::vector<double>(kWidth));
    for (int64_t i = 0; i < kWidth; i++) xs[0][i] = input(mb, i);
    for (int s = 0; s < S; s++)
      for (int64_t i = 0; i < kWidth; i++) xs[s + 1][i] = std::tanh(weight(s) * xs[s][i]);
    for (int64_t i = 0; i < kWidth; i++) *loss += xs[S][i];
    std::vector<double> g(kWidth, 1.0);
    for (int s = S - 1; s >= 0; s--)
      for (int64_t i = 0; i < kWidth; i++) {
        double y = xs[s + 1][i], dpre = g[i] * (1 - y * y);
        dw[s] += dpre * xs[s][i];
        g[i] = dpre * weight(s);
      }
  }
  return dw;
}

// Runs the toy model through the executor on micro-batches [mb_offset, mb_offset + m) and
// returns dL/dw of this rank's chunks [vp]; *loss gets the last stage's loss (0 elsewhere).
// steps: the table in Megatron's steps (in_steps, as the trainer posts it over NCCL) instead of
// build_pipeline's early receives.
static std::vector<float> run_toy(Group& pp, const PipelinePlan& plan, int mb_offset, float* loss,
                                  PipelineTiming* timing, std::optional<exatrain::Half> wire = std::nullopt,
                                  bool steps = false) {
  PipelineTable table = steps ? in_steps(build_pipeline(plan)) : build_pipeline(plan);
  int r = pp.rank();
  std::map<std::pair<int, int>, std::vector<float>> stash;  // (mb, chunk) -> stage input
  std::vector<float> dw(plan.vp, 0.f);
  *loss = 0;
  StageCallbacks cb;
  cb.forward = [&](int mb, int chunk, const float* in, float* out) {
    int s = stage_of(plan, r, chunk);
    std::vector<float>& x = stash[{mb, chunk}];
    x.resize(kWidth);
    for (int64_t i = 0; i < kWidth; i++)
      x[i] = in ? in[i] : static_cast<float>(input(mb_offset + mb, i));
    float w = static_cast<float>(weight(s));
    for (int64_t i = 0; i < kWidth; i++) {
      float y = std::tanh(w * x[i]);
      if (out) out[i] = y;
      else *loss += y;  // last stage
    }
  };
  cb.backward = [&](int mb, int chunk, const float* g_out, float* g_in) {
    int s = stage_of(plan, r, chunk);
    auto it = stash.find({mb, chunk});
    ASSERT_NE(it, stash.end());
    float w = static_cast<float>(weight(s));
    for (int64_t i = 0; i < kWidth; i++) {
      float x = it->second[i], y = std::tanh(w * x);
      float g = g_out ? g_out[i] : 1.0f;
      float dpre = g * (1 - y * y);
      dw[chunk] += dpre * x;
      if (g_in) g_in[i] = dpre * w;
    }
    stash.erase(it);
  };
  BufferPool pool(backend(), kWidth, wire);
  run_pipeline(pp, pool, table, cb, timing);
  EXPECT_TRUE(stash.empty());
  return dw;
}

static void run_and_check(Group& pp, const PipelinePlan& plan, PipelineTiming* timing = nullptr, bool steps = false) {
  int r = pp.rank(), S = plan.stages();
  float loss = 0;
  std::vector<float> dw = run_toy(pp, plan, 0, &loss, timing, std::nullopt, steps);
  double ref_loss = 0;
  std::vector<double> ref = reference_grads(S, plan.micro_batches, &ref_loss);
  std::string what = fmt::format("{} pp{} vp{} m{} rank {}{}", to_string(plan.schedule), plan.pp,
                                 plan.vp, plan.micro_batches, r, steps ? " in steps" : "");
  for (int c = 0; c < plan.vp; c++) {
    double want = ref[stage_of(plan, r, c)];
    EXPECT_NEAR(dw[c], want, 1e-5 * (1 + std::fabs(want))) << what << " chunk " << c;
  }
  if (r == (S - 1) % plan.pp) {
    EXPECT_NEAR(loss, ref_loss, 1e-5 * (1 + std::fabs(ref_loss))) << what;
  }
}

TEST(PipelineMpi, EverySchedulesGradientsEqualTheSingleProcessResult) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  // pp = world, and pp = 2 inside a dp x pp mesh (the pp groups run side by side).
  for (int pp_deg : {W, 2}) {
    if (pp_deg > W || W % pp_deg) continue;
    Mesh mesh = Mesh::create(MPI_COMM_WORLD, resolve_mesh_shape(W, 1, 1, pp_deg, std::nullopt));
    CommLedger ledger;
    MpiGroup pp(mesh.pp_comm, "pp", &ledger, nullptr);
    int m = 2 * pp_deg;
    // Each table as build_pipeline posts it (receives a compute early) and in Megatron's steps (as
    // the trainer posts it over NCCL), each batch through Group::post_p2p.
    for (bool steps : {false, true}) {
      run_and_check(pp, {PipeSchedule::gpipe, pp_deg, 1, m}, nullptr, steps);
      run_and_check(pp, {PipeSchedule::one_f_one_b, pp_deg, 1, m + 1}, nullptr, steps);
      if (pp_deg > 1) {
        run_and_check(pp, {PipeSchedule::interleaved, pp_deg, 2, m}, nullptr, steps);
        run_and_check(pp, {PipeSchedule::interleaved, pp_deg, 3, pp_deg}, nullptr, steps);
      }
    }
    // Accounting: every stage except the last sends one activation per micro-batch per chunk,
    // every stage except the first one gradient: bytes = 4 * width * sends.
    int64_t sends = 0;
    for (const PipelinePlan& p : {PipelinePlan{PipeSchedule::gpipe, pp_deg, 1, m},
                                  PipelinePlan{PipeSchedule::one_f_one_b, pp_deg, 1, m + 1},
                                  PipelinePlan{PipeSchedule::interleaved, pp_deg, 2, m},
                                  PipelinePlan{PipeSchedule::interleaved, pp_deg, 3, pp_deg}}) {
      if (p.vp > 1 && pp_deg == 1) continue;
      for (int c = 0; c < p.vp; c++) {
        int s = stage_of(p, pp.rank(), c);
        sends += p.micro_batches * ((s < p.stages() - 1) + (s > 0));
      }
    }
    EXPECT_EQ(ledger.bytes["pp_send"], 2 * 4 * kWidth * sends);  // both postings
    mesh.free();
  }
}

// The toy in float with every stage-to-stage message rounded to the 16-bit format h (the activation
// forward, its gradient backward), as a 16-bit wire sends it: dL/dw_s summed over micro-batches.
static std::vector<float> reference_grads_half_wire(int S, int m, exatrain::Half h) {
  namespace hc = exatrain::half_convert;
  auto wire = [h](float v) {
    return h == exatrain::Half::bf16 ? hc::bf16_to_f32(hc::f32_to_bf16(v)) : hc::f16_to_f32(hc::f32_to_f16(v));
  };
  std::vector<float> dw(S, 0.f);
  for (int mb = 0; mb < m; mb++) {
    std::vector<std::vector<float>> xs(S, std::vector<float>(kWidth));  // stage inputs
    for (int64_t i = 0; i < kWidth; i++) xs[0][i] = static_cast<float>(input(mb, i));
    for (int s = 0; s + 1 < S; s++)
      for (int64_t i = 0; i < kWidth; i++) xs[s + 1][i] = wire(std::tanh(static_cast<float>(weight(s)) * xs[s][i]));
    std::vector<float> g(kWidth, 1.0f);
    for (int s = S - 1; s >= 0; s--)
      for (int64_t i = 0; i < kWidth; i++) {
        const float w = static_cast<float>(weight(s)), y = std::tanh(w * xs[s][i]), dpre = g[i] * (1 - y * y);
        dw[s] += dpre * xs[s][i];
        g[i] = wire(dpre * w);
      }
  }
  return dw;
}

// A BufferPool with a 16-bit wire (the trainer's under mixed precision, [train] pipeline_dtype =
// "auto"): every message crosses in the format (bf16 or fp16), so the gradients are those of the toy
// with each message rounded to it (not the fp32 ones, nor the other format's), and pp_send counts 2
// bytes per element.
TEST(PipelineMpi, SixteenBitWireRoundsEveryMessageOnceAndSendsHalfTheBytes) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  if (W < 2) GTEST_SKIP() << "needs a pipeline";
  for (exatrain::Half h : {exatrain::Half::bf16, exatrain::Half::f16})
  for (const PipelinePlan& plan : {PipelinePlan{PipeSchedule::one_f_one_b, W, 1, W + 1},
                                   PipelinePlan{PipeSchedule::interleaved, W, 2, W}}) {
    CommLedger ledger;
    MpiGroup pp(MPI_COMM_WORLD, "pp", &ledger, nullptr);
    float loss = 0;
    const std::vector<float> dw = run_toy(pp, plan, 0, &loss, nullptr, h);
    const std::vector<float> want = reference_grads_half_wire(plan.stages(), plan.micro_batches, h);
    double ref_loss = 0;
    const std::vector<double> fp32 = reference_grads(plan.stages(), plan.micro_batches, &ref_loss);
    int64_t sends = 0;
    for (int c = 0; c < plan.vp; c++) {
      const int s = stage_of(plan, pp.rank(), c);
      EXPECT_NEAR(dw[c], want[s], 1e-6 * (1 + std::fabs(want[s]))) << "stage " << s;
      // The first stage's gradient has come through every rounded message: far from the fp32 one
      // (bf16 steps are 2^-8, fp16's 2^-11).
      if (s == 0) {
        EXPECT_GT(std::fabs(dw[c] - fp32[0]), 1e-5 * std::fabs(fp32[0])) << "stage 0: not rounded?";
      }
      sends += plan.micro_batches * ((s < plan.stages() - 1) + (s > 0));
    }
    EXPECT_EQ(ledger.bytes["pp_send"], 2 * kWidth * sends);
  }
}

TEST(PipelineMpi, TraceShowsEveryRanksScheduleInOrder) {
  int W = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (W < 2) GTEST_SKIP() << "needs a pipeline";
  MpiGroup pp(MPI_COMM_WORLD, "pp", nullptr, nullptr);
  PipelinePlan plan{PipeSchedule::interleaved, W, 2, W};
  std::vector<TraceEvent> events;
  MPI_Barrier(MPI_COMM_WORLD);
  PipelineTiming timing;
  timing.events = &events;
  timing.trace_origin = MPI_Wtime();
  run_and_check(pp, plan, &timing);
  EXPECT_GT(timing.compute_s, 0.0);
  // The compute events on this rank follow the table's compute order exactly.
  std::vector<std::string> want, got;
  PipelineTable table = build_pipeline(plan);  // named: a temporary's member would dangle
  for (const Action& a : table.ranks[me])
    if (is_compute(a.kind))
      want.push_back(fmt::format("{} mb{} c{}", a.kind == ActionKind::forward ? "F" : "B", a.mb,
                                 a.chunk));
  for (const TraceEvent& e : events)
    if (e.cat == "compute") got.push_back(e.name);
  EXPECT_EQ(got, want);
  long pid = static_cast<long>(getpid());  // rank 0's pid names the file
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  std::string path = fmt::format("/tmp/exatrain_trace_test_{}.json", pid);
  write_chrome_trace(MPI_COMM_WORLD, events, path);
  if (me == 0) {
    std::ifstream f(path);
    nlohmann::json j = nlohmann::json::parse(f);
    std::vector<int> computes(W, 0);
    for (auto& e : j)
      if (e["ph"] == "X" && e["cat"] == "compute") computes[e["pid"].get<int>()]++;
    for (int r = 0; r < W; r++) EXPECT_EQ(computes[r], 2 * plan.micro_batches * plan.vp) << r;
    std::remove(path.c_str());
  }
}

TEST(PipelineMpi, DataParallelPipelinesWithBucketedAllReduceEqualOneProcess) {
  // dp x pp mesh: each replica runs its own micro-batches through its pipeline, the replica group
  // sums the stage gradients with the bucketed all-reduce; the result equals one process running
  // every micro-batch through every stage.
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  if (W < 4) GTEST_SKIP() << "needs dp >= 2 and pp >= 2";
  int pp_deg = 2, vp = 2, m = 4;
  Mesh mesh = Mesh::create(MPI_COMM_WORLD, resolve_mesh_shape(W, 1, 1, pp_deg, std::nullopt));
  int dp = mesh.shape.dp;
  CommLedger ledger;
  MpiGroup pp(mesh.pp_comm, "pp", &ledger, nullptr), replicas(mesh.replica_comm, "dp", &ledger, nullptr);
  PipelinePlan plan{PipeSchedule::interleaved, pp_deg, vp, m};
  float loss = 0;
  std::vector<float> dw = run_toy(pp, plan, mesh.coord.dp * m, &loss, nullptr);
  IdentityCompressor dense;
  GradBucketer bucketer(backend(), replicas, dense, dw.data(), vp, 1);  // one bucket per chunk's weight
  for (int c = vp - 1; c >= 0; c--) bucketer.mark_ready(c, 1);
  bucketer.finish(1.0f);  // the loss is a sum over all micro-batches: no 1/dp
  double ref_loss = 0;
  std::vector<double> ref = reference_grads(plan.stages(), dp * m, &ref_loss);
  for (int c = 0; c < vp; c++) {
    double want = ref[stage_of(plan, pp.rank(), c)];
    EXPECT_NEAR(dw[c], want, 1e-5 * (1 + std::fabs(want))) << "chunk " << c;
  }
  EXPECT_EQ(ledger.calls["dp_all_reduce"], vp);
  mesh.free();
}
