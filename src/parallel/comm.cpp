#include "parallel/comm.hpp"

#include <chrono>
#include <climits>

#include "core/check.hpp"
#include "parallel/mesh.hpp"
#include "parallel/watchdog.hpp"

namespace exatrain::parallel {


static constexpr int64_t kFloatBytes = 4;

void CommLedger::add(const std::string& kind, int64_t sent_bytes) {
  bytes[kind] += sent_bytes;
  calls[kind] += 1;
}

void CommLedger::reset() {
  bytes.clear();
  calls.clear();
  seconds.clear();
}

int64_t CommLedger::total_bytes() const {
  int64_t t = 0;
  for (auto& [k, b] : bytes) t += b;
  return t;
}

std::map<std::string, double> comm_breakdown_s(const CommLedger& ledger) {
  std::map<std::string, double> out{
      {"tp_comm", 0}, {"cp_comm", 0}, {"dp_comm", 0}, {"pp_comm", 0}, {"pp_bubble", 0}};
  for (const auto& [kind, sec] : ledger.seconds) {
    std::string group = kind.substr(0, kind.find('_'));
    if (kind == "pp_recv") out["pp_bubble"] += sec;
    else if (group == "tp" || group == "cp" || group == "dp" || group == "pp") out[group + "_comm"] += sec;
  }
  return out;
}

// MPI counts are int: refuse anything larger rather than truncating silently.
static int as_count(int64_t n) {
  EXA_CHECK(n >= 0 && n <= INT_MAX, "message of {} floats exceeds MPI's int count", n);
  return static_cast<int>(n);
}

struct Group::Blocked {
  Group& g;
  std::string kind;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  Blocked(Group& g_, std::string kind_, int64_t op, const char* op_name)
      : g(g_), kind(std::move(kind_)) {
    if (g.watchdog_) g.watchdog_->enter(g.name_, op, op_name);
  }
  ~Blocked() {
    if (g.watchdog_) g.watchdog_->leave();
    if (g.ledger_)
      g.ledger_->seconds[kind] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

Group::Group(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog)
    : comm_(comm), name_(std::move(name)), ledger_(ledger), watchdog_(watchdog) {
  mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

void Group::account(const std::string& kind, int64_t bytes) {
  if (ledger_) ledger_->add(kind, bytes);
}

void Group::all_reduce_sum(float* buf, int64_t n) {
  if (size_ == 1) return;
  std::string kind = kind_of("all_reduce");
  account(kind, kFloatBytes * ring_all_reduce_sent(n, size_, rank_));
  Blocked b(*this, kind, next_op(), "allreduce");
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, as_count(n), MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Allreduce");
}

void Group::all_reduce_max(float* buf, int64_t n) {
  if (size_ == 1) return;
  std::string kind = kind_of("all_reduce");
  account(kind, kFloatBytes * ring_all_reduce_sent(n, size_, rank_));
  Blocked b(*this, kind, next_op(), "allreduce(max)");
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, as_count(n), MPI_FLOAT, MPI_MAX, comm_),
            "MPI_Allreduce");
}

void Group::reduce_scatter_sum(const float* in, float* out, int64_t shard) {
  if (size_ == 1) {
    if (in && out != in) std::copy(in, in + shard, out);
    return;
  }
  std::string kind = kind_of("reduce_scatter");
  account(kind, kFloatBytes * ring_reduce_scatter_sent(shard * size_, size_, rank_));
  Blocked b(*this, kind, next_op(), "reduce_scatter");
  const void* send = in ? static_cast<const void*>(in) : MPI_IN_PLACE;
  mpi_check(MPI_Reduce_scatter_block(send, out, as_count(shard), MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
}

void Group::all_gather(const float* in, float* out, int64_t shard) {
  if (size_ == 1) {
    if (in && in != out) std::copy(in, in + shard, out);
    return;
  }
  std::string kind = kind_of("all_gather");
  account(kind, kFloatBytes * ring_all_gather_sent(shard * size_, size_, rank_));
  Blocked b(*this, kind, next_op(), "allgather");
  const void* send = in ? static_cast<const void*>(in) : MPI_IN_PLACE;
  mpi_check(MPI_Allgather(send, as_count(shard), MPI_FLOAT, out, as_count(shard), MPI_FLOAT, comm_),
            "MPI_Allgather");
}

void Group::broadcast(float* buf, int64_t n, int root) {
  if (size_ == 1) return;
  std::string kind = kind_of("broadcast");
  account(kind, kFloatBytes * ring_all_gather_sent(n, size_, rank_));
  Blocked b(*this, kind, next_op(), "broadcast");
  mpi_check(MPI_Bcast(buf, as_count(n), MPI_FLOAT, root, comm_), "MPI_Bcast");
}

void Group::send(const float* buf, int64_t n, int peer, int tag, const std::string& kind) {
  std::string k = kind.empty() ? kind_of("send") : kind;
  account(k, kFloatBytes * n);
  Blocked b(*this, k, next_op(), "send");
  mpi_check(MPI_Send(buf, as_count(n), MPI_FLOAT, peer, tag, comm_), "MPI_Send");
}

void Group::recv(float* buf, int64_t n, int peer, int tag) {
  Blocked b(*this, kind_of("recv"), next_op(), "recv");
  mpi_check(MPI_Recv(buf, as_count(n), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE),
            "MPI_Recv");
}

Request Group::iall_reduce_sum(float* buf, int64_t n) {
  Request r;
  if (size_ == 1) return r;
  r.kind = kind_of("all_reduce");
  r.op_index = next_op();
  account(r.kind, kFloatBytes * ring_all_reduce_sent(n, size_, rank_));
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, as_count(n), MPI_FLOAT, MPI_SUM, comm_, &r.req),
            "MPI_Iallreduce");
  return r;
}

Request Group::ireduce_scatter_sum(const float* in, float* out, int64_t shard) {
  Request r;
  if (size_ == 1) {
    if (in && out != in) std::copy(in, in + shard, out);
    return r;
  }
  r.kind = kind_of("reduce_scatter");
  r.op_index = next_op();
  account(r.kind, kFloatBytes * ring_reduce_scatter_sent(shard * size_, size_, rank_));
  const void* send = in ? static_cast<const void*>(in) : MPI_IN_PLACE;
  mpi_check(
      MPI_Ireduce_scatter_block(send, out, as_count(shard), MPI_FLOAT, MPI_SUM, comm_, &r.req),
      "MPI_Ireduce_scatter_block");
  return r;
}

Request Group::iall_gather(const float* in, float* out, int64_t shard) {
  Request r;
  if (size_ == 1) {
    if (in && in != out) std::copy(in, in + shard, out);
    return r;
  }
  r.kind = kind_of("all_gather");
  r.op_index = next_op();
  account(r.kind, kFloatBytes * ring_all_gather_sent(shard * size_, size_, rank_));
  const void* send = in ? static_cast<const void*>(in) : MPI_IN_PLACE;
  mpi_check(MPI_Iallgather(send, as_count(shard), MPI_FLOAT, out, as_count(shard), MPI_FLOAT, comm_,
                           &r.req),
            "MPI_Iallgather");
  return r;
}

Request Group::isend(const float* buf, int64_t n, int peer, int tag, const std::string& kind) {
  Request r;
  r.kind = kind.empty() ? kind_of("send") : kind;
  r.op_index = next_op();
  account(r.kind, kFloatBytes * n);
  mpi_check(MPI_Isend(buf, as_count(n), MPI_FLOAT, peer, tag, comm_, &r.req), "MPI_Isend");
  return r;
}

Request Group::irecv(float* buf, int64_t n, int peer, int tag) {
  Request r;
  r.kind = kind_of("recv");
  r.op_index = next_op();
  mpi_check(MPI_Irecv(buf, as_count(n), MPI_FLOAT, peer, tag, comm_, &r.req), "MPI_Irecv");
  return r;
}

void Group::wait(Request& r) {
  if (!r.active()) return;
  Blocked b(*this, r.kind, r.op_index, "wait");
  mpi_check(MPI_Wait(&r.req, MPI_STATUS_IGNORE), "MPI_Wait");
}

void Group::wait_all(std::vector<Request>& rs) {
  for (Request& r : rs) wait(r);
}

bool Group::test(Request& r) {
  if (!r.active()) return true;
  int done = 0;
  mpi_check(MPI_Test(&r.req, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

void Group::barrier() {
  if (size_ == 1) return;
  Blocked b(*this, kind_of("barrier"), next_op(), "barrier");
  mpi_check(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace exatrain::parallel
