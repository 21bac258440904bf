// A GPT decoder stage: layers [first_layer, last_layer) of the model, optionally with the token
// embedding in front and the final norm + LM head + fused cross-entropy behind, holding the
// tensor-parallel shard `tp` of every weight. One stage with everything = the whole model.
//
// Data flow (N = B*T rows, C = hidden, V = local vocabulary slice):
//   forward:  tokens [B,T] (has_embedding) or input activations [B,T,C]
//             -> res[0] -> layer -> res[1] -> ... -> res[L] [B,T,C]
//             -> (has_head) ln_f -> logits [N,V] (rows Vp = logits_ld() apart) -> loss (mean
//             over N rows)
//   backward: (has_head) d loss, or output gradient [B,T,C] -> ... -> input gradient [B,T,C]
//             (has_embedding: into wte/wpe instead). Gradients ACCUMULATE into the gradient
//             arena (gradient accumulation = several forward/backward before zero_grad()).
// Each layer is a forward/backward pair of plain member functions over the arenas
// (see gpt_layer.cpp); the tensor-parallel collectives are calls to ParallelHooks.
//
// Owns (room model/): the Gpt stage, its parameter layout with roles and units (layout.hpp), the
// ParallelHooks it calls (parallel_hooks.hpp), the LinearObserver it shows its layer matrices'
// inputs and output gradients to (linear_observer.hpp), the recomputation policy. No
// communication, no MPI.
// May use: core/, job/, backend/.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/layout.hpp"
#include "model/linear_observer.hpp"
#include "model/parallel_hooks.hpp"
#include "model/recompute_policy.hpp"

namespace exatrain {

struct StageRange {
  int64_t first_layer = 0;
  int64_t last_layer = -1;  // exclusive; -1 = model.layers
  bool has_embedding = true;
  bool has_head = true;
};

struct GptOptions {
  ModelSpec model;
  TensorParallel tp;
  StageRange stage;
  Recompute recompute = Recompute::none;
  int64_t micro_batch = 1;  // B: sequences per forward
  int64_t seq = 0;          // T: tokens per sequence (0 = model.seq_len)
  // Activation slots: how many micro-batches may be between their forward and backward at
  // once (a pipeline stage under 1F1B needs up to pp). Each slot keeps its own saved
  // activations; backward scratch is shared.
  int64_t activation_slots = 1;
  // Arenas allocated with Backend::alloc_bytes_lazy (zero, no page resident until written), for a
  // caller that keeps them mostly empty: the distributed trainer's ZeRO 3 (lazy_params: it
  // initialises only its shards, never calls init_weights, and gathers one unit at a time) and
  // ZeRO 2/3 (lazy_grads: it returns each reduce-scattered range's pages to the OS and never
  // calls zero_grad, which would touch the whole arena).
  bool lazy_params = false;
  bool lazy_grads = false;
  // fp32, or mixed precision (bf16 / fp16; docs/precision.md): the float32 parameter arena stays
  // the master copy (what the optimizer updates, checkpoints keep and exports write); the model
  // keeps a 16-bit copy of it (Megatron's bf16 params beside its fp32 main params), converted per
  // entry on first use after params_changed(), and every linear layer's GEMM (forward, dX, dW)
  // takes 16-bit operands with float32 accumulation and float32 outputs. The inputs of those GEMMs
  // that are saved for backward (norm outputs, attention output, activation output) are kept in
  // 16 bits, and so are the GEMM outputs the backward reads (qkv, the MLP's pre-activation), as
  // autocast's linear returns them, rounded where they are made so that the forward computes with
  // what the backward reads; dY is rounded to 16 bits before the backward GEMMs. The embeddings are
  // looked up from the 16-bit copy (widened exactly). The residual stream kept for the backward is
  // 16-bit too unless fp32_residual (below). The arithmetic of norms, attention (its probabilities
  // kept), activations and residual adds, the logits, the loss and the gradients stay float32.
  // fp8 is not a training precision here.
  Precision precision = Precision::fp32;
  // Mixed precision only: false (the default) keeps the residual stream for the backward in 16 bits
  // too, as Megatron's and torchtitan's bf16 activations are: each layer's input inside the stage
  // and `mid` (the residual after attention), rounded where they are made so that the forward
  // computes with what the backward reads; a stage that is not the last rounds its output too.
  // true keeps them fp32 (with [train] pipeline_dtype = "fp32" too, Megatron's
  // --fp32-residual-connection). Either way the stage's input and output are fp32 buffers (the
  // pipeline's messages and the head read them) and the residual adds are fp32. [train]
  // residual_dtype (job.hpp); the planner counts the same (plan.hpp Plan::residual_fp32).
  bool fp32_residual = false;
};

// Bytes the model allocated, by kind (for the memory report).
struct ModelMemory {
  int64_t params = 0, grads = 0, activations = 0;
};

// The 16-bit format a training precision computes in (Gpt's weight copy and GEMM inputs, and the
// runtime's tensor- and pipeline-parallel messages): bf16 or fp16; none at fp32. The one mapping.
std::optional<Half> half_format(Precision p);

class Gpt {
 public:
  // hooks == nullptr: NoParallelHooks (requires tp.size == 1).
  Gpt(Backend& backend, const GptOptions& options, ParallelHooks* hooks = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // ---- parameters -------------------------------------------------------------------------
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }  // local (this shard / stage)
  float* params() { return params_; }                      // device arena [num_params]
  float* grads() { return grads_; }                        // device arena [num_params]
  void init_weights(uint64_t seed);                        // seeded, split-independent
  void zero_grad();
  // Mixed precision: the float32 arena changed (an optimizer step, a load), so the 16-bit copy is
  // converted again, entry by entry, before its next use. A caller that writes params() must call
  // it before the next forward (no-op at fp32).
  void params_changed();
  // Mixed precision, for a caller that keeps the 16-bit copy itself (parallel/master_shards.hpp:
  // under ZeRO 1/2 a rank holds only its shard of the fp32 masters of the entries the model reads
  // in 16 bits; ZeRO 3 gathers the copy unit by unit): the copy [num_params] (device; null at fp32), its format, and half_written(),
  // which says every entry's copy is current (no conversion from params() until the next
  // params_changed). reads_float32: whether the passes read entry p from params() (norms and
  // biases: fp32 as under torch.autocast) or, under mixed precision, only its 16-bit copy (layer
  // matrices and the untied head, which only GEMMs use, and the embeddings, looked up in 16 bits as
  // Megatron's bf16 model does).
  uint16_t* params_half() { return params_half_; }
  Half half_format() const { return half_; }
  void half_written();
  // The same for the entries inside [begin, end) only, or (current = false) their copy no longer
  // valid: for a caller that keeps the copy one range at a time (ZeRO 3 gathers and releases it).
  void half_written(int64_t begin, int64_t end, bool current);
  // From now on the caller keeps the 16-bit copy current (half_written after each write): a
  // conversion from params() after params_changed() is refused, since params() is incomplete.
  void keep_half_externally() { half_external_ = true; }
  static bool reads_float32(const ParamInfo& p) {
    return p.role == ParamRole::norm || p.role == ParamRole::bias;
  }
  // Shows every backward's layer matrices' inputs and output gradients to `o` (null: nobody);
  // model/linear_observer.hpp. K-FAC's factors come from here.
  void set_linear_observer(LinearObserver* o) { observer_ = o; }

