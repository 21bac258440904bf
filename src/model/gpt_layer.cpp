// One transformer layer as a forward/backward pair (pre-norm GPT block):
//   h   = norm_1(x)                       [Ns, C] -> [N, C]  (all-gather under seq. parallel)
//   qkv = rope(h W_qkv^T + b_qkv)         [N, (Hq+2Hkv)*D]   column-parallel (heads)
//   (every bias b_* is absent when model.bias = false)
//   a   = causal_attention(qkv)           [N, Hq*D]
//   mid = x + (a W_o^T) + b_o             [Ns, C]            row-parallel: all-reduce (or
//                                                            reduce-scatter under seq. parallel)
//   h2  = norm_2(mid)                     [Ns, C] -> [N, C]
//   fc  = h2 W_1^T + b_1                  [N, F] or [N, 2F]  column-parallel
//   y   = mid + act(fc) W_2^T + b_2       [Ns, C]            row-parallel
// N = B*T rows; Ns = N, or N/tp with sequence parallelism (this rank's rows of the residual).
// Every matrix product goes through linear_forward / linear_backward (below): float32, or under
// mixed precision 16-bit operands with float32 accumulation (gpt.hpp GptOptions::precision).
#include <algorithm>

#include "model/gpt_internal.hpp"

namespace exatrain {

// out may be x itself (Gpt::x32_): x is read only before out is first written.
void Gpt::layer_forward(int64_t l, const float* x, float* out, Acts& a) {
  const LayerOffsets& o = layer_off_[size_t(l)];
  const ModelSpec& m = opt_.model;
  const int64_t N = B_ * T_, Ns = Ns_, C = C_, QKV = (Hq_ + 2 * Hkv_) * D_, HD = Hq_ * D_;
  const int64_t FC = m.activation == Activation::swiglu ? 2 * F_ : F_;
  const float* P = params_;

  // ---- attention block ----
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, o.ln1_w, o.ln1_b);  // a.ln1 [N, C]
  // qkv[N, QKV] = ln1[N, C] @ W_qkv[QKV, C]^T + b
  linear_forward(a.ln1, a.ln1_h, C, o.qkv_w, QKV, a.qkv);
  if (o.qkv_b >= 0) be_.add_bias(a.qkv, P + o.qkv_b, N, QKV);
  if (m.position == Position::rope)  // rotate the Hq query and Hkv key heads (adjacent)
    be_.rope(a.qkv, B_, T_, QKV, Hq_ + Hkv_, D_, float(m.rope_theta), false);
  round_kept(a.qkv, a.qkv_h, N * QKV);
  be_.attention_forward(a.att, a.attn_saved, a.qkv, B_, T_, Hq_, Hkv_, D_, attention_operands());
  // mid[Ns, C] = sum over tp of att[N, HD] @ W_o[C, HD]^T, + b_o + x
  float* part = region_exit(a.mid);
  linear_forward(a.att, a.att_h, HD, o.o_w, C, part);
  region_exit_done(part, a.mid);
  if (o.o_b >= 0) be_.add_bias(a.mid, P + o.o_b, Ns, C);
  be_.add_inplace(a.mid, x, Ns * C);
  round_kept(a.mid, a.mid_h, Ns * C);

  // ---- MLP block ----
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, o.ln2_w, o.ln2_b);  // a.ln2 [N, C]
  // fc[N, FC] = ln2[N, C] @ W_1[FC, C]^T + b_1
  linear_forward(a.ln2, a.ln2_h, C, o.fc1_w, FC, a.fc);
  if (o.fc1_b >= 0) be_.add_bias(a.fc, P + o.fc1_b, N, FC);
  round_kept(a.fc, a.fc_h, N * FC);
  if (m.activation == Activation::gelu)
    be_.gelu_forward(a.fc_act, a.fc, N * F_);
  else
    be_.swiglu_forward(a.fc_act, a.fc, N, F_);
  // out[Ns, C] = sum over tp of fc_act[N, F] @ W_2[C, F]^T, + b_2 + mid
  part = region_exit(out);
  linear_forward(a.fc_act, a.fc_act_h, F_, o.fc2_w, C, part);
  region_exit_done(part, out);
  if (o.fc2_b >= 0) be_.add_bias(out, P + o.fc2_b, Ns, C);
  be_.add_inplace(out, a.mid, Ns * C);
}

