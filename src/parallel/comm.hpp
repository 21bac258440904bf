// Collectives over one MPI communicator ("group": tp, cp, dp, pp or world) with byte accounting.
//
// Choice: every reduction calls Open MPI's own collectives (MPI_Allreduce, MPI_Iallreduce,
// MPI_Reduce_scatter_block, MPI_Allgather, ...) instead of a hand-written ring. Open MPI picks the
// algorithm from (communicator size, message size) only, never from arrival timing, so the
// summation order — and hence every bit of the result — is the same run to run, and the MPI
// standard's advice (followed by Open MPI) is that all ranks receive identical bits. That is the
// determinism the equivalence tests need (parallel == single rank to 1e-5, bitwise repeatable).
// The blocking and non-blocking (libnbc) paths may round differently from each other; a run uses
// one path per kind consistently.
//
// Byte accounting convention — identical to the planner's (src/plan/comm.hpp, "BYTES
// CONVENTION"), so a test can assert runtime == planner EXACTLY, in integers:
// each call adds to ledger.bytes[kind] the bytes THIS rank sends for the ring algorithm, whatever
// Open MPI actually does internally. A collective over p ranks on a buffer of E elements (the FULL
// buffer: p * shard for reduce-scatter and all-gather) splits it into p chunks, chunk c holding
// floor(E/p) + (c < E % p ? 1 : 0) elements; r is this rank's index in the group:
//   reduce-scatter  E - chunk(r)                          kind "<g>_reduce_scatter"
//   all-gather      E - chunk((r+1) mod p)                kind "<g>_all_gather"
//   all-reduce      2E - chunk(r) - chunk((r+1) mod p)    kind "<g>_all_reduce"
//                   (= 2 (p-1)/p E when p divides E; max/sum alike)
//   broadcast       E - chunk((r+1) mod p)                kind "<g>_broadcast" (modelled as
//                                                         scatter + ring all-gather; start-up only)
//   send            E                                     kind "<g>_send" (pp_send, cp_send)
//   receive         nothing
// times 4 bytes per element (fp32). p = 1 sends nothing (the call returns without MPI).
// <g> is the group name: "tp", "cp", "dp" (the dp x cp group that holds the same weights, as in
// the planner), "pp". ledger.calls[kind] counts calls, ledger.seconds[kind] the wall time blocked
// in them (blocking calls and waits; receives are timed under "<g>_recv"). The caller resets the
// ledger at the start of every step.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <mpi.h>

#include "plan/comm.hpp"

namespace exatrain::parallel {

class Watchdog;

// Pure forms of the convention above, in ELEMENTS: the planner's own functions, so the ledger
// and plan::bytes_sent_per_step count with one definition.
using plan::ring_all_gather_sent;
using plan::ring_all_reduce_sent;
using plan::ring_chunk;
using plan::ring_reduce_scatter_sent;

struct CommLedger {
  std::map<std::string, int64_t> bytes;   // kind -> bytes sent by this rank since reset()
  std::map<std::string, int64_t> calls;   // kind -> number of calls
  std::map<std::string, double> seconds;  // kind -> seconds blocked (blocking calls and waits)
  void add(const std::string& kind, int64_t sent_bytes);
  void reset();
  int64_t total_bytes() const;
};

// Measured communication time of a step under the planner's `breakdown_s` names, so that
// `exatrain report` can put measured next to predicted: "tp_comm", "cp_comm", "dp_comm" sum the
// seconds blocked in every kind of that group; "pp_bubble" is the time blocked waiting for a
// pipeline message ("pp_recv": idle stages plus transfer time not hidden behind compute) and
// "pp_comm" the time blocked completing pipeline sends. Other groups (e.g. "world") are ignored.
std::map<std::string, double> comm_breakdown_s(const CommLedger& ledger);

// A pending non-blocking operation. Wait on it through the Group that started it.
struct Request {
  MPI_Request req = MPI_REQUEST_NULL;
  std::string kind;
  int64_t op_index = -1;
  bool active() const { return req != MPI_REQUEST_NULL; }
};

class Group {
 public:
  // ledger and watchdog may be null (no accounting / no watchdog). Both outlive the group.
  Group(MPI_Comm comm, std::string name, CommLedger* ledger, Watchdog* watchdog);

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  // buf[n], in place: element-wise sum / max over the group.
  void all_reduce_sum(float* buf, int64_t n);
  void all_reduce_max(float* buf, int64_t n);
  // in[size * shard] -> out[shard]: out = sum over ranks of in[rank * shard : (rank+1) * shard].
  // in and out must not overlap; in == nullptr means "in place": the input is out[size * shard]
  // and the result lands in out[0 : shard] (MPI_IN_PLACE semantics).
  void reduce_scatter_sum(const float* in, float* out, int64_t shard);
  // out[size * shard]: gathers every rank's shard in rank order. in[shard] may be nullptr, meaning
  // "in place": this rank's shard already sits at out + rank * shard.
  void all_gather(const float* in, float* out, int64_t shard);
  void broadcast(float* buf, int64_t n, int root);
  // Point-to-point with group-local peer ranks. kind == "" means "<name>_send".
  void send(const float* buf, int64_t n, int peer, int tag, const std::string& kind = "");
  void recv(float* buf, int64_t n, int peer, int tag);

  // Non-blocking variants: bytes are counted at launch; time is counted in wait().
  Request iall_reduce_sum(float* buf, int64_t n);
  Request ireduce_scatter_sum(const float* in, float* out, int64_t shard);
  Request iall_gather(const float* in, float* out, int64_t shard);
  Request isend(const float* buf, int64_t n, int peer, int tag, const std::string& kind = "");
  Request irecv(float* buf, int64_t n, int peer, int tag);
  void wait(Request& r);
  void wait_all(std::vector<Request>& rs);
  // Drives progress (Open MPI has no progress thread by default); true when r has completed.
  bool test(Request& r);

  void barrier();

 private:
  std::string kind_of(const char* op) const { return name_ + "_" + op; }
  int64_t next_op() { return ++op_count_; }
  void account(const std::string& kind, int64_t bytes);
  struct Blocked;  // RAII: watchdog enter/leave + time accounting

  MPI_Comm comm_;
  std::string name_;
  CommLedger* ledger_;
  Watchdog* watchdog_;
  int rank_ = 0, size_ = 1;
  int64_t op_count_ = 0;
};

}  // namespace exatrain::parallel
