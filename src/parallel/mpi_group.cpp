#include "parallel/mpi_group.hpp"

#include <chrono>
#include <climits>
#include <cstring>

#include "backend/half_convert.hpp"  // the one bf16 rounding (Backend::f32_to_bf16, the CUDA kernels)
#include "core/check.hpp"
#include "parallel/watchdog.hpp"

namespace exatrain::parallel {
namespace {

// MPI counts are int: refuse anything larger rather than truncating silently.
int as_count(int64_t n) {
  EXA_CHECK(n >= 0 && n <= INT_MAX, "message of {} elements exceeds MPI's int count", n);
  return static_cast<int>(n);
}

// MPI has no bfloat16 or half: the elements travel as 16-bit integers and these operators reduce
// them (in fp32, rounded back to the format at every pairwise step, as NCCL's bf16 and fp16
// reductions do). Widen / Round: half_convert's pair of the format.
template <float (*Widen)(uint16_t), uint16_t (*Round)(float)>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) b[i] = Round(Widen(a[i]) + Widen(b[i]));
}
template <float (*Widen)(uint16_t)>
void half_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; i++) {
    const float x = Widen(a[i]), y = Widen(b[i]);
    if (x > y || x != x) b[i] = a[i];
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::f64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(DType t, ReduceOp op) {
  if (t != DType::bf16 && t != DType::f16) return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, sum16 = MPI_OP_NULL, max16 = MPI_OP_NULL;  // once, on first use
  if (sum == MPI_OP_NULL) {
    using namespace half_convert;
    mpi_check(MPI_Op_create(&half_sum<bf16_to_f32, f32_to_bf16>, 1, &sum), "MPI_Op_create (bf16 sum)");
    mpi_check(MPI_Op_create(&half_max<bf16_to_f32>, 1, &max), "MPI_Op_create (bf16 max)");
    mpi_check(MPI_Op_create(&half_sum<f16_to_f32, f32_to_f16>, 1, &sum16), "MPI_Op_create (fp16 sum)");
    mpi_check(MPI_Op_create(&half_max<f16_to_f32>, 1, &max16), "MPI_Op_create (fp16 max)");
  }
  if (t == DType::f16) return op == ReduceOp::sum ? sum16 : max16;
  return op == ReduceOp::sum ? sum : max;
}

}  // namespace

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::i32: return "int32";
    case DType::f64: return "fp64";
  }
  return "?";
}

struct MpiGroup::Blocked {
  MpiGroup& g;
  std::string kind;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  Blocked(MpiGroup& g_, std::string kind_, int64_t op, const char* op_name) : g(g_), kind(std::move(kind_)) {
    if (g.watchdog_) g.watchdog_->enter(g.name(), op, op_name);
  }
  ~Blocked() {
    if (g.watchdog_) g.watchdog_->leave();
    if (g.ledger_)
      g.ledger_->seconds[kind] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

static int comm_rank(MPI_Comm c) {
  int r = 0;
  mpi_check(MPI_Comm_rank(c, &r), "MPI_Comm_rank");
  return r;
}
static int comm_size(MPI_Comm c) {
  int s = 1;
  mpi_check(MPI_Comm_size(c, &s), "MPI_Comm_size");
  return s;
}

MpiGroup::MpiGroup(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog, Backend* memory)
    : Group(std::move(name), comm_rank(comm), comm_size(comm)),
      comm_(comm), ledger_(ledger), watchdog_(watchdog), memory_(memory) {}

// fp64 carries host control values (losses, norms, timings): not part of the traffic the planner
// counts, so not accounted.
void MpiGroup::account(const std::string& kind, DType t, int64_t elements) {
  if (ledger_ && t != DType::f64) ledger_->add(kind, dtype_bytes(t) * elements);
}

std::vector<int64_t> MpiGroup::access(std::initializer_list<std::pair<const void*, int64_t>> bufs, DType t) {
  std::vector<int64_t> tokens;
  if (!memory_) return tokens;
  for (const auto& [p, n] : bufs)
    if (p && n > 0) tokens.push_back(memory_->begin_host_access(p, size_t(n * dtype_bytes(t))));
  return tokens;
}

void MpiGroup::release(std::vector<int64_t>& tokens) {
  for (int64_t t : tokens) memory_->end_host_access(t);
  tokens.clear();
}

// A group of one rank copies instead of communicating: with the backend (device memory), else the
// buffers are host memory.
void MpiGroup::copy(void* out, const void* in, int64_t bytes) {
  if (memory_) memory_->copy(out, in, size_t(bytes));
  else std::memcpy(out, in, size_t(bytes));
}

void MpiGroup::all_reduce(void* buf, int64_t n, DType t, ReduceOp op) {
  if (size() == 1) return;
  const std::string kind = kind_of("all_reduce");
  account(kind, t, ring_all_reduce_sent(n, size(), rank()));
  std::vector<int64_t> a = access({{buf, n}}, t);
  {
    Blocked b(*this, kind, next_op(), op == ReduceOp::sum ? "allreduce" : "allreduce(max)");
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, as_count(n), mpi_type(t), mpi_op(t, op), comm_), "MPI_Allreduce");
  }
  release(a);
}