void Gpt::layer_backward(int64_t l, const float* x, const float* dout, float* dx, Acts& a) {
  const LayerOffsets& o = layer_off_[size_t(l)];
  const ModelSpec& m = opt_.model;
  const int64_t N = B_ * T_, Ns = Ns_, C = C_, QKV = (Hq_ + 2 * Hkv_) * D_, HD = Hq_ * D_;
  const int64_t FC = m.activation == Activation::swiglu ? 2 * F_ : F_;
  float* G = grads_;

  if (recompute_.recompute_attention_before_backward())  // its saved state was not kept
    be_.attention_forward(nullptr, a.attn_saved, widen_kept(a.qkv, a.qkv_h, N * QKV), B_, T_, Hq_, Hkv_, D_,
                          attention_operands());

  // ---- MLP block: dout is d/d out [Ns, C] ----
  if (o.fc2_b >= 0) be_.bias_backward(G + o.fc2_b, dout, Ns, C);
  const float* dout_full = grad_to_full(dout);  // [N, C]
  // dW_2[C, F] += dout^T[C, N] @ fc_act[N, F];  dfc_act[N, F] = dout[N, C] @ W_2[C, F]
  linear_backward(dout_full, a.fc_act, a.fc_act_h, F_, o.fc2_w, C, dfc_act_);
  observe(o.fc2, a.fc_act, a.fc_act_h, F_, dout_full, C);
  const float* fc = widen_kept(a.fc, a.fc_h, N * FC);
  if (m.activation == Activation::gelu)
    be_.gelu_backward(dfc_, fc, dfc_act_, N * F_);
  else
    be_.swiglu_backward(dfc_, fc, dfc_act_, N, F_);
  if (o.fc1_b >= 0) be_.bias_backward(G + o.fc1_b, dfc_, N, FC);
  observe(o.fc1, a.ln2, a.ln2_h, C, dfc_, FC);  // gelu: fc1; swiglu: gate (columns [0, F) of dfc) and up
  if (m.activation == Activation::swiglu) observe(o.up, a.ln2, a.ln2_h, C, dfc_ + F_, FC);
  // dW_1[FC, C] += dfc^T[FC, N] @ ln2[N, C];  dln2[N, C] = dfc[N, FC] @ W_1[FC, C]
  linear_backward(dfc_, a.ln2, a.ln2_h, C, o.fc1_w, FC, dln_);
  const float* dln2 = grad_to_local();  // [Ns, C], summed over tp
  // dmid = dout (residual) + norm_2 backward
  be_.copy(dmid_, dout, sizeof(float) * size_t(Ns * C));
  norm_backward(dmid_, o.ln2_w, o.ln2_b, dln2, widen_kept(a.mid, a.mid_h, Ns * C), a.ln2_mean, a.ln2_rstd);

  // ---- attention block ----
  if (o.o_b >= 0) be_.bias_backward(G + o.o_b, dmid_, Ns, C);
  const float* dmid_full = grad_to_full(dmid_);  // [N, C]
  // dW_o[C, HD] += dmid^T[C, N] @ att[N, HD];  datt[N, HD] = dmid[N, C] @ W_o[C, HD]
  linear_backward(dmid_full, a.att, a.att_h, HD, o.o_w, C, datt_);
  observe(o.o, a.att, a.att_h, HD, dmid_full, C);
  be_.attention_backward(dqkv_, datt_, widen_kept(a.qkv, a.qkv_h, N * QKV), a.attn_saved, B_, T_, Hq_, Hkv_, D_,
                         attention_operands());
  if (m.position == Position::rope)  // gradient w.r.t. the pre-rotation q and k
    be_.rope(dqkv_, B_, T_, QKV, Hq_ + Hkv_, D_, float(m.rope_theta), true);
  if (o.qkv_b >= 0) be_.bias_backward(G + o.qkv_b, dqkv_, N, QKV);
  observe(o.q, a.ln1, a.ln1_h, C, dqkv_, QKV);  // q, k, v: their columns of the fused dqkv
  observe(o.k, a.ln1, a.ln1_h, C, dqkv_ + Hq_ * D_, QKV);
  observe(o.v, a.ln1, a.ln1_h, C, dqkv_ + (Hq_ + Hkv_) * D_, QKV);
  // dW_qkv[QKV, C] += dqkv^T @ ln1;  dln1[N, C] = dqkv[N, QKV] @ W_qkv[QKV, C]
  linear_backward(dqkv_, a.ln1, a.ln1_h, C, o.qkv_w, QKV, dln_);
  const float* dln1 = grad_to_local();  // [Ns, C]
  // dx = dmid (residual) + norm_1 backward
  be_.copy(dx, dmid_, sizeof(float) * size_t(Ns * C));
  norm_backward(dx, o.ln1_w, o.ln1_b, dln1, x, a.ln1_mean, a.ln1_rstd);
}

