#include "plan/validate.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "plan/fit.hpp"
#include "plan/flops.hpp"

namespace exatrain::plan {

std::vector<CsvRow> read_csv(const std::string& path) {
  EXA_CHECK(std::filesystem::exists(path), "cannot open validation file {}", path);
  // A regular file of at most 64 MiB (the published runs are ~100 KB); never a FIFO or device.
  std::string text = read_file_bytes(path, uint64_t(64) << 20);
  std::vector<std::vector<std::string>> records(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') { field += '"'; ++i; }
      else if (c == '"') quoted = false;
      else field += c;
    } else if (c == '"') quoted = true;
    else if (c == ',') { records.back().push_back(field); field.clear(); }
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      records.back().push_back(field);
      field.clear();
      records.emplace_back();
    } else field += c;
  }
  if (!field.empty() || !records.back().empty()) records.back().push_back(field);
  while (!records.empty() && (records.back().empty() ||
                              (records.back().size() == 1 && records.back()[0].empty())))
    records.pop_back();
  EXA_CHECK(!records.empty(), "{}: empty CSV", path);
  const auto& header = records[0];
  std::vector<CsvRow> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    EXA_CHECK(records[r].size() == header.size(), "{}: row {} has {} fields, header has {}", path,
              r, records[r].size(), header.size());
    CsvRow row;
    for (size_t c = 0; c < header.size(); ++c) row[header[c]] = records[r][c];
    rows.push_back(row);
  }
  return rows;
}

namespace {

// The global constants of plan::Calibration that validation fits besides each family's
// `sustained` (docs/planner.md "Calibrated constants").
const char* const kFittedGlobals[] = {"fp8_relative", "attention_relative"};

bool has(const std::string& s, const std::string& what) {
  std::string a = s, b = what;
  std::transform(a.begin(), a.end(), a.begin(), ::tolower);
  std::transform(b.begin(), b.end(), b.begin(), ::tolower);
  return a.find(b) != std::string::npos;
}
std::optional<double> number(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || it->second.empty()) return std::nullopt;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (!std::isfinite(v)) return std::nullopt;  // "nan", "inf", 1e999: no figure
    return v;
  } catch (...) {
    return std::nullopt;
  }
}
// A cell that holds a count: a whole number in [lo, 2^40] (so that casts and products stay
// defined); nullopt when absent or not such a number: the row is then skipped, never guessed.
std::optional<int64_t> whole(const std::string& text, int64_t lo) {
  CsvRow one{{"v", text}};
  auto v = number(one, "v");
  if (!v || *v != std::floor(*v) || *v < double(lo) || *v > double(int64_t(1) << 40)) return std::nullopt;
  return int64_t(*v);
}
std::optional<int64_t> whole(const CsvRow& row, const std::string& key, int64_t lo = 1) {
  auto it = row.find(key);
  return it == row.end() ? std::nullopt : whole(it->second, lo);
}
// Why a count cell is unusable: "KEY not stated" (empty) or "KEY = 'TEXT' is not a whole number".
std::string unusable(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || it->second.empty()) return key + " not stated";
  return fmt::format("{} = '{}' is not a whole number in range", key, it->second.substr(0, 40));
}
std::string cell(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  return it == row.end() ? "" : it->second;
}

// The source's author or repository (first word), for grouping.
std::string source_key(const std::string& source) {
  std::string s = source.substr(0, source.find(' '));
  return s;
}

// The year and month (yyyymm) a source cell dates its benchmark by: "Dec 2024", "June 2025",
// or the file name's "2025-06" / "202506"; 0 when it states none.
int source_year_month(const std::string& cell) {
  static const std::regex numeric(R"((20\d\d)-?(0[1-9]|1[0-2])(?!\d))");
  static const std::regex named(R"(\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* (20\d\d)\b)");
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  int best = 0;
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), numeric); it != std::sregex_iterator(); ++it)
    best = std::max(best, std::stoi((*it)[1]) * 100 + std::stoi((*it)[2]));
  for (auto it = std::sregex_iterator(cell.begin(), cell.end(), named); it != std::sregex_iterator(); ++it)
    for (int i = 0; i < 12; ++i)
      if ((*it)[1] == months[i]) best = std::max(best, std::stoi((*it)[2]) * 100 + i + 1);
  return best;
}

// Whether the notes state `key` on: named, and never as "key=False" / "key false" (a note saying
// it is off must not turn it on).
bool stated_on(const std::string& notes, const std::string& key) {
  if (!has(notes, key)) return false;
  for (const char* off : {"=False", "=false", " false", ": false", " off"})
    if (has(notes, key + off)) return false;
  return true;
}

// Megatron-Core with Transformer Engine's modules (Megatron-Bridge; NeMo 24.07's mcore_gpt with
// transformer_engine: true): "" or why the row cannot be modelled.
//  - attention: TE's DotProductAttention prefers its FusedAttention (cuDNN) backend over
//    FlashAttention on Hopper and later "for performance reasons" (get_attention_backend, in
//    transformer_engine/pytorch/attention/dot_product_attention/utils.py; in TE 1.x, NeMo 24.07's,
//    the same rule in transformer_engine/pytorch/attention.py): the Hopper-specific kernel class,
//    flash3, which the catalog has for Hopper devices only.
//  - fp8: FP8-CS is TE's current (tensorwise) scaling (Megatron-Bridge's
//    bf16_with_fp8_current_scaling_mixed), fp8_hybrid / "delayed" its delayed scaling; block
//    scalings (MX, subchannel) are refused, as rowwise is: no measured rate.
//  - gradients: Megatron's DDP with grad_reduce_in_fp32 = False keeps its main_grad buffer, and
//    reduces it, in the parameters' 16-bit dtype (Megatron-Bridge's perf recipes; NeMo's
//    grad_sync_dtype: bf16); fp8_param_gather gathers the linears' weights as fp8 (Megatron-FSDP's
//    per-layer gathers, the distributed optimizer's gather of the updated weights).
std::string megatron_te_of(const std::string& prec, const std::string& notes, const std::string& device, Plan& p) {
  if (!find_device(device).flash3_efficiency)
    return fmt::format("Transformer Engine's fused (cuDNN) attention is read as the flash3 class, which the "
                       "catalog has for Hopper devices only, not {}", device);
  p.attention = Attention::flash3;
  if (p.precision == Precision::fp8) {
    for (const char* block : {"FP8-MX", "MXFP8", "subchannel", "blockwise", "FP8-SS"})
      if (has(prec, block) || has(notes, block))
        return fmt::format("fp8 block scaling ({}): no measured rate of block-scaled fp8 GEMMs in the catalog", block);
    if (has(prec, "FP8-CS") || has(notes, "current scaling")) p.fp8_recipe = Fp8Recipe::tensorwise;
    else if (has(prec, "delayed") || has(notes, "delayed scaling")) p.fp8_recipe = Fp8Recipe::delayed;
    else return "fp8 recipe not stated (current or delayed scaling)";
  }
  if (has(notes, "grad_reduce_in_fp32=False")) p.grads_16bit = true;
  if (stated_on(notes, "fp8_param_gather") && p.zero >= 1 && p.precision == Precision::fp8) p.fp8_all_gather = true;
  return "";
}

