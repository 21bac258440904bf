// Communication accounting: the bytes each rank's ledger counts in one training step, per
// collective kind, equal plan::bytes_sent_per_step for the same plan and rank EXACTLY (integers).
// Conventions reconciled (docs/parallel.md, "Communication accounting"): the planner counts the
// sequence-parallel partial-gradient all-reduce and sp-sized pipeline messages; the runtime pads
// ZeRO arenas only when dp does not divide them and is run with one gradient bucket per arena.
// GPT-2-style models (gelu, layernorm, learned positions, biases) and Llama-style ones (swiglu,
// rmsnorm, rope, grouped-query attention with kv_heads % tp == 0, untied, with and without
// linear-layer biases); vocab 64 (divisible by tp) or 67 (odd: at tp 2 the vocabulary slices are 34
// and 33 rows, so the two tp ranks' dp buffers and tied-embedding messages differ). Embeddings are
// tied unless a config says untied: with pp > 1 the first and last stage's exchange of the
// embedding's gradient is counted under pp_send on both sides (pp 4: the middle stages send none).
// Every case also checks that both sides place the same layers on each pipeline rank; vocab 256 at
// pp 2 makes the default (cost-balanced) split uneven, 3 + 1. bf16 cases (ZeRO 0): the pipeline
// and tensor-parallel messages are 16-bit, as the planner counts them, or fp32 with [train]
// pipeline_dtype / tp_comm_dtype = "fp32".
#include <mpi.h>
#include <omp.h>

#include <cstdio>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "train/trainer.hpp"
#include "plan/comm.hpp"
#include "plan/plan.hpp"

using namespace exatrain;
using namespace exatrain::parallel;
using dist_test::Config;

struct Case {
  Config cfg;
  int64_t vocab = 64;
  bool bias = true;
  Precision precision = Precision::fp32;
  std::string pipeline_dtype = "auto", tp_comm_dtype = "auto";  // [train] pipeline_dtype, tp_comm_dtype
  std::string name() const {
    return fmt::format("{} vocab={}{}{}{}{}", cfg.name(), vocab, bias ? "" : " bias=false",
                       precision == Precision::fp32 ? "" : " bf16",
                       pipeline_dtype == "auto" ? "" : " pipeline_dtype=" + pipeline_dtype,
                       tp_comm_dtype == "auto" ? "" : " tp_comm_dtype=" + tp_comm_dtype);
  }
};

