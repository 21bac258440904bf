// Muon (optim/muon.hpp) on 2 or 4 ranks, through the job (train.optimizer = "muon"):
//   A. dp 2 (np 2) and dp 4 (np 4) under ZeRO 0 and ZeRO 1 (each matrix orthogonalised whole on
//      its one owner, the update all-gathered), and dp2 x pp2 (np 4), have the 10 losses of the
//      single-rank run on the same global batch (1e-5 relative); the same single-rank job with
//      AdamW differs by more than 1e-3 (Muon is what ran);
//   B. tensor parallelism, per-shard Newton-Schulz (the documented approximation): tp2 runs, its
//      losses are finite and differ from tp 1's (> 1e-6: the shards were orthogonalised alone),
//      and at np 4 dp2 x tp2 (ZeRO 0 and 1) and tp2 x pp2 agree with each other (1e-5);
//   C. exact resume: saved at step 5 and resumed at the same configuration, steps 6-10 have the
//      uninterrupted run's losses and final weights bit for bit; resumed at another dp (np 2:
//      dp2 -> pp2 at dp 1; np 4: dp4 ZeRO 1 -> dp2 x pp2 ZeRO 0) to 1e-5; resumed there with the
//      optimizer state zeroed after the load, they differ by more than 1e-6 (the state was loaded);
//   D. ZeRO 2 and 3 at dp = world are refused with the reason.
// `--backend cpu-guarded`: the same on the guarded backend. Exits non-zero on any mismatch.
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "dist_common.hpp"
#include "train/checkpoint_io.hpp"
#include "train/every_rank.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using dist_test::Config;

