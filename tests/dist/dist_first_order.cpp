// SGD, Lion, LAMB, Adafactor (optim/first_order.hpp), Shampoo (optim/shampoo.hpp, its roots
// refreshed every 2 steps from step 3, so the resume at step 5 restores roots mid-interval), SOAP
// (optim/soap.hpp, bases refreshed every 2 steps, on the matrices with AdamW elsewhere) and a mixed order (optim/mixed.hpp: Lion on
// every entry to step 6, then SOAP on the matrices: the resume at 5 crosses the switch) on 2
// or 4 ranks, through the job (train.optimizer = ...), each with its own learning rate:
//   A. dp = world under every ZeRO stage the optimizer allows (SGD and Lion are elementwise: ZeRO
//      0-3; LAMB, Adafactor and Shampoo need whole entries: ZeRO 0 and 1, each entry updated by its one
//      owner) has the 10 losses of the single-rank run on the same global batch (1e-5 relative);
//      the single-rank run differs from AdamW's by more than 1e-3 (the optimizer is what ran);
//   B. exact resume: saved at step 5 at dp = world ZeRO 1 and resumed there, steps 6-10 have the
//      uninterrupted run's losses and final weights bit for bit; resumed at another dp (np 2:
//      pp 2 at dp 1; np 4: dp2 x pp2) to 1e-5;
//   C. LAMB, Adafactor and Shampoo: ZeRO 2 and 3 at dp = world are refused with the reason.
// Exits non-zero on any mismatch.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "dist_common.hpp"
#include "train/every_rank.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using dist_test::Config;