// The overlap flags a row's notes state (Megatron-Core's and NeMo's names).
void overlaps_of(const std::string& notes, Plan& p) {
  if (has(notes, "--overlap-grad-reduce")) p.overlap_grad_reduce = true;
  if (stated_on(notes, "overlap_p2p_comm") && p.vp > 1) p.overlap_p2p_comm = true;
  if (has(notes, "--overlap-param-gather") && p.zero > 0) p.overlap_param_gather = true;
  if (has(notes, "--tp-comm-overlap") && p.tp > 1 && p.seq_parallel) p.tp_comm_overlap = TpCommOverlap::all;
}

// What each source's framework does where frameworks differ (plan/plan.hpp's framework fields),
// from the framework's documented behaviour at the time and what the row's notes state; "" or why
// the row cannot be modelled.
//  - Megatron-LM 2021-22 (SC21, Korthikanti, MT-NLG) and Megatron-DeepSpeed (BLOOM): unfused
//    attention with the fused scale-mask-softmax, fused element-wise kernels (bias-GELU,
//    bias-dropout-add), the data-parallel gradient reduction after the backward (Megatron's local
//    DDP all-reduces after the last micro-batch; DeepSpeed's pipeline engine reduces at the end of
//    its schedule), DeepSpeed's BF16Optimizer keeping bf16 and fp32 gradients; CUDA modules loaded
//    eagerly (PyTorch before 1.13: plan.hpp Plan::cuda_modules_eager).
//  - llm-foundry (MPT): FlashAttention-2/Triton attention, PyTorch eager element-wise ops, no
//    dropout (the MPT yamls set every pdrop to 0), FSDP (reduction overlapped), TE's delayed fp8.
//  - torchtitan (Llama 3): SDPA's flash backend, eager or torch.compile (stated), its "selective"
//    checkpointing is the op-level one (selective_ac_option = "op" in its Llama 3 configs),
//    torchao's float8 (tensorwise unless "rowwise" is stated), async TP where stated (forward passes only), the loss
//    eager (fp32 upcast) or compiled with the model by the torchtitan version's date.
//  - Megatron-Core / NeMo: the overlap flags the notes state (overlaps_of); Megatron-Bridge and
//    NeMo 24.07 (Megatron-Core with Transformer Engine): megatron_te_of.
std::string framework_of(const std::string& source, const std::string& source_cell, const std::string& prec,
                         const std::string& notes, const std::string& device, Plan& p) {
  for (const char* old : {"Narayanan", "Korthikanti", "Smith", "bigscience-workshop/bigscience", "Zhang"})
    if (source == old) {
      p.attention = Attention::unfused;
      p.overlap_grad_reduce = false;
      p.cuda_modules_eager = true;  // PyTorch before 1.13
    }
  // DeepSpeed's BF16Optimizer: named in the precision cell, or in the notes (BLOOM's production run).
  if (has(prec, "BF16Optimizer") || has(notes, "BF16Optimizer")) p.grads_twice = true;
  if (source == "bigscience-workshop/bigscience") {
    p.pp_scatter_gather = false;  // DeepSpeed's pipeline engine
    p.alibi = true;               // BLOOM: --position-embedding-type alibi
  }
  // Megatron's and DeepSpeed's fp16 paths accumulate and reduce fp16 gradients (Megatron forces
  // fp32 accumulation for bf16 only).
  if (p.precision == Precision::fp16) p.grads_16bit = true;
  if (has(source, "mosaicml")) {
    p.alibi = true;  // MPT: attn_config alibi: true, no RoPE
    p.fused_kernels = false;
    // ComposerMPTCausalLM's loss_fn defaults to "fused_crossentropy", flash-attn's
    // (llmfoundry/models/mpt/modeling_mpt.py: flash_attn.losses.cross_entropy.CrossEntropyLoss);
    // neither the pretrain yamls nor scripts/train/benchmarking/submit_benchmarks.py change it.
    p.cross_entropy = CrossEntropy::flash_attn;
    p.dropout = false;
    // llm-foundry's benchmark script before 2024 ran attn_impl "triton" with FSDP's PURE mixed
    // precision (bf16 gradients) and passed precision "bf16"; the 2024 one "flash" (flash-attn 2)
    // with "amp_" precisions and the DEFAULT policy (fp32 reduction): the row's notes say which.
    if (has(notes, "MP mode PURE")) {
      p.attention = Attention::flash1;
      p.grads_16bit = true;
    }
    p.fsdp_grad_pass = true;  // composer wraps the model in torch's FullyShardedDataParallel (FSDP1)
    // submit_benchmarks.py sets activation_checkpointing_reentrant: false; the 2024 sweep's torch
    // stops the recomputation early (plan.hpp), the 2023 one's (its default image: torch 1.13.1)
    // reran the whole block. TE's fp8 modules save after their forward: nothing skipped.
    p.recompute_early_stop = !has(notes, "MP mode PURE") && p.precision != Precision::fp8;
  }
  if (has(source, "torchtitan")) {
    // The trainy-whitefiber H200 benchmark's row does not restate it, but the command that file
    // gives runs `--training.compile` (and --training.local_batch_size=2, as the row has).
    p.fused_kernels = has(prec, "compile") || has(notes, "compile") || has(source_cell, "trainy-whitefiber");
    // torchtitan compiles the loss (the fp32 upcast inside it) with the model: from PR #642
    // (2024-10-22) to PR #755 (2024-12-19, "turning off compile on loss function") and again
    // from PR #1033 (2025-04-01), so by the benchmark's date in the source cell. The Dec 2024
    // benchmarks ran torchtitan 9dec370 (2024-12-26), whose loss was eager, but are read with
    // the fused class as a stand-in (docs/planner.md, "Causes counted, memory (third round)":
    // what torch.compile saved in their blocks is not placed); the June 2025 ones: compiled.
    const bool loss_compiled = source_year_month(source_cell) >= 202504;
    p.cross_entropy = !p.fused_kernels ? CrossEntropy::eager : loss_compiled ? CrossEntropy::compiled : CrossEntropy::fused;
    // Async TP: PyTorch's micro-pipelined all-gather/GEMM and GEMM/reduce-scatter, the forward's
    // collectives only (job/job.hpp TpCommOverlap).
    if (p.tp > 1 && (has(prec, "AsyncTP") || has(notes, "async TP") || has(notes, "AsyncTP")))
      p.tp_comm_overlap = TpCommOverlap::forward;
    // "float8 linears + fp8 all-gather" (--float8.enable_fsdp_float8_all_gather): FSDP2 gathers
    // the linears' weights as float8 (plan.hpp Plan::fp8_all_gather).
    p.fp8_all_gather = has(prec, "fp8 all-gather") || has(prec, "float8 all-gather");
    // Full AC is torch's checkpoint_wrapper (non-reentrant): early stop in eager mode, the
    // partitioner's recompute under torch.compile; eager Float8Linear saves after its forward.
    p.recompute_early_stop = p.fused_kernels || p.precision != Precision::fp8;
    // With pp > 1 FSDP2 keeps each rank's units gathered and their gradients unsharded for the
    // step (torchtitan's apply_fsdp, torch.distributed.pipelining's stage; plan.hpp).
    p.fsdp_unsharded_in_pipeline = p.pp > 1 && p.zero >= 3;
    p.fp8_saves_quantized_inputs = false;  // torchao's Float8Linear saves the high-precision tensors
    p.swiglu_saves_input_only = false;      // eager silu * up, or torch.compile's partition of it
    if (has(prec, "rowwise")) p.fp8_recipe = Fp8Recipe::rowwise;
    else if (p.precision == Precision::fp8) p.fp8_recipe = Fp8Recipe::tensorwise;
    if (p.recompute == Recompute::selective) p.recompute = Recompute::op;
  }
  if (has(source, "Megatron-Bridge") || source == "NVIDIA/NeMo")
    if (auto why = megatron_te_of(prec, notes, device, p); !why.empty()) return why;
  overlaps_of(notes, p);
  if (p.precision == Precision::fp8 && p.fp8_recipe == Fp8Recipe::rowwise)
    return "float8 rowwise: no measured rate of rowwise-scaled fp8 GEMMs in the catalog (torchao runs them "
           "in a kernel of their own, not cuBLAS's)";
  return "";
}

