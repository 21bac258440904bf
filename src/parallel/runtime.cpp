#include "parallel/runtime.hpp"

namespace exatrain::parallel {

ParallelRuntime::ParallelRuntime(MPI_Comm world, const RuntimePlan& plan, const RuntimeOptions& opts)
    : plan_(plan), mesh_(Mesh::create(world, plan.mesh)) {
  if (opts.watchdog_timeout_s > 0)
    watchdog_ = std::make_unique<Watchdog>(mesh_.world_rank, opts.watchdog_timeout_s,
                                           opts.abort_on_stall);
  Watchdog* wd = watchdog_.get();
  tp_ = std::make_unique<Group>(mesh_.tp_comm, "tp", &ledger_, wd);
  cp_ = std::make_unique<Group>(mesh_.cp_comm, "cp", &ledger_, wd);
  dp_ = std::make_unique<Group>(mesh_.replica_comm, "dp", &ledger_, wd);
  pp_ = std::make_unique<Group>(mesh_.pp_comm, "pp", &ledger_, wd);
}

ParallelRuntime::~ParallelRuntime() {
  tp_.reset();
  cp_.reset();
  dp_.reset();
  pp_.reset();
  mesh_.free();
}

}  // namespace exatrain::parallel
