// The pipeline tables under NCCL's stream semantics (parallel/stream_order.hpp): build_pipeline's
// early receives deadlock there, posted call by call or in batches; in_steps' batches do not, for
// every schedule, and keep every message's peers and per-pair order.
#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "core/check.hpp"
#include "parallel/schedule.hpp"
#include "parallel/stream_order.hpp"

using namespace exatrain::parallel;

namespace {

// Every valid plan of a grid: the three schedules, pp 2, 3, 4 and 8, vp 1..3, 1..16 micro-batches
// (58 plans: m >= pp, and interleaved needs m % pp == 0).
std::vector<PipelinePlan> plans() {
  std::vector<PipelinePlan> out;
  for (PipeSchedule s : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved})
    for (int pp : {2, 3, 4, 8})
      for (int vp : {1, 2, 3})
        for (int m : {1, 2, 3, 4, 6, 8, 16}) {
          if ((s == PipeSchedule::interleaved) != (vp > 1)) continue;
          const PipelinePlan p{s, pp, vp, m};
          try {
            validate_pipeline(p);
          } catch (const exatrain::Error&) {
            continue;  // fewer micro-batches than stages, or interleaved with m % pp != 0
          }
          out.push_back(p);
        }
  return out;
}

std::string name(const PipelinePlan& p) {
  return fmt::format("{} pp {} vp {} m {}", to_string(p.schedule), p.pp, p.vp, p.micro_batches);
}

}  // namespace

// Receives posted one compute early (MPI's overlap) block NCCL's in-order stream: the first rank's
// receive of the first gradient sits ahead of its later sends, which the last rank needs first.
TEST(StreamOrder, EarlyReceivesDeadlockOnNcclStreams) {
  for (const PipelinePlan& p : plans()) {
    const PipelineTable t = build_pipeline(p);
    for (P2pPosting posting : {P2pPosting::per_call, P2pPosting::batched})
      EXPECT_EQ(stream_problem(t, posting).rfind("deadlock: rank 0", 0), 0u) << name(p) << " " << to_string(posting);
  }
  EXPECT_EQ(stream_problem(build_pipeline({PipeSchedule::gpipe, 2, 1, 2}), P2pPosting::per_call),
            "deadlock: rank 0 communication stream waits at RecvGrad(mb 0, chunk 0) from rank 1, compute stream waits "
            "at Backward(mb 0, chunk 0); rank 1 communication stream waits at RecvAct(mb 1, chunk 0) from rank 0, "
            "compute stream waits at Forward(mb 1, chunk 0)");
}

// Megatron's steps, each step's sends and the next step's receives as one NCCL group: no deadlock,
// no message out of order, and the schedule's bubble exactly (free transfers, several
// forward/backward time ratios), for every schedule. Call by call the steps still deadlock for
// 1F1B and interleaved (the batch is what lets a send and a receive progress together); GPipe's
// do not.
TEST(StreamOrder, StepsInNcclGroupsRunEveryScheduleAtItsBubble) {
  ASSERT_EQ(plans().size(), 58u);  // the grid docs/cuda.md quotes
  for (const PipelinePlan& p : plans()) {
    const PipelineTable t = build_pipeline(p), steps = in_steps(t);
    for (double t_bwd : {1.0, 2.0, 3.0}) {
      const StreamRun run = simulate_streams(steps, P2pPosting::batched, 1.0, t_bwd);
      EXPECT_EQ(run.problem, "") << name(p);
      EXPECT_NEAR(run.bubble_fraction, expected_bubble_fraction(p), 1e-9) << name(p) << " t_bwd " << t_bwd;
    }
    EXPECT_EQ(stream_problem(steps, P2pPosting::per_call).empty(), p.schedule == PipeSchedule::gpipe) << name(p);
    // The same actions, so MPI's simulation runs it as before (every unit once, every message used).
    for (int r = 0; r < p.pp; r++) {
      auto key = [](const Action& a) { return std::make_tuple(int(a.kind), a.mb, a.chunk, a.peer); };
      std::vector<std::tuple<int, int, int, int>> a, b;
      for (const Action& x : t.ranks[size_t(r)]) a.push_back(key(x));
      for (const Action& x : steps.ranks[size_t(r)]) b.push_back(key(x));
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(a, b) << name(p) << " rank " << r;
    }
    EXPECT_NEAR(simulate_pipeline(steps, 1, 2).bubble_fraction, expected_bubble_fraction(p), 1e-9) << name(p);
  }
}

