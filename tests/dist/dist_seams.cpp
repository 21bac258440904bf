// The seams of the trainer under mpirun (2 and 4 ranks, all data-parallel):
//   1. The compressor slot (parallel/compressor.hpp) takes a second compressor: the bf16 reduction
//      of [train] grad_reduce_dtype = "bf16" (Bf16ReduceCompressor: fp32 -> bf16, the sum over dp in
//      bf16, bf16 -> fp32), non-blocking, its Reduction finishing the conversion when test() or
//      wait() sees the collective done.
//      a. One bucket on its own, all-reduce and reduce-scatter: the result equals the host
//         emulation (the bf16 values of every rank summed in fp32 and rounded to bf16 at each
//         pairwise step) exactly on 2 ranks (one addition: no order to choose) and to the bf16
//         rounding of the sum on 4; the ledger counts exactly half the identity's bytes.
//      b. Training under ZeRO 0, 1 and 2 with grad_reduce_dtype = "bf16" (the job key) against
//         "fp32": the first loss equals the identity run's bit for bit
//         (it is computed before any reduction), the later ones differ (the gradients are
//         rounded) but by less than 1 %, and the bucket collectives' bytes are exactly half of
//         the identity's while the parameter all-gathers (fp32, not compressed) are unchanged.
//   2. ZeRO 1 with shards cut between parameter entries (TrainerOptions::align_shards_to_entries,
//      one owner per matrix, as Muon and Shampoo need): the same losses and final weights as one rank
//      (1e-5), the shards of unequal size (not the equal layout), a compressor refused with them, every
//      saved optimizer-state slice begins and ends on an entry boundary, and the ranks' slices
//      tile each arena exactly once.
// Exits non-zero on any mismatch.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/check.hpp"
#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "parallel/compressor.hpp"
#include "parallel/mpi_group.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using namespace exatrain::parallel;
using dist_test::Config;

