// Runs one rank's pipeline action table over the pp group with non-blocking sends and receives,
// each run of consecutive sends and receives posted as one batch (schedule.hpp posting_batches,
// Group::post_p2p: one NCCL group on a GPU). The table's order is the caller's: build_pipeline's
// (receives a compute early) over MPI, in_steps' over NCCL (parallel/stream_order.hpp: why).
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
#include <optional>

#include "backend/backend.hpp"
#include "parallel/comm.hpp"
#include "parallel/schedule.hpp"
#include "parallel/trace.hpp"

namespace exatrain::parallel {

// Device buffers of one size, reused: take() hands out a free one (allocating when none is),
// give() returns it. And the format a message crosses the wire in: fp32, or under mixed precision
// its 16-bit format (Megatron's pipeline messages in the parameters' dtype, half the bytes): the
// sender rounds the activation or gradient it produced, the receiver widens it exactly.
class BufferPool {
 public:
  BufferPool(Backend& be, int64_t floats, std::optional<Half> wire_half = std::nullopt)
      : be_(be), floats_(floats), half_(wire_half) {}
  int64_t floats() const { return floats_; }
  DeviceBuffer take();  // [floats] fp32
  void give(DeviceBuffer b) { free_.push_back(std::move(b)); }
  // A message on the wire is floats() elements of wire_dtype().
  DType wire_dtype() const { return !half_ ? DType::f32 : *half_ == Half::f16 ? DType::f16 : DType::bf16; }
  DeviceBuffer take_wire();                // to receive a message into
  DeviceBuffer to_wire(DeviceBuffer f32);  // a produced message, ready to send (16-bit: rounded, f32 given back)
  DeviceBuffer from_wire(DeviceBuffer w);  // a received message as fp32 (16-bit: widened, w given back)
  void give_wire(DeviceBuffer w);

 private:
  Backend& be_;
  int64_t floats_;
  std::optional<Half> half_;
  std::vector<DeviceBuffer> free_, free_wire_;  // fp32; 16-bit ([ceil(floats / 2)] floats of storage)
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
// Every message has pool.floats() elements of pool.wire_dtype().
void run_pipeline(Group& pp, BufferPool& pool, const PipelineTable& table, const StageCallbacks& cb,
                  PipelineTiming* timing = nullptr);

}  // namespace exatrain::parallel
