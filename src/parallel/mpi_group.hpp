// Group over an MPI communicator (parallel/comm.hpp): Open MPI's own collectives, byte accounting
// by the ring convention, the watchdog around every blocking call and wait, and device memory
// handed to MPI only inside the backend's host-access scopes (Backend::begin_host_access), so the
// guarded CPU backend lets MPI read and write exactly the buffers of the calls in flight.
//
// Owns: the MPI side of every collective of the runtime (datatypes, the bf16 reduction
// operators, request handles). May use: core/, backend/, parallel/comm, parallel/watchdog, MPI.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "parallel/comm.hpp"
#include "parallel/mesh.hpp"

namespace exatrain::parallel {

class Watchdog;

class MpiGroup final : public Group {
 public:
  // ledger, watchdog and memory may be null (no accounting / no watchdog / host memory only).
  // All three outlive the group.
  MpiGroup(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog,
           Backend* memory = nullptr);
  MPI_Comm comm() const { return comm_; }

  void all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override;
  void reduce_scatter(const void* in, void* out, int64_t shard, DType t) override;
  void all_gather(const void* in, void* out, int64_t shard, DType t) override;
  void reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType t) override;
  void all_gather_v(void* buf, const std::vector<int64_t>& counts, DType t) override;
  void broadcast(void* buf, int64_t n, DType t, int root) override;
  void all_to_all(const void* in, void* out, int64_t n, DType t) override;
  void gather(const void* in, void* out, int64_t n, DType t, int root) override;
  void send(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind = "") override;
  void recv(void* buf, int64_t n, DType t, int peer, int tag) override;
  void send_recv(const void* send, void* recv, int64_t n, DType t, int peer, int tag,
                 const std::string& kind = "") override;
  Request iall_reduce(void* buf, int64_t n, DType t) override;
  Request ireduce_scatter(const void* in, void* out, int64_t shard, DType t) override;
  Request iall_gather(const void* in, void* out, int64_t shard, DType t) override;
  Request isend(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind = "") override;
  Request irecv(void* buf, int64_t n, DType t, int peer, int tag) override;
  void wait(Request& r) override;
  bool test(Request& r) override;
  void barrier() override;
  void after(const Event& e) override;
  using Group::all_gather;
  using Group::broadcast;
  using Group::irecv;
  using Group::isend;
  using Group::iall_gather;
  using Group::recv;
  using Group::send;

 private:
  struct Blocked;  // RAII: watchdog enter/leave + time accounting
  struct Pending {  // one non-blocking operation in flight
    MPI_Request req = MPI_REQUEST_NULL;
    std::string kind;
    int64_t op_index = -1;
    std::vector<int64_t> access;  // the backend's host-access tokens of its buffers
  };
  std::string kind_of(const char* op) const {
    return kind_tag().empty() ? name() + "_" + op : name() + "_" + kind_tag() + "_" + op;
  }
  int64_t next_op() { return ++op_count_; }
  void account(const std::string& kind, DType t, int64_t elements);
  std::vector<int64_t> access(std::initializer_list<std::pair<const void*, int64_t>> bufs, DType t);
  void release(std::vector<int64_t>& tokens);
  Request launch(MPI_Request req, std::string kind, std::vector<int64_t> tokens);
  void complete(Request& r);
  void copy(void* out, const void* in, int64_t bytes);

  MPI_Comm comm_;
  CommLedger* ledger_;
  Watchdog* watchdog_;
  Backend* memory_;
  int64_t op_count_ = 0;
  std::vector<Pending> pending_;  // Request::id indexes it
  std::vector<int64_t> free_;     // reusable slots of pending_
};

}  // namespace exatrain::parallel
