// Runs one rank's pipeline action table over the pp group with non-blocking sends and receives.
//
// The model is reached only through two callbacks per (micro-batch, chunk):
//   forward(mb, chunk, in, out)          in[act_floats]: activation from the previous stage, or
//                                        nullptr on stage 0 (the callback reads its own input);
//                                        out[act_floats]: for the next stage, nullptr on the last
//                                        stage (the callback computes the loss there).
//   backward(mb, chunk, grad_out, grad_in)  grad_out[act_floats]: gradient w.r.t. this stage's
//                                        output (nullptr on the last stage, where the loss starts);
//                                        grad_in[act_floats]: gradient w.r.t. this stage's input,
//                                        to send back (nullptr on stage 0).
// The callbacks keep whatever they stash for backward (activations, recomputation state).
// Every message has the same size act_floats (micro_batch * seq * hidden, over tp under sequence
// parallelism). Tags encode (micro-batch, destination stage, act/grad), so messages can never be
// confused whatever order MPI delivers them in. Message buffers are device memory from a
// BufferPool (kept across steps); the callbacks' in/out/grad pointers are device pointers.
#pragma once
#include <cstdint>
#include <functional>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/schedule.hpp"
#include "parallel/trace.hpp"

namespace exatrain::parallel {

// Device buffers of one size, reused: take() hands out a free one (allocating when none is),
// give() returns it.
class BufferPool {
 public:
  BufferPool(Backend& be, int64_t floats) : be_(be), floats_(floats) {}
  int64_t floats() const { return floats_; }
  DeviceBuffer take();
  void give(DeviceBuffer b) { free_.push_back(std::move(b)); }

 private:
  Backend& be_;
  int64_t floats_;
  std::vector<DeviceBuffer> free_;
};

struct StageCallbacks {
  std::function<void(int mb, int chunk, const float* in, float* out)> forward;
  std::function<void(int mb, int chunk, const float* grad_out, float* grad_in)> backward;
};

// Where the step's time went on this rank. compute_s: inside the callbacks; bubble_s: blocked
// waiting for a pipeline message (the bubble as this rank experiences it, including transfer time
// not hidden behind compute); with `events` non-null every compute and wait is also recorded as a
// trace event relative to `trace_origin` (an MPI_Wtime value taken after a common barrier).
struct PipelineTiming {
  double compute_s = 0, bubble_s = 0;
  std::vector<TraceEvent>* events = nullptr;
  double trace_origin = 0;
};

// pp.rank() selects the table row; pp.size() must equal table.plan.pp. Returns when every action
// has run and every send has completed (so the next step may reuse tags).
// Every message has pool.floats() elements.
void run_pipeline(Group& pp, BufferPool& pool, const PipelineTable& table, const StageCallbacks& cb,
                  PipelineTiming* timing = nullptr);

}  // namespace exatrain::parallel
