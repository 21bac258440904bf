// Gpt: parameter layout, buffers, stage forward/backward (embedding, layers, head + loss).
// The per-layer forward/backward pair is in gpt_layer.cpp.
#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "model/gpt_internal.hpp"

namespace exatrain {

std::optional<Half> half_format(Precision p) {
  if (p == Precision::bf16) return Half::bf16;
  if (p == Precision::fp16) return Half::f16;
  return std::nullopt;
}

Gpt::Gpt(Backend& backend, const GptOptions& options, ParallelHooks* hooks)
    : be_(backend), opt_(options), recompute_{options.recompute}, no_hooks_(backend),
      hooks_(hooks ? hooks : &no_hooks_) {
  const ModelSpec& m = opt_.model;
  const int tp = opt_.tp.size;
  if (opt_.stage.last_layer < 0) opt_.stage.last_layer = m.layers;
  if (opt_.seq <= 0) opt_.seq = m.seq_len;
  EXA_CHECK(tp >= 1 && opt_.tp.rank >= 0 && opt_.tp.rank < tp,
            "model: tensor-parallel rank {} of size {} is invalid", opt_.tp.rank, tp);
  EXA_CHECK(hooks != nullptr || tp == 1,
            "model: tp size {} needs ParallelHooks that implement the collectives", tp);
  EXA_CHECK(m.hidden % m.heads == 0, "model.hidden = {} must be divisible by model.heads = {}",
            m.hidden, m.heads);
  EXA_CHECK(m.kv_heads >= 1 && m.heads % m.kv_heads == 0,
            "model.kv_heads = {} must divide model.heads = {}", m.kv_heads, m.heads);
  EXA_CHECK(m.heads % tp == 0 && m.kv_heads % tp == 0 && m.ffn_hidden % tp == 0,
            "model: heads = {}, kv_heads = {} and ffn_hidden = {} must be divisible by tp = {}",
            m.heads, m.kv_heads, m.ffn_hidden, tp);
  EXA_CHECK(m.position != Position::rope || m.head_dim() % 2 == 0,
            "model: rope needs an even head dimension, got {}", m.head_dim());
  EXA_CHECK(0 <= opt_.stage.first_layer && opt_.stage.first_layer <= opt_.stage.last_layer &&
                opt_.stage.last_layer <= m.layers,
            "model: stage layers [{}, {}) are not inside [0, {})", opt_.stage.first_layer,
            opt_.stage.last_layer, m.layers);
  EXA_CHECK(opt_.seq >= 1 && opt_.seq <= m.seq_len, "model: sequence length {} not in [1, {}]",
            opt_.seq, m.seq_len);
  EXA_CHECK(opt_.micro_batch >= 1, "model: micro_batch must be >= 1, got {}", opt_.micro_batch);
  EXA_CHECK(opt_.activation_slots >= 1, "model: activation_slots must be >= 1, got {}",
            opt_.activation_slots);
  B_ = opt_.micro_batch;
  T_ = opt_.seq;
  C_ = m.hidden;
  first_ = opt_.stage.first_layer;
  L_ = opt_.stage.last_layer - first_;
  Hq_ = m.heads / tp;
  Hkv_ = m.kv_heads / tp;
  D_ = m.head_dim();
  F_ = m.ffn_hidden / tp;
  const VocabSlice vs = vocab_slice(m.vocab, tp, opt_.tp.rank);
  vocab_start_ = vs.start;
  vocab_local_ = vs.rows;
  EXA_CHECK(vocab_local_ > 0, "model: vocab {} too small for tp = {}", m.vocab, tp);
  logits_ld_ = (vocab_local_ + kLogitsRowAlign - 1) / kLogitsRowAlign * kLogitsRowAlign;
  sp_ = opt_.tp.sequence_parallel;
  EXA_CHECK(!sp_ || (B_ * T_) % tp == 0, "model: sequence parallelism needs micro_batch * seq "
            "= {} divisible by tp = {}", B_ * T_, tp);
  Ns_ = sp_ ? B_ * T_ / tp : B_ * T_;

  build_layout();
  const size_t arena_bytes = sizeof(float) * size_t(layout_.total());
  params_ = static_cast<float*>(opt_.lazy_params ? be_.alloc_bytes_lazy(arena_bytes) : be_.alloc_bytes(arena_bytes));
  grads_ = static_cast<float*>(opt_.lazy_grads ? be_.alloc_bytes_lazy(arena_bytes) : be_.alloc_bytes(arena_bytes));
  be_.label(params_, "parameter arena");
  be_.label(grads_, "gradient arena");
  mem_.params = mem_.grads = int64_t(sizeof(float)) * layout_.total();
  EXA_CHECK(opt_.precision != Precision::fp8, "model: fp8 is not a training precision (expected fp32, bf16 or fp16)");
  mixed_ = opt_.precision != Precision::fp32;
  residual16_ = mixed_ && !opt_.fp32_residual;
  if (mixed_) {
    half_ = *exatrain::half_format(opt_.precision);  // (Gpt::half_format() is the member)
    const size_t half_bytes = sizeof(uint16_t) * size_t(layout_.total());
    params_half_ = static_cast<uint16_t*>(opt_.lazy_params ? be_.alloc_bytes_lazy(half_bytes) : be_.alloc_bytes(half_bytes));
    be_.label(params_half_, "16-bit parameter copy");
    mem_.params += int64_t(half_bytes);
    half_fresh_.assign(layout_.entries().size(), 0);
  }
  allocate_activations();
}

Gpt::~Gpt() {
  be_.free_bytes(params_);
  be_.free_bytes(grads_);
  be_.free_bytes(params_half_);
  for (void* p : owned_) be_.free_bytes(p);
}

int64_t Gpt::add_param(const std::string& name, ParamRole role, int64_t unit, std::vector<int64_t> global,
                       int split, int64_t local, int64_t start, float init_std, float value) {
  using R = ParamRole;
  ParamInfo p;
  p.name = name;
  p.role = role;
  p.unit = unit;
  p.global_shape = global;
  p.shard_shape = global;
  if (split >= 0) p.shard_shape[size_t(split)] = local;
  p.split_dim = split;
  p.shard_start = split >= 0 ? start : 0;
  p.decay = role == R::matrix || role == R::embedding || role == R::head;
  // Used on this rank's rows only under sequence parallelism: the norms and the biases added
  // after a row-parallel exit (replicated over tp; the column-parallel biases are split).
  p.sp_partial_grad = sp_ && (role == R::norm || (role == R::bias && split < 0));
  p.init_std = init_std;
  p.init_value = value;
  return layout_.add(p);
}

void Gpt::add_layer_params(int64_t l) {
  const ModelSpec& m = opt_.model;
  const bool ln = m.norm == Norm::layernorm;
  const bool bias = m.bias;  // linear-layer biases (model.bias); norms follow model.norm
  const float std0 = 0.02f;
  // GPT-2's scaled init: residual output projections get std / sqrt(2 * layers).
  const float std_res = std0 / std::sqrt(2.0f * float(m.layers));
  const int r = opt_.tp.rank;
  const int64_t H = m.heads, KV = m.kv_heads, D = D_, C = C_, F = m.ffn_hidden;
  using R = ParamRole;
  auto add = [&](const std::string& name, ParamRole role, std::vector<int64_t> global, int split, int64_t local,
                 int64_t start, float init_std, float value) {
    return add_param(name, role, l, std::move(global), split, local, start, init_std, value);
  };
  const std::string p = "h." + std::to_string(l) + ".";
  LayerOffsets o;
  o.ln1_w = add(p + "ln_1.weight", R::norm, {C}, -1, 0, 0, 0, 1.0f);
  if (ln) o.ln1_b = add(p + "ln_1.bias", R::norm, {C}, -1, 0, 0, 0, 0.0f);
  o.q = layout_.entries().size();
  o.qkv_w = add(p + "attn.q_proj.weight", R::matrix, {H * D, C}, 0, Hq_ * D, r * Hq_ * D, std0, 0);
  o.k = layout_.entries().size();
  add(p + "attn.k_proj.weight", R::matrix, {KV * D, C}, 0, Hkv_ * D, r * Hkv_ * D, std0, 0);
  o.v = layout_.entries().size();
  add(p + "attn.v_proj.weight", R::matrix, {KV * D, C}, 0, Hkv_ * D, r * Hkv_ * D, std0, 0);
  if (bias) {
    o.qkv_b = add(p + "attn.q_proj.bias", R::bias, {H * D}, 0, Hq_ * D, r * Hq_ * D, 0, 0);
    add(p + "attn.k_proj.bias", R::bias, {KV * D}, 0, Hkv_ * D, r * Hkv_ * D, 0, 0);
    add(p + "attn.v_proj.bias", R::bias, {KV * D}, 0, Hkv_ * D, r * Hkv_ * D, 0, 0);
  }
  o.o = layout_.entries().size();
  o.o_w = add(p + "attn.o_proj.weight", R::matrix, {C, H * D}, 1, Hq_ * D, r * Hq_ * D, std_res, 0);
  if (bias) o.o_b = add(p + "attn.o_proj.bias", R::bias, {C}, -1, 0, 0, 0, 0);
  o.ln2_w = add(p + "ln_2.weight", R::norm, {C}, -1, 0, 0, 0, 1.0f);
  if (ln) o.ln2_b = add(p + "ln_2.bias", R::norm, {C}, -1, 0, 0, 0, 0.0f);
  const bool gelu = m.activation == Activation::gelu;
  o.fc1 = layout_.entries().size();
  o.fc1_w = add(p + (gelu ? "mlp.fc1.weight" : "mlp.gate_proj.weight"), R::matrix, {F, C}, 0, F_, r * F_, std0, 0);
  if (gelu) {
    if (bias) o.fc1_b = add(p + "mlp.fc1.bias", R::bias, {F}, 0, F_, r * F_, 0, 0);
  } else {
    o.up = layout_.entries().size();
    add(p + "mlp.up_proj.weight", R::matrix, {F, C}, 0, F_, r * F_, std0, 0);
    if (bias) {
      o.fc1_b = add(p + "mlp.gate_proj.bias", R::bias, {F}, 0, F_, r * F_, 0, 0);
      add(p + "mlp.up_proj.bias", R::bias, {F}, 0, F_, r * F_, 0, 0);
    }
  }
  const std::string down = gelu ? "mlp.fc2." : "mlp.down_proj.";
  o.fc2 = layout_.entries().size();
  o.fc2_w = add(p + down + "weight", R::matrix, {C, F}, 1, F_, r * F_, std_res, 0);
  if (bias) o.fc2_b = add(p + down + "bias", R::bias, {C}, -1, 0, 0, 0, 0);
  layer_off_.push_back(o);
}

void Gpt::build_layout() {
  const ModelSpec& m = opt_.model;
  const bool ln = m.norm == Norm::layernorm;
  const float std0 = 0.02f;
  const int64_t C = C_;
  using R = ParamRole;
  const int64_t E = kEmbeddingUnit;
  const bool head_own_wte = opt_.stage.has_head && m.tie_embeddings && !opt_.stage.has_embedding;
  if (opt_.stage.has_embedding || head_own_wte) {
    // The head stage's copy of a tied embedding belongs to the head (only the head reads it).
    off_wte_ = add_param("wte.weight", R::embedding, head_own_wte ? kHeadUnit : E, {m.vocab, C}, 0, vocab_local_,
                         vocab_start_, std0, 0);
    if (head_own_wte) layout_.mark_tied_copy(off_wte_);
  }
  if (opt_.stage.has_embedding && m.position == Position::learned)
    off_wpe_ = add_param("wpe.weight", R::embedding, E, {m.seq_len, C}, -1, 0, 0, std0, 0);
  for (int64_t l = first_; l < first_ + L_; l++) add_layer_params(l);
  if (opt_.stage.has_head) {
    off_lnf_w_ = add_param("ln_f.weight", R::norm, kHeadUnit, {C}, -1, 0, 0, 0, 1.0f);
    if (ln) off_lnf_b_ = add_param("ln_f.bias", R::norm, kHeadUnit, {C}, -1, 0, 0, 0, 0.0f);
    off_head_ = m.tie_embeddings ? off_wte_
                                 : add_param("lm_head.weight", R::head, kHeadUnit, {m.vocab, C}, 0, vocab_local_,
                                             vocab_start_, std0, 0);
  }
}

float* Gpt::alloc_act(int64_t n) {
  float* p = be_.alloc(n);  // owned_, freed in ~Gpt
  be_.label(p, "activations");
  owned_.push_back(p);
  mem_.activations += int64_t(sizeof(float)) * n;
  return p;
}

uint16_t* Gpt::alloc_half(int64_t n) {
  auto* p = static_cast<uint16_t*>(be_.alloc_bytes(sizeof(uint16_t) * size_t(n)));  // owned_
  be_.label(p, "activations (16-bit)");
  owned_.push_back(p);
  mem_.activations += int64_t(sizeof(uint16_t)) * n;
  return p;
}

std::unique_ptr<Gpt::Acts> Gpt::make_acts(bool own_attention_state) {
  const int64_t N = B_ * T_, C = C_;
  const bool ln = opt_.model.norm == Norm::layernorm;
  const int64_t qkv_w = (Hq_ + 2 * Hkv_) * D_;
  const int64_t fc_w = opt_.model.activation == Activation::swiglu ? 2 * F_ : F_;
  auto a = std::make_unique<Acts>();
  const int64_t Ns = Ns_;  // residual-stream rows (sequence parallel: this rank's)
  // Mixed precision keeps the GEMM inputs in 16 bits; their float32 forms share fwd32_.
  auto kept = [&](float** f32, uint16_t** f16, int64_t n) {
    if (mixed_)
      *f32 = fwd32_, *f16 = alloc_half(n);
    else
      *f32 = alloc_act(n);
  };
  kept(&a->ln1, &a->ln1_h, N * C);
  if (ln) a->ln1_mean = alloc_act(Ns);
  a->ln1_rstd = alloc_act(Ns);
  if (mixed_)  // a GEMM output the backward reads: 16-bit, widened into wide32_ when read
    a->qkv = wide32_, a->qkv_h = alloc_half(N * qkv_w);
  else
    a->qkv = alloc_act(N * qkv_w);
  a->attn_saved = own_attention_state
                      ? alloc_act(be_.attention_saved_floats(B_, T_, Hq_, D_, attention_operands()))
                      : shared_attn_saved_;
  kept(&a->att, &a->att_h, N * Hq_ * D_);
  if (residual16_)
    a->mid = mid32_, a->mid_h = alloc_half(Ns * C);
  else
    a->mid = alloc_act(Ns * C);
  kept(&a->ln2, &a->ln2_h, N * C);
  if (ln) a->ln2_mean = alloc_act(Ns);
  a->ln2_rstd = alloc_act(Ns);
  if (mixed_)
    a->fc = wide32_, a->fc_h = alloc_half(N * fc_w);
  else
    a->fc = alloc_act(N * fc_w);
  kept(&a->fc_act, &a->fc_act_h, N * F_);
  return a;
}

void Gpt::allocate_activations() {
  const int64_t N = B_ * T_, C = C_;
  const bool ln = opt_.model.norm == Norm::layernorm;
  const int64_t qkv_w = (Hq_ + 2 * Hkv_) * D_;
  const int64_t fc_w = opt_.model.activation == Activation::swiglu ? 2 * F_ : F_;
  // none: every layer keeps everything; selective: everything but the attention's saved state
  // (one shared buffer, recomputed in backward); full: one shared set, the
  // layer is re-run from its input (the slot's res[l]) in backward.
  const RecomputePolicy rc = recompute_;
  if (mixed_) {  // the float32 GEMM inputs before rounding, the rounded output gradient
    const int64_t widest_in = std::max({C, Hq_ * D_, F_});
    fwd32_ = alloc_act(N * widest_in);
    dy16_ = alloc_half(N * std::max({C, qkv_w, fc_w, opt_.stage.has_head ? logits_ld_ : 0}));
    if (L_ > 0) wide32_ = alloc_act(N * std::max(qkv_w, fc_w));
    if (residual16_ && L_ > 0) mid32_ = alloc_act(Ns_ * C);
    if (residual16_ && L_ > 1) x32_ = alloc_act(Ns_ * C);  // res[1..L-1]'s float32 form
  }
  if (rc.layer_keeps_activations() && !rc.layer_keeps_attention_state())
    shared_attn_saved_ = alloc_act(be_.attention_saved_floats(B_, T_, Hq_, D_, attention_operands()));
  if (!rc.layer_keeps_activations() && L_ > 0) {
    recompute_out_ = alloc_act(Ns_ * C);
    full_acts_ = make_acts(true);
  }
  slots_.resize(size_t(opt_.activation_slots));
  for (Slot& s : slots_) {
    for (int64_t l = 0; l <= L_; l++) {  // the stage's input and output fp32; between, per residual16_
      const bool inner16 = residual16_ && l > 0 && l < L_;
      s.res.push_back(inner16 ? x32_ : alloc_act(Ns_ * C));
      s.res_h.push_back(inner16 ? alloc_half(Ns_ * C) : nullptr);
    }
    if (rc.layer_keeps_activations())
      for (int64_t l = 0; l < L_; l++) s.acts.push_back(make_acts(rc.layer_keeps_attention_state()));
    s.tokens = static_cast<int32_t*>(be_.alloc_bytes(sizeof(int32_t) * size_t(N)));
    s.targets = static_cast<int32_t*>(be_.alloc_bytes(sizeof(int32_t) * size_t(N)));
    owned_.push_back(s.tokens);
    owned_.push_back(s.targets);
    if (opt_.stage.has_head) {
      // Mixed precision: lnf is a GEMM input like ln1 (kept 16-bit; its float32 form in fwd32_).
      if (mixed_)
        s.lnf = fwd32_, s.lnf_h = alloc_half(N * C);
      else
        s.lnf = alloc_act(N * C);
      if (ln) s.lnf_mean = alloc_act(Ns_);
      s.lnf_rstd = alloc_act(Ns_);
      s.logits = alloc_act(N * logits_ld_);  // zeroed: the padding columns stay 0
      s.rowmax = alloc_act(N);
      s.xstats = alloc_act(2 * N);
    }
  }
  if (opt_.stage.has_head) host_stats_.resize(size_t(3 * N));
  // backward scratch, shared by all layers and slots
  dres_a_ = alloc_act(Ns_ * C);
  dres_b_ = alloc_act(Ns_ * C);
  dmid_ = alloc_act(Ns_ * C);
  dln_ = alloc_act(N * C);
  if (sp_) {
    sp_local_ = alloc_act(Ns_ * C);
    sp_full_ = alloc_act(N * C);
    dln_local_ = alloc_act(Ns_ * C);
  }
  dqkv_ = alloc_act(N * qkv_w);
  datt_ = alloc_act(N * Hq_ * D_);
  dfc_ = alloc_act(N * fc_w);
  dfc_act_ = alloc_act(N * F_);
}

Gpt::Slot& Gpt::slot_at(int64_t slot) {
  EXA_CHECK(slot >= 0 && slot < int64_t(slots_.size()),
            "model: activation slot {} not in [0, {})", slot, slots_.size());
  return slots_[size_t(slot)];
}

Gpt::Acts& Gpt::acts_for(Slot& s, int64_t l) {
  return recompute_.layer_keeps_activations() ? *s.acts[size_t(l)] : *full_acts_;
}

void Gpt::init_weights(uint64_t seed) {
  // Through a 4 MiB host buffer: a full host copy would add the whole arena to peak memory.
  const int64_t chunk = 1 << 20;
  std::vector<float> host(static_cast<size_t>(chunk));
  for (const ParamInfo& p : layout_.entries()) {
    for (int64_t first = 0; first < p.numel; first += chunk) {
      const int64_t n = std::min(chunk, p.numel - first);
      init_param_range(p, seed, first, n, host.data());
      be_.upload(params_ + p.offset + first, host.data(), sizeof(float) * size_t(n));
    }
  }
  params_changed();
}

void Gpt::zero_grad() { be_.zero(grads_, sizeof(float) * size_t(layout_.total())); }

void Gpt::params_changed() { std::fill(half_fresh_.begin(), half_fresh_.end(), 0); }

void Gpt::half_written() { std::fill(half_fresh_.begin(), half_fresh_.end(), 1); }

void Gpt::half_written(int64_t begin, int64_t end, bool current) {
  const std::vector<ParamInfo>& e = layout_.entries();
  for (size_t i = 0; i < half_fresh_.size(); i++)
    if (e[i].offset >= begin && e[i].offset + e[i].numel <= end) half_fresh_[i] = current ? 1 : 0;
}

// The entries inside [offset, offset + n) (a matrix, or the fused q|k|v and gate|up) converted
// once after each params_changed: one conversion per step, not per GEMM.
const uint16_t* Gpt::weight_half(int64_t offset, int64_t n) {
  const std::vector<ParamInfo>& e = layout_.entries();
  for (size_t i = 0; i < e.size(); i++) {
    if (half_fresh_[i] || e[i].offset < offset || e[i].offset + e[i].numel > offset + n) continue;
    // A stale copy over sharded masters would be rounded from released pages (0 or NaN): refuse.
    EXA_CHECK(!half_external_, "Gpt: the 16-bit copy of '{}' is stale but this rank keeps only a shard of its fp32 "
              "masters (parallel/master_shards.hpp): under ZeRO 1/2, after writing params() call "
              "Trainer::masters_changed(), not Gpt::params_changed(); under ZeRO 3 a unit is read only between "
              "its gather and its release (GradSync::before_unit / after_unit)", e[i].name);
    be_.f32_to_half(half_, params_half_ + e[i].offset, params_ + e[i].offset, e[i].numel);
    half_fresh_[i] = 1;
  }
  return params_half_ + offset;
}

// Mixed precision reads the embeddings from their 16-bit copy, as Megatron's bf16 model does (the
// fp32 masters are the optimizer's only): this is what lets ZeRO shard their masters too.
void Gpt::lookup_tokens(float* out, const int32_t* tokens) {
  const int64_t N = B_ * T_, C = C_;
  if (!mixed_) return be_.embedding_forward(out, tokens, params_ + off_wte_, vocab_start_, vocab_local_, N, C);
  be_.embedding_forward_half(half_, out, tokens, weight_half(off_wte_, vocab_local_ * C), vocab_start_,
                             vocab_local_, N, C);
}

void Gpt::add_positions(float* out) {
  if (!mixed_) return be_.positional_forward(out, params_ + off_wpe_, B_, T_, C_);
  be_.positional_forward_half(half_, out, weight_half(off_wpe_, opt_.model.seq_len * C_), B_, T_, C_);
}

const float* Gpt::output(int64_t slot) const {
  return const_cast<Gpt*>(this)->slot_at(slot).res[size_t(L_)];
}
const float* Gpt::input_grad() const { return din_; }
std::vector<float> Gpt::download_logits(int64_t slot) const {
  EXA_CHECK(opt_.stage.has_head, "model: download_logits on a stage without the head (layers [{}, {}))", first_,
            first_ + L_);
  const int64_t N = B_ * T_, V = vocab_local_;
  std::vector<float> padded(size_t(N * logits_ld_)), dense(size_t(N * V));
  be_.download(padded.data(), const_cast<Gpt*>(this)->slot_at(slot).logits, sizeof(float) * padded.size());
  for (int64_t n = 0; n < N; n++)
    std::copy_n(padded.begin() + n * logits_ld_, V, dense.begin() + n * V);
  return dense;
}

float Gpt::forward(const int32_t* tokens, const float* input, const int32_t* targets,
                   int64_t slot) {
  const int64_t N = B_ * T_, C = C_;
  const ModelSpec& m = opt_.model;
  Slot& s = slot_at(slot);
  float* x = s.res[0];
  using Pass = ParallelHooks::Pass;
  if (opt_.stage.has_embedding) {
    hooks_->before_layer(ParallelHooks::kEmbedding, Pass::forward);
    EXA_CHECK(tokens != nullptr, "model: the embedding stage needs tokens");
    for (int64_t i = 0; i < N; i++)
      EXA_CHECK(tokens[i] >= 0 && tokens[i] < m.vocab, "model: token {} at position {} is "
                "outside the vocabulary [0, {})", tokens[i], i, m.vocab);
    be_.upload(s.tokens, tokens, sizeof(int32_t) * size_t(N));
    if (!sp_) {
      lookup_tokens(x, s.tokens);
      hooks_->partial_sum_allreduce(x, N * C);  // vocabulary-parallel embedding
      if (off_wpe_ >= 0) add_positions(x);
    } else {  // the positions are added once (rank 0) before the sum is scattered
      lookup_tokens(sp_full_, s.tokens);
      if (off_wpe_ >= 0 && opt_.tp.rank == 0) add_positions(sp_full_);
      hooks_->sp_reduce_scatter(sp_full_, x, Ns_ * C);
    }
    hooks_->after_layer(ParallelHooks::kEmbedding, Pass::forward);
  } else {
    EXA_CHECK(input != nullptr, "model: a stage without embedding needs input activations");
    be_.copy(x, input, sizeof(float) * size_t(Ns_ * C));
  }
  for (int64_t l = 0; l < L_; l++) {
    hooks_->before_layer(first_ + l, Pass::forward);
    layer_forward(l, s.res[size_t(l)], s.res[size_t(l) + 1], acts_for(s, l));
    round_kept(s.res[size_t(l) + 1], s.res_h[size_t(l) + 1], Ns_ * C);
    hooks_->after_layer(first_ + l, Pass::forward);
  }
  // A stage that hands its output on rounds it as the whole model rounds that layer's output
  // (res_h), so that a pipeline split computes what the whole model does, whatever the messages'
  // dtype. The head's input is not rounded, whole or split; every stage has a layer (plan/stages.cpp).
  // dy16_ (at least [N, C]) is the backward's scratch, idle here.
  if (residual16_ && L_ > 0 && !opt_.stage.has_head) round_kept(s.res[size_t(L_)], dy16_, Ns_ * C);
  if (!opt_.stage.has_head) return 0.0f;

  EXA_CHECK(targets != nullptr, "model: the head stage needs targets");
  for (int64_t i = 0; i < N; i++)
    EXA_CHECK(targets[i] >= 0 && targets[i] < m.vocab, "model: target {} at position {} is "
              "outside the vocabulary [0, {})", targets[i], i, m.vocab);
  be_.upload(s.targets, targets, sizeof(int32_t) * size_t(N));
  hooks_->before_layer(ParallelHooks::kHead, Pass::forward);
  norm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, s.res[size_t(L_)], off_lnf_w_, off_lnf_b_);
  // logits[N, V] (rows Vp apart) = lnf[N, C] @ W_head[V, C]^T (column-parallel over the vocabulary)
  linear_forward(s.lnf, s.lnf_h, C, off_head_, vocab_local_, s.logits, logits_ld_);
  be_.xent_max(s.rowmax, s.logits, N, vocab_local_, logits_ld_);
  hooks_->vocab_max_allreduce(s.rowmax, N);
  be_.xent_stats(s.xstats, s.xstats + N, s.logits, s.rowmax, s.targets, vocab_start_, N,
                 vocab_local_, logits_ld_);
  hooks_->vocab_sum_allreduce(s.xstats, 2 * N);
  hooks_->after_layer(ParallelHooks::kHead, Pass::forward);
  be_.download(host_stats_.data(), s.rowmax, sizeof(float) * size_t(N));
  be_.download(host_stats_.data() + N, s.xstats, sizeof(float) * size_t(2 * N));
  double loss = 0;  // rows summed in order: deterministic
  for (int64_t i = 0; i < N; i++) {
    const double mx = host_stats_[size_t(i)], se = host_stats_[size_t(N + i)],
                 tl = host_stats_[size_t(2 * N + i)];
    loss += std::log(se) + mx - tl;
  }
  return float(loss / double(N));
}

