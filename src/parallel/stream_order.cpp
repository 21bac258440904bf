#include "parallel/stream_order.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"

namespace exatrain::parallel {

const char* to_string(P2pPosting p) {
  switch (p) {
    case P2pPosting::per_call: return "per_call";
    case P2pPosting::batched: return "batched";
  }
  return "?";
}

namespace {

// A message: (is_grad, micro-batch, destination stage), as simulate_pipeline names them.
using Key = std::tuple<int, int, int>;

struct Call {
  Action action;
  Key key;
  bool done = false;
  double done_at = 0;  // when it completed (the later of the two items' starts: transfers are free)
};
// One item of the communication stream: one NCCL call, or a group of them.
struct Item {
  std::vector<Call> calls;
  size_t computes_before = 0;  // compute actions posted before it on this rank
  double end = 0;              // when its last call completed
};
struct Where {
  int rank = -1;  // -1: nowhere (a compute without a receive)
  size_t item = 0, call = 0;
};
struct RankStreams {
  std::vector<Item> comm;            // the communication stream, in posting order
  size_t comm_head = 0;              // items before it have completed
  std::vector<Action> compute;       // forwards and backwards, in order
  std::vector<Where> compute_input;  // per compute: where its receive is
  std::vector<double> compute_end;   // per compute run so far: when it ended
  size_t compute_head = 0;
  bool finished() const { return comm_head == comm.size() && compute_head == compute.size(); }
};

class StreamSim {
 public:
  StreamSim(const PipelineTable& t, P2pPosting posting, double t_fwd, double t_bwd)
      : p_(t.plan), t_fwd_(t_fwd), t_bwd_(t_bwd), ranks_(size_t(t.plan.pp)) {
    for (int r = 0; r < p_.pp; r++) post_rank(r, t.ranks[size_t(r)], posting);
  }

  StreamRun run() {
    StreamRun out;
    out.problem = !unposted_.empty() ? unposted_ : order_problem();
    if (!out.problem.empty()) return out;
    for (bool progress = true; progress;) {
      progress = false;
      for (RankStreams& rs : ranks_) progress |= advance_compute(rs);
      for (int r = 0; r < p_.pp; r++) progress |= advance_comm(r);
    }
    for (int r = 0; r < p_.pp; r++)
      if (!ranks_[size_t(r)].finished()) out.problem += (out.problem.empty() ? "deadlock: " : "; ") + where_stuck(r);
    if (!out.problem.empty()) return out;
    for (const RankStreams& rs : ranks_)
      if (!rs.compute_end.empty()) out.makespan = std::max(out.makespan, rs.compute_end.back());
    const double busy = p_.micro_batches * p_.vp * (t_fwd_ + t_bwd_);
    out.bubble_fraction = busy > 0 ? (out.makespan - busy) / busy : 0;
    return out;
  }

 private:
  // The message a send or receive of rank r carries.
  Key key_of(int r, const Action& a) const {
    const int s = stage_of(p_, r, a.chunk);
    switch (a.kind) {
      case ActionKind::recv_act: return {0, a.mb, s};
      case ActionKind::recv_grad: return {1, a.mb, s};
      case ActionKind::send_act: return {0, a.mb, s + 1};
      case ActionKind::send_grad: return {1, a.mb, s - 1};
      default: return {-1, -1, -1};
    }
  }

  // The rank's row as stream items: one per call, or one per batch of posting_batches.
  void post_rank(int r, const std::vector<Action>& row, P2pPosting posting) {
    RankStreams& rs = ranks_[size_t(r)];
    for (const std::vector<Action>& batch : posting_batches(row)) {
      if (is_compute(batch[0].kind)) {
        const Action& a = batch[0];
        const int s = stage_of(p_, r, a.chunk);
        const bool needs = a.kind == ActionKind::forward ? s > 0 : s < p_.stages() - 1;
        rs.compute.push_back(a);
        const auto in = recv_at_.find({r, Key{a.kind == ActionKind::backward, a.mb, s}});
        if (needs && in == recv_at_.end() && unposted_.empty())
          unposted_ = fmt::format("order: rank {} posts {}(mb {}, chunk {}) before its receive", r, to_string(a.kind),
                                  a.mb, a.chunk);
        rs.compute_input.push_back(needs && in != recv_at_.end() ? in->second : Where{});
        continue;
      }
      for (size_t i = 0; i < batch.size(); i++) {
        const Action& a = batch[i];
        if (i == 0 || posting == P2pPosting::per_call) rs.comm.push_back({{}, rs.compute.size()});
        const Key k = key_of(r, a);
        const Where w{r, rs.comm.size() - 1, rs.comm.back().calls.size()};
        rs.comm.back().calls.push_back({a, k, false});
        EXA_CHECK((is_send(a.kind) ? send_at_ : recv_at_).emplace(std::make_pair(r, k), w).second,
                  "rank {} posts {}(mb {}, chunk {}) twice", r, to_string(a.kind), a.mb, a.chunk);
        if (is_send(a.kind)) sent_[{r, a.peer}].push_back(k);
        else received_[{a.peer, r}].push_back(k);
      }
    }
  }