void MpiGroup::reduce_scatter(const void* in, void* out, int64_t shard, DType t) {
  const int64_t bytes = shard * dtype_bytes(t);
  if (size() == 1) {
    if (in && out != in) copy(out, in, bytes);
    return;
  }
  const std::string kind = kind_of("reduce_scatter");
  account(kind, t, ring_reduce_scatter_sent(shard * size(), size(), rank()));
  std::vector<int64_t> a = in ? access({{in, shard * size()}, {out, shard}}, t) : access({{out, shard * size()}}, t);
  {
    Blocked b(*this, kind, next_op(), "reduce_scatter");
    mpi_check(MPI_Reduce_scatter_block(in ? in : MPI_IN_PLACE, out, as_count(shard), mpi_type(t),
                                       mpi_op(t, ReduceOp::sum), comm_),
              "MPI_Reduce_scatter_block");
  }
  release(a);
}

void MpiGroup::all_gather(const void* in, void* out, int64_t shard, DType t) {
  if (size() == 1) {
    if (in && in != out) copy(out, in, shard * dtype_bytes(t));
    return;
  }
  const std::string kind = kind_of("all_gather");
  account(kind, t, ring_all_gather_sent(shard * size(), size(), rank()));
  std::vector<int64_t> a = access({{in, shard}, {out, shard * size()}}, t);
  {
    Blocked b(*this, kind, next_op(), "allgather");
    mpi_check(MPI_Allgather(in ? in : MPI_IN_PLACE, as_count(shard), mpi_type(t), out, as_count(shard),
                            mpi_type(t), comm_),
              "MPI_Allgather");
  }
  release(a);
}

namespace {
struct Counts {  // MPI's int counts and displacements of unequal shards
  std::vector<int> counts, displs;
  int64_t total = 0;
};
Counts int_counts(const std::vector<int64_t>& c, int size) {
  EXA_CHECK(int(c.size()) == size, "{} shard counts for a group of {}", c.size(), size);
  Counts out;
  for (int64_t n : c) {
    out.counts.push_back(as_count(n));
    out.displs.push_back(as_count(out.total));
    out.total += n;
  }
  as_count(out.total);
  return out;
}
}  // namespace

void MpiGroup::reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType t) {
  const Counts c = int_counts(counts, size());
  if (size() == 1) {
    if (in != out) copy(out, in, c.total * dtype_bytes(t));
    return;
  }
  const std::string kind = kind_of("reduce_scatter");
  account(kind, t, c.total - counts[size_t(rank())]);
  std::vector<int64_t> a = access({{in, c.total}, {out, counts[size_t(rank())]}}, t);
  {
    Blocked b(*this, kind, next_op(), "reduce_scatter(v)");
    mpi_check(MPI_Reduce_scatter(in, out, c.counts.data(), mpi_type(t), mpi_op(t, ReduceOp::sum), comm_),
              "MPI_Reduce_scatter");
  }
  release(a);
}

