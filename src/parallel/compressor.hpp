// The compressor slot of the data-parallel gradient reduction (parallel/grad_sync.hpp): every
// bucket's reduction over the dp group goes through a Compressor, which may send fewer or smaller
// bytes than the dense fp32 collective as long as every rank ends with (an approximation of) the
// sum. Identity (the default) is the dense collective; a compressor keeps per-bucket state across
// steps by the bucket's index (an error-feedback residual, PowerSGD's warm-start Q), may run
// several phases (PowerSGD: all-reduce P, orthogonalise, all-reduce Q: its Reduction's test()
// advances the phases) and may exchange other collectives (an all-gather of (index, value) pairs);
// whatever it sends goes through the Group, so the ledger counts its bytes exactly, by dtype.
//
// Owns: the reduction of one gradient bucket. May use: backend/ (ops on the bucket), parallel/comm.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "model/layout.hpp"
#include "parallel/comm.hpp"

namespace exatrain::parallel {

enum class ReduceKind { all_reduce, reduce_scatter };

// One bucket of a chunk's gradient arena to reduce over the dp group.
struct BucketReduce {
  int64_t index = 0;                    // stable across steps (per-bucket compressor state)
  ReduceKind kind = ReduceKind::all_reduce;
  const ParamLayout* layout = nullptr;  // the entries the bucket overlaps (shapes, roles)
  int64_t begin = 0, end = 0;           // the bucket's range of the arena
  // all_reduce: data[n] in place, every rank ends with the sum.
  // reduce_scatter: data[p * shard] (zero-padded by the caller), rank r ends with the sum of
  // chunk r in out[shard]; out == data means in place (the result at data[0 : shard]).
  float* data = nullptr;
  float* out = nullptr;
  int64_t n = 0, shard = 0;
  bool blocking = false;                // complete before start() returns
};

// A bucket's reduction in flight: test() drives it (and advances a multi-phase one), true once
// the sum is in place; wait() blocks until then.
class Reduction {
 public:
  virtual ~Reduction() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const char* name() const = 0;
  // The optimizer step (1-based) whose gradients the next start() calls reduce (every micro-batch
  // of it, under ZeRO 2): warm-up schedules and index refreshes count steps, not calls.
  virtual void begin_step(int64_t step) {}
  // The compressor's own figures for the step since begin_step, by name (parallel/compressors.hpp:
  // density, residual_norm, index_overlap, ...; metrics.jsonl "compression"). Empty for the identity.
  virtual std::map<std::string, double> step_stats() const { return {}; }
  // Starts the reduction of b over dp (every rank calls it for the same buckets in the same
  // order). Null when nothing is left to wait for (blocking, or a group of one).
  virtual std::unique_ptr<Reduction> start(Group& dp, Backend& be, const BucketReduce& b) = 0;
  // Compressed momentum ([comm] compress = "momentum", docs/compression.md): the compressor
  // reduces each rank's local AdamW momentum b1 m + (1 - b1) g_i instead of its gradient g_i, and the
  // bucket ends with the group's (compressed) sum, the new synchronised m. It reads m, the
  // optimizer's first moment of the previous step, from `exp_avg` (device, the chunk's whole arena
  // whose layout is `layout`; told once by ZeRO 0, whose optimizer keeps it on every rank).
  virtual bool compresses_momentum() const { return false; }
  virtual void bind_momentum(const ParamLayout* layout, const float* exp_avg) {}
  // True when the step's reductions (since begin_step) left the synchronised momentum in the
  // buckets, not the gradient sum (a compressed step; the dense warm-up steps reduce gradients):
  // the optimizer then takes them as its m (OptimStep::grads_are_momentum).
  virtual bool delivered_momentum() const { return false; }
};

// The dense fp32 collective: all-reduce or reduce-scatter of the bucket, non-blocking unless
// b.blocking (then the blocking collective: Open MPI's blocking and non-blocking algorithms may
// round differently, and each reduction keeps the path it had).
class IdentityCompressor final : public Compressor {
 public:
  const char* name() const override { return "none"; }
  std::unique_ptr<Reduction> start(Group& dp, Backend& be, const BucketReduce& b) override;
};

// The dense collective in bf16 ([train] grad_reduce_dtype = "bf16"): the bucket is rounded to bf16
// (Backend::f32_to_half) into a staging buffer, all-reduced or reduce-scattered over dp in bf16 and
// converted back into the bucket's fp32 destination; half the bytes of the fp32 collective. The
// sum: MpiGroup's bf16 MPI_Op adds two bf16 values in fp32 and rounds the sum to bf16 at every
// pairwise step of the reduction (as NCCL's bf16 sum), so p ranks' sum carries up to p - 1
// roundings. Non-blocking unless b.blocking; the conversion back happens when test() or wait()
// sees the collective done.
class Bf16ReduceCompressor final : public Compressor {
 public:
  const char* name() const override { return "bf16-reduce"; }
  std::unique_ptr<Reduction> start(Group& dp, Backend& be, const BucketReduce& b) override;
};

// A Group request as a Reduction (the identity's, and a building block for compressors).
class RequestReduction final : public Reduction {
 public:
  RequestReduction(Group& g, Request r) : g_(g), r_(r) {}
  ~RequestReduction() override { g_.wait(r_); }
  bool test() override { return g_.test(r_); }
  void wait() override { g_.wait(r_); }

 private:
  Group& g_;
  Request r_;
};

}  // namespace exatrain::parallel