  // NCCL matches a peer's sends and receives by their order, not by tag: for every pair of ranks the
  // messages must be received in the order they are sent ("" when they are).
  std::string order_problem() const {
    auto text = [](const std::vector<Key>& ks) {
      std::string t;
      for (const Key& k : ks)
        t += fmt::format("{}{}(mb {}, stage {})", t.empty() ? "" : " ", std::get<0>(k) ? "grad" : "act",
                         std::get<1>(k), std::get<2>(k));
      return t;
    };
    for (const auto& [pair, receives] : received_)
      if (!sent_.count(pair))
        return fmt::format("order: rank {} receives [{}] from rank {}, which sends it nothing", pair.second,
                           text(receives), pair.first);
    for (const auto& [pair, sends] : sent_) {
      const auto it = received_.find(pair);
      if (it != received_.end() && it->second == sends) continue;
      return fmt::format("order: rank {} sends to rank {} [{}] but rank {} receives [{}]; NCCL pairs them by order, "
                         "so messages would land in the wrong buffers", pair.first, pair.second, text(sends),
                         pair.second, it == received_.end() ? "" : text(it->second));
    }
    return "";
  }

  bool advance_compute(RankStreams& rs) {
    bool moved = false;
    while (rs.compute_head < rs.compute.size()) {
      const Where& input = rs.compute_input[rs.compute_head];
      double start = rs.compute_end.empty() ? 0 : rs.compute_end.back();
      if (input.rank >= 0) {
        const RankStreams& in = ranks_[size_t(input.rank)];
        if (in.comm_head <= input.item) break;  // its receive has not completed
        start = std::max(start, in.comm[input.item].end);
      }
      const Action& a = rs.compute[rs.compute_head];
      rs.compute_end.push_back(start + (a.kind == ActionKind::forward ? t_fwd_ : t_bwd_));
      ++rs.compute_head;
      moved = true;
    }
    return moved;
  }

  // When the item at w (running) started: after the item before it and the computes posted before it.
  double start_of(const Where& w) const {
    const RankStreams& rs = ranks_[size_t(w.rank)];
    double t = w.item > 0 ? rs.comm[w.item - 1].end : 0;
    const size_t before = rs.comm[w.item].computes_before;
    return before > 0 ? std::max(t, rs.compute_end[before - 1]) : t;
  }

  bool running(const Where& w) const {
    const RankStreams& rs = ranks_[size_t(w.rank)];
    return rs.comm_head == w.item && w.item < rs.comm.size() && rs.compute_head >= rs.comm[w.item].computes_before;
  }

  // NCCL runs the calls of a group that go the same way to the same peer in order: the call at w
  // waits for the earlier ones.
  bool behind_in_group(const Where& w) const {
    const Item& item = ranks_[size_t(w.rank)].comm[w.item];
    const Action& a = item.calls[w.call].action;
    for (size_t i = 0; i < w.call; i++) {
      const Action& b = item.calls[i].action;
      if (!item.calls[i].done && b.peer == a.peer && is_send(b.kind) == is_send(a.kind)) return true;
    }
    return false;
  }

  // The head item of rank r's communication stream: each call completes with its counterpart once
  // both items run; the item ends when all its calls have.
  bool advance_comm(int r) {
    RankStreams& rs = ranks_[size_t(r)];
    if (!running({r, rs.comm_head, 0})) return false;
    bool moved = false;
    Item& item = rs.comm[rs.comm_head];
    for (size_t i = 0; i < item.calls.size(); i++) {
      Call& c = item.calls[i];
      if (c.done) continue;
      const auto& other = is_send(c.action.kind) ? recv_at_ : send_at_;
      const auto it = other.find({c.action.peer, c.key});
      EXA_CHECK(it != other.end(), "rank {} {}(mb {}, chunk {}) has no counterpart on rank {}", r,
                to_string(c.action.kind), c.action.mb, c.action.chunk, c.action.peer);
      const Where& w = it->second;
      if (!running(w) || behind_in_group({r, rs.comm_head, i}) || behind_in_group(w)) continue;
      Call& peer_call = ranks_[size_t(w.rank)].comm[w.item].calls[w.call];
      c.done = peer_call.done = true;
      c.done_at = peer_call.done_at = std::max(start_of({r, rs.comm_head, i}), start_of(w));
      moved = true;
    }
    bool all = true;
    double end = start_of({r, rs.comm_head, 0});
    for (const Call& c : item.calls) all = all && c.done, end = std::max(end, c.done_at);
    if (all) item.end = end, ++rs.comm_head, moved = true;
    return moved;
  }

  std::string where_stuck(int r) const {
    const RankStreams& rs = ranks_[size_t(r)];
    std::string s = fmt::format("rank {}", r);
    if (rs.comm_head < rs.comm.size())
      for (const Call& c : rs.comm[rs.comm_head].calls)
        if (!c.done) {
          s += fmt::format(" communication stream waits at {}(mb {}, chunk {}) {} rank {}", to_string(c.action.kind),
                           c.action.mb, c.action.chunk, is_send(c.action.kind) ? "to" : "from", c.action.peer);
          break;
        }
    if (rs.compute_head < rs.compute.size()) {
      const Action& a = rs.compute[rs.compute_head];
      s += fmt::format("{} compute stream waits at {}(mb {}, chunk {})", rs.comm_head < rs.comm.size() ? "," : "",
                       to_string(a.kind), a.mb, a.chunk);
    }
    return s;
  }

  const PipelinePlan& p_;
  const double t_fwd_, t_bwd_;
  std::vector<RankStreams> ranks_;
  std::string unposted_;  // a compute posted before its receive
  std::map<std::pair<int, Key>, Where> send_at_, recv_at_;           // (rank, message) -> its call
  std::map<std::pair<int, int>, std::vector<Key>> sent_, received_;  // (from, to) -> messages in posting order
};

}  // namespace

StreamRun simulate_streams(const PipelineTable& table, P2pPosting posting, double t_fwd, double t_bwd) {
  return StreamSim(table, posting, t_fwd, t_bwd).run();
}

std::string stream_problem(const PipelineTable& table, P2pPosting posting) {
  return simulate_streams(table, posting, 1, 2).problem;
}

}  // namespace exatrain::parallel
