// `exatrain pipeline`: shows a pipeline schedule — the per-rank action tables the executor runs,
// a simulated timeline, peak micro-batches in flight and the bubble against its formula.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "parallel/schedule.hpp"

namespace exatrain::cli {

void add_pipeline_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("pipeline", "show a pipeline schedule (action tables, timeline)");
  struct Opts {
    std::string schedule = "1f1b";
    int pp = 4, vp = 1, m = 8, rank = -1;
    double t_fwd = 1, t_bwd = 2;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--schedule", o->schedule, "gpipe | 1f1b (interleaved when --vp > 1)")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  cmd->add_option("--pp", o->pp, "pipeline ranks");
  cmd->add_option("--vp", o->vp, "virtual stages (model chunks) per rank");
  cmd->add_option("--micro-batches,-m", o->m, "micro-batches per step");
  cmd->add_option("--fwd", o->t_fwd, "forward time of one chunk, in timeline units");
  cmd->add_option("--bwd", o->t_bwd, "backward time of one chunk, in timeline units");
  cmd->add_option("--rank", o->rank, "also list this rank's action table");
  cmd->callback([o] {
    parallel::PipelinePlan plan;
    plan.pp = o->pp;
    plan.vp = o->vp;
    plan.micro_batches = o->m;
    plan.schedule = o->schedule == "gpipe" ? parallel::PipeSchedule::gpipe
                    : o->vp > 1            ? parallel::PipeSchedule::interleaved
                                           : parallel::PipeSchedule::one_f_one_b;
    parallel::PipelineTable t = parallel::build_pipeline(plan);
    parallel::SimResult sim = parallel::simulate_pipeline(t, o->t_fwd, o->t_bwd);
    fmt::print("{} schedule, pp {} vp {}, {} micro-batches (forward {} / backward {} per chunk)\n",
               parallel::to_string(plan.schedule), plan.pp, plan.vp, plan.micro_batches, o->t_fwd,
               o->t_bwd);
    fmt::print("bubble fraction {:.4f} simulated, {:.4f} = (pp-1)/(vp*m) expected\n",
               sim.bubble_fraction, parallel::expected_bubble_fraction(plan));
    for (int r = 0; r < plan.pp; r++)
      fmt::print("rank {}: warm-up {} units, peak in flight {} (formula {})\n", r,
                 parallel::warmup_units(plan, r), sim.peak_in_flight[r],
                 parallel::expected_peak_in_flight(plan, r));
    bool integral = o->t_fwd == int(o->t_fwd) && o->t_bwd == int(o->t_bwd);
    if (integral && sim.makespan <= 400) fmt::print("\n{}", parallel::render_timeline(t, sim));
    if (o->rank >= 0 && o->rank < plan.pp) {
      fmt::print("\nrank {} actions:\n", o->rank);
      for (const parallel::Action& a : t.ranks[o->rank]) {
        std::string peer = a.peer >= 0 ? fmt::format(" peer {}", a.peer) : "";
        fmt::print("  {:<8} {}(mb {}, chunk {}){}\n", parallel::to_string(a.phase),
                   parallel::to_string(a.kind), a.mb, a.chunk, peer);
      }
    }
  });
}

}  // namespace exatrain::cli
