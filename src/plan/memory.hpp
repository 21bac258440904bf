// Memory per device: parameters, gradients and optimizer state by ZeRO stage and precision,
// activations per micro-batch in flight for the schedule (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", Sec. 4), buffers and an allowance for
// allocator fragmentation. All sizes in bytes; the report converts to GiB.
#pragma once
#include <cstdint>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

// Allowances (docs/planner.md): a runtime reserve for the CUDA/HIP context, BLAS and collective
// workspaces (stated), and two shares of the sum, the reserve included, for the caching allocator
// (fitted by `exatrain validate`: plan::Calibration): what it reserves beyond what is allocated at the peak a
// memory monitor reports (kFragmentation, fitted to measured peaks), and what a run near its
// capacity still needs beyond what is counted (kFragmentationAtCapacity, fitted to which runs ran and
// which failed out of memory; Memory::total).
constexpr double kRuntimeReserveBytes = 1.0 * (1 << 30);
// What eager CUDA module loading (Plan::cuda_modules_eager) adds to the context: 1573 MiB "for cuda
// kernels" that BigScience measured on a 40 GB A100 in Jan 2022 with their stack (torch.ones(1).cuda()
// and nvidia-smi; bigscience train/tr11-176B-ml/chronicles-prequel.md, which also gives 1271 MiB on
// its 32 GB V100s) less a lazily loaded context, which kRuntimeReserveBytes already holds: 287,047,680
// bytes (cudaMemGetInfo's used after a first tensor, pytorch/pytorch PR #86509). The two come from
// different setups; the PR's own eager figure, 666,632,192 bytes, is 0.35 GiB over its lazy one with
// the fewer libraries its test loaded (docs/planner.md, "Causes counted, memory (seventh round)").
constexpr double kEagerModuleLoadingBytes = 1573.0 * (1 << 20) - 287047680.0;
constexpr double kFragmentation = 0.205;              // = plan::Calibration::fragmentation
constexpr double kFragmentationAtCapacity = 0.047;    // = plan::Calibration::fragmentation_at_capacity

// Exact parameter count held by the rank at (pp_rank, tp_rank): the floats of the runtime model's
// arena (Gpt::layout().total(), summed over the rank's virtual stages; tests/plan/params_test.cpp
// checks it over a grid of models and splits). Megatron's tensor sharding: column-parallel QKV and
// fc1 / gate+up (weights and biases split by tp), row-parallel out-proj and fc2 (weights split,
// biases replicated), norms replicated, biases only with model.bias; vocabulary-parallel
// embedding and output matrix with the rows of job/model_shapes.hpp's vocab_slice (ceil(vocab / tp),
// the last rank the remainder: tp_rank 0 holds the most). The first pipeline rank holds the
// embeddings, the last the final norm and the output matrix (a copy of the tied embedding when
// pp > 1). kv heads fewer than tp are replicated (each rank keeps one kv head; the planner models
// this Megatron option, the runtime rejects it).
int64_t parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank, int64_t tp_rank = 0);
// Of those, the parameters outside the transformer layers: the embedding unit's (words, learned
// positions) on the first pipeline rank, the head unit's (final norm, the output matrix unless it is
// the tied embedding of a single stage) on the last; 0 elsewhere.
struct EndParameters { int64_t embedding = 0, head = 0; };
EndParameters end_parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank, int64_t tp_rank = 0);
// Of those, the elements of the layers' 2-D matrices (q/k/v/o, the MLP's): Muon's domain.
int64_t matrix_parameters_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank);
// The weights a ZeRO all-gather moves (ZeRO 3's gathered units, ZeRO 1 and 2's updated weights):
// bytes of `parameters` elements of which `matrix_parameters` are the layers' matrices, 16-bit
// (fp32 training: 32-bit), the matrices 8-bit with Plan::fp8_all_gather.
double gathered_weight_bytes(const Plan& p, double parameters, double matrix_parameters);
// One gathered layer (ZeRO 3's unit) on pipeline rank pp_rank: its bytes as the all-gather delivers it.
double gathered_unit_bytes(const ModelSpec& m, const Plan& p, int64_t pp_rank);

// Activation bytes one transformer layer keeps per micro-batch for the backward pass, on one
// tensor-parallel rank, 2-byte elements (16-bit training; x2 for fp32). Korthikanti Table 2,
// generalised to GQA (kv), any ffn width and SwiGLU:
//   none:      t*(R + S/tp) + 5*a*s*t/tp        R = 10h replicated, S = 4h+4kv + mlp split part
//   sp:        the R part is split by tp too
//   selective: the 5*a*s*t term (attention scores) is dropped
//   full:      2*h*t (the layer input; /tp with sp)
// with t = micro_batch * seq_len / cp tokens. GELU mlp split part = 4f (16h at f = 4h);
// SwiGLU = 8f (gate and up outputs, silu(gate), fc2 input). With flash attention the scores are
// never stored, so the 5as term is 0 for every recompute mode.
double activation_bytes_per_layer(const ModelSpec& m, const Plan& p, Recompute r);

// Bytes the cross entropy holds per logit of one micro-batch (plan.hpp Plan::cross_entropy):
// fused 8, eager 12, compiled 4.
double cross_entropy_bytes_per_logit(CrossEntropy ce);

// Memory::peak and Memory::total are a rank's counted sum (weights, gradients, optimizer state,
// activations, buffers) plus a share of it for the caching allocator: (1 + share) x counted, with
// share = fragmentation (the peak a monitor reports) or fragmentation_at_capacity (what the run needs).
inline double with_allocator_share(double counted, double share) { return (1 + share) * counted; }

// Micro-batches (in units of the rank's whole layers) whose activations pipeline rank r holds at
// the peak: gpipe m; 1F1B pp - r; interleaved (2 (pp-r-1) + (vp-1) pp + 1) / vp chunks' worth, which
// at rank 0 is Korthikanti's pp (1 + (pp-1)/(pp vp)) (Sec. 4.2.3); never more than m. The runtime's
// schedule holds the same (parallel/schedule.hpp expected_peak_in_flight, checked against it).
double microbatches_in_flight(const Plan& p, int64_t pp_rank = 0);

struct Memory {
  // `total`, the sum of the parts, is what the run needs: whether it fits compares it with the
  // device's memory. `buffers` holds the allocator's share at the capacity (fragmentation_at_capacity):
  // when a cudaMalloc fails, PyTorch's caching allocator frees its cached unused blocks and retries
  // (c10/cuda/CUDACachingAllocator.cpp; memory_stats()'s num_alloc_retries counts them), so a run
  // near its capacity gives back most of the reserve it holds at rest; what stays is the blocks'
  // splitting and rounding.
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0, total = 0;  // bytes
  // The peak a memory monitor reports (nvidia-smi, torch.cuda.max_memory_reserved) on a run with
  // room to spare: what is counted plus the `fragmentation` share the allocator keeps cached.
  double peak = 0;
  int64_t pp_rank = 0;  // the most loaded pipeline rank
};

// Memory of the most loaded rank (max over pipeline ranks).
// `fragmentation`: the allocator's reserved-but-unused share at a monitor's peak (Memory::peak);
// `at_capacity`: the share a run near its capacity still needs (Memory::total; plan::Calibration).
Memory memory_per_device(const ModelSpec& m, const Plan& p, const Device& d, double fragmentation = kFragmentation,
                         double at_capacity = kFragmentationAtCapacity);
// A lower bound on the most loaded rank's memory that needs no activations (for pruning).
double static_memory_lower_bound(const ModelSpec& m, const Plan& p);


}  // namespace exatrain::plan
