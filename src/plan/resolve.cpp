#include "plan/resolve.hpp"

#include <fmt/format.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/mesh.hpp"
#include "plan/predict.hpp"
#include "plan/search.hpp"

namespace exatrain::plan {
namespace {

// [parallel] gpus is the world size (omitted: it is).
void check_gpus(const Job& job, int world) {
  EXA_CHECK(job.parallel.gpus == world, "{}: [parallel] gpus = {} but the job runs on {} MPI ranks",
            job_origin(job, {"parallel.gpus"}), job.parallel.gpus, world);
}

// Every message starts with where the values it names came from (the job file, or the --set
// that gave one of them: job_origin), as the job file's own problems do.
template <class T>
T resolved(const Job& job, const std::optional<T>& v, const char* key) {
  EXA_CHECK(v.has_value(),
            "{}: [parallel] {} is \"auto\": run `exatrain plan` first; `train` needs every degree resolved",
            job_origin(job, {std::string("parallel.") + key}), key);
  return *v;
}

bool has_auto(const ParallelSpec& p) {
  return !p.tp || !p.pp || !p.cp || !p.vp || !p.zero || !p.micro_batch || !p.recompute || !p.seq_parallel ||
         !p.schedule;
}

// The planner's best plan for `world` ranks on the local machine that this runtime can run, for
// the fields the job leaves unset; cp is fixed to 1 (not run). Every rank searches (the search is
// deterministic), so no plan needs to be sent around.
const Prediction* best_runnable(const Job& job, const SearchResult& res) {
  for (const auto& c : res.top) {
    Plan p = c.plan;
    p.set_optimizer(job.train);  // (the search's plans carry it already; Purpose::train adds the runtime's rules)
    if (!plan_problem(job.model, p, Purpose::train)) return &c;
  }
  return nullptr;
}

// Why no plan fits: the rule the set fields break, with every unset field at its most permissive
// value (tp, pp, cp, vp 1, dp = world / (tp pp cp), micro_batch 1, ZeRO 0, no recomputation).
std::string why_no_plan(const Job& job, ParallelSpec probe) {
  for (auto* d : {&probe.tp, &probe.pp, &probe.cp, &probe.vp, &probe.micro_batch}) if (!*d) *d = 1;
  if (!probe.zero) probe.zero = 0;
  if (!probe.recompute) probe.recompute = Recompute::none;
  try {
    Plan plan = resolve_plan(probe, job.train.precision);
    plan.set_optimizer(job.train);  // the optimizer's own rule (whole entries: ZeRO 0 or 1)
    return plan_error(job.model, plan);
  } catch (const Error& e) {
    return e.what();
  }
}

void fill_from_search(Job& job, int world, std::FILE* log) {
  ParallelSpec& p = job.parallel;
  ParallelSpec fixed = p;
  fixed.gpus = world;
  if (!fixed.cp) fixed.cp = 1;
  const MachineSpec local = parse_job("[machine]\npreset = \"local\"\n", "local machine", {}).machine;
  // Ranked with its optimizer's cost, each plan as this trainer runs it.
  const SearchResult res = search_runnable_plans(job.model, local, fixed, job.train, 200);
  const Prediction* best = best_runnable(job, res);
  if (!best) {
    const std::string why = why_no_plan(job, fixed);
    EXA_CHECK(why.empty(), "{}: [parallel] the fields that are set cannot make a plan for {} ranks (unset ones at "
              "their smallest values): {}", job_origin(job, {"parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp",
              "parallel.vp", "parallel.micro_batch", "parallel.global_batch", "parallel.layers_per_stage", "parallel.zero",
              "train.optimizer", "comm.compressor"}), world, why);
    EXA_FAIL("{}: [parallel] has \"auto\" fields, and the planner found no plan for {} ranks on the local machine "
             "that this runtime can run with the fields that are set ({} plans searched, {} fit: `exatrain plan` on "
             "the job with --set parallel.gpus={} shows why); set the degrees explicitly",
             job_origin(job, {"parallel.tp", "parallel.pp", "parallel.dp", "parallel.zero", "parallel.micro_batch",
                              "parallel.global_batch"}),
             world, res.searched, res.top.size(), world);
  }
  const Plan& b = best->plan;
  p.layers_per_stage = b.layers_per_stage;
  p.gpus = world;
  p.tp = b.tp, p.pp = b.pp, p.dp = b.dp, p.cp = b.cp, p.vp = b.vp, p.zero = b.zero, p.micro_batch = b.micro_batch;
  p.recompute = b.recompute, p.seq_parallel = b.seq_parallel, p.schedule = b.schedule;
  if (log) {
    fmt::print(log, "[parallel] auto: the planner's best plan for {} ranks on the local machine ({} plans searched): "
               "{} (predicted {:.4g} s per step)\n", world, res.searched, plan_summary(b), best->step_time_s);
    std::fflush(log);
  }
}

}  // namespace

void training_job_problems(const Job& job, int world, std::vector<std::string>& errors) {
  const ParallelSpec& p = job.parallel;
  // One process (no launcher): gpus and every degree are 1, said for each the job sets otherwise.
  // On several ranks plan_from_job prints the world's equation instead (a gpus the job sets must
  // be the world size; omitted, it is the world size).
  if (world == 1 && job.origins.count("parallel.gpus") && p.gpus != 1)
    errors.push_back(fmt::format("{}: [parallel] gpus = {}: this trainer runs on one rank, so expected 1 (start it "
                                 "with mpirun -np {} for {} ranks)", job_origin(job, {"parallel.gpus"}), p.gpus,
                                 p.gpus, p.gpus));
  auto one = [&](const char* key, const std::optional<int64_t>& v) {
    if (world == 1 && v && *v != 1)
      errors.push_back(fmt::format("{}: [parallel] {} = {}: this trainer runs on one rank, so expected 1 (start it "
                                   "with mpirun -np N for N ranks; `exatrain plan` predicts such plans)",
                                   job_origin(job, {std::string("parallel.") + key}), key, *v));
  };
  one("tp", p.tp), one("pp", p.pp), one("dp", p.dp), one("cp", p.cp), one("vp", p.vp);
  // Mixed precision (docs/precision.md): bf16 and fp16 (with loss scaling) train with fp32
  // masters; fp8 is for `predict`/`plan`.
  if (job.train.precision == Precision::fp8)
    errors.push_back(fmt::format("{}: [train] precision = \"{}\": this trainer trains in \"fp32\", \"bf16\" or "
                                 "\"fp16\" (\"{}\" is for `predict`/`plan`)", job_origin(job, {"train.precision"}),
                                 to_string(job.train.precision), to_string(job.train.precision)));
  if (job.train.steps < 1)
    errors.push_back(fmt::format("{}: [train] steps = {}: expected at least 1", job_origin(job, {"train.steps"}),
                                 job.train.steps));
}

void fill_auto_parallel(Job& job, int world, std::FILE* log) {
  ParallelSpec& p = job.parallel;
  if (!has_auto(p)) return;
  if (world > 1) return fill_from_search(job, world, log);
  // One rank: omitted (or "auto") degrees mean the single-process run.
  for (auto* d : {&p.tp, &p.pp, &p.cp, &p.vp, &p.micro_batch}) if (!*d) *d = 1;
  if (!p.zero) p.zero = 0;
  if (!p.recompute) p.recompute = Recompute::none;
  if (!p.seq_parallel) p.seq_parallel = false;
  if (!p.schedule) p.schedule = Schedule::one_f_one_b;
}

Plan plan_from_job(const Job& job, int world) {
  const ParallelSpec& p = job.parallel;
  check_gpus(job, world);
  Plan r;
  r.gpus = world;
  r.global_batch = p.global_batch;
  r.tp = resolved(job, p.tp, "tp");
  r.pp = resolved(job, p.pp, "pp");
  r.cp = resolved(job, p.cp, "cp");
  r.zero = resolved(job, p.zero, "zero");
  r.micro_batch = resolved(job, p.micro_batch, "micro_batch");
  r.seq_parallel = resolved(job, p.seq_parallel, "seq_parallel");
  r.recompute = resolved(job, p.recompute, "recompute");
  r.vp = resolved(job, p.vp, "vp");
  r.schedule = resolved(job, p.schedule, "schedule");
  // Of [parallel]'s framework behaviours the trainer's plan takes the stage split and
  // recompute_early_stop (planned, not run: plan_problem refuses it for train), not the overlaps
  // (Plan::set_framework): this runtime runs its own (as_run_here, with which `report` predicts
  // its runs; the session says which the job plans otherwise). Taking them here would let
  // Rules::framework refuse a `train` job for flags it ignores, or a plan the search chose with
  // overlap_param_gather dropped at zero = 0.
  r.layers_per_stage = p.layers_per_stage;
  r.recompute_early_stop = p.recompute_early_stop;
  r.precision = job.train.precision;
  r.set_optimizer(job.train);
  // dp omitted (or "auto": there is one fit) is inferred.
  std::optional<int> dp;
  if (p.dp) dp = int(*p.dp);
  try {
    r.dp = resolve_mesh_shape(world, int(r.tp), int(r.cp), int(r.pp), dp).dp;
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", job_origin(job, {"parallel.gpus", "parallel.tp", "parallel.cp", "parallel.pp",
                                                       "parallel.dp"}), e.what()));
  }
  if (const std::optional<PlanProblem> e = plan_problem(job.model, r, Purpose::train))
    throw Error(fmt::format("{}: {}", job_origin(job, e->keys), e->job_text));
  return r;
}