void MpiGroup::all_gather_v(void* buf, const std::vector<int64_t>& counts, DType t) {
  const Counts c = int_counts(counts, size());
  if (size() == 1) return;
  const std::string kind = kind_of("all_gather");
  account(kind, t, c.total - counts[size_t((rank() + 1) % size())]);
  std::vector<int64_t> a = access({{buf, c.total}}, t);
  {
    Blocked b(*this, kind, next_op(), "allgather(v)");
    mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c.counts.data(), c.displs.data(), mpi_type(t),
                             comm_),
              "MPI_Allgatherv");
  }
  release(a);
}

void MpiGroup::broadcast(void* buf, int64_t n, DType t, int root) {
  if (size() == 1) return;
  const std::string kind = kind_of("broadcast");
  account(kind, t, ring_all_gather_sent(n, size(), rank()));
  std::vector<int64_t> a = access({{buf, n}}, t);
  {
    Blocked b(*this, kind, next_op(), "broadcast");
    mpi_check(MPI_Bcast(buf, as_count(n), mpi_type(t), root, comm_), "MPI_Bcast");
  }
  release(a);
}

void MpiGroup::all_to_all(const void* in, void* out, int64_t n, DType t) {
  if (size() == 1) {
    copy(out, in, n * dtype_bytes(t));
    return;
  }
  const std::string kind = kind_of("all_to_all");
  account(kind, t, (size() - 1) * n);
  std::vector<int64_t> a = access({{in, n * size()}, {out, n * size()}}, t);
  {
    Blocked b(*this, kind, next_op(), "alltoall");
    mpi_check(MPI_Alltoall(in, as_count(n), mpi_type(t), out, as_count(n), mpi_type(t), comm_), "MPI_Alltoall");
  }
  release(a);
}

void MpiGroup::gather(const void* in, void* out, int64_t n, DType t, int root) {
  std::vector<int64_t> a = access({{in, n}, {out, rank() == root ? n * size() : 0}}, t);
  {
    Blocked b(*this, kind_of("gather"), next_op(), "gather");
    mpi_check(MPI_Gather(in, as_count(n), mpi_type(t), out, as_count(n), mpi_type(t), root, comm_), "MPI_Gather");
  }
  release(a);
}

void MpiGroup::send(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind) {
  const std::string k = kind.empty() ? kind_of("send") : kind;
  account(k, t, n);
  std::vector<int64_t> a = access({{buf, n}}, t);
  {
    Blocked b(*this, k, next_op(), "send");
    mpi_check(MPI_Send(buf, as_count(n), mpi_type(t), peer, tag, comm_), "MPI_Send");
  }
  release(a);
}

