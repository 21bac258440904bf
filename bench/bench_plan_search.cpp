// Timing of `exatrain plan`'s exhaustive search (the target: under 1 s on one core for
// a 1T model on all of Frontier). Not a unit test: run build/bench/bench_plan_search.
// For each case it runs the search `repeats` times and prints the median wall and CPU time
// (CPU time = this process's user+system, so a busy shared machine shows in wall, not CPU).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/search.hpp"

namespace {

double cpu_seconds() {
  timespec ts{};
  EXA_SYSCHECK(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0, "clock_gettime");
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::stoi(argv[1]) : 5;
  const std::string dir = std::string(EXATRAIN_SOURCE_DIR) + "/docs/frontier/";
  struct Case { const char* model; int64_t nodes, global_batch; };
  // The Frontier study's three models on the whole machine (the slowest searches we know: the
  // GPU count with the most divisors and the deepest models), and the 1T model on 384 nodes.
  const Case cases[] = {{"gpt3-1t", 9408, 18816}, {"gpt3-175b", 9408, 18816},
                        {"gpt3-22b", 9408, 18816}, {"gpt3-1t", 384, 1536}};
  fmt::print("{:<10} {:>6} {:>7} {:>10} {:>9} {:>9} {:>12} {:>12}\n", "model", "nodes", "gpus",
             "searched", "evaluated", "feasible", "wall_s(med)", "cpu_s(med)");
  for (const Case& c : cases) {
    int64_t gpus = c.nodes * 8;
    exatrain::Job job = exatrain::load_job(
        dir + c.model + ".toml", {fmt::format("parallel.gpus={}", gpus),
                                  fmt::format("parallel.global_batch={}", c.global_batch)});
    std::vector<double> wall, cpu;
    exatrain::plan::SearchResult r;
    for (int i = 0; i < repeats; ++i) {
      double c0 = cpu_seconds();
      auto w0 = std::chrono::steady_clock::now();
      r = exatrain::plan::search_plans(job.model, job.machine, job.parallel, job.train.precision,
                                       5, exatrain::plan::default_calibration(), 0.10);
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
      cpu.push_back(cpu_seconds() - c0);
    }
    fmt::print("{:<10} {:>6} {:>7} {:>10} {:>9} {:>9} {:>12.3f} {:>12.3f}\n", c.model, c.nodes,
               gpus, r.searched, r.evaluated, r.feasible, median(wall), median(cpu));
  }
  return 0;
}
