// A fully resolved parallel plan (every `auto` of [parallel] filled) and its validity rules.
// Pure values and functions: no MPI, no tensors; the planner, the search and the runtime share it.
//
// Rank layout (Megatron order, tp fastest): global rank = tp_rank + tp*(cp_rank + cp*(dp_rank +
// dp*pp_rank)). So a tp group is tp consecutive ranks, a cp group has stride tp, a dp group
// stride tp*cp and a pipeline group stride tp*cp*dp.
//
// Owns (room plan/): the performance and memory model (flops, memory, comm and its exact bytes,
// pipeline, io, each optimizer's step cost, predict), the search, validation against published runs, the resolved Plan and
// THE validity rules (plan_problem), the one rank arithmetic (mesh.hpp), the pipeline stage split
// (stages.hpp), the job resolved once for `train` (resolve.hpp). Pure: no MPI, no tensors.
// May use: core/, job/, catalog/.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/job.hpp"

namespace exatrain::plan {

// Which cross-entropy implementation a framework runs (Plan::cross_entropy below).
enum class CrossEntropy { fused, eager, compiled, flash_attn };

struct Plan {
  int64_t gpus = 1, tp = 1, pp = 1, dp = 1, cp = 1, vp = 1, zero = 0, micro_batch = 1;
  int64_t global_batch = 1;
  Recompute recompute = Recompute::none;
  bool seq_parallel = false;
  Schedule schedule = Schedule::one_f_one_b;
  Precision precision = Precision::bf16;
  // [train] optimizer (job/job.hpp optimizer_names) and what it keeps per parameter (memory.cpp)
  // and needs (plan_problem: whole entries); set together from the job (optimizer_state).
  std::string optimizer = "adamw";
  OptimizerState optimizer_state;
  // The [optimizer] knobs its step cost depends on (plan/optimizer_cost.hpp), from the job too.
  struct OptimizerKnobs {
    int64_t ns_steps = 5;                   // Muon's Newton-Schulz iterations
    int64_t max_preconditioner_dim = 1024;  // Shampoo's block size; SOAP's largest rotated side
    int64_t precondition_frequency = 20;    // steps between Shampoo's roots / SOAP's eigenbases
    // Mixed order (job/job.hpp MixedSpec): the first-order optimizer of every entry but the
    // layers' matrices; "" when the matrix optimizer has them all. Costed after the switch
    // (first_order_steps is a transient).
    std::string others;
    // K-FAC's intervals (factor statistics, eigendecompositions) and its gradient workers per
    // layer as a fraction of the dp·cp replicas (optim/kfac.hpp).
    int64_t factor_update_steps = 10, inv_update_steps = 100;
    double grad_worker_fraction = 1;
    bool operator==(const OptimizerKnobs&) const = default;
  };
  OptimizerKnobs optimizer_knobs;
  // [comm]: the data-parallel gradient compressor (plan/compression.hpp models its bytes and time;
  // plan_problem its ZeRO rule); set with the optimizer, from TrainSpec::comm.
  CommSpec comm;
  // Explicit layers per virtual stage (size pp * vp, stage s = chunk * pp + pp_rank, as the
  // runtime); empty = the cost-balanced default split (plan/stages.hpp), the runtime's too.
  std::vector<int64_t> layers_per_stage;
  // Framework behaviours and kernels ([parallel] overlap_*, [train] fp8_recipe and attention;
  // job/job.hpp): what the time and memory models assume the framework does.
  bool overlap_grad_reduce = true, overlap_param_gather = false;
  // The interleaved schedule's pipeline sends and receives overlapped with the chunk in flight
  // ([parallel] overlap_p2p_comm; plan/predict.cpp pp_comm_time). vp > 1 only.
  bool overlap_p2p_comm = false;
  TpCommOverlap tp_comm_overlap = TpCommOverlap::none;  // none at tp = 1
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;
  // Fused (flash) attention never stores nor streams the s x s scores through HBM; unfused
  // (frameworks before FlashAttention, 2022) does. Validation picks it by the run's date.
  Attention attention = Attention::flash2;
  // How the framework holds gradients in memory beyond the model's fp32 buffers: DeepSpeed's
  // BF16Optimizer keeps the bf16 .grad the backward writes as well as its fp32 accumulation
  // buffer (2 bytes per parameter more). Not a job key: validation sets it for the runs that
  // name that optimizer.
  bool grads_twice = false;
  // CUDA's module loading is eager: the context holds every kernel of the libraries loaded, not
  // only those the run calls, so the runtime reserve grows (plan/memory.hpp
  // kEagerModuleLoadingBytes). Eager before PyTorch 1.13; 1.13 and later set
  // CUDA_MODULE_LOADING=LAZY when it is unset (pytorch/pytorch PR #86509; lazy loading needs
  // CUDA >= 11.7). Not a job key: validation sets it for the sources from before October 2022.
  bool cuda_modules_eager = false;
  // PyTorch FSDP (FullyShardedDataParallel, "FSDP1": llm-foundry/composer) passes every unit's
  // unsharded gradient through HBM before its reduce-scatter, per micro-batch: the cast to the
  // reduce dtype and the in-place pre-division (plan/predict.cpp fsdp_grad_pass_bytes). Not a job
  // key: validation sets it for the sources that ran FSDP1 with ZeRO 2/3 sharding.
  bool fsdp_grad_pass = false;
  // [train] fp8_param_gather: the linears' weights all-gathered as fp8, 1 byte per matrix element
  // instead of 2 (plan/memory.cpp gathered_weight_bytes). ZeRO 3 (torchao's float8 all-gather under
  // FSDP2, torchtitan --float8.enable_fsdp_float8_all_gather; Megatron-FSDP's fp8_param_gather):
  // each unit's weights are cast on their shard, so the gathered units hold, and the all-gathers
  // move, 1 byte (memory.cpp, predict.cpp zero3_time). ZeRO 1 and 2 (Megatron's distributed
  // optimizer with --fp8-param-gather: "keep the compute param in fp8 ... and perform the param
  // all-gather in fp8"): the gather of the updated weights moves 1 byte (predict.cpp
  // param_gather_time); the weights' memory stays 2 bytes a matrix element, Transformer Engine's
  // fp8 parameter and, for Hopper's fp8 GEMMs of the backward, its transpose (Megatron-FSDP's
  // fp8_need_transpose_data). fp8 only; planner only (this runtime has no fp8): bytes_sent_per_step
  // (the runtime's ledger convention, plan/comm.hpp) keeps 16-bit all-gathers.
  bool fp8_all_gather = false;
  // FSDP2 under PyTorch's pipelining with pp > 1 (torchtitan): torchtitan's apply_fsdp sets
  // reshard_after_forward = False when pp is on ("to avoid per-microbatch all-gathers"), and
  // torch.distributed.pipelining's stage (backward_maybe_with_nosync) runs every micro-batch's
  // backward with set_reshard_after_backward(False) and set_requires_gradient_sync(False), calling
  // FSDP's post-backward (the reduce-scatter) after the last one only. So a pipeline rank holds its
  // parameters unsharded in 16 bits (float8 for the linears with fp8_all_gather) and their
  // gradients unsharded in the reduce dtype for the whole step: FSDPParam.to_accumulated_grad_if_needed
  // upcasts each micro-batch's bf16 .grad into an fp32 accumulator (torchtitan reduces in fp32).
  // memory.cpp counts both (the gathered parameters beside the fp32 shards, the unsharded gradients
  // instead of sharded ones, no per-unit gather buffers); predict.cpp's zero3_time gathers once per
  // step and reduce-scatters once. Not counted: the accumulation's pass over the unsharded gradient
  // per micro-batch (read 2 + 4, write 4 bytes a parameter; about 0.4% of the step of torchtitan's
  // 405B rows). ZeRO 3 with pp > 1 only. Not a job key (this runtime gathers per micro-batch):
  // validation sets it for torchtitan's pipelined runs.
  bool fsdp_unsharded_in_pipeline = false;
  // Full recomputation that stops early: PyTorch's non-reentrant checkpoint (torch.utils.checkpoint
  // use_reentrant=False, torch >= 2.1; torchtitan's checkpoint_wrapper, composer's FSDP
  // activation_checkpointing_reentrant: false) stops rerunning the forward as soon as the last tensor
  // the backward needs is rebuilt (checkpoint.py: _StopRecomputationError from the pack hook of the
  // last saved tensor; set_checkpoint_early_stop, on by default), and torch.compile's partitioner
  // recomputes only what the backward graph uses. A layer's last linear (the MLP's down projection)
  // saves its input before its GEMM runs and nothing after it saves a tensor (no dropout), so its
  // forward GEMM is not rerun: compute.cpp's layer_time leaves it out of the recompute. Not where
  // the linear is a custom autograd Function that saves after its forward (Transformer Engine's
  // modules, torchao's eager Float8Linear) nor under Megatron's or DeepSpeed's reentrant
  // checkpointing or this runtime (model/recompute_policy.hpp reruns the whole layer, so `train`
  // refuses it). [parallel] recompute_early_stop (default false); validation sets it per source and date.
  bool recompute_early_stop = false;
  // Element-wise kernels: fused (Megatron's bias-GELU and bias-dropout-add, TE, torch.compile) or
  // one kernel per op (PyTorch eager); plan/compute.cpp counts each one's bytes.
  bool fused_kernels = true;
  // SwiGLU as one fused autograd Function that saves only its input (Megatron-Core's
  // bias_swiglu_impl, megatron/core/fusions/fused_bias_swiglu.py, with bias_activation_fusion, which
  // Megatron-Bridge's Llama 3 providers set): the MLP keeps the gate and up projections' outputs and
  // the down projection's input, not silu(gate). False: eager PyTorch (silu's output kept too) and
  // torch.compile as torchtitan runs it (its measured peaks do not show the saving: docs/planner.md).
  // plan/memory.cpp activation_bytes_per_layer, which applies it with fused_kernels only (eager
  // PyTorch keeps silu(gate) whatever this says). Not a job key: true; validation sets false for
  // torchtitan.
  bool swiglu_saves_input_only = true;
  // fp8 linears that save their quantized input for the backward, 1 byte per element, instead of
  // the 16-bit one: Transformer Engine's Linear and LayerNormLinear keep the fp8 copy the forward
  // GEMM used (update_usage(rowwise_usage=False, columnwise_usage=True) in module/linear.py and
  // ops/basic/basic_linear.py), so the norms' outputs and the down projection's input are held in
  // fp8; the attention core still keeps its own 16-bit output beside the out-projection's fp8
  // copy. torchao's Float8Linear saves the high-precision tensors (it re-casts in the backward):
  // false. plan/memory.cpp activation_bytes_per_layer. Not a job key: true (TE, the default fp8
  // recipe's library); validation sets false for torchtitan.
  bool fp8_saves_quantized_inputs = true;
  // The cross entropy over the logits, by what it holds per logit (plan/memory.cpp): Megatron's
  // fused vocabulary-parallel kernel (16-bit logits, an fp32 copy turned into the gradient in
  // place, the 16-bit gradient: 8 bytes), PyTorch eager on an fp32 upcast (16-bit logits, the
  // saved fp32 log-softmax, its fp32 gradient and the 16-bit gradient: 12), or that upcast and
  // loss compiled by torch.compile (inductor fuses the upcast, log-softmax and gradient: the 16-bit
  // logits and the 16-bit gradient, 4), or flash-attn's fused cross entropy (flash-attn 1.0.x's
  // CrossEntropyLoss over its xentropy CUDA extension, which llm-foundry imported in 2023 and carried
  // a copy of in 2024: it saves the 16-bit logits and one fp32 log-sum-exp per row and writes a new
  // 16-bit gradient, inplace_backward off; 4). Not a job key: validation sets it per source and date.
  CrossEntropy cross_entropy = CrossEntropy::fused;
  // Gradients accumulated and data-parallel-reduced in 16 bits instead of fp32: Megatron's fp16
  // path (accumulate_allreduce_grads_in_fp32 is forced only for bf16), DeepSpeed's fp16 ZeRO, FSDP's
  // PURE mixed precision. Not a job key: validation sets it per source; the default (fp32) is what
  // Megatron's bf16 runs, FSDP's default policy and this runtime do.
  bool grads_16bit = false;
  // [train] grad_reduce_dtype = "bf16" (set with the optimizer, from the job): the data-parallel
  // gradient reduction sends bf16, 2 bytes per element, while the gradients stay fp32 in memory
  // (parallel/compressor.hpp Bf16ReduceCompressor). comm.cpp's dp reduction bytes and predict's dp
  // time use it; memory does not change.
  bool grad_reduce_bf16 = false;
  // [train] pipeline_dtype = "fp32" (set with the optimizer, from the job): the stage-to-stage
  // messages stay fp32 under mixed precision; otherwise they have the compute dtype, 16 bits
  // under bf16/fp16 (Megatron-core's pipeline_dtype). comm.cpp's pp_send bytes and predict's p2p
  // time use pipeline_element_bytes(); the runtime's BufferPool sends the same (parallel/executor.hpp).
  bool pipeline_fp32 = false;
  // [train] tp_comm_dtype = "fp32" (likewise): the tensor-parallel regions' activations and
  // activation gradients cross the tp group in fp32 under mixed precision; otherwise in the compute
  // dtype (Megatron's). comm.cpp's tp bytes and predict's tp time use tp_element_bytes(); the
  // runtime's TpComm sends the same (parallel/tp_regions.hpp). The cross-entropy statistics are
  // fp32 and the sequence-parallel weight gradients have the gradients' dtype either way.
  bool tp_comm_fp32 = false;
  // [train] residual_dtype = "fp32" (likewise): under a 16-bit precision the residual stream kept
  // for the backward (each layer's input and `mid`) stays fp32, 4 bytes a value where the other
  // activations take 2 (Megatron's --fp32-residual-connection). memory.cpp counts it; the runtime
  // keeps the same (model/gpt.hpp GptOptions::fp32_residual).
  bool residual_fp32 = false;
  // Pipeline sends across nodes with tp > 1: Megatron's scatter/gather (each tp rank sends 1/tp of
  // the replicated activation, the receiving node all-gathers it; Narayanan et al. SC21 Sec. 4.1),
  // or every tp rank the whole tensor (DeepSpeed's pipeline engine). Not a job key: validation
  // sets it for the runs on DeepSpeed's engine.
  bool pp_scatter_gather = true;
  // ZeRO 3's gathers and reduce-scatters run under the neighbouring layers' compute (FSDP's
  // forward/backward prefetch, DeepSpeed ZeRO-3's prefetch bucket, Megatron-FSDP: predict.cpp
  // zero3_time); false: each layer's gather and reduce-scatter blocks, as this runtime's ZeRO 3
  // (parallel/zero3_sync.cpp; as_run_here). Not a job key: every ZeRO-3 framework modelled prefetches.
  bool zero3_prefetch = true;
  // Dropout in the layers (a 1-byte mask after attention and after the MLP); unset: GELU models
  // have it (GPT-2/3 style), SwiGLU models do not. Not a job key: validation sets it per source.
  std::optional<bool> dropout;
  // ALiBi position bias (Press et al. 2022) instead of the model's position scheme: MPT
  // (llm-foundry `alibi: true`) and BLOOM. The layers then run no RoPE kernels; the attention
  // core adds a bias to every score (plan/compute.cpp counts it). Not a job key: validation sets
  // it from the source (the runtime has no ALiBi).
  bool alibi = false;

