// Everything a rank needs to communicate, built once at start-up from the plan's mesh: one Group
// per axis (tp, cp, pp and the dp x cp replica group named "dp", as the planner counts it), a
// "world" group for the step's control values (loss, norm, timings), one byte ledger shared by
// all of them and the watchdog. The session (or a test) builds one and hands it to the Trainer.
// MPI must be initialised with MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...) or higher: the
// watchdog thread never calls MPI, and OpenMP kernels run between MPI calls of the main thread.
// ParallelRuntime::local() is the world of one process without MPI (groups of one rank, which
// communicate nothing): a single-rank trainer built without mpirun.
//
// Owns: the groups and their ledger. May use: backend/, plan/ (the mesh arithmetic), parallel/.
//
// Room parallel/ — Owns: the MPI side of the runtime and the data-parallel strategies: the
// realised mesh, the Group interface and MpiGroup, this runtime, the tensor-parallel regions and
// hooks, ZeRO layouts and gradient buckets, the GradSync strategies (grad_sync.hpp) and the
// compressor slot (compressor.hpp), pipeline schedules and executor, watchdog, traces.
// May use: core/, job/, plan/, backend/, model/, optim/, and MPI.
#pragma once
#include <memory>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/mesh.hpp"
#include "parallel/watchdog.hpp"

namespace exatrain::parallel {

struct RuntimeOptions {
  double watchdog_timeout_s = 300;  // 0 = no watchdog
  bool abort_on_stall = true;
};

class ParallelRuntime {
 public:
  // Collective over `world` (MPI_Comm_split per axis). `memory`: the backend whose device memory
  // the groups' buffers live in (they reach it only inside its host-access scopes).
  ParallelRuntime(MPI_Comm world, const MeshShape& shape, Backend& memory, const RuntimeOptions& opts = {});
  // One process, no MPI.
  static std::unique_ptr<ParallelRuntime> local(Backend& memory);
  ~ParallelRuntime();
  ParallelRuntime(const ParallelRuntime&) = delete;
  ParallelRuntime& operator=(const ParallelRuntime&) = delete;

  const Mesh& mesh() const { return mesh_; }
  const MeshShape& shape() const { return mesh_.shape; }
  CommLedger& ledger() { return ledger_; }
  Watchdog* watchdog() { return watchdog_.get(); }  // null when off
  Group& tp() { return *tp_; }
  Group& cp() { return *cp_; }
  Group& dp() { return *dp_; }  // the replica group: dp x cp ranks with the same weights
  Group& pp() { return *pp_; }
  Group& world() { return *world_; }
  // True on the pipeline rank that runs the last stage's loss (pp rank pp-1 for every schedule).
  bool holds_loss() const { return mesh_.coord.pp == mesh_.shape.pp - 1; }

 private:
  ParallelRuntime() = default;
  Mesh mesh_;
  CommLedger ledger_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Group> tp_, cp_, dp_, pp_, world_;
};

}  // namespace exatrain::parallel