// The batches of 1F1B (pp 2, 4 micro-batches; a step per compute: Megatron's
// send_forward_recv_backward after a forward, send_backward_recv_forward after a backward) and of
// the interleaved schedule (vp 2: a steady forward and backward are one step, then
// send_forward_backward_recv_forward_backward).
TEST(StreamOrder, StepsOfOneFOneBAndInterleaved) {
  auto text = [](const std::vector<Action>& row) {
    std::string s;
    for (const std::vector<Action>& batch : posting_batches(row)) {
      s += s.empty() ? "" : " | ";
      for (size_t i = 0; i < batch.size(); i++)
        s += fmt::format("{}{}{}{}", i ? " " : "", to_string(batch[i].kind), batch[i].mb, batch[i].chunk ? "b" : "");
    }
    return s;
  };
  const PipelineTable t = in_steps(build_pipeline({PipeSchedule::one_f_one_b, 2, 1, 4}));
  EXPECT_EQ(text(t.ranks[0]),
            "Forward0 | SendAct0 | Forward1 | SendAct1 RecvGrad0 | Backward0 | Forward2 | SendAct2 RecvGrad1 | "
            "Backward1 | Forward3 | SendAct3 RecvGrad2 | Backward2 | RecvGrad3 | Backward3");
  EXPECT_EQ(text(t.ranks[1]),
            "RecvAct0 | Forward0 | Backward0 | SendGrad0 RecvAct1 | Forward1 | Backward1 | SendGrad1 RecvAct2 | "
            "Forward2 | Backward2 | SendGrad2 RecvAct3 | Forward3 | Backward3 | SendGrad3");
  const PipelineTable i = in_steps(build_pipeline({PipeSchedule::interleaved, 2, 2, 4}));
  EXPECT_EQ(text(i.ranks[1]),
            "RecvAct0 | Forward0 | SendAct0 RecvAct1 | Forward1 | SendAct1 RecvAct0b | Forward0b | Backward0b | "
            "SendGrad0b RecvAct1b | Forward1b | Backward1b | SendGrad1b RecvAct2 RecvGrad0 | Forward2 | Backward0 | "
            "SendAct2 SendGrad0 RecvAct3 RecvGrad1 | Forward3 | Backward1 | SendAct3 SendGrad1 RecvAct2b | Forward2b | "
            "Backward2b | SendGrad2b RecvAct3b | Forward3b | Backward3b | SendGrad3b RecvGrad2 | Backward2 | SendGrad2 "
            "RecvGrad3 | Backward3 | SendGrad3");
}

// The order check: two sends to one peer swapped against its receives.
TEST(StreamOrder, MessagesOutOfOrderAreReported) {
  PipelineTable t = in_steps(build_pipeline({PipeSchedule::one_f_one_b, 2, 1, 4}));
  std::vector<Action>& row = t.ranks[0];
  auto first = std::find_if(row.begin(), row.end(), [](const Action& a) { return a.kind == ActionKind::send_act; });
  auto second = std::find_if(first + 1, row.end(), [](const Action& a) { return a.kind == ActionKind::send_act; });
  std::swap(first->mb, second->mb);
  EXPECT_EQ(stream_problem(t, P2pPosting::batched).rfind("order: rank 0 sends to rank 1 [act(mb 1, stage 1) act(mb 0, "
                                                          "stage 1)", 0),
            0u) << stream_problem(t, P2pPosting::batched);
}

// What the executor would refuse is reported, not thrown: a receive nobody sends, a compute posted
// before its receive.
TEST(StreamOrder, UnmatchedAndLateReceivesAreReported) {
  PipelineTable t = in_steps(build_pipeline({PipeSchedule::one_f_one_b, 2, 1, 2}));
  PipelineTable no_send = t;
  std::vector<Action>& row0 = no_send.ranks[0];
  row0.erase(std::remove_if(row0.begin(), row0.end(), [](const Action& a) { return a.kind == ActionKind::send_act; }),
             row0.end());
  EXPECT_EQ(stream_problem(no_send, P2pPosting::batched),
            "order: rank 1 receives [act(mb 0, stage 1) act(mb 1, stage 1)] from rank 0, which sends it nothing");
  PipelineTable late = t;
  std::vector<Action>& row1 = late.ranks[1];
  std::swap(row1[0], row1[1]);  // Forward0 before RecvAct0
  EXPECT_EQ(stream_problem(late, P2pPosting::batched), "order: rank 1 posts Forward(mb 0, chunk 0) before its receive");
}
