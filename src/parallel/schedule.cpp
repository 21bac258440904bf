#include "parallel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/check.hpp"

namespace exatrain::parallel {

const char* to_string(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe: return "gpipe";
    case PipeSchedule::one_f_one_b: return "1f1b";
    case PipeSchedule::interleaved: return "interleaved-1f1b";
  }
  return "?";
}
const char* to_string(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "Forward";
    case ActionKind::backward: return "Backward";
    case ActionKind::send_act: return "SendAct";
    case ActionKind::recv_act: return "RecvAct";
    case ActionKind::send_grad: return "SendGrad";
    case ActionKind::recv_grad: return "RecvGrad";
  }
  return "?";
}
const char* to_string(Phase p) {
  switch (p) {
    case Phase::warmup: return "warmup";
    case Phase::steady: return "steady";
    case Phase::cooldown: return "cooldown";
  }
  return "?";
}

void validate_pipeline(const PipelinePlan& p) {
  EXA_CHECK(p.pp >= 1 && p.vp >= 1 && p.micro_batches >= 1,
            "[parallel] pp, vp and micro-batches per step must be >= 1: pp {} vp {} micro_batches {}",
            p.pp, p.vp, p.micro_batches);
  EXA_CHECK(p.micro_batches >= p.pp,
            "[parallel] a pipeline needs at least as many micro-batches as stages: micro_batches {} "
            "< pp {}",
            p.micro_batches, p.pp);
  if (p.schedule == PipeSchedule::interleaved) {
    EXA_CHECK(p.vp > 1, "[parallel] the interleaved schedule needs vp > 1, got vp {}", p.vp);
    EXA_CHECK(p.pp > 1, "[parallel] interleaving (vp {} > 1) needs pp > 1, got pp {}", p.vp, p.pp);
    EXA_CHECK(p.micro_batches % p.pp == 0,
              "[parallel] interleaved 1F1B needs micro-batches divisible by pp: micro_batches {} % "
              "pp {} = {}",
              p.micro_batches, p.pp, p.micro_batches % p.pp);
  } else {
    EXA_CHECK(p.vp == 1, "[parallel] schedule {} runs one chunk per rank: vp must be 1, got vp {}",
              to_string(p.schedule), p.vp);
  }
}

PipelinePlan pipeline_plan(const plan::Plan& p) {
  PipelinePlan r;
  r.pp = int(p.pp);
  r.vp = int(p.vp);
  r.micro_batches = int(p.micro_batches());
  r.schedule = p.schedule == Schedule::gpipe ? PipeSchedule::gpipe
               : p.vp > 1                    ? PipeSchedule::interleaved
                                             : PipeSchedule::one_f_one_b;
  return r;
}

int stage_of(const PipelinePlan& p, int rank, int chunk) { return chunk * p.pp + rank; }

int warmup_units(const PipelinePlan& p, int rank) {
  int units = p.micro_batches * p.vp;
  switch (p.schedule) {
    case PipeSchedule::gpipe: return units;
    case PipeSchedule::one_f_one_b: return std::min(p.pp - rank - 1, units);
    case PipeSchedule::interleaved:
      return std::min(2 * (p.pp - rank - 1) + (p.vp - 1) * p.pp, units);
  }
  return units;
}

int expected_peak_in_flight(const PipelinePlan& p, int rank) {
  int m = p.micro_batches;
  switch (p.schedule) {
    case PipeSchedule::gpipe: return m;
    case PipeSchedule::one_f_one_b: return std::min(p.pp - rank, m);
    case PipeSchedule::interleaved:
      return std::min(2 * (p.pp - rank - 1) + (p.vp - 1) * p.pp + 1, m * p.vp);
  }
  return m;
}

double expected_bubble_fraction(const PipelinePlan& p) {
  return double(p.pp - 1) / (double(p.vp) * p.micro_batches);
}

namespace {

struct Compute {
  ActionKind kind;
  int mb, chunk;
  Phase phase;
};

// Megatron's unit order: groups of pp micro-batches sweep the chunks (forward 0..vp-1, backward
// vp-1..0). With vp = 1 it is simply micro-batch k.
int unit_mb(const PipelinePlan& p, int k) { return (k / (p.pp * p.vp)) * p.pp + k % p.pp; }
int unit_chunk(const PipelinePlan& p, int k, bool forward) {
  int c = (k / p.pp) % p.vp;
  return forward ? c : p.vp - 1 - c;
}

std::vector<Compute> compute_order(const PipelinePlan& p, int rank) {
  int units = p.micro_batches * p.vp;
  std::vector<Compute> out;
  auto F = [&](int k, Phase ph) {
    out.push_back({ActionKind::forward, unit_mb(p, k), unit_chunk(p, k, true), ph});
  };
  auto B = [&](int k, Phase ph) {
    out.push_back({ActionKind::backward, unit_mb(p, k), unit_chunk(p, k, false), ph});
  };
  if (p.schedule == PipeSchedule::gpipe) {
    // All forwards (the fill) then all backwards (the drain); no steady phase.
    for (int k = 0; k < units; k++) F(k, Phase::warmup);
    for (int k = 0; k < units; k++) B(k, Phase::cooldown);
    return out;
  }
  int w = warmup_units(p, rank);
  for (int k = 0; k < w; k++) F(k, Phase::warmup);
  for (int i = 0; i < units - w; i++) {
    F(w + i, Phase::steady);
    B(i, Phase::steady);
  }
  for (int k = units - w; k < units; k++) B(k, Phase::cooldown);
  return out;
}

}  // namespace

