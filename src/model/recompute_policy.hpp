// The activation-recomputation policy in one place: which activations a layer keeps between
// its forward and backward, and what backward rebuilds before running. GptOptions::recompute
// picks the mode; Gpt asks these questions when it allocates activations and when it runs a
// layer's backward (the buffers and the re-run itself are Gpt's).
#pragma once
#include "job/job.hpp"

namespace exatrain {

struct RecomputePolicy {
  Recompute mode = Recompute::none;

  // Each layer keeps its own saved activations (none, selective). false (full): all layers
  // share ONE set, and only the layer inputs (the residual stream) are kept.
  bool layer_keeps_activations() const { return mode != Recompute::full; }
  // A layer's own set includes what its attention saved for backward (none): the backend's
  // (Backend::attention_saved_floats: the probabilities [B,Hq,T,T] on the CPU backend and CUDA's
  // float32 path; CUDA's fused kernel under mixed precision: per-row log-sum-exp and its output).
  // false (selective): one such buffer shared by all layers.
  bool layer_keeps_attention_state() const { return mode == Recompute::none; }
  // Before a layer's backward: re-run its forward from the saved layer input, refilling the
  // shared set (full).
  bool rerun_layer_before_backward() const { return mode == Recompute::full; }
  // Before a layer's backward: recompute the attention's saved state from the saved qkv into
  // the shared buffer (selective).
  bool recompute_attention_before_backward() const { return mode == Recompute::selective; }
};

}  // namespace exatrain
