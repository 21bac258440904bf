#include "parallel/schedule.hpp"

#include <algorithm>
#include <limits>
#include <map>
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

SimResult simulate_pipeline(const PipelineTable& t, double t_fwd, double t_bwd) {
  const PipelinePlan& p = t.plan;
  int S = p.stages();
  int units = p.micro_batches * p.vp;
  // A message is identified by (is_grad, micro-batch, destination stage).
  using Key = std::tuple<int, int, int>;
  struct Msg {
    double time;
    int src;
  };
  std::map<Key, Msg> in_transit;
  std::vector<std::set<Key>> posted(p.pp);   // receives posted, not yet consumed
  std::vector<std::map<Key, int>> expect(p.pp);  // key -> peer the receive names
  std::vector<size_t> pc(p.pp, 0);
  std::vector<double> clock(p.pp, 0);
  std::vector<int> in_flight(p.pp, 0);
  SimResult res;
  res.peak_in_flight.assign(p.pp, 0);
  res.timeline.resize(p.pp);
  std::vector<std::set<std::pair<int, int>>> fwd_done(p.pp), bwd_done(p.pp);

  auto input_key = [&](int r, const Action& a, Key* k) {
    int s = stage_of(p, r, a.chunk);
    if (a.kind == ActionKind::forward && s > 0) { *k = {0, a.mb, s}; return true; }
    if (a.kind == ActionKind::backward && s < S - 1) { *k = {1, a.mb, s}; return true; }
    return false;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p.pp; r++) {
      const auto& acts = t.ranks[r];
      while (pc[r] < acts.size()) {
        const Action& a = acts[pc[r]];
        int s = stage_of(p, r, a.chunk);
        EXA_CHECK(a.chunk >= 0 && a.chunk < p.vp && a.mb >= 0 && a.mb < p.micro_batches,
                  "rank {} action {} names micro-batch {} chunk {} outside the plan", r, pc[r],
                  a.mb, a.chunk);
        if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) {
          Key k{a.kind == ActionKind::recv_grad, a.mb, s};
          EXA_CHECK(posted[r].insert(k).second, "rank {} posts receive {}(mb {}, chunk {}) twice",
                    r, to_string(a.kind), a.mb, a.chunk);
          expect[r][k] = a.peer;
        } else if (a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad) {
          bool grad = a.kind == ActionKind::send_grad;
          int dst_stage = grad ? s - 1 : s + 1;
          EXA_CHECK(dst_stage >= 0 && dst_stage < S && a.peer == dst_stage % p.pp,
                    "rank {} {}(mb {}, chunk {}) to rank {}: stage {} sends to stage {}, on rank {}",
                    r, to_string(a.kind), a.mb, a.chunk, a.peer, s, dst_stage, dst_stage % p.pp);
          Key k{grad, a.mb, dst_stage};
          EXA_CHECK(!in_transit.count(k), "rank {} sends {}(mb {}) to stage {} twice", r,
                    to_string(a.kind), a.mb, dst_stage);
          in_transit[k] = {clock[r], r};
        } else {
          bool fwd = a.kind == ActionKind::forward;
          double start = clock[r];
          Key k;
          if (input_key(r, a, &k)) {
            EXA_CHECK(posted[r].count(k), "rank {} runs {}(mb {}, chunk {}) without a posted receive",
                      r, to_string(a.kind), a.mb, a.chunk);
            auto it = in_transit.find(k);
            if (it == in_transit.end()) break;  // blocked: input not sent yet
            EXA_CHECK(it->second.src == expect[r][k],
                      "rank {} receives mb {} for stage {} from rank {} but the send came from rank "
                      "{}",
                      r, a.mb, s, expect[r][k], it->second.src);
            start = std::max(start, it->second.time);
            in_transit.erase(it);
            posted[r].erase(k);
          }
          auto unit = std::make_pair(a.mb, a.chunk);
          if (fwd) {
            EXA_CHECK(fwd_done[r].insert(unit).second, "rank {} runs Forward(mb {}, chunk {}) twice",
                      r, a.mb, a.chunk);
            in_flight[r]++;
            res.peak_in_flight[r] = std::max(res.peak_in_flight[r], in_flight[r]);
          } else {
            EXA_CHECK(fwd_done[r].count(unit), "rank {} runs Backward(mb {}, chunk {}) before its "
                      "Forward", r, a.mb, a.chunk);
            EXA_CHECK(bwd_done[r].insert(unit).second,
                      "rank {} runs Backward(mb {}, chunk {}) twice", r, a.mb, a.chunk);
            in_flight[r]--;
          }
          clock[r] = start + (fwd ? t_fwd : t_bwd);
          res.timeline[r].push_back({start, clock[r], a.kind, a.mb, a.chunk});
        }
        pc[r]++;
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p.pp; r++)
    if (pc[r] < t.ranks[r].size()) {
      const Action& a = t.ranks[r][pc[r]];
      stuck += fmt::format("; rank {} waits at action {} {}(mb {}, chunk {})", r, pc[r],
                           to_string(a.kind), a.mb, a.chunk);
    }
  EXA_CHECK(stuck.empty(), "pipeline deadlock: ranks wait for messages never sent{}", stuck);
  for (int r = 0; r < p.pp; r++) {
    EXA_CHECK(static_cast<int>(fwd_done[r].size()) == units &&
                  static_cast<int>(bwd_done[r].size()) == units,
              "rank {} ran {} forwards and {} backwards, expected {} each", r, fwd_done[r].size(),
              bwd_done[r].size(), units);
    EXA_CHECK(posted[r].empty(), "rank {} posted {} receives that no send matched", r,
              posted[r].size());
  }
  EXA_CHECK(in_transit.empty(), "{} sends have no matching receive", in_transit.size());
  res.makespan = *std::max_element(clock.begin(), clock.end());
  res.busy_per_rank = units * (t_fwd + t_bwd);
  res.bubble_fraction = (res.makespan - res.busy_per_rank) / res.busy_per_rank;
  return res;
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