// Each part of a row fills its piece of the case and returns "" or why the row cannot be used.

// The model's shape; the Llama 3 and MPT architectures by the model name and the source.
std::string model_of_row(const CsvRow& row, const std::string& notes, RunCase& rc) {
  for (const char* k : {"layers", "hidden", "heads", "seq_len"})
    if (!whole(row, k)) return unusable(row, k);
  // BLOOM rows leave the cell empty but their notes state the ~250k vocabulary of the BLOOM
  // tokenizer, 250,680 (stated in the production-run row of the same source).
  bool bloom_vocab = !whole(row, "vocab") && has(notes, "250k vocab");
  if (!whole(row, "vocab") && !bloom_vocab) return unusable(row, "vocab");
  ModelSpec& m = rc.model;
  m.layers = *whole(row, "layers");
  m.hidden = *whole(row, "hidden");
  m.heads = *whole(row, "heads");
  m.seq_len = *whole(row, "seq_len");
  m.vocab = bloom_vocab ? 250680 : *whole(row, "vocab");
  m.ffn_hidden = whole(row, "ffn_hidden").value_or(4 * m.hidden);
  m.kv_heads = m.heads;
  if (has(rc.model_name, "llama")) {  // Llama 3 shapes: SwiGLU, RMSNorm, RoPE, 8 kv heads (notes: "GQA 8 KV heads")
    m.activation = Activation::swiglu;
    m.norm = Norm::rmsnorm;
    m.position = Position::rope;
    m.tie_embeddings = false;
    m.kv_heads = 8;
    m.bias = false;
  }
  if (has(rc.source, "mosaicml")) {  // MPT: ALiBi (no position table), no biases; GELU 4h
    m.position = Position::rope;
    m.bias = false;
  }
  return "";
}

// The catalog device and cluster the gpu_type cell names, with the row's own network figures.
std::string machine_of_row(const CsvRow& row, RunCase& rc) {
  const std::string gpu = cell(row, "gpu_type");
  std::string device;
  std::string cluster;
  if (has(gpu, "H200")) { device = "h200"; cluster = "eos"; }
  else if (has(gpu, "H100 96GB")) { device = "h100-96g"; cluster = "eos"; }
  else if (has(gpu, "H100")) { device = "h100-sxm"; cluster = "eos"; }
  else if (has(gpu, "A100-40GB")) { device = "a100-40g"; cluster = "selene"; }
  else if (has(gpu, "Jean Zay")) { device = "a100-80g"; cluster = "jean-zay-a100"; }
  else if (has(gpu, "A100") && (has(gpu, "80GB") || has(gpu, "Selene"))) {
    device = "a100-80g"; cluster = "selene";
  } else return fmt::format("gpu_type '{}' not in the catalog", gpu);
  if (has(gpu, "80GB per MS blog")) return "device memory unresolved (40 or 80 GB)";
  rc.machine = find_cluster(cluster);
  rc.machine.device = device;
  // The row's own network figure where it states one (per node).
  if (has(gpu, "1600 Gbps")) rc.machine.inter_node_bw_gbs = 200;
  if (has(gpu, "400 Gb/s RDMA per GPU") || has(gpu, "400Gb/s CX-7 per GPU"))
    rc.machine.inter_node_bw_gbs = 400;
  if (auto g = whole(row, "gpus_per_node")) rc.machine.gpus_per_node = *g;
  return "";
}