namespace {

float bf16_round(float f) {  // round to nearest even, as Backend::f32_to_bf16 (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

float value(int rank, int64_t i) { return float(std::sin(0.37 * double(i) + 1.3 * rank) + 0.01 * rank); }

bool all_ok(bool ok) {
  int mine = ok, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// 1a. One bucket through each compressor, on device memory of `be`.
int isolated_bucket(Backend& be, int world, int rank) {
  int failures = 0;
  for (ReduceKind kind : {ReduceKind::all_reduce, ReduceKind::reduce_scatter}) {
    const int64_t shard = 301, n = kind == ReduceKind::all_reduce ? 1003 : shard * world;
    std::vector<float> host(static_cast<size_t>(n));
    std::map<std::string, int64_t> bytes;  // compressor -> bytes this rank sent
    std::vector<float> results[2];
    int which = 0;
    for (bool bf16 : {false, true}) {
      CommLedger ledger;
      MpiGroup dp(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be);
      std::unique_ptr<Compressor> c;
      if (bf16) c = std::make_unique<Bf16ReduceCompressor>();
      else c = std::make_unique<IdentityCompressor>();
      for (int64_t i = 0; i < n; i++) host[size_t(i)] = value(rank, i);
      DeviceBuffer buf(be, n, "test bucket");
      be.upload(buf.data(), host.data(), size_t(n) * 4);
      BucketReduce b;
      b.kind = kind, b.data = b.out = buf.data(), b.n = n, b.shard = shard;
      if (std::unique_ptr<Reduction> r = c->start(dp, be, b)) {
        while (!r->test()) {}
      }
      const int64_t got_n = kind == ReduceKind::all_reduce ? n : shard;
      results[which].assign(size_t(got_n), 0.f);
      be.download(results[which].data(), buf.data(), size_t(got_n) * 4);
      bytes[c->name()] = ledger.total_bytes();
      which++;
    }
    // The host emulation of the bf16 sum: every rank's values rounded to bf16, added in rank order
    // in fp32 with a rounding to bf16 after each addition.
    double worst = 0, worst_emu = 0;
    bool exact = true;
    const int64_t base = kind == ReduceKind::all_reduce ? 0 : rank * shard;
    for (size_t j = 0; j < results[1].size(); j++) {
      float emu = bf16_round(value(0, base + int64_t(j)));
      for (int r = 1; r < world; r++) emu = bf16_round(emu + bf16_round(value(r, base + int64_t(j))));
      exact = exact && results[1][j] == emu;
      // 4 ranks: another order of the additions; each rounding is within 2^-8 of its partial sum.
      double mag = 0;
      for (int r = 0; r < world; r++) mag += std::fabs(value(r, base + int64_t(j)));
      const double bound = mag * world / 128.0;
      worst = std::max(worst, std::fabs(double(results[1][j]) - double(results[0][j])) / bound);
      worst_emu = std::max(worst_emu, std::fabs(double(results[1][j]) - double(emu)) / bound);
    }
    const bool ok = all_ok((world != 2 || exact) && worst <= 1 && worst_emu <= 1 && bytes["none"] > 0 &&
                           bytes["bf16-reduce"] * 2 == bytes["none"]);
    failures += !ok;
    if (rank == 0)
      std::printf("%s np%d one bucket, %s: bf16 result %s the host emulation (worst %.2f of the rounding bound); "
                  "|bf16 - fp32| %.2f of the bound; bytes sent %lld (identity %lld)\n",
                  ok ? "OK  " : "FAIL", world, kind == ReduceKind::all_reduce ? "all-reduce" : "reduce-scatter",
                  world == 2 ? (exact ? "equals" : "DIFFERS from") : "(order of additions free) near", worst_emu,
                  worst, (long long)bytes["bf16-reduce"], (long long)bytes["none"]);
  }
  return failures;
}

// 1b. Training with each compressor under ZeRO `zero`.
int training_with_compressor(Backend& be, int world, int rank, int zero) {
  Config cfg;
  cfg.dp = world, cfg.zero = zero;
  const int steps = 4;
  const Job job = dist_test::job_for(cfg, steps);
  std::vector<double> losses[2];
  std::map<std::string, int64_t> bytes[2];
  for (int k = 0; k < 2; k++) {
    dist_test::DistRun run = dist_test::make_run(be, job, [&](TrainerOptions& o) {
      o.bucket_floats = 1000;
      if (k == 1) o.train.grad_reduce_dtype = "bf16";  // the job key: make_compressor's Bf16ReduceCompressor
    });
    for (int s = 0; s < steps; s++) {
      const StepMetrics m = run.trainer->train_step();
      losses[k].push_back(m.loss);
      if (s == steps - 1) bytes[k] = m.bytes;
    }
  }
  double worst = 0;
  bool differs = false;
  for (int s = 1; s < steps; s++) {
    worst = dist_test::worst_of(worst, dist_test::rel_diff(losses[1][size_t(s)], losses[0][size_t(s)]));
    differs = differs || losses[1][size_t(s)] != losses[0][size_t(s)];
  }
  // Bucket reductions: ZeRO 0 all-reduces the buckets, ZeRO 1 and 2 reduce-scatter them.
  const std::string reduced = zero == 0 ? "dp_all_reduce" : "dp_reduce_scatter";
  const bool halved = bytes[0][reduced] > 0 && 2 * bytes[1][reduced] == bytes[0][reduced];
  const bool gathers_same = bytes[1]["dp_all_gather"] == bytes[0]["dp_all_gather"];
  const bool ok = all_ok(losses[1][0] == losses[0][0] && differs && worst < 1e-2 && halved && gathers_same);
  if (rank == 0)
    std::printf("%s np%d zero %d, grad_reduce_dtype bf16 vs fp32: first loss %s, later losses %s, worst rel "
                "diff %.2e (< 1e-2); %s bytes %lld vs %lld (half: %s), dp_all_gather %lld vs %lld\n",
                ok ? "OK  " : "FAIL", world, zero, losses[1][0] == losses[0][0] ? "identical" : "DIFFERENT",
                differs ? "differ" : "IDENTICAL (the compressor was not used)", worst, reduced.c_str(),
                (long long)bytes[1][reduced], (long long)bytes[0][reduced], halved ? "yes" : "NO",
                (long long)bytes[1]["dp_all_gather"], (long long)bytes[0]["dp_all_gather"]);
  return !ok;
}

// 2. ZeRO 1 with shards cut between entries.
int aligned_zero1(Backend& be, int world, int rank) {
  Config cfg;
  cfg.dp = world, cfg.zero = 1;
  const int steps = 4;
  Job job = dist_test::job_for(cfg, steps);
  job.train.eps = 1e-5;  // as dist_equivalence: rounding-level differences stay below 1e-5
  const dist_test::Reference ref = dist_test::run_single_rank(job);
  dist_test::DistRun run = dist_test::make_run(be, job, [](TrainerOptions& o) { o.align_shards_to_entries = true; });
  Trainer& trainer = *run.trainer;
  double worst = 0;
  for (int s = 0; s < steps; s++)
    worst = dist_test::worst_of(worst, dist_test::rel_diff(trainer.train_step().loss, ref.losses[size_t(s)]));
  // Every saved slice on entry boundaries; the saved elements of each (chunk, state) over all
  // ranks add up to the arena (each element saved by exactly one rank: the slices tile it).
  std::string problems;
  std::map<std::pair<int, int>, int64_t> saved;  // (chunk, state) -> elements this rank saves
  int64_t slices = 0;
  for (const StateSlice& sl : trainer.state_slices()) {
    if (!sl.saver) continue;
    slices++;
    std::set<int64_t> cuts;
    for (const ParamInfo& p : trainer.chunk(sl.chunk).layout().entries()) cuts.insert(p.offset), cuts.insert(p.offset + p.numel);
    if (!cuts.count(sl.begin) || !cuts.count(sl.end))
      problems += fmt::format(" slice [{}, {}) of chunk {} state {} cuts an entry;", sl.begin, sl.end, sl.chunk, sl.state);
    saved[{sl.chunk, sl.state}] += sl.end - sl.begin;
  }
  bool tiles = true, unequal = false;  // unequal: the shards are not ZeroLayout::make's equal ones
  for (auto& [key, n] : saved) {
    int64_t total = 0, smallest = 0, largest = 0;
    MPI_Allreduce(&n, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&n, &smallest, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&n, &largest, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    tiles = tiles && total == trainer.chunk(key.first).num_params();
    unequal = unequal || smallest != largest;
  }
  const dist_test::WeightErrors we = dist_test::weight_errors(trainer.chunk(0), ref);
  worst = dist_test::worst_of(dist_test::worst_of(worst, we.norm_rel), we.max_rel);
  // A compressor cannot take these unequal shards: refused when the trainer is built, by name.
  std::string refusal;
  try {
    dist_test::make_run(be, job, [](TrainerOptions& o) {
      o.align_shards_to_entries = true;
      o.compressor = std::make_shared<Bf16ReduceCompressor>();
    });
  } catch (const Error& e) {
    refusal = e.what();
  }
  if (refusal.find("compressor \"bf16-reduce\" needs equal shards") == std::string::npos)
    problems += " a compressor with shards cut between entries was not refused by name (\"" + refusal + "\");";
  if (!problems.empty()) std::printf("rank %d:%s\n", rank, problems.c_str());
  double w = 0;
  MPI_Allreduce(&worst, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const bool ok = all_ok(problems.empty() && tiles && unequal && slices > 0) && w <= 1e-5;
  if (rank == 0)
    std::printf("%s np%d zero 1, shards cut between entries: losses and final weights against one rank %.2e; every "
                "saved slice on entry boundaries: %s; the ranks' slices tile each arena: %s; shards of unequal size: %s\n",
                ok ? "OK  " : "FAIL", world, w, problems.empty() ? "yes" : "NO", tiles ? "yes" : "NO",
                unequal ? "yes" : "NO (not the aligned layout)");
  return !ok;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  std::unique_ptr<Backend> be = dist_test::test_backend(argc, argv);
  int failures = isolated_bucket(*be, mpi.size, mpi.rank);
  for (int zero : {0, 1, 2}) failures += training_with_compressor(*be, mpi.size, mpi.rank, zero);
  failures += aligned_zero1(*be, mpi.size, mpi.rank);
  if (mpi.rank == 0) std::printf("%d failures (backend %s)\n", failures, be->name());
  MPI_Finalize();
  return failures == 0 && mpi.size >= 2 ? 0 : 1;
}