  int64_t micro_batches() const { return global_batch / (dp * micro_batch); }
  // optimizer and optimizer_state from the job's [train] optimizer (and [optimizer] keys).
  void set_optimizer(const TrainSpec& t) {
    optimizer = t.optimizer;
    optimizer_state = exatrain::optimizer_state(t);
    optimizer_knobs.ns_steps = t.muon.ns_steps;
    optimizer_knobs.max_preconditioner_dim = t.shampoo.max_preconditioner_dim;
    optimizer_knobs.precondition_frequency = t.shampoo.precondition_frequency;
    if (t.optimizer == "soap") {
      optimizer_knobs.max_preconditioner_dim = t.soap.max_preconditioner_dim;
      optimizer_knobs.precondition_frequency = t.soap.precondition_frequency;
    }
    optimizer_knobs.factor_update_steps = t.kfac.factor_update_steps;
    optimizer_knobs.inv_update_steps = t.kfac.inv_update_steps;
    optimizer_knobs.grad_worker_fraction = t.kfac.grad_worker_fraction;
    optimizer_knobs.others = t.mixed.active() ? t.mixed.first_order() : "";
    comm = t.comm;
    grad_reduce_bf16 = t.grad_reduce_dtype == "bf16";
    pipeline_fp32 = t.pipeline_dtype == "fp32";
    tp_comm_fp32 = t.tp_comm_dtype == "fp32";
    residual_fp32 = t.residual_dtype == "fp32";
  }
  // [train] fp8_recipe, attention and fp8_param_gather (what set_optimizer is to [train] optimizer).
  void set_kernels(const TrainSpec& t) {
    fp8_recipe = t.fp8_recipe;
    attention = t.attention;
    fp8_all_gather = t.fp8_param_gather;
  }
  // [parallel]'s framework behaviours (overlap_grad_reduce, overlap_param_gather, tp_comm_overlap,
  // recompute_early_stop, overlap_p2p_comm) and layers_per_stage, on a plan whose tp is set: tp_comm_overlap is
  // none at tp = 1 (no tensor-parallel communication; plan_notes says so). The one copy that
  // resolve_plan and the search's candidates (search.cpp base_plan) share; the trainer's plan
  // (resolve.cpp plan_from_job) takes the stage split and recompute_early_stop only.
  void set_framework(const ParallelSpec& par) {
    overlap_grad_reduce = par.overlap_grad_reduce;
    overlap_param_gather = par.overlap_param_gather;
    tp_comm_overlap = tp > 1 ? par.tp_comm_overlap : TpCommOverlap::none;
    recompute_early_stop = par.recompute_early_stop;
    overlap_p2p_comm = par.overlap_p2p_comm;
    layers_per_stage = par.layers_per_stage;
  }
  bool interleaved() const { return vp > 1; }
  // Full recomputation that leaves out each layer's last linear and the tp collective after it
  // (recompute_early_stop above): the one test compute, communication and FLOP counts share.
  bool recompute_stops_early() const { return recompute == Recompute::full && recompute_early_stop; }
  // Bytes of one element of a pipeline message (pipeline_fp32 above).
  int64_t pipeline_element_bytes() const;
  // Bytes of one element of a tensor-parallel region's message (tp_comm_fp32 above).
  int64_t tp_element_bytes() const;
  bool flash_attention() const { return attention != Attention::unfused; }
};

// The Plan of a Job whose [parallel] is fully resolved; throws an Error naming the first field
// still `auto`. seq_parallel at tp = 1 is a no-op (Megatron turns it off; plan_notes says so).
Plan resolve_plan(const ParallelSpec& parallel, Precision precision);
// The same with the job's optimizer (set_optimizer) and kernels (set_kernels).
Plan resolve_plan(const Job& job);

// Settings of the job that have no effect on this plan, as the frameworks accept them (a
// published configuration may carry them), one line each for `predict`, `check` and `train` to
// print: seq_parallel or tp_comm_overlap at tp = 1 (Megatron and NeMo turn them off),
// ZeRO without data-parallel replicas, overlap_param_gather under ZeRO 3 (it gathers per layer
// anyway), fp8_recipe without fp8, fp8_param_gather without fp8 or without a parameter all-gather,
// schedule = "gpipe" without a pipeline, tp_comm_dtype or
// pipeline_dtype = "fp32" without tp / pp or at fp32, residual_dtype = "fp32" at fp32 (and, at
// pp > 1, without pipeline_dtype = "fp32": half of Megatron's flag). Only keys the job sets.
std::vector<std::string> plan_notes(const Job& job, const Plan& plan);

// THE rules a plan must satisfy on a model, in one place: `predict`, `plan` (and its search) and
// `train` all call plan_problem. Purpose::train adds what the planner models but this runtime does
// not run (context parallelism, replicated kv heads). The first broken rule comes back with the
// job keys involved and the equation that fails, e.g. "tp must divide heads: heads % tp = 96 % 5 =
// 1, expected 0"; job_text is the trainer's wording, printed after the origins of those keys.
enum class Purpose { predict, train };
struct PlanProblem {
  std::vector<std::string> keys;  // e.g. {"parallel.tp", "model.heads"}
  std::string text;               // the rule and its equation
  std::string job_text;           // "[parallel] tp 3 must divide heads 8: 8 % 3 = 2"
};
std::optional<PlanProblem> plan_problem(const ModelSpec& model, const Plan& plan, Purpose purpose);
// `planned` with this trainer's framework behaviours, for a prediction of one of its runs (`report`,
// `calibrate` of run directories) and for the plans `train` chooses itself (search_runnable_plans):
// ZeRO 0 and 2 reduce bucket by bucket under the backward, ZeRO 1 reduce-scatters once after the
// last micro-batch (parallel/grad_sync.hpp: overlap_grad_reduce true at ZeRO 0 and 2, false at 1);
// ZeRO 3 gathers and reduce-scatters each layer blocking (no zero3_prefetch); ZeRO 1 and 2 gather
// the updated weights after the optimizer step (no overlap_param_gather); tensor-parallel
// collectives block (no tp_comm_overlap); pipeline messages are non-blocking MPI sends and receives
// posted a compute early, which MPI's weak progress (no progress thread) moves only inside its
// calls, so they are counted exposed (no overlap_p2p_comm) and whole (no pp_scatter_gather); full
// recomputation re-runs whole layers (no recompute_early_stop).
Plan as_run_here(Plan planned);
// plan_problem(..., Purpose::predict)'s text; empty string: valid.
std::string plan_error(const ModelSpec& model, const Plan& plan);
// Throws Error(plan_error) when the plan is invalid.
void check_plan(const ModelSpec& model, const Plan& plan);

// Layers per pipeline rank when pp does not divide the layers: floor(layers/pp) each, the
// remainder going one by one to the middle ranks first, because the first and last ranks also
// carry the embedding and the LM head. E.g. 126 layers on 16 ranks: 7, 8 x 14, 7.
// Megatron's convention, used only to read published runs that don't state their partition
// (validate.cpp); a plan without layers_per_stage uses the cost-balanced split of plan/stages.hpp.
std::vector<int64_t> balanced_layers(int64_t layers, int64_t pp);

// Transformer layers on each pipeline rank (size pp): the sum over the rank's vp stages of
// layers_per_stage when given, else of the cost-balanced split the runtime uses
// (plan/stages.hpp layers_per_pp_rank, memoised). The plan must be valid (plan_error empty).
std::vector<int64_t> layers_per_rank(const ModelSpec& model, const Plan& plan);
int64_t layers_on_rank(const ModelSpec& model, const Plan& plan, int64_t pp_rank);

int64_t element_bytes(Precision p);  // 4 for fp32, 2 for fp16/bf16/fp8 (fp8 keeps bf16 weights)

}  // namespace exatrain::plan
