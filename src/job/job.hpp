// The job file as typed C++ values: everything downstream receives a validated Job, never TOML.
// Keys and meanings follow ../shared/contracts/job-file.md exactly (they may be extended, never
// renamed). Fields of [parallel] that may be "auto" or omitted are std::optional: `plan` fills
// them; `predict` and `train` require them resolved.
//
// Owns (room job/): the typed Job, its parsing with presets, --set and origins (parse.hpp),
// job_to_toml, the shape arithmetic model, planner and runtime share (model_shapes.hpp).
// May use: core/.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace exatrain {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope };
// op: torchtitan's op-level selective checkpointing (selective_ac_option = "op"): the outputs of
// every other matmul and of attention are kept, the rest recomputed (planned, not run here).
enum class Recompute { none, selective, full, op };
enum class Schedule { gpipe, one_f_one_b };  // 1f1b is interleaved when vp > 1
enum class Precision { fp32, fp16, bf16, fp8 };
// How fp8 runs scale their GEMM inputs ([train] fp8_recipe): Transformer Engine's delayed scaling
// (amax history, casts fused into the producing kernels), torchao's dynamic tensorwise scaling
// (an amax pass, then a cast, per operand), torchao's rowwise scaling (per-row scales: a scaled
// GEMM kernel of its own).
enum class Fp8Recipe { delayed, tensorwise, rowwise };
// The attention kernel ([train] attention): FlashAttention-2-class fused kernels (flash-attn 2,
// PyTorch SDPA's flash backend), FlashAttention-1-class ones (flash-attn 1, the Triton
// FlashAttention kernel), Hopper's FlashAttention-3-class kernels (flash-attn 3, cuDNN fused
// attention as Transformer Engine runs it), or the unfused batched GEMMs and softmax of frameworks
// before FlashAttention (2022).
enum class Attention { flash2, flash1, flash3, unfused };
// Which passes' tensor-parallel collectives run in chunks under the GEMMs ([parallel]
// tp_comm_overlap): none; every pass (Megatron's --tp-comm-overlap, Transformer Engine's
// userbuffers: the forward's all-gather/GEMM and GEMM/reduce-scatter pipelines, and the backward's
// dgrad and wgrad overlaps); or the forward passes only (PyTorch's async TP, torchtitan
// enable_async_tensor_parallel: its authors measured up to 20-29% faster forwards but about 8%
// end to end for Llama 3 8B and 70B, which is the forward's share of the step; docs/planner.md).
enum class TpCommOverlap { none, all, forward };

// [model]
struct ModelSpec {
  std::string preset;            // "" when none
  std::string preset_file;       // a TOML file of the user's own, by path ("" when none)
  int64_t layers = 12;
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t kv_heads = 12;         // default: heads; fewer = grouped-query attention
  int64_t ffn_hidden = 3072;     // default: 4 * hidden
  int64_t seq_len = 1024;
  int64_t vocab = 50257;         // for `train`, default: the dataset tokenizer's vocabulary
  bool vocab_from_data = false;  // true when [model] did not set vocab (train takes the data's)
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  Position position = Position::learned;
  bool tie_embeddings = true;
  // Linear layers carry biases (QKV, out-projection, MLP), as GPT-2; false = none (Llama, MPT).
  bool bias = true;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;

  int64_t head_dim() const { return hidden / heads; }
  bool operator==(const ModelSpec&) const = default;
};

// [machine]
struct MachineSpec {
  std::string preset;                 // named cluster, "" when none
  std::string preset_file;            // a TOML file of the user's own, by path ("" when none)
  std::string device = "cpu-local";   // catalog device name
  int64_t gpus_per_node = 1;
  double intra_node_bw_gbs = 0;       // GB/s per device, one direction, inside a node
  double inter_node_bw_gbs = 0;       // GB/s per NODE, one direction, all NICs together
  double intra_node_latency_us = 0;
  double inter_node_latency_us = 0;
  double storage_bw_gbs = 0;          // aggregate file-system bandwidth
  std::optional<double> node_mtbf_hours;
  bool operator==(const MachineSpec&) const = default;
};