  // ---- stage forward / backward --------------------------------------------------------------
  // tokens, targets: host arrays [B*T]; input: device [B,T,C] when !has_embedding.
  // With sequence parallelism, input/output/input_grad hold this rank's B*T/tp rows.
  // Returns the mean cross-entropy over the B*T targets when has_head, else 0.
  // slot in [0, activation_slots): where this micro-batch's activations are kept until its
  // backward (which must use the same slot).
  float forward(const int32_t* tokens, const float* input, const int32_t* targets,
                int64_t slot = 0);
  // loss_scale: d(objective)/d(mean loss) (1/accumulation steps). output_grad: device [B,T,C]
  // when !has_head. Adds to grads(); input_grad() is valid afterwards (until the next
  // backward) when !has_embedding.
  void backward(const float* output_grad, float loss_scale, int64_t slot = 0);
  const float* output(int64_t slot = 0) const;  // device [B,T,C]: the last layer's output
  const float* input_grad() const;              // device [B,T,C]: d loss / d input
  // host [N,V] (this rank's vocabulary columns, dense): after forward, until backward.
  std::vector<float> download_logits(int64_t slot = 0) const;

  // ---- facts -------------------------------------------------------------------------------
  const GptOptions& options() const { return opt_; }
  Backend& backend() const { return be_; }
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_local() const { return vocab_local_; }
  // The row stride of the logits on the device: vocab_local rounded up to kLogitsRowAlign.
  int64_t logits_ld() const { return logits_ld_; }
  // Why the logits' rows are padded: cuBLASLt picks fast kernels only for operands whose rows start
  // 16-byte aligned, and GPT-2's 50,257-wide rows are not (on an H100 the 8192 x 50257 x 768 logits
  // GEMM took 6.6 ms against 1.1 ms at 50,304: bench/gpu/results/h100-2026-12-05). 64 columns (as
  // llm.c's padded Vp = 50,304) keeps both the float32 logits and their 16-bit gradient aligned; the
  // parameters keep the true vocabulary, the GEMMs and the cross-entropy never touch the columns
  // [V, Vp) (they stay the zeros they were allocated with; mixed precision rounds them along with
  // the gradient, as one contiguous conversion).
  static constexpr int64_t kLogitsRowAlign = 64;
  ModelMemory memory() const { return mem_; }
  // Model FLOPs of one forward+backward of this stage for B*T tokens (matmuls and attention,
  // the usual 6*params*tokens + attention count; excludes recomputation).
  double flops_per_step() const;

