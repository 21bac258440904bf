// K-FAC as in KAISA (Pauloski et al. 2021, "KAISA: An Adaptive Second-Order Optimizer Framework
// for Deep Neural Networks", SC21, arXiv 2107.01739; its code, kfac-pytorch): Kronecker-factored
// natural-gradient preconditioning of the layers' 2-D matrices (ParamRole::matrix), followed by SGD
// with momentum (KAISA's optimizer); the same SGD without preconditioning on every other entry
// (embeddings, head, norms, biases: not linear maps of the model's layers). docs/optimizers.md.
//
// On a matrix W [out, in] (y = x W^T) with gradient g = grad_scale * dW, at (this optimizer's) step t:
//   factor steps, t = 1, 1 + factor_update_steps, ...: the model's LinearObserver calls give, over
//   the step's micro-batches, S_A = sum x^T x [in, in] and S_G = sum dy^T dy [out, out] over every
//   row (token) it saw; summed over the replicas, with N the global batch's rows (dy = the
//   per-token gradient / N, the objective being the mean over tokens):
//     A_new = S_A / N,   G_new = N S_G              (kfac-pytorch: get_cov(a) and its batch-averaged G)
//     A = f A + (1 - f) A_new,  G likewise;  the first time A = A_new, G = G_new   (f: factor_decay)
//   inverse steps, t = 1, 1 + inv_update_steps, ...:  A = QA diag(dA) QA^T,  G = QG diag(dG) QG^T
//     (Backend::sym_eigh: eigenvalues clamped at 0; a failure keeps the previous ones, counted)
//   P = QG [(QG^T g QA) / (dG dA^T + damping)] QA^T     (= (G (x) A + damping I)^-1 g, kfac-pytorch's
//                                                         KFACEigenLayer.preconditioned_grad)
//   kl_clip > 0:  nu = min(1, sqrt(kl_clip / |sum over every matrix of the model of lr^2 <P, g>|))
//   SGD (torch.optim.SGD): d = nu P + wd W;  buf = momentum buf + d;  W -= lr (nesterov ? d + momentum buf : buf)
// Other entries: the same SGD with d = g + wd W. A failed eigendecomposition keeps the previous
// eigenbasis (counted: fallbacks()); a matrix with none yet (its first failed) takes P = g, plain
// SGD, until one succeeds.
//
// Distribution (KAISA). Every replica computes its micro-batches' statistics for every matrix of
// its chunks and they are all-reduced over the replicas on factor steps ("dp_kfac_factors" bytes),
// so every replica holds every factor (A, G). Then:
//   ZeRO 0 (every replica updates every matrix; OptimizerTopology::replicated): each matrix gets
//     one inverse worker (the matrices dealt to the replicas largest first, each to the least loaded
//     by in^3 + out^3) that computes its eigendecompositions, and g = grad_worker_fraction * dp
//     gradient workers, the replicas [k g, (k + 1) g) that contain the inverse worker. Only they
//     hold the eigenbases (sent by the inverse worker after every refresh: "dp_kfac_eigen") and
//     compute P; every other replica r receives P from gradient worker k g + (r mod g)
//     ("dp_kfac_grad") and applies the same SGD. fraction 1 is KAISA's COMM-OPT (every replica
//     holds every eigenbasis, no P moves); 1/dp its MEM-OPT (one worker per matrix, P sent to all);
//     between, HYBRID-OPT.
//   ZeRO 1 (shards cut between entries: each matrix has one owner): the owner computes everything
//     for its matrices (MEM-OPT's memory), and ZeRO 1's parameter all-gather replaces the P
//     broadcast; grad_worker_fraction must be 1 there (plan_problem says so).
// <P, g> is added by each matrix's inverse worker (or owner) only, then summed over the world.
// Under tensor parallelism each shard has its own factors (of its input and output columns): the
// block-diagonal approximation across shards, as Muon's per-shard orthogonalisation.
//
// State, as entry states (so a mixed order can route it): "momentum_buffer" of every entry's shape;
// per matrix "kfac_A" [in, in], "kfac_G" [out, out] (every holder of the matrix) and "kfac_QA"
// [in, in], "kfac_dA" [in], "kfac_QG" [out, out], "kfac_dG" [out] (its gradient workers; saved by
// the inverse worker). The step's statistics [sum of in^2 + out^2] and P [the matrices it updates]
// are scratch, not checkpointed.
//
// Owns: the K-FAC update, its factors, eigenbases, statistics and their distribution. May use:
// core/, job/, backend/, model/layout.hpp, model/linear_observer.hpp, optim/optimizer.hpp,
// optim/replica_comm.hpp.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

