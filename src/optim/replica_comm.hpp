// What a distributed optimizer may ask of the ranks around it, without MPI in optim/: the
// data-parallel replicas that hold the same model chunks (the dp x cp group, numbered 0..size-1)
// and a sum over every rank of the run. parallel/ implements it over its groups
// (parallel/optimizer_comm.hpp: every byte in the run's ledger under the kind given here);
// LocalReplicaComm is the world of one. K-FAC (optim/kfac.hpp) reduces its factor statistics and
// moves its eigendecompositions and preconditioned gradients through it.
//
// Owns: the interface. May use: nothing beyond the standard library.
#pragma once
#include <cstdint>
#include <string>

namespace exatrain {

class ReplicaComm {
 public:
  virtual ~ReplicaComm() = default;
  virtual int rank() const = 0;  // among the replicas
  virtual int size() const = 0;
  // buf [n] (device floats) summed over the replicas, in place; a collective of all of them.
  virtual void all_reduce_sum(float* buf, int64_t n, const std::string& kind) = 0;
  // Point to point between two replicas (device floats); every send has its matching receive.
  virtual void send(const float* buf, int64_t n, int peer, const std::string& kind) = 0;
  virtual void recv(float* buf, int64_t n, int peer) = 0;
  // A host value summed over every rank of the run (all replicas, tp ranks and pipeline stages);
  // not accounted (a scalar).
  virtual double sum_over_world(double x) = 0;
};

// One rank: nothing to reduce or send.
class LocalReplicaComm final : public ReplicaComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t, const std::string&) override {}
  void send(const float*, int64_t, int, const std::string&) override {}
  void recv(float*, int64_t, int) override {}
  double sum_over_world(double x) override { return x; }
};

}  // namespace exatrain
