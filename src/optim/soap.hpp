// SOAP: Adam in Shampoo's eigenbasis (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo
// using Adam", arXiv 2409.11321, and its reference code soap.py), on every entry; a side of a 2-D
// entry larger than max_preconditioner_dim, and every 1-D entry, keeps the identity basis (so those
// get plain Adam, as soap.py's precondition_1d = False). docs/optimizers.md.
//
// Per whole entry W [m, n], g = grad_scale * grad, f = factor_decay (soap.py's shampoo_beta):
//   step 1: L = (1 - f) g g^T, R = (1 - f) g^T g; Q_L, Q_R = their eigenvectors, eigenvalues
//           descending (Backend::sym_eigenbasis); W is not changed (soap.py skips the first step,
//           so that a step never uses its own gradient in the projection)
//   step s > 1, t = s - 1:
//     G~ = Q_L^T g Q_R;  m~ = b1 m~ + (1 - b1) G~;  v~ = b2 v~ + (1 - b2) G~^2   (moments in the basis)
//     W = W - lr sqrt(1 - b2^t) / (1 - b1^t) Q_L (m~ / (sqrt(v~) + eps)) Q_R^T;  W = W (1 - lr wd)
//     L = f L + (1 - f) g g^T;  R likewise
//     every precondition_frequency t: m = Q_L m~ Q_R^T;  Q = qr(L Q_sorted).Q with Q's columns
//       sorted by diag(Q^T L Q) (Backend::power_qr_refresh), v~ permuted alike;  m~ = Q_L^T m Q_R
// soap.py rotates m~ back and forth at every step; with the basis unchanged that is the identity
// (Q is orthogonal), so here it happens only when the basis changes.
// A failed or non-finite eigenbasis keeps the previous one (the identity before the first):
// fallbacks() counts them.
//
// Owns: the SOAP update, its factor and basis state, its scratch. May use: core/, job/, backend/,
// model/layout.hpp, optim/optimizer.hpp.
#pragma once
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

struct SoapConfig {
  float factor_decay = 0.95f;             // soap.py's shampoo_beta (-1 there: its beta2, 0.95)
  int64_t max_preconditioner_dim = 10000; // soap.py's max_precond_dim
  int64_t precondition_frequency = 10;    // soap.py's default
  AdamWConfig adam;                       // beta1, beta2, eps and the decoupled weight decay
};

class Soap final : public Optimizer {
 public:
  Soap(Backend& backend, SoapConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "soap"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_entries() const override { return true; }
  // "exp_avg" (m~, in the basis), "exp_avg_sq" (v~) of the entry's shape; per rotated side of a
  // 2-D entry "soap_GG_L", "soap_Q_L" [m, m] and "soap_GG_R", "soap_Q_R" [n, n].
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  int64_t fallbacks() const override { return fallbacks_; }
  int64_t scratch_bytes() const override { return bytes_of({&g_, &proj_, &dir_, &tmp_}); }

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  // One entry's shape and its rotated sides' factors and bases (null: the identity).
  struct Sides {
    int64_t m = 1, n = 1;
    float *L = nullptr, *QL = nullptr, *R = nullptr, *QR = nullptr;
  };
  Sides sides(const EntryPart& e) const;
  // out = QL^T in QR (to the basis) or QL in QR^T (back); out and in [m n], distinct.
  void rotate(float* out, const float* in, const Sides& s, bool to_basis);
  void update_factors(const Sides& s, const float* g);
  void init_bases(const Sides& s);
  void refresh_bases(const Sides& s, float* m, float* v);
  SoapConfig cfg_;
  DeviceBuffer g_, proj_, dir_, tmp_;  // [m n] scratch of the largest entry so far
  int64_t fallbacks_ = 0;
};

}  // namespace exatrain
