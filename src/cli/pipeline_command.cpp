// `exatrain pipeline`: shows a pipeline schedule — the per-rank action tables the executor runs,
// a simulated timeline, peak micro-batches in flight and the bubble against its formula.
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/prediction_chart.hpp"
#include "parallel/schedule.hpp"
#include "report/figures.hpp"

namespace exatrain::cli {
namespace {
// The simulated schedule as a timeline figure: one lane per pipeline rank, a box per forward or
// backward of one (micro-batch, chunk), labelled with the micro-batch; colour = direction, chunk.
report::TimelineChart timeline_chart(const parallel::PipelineTable& t, const parallel::SimResult& sim,
                                     double t_fwd, double t_bwd) {
  const parallel::PipelinePlan& plan = t.plan;
  report::TimelineChart c;
  c.title = fmt::format("{}, pp {}, vp {}, {} micro-batches: bubble fraction {:.4f}", parallel::to_string(plan.schedule),
                        plan.pp, plan.vp, plan.micro_batches, sim.bubble_fraction);
  c.x_label = fmt::format("time (one chunk's forward = {}, backward = {} units)", t_fwd, t_bwd);
  for (const char* dir : {"forward", "backward"})
    for (int chunk = 0; chunk < plan.vp; chunk++)
      c.legend.push_back(plan.vp > 1 ? fmt::format("{}, chunk {}", dir, chunk) : std::string(dir));
  for (int r = 0; r < plan.pp; r++) {
    c.lanes.push_back(fmt::format("rank {}", r));
    c.boxes.emplace_back();
    for (const parallel::SimSlot& s : sim.timeline[size_t(r)])
      c.boxes.back().push_back({s.start, s.end, fmt::format("{}", s.mb),
                                (s.kind == parallel::ActionKind::backward ? plan.vp : 0) + s.chunk});
  }
  return c;
}
}  // namespace

void add_pipeline_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("pipeline", "show a pipeline schedule (action tables, timeline)");
  struct Opts {
    std::string schedule = "1f1b", svg;
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
  cmd->add_option("--svg", o->svg, "also draw the simulated timeline (SVG)");
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
    if (!o->svg.empty()) {
      write_figure(o->svg, report::timeline_svg(timeline_chart(t, sim, o->t_fwd, o->t_bwd)));
      fmt::print("\ntimeline: {}\n", o->svg);
    }
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
