// What the model shows of its linear maps to an optimizer that needs their statistics (K-FAC's
// Kronecker factors: optim/kfac.hpp), without the model knowing any optimizer: in every layer's
// backward, once per layer matrix, the rows that entered the map and the gradient that left it.
// The model calls it; the trainer connects the optimizer's observer (Gpt::set_linear_observer).
//
// For a matrix entry w of shard shape [out, in] (y = x w^T): x [rows, in] with row stride ldx is
// the map's input, dy [rows, out] with row stride ldy is d(objective)/dy, both as this rank holds
// them under tensor parallelism (a column-parallel map: the replicated x and this rank's output
// columns; a row-parallel map: this rank's input columns and the full dy), rows = B*T of the
// micro-batch. sum over rows of dy^T x is the micro-batch's contribution to w's gradient (the
// tests check exactly that). Fused maps are reported per entry: q/k/v share x and take their own
// columns of the fused dqkv; gate/up (SwiGLU) likewise.
//
// Owns: the observer interface. May use: model/layout.hpp.
#pragma once
#include <cstdint>

#include "model/layout.hpp"

namespace exatrain {

class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  // Whether this backward's statistics are wanted at all (the model skips the calls otherwise).
  virtual bool observing() const = 0;
  // Called during backward, after dy is final, for every layer matrix of the stage; `w` is the
  // entry of the model's layout (its address identifies it for the step).
  virtual void linear_backward(const ParamInfo& w, const float* x, int64_t ldx, const float* dy, int64_t ldy,
                               int64_t rows) = 0;
};

}  // namespace exatrain