// [parallel]: std::nullopt = omitted or "auto".
struct ParallelSpec {
  int64_t gpus = 1;
  std::optional<int64_t> tp, pp, dp, cp, vp, zero, micro_batch;
  int64_t global_batch = 1;
  std::optional<Recompute> recompute;
  std::optional<bool> seq_parallel;
  std::optional<Schedule> schedule;
  std::vector<int64_t> layers_per_stage;  // optional explicit pipeline balance (extension)
  // `train` on several ranks: a rank inside one collective for longer than this reports
  // "rank r waits in op k of group g" and aborts the job (parallel/watchdog.hpp); 0 = off.
  double watchdog_timeout_s = 300;
  // What the framework overlaps, where frameworks differ (docs/job-file.md gives each default's
  // source): the data-parallel gradient reduction with the backward (Megatron
  // --overlap-grad-reduce; DDP, FSDP, DeepSpeed ZeRO-3, NeMo and this runtime at ZeRO 0 and 2 do), the ZeRO
  // parameter all-gather with the next step's forward (--overlap-param-gather: Megatron's default
  // off), the tensor-parallel all-gathers and reduce-scatters with the GEMMs (--tp-comm-overlap,
  // torchtitan's async TP: off unless asked). recompute_early_stop: full recomputation stops before
  // each layer's last linear, as PyTorch's non-reentrant checkpoint (torch >= 2.1: torchtitan,
  // FSDP/composer with activation_checkpointing_reentrant false) and torch.compile do; off:
  // Megatron, DeepSpeed and this runtime re-run the whole layer (plan/plan.hpp Plan::recompute_early_stop).
  // overlap_p2p_comm: the interleaved schedule's pipeline sends and receives run under the compute of
  // the chunk in flight (Megatron-Core's overlap_p2p_comm: on by default with vp > 1 in Megatron-LM
  // today, off with --no-overlap-p2p-communication, where older versions opted in with
  // --overlap-p2p-communication; NeMo's and Megatron-Bridge's recipes set it with vp > 1;
  // plan/predict.cpp pp_comm_time). Off by default: this trainer's non-blocking MPI messages move
  // only inside MPI calls (weak progress), so they are counted exposed (plan.hpp as_run_here).
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = false;
  TpCommOverlap tp_comm_overlap = TpCommOverlap::none;
  bool recompute_early_stop = false;
  bool overlap_p2p_comm = false;
  bool operator==(const ParallelSpec&) const = default;
};