// The parallel layout: degrees, ZeRO stage, virtual stages and the stage partition.
std::string layout_of_row(const CsvRow& row, const std::string& notes, RunCase& rc) {
  Plan& p = rc.plan;
  if (!whole(row, "tp") || !whole(row, "pp")) return unusable(row, whole(row, "tp") ? "pp" : "tp");
  p.tp = *whole(row, "tp");
  p.pp = *whole(row, "pp");
  if (!cell(row, "cp").empty() && !whole(row, "cp")) return unusable(row, "cp");
  p.cp = whole(row, "cp").value_or(1);
  if (p.tp > (int64_t(1) << 20) || p.pp > (int64_t(1) << 20) || p.cp > (int64_t(1) << 20))
    return "tp, pp or cp above 2^20";
  p.dp = whole(row, "dp") ? *whole(row, "dp") : p.gpus / (p.tp * p.pp * p.cp);
  if (!whole(row, "micro_batch")) return unusable(row, "micro_batch");
  p.micro_batch = *whole(row, "micro_batch");
  std::string zero = cell(row, "zero_stage");
  if (zero.empty()) return "zero_stage not stated";
  if (has(zero, "SHARD_GRAD_OP")) p.zero = 2;
  else if (has(zero, "FSDP") || has(zero, "ZeRO-3")) p.zero = 3;
  else if (auto z = whole(zero, 0); z && *z <= 3) p.zero = *z;
  else return fmt::format("zero_stage '{}' not understood", zero);
  std::string vp = cell(row, "virtual_pipeline_stages");
  if (!vp.empty()) {
    if (!whole(vp, 1)) return fmt::format("virtual_pipeline_stages '{}' not a whole number >= 1", vp);
    p.vp = *whole(vp, 1);
  }
  else if (p.pp == 1) p.vp = 1;
  else if (has(notes, "interleaved")) return "interleaved schedule without vp";
  else p.vp = 1;
  const int64_t layers = rc.model.layers;
  // Two layer slots for the ends (the embedding's and the LM head's or loss's) over `stages` virtual
  // stages: every stage (layers + 2) / stages layers, the first and the last one fewer.
  auto end_slots = [layers](int64_t stages) {
    std::vector<int64_t> split(stages, (layers + 2) / stages);
    split.front() -= 1;
    split.back() -= 1;
    return split;
  };
  // Megatron-DeepSpeed's "type:transformer|embedding" partition counts each embedding as a layer
  // slot: the first and last stages get one transformer layer fewer (vp 1: one stage per rank).
  if (p.pp > 1 && p.vp == 1 && has(notes, "transformer|embedding") && (layers + 2) % p.pp == 0)
    p.layers_per_stage = end_slots(p.pp);
  // Megatron-Core's account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split:
  // the embedding and the loss each take a layer slot, in the first and the last virtual stage
  // (stage s = chunk * pp + rank): those get one transformer layer fewer.
  const bool embedding_slot = has(notes, "account_for_embedding_in_pipeline_split");
  if (p.pp > 1 && embedding_slot != has(notes, "account_for_loss_in_pipeline_split"))
    return "only one of account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split: its "
           "stages are not modelled (both, or neither)";
  if (p.pp > 1 && embedding_slot) {
    if ((layers + 2) % (p.pp * p.vp) != 0)
      return fmt::format("account_for_embedding/loss_in_pipeline_split: {} layers + 2 slots do not divide into pp * vp "
                         "= {} virtual stages", layers, p.pp * p.vp);
    p.layers_per_stage = end_slots(p.pp * p.vp);
  }
  // Partition not stated and the layers don't divide: assume Megatron-style balanced uneven
  // stages (floor(layers/pp) each, the remainder on the middle ranks; plan.hpp) and say so.
  if (p.pp > 1 && p.vp == 1 && p.layers_per_stage.empty() && layers % p.pp != 0) {
    p.layers_per_stage = balanced_layers(layers, p.pp);
    rc.assumption = fmt::format("stages not stated; assumed balanced [{}]",
                                fmt::join(p.layers_per_stage, ","));
  }
  return "";
}

// Sequence parallelism, recomputation, precision and the framework's behaviours; then the plan
// is checked once, as the job file's would be.
std::string training_of_row(const CsvRow& row, const std::string& notes, RunCase& rc) {
  Plan& p = rc.plan;
  std::string sp = cell(row, "seq_parallel");
  if (sp == "yes") p.seq_parallel = true;
  else if (sp == "no" || p.tp == 1) p.seq_parallel = false;
  // torchtitan's tensor-parallel plan always shards norms along the sequence (framework default).
  else if (has(rc.source, "torchtitan")) p.seq_parallel = true;
  else return "seq_parallel not stated with tp > 1";
  std::string rec = cell(row, "recompute");
  if (rec.rfind("none", 0) == 0) p.recompute = Recompute::none;
  else if (rec.rfind("full", 0) == 0) p.recompute = Recompute::full;
  else if (rec.rfind("selective", 0) == 0) p.recompute = Recompute::selective;
  else return "recompute not stated";
  std::string prec = cell(row, "precision");
  if (prec.empty()) return "precision not stated";
  if (has(prec, "fp8") || has(prec, "float8")) p.precision = Precision::fp8;
  else if (has(prec, "bf16")) p.precision = Precision::bf16;
  else if (has(prec, "16")) p.precision = Precision::fp16;
  else return fmt::format("precision '{}' not understood", prec);
  if (auto why = framework_of(rc.source, cell(row, "source"), prec, notes, rc.machine.device, p); !why.empty())
    return why;
  std::string err = plan_error(rc.model, p);
  if (!err.empty()) return "plan as stated is invalid: " + err;
  return "";
}

// The memory validation points the notes state: an out-of-memory run or a peak in GiB.
void memory_of_row(const std::string& notes, RunCase& rc) {
  if (has(notes, "OUT OF MEMORY")) rc.measured_oom = true;
  for (const char* key : {"peak memory ", "memory ", "embedding-stage nodes) = "}) {
    auto pos = notes.find(key);
    if (pos == std::string::npos) continue;
    try {
      const double gib = std::stod(notes.substr(pos + std::string(key).size()));
      if (std::isfinite(gib) && gib > 0) rc.measured_memory_gib = gib;
    } catch (...) {
    }
    if (rc.measured_memory_gib) break;
  }
}

// The measured step time: stated, or from TFLOP/s by the row's stated counting convention, or
// from MFU; a row with only a memory point is kept for the memory figures.
std::string step_of_row(const CsvRow& row, const std::string& notes, RunCase& rc) {
  const ModelSpec& m = rc.model;
  const Plan& p = rc.plan;
  if (auto st = number(row, "step_time_s")) {
    rc.measured_step_s = *st;
    rc.measured_basis = "step_time_s";
  } else if (auto tf = number(row, "measured_tflops_per_gpu")) {
    double flops = 0;
    if (has(notes, "INCLUDING the activation-recompute") || has(notes, "hardware TFLOPs") ||
        has(notes, "same FLOP convention as Table 1")) {
      flops = hardware_flops_per_step(m, p.global_batch, Recompute::full);
      rc.measured_basis = "hardware TFLOP/s (96 B s l h^2 formula)";
    } else if (has(notes, "model FLOPs") || has(notes, "MFU = TF/")) {
      flops = model_flops_per_step(m, p.global_batch);
      rc.measured_basis = "model TFLOP/s";
    } else return "TFLOP/s counting convention not stated";
    rc.measured_step_s = flops / (*tf * 1e12 * double(p.gpus));
  } else if (auto mfu = number(row, "measured_mfu_pct")) {
    const Device& d = find_device(rc.machine.device);
    rc.measured_step_s = model_flops_per_step(m, p.global_batch) /
                         (*mfu / 100 * d.peak_tflops(p.precision) * 1e12 * double(p.gpus));
    rc.measured_basis = "MFU";
  } else if (rc.measured_oom || rc.measured_memory_gib) {
    rc.memory_only = true;
  } else return "no measurement (step time, TFLOP/s or MFU)";
  return "";
}

}  // namespace