struct KfacConfig {
  float momentum = 0.9f;           // SGD momentum (KAISA's experiments)
  bool nesterov = false;
  float weight_decay = 0;          // torch.optim.SGD's (L2 in the gradient), entries with decay only
  float damping = 0.001f;          // kfac-pytorch's defaults, here and below
  float factor_decay = 0.95f;
  int64_t factor_update_steps = 10;
  int64_t inv_update_steps = 100;
  float kl_clip = 0.001f;          // 0: no clipping
  double grad_worker_fraction = 1; // of the replicas (ZeRO 0)
};

class Kfac final : public Optimizer, public LinearObserver {
 public:
  Kfac(Backend& backend, KfacConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "kfac"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_entries() const override { return true; }
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  static bool preconditioned(const ParamInfo& p) { return p.role == ParamRole::matrix && p.shard_shape.size() == 2; }
  int64_t fallbacks() const override { return fallbacks_; }
  int64_t scratch_bytes() const override { return bytes_of({&stats_, &pgrad_, &tmp_}); }

  void connect(const OptimizerTopology& topology) override;
  void begin_step(int64_t step) override;
  LinearObserver* linear_observer() override { return this; }
  bool holds_entry_state(const ParamInfo& p, size_t spec) const override;
  int entry_state_saver(const ParamInfo& p, size_t spec) const override;

  // LinearObserver
  bool observing() const override { return capturing_; }
  void linear_backward(const ParamInfo& w, const float* x, int64_t ldx, const float* dy, int64_t ldy,
                       int64_t rows) override;

  // The replica that computes matrix p's eigendecompositions, and the first of its gradient
  // workers (ZeRO 0), with the connected topology.
  int inverse_worker(const ParamInfo& p) const;
  int first_grad_worker(const ParamInfo& p) const;
  int grad_workers() const { return group_; }

 protected:
  void prepare_step(const std::vector<EntryPart>& parts, const OptimStep& ctx) override;
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  struct Matrix {
    int64_t a_off = 0, g_off = 0;  // its S_A, S_G in stats_
    int64_t rows = 0;              // rows observed this step on this rank
    int worker = 0;                // its inverse worker (replicated)
    int64_t p_off = -1;            // its P in pgrad_ this step (-1: not updated here)
    int ready = -1;                // its eigenbases hold a decomposition: 1 yes, 0 no, -1 not known yet
  };
  const Matrix& matrix(const ParamInfo& p) const;
  bool is_grad_worker(const ParamInfo& p) const;  // holds its eigenbases and computes P
  bool computes_inverse(const ParamInfo& p) const;
  bool has_eigenbases(const EntryPart& e);  // this gradient worker's eigenvectors are not all 0
  void assign_workers();
  void fold_factors(const std::vector<const EntryPart*>& ms, const OptimStep& ctx);
  void refresh_eigen(const std::vector<const EntryPart*>& ms);
  double precondition(const std::vector<const EntryPart*>& ms, const OptimStep& ctx);
  void precondition_one(const EntryPart& e, float* P, float grad_scale);
  void share_preconditioned(const std::vector<const EntryPart*>& ms);

  KfacConfig cfg_;
  OptimizerTopology topo_;
  LocalReplicaComm local_;
  ReplicaComm* comm_ = &local_;
  int group_ = 1;  // gradient workers per matrix (replicated)
  std::unordered_map<const ParamInfo*, Matrix> matrices_;
  DeviceBuffer stats_;  // [sum of in^2 + out^2] over the chunks' matrices
  DeviceBuffer pgrad_;  // P of the matrices this rank updates, this step
  DeviceBuffer tmp_;    // [largest out * in]
  bool capturing_ = false;
  float nu_ = 1;        // this step's KL clip factor
  int64_t fallbacks_ = 0;
};

}  // namespace exatrain
