#include "parallel/executor.hpp"

#include <map>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "parallel/mesh.hpp"

namespace exatrain::parallel {

namespace {

// A buffer with the request that fills it (receive) or drains it (send).
struct Pending {
  DeviceBuffer buf;
  Request req;
};

using Unit = std::pair<int, int>;  // (micro-batch, chunk)

int message_tag(const PipelinePlan& p, bool grad, int mb, int dst_stage) {
  return (mb * p.stages() + dst_stage) * 2 + (grad ? 1 : 0);
}

}  // namespace

DeviceBuffer BufferPool::take() {
  if (free_.empty()) return DeviceBuffer(be_, floats_, "pipeline message");
  DeviceBuffer b = std::move(free_.back());
  free_.pop_back();
  return b;
}

DeviceBuffer BufferPool::take_wire() {
  if (!half_) return take();
  if (free_wire_.empty()) return DeviceBuffer(be_, (floats_ + 1) / 2, "pipeline message (16-bit)");
  DeviceBuffer b = std::move(free_wire_.back());
  free_wire_.pop_back();
  return b;
}

void BufferPool::give_wire(DeviceBuffer w) {
  if (!half_) return give(std::move(w));
  free_wire_.push_back(std::move(w));
}

DeviceBuffer BufferPool::to_wire(DeviceBuffer f32) {
  if (!half_) return f32;
  DeviceBuffer w = take_wire();
  be_.f32_to_half(*half_, reinterpret_cast<uint16_t*>(w.data()), f32.data(), floats_);
  give(std::move(f32));
  return w;
}

DeviceBuffer BufferPool::from_wire(DeviceBuffer w) {
  if (!half_) return w;
  DeviceBuffer f32 = take();
  be_.half_to_f32(*half_, f32.data(), reinterpret_cast<const uint16_t*>(w.data()), floats_);
  give_wire(std::move(w));
  return f32;
}

namespace {

// One rank's run of its table row: the messages in flight and one method per action kind.
class RankRun {
 public:
  RankRun(Group& pp, BufferPool& pool, const PipelineTable& t, const StageCallbacks& cb, PipelineTiming* timing)
      : pp_(pp), pool_(pool), p_(t.plan), cb_(cb), timing_(timing), r_(pp.rank()), S_(t.plan.stages()),
        floats_(pool.floats()) {}

  // MPI_TAG_UB is attached to MPI_COMM_WORLD only; its value holds for every communicator.
  void check_tags() const {
    int* tag_ub = nullptr;
    int flag = 0;
    mpi_check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr");
    const int max_tag = message_tag(p_, true, p_.micro_batches - 1, p_.stages() - 1);
    EXA_CHECK(flag && max_tag <= *tag_ub, "pipeline needs MPI tags up to {} but MPI_TAG_UB is {}", max_tag,
              flag ? *tag_ub : -1);
  }

  // One of posting_batches' batches: a compute, or a run of sends and receives posted together
  // (Group::post_p2p: one NCCL group on a GPU).
  void run(const std::vector<Action>& batch) {
    const Action& a = batch[0];
    const Unit u{a.mb, a.chunk};
    const int s = stage_of(p_, r_, a.chunk);
    if (a.kind == ActionKind::forward) return forward(a, u, s);
    if (a.kind == ActionKind::backward) return backward(a, u, s);
    post(batch);
  }

  // Every send complete (so the next step may reuse tags), every receive used.
  void finish() {
    timed(false, [] { return std::string("wait sends"); }, [&] {
      for (Pending& msg : sending_) {
        pp_.wait(msg.req);
        pool_.give_wire(std::move(msg.buf));
      }
    });
    EXA_CHECK(act_in_.empty() && grad_in_.empty(), "rank {} finished its table with {} unused receives", r_,
              act_in_.size() + grad_in_.size());
  }

 private:
  // Runs fn and books its duration as compute or bubble (and a trace event named name()).
  template <class Name, class Fn>
  void timed(bool compute, Name&& name, Fn&& fn) {
    if (!timing_) return fn();
    const double t0 = MPI_Wtime();
    fn();
    const double t1 = MPI_Wtime();
    (compute ? timing_->compute_s : timing_->bubble_s) += t1 - t0;
    if (timing_->events)
      timing_->events->push_back({name(), compute ? "compute" : "wait", (t0 - timing_->trace_origin) * 1e6,
                                  (t1 - t0) * 1e6});
  }