void Gpt::observe(size_t entry, const float* x, const uint16_t* x16, int64_t ldx, const float* dy, int64_t ldy) {
  if (!observer_ || !observer_->observing()) return;
  if (mixed_) {  // the GEMM's input as the GEMM saw it: the kept 16-bit copy
    // Widened into fwd32_ ([N, max(C, Hq*D, F)], the forward's staging of the GEMM inputs): the
    // backward reads nothing from it, and the observer consumes x before this call returns.
    be_.half_to_f32(half_, fwd32_, x16, B_ * T_ * ldx);
    x = fwd32_;
  }
  observer_->linear_backward(layout_.entries()[entry], x, ldx, dy, ldy, B_ * T_);
}

void Gpt::round_kept(float* x, uint16_t* kept, int64_t n) {
  if (kept == nullptr) return;
  be_.f32_to_half(half_, kept, x, n);
  be_.half_to_f32(half_, x, kept, n);  // exact: x now holds what the backward widens
}

const float* Gpt::widen_kept(float* x, const uint16_t* kept, int64_t n) {
  if (kept != nullptr) be_.half_to_f32(half_, x, kept, n);  // exact
  return x;
}

// ---- the linear layers' GEMMs: float32, or 16-bit operands with float32 accumulation ----------

void Gpt::linear_forward(const float* x32, uint16_t* x16, int64_t I, int64_t w, int64_t O, float* y,
                         int64_t ldy) {
  const int64_t N = B_ * T_;
  if (ldy == 0) ldy = O;
  if (!mixed_) return be_.gemm(false, true, N, O, I, 1.0f, x32, I, params_ + w, I, 0.0f, y, ldy);
  be_.f32_to_half(half_, x16, x32, N * I);
  be_.gemm_half(half_, false, true, N, O, I, 1.0f, x16, I, weight_half(w, O * I), I, 0.0f, y, ldy);
}

void Gpt::linear_backward(const float* dy, const float* x32, const uint16_t* x16, int64_t I, int64_t w, int64_t O,
                          float* dx, int64_t ldy) {
  const int64_t N = B_ * T_;
  if (ldy == 0) ldy = O;
  if (!mixed_) {
    be_.gemm(true, false, O, I, N, 1.0f, dy, ldy, x32, I, 1.0f, grads_ + w, I);
    be_.gemm(false, false, N, I, O, 1.0f, dy, ldy, params_ + w, I, 0.0f, dx, I);
    return;
  }
  be_.f32_to_half(half_, dy16_, dy, N * ldy);
  be_.gemm_half(half_, true, false, O, I, N, 1.0f, dy16_, ldy, x16, I, 1.0f, grads_ + w, I);  // fp32 accumulation
  be_.gemm_half(half_, false, false, N, I, O, 1.0f, dy16_, ldy, weight_half(w, O * I), I, 0.0f, dx, I);
}

}  // namespace exatrain