// [train]
// [optimizer] keys of train.optimizer = "muon" (docs/job-file.md and docs/optimizers.md give each
// default's source). The entries Muon does not take use AdamW with [train]'s beta1, beta2, eps and
// weight_decay.
struct MuonSpec {
  double momentum = 0.95;       // Keller Jordan's Muon and Moonlight both use 0.95
  bool nesterov = true;         // likewise
  int64_t ns_steps = 5;         // quintic Newton-Schulz iterations
  std::string scale = "rms_match";  // "rms_match": 0.2 sqrt(max(m, n)) (Moonlight); "shape": sqrt(max(1, m/n))
  bool operator==(const MuonSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "sgd": torch.optim.SGD (dampening 0); weight decay is
// [train] weight_decay as L2 added to the gradient, as torch.optim.SGD's.
struct SgdSpec {
  double momentum = 0.9;        // the classical value (Sutskever et al. 2013); torch's default is 0
  bool nesterov = false;        // torch.optim.SGD's default
  bool operator==(const SgdSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "lion" (Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms", arXiv 2302.06675); weight decay is [train] weight_decay, decoupled.
struct LionSpec {
  double beta1 = 0.9;           // the paper's defaults (its Algorithm 2 and section 3)
  double beta2 = 0.99;
  bool operator==(const LionSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "adafactor" (Shazeer & Stern 2018, arXiv 1804.04235) with
// an explicit learning rate ([train] lr and its schedule), as Hugging Face's Adafactor with
// relative_step = scale_parameter = false; weight decay is [train] weight_decay, decoupled.
struct AdafactorSpec {
  double beta1 = 0;             // 0: no first moment (the paper's memory-saving default)
  double decay_rate = -0.8;     // beta2_t = 1 - t^decay_rate (the paper's section 7.2)
  double eps1 = 1e-30;          // added to the squared gradient (the paper's epsilon_1)
  double clip_threshold = 1.0;  // update clipping: U / max(1, RMS(U) / d), d = 1 (section 6)
  bool factored = true;         // false: a full second moment for matrices too
  bool operator==(const AdafactorSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "shampoo" (optim/shampoo.hpp): blocked Shampoo with Adam
// grafting ([train] beta1, beta2, eps are the grafting Adam's; weight decay decoupled).
struct ShampooSpec {
  double factor_decay = 0.999;           // EMA of the Kronecker factors (Distributed Shampoo: betas[1])
  double epsilon = 1e-12;                // added to the factors' eigenvalues (Distributed Shampoo's default)
  int64_t max_preconditioner_dim = 1024; // block size (Distributed Shampoo's default)
  int64_t precondition_frequency = 20;   // steps between root refreshes (Distributed Shampoo: 1; 20 for CPU cost)
  int64_t start_preconditioning_step = 20;  // AdamW-grafted steps before the first roots
  bool operator==(const ShampooSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "soap" (optim/soap.hpp): Adam in Shampoo's eigenbasis
// ([train] beta1, beta2, eps are its Adam's; weight decay decoupled). Defaults: soap.py's (Vyas et al. 2024).
struct SoapSpec {
  double factor_decay = 0.95;            // EMA of the factors (soap.py's shampoo_beta, its beta2 by default)
  int64_t max_preconditioner_dim = 10000; // a larger side keeps the identity basis (soap.py's max_precond_dim)
  int64_t precondition_frequency = 10;   // optimizer steps between eigenbasis refreshes (soap.py's default)
  bool operator==(const SoapSpec&) const = default;
};

// [optimizer] keys of train.optimizer = "kfac" (optim/kfac.hpp): K-FAC as in KAISA, SGD with
// momentum on the preconditioned matrices and on the rest (weight decay: [train] weight_decay as
// torch.optim.SGD's L2). Defaults: kfac-pytorch's (KAISA's code) KFAC preconditioner.
struct KfacSpec {
  double momentum = 0.9;              // SGD momentum (KAISA's experiments)
  bool nesterov = false;
  double damping = 0.001;             // Tikhonov damping added to the factors' eigenvalue products
  double factor_decay = 0.95;         // EMA of the Kronecker factors
  int64_t factor_update_steps = 10;   // steps between factor updates (kfac-pytorch: factor_update_freq)
  int64_t inv_update_steps = 100;     // steps between eigendecompositions (inv_update_freq)
  double kl_clip = 0.001;             // KL clipping of the update; 0: off
  double grad_worker_fraction = 1.0;  // of the dp replicas computing each layer's P (ZeRO 0; 1: COMM-OPT)
  bool operator==(const KfacSpec&) const = default;
};

// [optimizer] keys of the matrix optimizers (muon, shampoo, soap, kfac) that make them mixed-order
// (optim/mixed.hpp): `others` gives the layers' 2-D matrices to the matrix optimizer and every
// other entry to a first-order one (with its defaults, and [train]'s beta1, beta2, eps for adamw
// and lamb); `first_order_steps` runs that one on every entry for so many steps first.
struct MixedSpec {
  std::string others;             // "": the matrix optimizer's own rule for the rest (no mixing),
                                  // unless first_order_steps > 0: then adamw (first_order())
  int64_t first_order_steps = 0;  // 0: the matrix optimizer from the first step
  bool active() const { return !others.empty() || first_order_steps > 0; }
  std::string first_order() const { return others.empty() ? "adamw" : others; }
  bool operator==(const MixedSpec&) const = default;
};

// The optimizers that can be mixed with a first-order one (MixedSpec), and those first-order ones.
inline const std::vector<std::string>& matrix_optimizer_names() {
  static const std::vector<std::string> names = {"muon", "shampoo", "soap", "kfac"};
  return names;
}
inline const std::vector<std::string>& first_order_optimizer_names() {
  static const std::vector<std::string> names = {"adamw", "lamb", "sgd", "lion", "adafactor"};
  return names;
}

// The optimizers of train.optimizer, in the order of [train] optimizer's documented choices.
inline const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"adamw", "sgd", "lamb", "lion", "adafactor", "muon", "shampoo", "soap",
                                                 "kfac"};
  return names;
}

// fp32 state elements an optimizer keeps per parameter element, on the layers' 2-D matrices and
// on the rest (embeddings, head, norms, biases), for the memory model (plan/memory.cpp) and
// the docs (optim/ allocates these; Adafactor's factored means are counted as 0).
struct OptimizerState {
  double per_matrix_element = 2, per_other_element = 2;
  // True when its update needs every entry whole on one rank (a per-matrix norm, a factored
  // moment, an orthogonalisation): ZeRO 2 and 3 at dp > 1 cut entries, so they are refused.
  bool whole_entries = false;
  bool operator==(const OptimizerState&) const = default;
};
// [comm]: compressed data-parallel gradient communication (parallel/compressors.hpp;
// docs/compression.md has each compressor, its sources and the measurements). The defaults are the
// sources' own: DGC's momentum 0.9 and 0.1% density, PyTorch's PowerSGD rank 4 hook (rank 1 by
// default there), GRACE's per-tensor top-k with error feedback.
struct CommSpec {
  std::string compressor = "none";  // comm_compressor_names(); "none": the dense fp32 collective
  double density = 0.01;            // topk, dgc, blocktopk, temporal: fraction of the elements sent
  int64_t rank = 4;                 // powersgd: the rank r of P [n, r] and Q [m, r]
  int64_t warmup_steps = 0;         // steps before the target density (dense, or DGC's exponential decay)
  std::string warmup = "dense";     // "dense": the warm-up steps send everything; "exponential": the
                                    // density falls geometrically from 25% (DGC's schedule)
  int64_t refresh_every = 10;       // temporal: the index set is chosen anew every R steps
  bool error_feedback = true;       // what is not sent is kept and added to the next step's gradient
  std::string selection = "exact";  // "exact": top-k by radix selection; "sample": DGC's sampled threshold
  double sample_fraction = 0.01;    // selection = "sample": fraction of the elements sampled
  std::string collective = "allgather";  // "allgather": of (index, value) pairs; "split_reduce": Ok-Topk-style
  std::string values = "fp32";      // topk, dgc: a sent value on the wire: "fp32"; "bf16" (rounded); "sign": its sign
                                    // and one magnitude per piece, the mean |v| (sparse ternary compression)
  std::string indices = "int32";    // topk, dgc: a sent index on the wire: "int32"; "golomb": Rice-coded gaps
                                    // (parallel/pair_codec.hpp; both need collective = "allgather")
  std::string small_pieces = "fp32";  // topk, dgc: the pieces below min_compress (norms, biases): "fp32" all-reduce;
                                      // "sign": scaled signs with error feedback (parallel/compress_common.hpp)
  std::string scope = "entry";      // "entry": k per parameter entry (per-layer densities); "bucket": one top-k per bucket
  int64_t block_size = 256;         // blocktopk: elements per block
  int64_t min_compress = 1024;      // a piece of an entry with fewer elements is sent dense (norms, biases)
  double momentum = 0.9;            // dgc: momentum correction (the optimizer is SGD without momentum)
  std::string adam_variance = "update";  // "freeze": AdamW's second moment frozen after warmup_steps
                                         // (1-bit Adam's rule; docs/compression.md, "Under Adam")
  std::string compress = "gradient";     // "momentum": after the dense warm-up each rank compresses its local
                                         // AdamW momentum (b1 m + (1 - b1) g_i, m the synchronised one) with error
                                         // feedback, and the group's sum is the new m (1-bit Adam's scheme;
                                         // docs/compression.md, "The Adam question")
  int64_t overlap_every = 10;       // sparsifiers: measure the overlap of the raw gradient's successive
                                    // top-k sets at every N-th step (and the one before); 0: never
  std::map<std::string, double> role_density;  // scope = "entry": density per ParamRole name
  bool active() const { return compressor != "none"; }
  bool packs_pairs() const { return values != "fp32" || indices != "int32"; }  // parallel/pair_codec.hpp
  bool operator==(const CommSpec&) const = default;
};

// [comm] compressor's choices, in the documented order.
inline const std::vector<std::string>& comm_compressor_names() {
  static const std::vector<std::string> names = {"none", "topk", "dgc", "blocktopk", "temporal", "powersgd", "sign"};
  return names;
}

// fp16 loss scaling ([train] precision = "fp16"; docs/precision.md "Loss scaling"): the loss is
// multiplied by the scale before backward (the initial dlogits), the fp32 gradients are divided by
// it before clipping and the optimizer, and a step whose gradients hold an inf or NaN on any rank
// is skipped. Dynamic (the default): initial 2^16 (GradScaler's init_scale), x backoff (0.5) after
// an overflow once the hysteresis is used up (below), x growth_factor (2) after growth_interval
// consecutive good steps: 1000, Megatron's loss_scale_window and DeepSpeed's (GradScaler has
// 2000), the trainers whose fp32 main_grad / master-weight layout this runtime follows. Below
// min_scale (Megatron's and DeepSpeed's min_loss_scale, 1) the run stops (DeepSpeed's
// raise_error_at_min_scale): the gradients overflow at any scale. Hysteresis (Megatron's
// --hysteresis and DeepSpeed's `hysteresis`, both default 2): the scale backs off only once
// `hysteresis` overflows have been seen since the last growth (every overflowing step is skipped
// all the same); 1 is GradScaler's rule, a backoff on every overflow. Fixed (loss_scale = a number):
// the scale never changes; an overflowing step is still skipped (Megatron's ConstantGradScaler).
struct LossScaleSpec {
  bool dynamic = true;           // loss_scale = "dynamic" | a number (fixed: `initial` is it)
  double initial = 65536;        // initial_loss_scale (dynamic), or the fixed loss_scale
  int64_t growth_interval = 1000;  // loss_scale_growth_interval
  double growth_factor = 2;      // loss_scale_growth_factor
  double backoff = 0.5;          // loss_scale_backoff
  double min_scale = 1;          // min_loss_scale
  int64_t hysteresis = 2;        // loss_scale_hysteresis
  bool operator==(const LossScaleSpec&) const = default;
};
// The largest loss scale (initial, fixed or grown): far above any useful one (a scale of 2^64
// overflows fp16 for every dY above 2^-48) and below float32's limit (the backward's dlogits
// factor is a float).
inline constexpr double kMaxLossScale = 18446744073709551616.0;  // 2^64

struct TrainSpec {
  Precision precision = Precision::fp32;
  std::string optimizer = "adamw";
  int64_t steps = 100;
  uint64_t seed = 1234;
  double lr = 6e-4;
  double min_lr = 0.0;          // cosine decays to this
  int64_t warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;       // global-norm clip; 0 = off
  std::string data;             // "" = bundled corpus
  std::string run_dir = "runs/default";
  int64_t checkpoint_every = 0; // 0 = only at the end
  int64_t keep_checkpoints = 3;  // 0 = keep all
  int64_t eval_every = 0;
  int64_t eval_batches = 4;
  int64_t log_every = 1;
  int64_t threads = 0;          // 0 = all cores
  std::string nan_policy = "stop";  // stop | skip
  LossScaleSpec loss_scale;     // precision = "fp16" only (the keys are refused otherwise)
  // The dtype of the data-parallel gradient reduction: "fp32" (Megatron's main_grad all-reduce,
  // FSDP's default reduce_dtype) or "bf16" (each bucket rounded to bf16 for the collective, summed
  // in fp32 per pair and rounded back, as NCCL's bf16 sum; parallel/compressor.hpp). The gradients
  // are accumulated in fp32 either way.
  std::string grad_reduce_dtype = "fp32";
  // The dtype of the pipeline's stage-to-stage messages (activations forward, their gradients
  // backward): "auto", the compute dtype (fp32, or under bf16/fp16 their 16-bit format, half the
  // bytes: Megatron-core's pipeline_dtype = params_dtype), or "fp32" (with residual_dtype = "fp32"
  // too, Megatron's fp32_residual_connection: the residual stream crosses the stage boundary
  // unrounded; with a 16-bit residual the stage's output is rounded already).
  std::string pipeline_dtype = "auto";
  // The dtype of the tensor-parallel regions' messages (the row-parallel outputs' all-reduce, the
  // column-parallel inputs' gradient all-reduce, sequence parallelism's all-gathers and
  // reduce-scatters): "auto", the compute dtype (16 bits under bf16/fp16, as Megatron's bf16
  // activations are), or "fp32".
  std::string tp_comm_dtype = "auto";
  // The dtype of the residual stream kept for the backward under mixed precision (each layer's
  // input and the residual after attention, `mid`): "auto", the compute dtype (16 bits under
  // bf16/fp16, as Megatron's and torchtitan's bf16 activations are), or "fp32" (Megatron's
  // --fp32-residual-connection; what torch.autocast's type promotion gives). The stage's input and
  // output stay fp32 either way (model/gpt.hpp GptOptions::fp32_residual).
  std::string residual_dtype = "auto";
  // Where the model trains (docs/job-file.md): "cpu", "cuda" (one GPU per rank), or "auto" (the
  // default): "cuda" when this exatrain has the CUDA backend and a GPU is visible, else "cpu"
  // (resolved where the backend is made: resolved_backend below).
  std::string device = "auto";
  // The compute backend: "cpu" (OpenBLAS + OpenMP), "cpu-guarded" (the same with device memory the
  // host cannot touch outside an op: the proof of the device boundary, for tests) or "cuda"; ""
  // (the default): the device's ("cpu" on device "cpu", "cuda" on "cuda").
  std::string backend;
  // Kernels the planner's time model assumes (docs/job-file.md): the fp8 scaling recipe (fp8 runs)
  // and the attention kernel.
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;
  Attention attention = Attention::flash2;
  // fp8 runs keep the linears' weights in fp8 and all-gather them so, 1 byte per matrix element
  // instead of 2 (Megatron --fp8-param-gather / DistributedDataParallelConfig.fp8_param_gather,
  // Megatron-FSDP's, torchtitan's float8 enable_fsdp_float8_all_gather): ZeRO 1 and 2's gather of
  // the updated weights, ZeRO 3's per-layer gathers. Planner only (plan.hpp Plan::fp8_all_gather).
  bool fp8_param_gather = false;
  MuonSpec muon;                // [optimizer] when optimizer = "muon"
  SgdSpec sgd;                  // ... "sgd"
  LionSpec lion;                // ... "lion"
  AdafactorSpec adafactor;      // ... "adafactor"
  ShampooSpec shampoo;          // ... "shampoo"
  SoapSpec soap;                // ... "soap"
  KfacSpec kfac;                // ... "kfac"
  MixedSpec mixed;              // ... "muon", "shampoo", "soap", "kfac": mixed with a first-order optimizer
  CommSpec comm;                // [comm]: the data-parallel gradient compressor
  bool operator==(const TrainSpec&) const = default;
};

// The state of the job's optimizer (OptimizerState), from train.optimizer and its [optimizer] keys.
OptimizerState optimizer_state(const TrainSpec& t);

struct Job {
  std::string source;  // the file it came from, for error messages
  ModelSpec model;
  MachineSpec machine;
  ParallelSpec parallel;
  TrainSpec train;
  // Where each key's value came from ("section.key" -> the job file, a preset file, or
  // "--set section.key=value"; keys at their defaults are absent), so that a check between keys
  // names the --set that broke it (job_origin() in job/parse.hpp).
  std::map<std::string, std::string> origins;
};

// Text names for the enums, as spelt in the job file.
const char* to_string(Activation);
const char* to_string(Norm);
const char* to_string(Position);
const char* to_string(Recompute);
const char* to_string(Schedule);
const char* to_string(Precision);
const char* to_string(Fp8Recipe);
const char* to_string(Attention);
const char* to_string(TpCommOverlap);  // the job key's value as TOML writes it: false, true or "forward" (quoted)

// The backend a run uses (make_backend's name), given how many CUDA devices are visible (0 without
// the CUDA backend): [train] backend when set (the parser refused one that contradicts [train]
// device), else the device's; device "auto" is "cuda" when visible_gpus > 0, else "cpu".
std::string resolved_backend(const TrainSpec& t, int visible_gpus);

}  // namespace exatrain