RunCase case_from_row(const CsvRow& row, int index) {
  RunCase rc;
  rc.row = index;
  rc.source = source_key(cell(row, "source"));
  rc.model_name = cell(row, "model_name");
  const std::string notes = cell(row, "notes");
  auto skip = [&](std::string why) { rc.skip_reason = std::move(why); return rc; };
  if (auto why = model_of_row(row, notes, rc); !why.empty()) return skip(why);
  auto gpus = whole(row, "gpus");
  if (!gpus) return skip(unusable(row, "gpus"));
  auto gbs = whole(row, "global_batch_seqs");
  if (!gbs) return skip(unusable(row, "global_batch_seqs"));
  if (auto why = machine_of_row(row, rc); !why.empty()) return skip(why);
  rc.plan.gpus = *gpus;
  rc.plan.global_batch = *gbs;
  if (auto why = layout_of_row(row, notes, rc); !why.empty()) return skip(why);
  if (auto why = training_of_row(row, notes, rc); !why.empty()) return skip(why);
  memory_of_row(notes, rc);
  if (auto why = step_of_row(row, notes, rc); !why.empty()) return skip(why);
  return rc;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  std::vector<double> ra = ranks(a), rb = ranks(b);
  double n = double(a.size());
  double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (va == 0 || vb == 0) return 0;
  return cov / std::sqrt(va * vb);
}