void Gpt::backward(const float* output_grad, float loss_scale, int64_t slot) {
  const int64_t N = B_ * T_, C = C_;
  Slot& s = slot_at(slot);
  float* dx = dres_a_;  // d loss / d res[L]
  using Pass = ParallelHooks::Pass;
  if (opt_.stage.has_head) {
    hooks_->before_layer(ParallelHooks::kHead, Pass::backward);
    // dlogits (in place) = loss_scale/N * (softmax - onehot)
    be_.xent_backward(s.logits, s.rowmax, s.xstats, s.targets, vocab_start_,
                      loss_scale / float(N), N, vocab_local_, logits_ld_);
    // dW_head[V,C] += dlogits^T[V,N] @ lnf[N,C];  dlnf[N,C] = dlogits[N,V] @ W_head[V,C]
    linear_backward(s.logits, s.lnf, s.lnf_h, C, off_head_, vocab_local_, dln_, logits_ld_);
    const float* dlnf = grad_to_local();
    be_.zero(dx, sizeof(float) * size_t(Ns_ * C));
    norm_backward(dx, off_lnf_w_, off_lnf_b_, dlnf, s.res[size_t(L_)], s.lnf_mean, s.lnf_rstd);
    hooks_->after_layer(ParallelHooks::kHead, Pass::backward);
  } else {
    EXA_CHECK(output_grad != nullptr, "model: a stage without head needs the output gradient");
    be_.copy(dx, output_grad, sizeof(float) * size_t(Ns_ * C));
  }
  float* other = dres_b_;
  for (int64_t l = L_ - 1; l >= 0; l--) {
    Acts& a = acts_for(s, l);
    const float* x = widen_kept(s.res[size_t(l)], s.res_h[size_t(l)], Ns_ * C);  // the layer's input
    if (recompute_.rerun_layer_before_backward()) {  // refill the shared acts
      hooks_->before_layer(first_ + l, Pass::recompute);
      layer_forward(l, x, recompute_out_, a);
      hooks_->after_layer(first_ + l, Pass::recompute);
    }
    hooks_->before_layer(first_ + l, Pass::backward);
    layer_backward(l, x, dx, other, a);
    hooks_->after_layer(first_ + l, Pass::backward);
    std::swap(dx, other);
  }
  din_ = dx;  // d loss / d res[0]
  if (opt_.stage.has_embedding) {
    // vocabulary-parallel embedding: backward is the identity on every rank
    hooks_->before_layer(ParallelHooks::kEmbedding, Pass::backward);
    const float* dfull = grad_to_full(dx);  // [N, C]
    be_.embedding_backward(grads_ + off_wte_, dfull, s.tokens, vocab_start_, vocab_local_, N, C);
    if (off_wpe_ >= 0) be_.positional_backward(grads_ + off_wpe_, dfull, B_, T_, C);
    hooks_->after_layer(ParallelHooks::kEmbedding, Pass::backward);
  }
}