 private:
  struct LayerOffsets;  // parameter offsets of one layer (same for params and grads)
  struct Acts;          // activation buffers of one layer
  // Everything one in-flight micro-batch keeps between its forward and backward.
  struct Slot {
    std::vector<float*> res;                   // [L+1] x [Ns,C]: layer inputs + output
    // 16-bit residual (GptOptions::fp32_residual false under mixed precision): res[1..L-1] are
    // kept here in 16 bits, res[l] then points at x32_ (their float32 form, valid during the
    // forward and refilled by widen_kept in the backward); nullptr where res[l] is kept.
    std::vector<uint16_t*> res_h;
    std::vector<std::unique_ptr<Acts>> acts;   // per layer (none/selective); empty for full
    int32_t* tokens = nullptr;                 // device [N]
    int32_t* targets = nullptr;                // device [N]
    float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;  // [N,C], [N], [N]
    uint16_t* lnf_h = nullptr;                 // mixed precision: lnf in 16 bits [N,C]
    float* logits = nullptr;                   // [N,V], row stride logits_ld_
    float *rowmax = nullptr, *xstats = nullptr;  // [N], [2,N]
  };
  std::unique_ptr<Acts> make_acts(bool own_attention_state);
  Slot& slot_at(int64_t slot);
  void build_layout();
  // One parameter of the layout: name, role, unit, global shape, split dim (-1: replicated), local
  // extent along it and its start, init std, constant init value; returns its offset.
  int64_t add_param(const std::string& name, ParamRole role, int64_t unit, std::vector<int64_t> global,
                    int split, int64_t local, int64_t start, float init_std, float value);
  void add_layer_params(int64_t l);  // layer l's norms, attention and MLP (layer_off_)
  void allocate_activations();
  float* alloc_act(int64_t n);
  void layer_forward(int64_t l, const float* x, float* out, Acts& a);
  void layer_backward(int64_t l, const float* x, const float* dout, float* dx, Acts& a);
  // The observer's call for layout entry `entry` (x [N, in] stride ldx, dy [N, out] stride ldy).
  // Mixed precision: x is the kept 16-bit copy x16 (converted for the observer).
  void observe(size_t entry, const float* x, const uint16_t* x16, int64_t ldx, const float* dy, int64_t ldy);
  Acts& acts_for(Slot& s, int64_t l);