namespace {

using dist_test::report;
using dist_test::worst_over_ranks;

constexpr int kSteps = 10, kHalf = 5;

Job muon_job(const Config& c) {
  Job j = dist_test::job_for(c, kSteps);
  j.train.optimizer = "muon";
  return j;
}

std::vector<double> losses_of(Backend& be, const Config& c) {
  dist_test::DistRun r = dist_test::make_run(be, muon_job(c));
  std::vector<double> l;
  for (int s = 0; s < kSteps; s++) l.push_back(r.trainer->train_step().loss);
  return l;
}

std::string trace(const std::vector<double>& a) {
  std::string s;
  for (double x : a) s += fmt::format(" {:.6f}", x);
  return s;
}

// A: every data-parallel configuration of this world against the single-rank run.
int equivalence(Backend& be, int world, int rank) {
  std::vector<Config> cs;
  for (int zero : {0, 1}) {
    Config c;
    c.dp = world, c.zero = zero, c.micro_batches = 8 / world;
    cs.push_back(c);
  }
  if (world == 4) {
    Config c;
    c.dp = 2, c.pp = 2, c.zero = 1, c.micro_batches = 4;
    cs.push_back(c);
  }
  const dist_test::Reference ref = dist_test::run_single_rank(muon_job(cs[0]));
  Job adamw = dist_test::job_for(cs[0], kSteps);
  const dist_test::Reference ref_adamw = dist_test::run_single_rank(adamw);
  int failures = 0;
  const double d_adamw = worst_over_ranks(ref_adamw.losses, ref.losses);
  failures += report(d_adamw > 1e-3, fmt::format("A: single-rank muon vs adamw losses differ by {:.2e} (must be > 1e-3); "
                                                 "muon:{}", d_adamw, trace(ref.losses)), rank);
  for (const Config& c : cs) {
    const double d = worst_over_ranks(losses_of(be, c), ref.losses);
    failures += report(d <= 1e-5, fmt::format("A: [{}] vs single rank: loss rel diff {:.2e} (tolerance 1e-5)", c.name(), d),
                       rank);
  }
  return failures;
}

// B: tensor parallelism with per-shard Newton-Schulz.
int tensor_parallel(Backend& be, int world, int rank) {
  Config tp2;
  tp2.tp = 2, tp2.dp = world / 2, tp2.micro_batches = 8 / tp2.dp;
  const std::vector<double> l = losses_of(be, tp2);
  Config tp1 = tp2;
  tp1.tp = 1, tp1.dp = 1, tp1.micro_batches = 8;
  const dist_test::Reference ref = dist_test::run_single_rank(muon_job(tp1));
  const double d = worst_over_ranks(l, ref.losses);
  bool finite = true;
  for (double x : l) finite = finite && std::isfinite(x);
  int failures = report(finite && d > 1e-6,
                        fmt::format("B: [{}] (per-shard Newton-Schulz) vs tp 1: loss rel diff {:.2e} (must be > 1e-6, "
                                    "finite):{}", tp2.name(), d, trace(l)), rank);
  if (world != 4) return failures;
  Config z1 = tp2, tp2_pp2;
  z1.zero = 1;
  tp2_pp2.tp = 2, tp2_pp2.pp = 2, tp2_pp2.micro_batches = 8;
  for (const Config& c : {z1, tp2_pp2}) {
    const double e = worst_over_ranks(losses_of(be, c), l);
    failures += report(e <= 1e-5, fmt::format("B: [{}] vs [{}]: loss rel diff {:.2e} (tolerance 1e-5)", c.name(),
                                              tp2.name(), e), rank);
  }
  return failures;
}

// C: save at kHalf at `save`, resume at `save` (bit for bit) and at `other` (1e-5).
int resume(Backend& be, const Config& save, const Config& other, const std::string& dir, int rank) {
  const dist_test::SavedRun a = dist_test::run_saving_at(be, muon_job(save), kSteps, kHalf, dir);
  const std::vector<double>& ref = a.losses;
  int failures = 0;
  for (int k = 0; k < 3; k++) {
    const Config& c = k == 0 ? save : other;
    dist_test::DistRun b = dist_test::resumed_run(be, muon_job(c), a.checkpoint);
    if (k == 2)  // the momentum buffers and AdamW moments zeroed: the state must matter
      for (const EntryStateTensor& e : b.trainer->optimizer().entry_state_tensors())
        be.zero(e.data, sizeof(float) * size_t(e.numel()));
    std::vector<double> got(ref.begin(), ref.begin() + kHalf);
    for (int s = kHalf; s < kSteps; s++) got.push_back(b.trainer->train_step().loss);
    if (k == 0) {
      int mine = got == ref && dist_test::host_params(b.trainer->model()) == dist_test::host_params(a.run.trainer->model());
      int all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      failures += report(all, fmt::format("C: saved at [{}] step {}, resumed there: steps 6-10 losses and final weights "
                                          "bit for bit: {} (resumed{} / uninterrupted{})", save.name(), kHalf,
                                          all ? "equal" : "DIFFER", trace(got), trace(ref)), rank);
    } else if (k == 2) {
      const double d = worst_over_ranks(got, ref);
      failures += report(d > 1e-6, fmt::format("C: the same with the optimizer state zeroed after the load: steps 6-10 "
                                               "loss rel diff {:.2e} (must be > 1e-6)", d), rank);
    } else {
      const double d = worst_over_ranks(got, ref);
      failures += report(d <= 1e-5, fmt::format("C: saved at [{}] step {}, resumed at [{}]: steps 6-10 loss rel diff "
                                                "{:.2e} (tolerance 1e-5)", save.name(), kHalf, c.name(), d), rank);
    }
  }
  return failures;
}

// D: ZeRO 2 and 3 cut matrices across the dp ranks.
int zero23_refused(Backend& be, int world, int rank) {
  int failures = 0;
  for (int zero : {2, 3}) {
    Config c;
    c.dp = world, c.zero = zero, c.micro_batches = 8 / world;
    const std::string err = dist_test::refusal(be, muon_job(c));
    const bool ok = err.find(fmt::format("[parallel] zero = {} with [train] optimizer = \"muon\"", zero)) !=
                        std::string::npos && err.find("expected zero = 0 or 1") != std::string::npos;
    failures += report(ok, fmt::format("D: [{}] refused: {}", c.name(), err.empty() ? "(not refused)" : err), rank);
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  std::unique_ptr<Backend> be = dist_test::test_backend(argc, argv);
  EXA_CHECK(mpi.size == 2 || mpi.size == 4, "dist_muon runs on 2 or 4 ranks, not {}", mpi.size);
  const std::string root = dist_test::shared_temp_dir("dist-muon");

  int failures = equivalence(*be, mpi.size, mpi.rank) + tensor_parallel(*be, mpi.size, mpi.rank);
  Config save, other;
  save.dp = mpi.size, save.zero = 1, save.micro_batches = 8 / mpi.size;
  if (mpi.size == 2) other.pp = 2, other.micro_batches = 8;            // dp 2 -> dp 1
  else other.dp = 2, other.pp = 2, other.micro_batches = 4;            // dp 4 -> dp 2
  failures += resume(*be, save, other, root + "/C", mpi.rank);
  failures += zero23_refused(*be, mpi.size, mpi.rank);

  MPI_Barrier(MPI_COMM_WORLD);
  if (mpi.rank == 0) std::filesystem::remove_all(root);
  if (mpi.rank == 0) std::printf("%d failures (backend %s)\n", failures, be->name());
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