// ---- column-parallel entry / row-parallel exit (tensor and sequence parallel) -------------

void Gpt::norm_forward(float* full_out, float* mean, float* rstd, const float* x_local,
                       int64_t w, int64_t b) {
  float* dst = sp_ ? sp_local_ : full_out;  // [Ns, C]
  const float eps = float(opt_.model.norm_eps);
  if (opt_.model.norm == Norm::layernorm)
    be_.layernorm_forward(dst, mean, rstd, x_local, params_ + w, params_ + b, Ns_, C_, eps);
  else
    be_.rmsnorm_forward(dst, rstd, x_local, params_ + w, Ns_, C_, eps);
  if (sp_) hooks_->sp_all_gather(sp_local_, full_out, Ns_ * C_);  // -> [N, C]
}

void Gpt::norm_backward(float* dx_local, int64_t w, int64_t b, const float* dnorm_local,
                        const float* x_local, const float* mean, const float* rstd) {
  if (opt_.model.norm == Norm::layernorm)
    be_.layernorm_backward(dx_local, grads_ + w, grads_ + b, dnorm_local, x_local, params_ + w,
                           mean, rstd, Ns_, C_);
  else
    be_.rmsnorm_backward(dx_local, grads_ + w, dnorm_local, x_local, params_ + w, rstd, Ns_, C_);
}

