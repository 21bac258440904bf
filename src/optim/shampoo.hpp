// Shampoo (Gupta, Koren & Singer 2018, arXiv 1802.09568; Anil et al. 2020, "Scalable Second
// Order Optimization for Deep Learning", arXiv 2002.09018; Meta's Distributed Shampoo,
// arXiv 2309.06497) with Adam grafting, for the 2-D entries; AdamW for the rest. docs/optimizers.md.
//
// On a whole entry W [m, n], cut into blocks of at most max_preconditioner_dim rows and columns,
// g = grad_scale * grad, t the step:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2                 (the grafting Adam's moments)
//   per block G_b:  L_b = f L_b + (1 - f) G_b G_b^T,  R_b = f R_b + (1 - f) G_b^T G_b   (f: factor_decay)
//   every precondition_frequency steps from start_preconditioning_step on:
//     L_b^{-1/4}, R_b^{-1/4} from eigendecompositions (Backend::sym_inverse_root, eigenvalues + epsilon)
//   A = (m / bc1) / (sqrt(v / bc2) + eps)                           (Adam's direction)
//   S = blockwise L_b^{-1/4} (m / bc1)_b R_b^{-1/4};  D = S |A|_F / |S|_F   (layer-wise grafting:
//       Shampoo's direction with Adam's step size, Agarwal et al. 2020, arXiv 2002.11803)
//   before the first roots (or while an entry has none): D = A
//   W = W (1 - lr wd) - lr D
// A failed or non-finite root keeps the block's previous one (fallbacks() counts them).
//
// Owns: the Shampoo update, its factor and root state, its scratch. May use: core/, job/,
// backend/, model/layout.hpp, optim/optimizer.hpp.
#pragma once
#include <string>
#include <vector>

#include "optim/optimizer.hpp"

namespace exatrain {

struct ShampooConfig {
  float factor_decay = 0.999f;           // f above; 1 would sum (Gupta et al.'s original)
  double epsilon = 1e-12;                // added to the factors' eigenvalues (Distributed Shampoo's)
  int64_t max_preconditioner_dim = 1024; // block size (Distributed Shampoo's default)
  int64_t precondition_frequency = 20;   // steps between root refreshes
  int64_t start_preconditioning_step = 20;
  AdamWConfig adamw;                     // the grafting Adam and the 1-D entries
};

class Shampoo final : public Optimizer {
 public:
  Shampoo(Backend& backend, ShampooConfig config) : Optimizer(backend), cfg_(config) {}
  const char* name() const override { return "shampoo"; }
  std::vector<std::string> state_names() const override { return {}; }
  bool needs_whole_entries() const override { return true; }
  // 2-D entries: "exp_avg", "exp_avg_sq" [m, n]; "shampoo_L", "shampoo_R" (the blocks' factors,
  // concatenated: sum of mb^2 and of nb^2 floats) and "shampoo_L_root", "shampoo_R_root" (alike);
  // other entries: AdamW's "exp_avg", "exp_avg_sq".
  std::vector<EntryStateSpec> entry_states(const ParamInfo& p) const override;
  static bool preconditioned(const ParamInfo& p) { return p.shard_shape.size() == 2; }
  int64_t fallbacks() const override { return fallbacks_; }
  int64_t scratch_bytes() const override { return bytes_of({&adam_, &mhat_, &dir_, &tmp_}); }

  // One block of an [m, n] entry: rows [r0, r0 + mb), columns [c0, c0 + nb), and where its L and
  // R start in the concatenated factor tensors.
  struct Block {
    int64_t r0, mb, c0, nb, l_off, r_off;
  };
  static std::vector<Block> blocks(int64_t m, int64_t n, int64_t max_dim);

 protected:
  void update(const EntryPart& part, const OptimStep& ctx) override;

 private:
  // D = S |A| / |S| into dir_; false when there is no usable root (the step is then along A).
  bool shampoo_direction(const EntryPart& e, const std::vector<Block>& bl, float bc1);
  void refresh_roots(const EntryPart& e, const std::vector<Block>& bl);
  ShampooConfig cfg_;
  DeviceBuffer adam_, mhat_, dir_, tmp_;  // [m n] scratch of the largest entry so far
  int64_t fallbacks_ = 0;
};

}  // namespace exatrain
