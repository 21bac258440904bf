// Topology-independent, sharded checkpoints on 4 ranks: a run saved at tp2 x pp2 (sequence
// parallel) resumes at dp4 (ZeRO 1), runs saved at dp4 (ZeRO 3, ZeRO 2, ZeRO 0) resume at
// tp2 x pp2 (the last interleaved, vp 2), vp 2 resumes at dp2 x tp2 (ZeRO 1), which resumes at
// dp4 (ZeRO 0), a single-rank run's checkpoint resumes at dp4 (ZeRO 3) and a tp2 x pp2 one on a
// single rank (the same writer and reader, on MPI_COMM_SELF); in all cases the 5 steps after the resume have the losses of an uninterrupted 10-step
// run (1e-5 relative) and end on its weights. Every distributed save and load also checks the
// memory bound of the sharded checkpoint code (memory_bound_holds). Exits non-zero on any mismatch.
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "checkpoint/checkpoint.hpp"
#include "train/checkpoint_io.hpp"
#include "train/every_rank.hpp"
#include "train/state_io.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using namespace exatrain::parallel;
using dist_test::Config;

namespace {

// The sharded save and load stay within each rank's own state: no buffer of the checkpoint code
// (tensor list, header) exceeds the rank's slices, nor a quarter of the checkpoint (the old
// gather to rank 0 needed all of it); a rank moves only its slices' bytes; and a save writes every
// element of the two files exactly once over all ranks (the moved bytes add up to the files').
bool memory_bound_holds(const char* what, const Config& c, const CheckpointIoStats& st, bool save, int rank) {
  int64_t moved = 0;
  MPI_Allreduce(&st.moved_bytes, &moved, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  int mine = st.largest_buffer_bytes <= st.slice_bytes && st.largest_buffer_bytes < st.file_data_bytes / 4 &&
             st.moved_bytes <= st.slice_bytes && (!save || moved == st.file_data_bytes);
  int ok = 0;
  MPI_Allreduce(&mine, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::printf("%s %s at [%s], rank %d: largest buffer %lld B, slices %lld B, moved %lld B (all ranks %lld B), "
              "files' tensors %lld B\n", ok ? "OK  " : "FAIL", what, c.name().c_str(), rank,
              (long long)st.largest_buffer_bytes, (long long)st.slice_bytes, (long long)st.moved_bytes,
              (long long)moved, (long long)st.file_data_bytes);
  std::fflush(stdout);
  return ok;
}

uint64_t cursor_of(const TrainerExtras& ex) {
  return std::stoull(ex.data_cursor_json.substr(ex.data_cursor_json.find(':') + 1));
}

struct SingleRun {
  std::unique_ptr<parallel::ParallelRuntime> rt;
  std::unique_ptr<dist_test::SyntheticSource> src;
  std::unique_ptr<Trainer> trainer;
};

// The Trainer of `job` on one rank (rank 0 alone: MPI_COMM_SELF), resumed from checkpoint `dir`
// unless it is "", by the same checkpoint reader as every run.
SingleRun single_rank(Backend& be, const Job& job, const std::string& dir) {
  const TrainerOptions o = dist_test::single_rank_options(job);
  SingleRun r;
  r.rt = parallel::ParallelRuntime::local(be);
  r.src = std::make_unique<dist_test::SyntheticSource>(job.model.vocab, 0, 1);
  r.trainer = std::make_unique<Trainer>(be, *r.rt, o, *r.src);
  if (!dir.empty()) r.src->seek(cursor_of(load_checkpoint(*r.trainer, MPI_COMM_SELF, dir)));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const dist_test::World mpi = dist_test::start_mpi(argc, argv);
  const int rank = mpi.rank;
  auto backend = make_cpu_backend(1);
  const int steps = 10, half = 5;
  Config tp_pp;  // global batch 4 = 1 x 4 micro-batches x dp 1
  tp_pp.tp = 2, tp_pp.pp = 2, tp_pp.sp = true;
  Config dp4;    // global batch 4 = 1 x 1 micro-batch x dp 4
  dp4.dp = 4, dp4.micro_batches = 1;
  const dist_test::Reference ref = dist_test::run_single_rank(dist_test::job_for(tp_pp, steps));

  // A directory every rank sees (every rank writes its slices of the checkpoint, and reads them).
  const std::string root = dist_test::shared_temp_dir("dist-ckpt");

  // Every case saves at step 5 and resumes to step 10; "single" is the single-rank Trainer (on
  // rank 0), whose checkpoints are the same format: interchangeable with the distributed ones.
  int failures = 0;
  struct Case { Config save, resume; int save_zero, resume_zero; bool single_save, single_resume; };
  Config vp2 = tp_pp;  // interleaved: two model chunks per rank
  vp2.vp = 2;
  Config dp2_tp2;      // global batch 4 = 1 x 2 micro-batches x dp 2
  dp2_tp2.dp = 2, dp2_tp2.tp = 2, dp2_tp2.micro_batches = 2;
  Config dp2_pp2;      // ZeRO 3 with a pipeline: the tied embedding's two copies are sharded segments
  dp2_pp2.dp = 2, dp2_pp2.pp = 2, dp2_pp2.micro_batches = 2;
  const Case cases[] = {{tp_pp, dp4, 0, 1, false, false},   {dp4, tp_pp, 3, 0, false, false},
                        {dp4, tp_pp, 2, 0, false, false},   {dp4, vp2, 0, 0, false, false},
                        {vp2, dp2_tp2, 0, 1, false, false}, {dp2_tp2, dp4, 1, 0, false, false},
                        {tp_pp, dp4, 0, 3, true, false},    {tp_pp, tp_pp, 0, 0, false, true},
                        {dp2_pp2, tp_pp, 3, 0, false, false}, {tp_pp, dp2_pp2, 0, 3, false, false}};
  int case_index = 0;
  for (Case cs : cases) {
    cs.save.zero = cs.save_zero, cs.resume.zero = cs.resume_zero;
    const std::string dir_root = fmt::format("{}/case{}", root, case_index++);
    const std::string save_name = cs.single_save ? "single rank" : cs.save.name();
    const std::string resume_name = cs.single_resume ? "single rank" : cs.resume.name();
    std::string saved;
    if (cs.single_save && rank == 0) {
      SingleRun a = single_rank(*backend, dist_test::job_for(cs.save, steps), "");
      for (int s = 0; s < half; s++) a.trainer->train_step();
      TrainerExtras ex;
      ex.data_cursor_json = fmt::format("{{\"position\": {}}}", a.src->position());
      saved = save_checkpoint(*a.trainer, MPI_COMM_SELF, dir_root, ex, 2);
    } else if (!cs.single_save) {
      dist_test::DistRun a = dist_test::make_run(*backend, dist_test::job_for(cs.save, steps));
      for (int s = 0; s < half; s++) a.trainer->train_step();
      TrainerExtras ex;
      ex.data_cursor_json = fmt::format("{{\"position\": {}}}", a.src->position());
      saved = save_checkpoint(*a.trainer, MPI_COMM_WORLD, dir_root, ex, 2);
      failures += !memory_bound_holds("save", cs.save, last_checkpoint_io_stats(), true, rank);
    }
    broadcast_from_rank0(saved, MPI_COMM_WORLD, nullptr, "MPI_Bcast (test checkpoint)");

    double worst = 0, w = 0;
    std::string trace;
    int64_t final_step = 0;
    auto track = [&](int s, double loss) {
      worst = dist_test::worst_of(worst, dist_test::rel_diff(loss, ref.losses[size_t(s)]));
      trace += fmt::format(" {:.6f}/{:.6f}", loss, ref.losses[size_t(s)]);
    };
    if (cs.single_resume) {
      if (rank == 0) {
        SingleRun b = single_rank(*backend, dist_test::job_for(cs.resume, steps), saved);
        for (int s = half; s < steps; s++) track(s, b.trainer->train_step().loss);
        w = dist_test::max_weight_diff(b.trainer->model(), ref);
        final_step = b.trainer->step();
      }
      MPI_Bcast(&final_step, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    } else {
      dist_test::DistRun b = dist_test::make_run(*backend, dist_test::job_for(cs.resume, steps));
      TrainerExtras ex = load_checkpoint(*b.trainer, MPI_COMM_WORLD, saved);
      failures += !memory_bound_holds("load", cs.resume, last_checkpoint_io_stats(), false, rank);
      b.src->seek(cursor_of(ex));
      for (int s = half; s < steps; s++) track(s, b.trainer->train_step().loss);
      b.trainer->gather_full_params();
      for (int c = 0; c < b.trainer->chunks(); c++) w = dist_test::worst_of(w, dist_test::max_weight_diff(b.trainer->chunk(c), ref));
      final_step = b.trainer->step();
    }
    double mine[2] = {worst, w}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const bool ok = all[0] <= 1e-5 && all[1] <= 1e-4 && final_step == steps;
    failures += !ok;
    if (rank == 0)
      std::printf("%s saved at [%s] step %d, resumed at [%s]: steps 6-10 loss rel diff %.2e, weight diff %.2e vs "
                  "an uninterrupted run; losses (resumed/uninterrupted)%s\n",
                  ok ? "OK  " : "FAIL", save_name.c_str(), half, resume_name.c_str(), all[0], all[1], trace.c_str());
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
