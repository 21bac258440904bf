// Collectives over one process group ("group": tp, cp, dp, pp or world) with byte accounting.
// `Group` is the interface the runtime is written against; MpiGroup (parallel/mpi_group.hpp)
// implements it with MPI now, an NCCL group can implement it later. Buffers are device memory
// (Backend::alloc) unless said otherwise; every element has a DType (fp32, bf16, fp16, int32, fp64).
//
// Owns: the Group interface, the byte ledger and its convention. May use: core/, plan/ (the
// convention's pure functions), backend/ (events, memory access).
//
// Choice (MpiGroup): every reduction calls Open MPI's own collectives (MPI_Allreduce, MPI_Iallreduce,
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
//   all-to-all      (p-1) n of the p n elements           kind "<g>_all_to_all" (this rank's block stays)
//   send            E                                     kind "<g>_send" (pp_send, cp_send)
//   receive         nothing
// times the element size of the call's DType (4 for fp32, 2 for bf16 and fp16). p = 1 sends nothing (the call returns without MPI).
// <g> is the group name: "tp", "cp", "dp" (the dp x cp group that holds the same weights, as in
// the planner), "pp". ledger.calls[kind] counts calls, ledger.seconds[kind] the wall time blocked
// in them (blocking calls and waits; receives are timed under "<g>_recv"). The caller resets the
// ledger at the start of every step.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "plan/comm.hpp"

namespace exatrain::parallel {

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

// Element types of communication buffers. bf16 is bfloat16 storage (Backend::f32_to_bf16), f16
// IEEE half (Backend::f32_to_half(Half::f16, ...)); their sums are computed in fp32 and rounded
// back (per pairwise step of the reduction). Moved without reducing, both are 16-bit payloads.
enum class DType { f32, bf16, i32, f64, f16 };
int64_t dtype_bytes(DType t);
const char* to_string(DType t);
enum class ReduceOp { sum, max };

// A pending non-blocking operation: a handle into the Group that started it (wait or test it
// through that Group). Inactive (id < 0) once completed, or when the call sent nothing.
struct Request {
  int64_t id = -1;
  bool active() const { return id >= 0; }
};

// One send or receive of a batch posted together (Group::post_p2p).
struct P2pCall {
  bool send = false;
  void* buf = nullptr;  // written (receive), or only read (send: see send_from)
  int64_t n = 0;        // elements of t
  DType t = DType::f32;
  int peer = -1, tag = 0;
  std::string kind;  // sends: the ledger kind ("" = "<name>_send")