  // Posts the batch's receives (into fresh wire buffers) and sends (of what their computes made,
  // rounded to the wire format) as one Group::post_p2p; sends stay in flight in sending_, and the
  // completed ones are reaped.
  void post(const std::vector<Action>& batch) {
    reap_sends();  // their wire buffers back to the pool before this batch takes any
    std::vector<P2pCall> calls;
    std::vector<Pending*> receives;  // per call: the receive's entry (stable: a map's), or null for a send
    std::vector<Pending> sends;
    for (const Action& a : batch) {
      const Unit u{a.mb, a.chunk};
      const int s = stage_of(p_, r_, a.chunk);
      const bool grad = a.kind == ActionKind::recv_grad || a.kind == ActionKind::send_grad;
      if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad) {
        Pending& in = (grad ? grad_in_ : act_in_)[u];
        in.buf = pool_.take_wire();
        calls.push_back(
            P2pCall::recv_into(in.buf.data(), floats_, pool_.wire_dtype(), a.peer, message_tag(p_, grad, a.mb, s)));
        receives.push_back(&in);
        continue;
      }
      std::map<Unit, Pending>& out = grad ? grad_out_ : act_out_;
      auto it = out.find(u);
      EXA_CHECK(it != out.end(), "rank {} {}(mb {}) before its {}", r_, grad ? "SendGrad" : "SendAct", a.mb,
                grad ? "Backward" : "Forward");
      Pending msg = std::move(it->second);
      out.erase(it);
      msg.buf = pool_.to_wire(std::move(msg.buf));
      calls.push_back(P2pCall::send_from(msg.buf.data(), floats_, pool_.wire_dtype(), a.peer,
                                       message_tag(p_, grad, a.mb, grad ? s - 1 : s + 1)));
      receives.push_back(nullptr);
      sends.push_back(std::move(msg));
    }
    std::vector<Request> reqs = pp_.post_p2p(calls);
    for (size_t i = 0, k = 0; i < calls.size(); i++) {
      if (receives[i]) receives[i]->req = reqs[i];
      else sends[k].req = reqs[i], sending_.push_back(std::move(sends[k++]));
    }
    reap_sends();
  }

  void reap_sends() {
    for (size_t i = 0; i < sending_.size();) {
      if (!pp_.test(sending_[i].req)) { i++; continue; }
      pool_.give_wire(std::move(sending_[i].buf));
      sending_[i] = std::move(sending_.back());
      sending_.pop_back();
    }
  }

  // The received message of unit u (waited for), or null on the stage without a sender.
  const float* received(std::map<Unit, Pending>& in, const Action& a, const Unit& u, const char* what) {
    auto it = in.find(u);
    EXA_CHECK(it != in.end(), "rank {} {}(mb {}, chunk {}) has no posted receive", r_, what, a.mb, a.chunk);
    timed(false, [&] { return fmt::format("wait {} mb{} c{}", what[0] == 'F' ? "act" : "grad", a.mb, a.chunk); },
          [&] { pp_.wait(it->second.req); });
    it->second.buf = pool_.from_wire(std::move(it->second.buf));
    return it->second.buf.data();
  }

  // The callback has stashed what it needs of a received message: its buffer goes back.
  void release(std::map<Unit, Pending>& in, const Unit& u) {
    if (auto it = in.find(u); it != in.end()) {
      pool_.give(std::move(it->second.buf));
      in.erase(it);
    }
  }

  void forward(const Action& a, const Unit& u, int s) {
    const float* in = s > 0 ? received(act_in_, a, u, "Forward") : nullptr;
    float* out = nullptr;
    if (s < S_ - 1) out = (act_out_[u].buf = pool_.take()).data();
    timed(true, [&] { return fmt::format("F mb{} c{}", a.mb, a.chunk); }, [&] { cb_.forward(a.mb, a.chunk, in, out); });
    release(act_in_, u);
  }

  void backward(const Action& a, const Unit& u, int s) {
    const float* g_out = s < S_ - 1 ? received(grad_in_, a, u, "Backward") : nullptr;
    float* g_in = nullptr;
    if (s > 0) g_in = (grad_out_[u].buf = pool_.take()).data();
    timed(true, [&] { return fmt::format("B mb{} c{}", a.mb, a.chunk); },
          [&] { cb_.backward(a.mb, a.chunk, g_out, g_in); });
    release(grad_in_, u);
  }

  Group& pp_;
  BufferPool& pool_;
  const PipelinePlan& p_;
  const StageCallbacks& cb_;
  PipelineTiming* timing_;
  const int r_, S_;
  const int64_t floats_;
  std::map<Unit, Pending> act_in_, grad_in_;   // received, waiting for their compute
  std::map<Unit, Pending> act_out_, grad_out_; // produced, waiting for their send
  std::vector<Pending> sending_;               // sends in flight
};

}  // namespace

void run_pipeline(Group& pp, BufferPool& pool, const PipelineTable& t, const StageCallbacks& cb,
                  PipelineTiming* timing) {
  EXA_CHECK(pp.size() == t.plan.pp, "pipeline table built for pp {} run on a group of {} ranks", t.plan.pp, pp.size());
  RankRun run(pp, pool, t, cb, timing);
  run.check_tags();
  for (const std::vector<Action>& batch : posting_batches(t.ranks[size_t(pp.rank())])) run.run(batch);
  run.finish();
}

}  // namespace exatrain::parallel
