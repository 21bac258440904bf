// NcclGroup: parallel/nccl_group.hpp says what it does and how it orders streams.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <vector>

#include "backend/cuda/cuda_backend.hpp"
#include "core/check.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/nccl_group.hpp"

namespace exatrain::parallel {
namespace {

#define EXA_NCCL(call)                                                                                          \
  do {                                                                                                          \
    const ncclResult_t r_ = (call);                                                                             \
    EXA_CHECK(r_ == ncclSuccess, "nccl group {}: {} failed: {} ({})", name(), #call, ncclGetErrorString(r_),    \
              ncclGetLastError(comm_));                                                                         \
  } while (0)
#define EXA_CUDART(call)                                                                                        \
  do {                                                                                                          \
    const cudaError_t e_ = (call);                                                                              \
    EXA_CHECK(e_ == cudaSuccess, "nccl group {}: {} failed: {}", name(), #call, cudaGetErrorString(e_));        \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::f64: return ncclFloat64;
  }
  return ncclFloat32;
}

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int comm_size(MPI_Comm c) {
  int s = 1;
  MPI_Comm_size(c, &s);
  return s;
}

class NcclGroup final : public Group {
 public:
  NcclGroup(MPI_Comm comm, const std::string& group_name, CommLedger* ledger, Watchdog* watchdog, Backend& be)
      : Group(group_name, comm_rank(comm), comm_size(comm)), be_(be), ledger_(ledger),
        host_(comm, group_name, ledger, watchdog, nullptr) {
    EXA_CHECK(cuda_device_of(be) >= 0, "nccl group {}: the backend is \"{}\", not \"cuda\"", name(), be.name());
    EXA_CUDART(cudaSetDevice(cuda_device_of(be)));
    stream_ = be.create_stream();
    s_ = static_cast<cudaStream_t>(cuda_stream_handle(*stream_));
    if (size() == 1) return;  // nothing to communicate: no communicator
    ncclUniqueId id;
    if (rank() == 0) EXA_NCCL(ncclGetUniqueId(&id));
    EXA_CHECK(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm) == MPI_SUCCESS,
              "nccl group {}: MPI_Bcast of the NCCL unique id failed", name());
    EXA_NCCL(ncclCommInitRank(&comm_, size(), id, rank()));
  }
  ~NcclGroup() override {
    if (s_) cudaStreamSynchronize(s_);
    if (comm_) ncclCommDestroy(comm_);
    for (auto& p : pending_)
      if (p.done) cudaEventDestroy(p.done);
    if (ready_) cudaEventDestroy(ready_);
    if (finished_) cudaEventDestroy(finished_);
  }