static std::vector<Case> configs_for(int world) {
  auto c = [](int dp, int tp, int pp) {
    Config x;
    x.dp = dp, x.tp = tp, x.pp = pp;
    return x;
  };
  auto llama = [](Config x, int64_t vocab, bool bias) {
    x.llama = true;
    return Case{x, vocab, bias};
  };
  std::vector<Case> v;
  if (world == 4) {
    v.push_back({c(2, 2, 1)});
    Config a = c(1, 2, 2); a.sp = true; v.push_back({a});
    a = c(2, 1, 2); a.vp = 2; a.zero = 1; v.push_back({a});
    a = c(4, 1, 1); a.zero = 2; a.micro_batches = 2; v.push_back({a});
    a = c(1, 2, 2); a.recompute = Recompute::full; a.schedule = Schedule::gpipe; v.push_back({a});
    a = c(2, 2, 1); a.zero = 3; a.untied = true; v.push_back({a});
    a = c(1, 1, 4); v.push_back({a});
    a = c(2, 1, 2); a.zero = 2; v.push_back({a});  // ZeRO 2: m reduce-scatters, tied exchange of the owned 1/dp
    a = c(2, 1, 2); a.zero = 3; v.push_back({a});  // ZeRO 3: tied exchange of the owned 1/dp
    // ZeRO 3 on one stage with tied embeddings: the LM head gathers the embedding unit again.
    a = c(4, 1, 1); a.zero = 3; a.micro_batches = 2; v.push_back({a});
    a = c(2, 2, 1); a.zero = 3; v.push_back({a, 67});
    a = c(2, 2, 1); a.sp = true; a.zero = 2; v.push_back({a});  // ZeRO 2/3 + sp: the partial-gradient
    a = c(2, 2, 1); a.sp = true; a.zero = 3; a.untied = true; v.push_back({a});  // all-reduce m times
    // Odd vocabulary at tp 2: uneven slices in the dp all-reduce and the tied-embedding exchange.
    a = c(1, 2, 2); v.push_back({a, 67});
    a = c(2, 2, 1); a.zero = 1; v.push_back({a, 67});
    // Llama-style: biases or none, sequence parallelism (its partial-gradient all-reduce counts
    // the norms and, with biases, the o_proj and down_proj biases), pipeline, ZeRO.
    a = c(2, 2, 1); a.sp = true; v.push_back(llama(a, 67, false));
    a = c(2, 2, 1); a.sp = true; a.zero = 2; v.push_back(llama(a, 64, true));
    a = c(1, 2, 2); v.push_back(llama(a, 67, true));
    a = c(2, 1, 2); a.zero = 1; v.push_back(llama(a, 67, false));
    // Default (cost-balanced) split made uneven by the LM head: vocab 256 costs 1.7 layers of the
    // tiny model, so pp 2 places 3 + 1 layers (plan/stages.hpp), in the planner as in the runtime.
    a = c(2, 1, 2); v.push_back({a, 256});
    a = c(1, 2, 2); a.sp = true; v.push_back(llama(a, 256, true));
    // bf16 at tp 1 and ZeRO 0: the pipeline messages in 16 bits (as the planner counts them), the
    // gradients' reduction and the tied embedding's exchange in their reduce dtype (fp32).
    v.push_back({c(1, 1, 4), 64, true, Precision::bf16});
    v.push_back({c(2, 1, 2), 64, true, Precision::bf16});
    a = c(2, 1, 2); a.vp = 2; v.push_back({a, 64, true, Precision::bf16});
    v.push_back({c(2, 1, 2), 64, true, Precision::bf16, "fp32"});  // the messages kept fp32, counted so
    // bf16 at tp 2 (ZeRO 0): the regions' messages in 16 bits, the cross-entropy statistics and
    // sequence parallelism's weight gradients in fp32; and with tp_comm_dtype = "fp32".
    v.push_back({c(2, 2, 1), 64, true, Precision::bf16});
    a = c(1, 2, 2); a.sp = true; v.push_back({a, 67, true, Precision::bf16});
    a = c(2, 2, 1); a.sp = true; a.llama = true; v.push_back({a, 64, true, Precision::bf16});
    v.push_back({c(2, 2, 1), 64, true, Precision::bf16, "auto", "fp32"});
  } else if (world == 8) {
    Config a = c(2, 2, 2); a.sp = true; a.zero = 1; a.recompute = Recompute::full; v.push_back({a});
    a = c(2, 2, 2); a.vp = 2; v.push_back({a});
    a = c(2, 2, 2); a.sp = true; v.push_back(llama(a, 67, false));
  }
  return v;
}

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  const int world = mpi.size, rank = mpi.rank;
  auto backend = make_cpu_backend(1);
  int failures = 0;
  const std::vector<Case> configs = configs_for(world);
  for (const Case& cs : configs) {
    const Config& cfg = cs.cfg;
    Job job = dist_test::job_for(cfg, 2);
    job.model.vocab = cs.vocab;
    job.model.bias = cs.bias;
    job.train.precision = cs.precision;
    job.train.pipeline_dtype = cs.pipeline_dtype;
    job.train.tp_comm_dtype = cs.tp_comm_dtype;
    dist_test::DistRun run = dist_test::make_run(*backend, job, [](TrainerOptions& o) {
      o.bucket_floats = int64_t(1) << 40;  // one bucket per arena: the planner's flat all-reduce
    });
    Trainer& trainer = *run.trainer;
    const ParallelRuntime& rt = *run.rt;
    trainer.train_step();
    const StepMetrics m = trainer.train_step();  // a steady step: the ledger was reset at its start

    const plan::Plan p = plan::resolve_plan(job);  // with the job's [train] keys (pipeline_dtype)
    const plan::RankPosition pos = plan::rank_position(p, rank);
    const MeshCoord& mc = rt.mesh().coord;
    std::string problems;
    if (pos.tp_rank != mc.tp || pos.dp_rank != mc.dp || pos.pp_rank != mc.pp)
      problems += fmt::format(" rank order differs: planner (tp {}, dp {}, pp {}) runtime (tp {}, dp {}, pp {});",
                              pos.tp_rank, pos.dp_rank, pos.pp_rank, mc.tp, mc.dp, mc.pp);
    // The same pipeline split: the planner's layers on this pp rank = the runtime's chunks' layers.
    int64_t runtime_layers = 0;
    for (int ch = 0; ch < trainer.chunks(); ch++) {
      const StageRange& st = trainer.chunk(ch).options().stage;
      runtime_layers += st.last_layer - st.first_layer;
    }
    const int64_t planner_layers = plan::layers_per_rank(job.model, p)[size_t(pos.pp_rank)];
    if (planner_layers != runtime_layers)
      problems += fmt::format(" layers on pp rank {}: runtime {} planner {};", pos.pp_rank, runtime_layers,
                              planner_layers);
    const plan::CommBytes want = plan::bytes_sent_per_step(job.model, p, pos);
    std::map<std::string, int64_t> got = m.bytes;
    int64_t total = 0;
    for (int k = 0; k < plan::kCommKinds; k++) {
      const std::string name = plan::to_string(plan::CommKind(k));
      const int64_t g = got.count(name) ? got[name] : 0;
      total += g;
      if (g != want.bytes[size_t(k)])
        problems += fmt::format(" {}: runtime {} planner {};", name, g, want.bytes[size_t(k)]);
      got.erase(name);
    }
    for (const auto& [name, b] : got)
      if (b != 0 && name.rfind("world", 0) != 0) problems += fmt::format(" {}: runtime {} not in the planner;", name, b);
    // The evaluation's forward sends its stage outputs as training does (pipeline_dtype): one
    // message of act elements per stage this rank owns but the last, per batch (dp batches: one each).
    if (p.pp > 1) {
      run.rt->ledger().reset();
      trainer.evaluate(p.dp, [&](int64_t i, int32_t* tok, int32_t* tgt) {
        dist_test::val_batch(job.model.vocab, i, cfg.micro_batch, job.model.seq_len, tok, tgt);
      });
      const int S = int(p.pp * p.vp);
      int64_t sends = 0;
      for (int s = 0; s + 1 < S; s++) sends += s % int(p.pp) == pos.pp_rank;  // stage s on pp rank s mod pp
      const int64_t act = cfg.micro_batch * job.model.seq_len * job.model.hidden / (p.seq_parallel ? p.tp : 1);
      const int64_t want_eval = sends * act * p.pipeline_element_bytes();
      const int64_t got_eval = run.rt->ledger().bytes["pp_eval"];
      if (got_eval != want_eval)
        problems += fmt::format(" evaluation pp_eval: runtime {} expected {} ({} sends of {} elements);", got_eval,
                                want_eval, sends, act);
    }
    int bad = !problems.empty(), any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    for (int r = 0; r < world; r++) {
      MPI_Barrier(MPI_COMM_WORLD);
      if (r == rank && !problems.empty()) std::printf("  rank %d:%s\n", rank, problems.c_str());
      std::fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int64_t all_total = 0;
    MPI_Reduce(&total, &all_total, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    failures += any_bad;
    if (rank == 0)
      std::printf("%s np%d %-72s %lld bytes sent per step by all ranks, equal to the planner's per rank and kind\n",
                  any_bad ? "FAIL" : "OK  ", world, cs.name().c_str(), (long long)all_total);
    std::fflush(stdout);
  }
  if (rank == 0) std::printf("%d of %zu configurations failed\n", failures, configs.size());
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