std::vector<std::string> validation_fit_constants(const std::vector<RunCase>& cases) {
  std::vector<std::string> out;
  for (const RunCase& rc : cases) {
    if (!rc.skip_reason.empty() || rc.memory_only) continue;
    const std::string name = find_device(rc.machine.device).family + ".sustained";
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  for (const char* g : kFittedGlobals) out.push_back(g);
  return out;
}

namespace {

MeasuredRun measured_run(const RunCase& rc) {
  return {rc.source, fmt::format("row {}", rc.row), rc.model, rc.machine, rc.plan, rc.measured_step_s};
}

std::string constants_text(const Calibration& cal, const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += fmt::format("{}{}={:.4g}", s.empty() ? "" : " ", n, cal.get(n));
  return s;
}

// Leave-one-source-out: for each source, the constants refitted on the other sources (from the
// shipped values) predict its rows. A family whose rows all come from the held-out source keeps
// its shipped value (nothing else can determine it) and the fold says so.
void hold_out_each_source(ValidationReport& rep, const std::vector<RunCase>& cases, const Calibration& cal) {
  rep.fitted = validation_fit_constants(cases);
  std::vector<MeasuredRun> all;
  for (const CaseResult& r : rep.results) all.push_back(measured_run(r.run));
  const FitResult everything = fit_constants(all, cal, rep.fitted);
  rep.all_data_fit = everything.cal;
  rep.all_data_fit_pct = everything.objective_pct;
  if (!everything.converged) rep.unconverged.push_back("all sources");
  for (SourceStats& st : rep.sources) {
    std::vector<MeasuredRun> rest;
    std::vector<size_t> held;
    for (size_t i = 0; i < rep.results.size(); ++i) {
      if (rep.results[i].run.source == st.source) held.push_back(i);
      else rest.push_back(all[i]);
    }
    std::vector<std::string> fit;  // only constants the rest of the rows can see
    for (const std::string& c : rep.fitted) {
      const bool device_constant = c.ends_with(".sustained");
      const std::string family = c.substr(0, c.rfind('.'));
      if (!device_constant || std::any_of(rest.begin(), rest.end(), [&](const MeasuredRun& r) {
            return find_device(r.machine.device).family == family;
          }))
        fit.push_back(c);
    }
    Calibration fold = cal;
    if (!rest.empty()) {
      const FitResult f = fit_constants(rest, cal, fit);
      fold = f.cal;
      if (!f.converged) rep.unconverged.push_back(st.source);
    }
    st.held_out_constants = constants_text(fold, fit);
    if (fit.size() < rep.fitted.size()) st.held_out_constants += " (others as shipped: no other source has them)";
    std::vector<MeasuredRun> mine;
    for (size_t i : held) mine.push_back(all[i]);
    const std::vector<double> pred = predict_runs(mine, fold);
    for (size_t j = 0; j < held.size(); ++j) {
      CaseResult& r = rep.results[held[j]];
      r.held_out_step_s = pred[j];
      r.held_out_error = (pred[j] - r.run.measured_step_s) / r.run.measured_step_s;
    }
  }
}

void summarise(ValidationReport& rep, bool held_out) {
  std::map<std::string, SourceStats> by_source;
  double sum = 0, sum_held = 0;
  for (const CaseResult& r : rep.results) {
    SourceStats& s = by_source[r.run.source];
    s.source = r.run.source;
    ++s.rows;
    s.mape_pct += 100 * std::fabs(r.error), s.bias_pct += 100 * r.error;
    s.held_out_mape_pct += 100 * std::fabs(r.held_out_error), s.held_out_bias_pct += 100 * r.held_out_error;
    sum += std::fabs(r.error), sum_held += std::fabs(r.held_out_error);
  }
  const double n = double(std::max<size_t>(1, rep.results.size()));
  rep.mape_pct = 100 * sum / n;
  rep.held_out_mape_pct = held_out ? 100 * sum_held / n : 0;
  rep.worst_held_out_pct = 0;
  for (auto& [name, s] : by_source) {
    for (double* v : {&s.mape_pct, &s.bias_pct, &s.held_out_mape_pct, &s.held_out_bias_pct}) *v /= s.rows;
    // Keep the fold's constants when the stats are recomputed.
    for (const SourceStats& old : rep.sources)
      if (old.source == name) s.held_out_constants = old.held_out_constants;
    rep.worst_held_out_pct = std::max(rep.worst_held_out_pct, s.held_out_mape_pct);
  }
  rep.sources.clear();
  for (auto& [name, s] : by_source) rep.sources.push_back(s);
  // Ranking: within runs of one model (layers x hidden) on one GPU count and device (any
  // sequence length, batch or plan), order by throughput (tokens/s), measured vs predicted.
  std::map<std::string, std::vector<const CaseResult*>> groups;
  for (const CaseResult& r : rep.results) {
    const auto& m = r.run.model;
    groups[fmt::format("{} {}x{} on {} {}", r.run.source, m.layers, m.hidden, r.run.plan.gpus, r.run.machine.device)]
        .push_back(&r);
  }
  rep.groups.clear();
  double rho_sum = 0, held_sum = 0;
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    std::vector<double> meas, pred, held;
    for (const CaseResult* r : members) {
      const double tokens = double(r->run.plan.global_batch) * r->run.model.seq_len;
      meas.push_back(tokens / r->run.measured_step_s);
      pred.push_back(tokens / r->predicted_step_s);
      held.push_back(held_out ? tokens / r->held_out_step_s : 0);
    }
    GroupRank g{key, int(members.size()), spearman(meas, pred), held_out ? spearman(meas, held) : 0};
    rho_sum += g.rho, held_sum += g.held_out_rho;
    rep.groups.push_back(g);
  }
  const double ng = double(std::max<size_t>(1, rep.groups.size()));
  rep.mean_rho = rho_sum / ng;
  rep.held_out_rho = held_sum / ng;
}

MemoryStats memory_stats(const std::vector<MemoryResult>& rows, bool held_out) {
  MemoryStats st;
  double sum = 0;
  for (const MemoryResult& mr : rows) {
    const double gib = held_out ? mr.held_out_gib : mr.predicted_gib;
    const bool fits = held_out ? mr.held_out_fits : mr.predicted_fits;
    if (mr.run.measured_oom) {
      ++st.oom_rows;
      if (!fits) ++st.oom_predicted;
    } else if (mr.run.measured_memory_gib) {
      const double err = std::fabs(gib / *mr.run.measured_memory_gib - 1);
      sum += 100 * err;
      ++st.points;
      if (err <= 0.15) ++st.within_15;
      ++st.fit_rows;
      if (fits) ++st.fit_predicted;
    } else {  // a measured step and no memory figure: it ran
      ++st.ran_rows;
      if (fits) ++st.ran_predicted;
    }
  }
  st.mape_pct = st.points ? sum / st.points : 0;
  return st;
}

// The peak a monitor would report for a row with the given fragmentation (GiB): Memory::peak, from
// the row's counted memory (plan/memory.hpp with_allocator_share), no new memory model run.
double peak_with(const MemoryResult& mr, double fragmentation) { return with_allocator_share(mr.counted_gib, fragmentation); }

// Whether the row's run fits with this fragmentation_at_capacity (Memory::total), and whether that is
// the right call: a run that failed out of memory must not fit, any other (a measured peak or step: it
// ran) must.
bool fits_with(const MemoryResult& mr, double at_capacity) {
  return with_allocator_share(mr.counted_gib, at_capacity) <= mr.device_gib;
}
bool call_right(const MemoryResult& mr, double at_capacity) { return fits_with(mr, at_capacity) != mr.run.measured_oom; }

// The fragmentation_at_capacity that makes the most fit / does-not-fit calls right (a scan of
// (0, 0.6] in steps of 0.005). The calls change only where a row crosses its capacity, so the best
// values form intervals: the middle of the widest one (the first of equals). Not tuned to a goal:
// runs that ran bound it from above, out-of-memory runs from below.
double fit_fragmentation_at_capacity(const std::vector<const MemoryResult*>& rows, double fallback) {
  if (rows.empty()) return fallback;
  std::vector<int> right(121, 0);  // right[i]: calls right at f = 0.005 i
  for (int i = 1; i <= 120; ++i)
    for (const MemoryResult* mr : rows) right[i] += call_right(*mr, 0.005 * i);
  const int best = *std::max_element(right.begin() + 1, right.end());
  int best_start = 1, best_len = 0;
  for (int i = 1; i <= 120;) {
    int j = i;
    while (j <= 120 && right[j] == best) ++j;
    if (j - i > best_len) best_start = i, best_len = j - i;
    i = std::max(j, i + 1);
  }
  return 0.005 * (best_start + 0.5 * (best_len - 1));
}

// The fragmentation that minimises the MAPE over measured peaks (a scan of [0, 0.6] in steps of
// 0.005: one constant, and the memory model is cheap).
double fit_fragmentation(const std::vector<const MemoryResult*>& rows, double fallback) {
  double best = fallback, best_mape = 1e300;
  for (int i = 1; i <= 120; ++i) {
    const double f = 0.005 * i;
    double sum = 0;
    int n = 0;
    for (const MemoryResult* mr : rows)
      if (mr->run.measured_memory_gib) sum += std::fabs(peak_with(*mr, f) / *mr->run.measured_memory_gib - 1), ++n;
    if (n && sum < best_mape) best_mape = sum, best = f;
  }
  return best;
}

// Leave-one-source-out for memory: each source's rows with the fragmentation fitted on the other
// sources' measured peaks (the shipped value when no other source has one), and their fit calls with
// the fragmentation_at_capacity fitted on the other sources' calls.
void hold_out_memory(ValidationReport& rep, const Calibration& cal) {
  std::set<std::string> sources;
  for (const MemoryResult& mr : rep.memory) sources.insert(mr.run.source);
  for (const std::string& s : sources) {
    std::vector<const MemoryResult*> rest;
    for (const MemoryResult& mr : rep.memory)
      if (mr.run.source != s) rest.push_back(&mr);
    const bool any = std::any_of(rest.begin(), rest.end(), [](const MemoryResult* m) { return bool(m->run.measured_memory_gib); });
    const double f = any ? fit_fragmentation(rest, cal.fragmentation) : cal.fragmentation;
    const double fc = fit_fragmentation_at_capacity(rest, cal.fragmentation_at_capacity);
    rep.memory_folds.push_back(fmt::format("{}: fragmentation={:.3f}{} fragmentation_at_capacity={:.3f}", s, f,
                                           any ? "" : " (as shipped: no other source)", fc));
    for (MemoryResult& mr : rep.memory)
      if (mr.run.source == s) {
        mr.held_out_gib = peak_with(mr, f);
        mr.held_out_needed_gib = with_allocator_share(mr.counted_gib, fc);
        mr.held_out_fits = fits_with(mr, fc);
      }
  }
  std::vector<const MemoryResult*> all;
  for (const MemoryResult& mr : rep.memory) all.push_back(&mr);
  rep.all_data_fit.fragmentation = fit_fragmentation(all, cal.fragmentation);
  rep.all_data_fit.fragmentation_at_capacity = fit_fragmentation_at_capacity(all, cal.fragmentation_at_capacity);
  rep.memory_folds.push_back(fmt::format("(all sources): fragmentation={:.3f} fragmentation_at_capacity={:.3f} "
                                         "(shipped {:.3f}, {:.3f})", rep.all_data_fit.fragmentation,
                                         rep.all_data_fit.fragmentation_at_capacity, cal.fragmentation,
                                         cal.fragmentation_at_capacity));
  rep.memory_held_out = memory_stats(rep.memory, true);
}

}  // namespace

