#include "plan/plan.hpp"

#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/check.hpp"
#include "plan/flops.hpp"
#include "plan/stages.hpp"

namespace exatrain::plan {

int64_t element_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }
int64_t Plan::pipeline_element_bytes() const { return pipeline_fp32 ? 4 : element_bytes(precision); }
int64_t Plan::tp_element_bytes() const { return tp_comm_fp32 ? 4 : element_bytes(precision); }

Plan resolve_plan(const ParallelSpec& par, Precision precision) {
  auto need = [](const auto& opt, const char* key) {
    EXA_CHECK(opt.has_value(),
              "[parallel] {} is auto: `predict` needs every field resolved (run `exatrain plan` "
              "to fill it, or set {} = <value>)", key, key);
    return *opt;
  };
  Plan p;
  p.gpus = par.gpus;
  p.global_batch = par.global_batch;
  p.tp = need(par.tp, "tp");
  p.pp = need(par.pp, "pp");
  p.cp = par.cp.value_or(1);
  p.vp = par.vp.value_or(1);
  // dp defaults to gpus / (tp * pp * cp), as the contract states.
  if (!par.dp) {
    int64_t model_ranks = std::max<int64_t>(1, p.tp * p.pp * p.cp);
    EXA_CHECK(par.gpus % model_ranks == 0,
              "[parallel] dp defaults to gpus / (tp * pp * cp) = {} / ({} * {} * {}), which is not "
              "an integer: choose tp * pp * cp dividing gpus", par.gpus, p.tp, p.pp, p.cp);
  }
  p.dp = par.dp ? *par.dp : par.gpus / std::max<int64_t>(1, p.tp * p.pp * p.cp);
  p.zero = need(par.zero, "zero");
  p.micro_batch = need(par.micro_batch, "micro_batch");
  p.recompute = need(par.recompute, "recompute");
  // Sequence parallelism splits the tensor-parallel region's sequence: without tp it has nothing
  // to split (Megatron sets it false at tp = 1; plan_notes says so).
  p.seq_parallel = par.seq_parallel.value_or(false) && p.tp > 1;
  p.schedule = par.schedule.value_or(Schedule::one_f_one_b);
  p.precision = precision;
  p.set_framework(par);
  return p;
}

Plan resolve_plan(const Job& job) {
  Plan p = resolve_plan(job.parallel, job.train.precision);
  p.set_optimizer(job.train);
  p.set_kernels(job.train);
  return p;
}

Plan as_run_here(Plan p) {
  p.overlap_grad_reduce = p.zero == 0 || p.zero == 2;
  p.overlap_param_gather = false;
  p.zero3_prefetch = false;
  p.tp_comm_overlap = TpCommOverlap::none;
  p.overlap_p2p_comm = false;
  p.pp_scatter_gather = false;
  p.recompute_early_stop = false;
  return p;
}

