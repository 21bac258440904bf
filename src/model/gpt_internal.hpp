// Private structures of Gpt shared by gpt.cpp and gpt_layer.cpp.
#pragma once
#include "model/gpt.hpp"

namespace exatrain {

// Offsets (floats) of one layer's parameters; the same offsets index the gradient arena.
// -1 = absent (norm biases with rmsnorm, every linear bias with model.bias = false).
struct Gpt::LayerOffsets {
  int64_t ln1_w = -1, ln1_b = -1;
  int64_t qkv_w = -1, qkv_b = -1;  // fused local [(Hq+2Hkv)*D, C], [(Hq+2Hkv)*D]
  int64_t o_w = -1, o_b = -1;      // [C, Hq*D], [C]
  int64_t ln2_w = -1, ln2_b = -1;
  int64_t fc1_w = -1, fc1_b = -1;  // gelu: [F, C], [F]; swiglu: fused gate|up [2F, C], [2F]
  int64_t fc2_w = -1, fc2_b = -1;  // [C, F], [C]
  // The layer's matrices as layout entries (indices into layout().entries()), for a LinearObserver:
  // q, k, v, o; fc1 and fc2 (gelu) or gate, up and down (swiglu: up in `up`).
  size_t q = 0, k = 0, v = 0, o = 0, fc1 = 0, up = 0, fc2 = 0;
};

// Activations of one layer saved by forward for backward (N = B*T).
struct Gpt::Acts {
  float* ln1 = nullptr;       // [N, C] norm_1 output
  float* ln1_mean = nullptr;  // [N] (layernorm only)
  float* ln1_rstd = nullptr;  // [N]
  float* qkv = nullptr;       // [N, (Hq+2Hkv)*D] after rope
  float* attn_saved = nullptr;  // attention's state for backward (Backend::attention_saved_floats)
  float* att = nullptr;       // [N, Hq*D] attention output before the out-projection
  float* mid = nullptr;       // [N, C] residual after attention
  float* ln2 = nullptr;       // [N, C]
  float* ln2_mean = nullptr;  // [N]
  float* ln2_rstd = nullptr;  // [N]
  float* fc = nullptr;        // [N, F] (gelu) or [N, 2F] (swiglu): FC1 output
  float* fc_act = nullptr;    // [N, F] activation output
  // Mixed precision: the kept GEMM inputs in 16 bits (ln1, att, ln2, fc_act above then point at
  // one float32 scratch shared by all layers, Gpt::fwd32_, valid only during the forward), and the
  // GEMM outputs that the backward reads, qkv and fc, in 16 bits as PyTorch's autocast and Megatron
  // keep them (qkv and fc above then point at Gpt::wide32_: float32 staging shared by all layers;
  // Gpt::widen_kept refills it in the backward). mid, part of the residual stream, likewise unless
  // GptOptions::fp32_residual.
  uint16_t* ln1_h = nullptr;     // [N, C]
  uint16_t* att_h = nullptr;     // [N, Hq*D]
  uint16_t* ln2_h = nullptr;     // [N, C]
  uint16_t* fc_act_h = nullptr;  // [N, F]
  uint16_t* qkv_h = nullptr;     // [N, (Hq+2Hkv)*D] after rope
  uint16_t* fc_h = nullptr;      // [N, F] or [N, 2F]
  uint16_t* mid_h = nullptr;     // [Ns, C] (16-bit residual; mid then points at Gpt::mid32_)
};

}  // namespace exatrain