  void all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    if (t == DType::f64) return host_.all_reduce(buf, n, t, op);
    if (size() == 1) return;
    const std::string kind = kind_of("all_reduce");
    account(kind, t, ring_all_reduce_sent(n, size(), rank()));
    blocking(kind, [&] {
      EXA_NCCL(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), op == ReduceOp::sum ? ncclSum : ncclMax, comm_, s_));
    });
  }
  void reduce_scatter(const void* in, void* out, int64_t shard, DType t) override {
    if (size() == 1) return copy(out, in, shard, t);
    const std::string kind = kind_of("reduce_scatter");
    account(kind, t, ring_reduce_scatter_sent(shard * size(), size(), rank()));
    blocking(kind, [&] { enqueue_reduce_scatter(in, out, shard, t); });
  }
  void all_gather(const void* in, void* out, int64_t shard, DType t) override {
    if (size() == 1) return copy(out, in, shard, t);
    const std::string kind = kind_of("all_gather");
    account(kind, t, ring_all_gather_sent(shard * size(), size(), rank()));
    blocking(kind, [&] { enqueue_all_gather(in, out, shard, t); });
  }
  void reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType t) override;
  void all_gather_v(void* buf, const std::vector<int64_t>& counts, DType t) override;
  void broadcast(void* buf, int64_t n, DType t, int root) override {
    if (t == DType::f64) return host_.broadcast(buf, n, t, root);
    if (size() == 1) return;
    const std::string kind = kind_of("broadcast");
    account(kind, t, ring_all_gather_sent(n, size(), rank()));
    blocking(kind, [&] { EXA_NCCL(ncclBroadcast(buf, buf, size_t(n), nccl_type(t), root, comm_, s_)); });
  }
  void all_to_all(const void* in, void* out, int64_t n, DType t) override {
    if (t == DType::f64) return host_.all_to_all(in, out, n, t);
    if (size() == 1) return copy(out, in, n, t);
    const std::string kind = kind_of("all_to_all");
    account(kind, t, (size() - 1) * n);
    const size_t block = size_t(n * dtype_bytes(t));
    blocking(kind, [&] {  // NCCL has no all-to-all: grouped send/recv pairs, one per peer
      EXA_NCCL(ncclGroupStart());
      for (int r = 0; r < size(); r++) {
        if (r == rank()) continue;
        EXA_NCCL(ncclSend(static_cast<const char*>(in) + r * block, size_t(n), nccl_type(t), r, comm_, s_));
        EXA_NCCL(ncclRecv(static_cast<char*>(out) + r * block, size_t(n), nccl_type(t), r, comm_, s_));
      }
      EXA_NCCL(ncclGroupEnd());
      EXA_CUDART(cudaMemcpyAsync(static_cast<char*>(out) + rank() * block, static_cast<const char*>(in) + rank() * block,
                                 block, cudaMemcpyDeviceToDevice, s_));
    });
  }
  void gather(const void* in, void* out, int64_t n, DType t, int root) override { host_.gather(in, out, n, t, root); }
  void send(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind) override {
    const std::string k = kind.empty() ? kind_of("send") : kind;
    account(k, t, n);
    blocking(k, [&] { EXA_NCCL(ncclSend(buf, size_t(n), nccl_type(t), peer, comm_, s_)); });
  }
  void recv(void* buf, int64_t n, DType t, int peer, int tag) override {
    blocking(kind_of("recv"), [&] { EXA_NCCL(ncclRecv(buf, size_t(n), nccl_type(t), peer, comm_, s_)); });
  }
  void send_recv(const void* send, void* recv, int64_t n, DType t, int peer, int tag,
                 const std::string& kind) override {
    const std::string k = kind.empty() ? kind_of("send") : kind;
    account(k, t, n);
    blocking(k, [&] {
      EXA_NCCL(ncclGroupStart());
      EXA_NCCL(ncclSend(send, size_t(n), nccl_type(t), peer, comm_, s_));
      EXA_NCCL(ncclRecv(recv, size_t(n), nccl_type(t), peer, comm_, s_));
      EXA_NCCL(ncclGroupEnd());
    });
  }

  Request iall_reduce(void* buf, int64_t n, DType t) override {
    if (size() == 1) return {};
    std::string kind = kind_of("all_reduce");
    account(kind, t, ring_all_reduce_sent(n, size(), rank()));
    return launch(std::move(kind), [&] {
      EXA_NCCL(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), ncclSum, comm_, s_));
    });
  }
  Request ireduce_scatter(const void* in, void* out, int64_t shard, DType t) override {
    if (size() == 1) return copy(out, in, shard, t), Request{};
    std::string kind = kind_of("reduce_scatter");
    account(kind, t, ring_reduce_scatter_sent(shard * size(), size(), rank()));
    return launch(std::move(kind), [&] { enqueue_reduce_scatter(in, out, shard, t); });
  }
  Request iall_gather(const void* in, void* out, int64_t shard, DType t) override {
    if (size() == 1) return copy(out, in, shard, t), Request{};
    std::string kind = kind_of("all_gather");
    account(kind, t, ring_all_gather_sent(shard * size(), size(), rank()));
    return launch(std::move(kind), [&] { enqueue_all_gather(in, out, shard, t); });
  }
  Request isend(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind) override {
    std::string k = kind.empty() ? kind_of("send") : kind;
    account(k, t, n);
    return launch(std::move(k), [&] { EXA_NCCL(ncclSend(buf, size_t(n), nccl_type(t), peer, comm_, s_)); });
  }
  Request irecv(void* buf, int64_t n, DType t, int peer, int tag) override {
    return launch(kind_of("recv"), [&] { EXA_NCCL(ncclRecv(buf, size_t(n), nccl_type(t), peer, comm_, s_)); });
  }
  // One NCCL group: its calls progress independently of each other, where separate calls on this
  // stream would each wait for the one before (parallel/stream_order.hpp).
  std::vector<Request> post_p2p(const std::vector<P2pCall>& calls) override {
    if (calls.empty()) return {};
    after_compute();
    EXA_NCCL(ncclGroupStart());
    for (const P2pCall& c : calls) {
      if (c.send) EXA_NCCL(ncclSend(c.buf, size_t(c.n), nccl_type(c.t), c.peer, comm_, s_));
      else EXA_NCCL(ncclRecv(c.buf, size_t(c.n), nccl_type(c.t), c.peer, comm_, s_));
    }
    EXA_NCCL(ncclGroupEnd());  // the calls are on the stream only now: the events follow them
    std::vector<Request> out;
    for (const P2pCall& c : calls) {
      std::string kind = !c.send ? kind_of("recv") : c.kind.empty() ? kind_of("send") : c.kind;
      if (c.send) account(kind, c.t, c.n);
      out.push_back(record(std::move(kind)));
    }
    return out;
  }
  bool p2p_in_stream_order() const override { return true; }
  // The compute stream waits for the operation (the host does not): later ops see its results.
  void wait(Request& r) override {
    if (!r.active()) return;
    Pending& p = pending_[size_t(r.id)];
    const auto t0 = std::chrono::steady_clock::now();
    EXA_CUDART(cudaStreamWaitEvent(compute(), p.done, 0));
    seconds(p.kind, t0);
    complete(r);
  }
  bool test(Request& r) override {
    if (!r.active()) return true;
    const cudaError_t e = cudaEventQuery(pending_[size_t(r.id)].done);
    if (e == cudaErrorNotReady) return false;
    EXA_CUDART(e);
    wait(r);
    return true;
  }
  void barrier() override {
    EXA_CUDART(cudaStreamSynchronize(s_));
    host_.barrier();
  }
  void after(const Event& e) override {
    EXA_CUDART(cudaStreamWaitEvent(s_, static_cast<cudaEvent_t>(cuda_event_handle(e)), 0));
  }
  using Group::all_gather;
  using Group::broadcast;
  using Group::iall_gather;
  using Group::irecv;
  using Group::isend;
  using Group::recv;
  using Group::send;

 private:
  struct Pending {
    cudaEvent_t done = nullptr;  // recorded on the communication stream after the operation
    std::string kind;
  };
  std::string kind_of(const char* op) const {
    return kind_tag().empty() ? name() + "_" + op : name() + "_" + kind_tag() + "_" + op;
  }
  cudaStream_t compute() { return static_cast<cudaStream_t>(cuda_stream_handle(be_.compute_stream())); }
  void account(const std::string& kind, DType t, int64_t elements) {
    if (ledger_ && t != DType::f64) ledger_->add(kind, dtype_bytes(t) * elements);
  }
  void seconds(const std::string& kind, std::chrono::steady_clock::time_point t0) {
    if (ledger_) ledger_->seconds[kind] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void copy(void* out, const void* in, int64_t n, DType t) {
    if (in && in != out) be_.copy(out, in, size_t(n * dtype_bytes(t)));
  }
  // The communication stream waits for the compute stream's work so far.
  void after_compute() {
    if (!ready_) EXA_CUDART(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    EXA_CUDART(cudaEventRecord(ready_, compute()));
    EXA_CUDART(cudaStreamWaitEvent(s_, ready_, 0));
  }
  template <class F>
  void blocking(const std::string& kind, F&& enqueue) {
    const auto t0 = std::chrono::steady_clock::now();
    after_compute();
    enqueue();
    if (!finished_) EXA_CUDART(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming));
    EXA_CUDART(cudaEventRecord(finished_, s_));
    EXA_CUDART(cudaStreamWaitEvent(compute(), finished_, 0));
    seconds(kind, t0);
  }
  template <class F>
  Request launch(std::string kind, F&& enqueue) {
    after_compute();
    enqueue();
    return record(std::move(kind));
  }
  // A request whose event marks the work enqueued on the communication stream so far.
  Request record(std::string kind) {
    int64_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = int64_t(pending_.size());
      pending_.emplace_back();
      EXA_CUDART(cudaEventCreateWithFlags(&pending_.back().done, cudaEventDisableTiming));
    }
    Pending& p = pending_[size_t(id)];
    p.kind = std::move(kind);
    EXA_CUDART(cudaEventRecord(p.done, s_));
    return Request{id};
  }
  void complete(Request& r) {
    free_.push_back(r.id);
    r.id = -1;
  }
  // The Group contract's in-place forms on NCCL's: reduce-scatter in place leaves the result at
  // out + rank * shard (NCCL's), moved to out[0, shard) (the contract's).
  void enqueue_reduce_scatter(const void* in, void* out, int64_t shard, DType t) {
    const size_t bytes = size_t(shard * dtype_bytes(t));
    if (in) {
      EXA_NCCL(ncclReduceScatter(in, out, size_t(shard), nccl_type(t), ncclSum, comm_, s_));
      return;
    }
    char* mine = static_cast<char*>(out) + size_t(rank()) * bytes;
    EXA_NCCL(ncclReduceScatter(out, mine, size_t(shard), nccl_type(t), ncclSum, comm_, s_));
    if (rank() != 0) EXA_CUDART(cudaMemcpyAsync(out, mine, bytes, cudaMemcpyDeviceToDevice, s_));
  }
  void enqueue_all_gather(const void* in, void* out, int64_t shard, DType t) {
    const void* send = in ? in : static_cast<const char*>(out) + size_t(rank()) * size_t(shard * dtype_bytes(t));
    EXA_NCCL(ncclAllGather(send, out, size_t(shard), nccl_type(t), comm_, s_));
  }

  Backend& be_;
  CommLedger* ledger_;
  MpiGroup host_;  // f64 host values and gather()
  std::unique_ptr<Stream> stream_;
  cudaStream_t s_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, finished_ = nullptr;
  std::vector<Pending> pending_;
  std::vector<int64_t> free_;
};