std::vector<std::string> plan_notes(const Job& job, const Plan& p) {
  std::vector<std::string> notes;
  auto set = [&](const char* key) { return job.origins.count(key) > 0; };
  const ParallelSpec& par = job.parallel;
  if (set("parallel.seq_parallel") && par.seq_parallel.value_or(false) && p.tp == 1)
    notes.push_back("seq_parallel = true has no effect at tp = 1 (sequence parallelism splits the tensor-parallel "
                    "region; Megatron and NeMo turn it off there too): planned without it");
  if (set("parallel.tp_comm_overlap") && par.tp_comm_overlap != TpCommOverlap::none && p.tp == 1)
    notes.push_back(fmt::format("tp_comm_overlap = {} has no effect at tp = 1 (no tensor-parallel communication; "
                                "NeMo turns it off there too)", to_string(par.tp_comm_overlap)));
  if (set("parallel.zero") && p.zero > 0 && p.dp * p.cp == 1)
    notes.push_back(fmt::format("zero = {} has no effect with dp * cp = 1 (nothing to shard over; Megatron's "
                                "distributed optimizer at dp = 1 is the plain one)", p.zero));
  if (set("parallel.overlap_param_gather") && par.overlap_param_gather && p.zero == 3)
    notes.push_back("overlap_param_gather = true has no effect under ZeRO 3 (it gathers each layer's parameters "
                    "before its use and prefetches the next layer's anyway)");
  if (set("parallel.overlap_param_gather") && par.overlap_param_gather && p.zero > 0 && p.dp * p.cp == 1)
    notes.push_back("overlap_param_gather = true has no effect with dp * cp = 1 (no parameter all-gather)");
  if (set("parallel.overlap_p2p_comm") && par.overlap_p2p_comm && p.vp == 1)
    notes.push_back("overlap_p2p_comm = true has no effect without the interleaved schedule (vp = 1): Megatron "
                    "overlaps the pipeline's sends and receives in the interleaved schedule only");
  if (set("parallel.recompute_early_stop") && par.recompute_early_stop && p.recompute != Recompute::full)
    notes.push_back(fmt::format("recompute_early_stop = true has no effect at recompute = \"{}\" (it skips the "
                                "last linear of a fully recomputed layer)", to_string(p.recompute)));
  if (set("parallel.overlap_grad_reduce") && par.overlap_grad_reduce && p.dp * p.cp == 1)
    notes.push_back("overlap_grad_reduce = true has no effect with dp * cp = 1 (no gradient reduction)");
  if (set("train.fp8_recipe") && p.precision != Precision::fp8)
    notes.push_back(fmt::format("fp8_recipe = \"{}\" has no effect at precision = \"{}\" (only fp8 runs scale "
                                "their GEMM inputs)", to_string(p.fp8_recipe), to_string(p.precision)));
  const bool no_gather = p.zero == 0 || p.dp * p.cp == 1;
  if (set("train.fp8_param_gather") && job.train.fp8_param_gather && (p.precision != Precision::fp8 || no_gather))
    notes.push_back(p.precision != Precision::fp8
                        ? fmt::format("fp8_param_gather = true has no effect at precision = \"{}\" (no fp8 weights)",
                                      to_string(p.precision))
                        : fmt::format("fp8_param_gather = true has no effect {} (no parameter all-gather)",
                                      p.zero == 0 ? "at zero = 0" : "with dp * cp = 1"));
  if (set("parallel.schedule") && p.schedule == Schedule::gpipe && p.pp == 1)
    notes.push_back("schedule = \"gpipe\" has no effect at pp = 1 (no pipeline)");
  if (set("train.tp_comm_dtype") && p.tp_comm_fp32 && (p.tp == 1 || p.precision == Precision::fp32))
    notes.push_back(p.tp == 1 ? "tp_comm_dtype = \"fp32\" has no effect at tp = 1 (no tensor-parallel messages)"
                              : "tp_comm_dtype = \"fp32\" has no effect at precision = \"fp32\" (the messages are "
                                "fp32 already)");
  if (set("train.pipeline_dtype") && p.pipeline_fp32 && (p.pp == 1 || p.precision == Precision::fp32))
    notes.push_back(p.pp == 1 ? "pipeline_dtype = \"fp32\" has no effect at pp = 1 (no pipeline messages)"
                              : "pipeline_dtype = \"fp32\" has no effect at precision = \"fp32\" (the messages are "
                                "fp32 already)");
  if (set("train.residual_dtype") && p.residual_fp32 && p.precision == Precision::fp32)
    notes.push_back("residual_dtype = \"fp32\" has no effect at precision = \"fp32\" (every activation is fp32)");
  // Megatron's --fp32-residual-connection sends fp32 between stages as well: half of it is set.
  if (set("train.residual_dtype") && p.residual_fp32 && p.precision != Precision::fp32 && p.pp > 1 &&
      !p.pipeline_fp32)
    notes.push_back("residual_dtype = \"fp32\" with pipeline_dtype = \"auto\" at pp > 1: the residual stream is "
                    "rounded to 16 bits at each stage boundary (the pipeline's messages); Megatron's "
                    "--fp32-residual-connection keeps it fp32 there too: set pipeline_dtype = \"fp32\" as well");
  return notes;
}