void MpiGroup::recv(void* buf, int64_t n, DType t, int peer, int tag) {
  std::vector<int64_t> a = access({{buf, n}}, t);
  {
    Blocked b(*this, kind_of("recv"), next_op(), "recv");
    mpi_check(MPI_Recv(buf, as_count(n), mpi_type(t), peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  release(a);
}

void MpiGroup::send_recv(const void* send, void* recv, int64_t n, DType t, int peer, int tag,
                         const std::string& kind) {
  const std::string k = kind.empty() ? kind_of("send") : kind;
  account(k, t, n);
  std::vector<int64_t> a = access({{send, n}, {recv, n}}, t);
  {
    Blocked b(*this, k, next_op(), "sendrecv");
    mpi_check(MPI_Sendrecv(send, as_count(n), mpi_type(t), peer, tag, recv, as_count(n), mpi_type(t), peer, tag,
                           comm_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
  }
  release(a);
}

Request MpiGroup::launch(MPI_Request req, std::string kind, std::vector<int64_t> tokens) {
  int64_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = int64_t(pending_.size());
    pending_.emplace_back();
  }
  pending_[size_t(id)] = Pending{req, std::move(kind), op_count_, std::move(tokens)};
  return Request{id};
}

Request MpiGroup::iall_reduce(void* buf, int64_t n, DType t) {
  if (size() == 1) return {};
  std::string kind = kind_of("all_reduce");
  next_op();
  account(kind, t, ring_all_reduce_sent(n, size(), rank()));
  std::vector<int64_t> a = access({{buf, n}}, t);
  MPI_Request req;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, as_count(n), mpi_type(t), mpi_op(t, ReduceOp::sum), comm_, &req),
            "MPI_Iallreduce");
  return launch(req, std::move(kind), std::move(a));
}

Request MpiGroup::ireduce_scatter(const void* in, void* out, int64_t shard, DType t) {
  if (size() == 1) {
    if (in && out != in) copy(out, in, shard * dtype_bytes(t));
    return {};
  }
  std::string kind = kind_of("reduce_scatter");
  next_op();
  account(kind, t, ring_reduce_scatter_sent(shard * size(), size(), rank()));
  std::vector<int64_t> a = in ? access({{in, shard * size()}, {out, shard}}, t) : access({{out, shard * size()}}, t);
  MPI_Request req;
  mpi_check(MPI_Ireduce_scatter_block(in ? in : MPI_IN_PLACE, out, as_count(shard), mpi_type(t),
                                      mpi_op(t, ReduceOp::sum), comm_, &req),
            "MPI_Ireduce_scatter_block");
  return launch(req, std::move(kind), std::move(a));
}

Request MpiGroup::iall_gather(const void* in, void* out, int64_t shard, DType t) {
  if (size() == 1) {
    if (in && in != out) copy(out, in, shard * dtype_bytes(t));
    return {};
  }
  std::string kind = kind_of("all_gather");
  next_op();
  account(kind, t, ring_all_gather_sent(shard * size(), size(), rank()));
  std::vector<int64_t> a = access({{in, shard}, {out, shard * size()}}, t);
  MPI_Request req;
  mpi_check(MPI_Iallgather(in ? in : MPI_IN_PLACE, as_count(shard), mpi_type(t), out, as_count(shard), mpi_type(t),
                           comm_, &req),
            "MPI_Iallgather");
  return launch(req, std::move(kind), std::move(a));
}

Request MpiGroup::isend(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind) {
  std::string k = kind.empty() ? kind_of("send") : kind;
  next_op();
  account(k, t, n);
  std::vector<int64_t> a = access({{buf, n}}, t);
  MPI_Request req;
  mpi_check(MPI_Isend(buf, as_count(n), mpi_type(t), peer, tag, comm_, &req), "MPI_Isend");
  return launch(req, std::move(k), std::move(a));
}

Request MpiGroup::irecv(void* buf, int64_t n, DType t, int peer, int tag) {
  next_op();
  std::vector<int64_t> a = access({{buf, n}}, t);
  MPI_Request req;
  mpi_check(MPI_Irecv(buf, as_count(n), mpi_type(t), peer, tag, comm_, &req), "MPI_Irecv");
  return launch(req, kind_of("recv"), std::move(a));
}

// The operation is done: its buffers leave the host-access scope, its slot is reused.
void MpiGroup::complete(Request& r) {
  Pending& p = pending_[size_t(r.id)];
  release(p.access);
  p.req = MPI_REQUEST_NULL;
  free_.push_back(r.id);
  r.id = -1;
}

void MpiGroup::wait(Request& r) {
  if (!r.active()) return;
  Pending& p = pending_[size_t(r.id)];
  {
    Blocked b(*this, p.kind, p.op_index, "wait");
    mpi_check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  complete(r);
}

bool MpiGroup::test(Request& r) {
  if (!r.active()) return true;
  int done = 0;
  mpi_check(MPI_Test(&pending_[size_t(r.id)].req, &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done) complete(r);
  return done != 0;
}

void MpiGroup::barrier() {
  if (size() == 1) return;
  Blocked b(*this, kind_of("barrier"), next_op(), "barrier");
  mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiGroup::after(const Event& e) {
  if (memory_) memory_->synchronize(e);
}

}  // namespace exatrain::parallel
