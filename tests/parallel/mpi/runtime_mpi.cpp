// Under mpirun: a ParallelRuntime built from a parsed job file has groups of the right sizes and
// one ledger that books every group's traffic under its own kind.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include "job/parse.hpp"
#include "backend/backend.hpp"
#include "parallel/runtime.hpp"
#include "plan/resolve.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

TEST(RuntimeMpi, BuildsTheMeshFromTheJobAndBooksEachGroup) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  int tp = W >= 2 ? 2 : 1, pp = W >= 4 ? 2 : 1;
  Job job = parse_job(fmt::format("[model]\nlayers = 4\nhidden = 32\nheads = 4\nffn_hidden = 64\n"
                                  "seq_len = 8\nvocab = 50\n"
                                  "[parallel]\ngpus = {}\ntp = {}\npp = {}\ncp = 1\nvp = 1\n"
                                  "zero = 1\nmicro_batch = 1\nglobal_batch = {}\n"
                                  "recompute = \"none\"\nseq_parallel = false\nschedule = \"1f1b\"\n",
                                  W, tp, pp, 4 * W),
                      "runtime.toml");
  const plan::Plan plan = plan::plan_from_job(job, W);
  auto be = make_cpu_backend(1);
  ParallelRuntime rt(MPI_COMM_WORLD, MeshShape{int(plan.tp), int(plan.cp), int(plan.dp), int(plan.pp)}, *be,
                     {/*watchdog_timeout_s=*/60, true});
  EXPECT_EQ(rt.tp().size(), tp);
  EXPECT_EQ(rt.pp().size(), pp);
  EXPECT_EQ(rt.dp().size(), W / (tp * pp));
  EXPECT_EQ(rt.holds_loss(), rt.mesh().coord.pp == pp - 1);
  std::vector<float> x(16, 1.0f);
  rt.tp().all_reduce_sum(x.data(), 16);
  rt.dp().all_reduce_sum(x.data(), 16);
  EXPECT_EQ(x[0], static_cast<float>(tp * (W / (tp * pp))));
  EXPECT_EQ(rt.ledger().bytes["tp_all_reduce"], tp > 1 ? 4 * 2 * 16 * (tp - 1) / tp : 0);
  int dp = W / (tp * pp);
  EXPECT_EQ(rt.ledger().bytes["dp_all_reduce"], dp > 1 ? 4 * 2 * 16 * (dp - 1) / dp : 0);
}