namespace {

using dist_test::report;
using dist_test::worst_over_ranks;

constexpr int kSteps = 10, kHalf = 5;

struct Case {
  const char* optimizer;
  double lr;          // each optimizer's own scale (SGD's is larger, Lion's smaller than AdamW's)
  bool whole_entries;  // LAMB, Adafactor, Shampoo, SOAP
  const char* others = "";         // [optimizer] others: mixed order
  int64_t first_order_steps = 0;   // [optimizer] first_order_steps
  // A against the single-rank run, and B at another layout. SOAP's eigenvectors move by (rounding) / (eigenvalue gap) when
  // the reduced gradient changes by a rounding, and Adam in that basis is not rotation invariant:
  // dp 2 and 4 differ from dp 1 by 3e-6 to 2.2e-5 (measured, 10 steps; a resume at another dp
  // whose SOAP starts after it, 1e-5); 5e-5 for SOAP.
  double tolerance = 1e-5;
  std::string label() const {
    return std::string(optimizer) + (*others ? std::string("+") + others : "") +
           (first_order_steps ? "@" + std::to_string(first_order_steps) : "");
  }
};

Job job_of(const Case& k, const Config& c) {
  Job j = dist_test::job_for(c, kSteps);
  j.train.optimizer = k.optimizer;
  j.train.lr = k.lr;
  j.train.adafactor.beta1 = 0.9;  // the first moment too: more state through the checkpoint
  j.train.shampoo.start_preconditioning_step = 3, j.train.shampoo.precondition_frequency = 2;
  j.train.shampoo.max_preconditioner_dim = 24;  // several blocks on the tiny model's matrices
  j.train.soap.precondition_frequency = 2;
  // SOAP rotates only the layers' matrices (others = adamw or lion below) and only their sides of
  // at most 32 (the hidden size): a longer side's factor starts rank-deficient (rank <= the shorter
  // side; the position embedding [16, 32] always is), its null-space eigenvectors are arbitrary, and
  // runs that differ only in their reduction order pick different ones (measured: 1.9e-4 relative
  // in the loss at dp 2 against dp 1 with every side of every 2-D entry rotated, 8.4e-5 with the
  // sides up to 32; docs/optimizers.md).
  j.train.soap.max_preconditioner_dim = 32;
  j.train.mixed.others = k.others, j.train.mixed.first_order_steps = k.first_order_steps;
  return j;
}

// A and C: every ZeRO stage at dp = world against the single-rank run, or refused.
int equivalence(Backend& be, const Case& k, int world, int rank) {
  Config one;
  one.micro_batches = 8;
  const dist_test::Reference ref = dist_test::run_single_rank(job_of(k, one));
  const dist_test::Reference adamw = dist_test::run_single_rank(dist_test::job_for(one, kSteps));
  int failures = report(worst_over_ranks(adamw.losses, ref.losses) > 1e-3,
                        fmt::format("A: {} single rank differs from adamw by {:.2e} (must be > 1e-3)", k.label(),
                                    worst_over_ranks(adamw.losses, ref.losses)), rank);
  for (int zero = 0; zero <= 3; zero++) {
    Config c;
    c.dp = world, c.zero = zero, c.micro_batches = 8 / world;
    if (k.whole_entries && zero >= 2) {
      const std::string err = dist_test::refusal(be, job_of(k, c));
      const bool ok = err.find(fmt::format("[parallel] zero = {} with [train] optimizer = \"{}\"", zero, k.optimizer)) !=
                      std::string::npos && err.find("expected zero = 0 or 1") != std::string::npos;
      failures += report(ok, fmt::format("C: {} [{}] refused: {}", k.label(), c.name(), err.empty() ? "(not refused)" : err),
                         rank);
      continue;
    }
    dist_test::DistRun r = dist_test::make_run(be, job_of(k, c));
    std::vector<double> l;
    for (int s = 0; s < kSteps; s++) l.push_back(r.trainer->train_step().loss);
    const double d = worst_over_ranks(l, ref.losses);
    failures += report(d <= k.tolerance, fmt::format("A: {} [{}] vs single rank: loss rel diff {:.2e} (tolerance {:.0e})",
                                                     k.label(), c.name(), d, k.tolerance), rank);
  }
  return failures;
}

// B: save at kHalf at `save`, resume at `save` (bit for bit) and at `other` (1e-5).
int resume(Backend& be, const Case& k, const Config& save, const Config& other, const std::string& dir, int rank) {
  const dist_test::SavedRun a = dist_test::run_saving_at(be, job_of(k, save), kSteps, kHalf, dir);
  const std::vector<double>& ref = a.losses;
  int failures = 0;
  for (const Config* c : {&save, &other}) {
    dist_test::DistRun b = dist_test::resumed_run(be, job_of(k, *c), a.checkpoint);
    std::vector<double> got(ref.begin(), ref.begin() + kHalf);
    for (int s = kHalf; s < kSteps; s++) got.push_back(b.trainer->train_step().loss);
    if (c == &save) {
      int mine = got == ref && dist_test::host_params(b.trainer->model()) == dist_test::host_params(a.run.trainer->model());
      int all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      failures += report(all, fmt::format("B: {} saved at [{}] step {}, resumed there: steps 6-10 and final weights "
                                          "bit for bit: {}", k.label(), save.name(), kHalf, all ? "equal" : "DIFFER"),
                         rank);
    } else {
      const double d = worst_over_ranks(got, ref);
      failures += report(d <= k.tolerance, fmt::format("B: {} saved at [{}] step {}, resumed at [{}]: steps 6-10 "
                                                       "loss rel diff {:.2e} (tolerance {:.0e})", k.label(), save.name(),
                                                       kHalf, c->name(), d, k.tolerance), rank);
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  std::unique_ptr<Backend> be = dist_test::test_backend(argc, argv);
  EXA_CHECK(mpi.size == 2 || mpi.size == 4, "dist_first_order runs on 2 or 4 ranks, not {}", mpi.size);
  const std::string root = dist_test::shared_temp_dir("dist-first-order");

  const Case cases[] = {{"sgd", 0.05, false}, {"lion", 1e-4, false}, {"lamb", 6e-4, true}, {"adafactor", 6e-4, true},
                        {"shampoo", 6e-4, true}, {"soap", 6e-4, true, "adamw", 0, 5e-5},
                        {"soap", 6e-4, true, "lion", 6, 5e-5}};  // Lion everywhere to step 6, then SOAP on the matrices
  Config save, other;
  save.dp = mpi.size, save.zero = 1, save.micro_batches = 8 / mpi.size;
  if (mpi.size == 2) other.pp = 2, other.micro_batches = 8;
  else other.dp = 2, other.pp = 2, other.micro_batches = 4;
  int failures = 0;
  for (const Case& k : cases) {
    failures += equivalence(*be, k, mpi.size, mpi.rank);
    failures += resume(*be, k, save, other, root + "/" + k.label(), mpi.rank);
  }

  MPI_Barrier(MPI_COMM_WORLD);
  if (mpi.rank == 0) std::filesystem::remove_all(root);
  if (mpi.rank == 0) std::printf("%d failures (backend %s)\n", failures, be->name());
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
