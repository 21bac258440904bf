// optimizer_state: what each train.optimizer keeps per parameter element (job/job.hpp), for the
// memory model; the counts are those of the state optim/ allocates (Adafactor's rounded, below).
#include "job/job.hpp"

namespace exatrain {

OptimizerState optimizer_state(const TrainSpec& t) {
  if (t.mixed.active()) {  // the matrix optimizer's on the matrices, the first-order one's elsewhere
    TrainSpec matrix = t, first = t;
    matrix.mixed = first.mixed = MixedSpec{};
    first.optimizer = t.mixed.first_order();
    const OptimizerState a = optimizer_state(matrix), b = optimizer_state(first);
    const double kept = t.mixed.first_order_steps > 0 ? b.per_matrix_element : 0;  // through the schedule
    return {a.per_matrix_element + kept, b.per_other_element, true};
  }
  const std::string& o = t.optimizer;
  if (o == "sgd" || o == "lion") return {1, 1, false};  // the momentum buffer / Lion's m
  if (o == "lamb") return {2, 2, true};                 // Adam's moments; a trust ratio per entry
  if (o == "muon") return {1, 2, true};                 // momentum per matrix; AdamW's two elsewhere
  // Shampoo: the grafting Adam's two, and per full B x B block a factor and a root on each side
  // (4 B^2 per B^2 elements); a matrix smaller than a block has 2 (m^2 + n^2) / (m n) instead.
  if (o == "shampoo") return {6, 2, true};
  // SOAP (Vyas et al. 2024, arXiv 2409.11321): Adam's two in the eigenbasis, and per rotated side
  // of an [m, n] matrix its factor and eigenbasis (2 m^2 + 2 n^2 per m n elements: 4 for a square
  // one, more for a tensor-parallel shard), counted like Shampoo's full blocks.
  if (o == "soap") return {6, 2, true};
  // K-FAC (optim/kfac.hpp), per element: the momentum and the step's preconditioned gradient P
  // (scratch, but resident) on the matrices, SGD's momentum elsewhere. Its factors, eigenbases and
  // statistics have the matrices' side lengths, not their elements: plan/optimizer_cost.cpp's
  // kfac_factor_bytes counts them exactly, and plan/memory.cpp adds them.
  if (o == "kfac") return {2, 1, true};
  if (o == "adafactor") {
    // Factored: a row and a column mean per 2-D entry (embeddings too), (m + n) / (m n) values
    // per element, counted as 0; the 1-D entries' full moments (norms, biases: under 0.1% of a
    // GPT's parameters) are not counted either.
    const double m = t.adafactor.beta1 > 0 ? 1 : 0;  // the optional first moment
    const double v = t.adafactor.factored ? 0 : 1;
    return {m + v, m + v, true};
  }
  return {2, 2, false};  // adamw
}

}  // namespace exatrain
