// Resident memory of one rank of the distributed trainer per ZeRO stage (Linux /proc/self/status:
// VmRSS now, VmHWM = peak), on the GPT-2 124M shape (12 x 768, vocab 50,257, seq 128, B = 1) at
// dp = world size: after construction and after one training step of m micro-batches. One stage
// per process, so that the peak is that stage's (docs/parallel.md, "ZeRO memory"):
//   for z in 0 1 2 3; do mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/parallel/bench_zero_memory --zero $z; done
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/backend.hpp"
#include "dist_common.hpp"
#include "plan/resolve.hpp"
#include "train/trainer.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

namespace {
double status_mib(const char* key) {  // a "VmXXX:   123 kB" line of /proc/self/status, in MiB
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(std::strlen(key))) / 1024.0;
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  const dist_test::World w = dist_test::start_mpi(argc, argv);
  dist_test::Config c;
  c.dp = w.size;
  c.micro_batches = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--zero")) c.zero = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--m")) c.micro_batches = std::atoi(argv[i + 1]);
  }
  Job job = dist_test::job_for(c, 1);
  ModelSpec& m = job.model;
  m.layers = 12, m.hidden = 768, m.heads = 12, m.kv_heads = 12, m.ffn_hidden = 3072, m.vocab = 50257, m.seq_len = 128;
  {
    const plan::Plan plan = plan::plan_from_job(job, w.size);
    auto be = make_cpu_backend(1);
    ParallelRuntime rt(MPI_COMM_WORLD, MeshShape{int(plan.tp), int(plan.cp), int(plan.dp), int(plan.pp)}, *be);
    dist_test::SyntheticSource src(m.vocab, rt.dp().rank(), rt.dp().size());
    TrainerOptions o = trainer_options(job, plan);
    o.peak_gflops = 1;
    Trainer t(*be, rt, o, src);
    const double built = status_mib("VmRSS:"), built_peak = status_mib("VmHWM:");
    t.train_step();
    const double stepped = status_mib("VmRSS:"), peak = status_mib("VmHWM:");
    if (w.rank == 0)
      std::printf("dp %d zero %d m %lld: model %.0f MiB of fp32 weights; rank 0 resident after construction %.0f MiB "
                  "(peak %.0f), after one step %.0f MiB (peak %.0f)\n",
                  w.size, c.zero, (long long)c.micro_batches, double(t.params_on_rank()) * 4 / 1048576, built,
                  built_peak, stepped, peak);
  }
  MPI_Finalize();
  return 0;
}
