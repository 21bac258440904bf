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

void run_pipeline(Group& pp, BufferPool& pool, const PipelineTable& t, const StageCallbacks& cb,
                  PipelineTiming* timing) {
  const int64_t act_floats = pool.floats();
  const PipelinePlan& p = t.plan;
  EXA_CHECK(pp.size() == p.pp, "pipeline table built for pp {} run on a group of {} ranks", p.pp,
            pp.size());
  int* tag_ub = nullptr;
  int flag = 0;
  // MPI_TAG_UB is attached to MPI_COMM_WORLD only; its value holds for every communicator.
  mpi_check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag), "MPI_Comm_get_attr");
  int max_tag = message_tag(p, true, p.micro_batches - 1, p.stages() - 1);
  EXA_CHECK(flag && max_tag <= *tag_ub, "pipeline needs MPI tags up to {} but MPI_TAG_UB is {}",
            max_tag, flag ? *tag_ub : -1);

  int r = pp.rank();
  int S = p.stages();
  std::map<Unit, Pending> act_in, grad_in;  // received, waiting for their compute
  std::map<Unit, Pending> act_out, grad_out_send;  // produced, being sent
  std::vector<Pending> sending;  // completed computes whose sends are in flight

  // Timing: `timed(cat, name, fn)` runs fn and books its duration.
  auto timed = [&](bool compute, auto&& name, auto&& fn) {
    if (!timing) return fn();
    double t0 = MPI_Wtime();
    fn();
    double t1 = MPI_Wtime();
    (compute ? timing->compute_s : timing->bubble_s) += t1 - t0;
    if (timing->events)
      timing->events->push_back({name(), compute ? "compute" : "wait",
                                 (t0 - timing->trace_origin) * 1e6, (t1 - t0) * 1e6});
  };

  // Send buffers are kept until their request completes; completed ones are released as we go.
  auto reap_sends = [&] {
    for (size_t i = 0; i < sending.size();) {
      if (pp.test(sending[i].req)) {
        pool.give(std::move(sending[i].buf));
        sending[i] = std::move(sending.back());
        sending.pop_back();
      } else {
        i++;
      }
    }
  };

  for (const Action& a : t.ranks[r]) {
    Unit u{a.mb, a.chunk};
    int s = stage_of(p, r, a.chunk);
    switch (a.kind) {
      case ActionKind::recv_act: {
        Pending& in = act_in[u];
        in.buf = pool.take();
        in.req = pp.irecv(in.buf.data(), act_floats, a.peer, message_tag(p, false, a.mb, s));
        break;
      }
      case ActionKind::recv_grad: {
        Pending& in = grad_in[u];
        in.buf = pool.take();
        in.req = pp.irecv(in.buf.data(), act_floats, a.peer, message_tag(p, true, a.mb, s));
        break;
      }
      case ActionKind::forward: {
        const float* in = nullptr;
        if (s > 0) {
          auto it = act_in.find(u);
          EXA_CHECK(it != act_in.end(), "rank {} Forward(mb {}, chunk {}) has no posted receive", r,
                    a.mb, a.chunk);
          timed(false, [&] { return fmt::format("wait act mb{} c{}", a.mb, a.chunk); },
                [&] { pp.wait(it->second.req); });
          in = it->second.buf.data();
        }
        float* out = nullptr;
        if (s < S - 1) {
          act_out[u].buf = pool.take();
          out = act_out[u].buf.data();
        }
        timed(true, [&] { return fmt::format("F mb{} c{}", a.mb, a.chunk); },
              [&] { cb.forward(a.mb, a.chunk, in, out); });
        if (auto it = act_in.find(u); it != act_in.end()) {  // the callback stashed what backward needs
          pool.give(std::move(it->second.buf));
          act_in.erase(it);
        }
        break;
      }
      case ActionKind::send_act: {
        auto it = act_out.find(u);
        EXA_CHECK(it != act_out.end(), "rank {} SendAct(mb {}) before its Forward", r, a.mb);
        Pending msg = std::move(it->second);
        act_out.erase(it);
        msg.req = pp.isend(msg.buf.data(), act_floats, a.peer, message_tag(p, false, a.mb, s + 1));
        sending.push_back(std::move(msg));
        reap_sends();
        break;
      }
      case ActionKind::backward: {
        const float* g_out = nullptr;
        if (s < S - 1) {
          auto it = grad_in.find(u);
          EXA_CHECK(it != grad_in.end(), "rank {} Backward(mb {}, chunk {}) has no posted receive",
                    r, a.mb, a.chunk);
          timed(false, [&] { return fmt::format("wait grad mb{} c{}", a.mb, a.chunk); },
                [&] { pp.wait(it->second.req); });
          g_out = it->second.buf.data();
        }
        float* g_in = nullptr;
        if (s > 0) {
          grad_out_send[u].buf = pool.take();
          g_in = grad_out_send[u].buf.data();
        }
        timed(true, [&] { return fmt::format("B mb{} c{}", a.mb, a.chunk); },
              [&] { cb.backward(a.mb, a.chunk, g_out, g_in); });
        if (auto it = grad_in.find(u); it != grad_in.end()) {
          pool.give(std::move(it->second.buf));
          grad_in.erase(it);
        }
        break;
      }
      case ActionKind::send_grad: {
        auto it = grad_out_send.find(u);
        EXA_CHECK(it != grad_out_send.end(), "rank {} SendGrad(mb {}) before its Backward", r, a.mb);
        Pending msg = std::move(it->second);
        grad_out_send.erase(it);
        msg.req = pp.isend(msg.buf.data(), act_floats, a.peer, message_tag(p, true, a.mb, s - 1));
        sending.push_back(std::move(msg));
        reap_sends();
        break;
      }
    }
  }
  timed(false, [] { return std::string("wait sends"); },
        [&] {
          for (Pending& msg : sending) {
            pp.wait(msg.req);
            pool.give(std::move(msg.buf));
          }
        });
  EXA_CHECK(act_in.empty() && grad_in.empty(), "rank {} finished its table with {} unused receives",
            r, act_in.size() + grad_in.size());
}

}  // namespace exatrain::parallel