ValidationReport validate_runs(const std::string& csv_path, const Calibration& cal, const ValidateOptions& options) {
  ValidationReport rep;
  std::vector<CsvRow> rows = read_csv(csv_path);
  std::vector<RunCase> cases;
  for (size_t i = 0; i < rows.size(); ++i) cases.push_back(case_from_row(rows[i], int(i) + 1));
  for (const RunCase& rc : cases) {
    if (!rc.skip_reason.empty()) { rep.skipped.push_back(rc); continue; }
    const Prediction pr = predict(rc.model, rc.machine, rc.plan, cal);
    MemoryResult mr;
    mr.run = rc;
    mr.predicted_gib = mr.held_out_gib = pr.memory.peak / double(1 << 30);
    mr.predicted_fits = mr.held_out_fits = pr.fits;
    mr.needed_gib = mr.held_out_needed_gib = pr.memory.total / double(1 << 30);
    // Memory::total = with_allocator_share(counted, fragmentation_at_capacity) (plan/memory.hpp).
    mr.counted_gib = mr.needed_gib / (1 + cal.fragmentation_at_capacity);
    mr.device_gib = pr.device_memory_bytes / double(1 << 30);
    rep.memory.push_back(mr);
    if (rc.memory_only) continue;
    CaseResult res;
    res.run = rc;
    res.predicted_step_s = pr.step_time_s;
    res.error = (res.predicted_step_s - rc.measured_step_s) / rc.measured_step_s;
    rep.results.push_back(res);
  }
  rep.memory_stats = memory_stats(rep.memory, false);
  summarise(rep, false);
  if (options.held_out && !rep.results.empty()) {
    hold_out_each_source(rep, cases, cal);
    summarise(rep, true);
  }
  if (options.held_out && !rep.memory.empty()) hold_out_memory(rep, cal);
  return rep;
}

// The plan column of --rows' tables: plan_summary padded to the longest plan of the report, so that
// no plan loses its tail (sp, the schedule, the stages) and the columns after it line up from row to row.
namespace {
size_t plan_column_width(const ValidationReport& rep) {
  size_t width = 4;  // "plan"
  for (const CaseResult& r : rep.results) width = std::max(width, plan_summary(r.run.plan).size());
  for (const MemoryResult& mr : rep.memory) width = std::max(width, plan_summary(mr.run.plan).size());
  return width;
}
}  // namespace

std::string format_rows(const ValidationReport& rep) {
  std::string s;
  const bool held = !rep.fitted.empty();  // leave-one-source-out ran: a held-out column to show
  const size_t width = plan_column_width(rep);
  auto plan_column = [width](const Plan& p) { return fmt::format("{:<{}}", plan_summary(p), width); };
  s += fmt::format("{:>4} {:<30} {:<28} {:<{}} {:>10} {:>10} {:>7} {:>8}\n", "row", "source", "model", "plan", width,
                   "measured", "predicted", "err%", "held-out%");
  for (const CaseResult& r : rep.results)
    s += fmt::format("{:>4} {:<30.30} {:<28.28} {} {:>10.4g} {:>10.4g} {:>+7.1f} {:>8}\n", r.run.row, r.run.source,
                     r.run.model_name, plan_column(r.run.plan), r.run.measured_step_s, r.predicted_step_s,
                     100 * r.error, held ? fmt::format("{:+.1f}", 100 * r.held_out_error) : "-");
  for (const CaseResult& r : rep.results)
    if (!r.run.assumption.empty()) s += fmt::format("{:>4} assumption: {}\n", r.run.row, r.run.assumption);
  s += "skipped rows:\n";
  for (const RunCase& rc : rep.skipped)
    s += fmt::format("{:>4} {:<30.30} {:<28.28} {}\n", rc.row, rc.source, rc.model_name, rc.skip_reason);
  s += "memory per GPU (most loaded rank), GiB: the peak a monitor reports, what the run needs (fits compares it):\n";
  for (const MemoryResult& mr : rep.memory) {
    if (!mr.run.measured_oom && !mr.run.measured_memory_gib) {  // ran: listed where a call is wrong
      if (!mr.predicted_fits || !mr.held_out_fits)
        s += fmt::format("{:>4} {:<28.28} {} ran       peak {:>6.1f} needs {:>6.1f}, held out {:.1f} (does not fit{})\n",
                         mr.run.row, mr.run.model_name, plan_column(mr.run.plan), mr.predicted_gib, mr.needed_gib,
                         mr.held_out_needed_gib, mr.predicted_fits ? " held out" : mr.held_out_fits ? " in-sample" : "");
      continue;
    }
    s += fmt::format("{:>4} {:<28.28} {} measured {:>6} peak {:>6.1f} needs {:>6.1f}{}\n", mr.run.row,
                     mr.run.model_name, plan_column(mr.run.plan),
                     mr.run.measured_oom ? std::string("OOM") : fmt::format("{:.1f}", *mr.run.measured_memory_gib),
                     mr.predicted_gib, mr.needed_gib, mr.predicted_fits ? "" : " (does not fit)");
  }
  s += fmt::format("ranking within groups (Spearman rho of tokens/s, groups of >= 2 runs; in-sample{}):\n",
                   held ? ", held out" : "");
  for (const GroupRank& g : rep.groups)
    s += fmt::format("  {:<64} n={:<3} rho={:+.2f}{}\n", g.group, g.rows, g.rho,
                     held ? fmt::format(" {:+.2f}", g.held_out_rho) : "");
  return s;
}

std::string format_report(const ValidationReport& rep, bool per_row) {
  std::string s = per_row ? format_rows(rep) : "";
  const bool held = !rep.fitted.empty();
  s += fmt::format("step time, {} rows{}:\n", rep.results.size(),
                   held ? "; held out = predicted with the constants fitted on the OTHER sources" : "");
  s += fmt::format("  {:<32} {:>5} {:>11} {:>8} {:>13} {:>8}\n", "source", "rows", "in-sample%", "bias%",
                   "held-out%", "bias%");
  for (const SourceStats& st : rep.sources)
    s += fmt::format("  {:<32} {:>5} {:>11.1f} {:>+8.1f} {:>13} {:>8}\n", st.source, st.rows, st.mape_pct,
                     st.bias_pct, held ? fmt::format("{:.1f}", st.held_out_mape_pct) : "-",
                     held ? fmt::format("{:+.1f}", st.held_out_bias_pct) : "-");
  s += fmt::format("  {:<32} {:>5} {:>11.1f} {:>8} {:>13} {:>8}\n", "all rows", rep.results.size(), rep.mape_pct, "",
                   held ? fmt::format("{:.1f}", rep.held_out_mape_pct) : "-", "");
  if (held) {
    s += "  constants refitted for each held-out source (fitted on the others):\n";
    for (const SourceStats& st : rep.sources) s += fmt::format("    {:<30} {}\n", st.source, st.held_out_constants);
    s += fmt::format("    {:<30} {} (objective {:.2f}%; the shipped values: {})\n", "(all sources)",
                     constants_text(rep.all_data_fit, rep.fitted), rep.all_data_fit_pct,
                     constants_text(default_calibration(), rep.fitted));
    if (!rep.unconverged.empty())
      s += fmt::format("  warning: these fits stopped at their sweep cap while still improving (the best constants "
                       "found, not a converged optimum): {}\n", fmt::join(rep.unconverged, ", "));
  }
  s += fmt::format("ranking: mean Spearman rho of tokens/s within {} groups (one model on one GPU count): in-sample "
                   "{:.2f}{}\n", rep.groups.size(), rep.mean_rho,
                   held ? fmt::format(", held out {:.2f}", rep.held_out_rho) : "");
  auto memory_line = [&](const char* what, const MemoryStats& m) {
    s += fmt::format("  {:<10} MAPE {:.1f}% over {} measured peaks ({} within 15%); out-of-memory runs called: {} of {}; "
                     "runs that ran called fitting: {} of {} with a measured peak, {} of {} with a step time only; "
                     "calls right: {} of {} ({:.1f}%)\n",
                     what, m.mape_pct, m.points, m.within_15, m.oom_predicted, m.oom_rows, m.fit_predicted, m.fit_rows,
                     m.ran_predicted, m.ran_rows, m.calls_right(), m.calls(), 100.0 * m.calls_right() / std::max(1, m.calls()));
  };
  s += "memory per GPU (most loaded rank):\n";
  memory_line("in-sample", rep.memory_stats);
  if (!rep.memory_folds.empty()) {
    memory_line("held out", rep.memory_held_out);
    for (const auto& f : rep.memory_folds) s += fmt::format("    {}\n", f);
  }
  s += fmt::format("{} rows skipped (missing cells; --rows lists them)\n", rep.skipped.size());
  s += fmt::format("held_out_mape_pct={} worst_source_pct={} in_sample_mape_pct={:.2f} rows={}\n",
                   held ? fmt::format("{:.2f}", rep.held_out_mape_pct) : "-",
                   held ? fmt::format("{:.2f}", rep.worst_held_out_pct) : "-", rep.mape_pct, rep.results.size());
  return s;
}

