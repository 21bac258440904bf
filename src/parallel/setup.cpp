#include "parallel/setup.hpp"

#include "core/check.hpp"
#include "job/parse.hpp"

namespace exatrain::parallel {

// Every message starts with where the values it names came from (the job file, or the --set
// that gave one of them: job_origin), as the job file's own problems do.
template <class T>
static T resolved(const Job& job, const std::optional<T>& v, const char* key) {
  EXA_CHECK(v.has_value(),
            "{}: [parallel] {} is \"auto\": run `exatrain plan` first; `train` needs every degree "
            "resolved",
            job_origin(job, {std::string("parallel.") + key}), key);
  return *v;
}

static void check_divides(const Job& job, int64_t degree, const char* degree_name, int64_t value,
                          const char* value_name, const char* value_key) {
  EXA_CHECK(value % degree == 0, "{}: [parallel] {} {} must divide {} {}: {} % {} = {}",
            job_origin(job, {std::string("parallel.") + degree_name, value_key}), degree_name, degree, value_name,
            value, value, degree, value % degree);
}

// Runs f; an Error from it (mesh or pipeline arithmetic, which sees numbers only) gets the origins
// of `keys` in front.
template <class F>
static auto named(const Job& job, const std::vector<std::string>& keys, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", job_origin(job, keys), e.what()));
  }
}

RuntimePlan runtime_plan_from_job(const Job& job, int world) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  EXA_CHECK(p.gpus == world, "{}: [parallel] gpus = {} but the job runs on {} MPI ranks",
            job_origin(job, {"parallel.gpus"}), p.gpus, world);
  int tp = static_cast<int>(resolved(job, p.tp, "tp"));
  int pp = static_cast<int>(resolved(job, p.pp, "pp"));
  int cp = static_cast<int>(resolved(job, p.cp, "cp"));
  // The planner models context parallelism; the trainer does not run it (DistributedTrainer
  // checks too, without the job's origins): refused here, where the message can name them.
  EXA_CHECK(cp == 1, "{}: [parallel] cp = {}: context parallelism is planned but not run by the trainer "
            "(expected cp = 1)", job_origin(job, {"parallel.cp"}), cp);
  std::optional<int> dp;
  if (p.dp) dp = static_cast<int>(*p.dp);  // omitted dp is inferred; "auto" too, there is one fit
  RuntimePlan r;
  r.mesh = named(job, {"parallel.gpus", "parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp"},
                 [&] { return resolve_mesh_shape(world, tp, cp, pp, dp); });
  r.zero = static_cast<int>(resolved(job, p.zero, "zero"));
  EXA_CHECK(r.zero >= 0 && r.zero <= 3, "{}: [parallel] zero must be 0, 1, 2 or 3, got {}",
            job_origin(job, {"parallel.zero"}), r.zero);
  r.micro_batch = resolved(job, p.micro_batch, "micro_batch");
  r.seq_parallel = resolved(job, p.seq_parallel, "seq_parallel");
  r.recompute = resolved(job, p.recompute, "recompute");
  int vp = static_cast<int>(resolved(job, p.vp, "vp"));
  Schedule sched = resolved(job, p.schedule, "schedule");

  int64_t per_step = r.micro_batch * r.mesh.dp;
  EXA_CHECK(p.global_batch % per_step == 0,
            "{}: [parallel] global_batch {} is not divisible by micro_batch {} * dp {} = {}",
            job_origin(job, {"parallel.global_batch", "parallel.micro_batch", "parallel.dp"}), p.global_batch,
            r.micro_batch, r.mesh.dp, per_step);
  r.micro_batches = p.global_batch / per_step;

  // Tensor parallelism splits heads, the FFN and the vocabulary; grouped-query attention's
  // kv heads are split too, or replicated when there are fewer than tp of them.
  check_divides(job, tp, "tp", m.heads, "heads", "model.heads");
  check_divides(job, tp, "tp", m.ffn_hidden, "ffn_hidden", "model.ffn_hidden");
  // The engine splits kv heads across tp ranks; replicating them when kv_heads < tp (which
  // Megatron does, and the planner models) is not implemented in the runtime.
  EXA_CHECK(m.kv_heads % tp == 0,
            "{}: [parallel] tp = {} does not divide kv_heads = {}: kv_heads % tp = {} % {} = {}, expected 0 (the "
            "runtime splits the kv heads of grouped-query attention across tp ranks; replicating them is not "
            "implemented)",
            job_origin(job, {"parallel.tp", "model.kv_heads"}), tp, m.kv_heads, m.kv_heads, tp, m.kv_heads % tp);
  EXA_CHECK(m.vocab >= tp, "{}: [parallel] vocab {} < tp {}: every rank needs a vocabulary slice",
            job_origin(job, {"model.vocab", "parallel.tp"}), m.vocab, tp);
  if (r.seq_parallel) check_divides(job, tp, "tp", m.seq_len, "seq_len (sequence parallelism)", "model.seq_len");
  check_divides(job, cp, "cp", m.seq_len, "seq_len", "model.seq_len");

  r.pipeline.pp = pp;
  r.pipeline.vp = vp;
  r.pipeline.micro_batches = static_cast<int>(r.micro_batches);
  if (sched == Schedule::gpipe) {
    r.pipeline.schedule = PipeSchedule::gpipe;
  } else {
    r.pipeline.schedule = vp > 1 ? PipeSchedule::interleaved : PipeSchedule::one_f_one_b;
  }
  named(job, {"parallel.pp", "parallel.vp", "parallel.schedule", "parallel.global_batch", "parallel.micro_batch"},
        [&] { validate_pipeline(r.pipeline); });
  int stages = pp * vp;
  if (!p.layers_per_stage.empty()) {
    EXA_CHECK(static_cast<int>(p.layers_per_stage.size()) == stages,
              "{}: [parallel] layers_per_stage has {} entries but pp {} * vp {} = {} stages",
              job_origin(job, {"parallel.layers_per_stage", "parallel.pp", "parallel.vp"}), p.layers_per_stage.size(),
              pp, vp, stages);
    // schedule.cpp's stages_from_list checks these too, but sees numbers only.
    int64_t sum = 0;
    for (size_t s = 0; s < p.layers_per_stage.size(); s++) {
      EXA_CHECK(p.layers_per_stage[s] >= 1, "{}: [parallel] layers_per_stage[{}] = {}: every stage needs >= 1 layer",
                job_origin(job, {"parallel.layers_per_stage"}), s, p.layers_per_stage[s]);
      sum += p.layers_per_stage[s];
    }
    EXA_CHECK(sum == m.layers, "{}: [parallel] layers_per_stage sums to {} but the model has layers = {}",
              job_origin(job, {"parallel.layers_per_stage", "model.layers"}), sum, m.layers);
  } else {
    EXA_CHECK(m.layers >= stages,
              "{}: [parallel] every pipeline stage needs a layer: layers {} < pp {} * vp {} = {}",
              job_origin(job, {"model.layers", "parallel.pp", "parallel.vp"}), m.layers, pp, vp, stages);
  }
  return r;
}

}  // namespace exatrain::parallel