PipelineTable build_pipeline(const PipelinePlan& p) {
  validate_pipeline(p);
  PipelineTable t;
  t.plan = p;
  int S = p.stages();
  t.ranks.resize(p.pp);
  for (int r = 0; r < p.pp; r++) {
    std::vector<Compute> order = compute_order(p, r);
    // The receive a compute needs (if any), as an action.
    auto recv_of = [&](const Compute& c, Action* a) {
      int s = stage_of(p, r, c.chunk);
      if (c.kind == ActionKind::forward && s > 0) {
        *a = {ActionKind::recv_act, c.mb, c.chunk, (s - 1) % p.pp, c.phase};
        return true;
      }
      if (c.kind == ActionKind::backward && s < S - 1) {
        *a = {ActionKind::recv_grad, c.mb, c.chunk, (s + 1) % p.pp, c.phase};
        return true;
      }
      return false;
    };
    std::vector<Action>& acts = t.ranks[r];
    Action a;
    if (!order.empty() && recv_of(order[0], &a)) acts.push_back(a);
    for (size_t k = 0; k < order.size(); k++) {
      if (k + 1 < order.size() && recv_of(order[k + 1], &a)) acts.push_back(a);  // post early
      const Compute& c = order[k];
      acts.push_back({c.kind, c.mb, c.chunk, -1, c.phase});
      int s = stage_of(p, r, c.chunk);
      if (c.kind == ActionKind::forward && s < S - 1)
        acts.push_back({ActionKind::send_act, c.mb, c.chunk, (s + 1) % p.pp, c.phase});
      if (c.kind == ActionKind::backward && s > 0)
        acts.push_back({ActionKind::send_grad, c.mb, c.chunk, (s - 1) % p.pp, c.phase});
    }
  }
  return t;
}

namespace {

// A rank's sends and receives by (kind, micro-batch, chunk): at most one each per compute.
using MessageIndex = std::map<std::tuple<ActionKind, int, int>, Action>;

// The receive (recv_act / recv_grad) or the send (send_act / send_grad) of compute c, if any.
std::optional<Action> message_of(const MessageIndex& messages, const Action& c, bool receive) {
  const bool fwd = c.kind == ActionKind::forward;
  const ActionKind want = receive ? (fwd ? ActionKind::recv_act : ActionKind::recv_grad)
                                  : (fwd ? ActionKind::send_act : ActionKind::send_grad);
  const auto it = messages.find({want, c.mb, c.chunk});
  if (it == messages.end()) return std::nullopt;
  return it->second;
}

// vp = 1: every compute is a step (Megatron's 1F1B: send_forward_recv_backward after a forward,
// send_backward_recv_forward after a backward). vp > 1: a warm-up forward, a steady forward with
// the backward after it, or a cool-down backward (Megatron's interleaved schedule:
// send_forward_backward_recv_forward_backward after each steady pair).
std::vector<Action> row_in_steps(const std::vector<Action>& row, int vp) {
  std::vector<Action> computes, out;
  MessageIndex messages;
  for (const Action& a : row) {
    if (is_compute(a.kind)) computes.push_back(a);
    else messages.emplace(std::make_tuple(a.kind, a.mb, a.chunk), a);
  }
  auto ends_step = [vp](const Action& c) {
    return vp == 1 || c.kind == ActionKind::backward || c.phase == Phase::warmup;
  };
  for (size_t begin = 0; begin < computes.size();) {
    size_t end = begin;
    while (!ends_step(computes[end]) && end + 1 < computes.size()) end++;
    for (size_t i = begin; i <= end; i++)
      if (auto r = message_of(messages, computes[i], true)) out.push_back(*r);
    for (size_t i = begin; i <= end; i++) out.push_back(computes[i]);
    for (size_t i = begin; i <= end; i++)
      if (auto s = message_of(messages, computes[i], false)) out.push_back(*s);
    begin = end + 1;
  }
  // Every send and receive belongs to a compute (build_pipeline's tables): none dropped.
  EXA_CHECK(out.size() == row.size(), "in_steps: {} of the row's {} actions placed (a send or receive without its "
            "compute)", out.size(), row.size());
  return out;
}

}  // namespace

