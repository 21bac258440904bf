#include "parallel/runtime.hpp"

#include <cstring>

#include "core/check.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/nccl_group.hpp"

namespace exatrain::parallel {
namespace {

// A group of one rank: nothing to communicate (copies where the output is another buffer).
class SelfGroup final : public Group {
 public:
  SelfGroup(std::string name, Backend& be) : Group(std::move(name), 0, 1), be_(be) {}
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* in, void* out, int64_t shard, DType t) override { copy(out, in, shard, t); }
  void all_gather(const void* in, void* out, int64_t shard, DType t) override { copy(out, in, shard, t); }
  void reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& c, DType t) override {
    copy(out, in, c.at(0), t);
  }
  void all_gather_v(void*, const std::vector<int64_t>&, DType) override {}
  void broadcast(void*, int64_t, DType, int) override {}
  void all_to_all(const void* in, void* out, int64_t n, DType t) override { copy(out, in, n, t); }
  void gather(const void* in, void* out, int64_t n, DType t, int) override {
    if (out && in != out) std::memcpy(out, in, size_t(n * dtype_bytes(t)));  // host values
  }
  void send(const void*, int64_t, DType, int, int, const std::string&) override { no_peer(); }
  void recv(void*, int64_t, DType, int, int) override { no_peer(); }
  void send_recv(const void*, void*, int64_t, DType, int, int, const std::string&) override { no_peer(); }
  Request iall_reduce(void*, int64_t, DType) override { return {}; }
  Request ireduce_scatter(const void* in, void* out, int64_t shard, DType t) override {
    copy(out, in, shard, t);
    return {};
  }
  Request iall_gather(const void* in, void* out, int64_t shard, DType t) override {
    copy(out, in, shard, t);
    return {};
  }
  Request isend(const void*, int64_t, DType, int, int, const std::string&) override { no_peer(); }
  Request irecv(void*, int64_t, DType, int, int) override { no_peer(); }
  void wait(Request&) override {}
  bool test(Request&) override { return true; }
  void barrier() override {}
  void after(const Event& e) override { be_.synchronize(e); }

 private:
  void copy(void* out, const void* in, int64_t n, DType t) {
    if (in && in != out) be_.copy(out, in, size_t(n * dtype_bytes(t)));
  }
  [[noreturn]] void no_peer() { EXA_FAIL("group {} has one rank: there is no peer to send to", name()); }
  Backend& be_;
};

}  // namespace

ParallelRuntime::ParallelRuntime(MPI_Comm world, const MeshShape& shape, Backend& memory, const RuntimeOptions& opts)
    : mesh_(Mesh::create(world, shape)) {
  if (opts.watchdog_timeout_s > 0)
    watchdog_ = std::make_unique<Watchdog>(mesh_.world_rank, opts.watchdog_timeout_s, opts.abort_on_stall);
  Watchdog* wd = watchdog_.get();
  // Device memory a host MPI cannot be given (the CUDA backend): NCCL groups for the axes, and the
  // world group on MPI over host memory only (it carries host values: losses, norms, timings).
  const bool nccl = std::string(memory.name()) == "cuda";
  auto group = [&](MPI_Comm comm, const char* name) -> std::unique_ptr<Group> {
    if (nccl) return make_nccl_group(comm, name, &ledger_, wd, memory);
    return std::make_unique<MpiGroup>(comm, name, &ledger_, wd, &memory);
  };
  tp_ = group(mesh_.tp_comm, "tp");
  cp_ = group(mesh_.cp_comm, "cp");
  dp_ = group(mesh_.replica_comm, "dp");
  pp_ = group(mesh_.pp_comm, "pp");
  world_ = std::make_unique<MpiGroup>(world, "world", &ledger_, wd, nccl ? nullptr : &memory);
}

#ifndef EXATRAIN_HAVE_CUDA
bool nccl_built() { return false; }
std::unique_ptr<Group> make_nccl_group(MPI_Comm, std::string name, CommLedger*, Watchdog*, Backend& be) {
  EXA_FAIL("group {}: NCCL groups need the CUDA build (EXATRAIN_CUDA=ON); the backend is \"{}\"", name, be.name());
}
#endif

std::unique_ptr<ParallelRuntime> ParallelRuntime::local(Backend& memory) {
  std::unique_ptr<ParallelRuntime> rt(new ParallelRuntime());
  for (auto [g, name] : {std::pair{&rt->tp_, "tp"}, {&rt->cp_, "cp"}, {&rt->dp_, "dp"}, {&rt->pp_, "pp"},
                         {&rt->world_, "world"}})
    *g = std::make_unique<SelfGroup>(name, memory);
  return rt;
}

ParallelRuntime::~ParallelRuntime() {
  tp_.reset();
  cp_.reset();
  dp_.reset();
  pp_.reset();
  world_.reset();
  mesh_.free();
}

}  // namespace exatrain::parallel
