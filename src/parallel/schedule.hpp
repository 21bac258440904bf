// Pipeline schedules as per-rank action tables: pure functions, no MPI (run by executor.hpp).
//
// Stages: with pp ranks and vp virtual stages (model chunks) per rank there are S = pp * vp
// stages; stage s = chunk * pp + rank (Megatron's interleaving: rank r holds chunks r, r+pp, ...).
// A "unit" is one (micro-batch, chunk) pair; rank r runs m * vp forward and m * vp backward units.
//
//   gpipe        all m forwards, then all m backwards (vp must be 1); peak in flight m.
//   1f1b         (PipeDream-Flush) warm-up of w = min(pp - r - 1, m) forwards, steady state of
//                (forward, backward) pairs, cool-down of w backwards; peak in flight min(pp-r, m).
//   interleaved  1f1b with vp > 1 (Narayanan et al. 2021, Megatron's order): warm-up
//                w = min(2 (pp - r - 1) + (vp - 1) pp, m vp) units; peak in flight min(w+1, m vp);
//                needs m divisible by pp.
// Bubble fraction (idle over busy time, equal stage costs, free communication):
//   (pp - 1) / m for gpipe and 1f1b, (pp - 1) / (vp m) for interleaved.
//
// Communication actions around each compute: RecvAct before a forward of stage s > 0, SendAct
// after a forward of stage s < S-1, RecvGrad before a backward of stage s < S-1, SendGrad after a
// backward of stage s > 0. Receives are posted one compute early (the receive of compute k+1 is
// listed before compute k) so that the message can arrive while compute k runs. All sends and
// receives are non-blocking; a compute waits only for its own input. in_steps (below) reorders a
// table for NCCL, which runs them in posting order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "plan/stages.hpp"

namespace exatrain::parallel {

enum class PipeSchedule { gpipe, one_f_one_b, interleaved };
enum class ActionKind { forward, backward, send_act, recv_act, send_grad, recv_grad };
inline bool is_compute(ActionKind k) { return k == ActionKind::forward || k == ActionKind::backward; }
inline bool is_send(ActionKind k) { return k == ActionKind::send_act || k == ActionKind::send_grad; }
enum class Phase { warmup, steady, cooldown };
const char* to_string(PipeSchedule);
const char* to_string(ActionKind);
const char* to_string(Phase);

struct Action {
  ActionKind kind;
  int mb = 0;      // micro-batch
  int chunk = 0;   // model chunk on THIS rank (0 .. vp-1)
  int peer = -1;   // pp rank sent to / received from (-1 for compute)
  Phase phase = Phase::warmup;
};

struct PipelinePlan {
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  int pp = 1, vp = 1, micro_batches = 1;
  int stages() const { return pp * vp; }
};

struct PipelineTable {
  PipelinePlan plan;
  std::vector<std::vector<Action>> ranks;  // [pp][actions in execution order]
};

// Validates (errors print the equation) and builds every rank's table.
//   "fewer micro-batches than stages": micro_batches 2 < pp 4
//   interleaved: micro_batches 6 % pp 4 = 2 (must be 0); vp > 1 needs pp > 1; gpipe needs vp 1.
void validate_pipeline(const PipelinePlan& plan);
// The pipeline of a resolved plan: pp, vp, micro-batches per step, and its schedule (GPipe, or
// 1F1B, interleaved when vp > 1). Checks nothing: plan_problem's rules hold for a resolved plan.
PipelinePlan pipeline_plan(const plan::Plan& p);
PipelineTable build_pipeline(const PipelinePlan& plan);

int stage_of(const PipelinePlan& plan, int rank, int chunk);
int warmup_units(const PipelinePlan& plan, int rank);
int expected_peak_in_flight(const PipelinePlan& plan, int rank);
double expected_bubble_fraction(const PipelinePlan& plan);

// The same table posted in Megatron's steps, as a GPU runtime must post it (NCCL runs a rank's
// sends and receives in the order they were posted, each blocking its stream until the peer's
// matching call runs: parallel/stream_order.hpp). A step's receives are listed just before its
// computes and its sends just after them, so that between two steps one run of actions sends the
// outputs of the step before and receives the inputs of the step after. A step is one compute
// for GPipe and 1F1B (Megatron's send_forward_recv_backward, send_backward_recv_forward); with vp
// > 1 a warm-up forward, a steady forward with the backward after it, or a cool-down backward
// (Megatron's interleaved send_forward_backward_recv_forward_backward). Every message keeps its
// peers and the per-pair order of build_pipeline's table.
PipelineTable in_steps(const PipelineTable& table);

// A rank's row as the executor posts it: each compute alone, each run of consecutive sends and
// receives as one batch (Group::post_p2p: one NCCL group on a GPU, each call its own MPI request).
std::vector<std::vector<Action>> posting_batches(const std::vector<Action>& row);

// Simulated execution with per-unit forward and backward times (one chunk = one unit) and free
// communication. Checks as it goes and throws exatrain::Error on: a backward before its forward,
// a unit run twice or never, a receive without a matching send (or with the wrong peer), and
// deadlock (every unfinished rank waiting for a message nobody will send).
struct SimSlot {
  double start = 0, end = 0;
  ActionKind kind;  // forward or backward
  int mb = 0, chunk = 0;
};
struct SimResult {
  double makespan = 0;               // time the last rank finishes
  double busy_per_rank = 0;          // m * vp * (t_fwd + t_bwd)
  double bubble_fraction = 0;        // (makespan - busy) / busy
  std::vector<int> peak_in_flight;   // [pp] max forwards not yet backwarded
  std::vector<std::vector<SimSlot>> timeline;  // [pp] computes in time order
};
SimResult simulate_pipeline(const PipelineTable& table, double t_fwd, double t_bwd);

// Text picture of a simulated schedule with integer unit times: one row per rank, one cell per
// time unit, "F3" / "B3" (micro-batch 3; "F3b" = chunk 1 when vp > 1) and "." when idle, e.g.
// 1F1B, pp 2, m 2, t_fwd 1, t_bwd 2:
//   rank 0 | F0 F1 .  .  B0 B0 .  B1 B1
//   rank 1 | .  F0 B0 B0 F1 B1 B1 .  .
std::string render_timeline(const PipelineTable& table, const SimResult& sim);

// Stage balancing lives in plan/stages.hpp, shared with the planner so that both split the layers
// the same way; the runtime names it from here.
using plan::StageLayers;
using plan::balance_stages;
using plan::stages_from_list;

}  // namespace exatrain::parallel