  static P2pCall recv_into(void* buf, int64_t n, DType t, int peer, int tag) { return {false, buf, n, t, peer, tag, ""}; }
  // A send reads its buffer only; the one field serves both (isend's const in, irecv's out).
  static P2pCall send_from(const void* buf, int64_t n, DType t, int peer, int tag, std::string kind = "") {
    return {true, const_cast<void*>(buf), n, t, peer, tag, std::move(kind)};
  }
};

class Group {
 public:
  virtual ~Group() = default;
  const std::string& name() const { return name_; }
  // While a tag is set, the ledger kind of this group's calls is "<name>_<tag>_<op>" instead of
  // "<name>_<op>" (a compressor's collectives: "dp_topk_all_gather", counted apart from ZeRO's
  // "dp_all_gather"; comm_breakdown_s still puts them under the group). KindTag sets one for a scope.
  void set_kind_tag(std::string tag) { tag_ = std::move(tag); }
  const std::string& kind_tag() const { return tag_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // ---- collectives (n, shard: elements of type t). Size 1: no communication (a copy where the
  // output is another buffer). Every one is accounted in the ledger by the convention above.
  // buf[n] in place: element-wise sum / max over the group.
  virtual void all_reduce(void* buf, int64_t n, DType t, ReduceOp op) = 0;
  // in[size * shard] -> out[shard] = sum over ranks of in[rank * shard : (rank+1) * shard]; in and
  // out must not overlap; in == nullptr means in place: the input is out[size * shard] and the
  // result lands in out[0 : shard].
  virtual void reduce_scatter(const void* in, void* out, int64_t shard, DType t) = 0;
  // out[size * shard]: every rank's shard in rank order; in == nullptr: this rank's shard already
  // sits at out + rank * shard.
  virtual void all_gather(const void* in, void* out, int64_t shard, DType t) = 0;
  // Unequal shards (ZeRO layouts cut between parameter entries): rank r's shard has counts[r]
  // elements, the shards back to back in rank order. reduce_scatter_v: in[sum counts] -> out[counts[rank]];
  // all_gather_v in place: buf[sum counts], this rank's shard already at its place. Accounted as
  // the ring with these chunks (reduce-scatter E - counts[r], all-gather E - counts[(r+1) % p]).
  virtual void reduce_scatter_v(const void* in, void* out, const std::vector<int64_t>& counts, DType t) = 0;
  virtual void all_gather_v(void* buf, const std::vector<int64_t>& counts, DType t) = 0;
  virtual void broadcast(void* buf, int64_t n, DType t, int root) = 0;
  // in[size * n] -> out[size * n]: block r of `in` goes to rank r, block r of `out` came from rank r
  // (this rank's own block copied); in and out must not overlap. Accounted as the (size - 1) * n
  // elements sent to the others (split_reduce's count exchange: P counts a rank, not P * P).
  virtual void all_to_all(const void* in, void* out, int64_t n, DType t) = 0;
  // in[n] of every rank -> out[size * n] on `root` (out may be null elsewhere). For host values
  // (metrics); not accounted.
  virtual void gather(const void* in, void* out, int64_t n, DType t, int root) = 0;
  // Point-to-point with group-local peer ranks; kind "" = "<name>_send".
  virtual void send(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind = "") = 0;
  virtual void recv(void* buf, int64_t n, DType t, int peer, int tag) = 0;
  // Sends send[n] to peer and receives its recv[n] at once (an exchange of two ranks).
  virtual void send_recv(const void* send, void* recv, int64_t n, DType t, int peer, int tag,
                         const std::string& kind = "") = 0;

  // Non-blocking variants: bytes are counted at launch, time in wait().
  virtual Request iall_reduce(void* buf, int64_t n, DType t) = 0;  // sum
  virtual Request ireduce_scatter(const void* in, void* out, int64_t shard, DType t) = 0;
  virtual Request iall_gather(const void* in, void* out, int64_t shard, DType t) = 0;
  virtual Request isend(const void* buf, int64_t n, DType t, int peer, int tag, const std::string& kind = "") = 0;
  virtual Request irecv(void* buf, int64_t n, DType t, int peer, int tag) = 0;
  // Sends and receives that must progress together, one request each in the order given: NCCL
  // fuses them into one group (ncclGroupStart/End: the calls of a group never block each other,
  // while separate calls on one stream run one after the other, parallel/stream_order.hpp); MPI
  // starts each as isend / irecv (this default).
  virtual std::vector<Request> post_p2p(const std::vector<P2pCall>& calls);
  // Whether this group runs point-to-point calls in posting order on one stream, each waiting for
  // its peer's matching call (NCCL): a pipeline must then post in Megatron's steps
  // (schedule.hpp in_steps) rather than receive early.
  virtual bool p2p_in_stream_order() const { return false; }
  virtual void wait(Request& r) = 0;
  // Drives progress; true when r has completed (then it is inactive).
  virtual bool test(Request& r) = 0;
  virtual void barrier() = 0;
  // Collectives of this group started after this call read data that the backend's streams
  // produced before `e` (MPI: the host waits for e; NCCL: its stream waits for e).
  virtual void after(const Event& e) = 0;

  // ---- fp32 shorthands (the runtime's common case)
  void all_reduce_sum(float* buf, int64_t n) { all_reduce(buf, n, DType::f32, ReduceOp::sum); }
  void all_reduce_max(float* buf, int64_t n) { all_reduce(buf, n, DType::f32, ReduceOp::max); }
  void reduce_scatter_sum(const float* in, float* out, int64_t shard) { reduce_scatter(in, out, shard, DType::f32); }
  void all_gather(const float* in, float* out, int64_t shard) { all_gather(in, out, shard, DType::f32); }
  void broadcast(float* buf, int64_t n, int root) { broadcast(buf, n, DType::f32, root); }
  void send(const float* buf, int64_t n, int peer, int tag, const std::string& kind = "") {
    send(buf, n, DType::f32, peer, tag, kind);
  }
  void recv(float* buf, int64_t n, int peer, int tag) { recv(buf, n, DType::f32, peer, tag); }
  Request iall_reduce_sum(float* buf, int64_t n) { return iall_reduce(buf, n, DType::f32); }
  Request ireduce_scatter_sum(const float* in, float* out, int64_t shard) {
    return ireduce_scatter(in, out, shard, DType::f32);
  }
  Request iall_gather(const float* in, float* out, int64_t shard) { return iall_gather(in, out, shard, DType::f32); }
  Request isend(const float* buf, int64_t n, int peer, int tag, const std::string& kind = "") {
    return isend(buf, n, DType::f32, peer, tag, kind);
  }
  Request irecv(float* buf, int64_t n, int peer, int tag) { return irecv(buf, n, DType::f32, peer, tag); }
  void wait_all(std::vector<Request>& rs) {
    for (Request& r : rs) wait(r);
  }
  // A host scalar summed over the group (losses, norms): fp64, not accounted.
  double sum(double x) {
    all_reduce(&x, 1, DType::f64, ReduceOp::sum);
    return x;
  }

 protected:
  Group(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}

 private:
  std::string name_, tag_;
  int rank_ = 0, size_ = 1;
};

// Sets a group's kind tag for the scope (and restores the previous one).
class KindTag {
 public:
  KindTag(Group& g, std::string tag) : g_(g), old_(g.kind_tag()) { g.set_kind_tag(std::move(tag)); }
  ~KindTag() { g_.set_kind_tag(old_); }
  KindTag(const KindTag&) = delete;
  KindTag& operator=(const KindTag&) = delete;

 private:
  Group& g_;
  std::string old_;
};

}  // namespace exatrain::parallel
