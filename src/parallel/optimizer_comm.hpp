// The optimizer's view of the data-parallel replicas (optim/replica_comm.hpp) over this runtime's
// groups: the dp group (dp x cp ranks holding the same weights) and the world. Every byte lands in
// the ledger under the kind the optimizer names (K-FAC: "dp_kfac_factors", "dp_kfac_eigen",
// "dp_kfac_grad"), so metrics.jsonl's bytes_sent tells them from the gradients' "dp_all_reduce".
//
// Owns: the adapter. May use: optim/replica_comm.hpp, parallel/comm.hpp.
#pragma once
#include <string>

#include "optim/replica_comm.hpp"
#include "parallel/comm.hpp"

namespace exatrain::parallel {

class GroupReplicaComm final : public ReplicaComm {
 public:
  GroupReplicaComm(Group& dp, Group& world, CommLedger& ledger) : dp_(dp), world_(world), ledger_(ledger) {}
  int rank() const override { return dp_.rank(); }
  int size() const override { return dp_.size(); }
  // The dp group's all-reduce; its ledger entry (bytes, calls, seconds under "dp_all_reduce")
  // moved to `kind`.
  void all_reduce_sum(float* buf, int64_t n, const std::string& kind) override;
  void send(const float* buf, int64_t n, int peer, const std::string& kind) override {
    dp_.send(buf, n, peer, kTag, kind);
  }
  void recv(float* buf, int64_t n, int peer) override { dp_.recv(buf, n, peer, kTag); }
  double sum_over_world(double x) override { return world_.sum(x); }

 private:
  static constexpr int kTag = 7301;  // the optimizer's point-to-point messages on the dp group
  Group &dp_, &world_;
  CommLedger& ledger_;
};

}  // namespace exatrain::parallel
