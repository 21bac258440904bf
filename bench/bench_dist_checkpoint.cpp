// Sharded checkpoints (train/checkpoint_io.hpp): time and memory of
// one save and one load of a GPT of about 30M parameters (hidden 512, 8 layers, vocab 8192; files
// of ~370 MB: weights + AdamW moments), for several parallel layouts of the world. Rank 0 prints,
// per layout: save and load seconds and throughput, and per rank the largest buffer the
// checkpoint code allocated, the bytes it wrote/read, and, next to the memory of its own trainer
// state, the growth of its resident memory during the save and during the load (peak minus the
// resident size before; the load maps the files, so the pages of its own slices count while
// mapped). Run from the repository root:
//   mpirun -np 2 build/bench/bench_dist_checkpoint [hidden layers]
#include <mpi.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "plan/resolve.hpp"
#include "train/trainer.hpp"
#include "train/checkpoint_io.hpp"
#include "train/every_rank.hpp"

using namespace exatrain;

namespace {

class NoTokens final : public TokenSource {  // the bench trains no step
 public:
  void next_batch(int64_t, int64_t, int32_t*, int32_t*) override {}
  uint64_t position() const override { return 0; }
  void seek(uint64_t) override {}
};

int64_t status_kib(const char* key) {  // a line of /proc/self/status, e.g. "VmHWM:"
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key));
  return 0;
}

// Resets the peak resident memory (VmHWM) to the current one (Linux: clear_refs 5) and returns it.
int64_t reset_peak_bytes() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return status_kib("VmRSS:") * 1024;
}
int64_t peak_bytes() { return status_kib("VmHWM:") * 1024; }

constexpr int kFields = 6;  // gathered per rank

struct Layout {
  int dp, tp, pp, zero;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);  // the trainer needs FUNNELED
  EXA_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level {}, below MPI_THREAD_FUNNELED", provided);
  const auto [rank, world] = world_rank_size();
  omp_set_num_threads(1);
  Job job;
  job.source = "bench";
  job.model.hidden = argc > 1 ? std::atoll(argv[1]) : 512;
  job.model.layers = argc > 2 ? std::atoll(argv[2]) : 8;
  job.model.heads = 8, job.model.kv_heads = 8, job.model.ffn_hidden = 4 * job.model.hidden;
  job.model.seq_len = 64, job.model.vocab = 8192;
  std::vector<Layout> layouts = {{world, 1, 1, 0}, {world, 1, 1, 3}};
  if (world % 2 == 0) layouts.push_back({world / 2, 2, 1, 1}), layouts.push_back({world / 2, 1, 2, 2});
  auto backend = make_cpu_backend(1);
  char tmpl[] = "/tmp/exatrain-bench-ckpt-XXXXXX";
  std::string root;
  if (rank == 0) root = mkdtemp(tmpl);
  broadcast_from_rank0(root, MPI_COMM_WORLD, nullptr, "MPI_Bcast (bench directory)");
  for (const Layout& l : layouts) {
    ParallelSpec& p = job.parallel;
    p.gpus = world, p.dp = l.dp, p.tp = l.tp, p.pp = l.pp, p.cp = 1, p.vp = 1, p.zero = l.zero;
    p.micro_batch = 1, p.global_batch = 2 * l.dp * l.pp, p.recompute = Recompute::none;
    p.seq_parallel = false, p.schedule = Schedule::one_f_one_b;
    const plan::Plan plan = plan::plan_from_job(job, world);
    parallel::ParallelRuntime rt(MPI_COMM_WORLD,
                                 parallel::MeshShape{int(plan.tp), int(plan.cp), int(plan.dp), int(plan.pp)}, *backend);
    NoTokens tokens;
    TrainerOptions o = trainer_options(job, plan);
    o.peak_gflops = 1;
    Trainer trainer(*backend, rt, o, tokens);
    int64_t state = 0;  // bytes of this rank's own parameters, moments (and ZeRO shards)
    for (const auto& s : trainer.state_slices()) state += int64_t(sizeof(float)) * (s.end - s.begin);
    TrainerExtras ex;
    ex.data_cursor_json = "{\"position\": 0}";
    MPI_Barrier(MPI_COMM_WORLD);
    int64_t before = reset_peak_bytes();
    double t0 = MPI_Wtime();
    std::string dir = save_checkpoint(trainer, MPI_COMM_WORLD, root, ex, 1);
    const double save_s = MPI_Wtime() - t0;
    const int64_t save_growth = peak_bytes() - before;
    const CheckpointIoStats saved = last_checkpoint_io_stats();
    broadcast_from_rank0(dir, MPI_COMM_WORLD, nullptr, "MPI_Bcast (bench checkpoint)");
    MPI_Barrier(MPI_COMM_WORLD);
    before = reset_peak_bytes();
    t0 = MPI_Wtime();
    load_checkpoint(trainer, MPI_COMM_WORLD, dir);
    const double load_s = MPI_Wtime() - t0;
    const int64_t load_growth = peak_bytes() - before;
    const CheckpointIoStats loaded = last_checkpoint_io_stats();
    const int64_t mine[kFields] = {std::max(saved.largest_buffer_bytes, loaded.largest_buffer_bytes),
                                   saved.moved_bytes, loaded.moved_bytes, state, save_growth, load_growth};
    std::vector<int64_t> all(size_t(kFields * world));
    MPI_Gather(mine, kFields, MPI_INT64_T, all.data(), kFields, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const double gb = double(saved.file_data_bytes) / 1e9;
      fmt::print("dp{} tp{} pp{} zero{}: checkpoint {:.0f} MB of tensors; save {:.2f} s ({:.2f} GB/s incl. rank 0's "
                 "SHA-256 read-back), load {:.2f} s ({:.2f} GB/s incl. rank 0's SHA-256)\n",
                 l.dp, l.tp, l.pp, l.zero, gb * 1e3, save_s, gb / save_s, load_s, gb / load_s);
      for (int r = 0; r < world; r++) {
        const int64_t* a = &all[size_t(kFields * r)];
        fmt::print("  rank {}: own state {:.1f} MB; wrote {:.1f} MB, read {:.1f} MB; largest checkpoint buffer "
                   "{:.1f} KB; resident memory grew by {:.1f} MB during the save, {:.1f} MB during the load\n", r,
                   a[3] / 1e6, a[1] / 1e6, a[2] / 1e6, a[0] / 1e3, a[4] / 1e6, a[5] / 1e6);
      }
      std::fflush(stdout);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Finalize();
  return 0;
}