std::string format_never_fitted(const ValidationReport& rep, const std::string& path) {
  std::string s = fmt::format("never fitted: {} ({} rows; {} skipped), runs from sources no constant was fitted to, "
                              "predicted with the in-sample column's constants:\n",
                              path, rep.results.size(), rep.skipped.size());
  s += fmt::format("  {:<32} {:>5} {:>8} {:>8}\n", "source", "rows", "MAPE%", "bias%");
  double worst = 0;
  for (const SourceStats& st : rep.sources) {
    s += fmt::format("  {:<32} {:>5} {:>8.1f} {:>+8.1f}\n", st.source, st.rows, st.mape_pct, st.bias_pct);
    worst = std::max(worst, st.mape_pct);
  }
  s += fmt::format("  {:<32} {:>5} {:>8.1f}\n", "all rows", rep.results.size(), rep.mape_pct);
  const MemoryStats& m = rep.memory_stats;
  s += fmt::format("  ranking: mean Spearman rho within {} groups {:.2f}; memory: runs that ran called fitting {} of "
                   "{}, out-of-memory runs called {} of {}\n",
                   rep.groups.size(), rep.mean_rho, m.fit_predicted + m.ran_predicted, m.fit_rows + m.ran_rows,
                   m.oom_predicted, m.oom_rows);
  s += fmt::format("never_fitted_mape_pct={:.2f} never_fitted_worst_source_pct={:.2f} rows={}\n", rep.mape_pct, worst,
                   rep.results.size());
  return s;
}

nlohmann::json report_json(const ValidationReport& rep, const Calibration& cal) {
  using nlohmann::json;
  json rows = json::array();
  for (const CaseResult& r : rep.results) {
    const Prediction pr = predict(r.run.model, r.run.machine, r.run.plan, cal);
    json j = to_json(pr);
    j["row"] = r.run.row;
    j["source"] = r.run.source;
    j["model_name"] = r.run.model_name;
    j["measured_step_s"] = r.run.measured_step_s;
    j["measured_basis"] = r.run.measured_basis;
    j["held_out_step_s"] = r.held_out_step_s;
    j["error"] = r.error;
    j["held_out_error"] = r.held_out_error;
    if (!r.run.assumption.empty()) j["assumption"] = r.run.assumption;
    rows.push_back(j);
  }
  json skipped = json::array();
  for (const RunCase& rc : rep.skipped) skipped.push_back({{"row", rc.row}, {"source", rc.source}, {"reason", rc.skip_reason}});
  json sources = json::array();
  for (const SourceStats& s : rep.sources)
    sources.push_back({{"source", s.source}, {"rows", s.rows}, {"mape_pct", s.mape_pct}, {"bias_pct", s.bias_pct},
                       {"held_out_mape_pct", s.held_out_mape_pct}, {"held_out_bias_pct", s.held_out_bias_pct},
                       {"held_out_constants", s.held_out_constants}});
  json memory = json::array();
  for (const MemoryResult& m : rep.memory) {
    // The rows with a memory figure, and the runs that ran but are called too big (in-sample or held out).
    const bool figure = m.run.measured_oom || m.run.measured_memory_gib.has_value();
    if (!figure && m.predicted_fits && m.held_out_fits) continue;
    const json measured = m.run.measured_memory_gib ? json(*m.run.measured_memory_gib) : json(nullptr);
    memory.push_back({{"row", m.run.row}, {"measured_gib", measured}, {"measured_oom", m.run.measured_oom},
                      {"predicted_gib", m.predicted_gib}, {"needed_gib", m.needed_gib},
                      {"predicted_fits", m.predicted_fits}, {"held_out_gib", m.held_out_gib},
                      {"held_out_needed_gib", m.held_out_needed_gib}, {"held_out_fits", m.held_out_fits}});
  }
  return {{"rows", rows}, {"skipped", skipped}, {"sources", sources}, {"memory", memory},
          {"mape_pct", rep.mape_pct}, {"held_out_mape_pct", rep.held_out_mape_pct},
          {"worst_held_out_pct", rep.worst_held_out_pct}, {"mean_rho", rep.mean_rho},
          {"held_out_rho", rep.held_out_rho}, {"memory_mape_pct", rep.memory_stats.mape_pct},
          {"memory_within_15", rep.memory_stats.within_15}, {"memory_points", rep.memory_stats.points},
          {"oom_rows", rep.memory_stats.oom_rows}, {"oom_predicted", rep.memory_stats.oom_predicted},
          {"memory_held_out_mape_pct", rep.memory_held_out.mape_pct},
          {"memory_held_out_within_15", rep.memory_held_out.within_15},
          {"oom_held_out_predicted", rep.memory_held_out.oom_predicted},
          {"fit_rows", rep.memory_stats.fit_rows}, {"fit_predicted", rep.memory_stats.fit_predicted},
          {"ran_rows", rep.memory_stats.ran_rows}, {"ran_predicted", rep.memory_stats.ran_predicted},
          {"memory_calls", rep.memory_stats.calls()}, {"memory_calls_right", rep.memory_stats.calls_right()},
          {"memory_held_out_calls_right", rep.memory_held_out.calls_right()}, {"unconverged_fits", rep.unconverged}};
}

}  // namespace exatrain::plan