  Backend& be_;
  GptOptions opt_;
  RecomputePolicy recompute_;  // {opt_.recompute}
  NoParallelHooks no_hooks_;
  ParallelHooks* hooks_;
  LinearObserver* observer_ = nullptr;
  // shapes
  int64_t B_, T_, C_, L_, first_, Hq_, Hkv_, D_, F_, vocab_start_, vocab_local_, logits_ld_;
  bool sp_ = false;  // sequence parallel
  int64_t Ns_ = 0;   // rows of the residual stream on this rank: B*T, or B*T/tp with sp_
  ParamLayout layout_;
  std::vector<LayerOffsets> layer_off_;
  int64_t off_wte_ = -1, off_wpe_ = -1, off_lnf_w_ = -1, off_lnf_b_ = -1, off_head_ = -1;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  // activations
  std::vector<void*> owned_;
  std::vector<Slot> slots_;
  std::unique_ptr<Acts> full_acts_;  // full: one set shared by all layers and slots
  float* shared_attn_saved_ = nullptr;  // selective: attention's saved state, reused by all layers and slots
  float* recompute_out_ = nullptr;   // full: [N,C] scratch output of the re-run
  // backward scratch
  float *dres_a_ = nullptr, *dres_b_ = nullptr, *dmid_ = nullptr, *dln_ = nullptr;
  float *dqkv_ = nullptr, *datt_ = nullptr, *dfc_ = nullptr, *dfc_act_ = nullptr;
  float* din_ = nullptr;  // points at the buffer holding d loss / d res[0]
  // sequence parallel scratch: norm output before all-gather [Ns,C]; partial sums before
  // reduce-scatter and gathered gradients [N,C]; reduce-scattered input gradient [Ns,C]
  float *sp_local_ = nullptr, *sp_full_ = nullptr, *dln_local_ = nullptr;
  // Helpers at the column-parallel entry / row-parallel exit (see parallel_hooks.hpp).
  void norm_forward(float* full_out, float* mean, float* rstd, const float* x_local,
                    int64_t w, int64_t b);
  void norm_backward(float* dx_local, int64_t w, int64_t b, const float* dnorm_local,
                     const float* x_local, const float* mean, const float* rstd);
  float* region_exit(float* out_local);  // returns the [N,C] buffer the partial GEMM writes
  void region_exit_done(float* partial, float* out_local);
  const float* grad_to_full(const float* g_local);
  const float* grad_to_local();  // reduces dln_ [N,C] over tp; returns [Ns,C]
  std::vector<float> host_stats_;
  ModelMemory mem_;
  // ---- mixed precision (precision != fp32) ----
  bool mixed_ = false;
  Half half_ = Half::bf16;
  uint16_t* params_half_ = nullptr;  // [num_params]: the 16-bit copy of params_
  // Attention's operands (Backend::attention_forward): the 16-bit format under mixed precision (the
  // CUDA backend's flash kernel), float32 otherwise.
  std::optional<Half> attention_operands() const { return mixed_ ? std::optional<Half>(half_) : std::nullopt; }
  std::vector<char> half_fresh_;     // per layout entry: its 16-bit copy matches params_
  bool half_external_ = false;       // keep_half_externally(): params_ holds only a shard of the masters
  float* fwd32_ = nullptr;           // [N, max(C, Hq*D, F)] float32 GEMM input before rounding
  uint16_t* dy16_ = nullptr;         // [N, max(C, QKV, FC, Vp)] the output gradient, rounded
  float* wide32_ = nullptr;          // [N, max(QKV, FC)] float32 form of a kept 16-bit qkv or fc
  float* mid32_ = nullptr;           // [Ns, C] float32 form of the kept 16-bit mid (16-bit residual)
  // [Ns, C] the float32 form of a 16-bit inner layer input (Slot::res_h): one buffer serves every
  // inner layer, in and out, since layer_forward reads its input x only before it writes its output.
  float* x32_ = nullptr;
  bool residual16_ = false;          // mixed precision with !GptOptions::fp32_residual
  // Mixed precision keeps two GEMM outputs in 16 bits (Acts: qkv, fc) and, unless fp32_residual,
  // the residual stream (Acts: mid; Slot::res_h). round_kept rounds the
  // float32 staging x[n] into the kept copy and back, so the forward computes with exactly what the
  // backward reads; widen_kept refills the staging from the copy and returns it. Where x is kept
  // itself (kept == nullptr: fp32, or an fp32 residual) both leave it alone.
  void round_kept(float* x, uint16_t* kept, int64_t n);
  const float* widen_kept(float* x, const uint16_t* kept, int64_t n);
  uint16_t* alloc_half(int64_t n);
  const uint16_t* weight_half(int64_t offset, int64_t n);  // the 16-bit copy of params_[offset, +n)
  // out[N, C] = wte[tokens] of this vocabulary slice (0 outside it); out[B,T,C] += wpe[T,C].
  // Mixed precision: from the 16-bit copies.
  void lookup_tokens(float* out, const int32_t* tokens);
  void add_positions(float* out);
  // y[N, O] = x[N, I] @ W[O, I]^T (W at parameter offset w; y's rows ldy >= O apart, 0: O). Mixed:
  // x32 is rounded into x16 (the kept copy) first and the GEMM is 16-bit; fp32: x32 is used as it is.
  void linear_forward(const float* x32, uint16_t* x16, int64_t I, int64_t w, int64_t O, float* y,
                      int64_t ldy = 0);
  // dW[O, I] += dy^T x;  dx[N, I] = dy[N, O] @ W[O, I] (dy's rows ldy >= O apart, 0: O; under mixed
  // precision the padding columns are converted with the rest, as one contiguous pass, and never
  // read by the GEMMs).
  void linear_backward(const float* dy, const float* x32, const uint16_t* x16, int64_t I, int64_t w, int64_t O,
                       float* dx, int64_t ldy = 0);
};

}  // namespace exatrain