PipelineTable in_steps(const PipelineTable& t) {
  PipelineTable out = t;
  for (auto& row : out.ranks) row = row_in_steps(row, t.plan.vp);
  return out;
}

std::vector<std::vector<Action>> posting_batches(const std::vector<Action>& row) {
  std::vector<std::vector<Action>> out;
  bool open = false;  // the last batch is a run of sends and receives
  for (const Action& a : row) {
    if (is_compute(a.kind) || !open) out.emplace_back();
    out.back().push_back(a);
    open = !is_compute(a.kind);
  }
  return out;
}

namespace {

// The simulation of simulate_pipeline: every rank's program counter and clock, the messages in
// transit, and the checks of every action as it runs.
class Simulator {
 public:
  Simulator(const PipelineTable& t, double t_fwd, double t_bwd)
      : t_(t), p_(t.plan), S_(t.plan.stages()), t_fwd_(t_fwd), t_bwd_(t_bwd), posted_(size_t(p_.pp)),
        expect_(size_t(p_.pp)), pc_(size_t(p_.pp), 0), clock_(size_t(p_.pp), 0), in_flight_(size_t(p_.pp), 0),
        fwd_done_(size_t(p_.pp)), bwd_done_(size_t(p_.pp)) {
    res_.peak_in_flight.assign(size_t(p_.pp), 0);
    res_.timeline.resize(size_t(p_.pp));
  }

