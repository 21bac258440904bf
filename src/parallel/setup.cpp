#include "parallel/setup.hpp"

#include "core/check.hpp"

namespace exatrain::parallel {

template <class T>
static T resolved(const std::optional<T>& v, const char* key) {
  EXA_CHECK(v.has_value(),
            "[parallel] {} is \"auto\": run `exatrain plan` first; `train` needs every degree "
            "resolved",
            key);
  return *v;
}

static void check_divides(int64_t degree, const char* degree_name, int64_t value,
                          const char* value_name) {
  EXA_CHECK(value % degree == 0, "[parallel] {} {} must divide {} {}: {} % {} = {}", degree_name,
            degree, value_name, value, value, degree, value % degree);
}

RuntimePlan runtime_plan_from_job(const Job& job, int world) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  EXA_CHECK(p.gpus == world, "[parallel] gpus = {} but the job runs on {} MPI ranks", p.gpus, world);
  int tp = static_cast<int>(resolved(p.tp, "tp"));
  int pp = static_cast<int>(resolved(p.pp, "pp"));
  int cp = static_cast<int>(resolved(p.cp, "cp"));
  std::optional<int> dp;
  if (p.dp) dp = static_cast<int>(*p.dp);  // omitted dp is inferred; "auto" too, there is one fit
  RuntimePlan r;
  r.mesh = resolve_mesh_shape(world, tp, cp, pp, dp);
  r.zero = static_cast<int>(resolved(p.zero, "zero"));
  EXA_CHECK(r.zero >= 0 && r.zero <= 3, "[parallel] zero must be 0, 1, 2 or 3, got {}", r.zero);
  r.micro_batch = resolved(p.micro_batch, "micro_batch");
  r.seq_parallel = resolved(p.seq_parallel, "seq_parallel");
  r.recompute = resolved(p.recompute, "recompute");
  int vp = static_cast<int>(resolved(p.vp, "vp"));
  Schedule sched = resolved(p.schedule, "schedule");

  int64_t per_step = r.micro_batch * r.mesh.dp;
  EXA_CHECK(p.global_batch % per_step == 0,
            "[parallel] global_batch {} is not divisible by micro_batch {} * dp {} = {}",
            p.global_batch, r.micro_batch, r.mesh.dp, per_step);
  r.micro_batches = p.global_batch / per_step;

  // Tensor parallelism splits heads, the FFN and the vocabulary; grouped-query attention's
  // kv heads are split too, or replicated when there are fewer than tp of them.
  check_divides(tp, "tp", m.heads, "heads");
  check_divides(tp, "tp", m.ffn_hidden, "ffn_hidden");
  // The engine splits kv heads across tp ranks; replicating them when kv_heads < tp (which
  // Megatron does, and the planner models) is not implemented in the runtime.
  EXA_CHECK(m.kv_heads % tp == 0,
            "[parallel] tp = {} does not divide kv_heads = {}: kv_heads % tp = {} % {} = {}, expected 0 (the "
            "runtime splits the kv heads of grouped-query attention across tp ranks; replicating them is not "
            "implemented)",
            tp, m.kv_heads, m.kv_heads, tp, m.kv_heads % tp);
  EXA_CHECK(m.vocab >= tp, "[parallel] vocab {} < tp {}: every rank needs a vocabulary slice",
            m.vocab, tp);
  if (r.seq_parallel) check_divides(tp, "tp", m.seq_len, "seq_len (sequence parallelism)");
  check_divides(cp, "cp", m.seq_len, "seq_len");

  r.pipeline.pp = pp;
  r.pipeline.vp = vp;
  r.pipeline.micro_batches = static_cast<int>(r.micro_batches);
  if (sched == Schedule::gpipe) {
    r.pipeline.schedule = PipeSchedule::gpipe;
  } else {
    r.pipeline.schedule = vp > 1 ? PipeSchedule::interleaved : PipeSchedule::one_f_one_b;
  }
  validate_pipeline(r.pipeline);
  int stages = pp * vp;
  if (!p.layers_per_stage.empty()) {
    EXA_CHECK(static_cast<int>(p.layers_per_stage.size()) == stages,
              "[parallel] layers_per_stage has {} entries but pp {} * vp {} = {} stages",
              p.layers_per_stage.size(), pp, vp, stages);
  } else {
    EXA_CHECK(m.layers >= stages,
              "[parallel] every pipeline stage needs a layer: layers {} < pp {} * vp {} = {}",
              m.layers, pp, vp, stages);
  }
  return r;
}

}  // namespace exatrain::parallel