void NcclGroup::reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType t) {
  EXA_CHECK(int(counts.size()) == size(), "nccl group {}: {} shard counts for a group of {}", name(), counts.size(),
            size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (size() == 1) return copy(out, in, total, t);
  const std::string kind = kind_of("reduce_scatter");
  account(kind, t, total - counts[size_t(rank())]);
  blocking(kind, [&] {
    EXA_NCCL(ncclGroupStart());
    int64_t at = 0;
    for (int r = 0; r < size(); r++) {
      const void* send = static_cast<const char*>(in) + size_t(at * dtype_bytes(t));
      EXA_NCCL(ncclReduce(send, r == rank() ? out : nullptr, size_t(counts[size_t(r)]), nccl_type(t), ncclSum, r,
                          comm_, s_));
      at += counts[size_t(r)];
    }
    EXA_NCCL(ncclGroupEnd());
  });
}

void NcclGroup::all_gather_v(void* buf, const std::vector<int64_t>& counts, DType t) {
  EXA_CHECK(int(counts.size()) == size(), "nccl group {}: {} shard counts for a group of {}", name(), counts.size(),
            size());
  if (size() == 1) return;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  const std::string kind = kind_of("all_gather");
  account(kind, t, total - counts[size_t((rank() + 1) % size())]);
  blocking(kind, [&] {
    EXA_NCCL(ncclGroupStart());
    int64_t at = 0;
    for (int r = 0; r < size(); r++) {
      void* shard = static_cast<char*>(buf) + size_t(at * dtype_bytes(t));
      EXA_NCCL(ncclBroadcast(shard, shard, size_t(counts[size_t(r)]), nccl_type(t), r, comm_, s_));
      at += counts[size_t(r)];
    }
    EXA_NCCL(ncclGroupEnd());
  });
}

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Group> make_nccl_group(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog,
                                       Backend& be) {
  return std::make_unique<NcclGroup>(comm, std::move(name), ledger, watchdog, be);
}

}  // namespace exatrain::parallel