  // Runs every rank as far as it gets, round after round, until no rank moves.
  SimResult run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p_.pp; r++)
        while (pc_[size_t(r)] < t_.ranks[size_t(r)].size() && advance(r, t_.ranks[size_t(r)][pc_[size_t(r)]])) {
          pc_[size_t(r)]++;
          progress = true;
        }
    }
    check_complete();
    const int units = p_.micro_batches * p_.vp;
    res_.makespan = *std::max_element(clock_.begin(), clock_.end());
    res_.busy_per_rank = units * (t_fwd_ + t_bwd_);
    res_.bubble_fraction = (res_.makespan - res_.busy_per_rank) / res_.busy_per_rank;
    return res_;
  }

 private:
  // A message is identified by (is_grad, micro-batch, destination stage).
  using Key = std::tuple<int, int, int>;
  struct Msg {
    double time;
    int src;
  };

  // Runs action a of rank r; false when it blocks (its input not sent yet).
  bool advance(int r, const Action& a) {
    EXA_CHECK(a.chunk >= 0 && a.chunk < p_.vp && a.mb >= 0 && a.mb < p_.micro_batches,
              "rank {} action {} names micro-batch {} chunk {} outside the plan", r, pc_[size_t(r)], a.mb, a.chunk);
    const int s = stage_of(p_, r, a.chunk);
    if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) return post(r, a, s), true;
    if (is_send(a.kind)) return send(r, a, s), true;
    return compute(r, a, s);
  }

  void post(int r, const Action& a, int s) {
    const Key k{a.kind == ActionKind::recv_grad, a.mb, s};
    EXA_CHECK(posted_[size_t(r)].insert(k).second, "rank {} posts receive {}(mb {}, chunk {}) twice", r,
              to_string(a.kind), a.mb, a.chunk);
    expect_[size_t(r)][k] = a.peer;
  }

  void send(int r, const Action& a, int s) {
    const bool grad = a.kind == ActionKind::send_grad;
    const int dst_stage = grad ? s - 1 : s + 1;
    EXA_CHECK(dst_stage >= 0 && dst_stage < S_ && a.peer == dst_stage % p_.pp,
              "rank {} {}(mb {}, chunk {}) to rank {}: stage {} sends to stage {}, on rank {}", r, to_string(a.kind),
              a.mb, a.chunk, a.peer, s, dst_stage, dst_stage % p_.pp);
    const Key k{grad, a.mb, dst_stage};
    EXA_CHECK(!in_transit_.count(k), "rank {} sends {}(mb {}) to stage {} twice", r, to_string(a.kind), a.mb,
              dst_stage);
    in_transit_[k] = {clock_[size_t(r)], r};
  }

  // A forward or backward: waits for its input message (if any), then takes t_fwd or t_bwd.
  bool compute(int r, const Action& a, int s) {
    const bool fwd = a.kind == ActionKind::forward;
    double start = clock_[size_t(r)];
    if ((fwd && s > 0) || (!fwd && s < S_ - 1)) {
      const Key k{fwd ? 0 : 1, a.mb, s};
      EXA_CHECK(posted_[size_t(r)].count(k), "rank {} runs {}(mb {}, chunk {}) without a posted receive", r,
                to_string(a.kind), a.mb, a.chunk);
      auto it = in_transit_.find(k);
      if (it == in_transit_.end()) return false;  // blocked: input not sent yet
      EXA_CHECK(it->second.src == expect_[size_t(r)][k],
                "rank {} receives mb {} for stage {} from rank {} but the send came from rank {}", r, a.mb, s,
                expect_[size_t(r)][k], it->second.src);
      start = std::max(start, it->second.time);
      in_transit_.erase(it);
      posted_[size_t(r)].erase(k);
    }
    const auto unit = std::make_pair(a.mb, a.chunk);
    if (fwd) {
      EXA_CHECK(fwd_done_[size_t(r)].insert(unit).second, "rank {} runs Forward(mb {}, chunk {}) twice", r, a.mb,
                a.chunk);
      res_.peak_in_flight[size_t(r)] = std::max(res_.peak_in_flight[size_t(r)], ++in_flight_[size_t(r)]);
    } else {
      EXA_CHECK(fwd_done_[size_t(r)].count(unit), "rank {} runs Backward(mb {}, chunk {}) before its Forward", r,
                a.mb, a.chunk);
      EXA_CHECK(bwd_done_[size_t(r)].insert(unit).second, "rank {} runs Backward(mb {}, chunk {}) twice", r, a.mb,
                a.chunk);
      in_flight_[size_t(r)]--;
    }
    clock_[size_t(r)] = start + (fwd ? t_fwd_ : t_bwd_);
    res_.timeline[size_t(r)].push_back({start, clock_[size_t(r)], a.kind, a.mb, a.chunk});
    return true;
  }

  // Every rank at the end of its table, every unit run forward and backward once, every message used.
  void check_complete() const {
    std::string stuck;
    for (int r = 0; r < p_.pp; r++)
      if (pc_[size_t(r)] < t_.ranks[size_t(r)].size()) {
        const Action& a = t_.ranks[size_t(r)][pc_[size_t(r)]];
        stuck += fmt::format("; rank {} waits at action {} {}(mb {}, chunk {})", r, pc_[size_t(r)], to_string(a.kind),
                             a.mb, a.chunk);
      }
    EXA_CHECK(stuck.empty(), "pipeline deadlock: ranks wait for messages never sent{}", stuck);
    const int units = p_.micro_batches * p_.vp;
    for (int r = 0; r < p_.pp; r++) {
      EXA_CHECK(static_cast<int>(fwd_done_[size_t(r)].size()) == units &&
                    static_cast<int>(bwd_done_[size_t(r)].size()) == units,
                "rank {} ran {} forwards and {} backwards, expected {} each", r, fwd_done_[size_t(r)].size(),
                bwd_done_[size_t(r)].size(), units);
      EXA_CHECK(posted_[size_t(r)].empty(), "rank {} posted {} receives that no send matched", r,
                posted_[size_t(r)].size());
    }
    EXA_CHECK(in_transit_.empty(), "{} sends have no matching receive", in_transit_.size());
  }

  const PipelineTable& t_;
  const PipelinePlan& p_;
  const int S_;
  const double t_fwd_, t_bwd_;
  std::map<Key, Msg> in_transit_;
  std::vector<std::set<Key>> posted_;       // receives posted, not yet consumed
  std::vector<std::map<Key, int>> expect_;  // key -> peer the receive names
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<int> in_flight_;
  std::vector<std::set<std::pair<int, int>>> fwd_done_, bwd_done_;
  SimResult res_;
};

}  // namespace

SimResult simulate_pipeline(const PipelineTable& t, double t_fwd, double t_bwd) {
  return Simulator(t, t_fwd, t_bwd).run();
}

std::string render_timeline(const PipelineTable& t, const SimResult& sim) {
  int units = static_cast<int>(sim.makespan + 0.5);
  std::vector<std::vector<std::string>> cells(t.plan.pp, std::vector<std::string>(units, "."));
  size_t width = 1;
  for (int r = 0; r < t.plan.pp; r++)
    for (const SimSlot& s : sim.timeline[r]) {
      std::string label = fmt::format("{}{}", s.kind == ActionKind::forward ? 'F' : 'B', s.mb);
      if (t.plan.vp > 1) label += static_cast<char>('a' + s.chunk);
      width = std::max(width, label.size());
      for (int u = static_cast<int>(s.start + 0.5); u < static_cast<int>(s.end + 0.5); u++)
        cells[r][u] = label;
    }
  std::string out;
  for (int r = 0; r < t.plan.pp; r++) {
    std::string row = fmt::format("rank {} |", r);
    for (const std::string& c : cells[r]) row += " " + c + std::string(width - c.size(), ' ');
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  return out;
}

}  // namespace exatrain::parallel