float* Gpt::region_exit(float* out_local) { return sp_ ? sp_full_ : out_local; }

void Gpt::region_exit_done(float* partial, float* out_local) {
  if (sp_)
    hooks_->sp_reduce_scatter(partial, out_local, Ns_ * C_);
  else
    hooks_->partial_sum_allreduce(out_local, B_ * T_ * C_);
}

const float* Gpt::grad_to_full(const float* g_local) {
  if (!sp_) return g_local;
  hooks_->sp_all_gather(g_local, sp_full_, Ns_ * C_);
  return sp_full_;
}

const float* Gpt::grad_to_local() {
  if (!sp_) {
    hooks_->input_grad_allreduce(dln_, B_ * T_ * C_);
    return dln_;
  }
  hooks_->sp_reduce_scatter(dln_, dln_local_, Ns_ * C_);
  return dln_local_;
}

double Gpt::flops_per_step() const {
  const double N = double(B_ * T_), C = double(C_);
  const double qkv = double((Hq_ + 2 * Hkv_) * D_);
  const double fc = opt_.model.activation == Activation::swiglu ? 3.0 * double(F_) : 2.0 * double(F_);
  double matmul_params = double(L_) * (C * qkv + C * double(Hq_ * D_) + C * fc);
  if (opt_.stage.has_head) matmul_params += C * double(vocab_local_);
  // causal attention: sum_t (t+1) = T(T+1)/2 score and value products per head, 2 FLOPs each
  const double att_fwd = double(L_) * double(B_ * Hq_) * double(T_) * double(T_ + 1) / 2.0 *
                         double(D_) * 2.0 * 2.0;
  return 6.0 * matmul_params * N + 3.0 * att_fwd;
}

}  // namespace exatrain
