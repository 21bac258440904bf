#include "optim/kfac.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.hpp"

namespace exatrain {
namespace {
// The entry states of a matrix, in entry_states' order.
enum : size_t { kMomentum = 0, kA = 1, kG = 2, kQA = 3, kDA = 4, kQG = 5, kDG = 6 };
int64_t rows_of(const ParamInfo& p) { return p.shard_shape[0]; }  // out
int64_t cols_of(const ParamInfo& p) { return p.shard_shape[1]; }  // in
}  // namespace

std::vector<EntryStateSpec> Kfac::entry_states(const ParamInfo& p) const {
  std::vector<EntryStateSpec> specs = {{"momentum_buffer", p.shard_shape}};
  if (!preconditioned(p)) return specs;
  const int64_t out = rows_of(p), in = cols_of(p);
  specs.push_back({"kfac_A", {in, in}});
  specs.push_back({"kfac_G", {out, out}});
  specs.push_back({"kfac_QA", {in, in}});
  specs.push_back({"kfac_dA", {in}});
  specs.push_back({"kfac_QG", {out, out}});
  specs.push_back({"kfac_dG", {out}});
  return specs;
}

// Every matrix of the chunks gets its place in the statistics buffer (chunk and arena order: the
// same on every replica, which all-reduce it as one buffer) and, under ZeRO 0, its workers.
void Kfac::connect(const OptimizerTopology& topology) {
  topo_ = topology;
  comm_ = topology.comm ? topology.comm : &local_;
  const int dp = comm_->size();
  group_ = topo_.replicated && dp > 1 ? int(std::lround(cfg_.grad_worker_fraction * dp)) : 1;
  EXA_CHECK(group_ >= 1 && dp % group_ == 0,
            "kfac: grad_worker_fraction = {} over {} replicas gives {} gradient workers per matrix, which must be "
            "a whole divisor of {}", cfg_.grad_worker_fraction, dp, group_, dp);
  matrices_.clear();
  int64_t at = 0;
  for (const ParamLayout* layout : topo_.chunks)
    for (const ParamInfo& p : layout->entries()) {
      if (!preconditioned(p)) continue;
      Matrix m;
      m.a_off = at, at += cols_of(p) * cols_of(p);
      m.g_off = at, at += rows_of(p) * rows_of(p);
      matrices_.emplace(&p, m);
    }
  stats_ = DeviceBuffer(be_, at, "kfac factor statistics");
  assign_workers();
}

// KAISA's assignment: the matrices dealt to the replicas largest first (eigendecomposition cost
// in^3 + out^3), each to the least loaded (the lowest rank on a tie); stable, so every replica
// computes the same assignment.
void Kfac::assign_workers() {
  std::vector<const ParamInfo*> order;
  for (const ParamLayout* layout : topo_.chunks)
    for (const ParamInfo& p : layout->entries())
      if (preconditioned(p)) order.push_back(&p);
  auto cost = [](const ParamInfo* p) { return std::pow(double(cols_of(*p)), 3) + std::pow(double(rows_of(*p)), 3); };
  std::stable_sort(order.begin(), order.end(), [&](const ParamInfo* a, const ParamInfo* b) { return cost(a) > cost(b); });
  std::vector<double> load(size_t(comm_->size()), 0.0);
  for (const ParamInfo* p : order) {
    const size_t w = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    matrices_.at(p).worker = int(w);
    load[w] += cost(p);
  }
}

const Kfac::Matrix& Kfac::matrix(const ParamInfo& p) const {
  auto it = matrices_.find(&p);
  EXA_CHECK(it != matrices_.end(), "kfac: {} is not a matrix of the chunks it was connected to (Optimizer::connect)",
            p.name);
  return it->second;
}

int Kfac::inverse_worker(const ParamInfo& p) const { return topo_.replicated ? matrix(p).worker : comm_->rank(); }
int Kfac::first_grad_worker(const ParamInfo& p) const { return inverse_worker(p) / group_ * group_; }

bool Kfac::is_grad_worker(const ParamInfo& p) const {
  if (!topo_.replicated) return true;  // the owner
  const int first = first_grad_worker(p), r = comm_->rank();
  return r >= first && r < first + group_;
}
bool Kfac::computes_inverse(const ParamInfo& p) const { return !topo_.replicated || matrix(p).worker == comm_->rank(); }

bool Kfac::holds_entry_state(const ParamInfo& p, size_t spec) const {
  return !preconditioned(p) || spec < kQA || is_grad_worker(p);
}

int Kfac::entry_state_saver(const ParamInfo& p, size_t spec) const {
  return topo_.replicated && preconditioned(p) && spec >= kQA ? matrix(p).worker : -1;
}

void Kfac::begin_step(int64_t step) {
  capturing_ = step >= 1 && (step - 1) % cfg_.factor_update_steps == 0;
  if (!capturing_) return;
  if (!stats_.empty()) be_.zero(stats_.data(), sizeof(float) * size_t(stats_.size()));
  for (auto& [p, m] : matrices_) m.rows = 0;
}

// S_A += x^T x, S_G += dy^T dy over the micro-batch's rows.
void Kfac::linear_backward(const ParamInfo& w, const float* x, int64_t ldx, const float* dy, int64_t ldy,
                           int64_t rows) {
  Matrix& m = matrices_.at(&w);
  const int64_t out = rows_of(w), in = cols_of(w);
  be_.gemm(true, false, in, in, rows, 1.0f, x, ldx, x, ldx, 1.0f, stats_.data() + m.a_off, in);
  be_.gemm(true, false, out, out, rows, 1.0f, dy, ldy, dy, ldy, 1.0f, stats_.data() + m.g_off, out);
  m.rows += rows;
}

// The step's statistics summed over the replicas, then into the running averages of the matrices
// this rank updates: A = f A + (1 - f) S_A / N, G = f G + (1 - f) N S_G (f = 0 at step 1).
void Kfac::fold_factors(const std::vector<const EntryPart*>& ms, const OptimStep& ctx) {
  comm_->all_reduce_sum(stats_.data(), stats_.size(), "dp_kfac_factors");
  const float f = ctx.step == 1 ? 0.0f : cfg_.factor_decay;
  for (const EntryPart* e : ms) {
    const Matrix& m = matrix(e->p);
    EXA_CHECK(m.rows > 0, "kfac: no statistics of {} at step {}: the model's linear observer is not connected "
              "(Gpt::set_linear_observer)", e->p.name, ctx.step);
    const double n = double(m.rows) * double(comm_->size());  // every replica sees as many rows
    const int64_t out = rows_of(e->p), in = cols_of(e->p);
    float *A = e->entry_state[kA], *G = e->entry_state[kG];
    float *sa = stats_.data() + m.a_off, *sg = stats_.data() + m.g_off;
    be_.scale(sa, float((1.0 - f) / n), in * in);
    be_.scale(sg, float((1.0 - f) * n), out * out);
    be_.scale(A, f, in * in);
    be_.scale(G, f, out * out);
    be_.add_inplace(A, sa, in * in);
    be_.add_inplace(G, sg, out * out);
  }
}

// Each matrix's inverse worker decomposes both factors (a failure keeps the previous ones) and sends
// the result to its other gradient workers; every replica walks the matrices in the same order.
void Kfac::refresh_eigen(const std::vector<const EntryPart*>& ms) {
  for (const EntryPart* e : ms) {
    matrices_.at(&e->p).ready = -1;  // known again after this refresh
    if (!computes_inverse(e->p)) continue;
    float* const* s = e->entry_state;
    if (!be_.sym_eigh(s[kQA], s[kDA], s[kA], cols_of(e->p))) fallbacks_++;
    if (!be_.sym_eigh(s[kQG], s[kDG], s[kG], rows_of(e->p))) fallbacks_++;
  }
  if (!topo_.replicated || group_ == 1) return;
  const int me = comm_->rank();
  for (const EntryPart* e : ms) {
    const int w = matrix(e->p).worker, first = first_grad_worker(e->p);
    if (me != w && !is_grad_worker(e->p)) continue;
    const int64_t out = rows_of(e->p), in = cols_of(e->p);
    float* const* s = e->entry_state;
    const std::pair<size_t, int64_t> parts[] = {{kQA, in * in}, {kDA, in}, {kQG, out * out}, {kDG, out}};
    for (int r = first; r < first + group_; r++) {
      if (r == w || (me != w && me != r)) continue;
      for (const auto& [k, n] : parts) {
        if (me == w) comm_->send(s[k], n, r, "dp_kfac_eigen");
        else comm_->recv(s[k], n, w);
      }
    }
  }
}

// Eigenvectors are never 0 once decomposed (orthonormal columns): all 0 means none yet (the first
// decomposition failed). Known after each refresh, or found from the (loaded) state once.
bool Kfac::has_eigenbases(const EntryPart& e) {
  Matrix& m = matrices_.at(&e.p);
  if (m.ready < 0)
    m.ready = be_.sum_squares(e.entry_state[kQA], cols_of(e.p) * cols_of(e.p)) > 0 &&
              be_.sum_squares(e.entry_state[kQG], rows_of(e.p) * rows_of(e.p)) > 0;
  return m.ready == 1;
}

// P of every matrix this rank is a gradient worker of, into pgrad_ (g itself for a matrix without
// eigenbases yet); returns lr^2 <P, g> summed over the matrices this rank is the inverse worker
// (or owner) of.
double Kfac::precondition(const std::vector<const EntryPart*>& ms, const OptimStep& ctx) {
  double vg = 0;
  for (const EntryPart* e : ms) {
    if (!is_grad_worker(e->p)) continue;
    float* P = pgrad_.data() + matrix(e->p).p_off;
    if (!has_eigenbases(*e)) {
      be_.copy(P, e->grads, sizeof(float) * size_t(e->n));
      be_.scale(P, ctx.grad_scale, e->n);
    } else {
      precondition_one(*e, P, ctx.grad_scale);
    }
    if (cfg_.kl_clip > 0 && computes_inverse(e->p))
      vg += double(ctx.lr) * double(ctx.lr) * double(ctx.grad_scale) * be_.dot(P, e->grads, e->n);
  }
  return vg;
}

// P = QG [(QG^T g QA) / (dG dA^T + damping)] QA^T, g = grad_scale * the entry's gradient.
void Kfac::precondition_one(const EntryPart& e, float* P, float grad_scale) {
  const int64_t out = rows_of(e.p), in = cols_of(e.p);
  float* const* s = e.entry_state;
  float* tmp = reserve_scratch(be_, tmp_, out * in, "kfac scratch");
  // V = QG^T g QA [out, in];  V /= dG dA^T + damping;  P = QG V QA^T
  be_.gemm(true, false, out, in, out, grad_scale, s[kQG], out, e.grads, in, 0.0f, tmp, in);
  be_.gemm(false, false, out, in, in, 1.0f, tmp, in, s[kQA], in, 0.0f, P, in);
  be_.eigen_damped_divide(P, s[kDG], s[kDA], out, in, cfg_.damping);
  be_.gemm(false, false, out, in, out, 1.0f, s[kQG], out, P, in, 0.0f, tmp, in);
  be_.gemm(false, true, out, in, in, 1.0f, tmp, in, s[kQA], in, 0.0f, P, in);
}

// Replica r outside a matrix's gradient workers [first, first + g) receives its P from worker
// first + (r mod g); every replica walks the matrices and the receivers in the same order.
void Kfac::share_preconditioned(const std::vector<const EntryPart*>& ms) {
  const int dp = comm_->size(), me = comm_->rank();
  if (!topo_.replicated || group_ == dp) return;
  for (const EntryPart* e : ms) {
    const int first = first_grad_worker(e->p);
    float* P = pgrad_.data() + matrix(e->p).p_off;
    for (int r = 0; r < dp; r++) {
      if (r >= first && r < first + group_) continue;
      const int src = first + r % group_;
      if (me == src) comm_->send(P, e->n, r, "dp_kfac_grad");
      else if (me == r) comm_->recv(P, e->n, src);
    }
  }
}

void Kfac::prepare_step(const std::vector<EntryPart>& parts, const OptimStep& ctx) {
  std::vector<const EntryPart*> ms;
  int64_t total = 0;
  for (const EntryPart& e : parts) {
    if (!preconditioned(e.p)) continue;
    check_whole_entry("kfac", e);
    matrices_.at(&e.p).p_off = total;
    total += e.n;
    ms.push_back(&e);
  }
  reserve_scratch(be_, pgrad_, total, "kfac preconditioned gradients");
  if (capturing_) fold_factors(ms, ctx);
  if ((ctx.step - 1) % cfg_.inv_update_steps == 0) refresh_eigen(ms);
  const double vg = precondition(ms, ctx);
  share_preconditioned(ms);
  nu_ = 1;
  if (cfg_.kl_clip > 0) {
    const double total_vg = std::fabs(comm_->sum_over_world(vg));
    if (total_vg > 0) nu_ = float(std::min(1.0, std::sqrt(double(cfg_.kl_clip) / total_vg)));
  }
}

void Kfac::update(const EntryPart& e, const OptimStep& ctx) {
  check_whole_entry("kfac", e);
  const float wd = e.p.decay ? cfg_.weight_decay : 0.0f;
  float* buf = e.entry_state[kMomentum];
  if (!preconditioned(e.p))
    return be_.sgd_update(e.params, e.grads, buf, e.n, ctx.lr, cfg_.momentum, cfg_.nesterov, wd, ctx.grad_scale);
  const float* P = pgrad_.data() + matrix(e.p).p_off;
  be_.sgd_update(e.params, P, buf, e.n, ctx.lr, cfg_.momentum, cfg_.nesterov, wd, nu_);
}

}  // namespace exatrain
