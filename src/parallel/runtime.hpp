// Everything a rank needs to communicate, built once at start-up from a RuntimePlan: the mesh,
// one Group per axis (tp, cp, pp and the dp x cp replica group named "dp", as the planner counts
// it), one byte ledger shared by all of them and the watchdog. The training loop owns one.
// MPI must be initialised with MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...) or higher: the
// watchdog thread never calls MPI, and OpenMP kernels run between MPI calls of the main thread.
#pragma once
#include <memory>

#include "parallel/comm.hpp"
#include "parallel/mesh.hpp"
#include "parallel/setup.hpp"
#include "parallel/watchdog.hpp"

namespace exatrain::parallel {

struct RuntimeOptions {
  double watchdog_timeout_s = 300;  // 0 = no watchdog
  bool abort_on_stall = true;
};

class ParallelRuntime {
 public:
  // Collective over `world` (MPI_Comm_split per axis).
  ParallelRuntime(MPI_Comm world, const RuntimePlan& plan, const RuntimeOptions& opts = {});
  ~ParallelRuntime();
  ParallelRuntime(const ParallelRuntime&) = delete;
  ParallelRuntime& operator=(const ParallelRuntime&) = delete;

  const RuntimePlan& plan() const { return plan_; }
  const Mesh& mesh() const { return mesh_; }
  CommLedger& ledger() { return ledger_; }
  Watchdog* watchdog() { return watchdog_.get(); }  // null when off
  Group& tp() { return *tp_; }
  Group& cp() { return *cp_; }
  Group& dp() { return *dp_; }  // the replica group: dp x cp ranks with the same weights
  Group& pp() { return *pp_; }
  // True on the pipeline rank that runs the last stage's loss (pp rank pp-1 for every schedule).
  bool holds_loss() const { return mesh_.coord.pp == plan_.mesh.pp - 1; }

 private:
  RuntimePlan plan_;
  Mesh mesh_;
  CommLedger ledger_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Group> tp_, cp_, dp_, pp_;
};

}  // namespace exatrain::parallel