namespace {

// The rules every plan must satisfy, in order (a rule may assume the ones before it hold). Each
// problem names the job keys involved, the planner's wording of the rule with its equation, and
// (where the trainer has always said it so) the trainer's wording after the job's origins.
struct Rules {
  const ModelSpec& m;
  const Plan& p;
  Purpose purpose;
  std::optional<PlanProblem> found;

  bool fail(std::vector<std::string> keys, std::string text, std::string job_text = "") {
    if (job_text.empty()) job_text = "[parallel] " + text;
    found = PlanProblem{std::move(keys), std::move(text), std::move(job_text)};
    return true;
  }
  bool degrees();
  bool sizes();
  bool runtime();
  bool shapes();
  bool runtime_shapes();
  bool batches();
  bool pipeline();
  bool stages();
  bool optimizer();
  bool framework();
  bool kfac_workers();
  bool compression();
};

bool Rules::degrees() {
  auto positive = [](int64_t v) { return v >= 1; };
  if (!positive(p.tp) || !positive(p.pp) || !positive(p.dp) || !positive(p.cp) || !positive(p.vp) ||
      !positive(p.micro_batch) || !positive(p.global_batch))
    return fail({"parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp", "parallel.vp", "parallel.micro_batch",
                 "parallel.global_batch"},
                fmt::format("tp, pp, dp, cp, vp, micro_batch and global_batch must be >= 1 (got tp={} pp={} dp={} "
                            "cp={} vp={} micro_batch={} global_batch={})",
                            p.tp, p.pp, p.dp, p.cp, p.vp, p.micro_batch, p.global_batch));
  if (p.zero < 0 || p.zero > 3)
    return fail({"parallel.zero"}, fmt::format("zero must be 0, 1, 2 or 3 (got {})", p.zero));
  // The degrees' product in wide arithmetic: the job file's limits allow degrees whose int64
  // product overflows.
  const __int128 ranks = __int128(p.tp) * p.pp * p.dp * p.cp;
  if (ranks != p.gpus)
    return fail({"parallel.gpus", "parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp"},
                fmt::format("gpus = tp * pp * dp * cp: {} * {} * {} * {} = {}, but gpus = {}", p.tp, p.pp, p.dp,
                            p.cp, double(ranks) < 1e18 ? fmt::format("{}", int64_t(ranks))
                                                       : fmt::format("{:.3g}", double(ranks)), p.gpus));
  return false;
}

// Numbers the planner cannot represent: a model whose parameter count overflows (plan/flops.hpp,
// counted in wide arithmetic), and a step whose activations alone are beyond 2^56 bytes (the
// per-rank byte counts of plan/comm.cpp and memory.cpp multiply tokens, hidden and layers in
// int64). Each is refused with its figure.
bool Rules::sizes() {
  if (std::string e = model_size_problem(m); !e.empty())
    return fail({"model.layers", "model.hidden", "model.ffn_hidden", "model.vocab"}, e, e);
  const __int128 activation_bytes = __int128(p.global_batch) * m.seq_len * m.hidden * (m.layers + 2) * 16;
  if (activation_bytes > (__int128(1) << 56))
    return fail({"parallel.global_batch", "model.seq_len", "model.hidden", "model.layers"},
                fmt::format("a step's activations are too large to count: global_batch * seq_len * hidden * "
                            "(layers + 2) * 16 bytes = {} * {} * {} * {} * 16 = {:.3g} bytes, more than 2^56",
                            p.global_batch, m.seq_len, m.hidden, m.layers + 2, double(activation_bytes)));
  return false;
}

// What the planner models and this runtime does not run (yet): refused for `train` only.
bool Rules::runtime() {
  if (purpose != Purpose::train) return false;
  if (p.recompute == Recompute::op)
    return fail({"parallel.recompute"}, "recompute = \"op\" (op-level selective checkpointing) is planned but not run",
                "[parallel] recompute = \"op\": op-level selective checkpointing is planned but not run by the trainer "
                "(expected \"none\", \"selective\" or \"full\")");
  if (p.recompute_stops_early())
    return fail({"parallel.recompute_early_stop"}, "recompute_early_stop = true is planned but not run",
                "[parallel] recompute_early_stop = true: the trainer re-runs every fully recomputed layer whole "
                "(model/recompute_policy.hpp; expected false)");
  if (p.cp != 1)
    return fail({"parallel.cp"}, fmt::format("cp = {}: context parallelism is planned but not run", p.cp),
                fmt::format("[parallel] cp = {}: context parallelism is planned but not run by the trainer "
                            "(expected cp = 1)", p.cp));
  return false;
}

bool Rules::runtime_shapes() {
  if (purpose != Purpose::train) return false;
  if (m.kv_heads % p.tp != 0)  // the planner models Megatron's replication of kv heads; the engine splits them
    return fail({"parallel.tp", "model.kv_heads"},
                fmt::format("tp must divide kv_heads: kv_heads % tp = {} % {} = {}", m.kv_heads, p.tp,
                            m.kv_heads % p.tp),
                fmt::format("[parallel] tp = {} does not divide kv_heads = {}: kv_heads % tp = {} % {} = {}, expected "
                            "0 (the runtime splits the kv heads of grouped-query attention across tp ranks; "
                            "replicating them is not implemented)",
                            p.tp, m.kv_heads, m.kv_heads, p.tp, m.kv_heads % p.tp));
  if (m.vocab < p.tp)
    return fail({"model.vocab", "parallel.tp"}, fmt::format("vocab {} < tp {}: every rank needs a vocabulary slice",
                                                            m.vocab, p.tp));
  if (p.seq_parallel && m.seq_len % p.tp != 0)
    return fail({"parallel.tp", "model.seq_len"},
                fmt::format("sequence parallelism splits the sequence: seq_len % tp = {} % {} = {}, expected 0",
                            m.seq_len, p.tp, m.seq_len % p.tp),
                fmt::format("[parallel] tp {} must divide seq_len (sequence parallelism) {}: {} % {} = {}", p.tp,
                            m.seq_len, m.seq_len, p.tp, m.seq_len % p.tp));
  return false;
}

bool Rules::shapes() {
  if (m.heads % p.tp != 0)
    return fail({"parallel.tp", "model.heads"},
                fmt::format("tp must divide heads: heads % tp = {} % {} = {}, expected 0", m.heads, p.tp,
                            m.heads % p.tp),
                fmt::format("[parallel] tp {} must divide heads {}: {} % {} = {}", p.tp, m.heads, m.heads, p.tp,
                            m.heads % p.tp));
  if (m.kv_heads % p.tp != 0 && p.tp % m.kv_heads != 0)
    return fail({"parallel.tp", "model.kv_heads"},
                fmt::format("tp must divide kv_heads (or kv_heads divide tp, replicating them): kv_heads % tp = "
                            "{} % {} = {}", m.kv_heads, p.tp, m.kv_heads % p.tp));
  if (m.ffn_hidden % p.tp != 0)
    return fail({"parallel.tp", "model.ffn_hidden"},
                fmt::format("tp must divide ffn_hidden: ffn_hidden % tp = {} % {} = {}, expected 0", m.ffn_hidden,
                            p.tp, m.ffn_hidden % p.tp),
                fmt::format("[parallel] tp {} must divide ffn_hidden {}: {} % {} = {}", p.tp, m.ffn_hidden,
                            m.ffn_hidden, p.tp, m.ffn_hidden % p.tp));
  if (m.seq_len % p.cp != 0)
    return fail({"parallel.cp", "model.seq_len"},
                fmt::format("cp must divide seq_len: seq_len % cp = {} % {} = {}, expected 0", m.seq_len, p.cp,
                            m.seq_len % p.cp));
  if (p.cp > 1 && (m.seq_len / p.cp) % 2 != 0)
    return fail({"parallel.cp", "model.seq_len"},
                fmt::format("context parallelism splits each sequence into 2*cp load-balanced chunks: seq_len % "
                            "(2*cp) = {} % {} = {}, expected 0", m.seq_len, 2 * p.cp, m.seq_len % (2 * p.cp)));
  return false;
}

bool Rules::batches() {
  if (__int128(p.dp) * p.micro_batch > INT64_MAX)  // the product below would overflow
    return fail({"parallel.global_batch", "parallel.micro_batch", "parallel.dp"},
                fmt::format("global_batch must be divisible by dp * micro_batch: dp * micro_batch = {} * {} is far "
                            "above global_batch = {}", p.dp, p.micro_batch, p.global_batch));
  if (p.global_batch % (p.dp * p.micro_batch) != 0)
    return fail({"parallel.global_batch", "parallel.micro_batch", "parallel.dp"},
                fmt::format("global_batch must be divisible by dp * micro_batch: {} % ({} * {}) = {}, expected 0",
                            p.global_batch, p.dp, p.micro_batch, p.global_batch % (p.dp * p.micro_batch)),
                fmt::format("[parallel] global_batch {} is not divisible by micro_batch {} * dp {} = {}",
                            p.global_batch, p.micro_batch, p.dp, p.micro_batch * p.dp));
  return false;
}

bool Rules::pipeline() {
  const std::vector<std::string> keys{"parallel.pp", "parallel.vp", "parallel.schedule", "parallel.global_batch",
                                      "parallel.micro_batch"};
  const int64_t mb = p.micro_batches();
  if (p.pp > 1 && mb < p.pp)
    return fail(keys,
                fmt::format("micro-batches >= pp: global_batch / (dp * micro_batch) = {} / ({} * {}) = {} < pp = {}",
                            p.global_batch, p.dp, p.micro_batch, mb, p.pp),
                fmt::format("[parallel] a pipeline needs at least as many micro-batches as stages: micro_batches {} "
                            "< pp {}", mb, p.pp));
  if (p.vp > 1 && p.pp == 1) return fail(keys, fmt::format("vp = {} > 1 (interleaved schedule) needs pp > 1", p.vp));
  if (p.vp > 1 && p.schedule == Schedule::gpipe)
    return fail(keys, fmt::format("vp = {} > 1 is the interleaved 1F1B schedule; schedule = \"gpipe\" needs vp = 1",
                                  p.vp));
  if (p.vp > 1 && mb % p.pp != 0)
    return fail(keys, fmt::format("the interleaved schedule needs micro-batches % pp = 0: {} % {} = {}", mb, p.pp,
                                  mb % p.pp));
  return false;
}

// Framework behaviours the model cannot represent as asked: refused with the reason.
bool Rules::framework() {
  if (p.tp_comm_overlap != TpCommOverlap::none && p.tp > 1 && !p.seq_parallel)
    return fail({"parallel.tp_comm_overlap", "parallel.seq_parallel", "parallel.tp"},
                fmt::format("tp_comm_overlap = {} at tp = {} needs seq_parallel = true: the overlap splits the "
                            "sequence-parallel all-gathers and reduce-scatters into chunks that run under the "
                            "GEMMs (Megatron asserts the same; PyTorch's async TP fuses only those collectives); "
                            "without sequence parallelism the tensor-parallel all-reduces are not overlapped",
                            to_string(p.tp_comm_overlap), p.tp));
  if (p.overlap_param_gather && p.zero == 0 && p.dp * p.cp > 1)
    return fail({"parallel.overlap_param_gather", "parallel.zero"},
                "overlap_param_gather = true needs zero >= 1: the all-gather it overlaps with the next forward is "
                "the distributed optimizer's (ZeRO 1/2) parameter gather, which zero = 0 does not do (Megatron's "
                "--overlap-param-gather requires --use-distributed-optimizer)");
  return false;
}

bool Rules::stages() {
  const int64_t stages = p.pp * p.vp;
  const std::vector<std::string> keys{"parallel.layers_per_stage", "parallel.pp", "parallel.vp"};
  if (p.layers_per_stage.empty()) {
    // The default split is balanced by cost (plan/stages.hpp): any pp * vp up to the layers.
    if (stages > m.layers)
      return fail({"model.layers", "parallel.pp", "parallel.vp"},
                  fmt::format("every virtual stage needs a layer: pp * vp = {} * {} = {} > layers = {}", p.pp, p.vp,
                              stages, m.layers));
    return false;
  }
  // One entry per virtual stage, in stage order (stage s = chunk * pp + pp_rank), as the runtime.
  if (int64_t(p.layers_per_stage.size()) != stages)
    return fail(keys, fmt::format("layers_per_stage has {} entries, expected pp * vp = {} * {} = {} (one per "
                                  "virtual stage, stage s = chunk * pp + pp_rank)",
                                  p.layers_per_stage.size(), p.pp, p.vp, stages));
  for (size_t s = 0; s < p.layers_per_stage.size(); ++s)
    if (p.layers_per_stage[s] < 1)
      return fail({"parallel.layers_per_stage"},
                  fmt::format("layers_per_stage[{}] = {}: every virtual stage needs >= 1 layer", s,
                              p.layers_per_stage[s]),
                  fmt::format("[parallel] layers_per_stage[{}] = {}: every stage needs >= 1 layer", s,
                              p.layers_per_stage[s]));
  const int64_t sum = std::accumulate(p.layers_per_stage.begin(), p.layers_per_stage.end(), int64_t(0));
  if (sum != m.layers)
    return fail({"parallel.layers_per_stage", "model.layers"},
                fmt::format("sum(layers_per_stage) = {} must equal layers = {}", sum, m.layers),
                fmt::format("[parallel] layers_per_stage sums to {} but the model has layers = {}", sum, m.layers));
  return false;
}

// K-FAC's gradient workers (optim/kfac.hpp): under ZeRO 0, grad_worker_fraction of the dp·cp replicas
// per layer, a whole divisor of them (KAISA's groups of equal size); under ZeRO >= 1 each layer has
// one owner (KAISA's MEM-OPT by construction), so a fraction other than 1 has no meaning there.
// (Over one replica there is nothing to distribute.)
bool Rules::kfac_workers() {
  const double f = p.optimizer_knobs.grad_worker_fraction;
  const int64_t replicas = p.dp * p.cp;
  const std::vector<std::string> keys = {"optimizer.grad_worker_fraction", "parallel.zero", "parallel.dp"};
  if (replicas == 1) return false;  // one replica: nothing to distribute, any fraction is that one
  if (p.zero >= 1 && f != 1)
    return fail(keys, fmt::format("grad_worker_fraction = {} with zero = {}: under ZeRO >= 1 every layer has one owner "
                                  "among the dp = {} replicas; expected grad_worker_fraction = 1 or zero = 0", f,
                                  p.zero, replicas),
                fmt::format("[optimizer] grad_worker_fraction = {} with [parallel] zero = {}: K-FAC under ZeRO >= 1 "
                            "gives every layer one owner among the {} replicas (KAISA's MEM-OPT), so the fraction "
                            "has no meaning; set zero = 0 to choose it, or leave it at 1", f, p.zero, replicas));
  const double g = f * double(replicas);
  const int64_t gi = std::llround(g);
  if (p.zero == 0 && (gi < 1 || std::fabs(g - double(gi)) > 1e-9 * double(replicas) || replicas % gi != 0))
    return fail(keys, fmt::format("grad_worker_fraction = {} x dp = {} = {:g} gradient workers per layer: expected a "
                                  "whole number that divides {}", f, replicas, g, replicas),
                fmt::format("[optimizer] grad_worker_fraction = {} x {} replicas = {:g} gradient workers per layer: "
                            "K-FAC's groups must be a whole number of replicas that divides {} (e.g. {:g})", f,
                            replicas, g, replicas, 1.0 / double(replicas)));
  return false;
}

// Muon orthogonalises every matrix whole on the one rank that owns it (optim/muon.hpp), LAMB's
// trust ratio and Adafactor's factored moment are over whole entries (optim/first_order.hpp); ZeRO
// 2 and 3 keep gradients in bucket and unit shards that cut entries across the dp·cp replicas
// (parallel/grad_sync.cpp asserts the same for an optimizer that needs whole entries).
bool Rules::optimizer() {
  if (p.optimizer == "kfac" && kfac_workers()) return true;
  if (!p.optimizer_state.whole_entries || p.zero < 2 || p.dp * p.cp == 1) return false;
  const std::string at = p.cp > 1 ? fmt::format("dp = {} x cp = {}", p.dp, p.cp) : fmt::format("dp = {}", p.dp);
  return fail({"parallel.zero", "train.optimizer", "parallel.cp"},
              fmt::format("zero = {} with optimizer = \"{}\" at {}: {} needs every parameter tensor whole on "
                          "one rank and ZeRO {} shards tensors across the dp ranks; expected zero = 0 or 1", p.zero,
                          p.optimizer, at, p.optimizer, p.zero),
              fmt::format("[parallel] zero = {} with [train] optimizer = \"{}\" at {}: {} updates every "
                          "parameter tensor whole on the rank that owns it (an orthogonalisation, a per-tensor "
                          "norm or factored moment), and ZeRO {} shards tensors across the dp ranks; expected "
                          "zero = 0 or 1 (ZeRO 1 gives each tensor one owner)", p.zero, p.optimizer, at,
                          p.optimizer, p.zero));
}

// The compressor slot (parallel/compressor.hpp) takes the bucket reductions of ZeRO 0, 1 and 2
// with equal shards: ZeRO 3 reduce-scatters unit by unit outside it, and ZeRO 1 for an optimizer
// that needs whole entries cuts unequal shards (reduce_scatter_v); parallel/grad_sync.cpp asserts the same.
bool Rules::compression() {
  // [train] grad_reduce_dtype = "bf16" is the compressor slot's bf16 collective: the same two rules.
  if (p.grad_reduce_bf16 && p.dp * p.cp > 1 && (p.zero == 3 || (p.zero == 1 && p.optimizer_state.whole_entries)))
    return fail({"train.grad_reduce_dtype", "parallel.zero", "train.optimizer"},
                fmt::format("grad_reduce_dtype = \"bf16\" with zero = {}{}: the bf16 reduction runs in the compressor "
                            "slot, which {}; expected zero = {} or grad_reduce_dtype = \"fp32\"", p.zero,
                            p.zero == 1 ? " and optimizer = \"" + p.optimizer + "\"" : "",
                            p.zero == 3 ? "ZeRO 3's unit-by-unit reduce-scatters do not take"
                                        : "ZeRO 1's unequal shards for that optimizer do not take",
                            p.zero == 3 ? "0, 1 or 2" : "0"),
                fmt::format("[train] grad_reduce_dtype = \"bf16\" with [parallel] zero = {}{}: the bf16 reduction runs "
                            "in the compressor slot, which {}; expected zero = {} or grad_reduce_dtype = \"fp32\"",
                            p.zero, p.zero == 1 ? " and [train] optimizer = \"" + p.optimizer + "\"" : "",
                            p.zero == 3 ? "ZeRO 3's unit-by-unit reduce-scatters do not take"
                                        : "ZeRO 1's unequal shards for that optimizer do not take",
                            p.zero == 3 ? "0, 1 or 2" : "0"));
  if (!p.comm.active() || p.dp * p.cp == 1) return false;
  const std::string c = p.comm.compressor;
  if (p.zero == 3)
    return fail({"comm.compressor", "parallel.zero"},
                fmt::format("compressor = \"{}\" with zero = 3: ZeRO 3 reduce-scatters every unit's gradients as "
                            "backward makes them, outside the compressor slot; expected zero = 0, 1 or 2", c),
                fmt::format("[comm] compressor = \"{}\" with [parallel] zero = 3: ZeRO 3 reduce-scatters every unit's "
                            "gradients as backward makes them, outside the compressor slot; expected zero = 0, 1 or 2 "
                            "(or compressor = \"none\")", c));
  // Compressed momentum (comm.compress = "momentum") reads AdamW's whole synchronised m on every
  // rank: a rule here, so that a plan with zero = "auto" never picks ZeRO 1 or 2 for it.
  if (p.comm.compress == "momentum" && p.zero != 0)
    return fail({"comm.compress", "parallel.zero"},
                fmt::format("compress = \"momentum\" with zero = {}: each rank forms its local momentum from the "
                            "synchronised one, which ZeRO {} keeps only as this rank's shard; expected zero = 0",
                            p.zero, p.zero),
                fmt::format("[comm] compress = \"momentum\" with [parallel] zero = {}: each rank forms its local "
                            "momentum from the synchronised one, which ZeRO {} keeps only as this rank's shard; "
                            "expected zero = 0", p.zero, p.zero));
  if (p.zero == 1 && p.optimizer_state.whole_entries)
    return fail({"comm.compressor", "parallel.zero", "train.optimizer"},
                fmt::format("compressor = \"{}\" with zero = 1 and optimizer = \"{}\": ZeRO 1 gives every tensor one "
                            "owner for {} (shards of unequal size), which the compressor slot does not take; expected "
                            "zero = 0", c, p.optimizer, p.optimizer),
                fmt::format("[comm] compressor = \"{}\" with [parallel] zero = 1 and [train] optimizer = \"{}\": ZeRO 1 "
                            "cuts its shards between whole tensors for {} (shards of unequal size), which the compressor "
                            "slot does not take; expected zero = 0 (or compressor = \"none\")", c, p.optimizer, p.optimizer));
  return false;
}

}  // namespace