void check_training_job(const Job& job, int world) {
  std::vector<std::string> errors;
  training_job_problems(job, world, errors);
  if (errors.empty()) return;
  std::string msg = fmt::format("{} problem{} in job {}:", errors.size(), errors.size() == 1 ? "" : "s", job.source);
  for (const auto& e : errors) msg += "\n  " + e;
  throw Error(msg);
}

Plan resolve_training_plan(Job& job, int world, std::FILE* log) {
  if (!job.origins.count("parallel.gpus")) job.parallel.gpus = world;
  check_gpus(job, world);  // before the search, which plans for the world it is given
  fill_auto_parallel(job, world, log);
  const Plan plan = plan_from_job(job, world);
  if (!job.parallel.dp) job.parallel.dp = plan.dp;  // inferred: the run's job.toml says which
  return plan;
}

std::vector<std::string> framework_not_run_here(const Job& job, const Plan& plan, bool set_only) {
  Plan planned = plan;
  planned.set_framework(job.parallel);
  const Plan here = as_run_here(planned);
  const bool replicas = planned.dp * planned.cp > 1;
  std::vector<std::string> lines;
  auto say = [&](const char* key, bool differs, bool acts, const std::string& value, const std::string& why) {
    if (differs && acts && (!set_only || job.origins.count(std::string("parallel.") + key)))
      lines.push_back(fmt::format("{} = {}: {}", key, value, why));
  };
  // Compressed reductions block whatever the flag (predict.cpp counts them so).
  say("overlap_grad_reduce", planned.overlap_grad_reduce != here.overlap_grad_reduce,
      replicas && planned.zero != 3 && !planned.comm.active(),
      planned.overlap_grad_reduce ? "true" : "false",
      planned.overlap_grad_reduce ? "this trainer's ZeRO 1 reduce-scatters the gradients once, after the last "
                                    "micro-batch's backward"
                                  : fmt::format("this trainer's ZeRO {} reduces the gradients bucket by bucket under "
                                                "the backward", planned.zero));
  say("overlap_param_gather", planned.overlap_param_gather != here.overlap_param_gather,
      replicas && (planned.zero == 1 || planned.zero == 2), "true",
      "this trainer all-gathers the updated weights after the optimizer step, before the next forward");
  say("tp_comm_overlap", planned.tp_comm_overlap != here.tp_comm_overlap, planned.tp > 1,
      to_string(planned.tp_comm_overlap), "this trainer's tensor-parallel collectives block");
  say("overlap_p2p_comm", planned.overlap_p2p_comm != here.overlap_p2p_comm, planned.vp > 1, "true",
      "this trainer's pipeline messages are non-blocking MPI sends and receives, which MPI moves only inside "
      "its calls (weak progress, no progress thread): counted exposed");
  say("recompute_early_stop", planned.recompute_early_stop != here.recompute_early_stop,
      planned.recompute == Recompute::full, "true", "this trainer re-runs every recomputed layer whole");
  // Not keys: what the planner assumes of the frameworks it models (Plan::zero3_prefetch,
  // Plan::pp_scatter_gather), for report's table.
  if (!set_only && planned.zero == 3 && replicas)
    lines.push_back("zero = 3: this trainer gathers each layer's weights and reduce-scatters its gradients "
                    "blocking, without the prefetch of FSDP and DeepSpeed");
  if (!set_only && planned.pp > 1 && planned.tp > 1 && !planned.seq_parallel)
    lines.push_back("pp > 1 at tp > 1: this trainer sends every tensor-parallel rank's whole activation between "
                    "stages, without Megatron's scatter/gather across nodes");
  return lines;
}

}  // namespace exatrain::plan