std::optional<PlanProblem> plan_problem(const ModelSpec& model, const Plan& plan, Purpose purpose) {
  Rules r{model, plan, purpose, std::nullopt};
  (void)(r.degrees() || r.sizes() || r.runtime() || r.shapes() || r.runtime_shapes() || r.batches() || r.pipeline() || r.stages() ||
               r.optimizer() || r.compression() || r.framework());
  return r.found;
}

std::string plan_error(const ModelSpec& m, const Plan& p) {
  const std::optional<PlanProblem> e = plan_problem(m, p, Purpose::predict);
  return e ? e->text : "";
}

void check_plan(const ModelSpec& model, const Plan& plan) {
  std::string err = plan_error(model, plan);
  EXA_CHECK(err.empty(), "invalid plan: {}", err);
}

std::vector<int64_t> balanced_layers(int64_t layers, int64_t pp) {
  std::vector<int64_t> out(pp, layers / pp);
  int64_t extra = layers % pp;
  for (int64_t r = 1; r + 1 < pp && extra > 0; ++r, --extra) ++out[r];
  if (extra > 0) { ++out[0]; --extra; }
  if (extra > 0) { ++out[pp - 1]; --extra; }
  return out;
}

std::vector<int64_t> layers_per_rank(const ModelSpec& m, const Plan& p) {
  return layers_per_pp_rank(m, p.pp, p.vp, p.layers_per_stage);
}

int64_t layers_on_rank(const ModelSpec& m, const Plan& p, int64_t pp_rank) {
  if (p.pp == 1) return m.layers;  // the common case, without the memo's lookup
  return layers_per_rank(m, p)[size_t(pp_rank)];
}

}  // namespace exatrain::plan
