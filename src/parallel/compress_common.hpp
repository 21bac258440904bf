// What the compressors of parallel/compressors.hpp share (internal to parallel/): a bucket cut
// into pieces by the layout's entries, per-bucket state kept across steps, the warm-up, the dense
// all-reduce of small pieces, the reduce-scatter's shard, and the step's figures. A compressor
// derives from CompressorBase and implements reduce() for the bucket's compressible pieces.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "job/job.hpp"
#include "model/layout.hpp"
#include "parallel/compressor.hpp"
#include "parallel/compressors.hpp"
#include "parallel/sparse_collectives.hpp"

namespace exatrain::parallel::compress {

// A contiguous part of one bucket [offset, offset + len) (bucket coordinates) inside one entry.
struct Piece {
  int64_t offset = 0, len = 0;
  ParamRole role = ParamRole::matrix;
  int64_t rows = 0, cols = 0;  // whole rows of a 2-D entry (rows * cols == len); 0 otherwise
  bool dense = false;          // sent by the dense all-reduce (too small, or not compressible)
};

// How a bucket is cut (the same on every dp rank: replicas share the layout).
struct BucketPlan {
  int64_t len = 0;            // the bucket's real elements (end - begin; padding excluded)
  std::vector<Piece> pieces;  // in order, tiling [0, len)
  int64_t compressible = 0;   // elements in pieces that are not dense
  bool has_dense() const { return compressible < len; }
};

struct PlanRules {
  bool per_entry = true;      // pieces per entry (else one piece: the whole bucket)
  bool matrix_rows = false;   // PowerSGD: an entry's partial rows become dense pieces of their own
  int64_t min_compress = 0;   // pieces with fewer elements are dense
  int64_t rank = 0;           // PowerSGD: a matrix piece is dense unless 2 (rows + cols) rank < rows cols
};
BucketPlan plan_bucket(const BucketReduce& b, const PlanRules& rules);

// The figures of one step (CompressorBase::step_stats turns them into metrics).
struct StepStats {
  double elements = 0;        // compressible elements reduced (every call: ZeRO 2 counts each micro-batch)
  double selected = 0;        // of them, what this rank sent (values, or their equivalent)
  double overlap_common = 0, overlap_previous = 0;  // |S_t ∩ S_prev| and |S_prev|, summed over buckets
  double gradient_common = 0, gradient_previous = 0;  // the same for the raw gradient's top-k sets
  double refreshed = 0, fallbacks = 0, dense_warmup = 0;
  double dense_equivalent_bytes = 0;
};

// One bucket's state: its plan and the error-feedback residual (the accumulator), plus whatever a
// compressor keeps (Extra).
struct Bucket {
  BucketPlan plan;
  int64_t serial = 0;            // creation order: seeds
  DeviceBuffer residual;         // [len] when error feedback is on
  double residual_squares = 0;   // after the latest reduction
  DeviceBuffer gradient_topk;    // int32: the raw gradient's top-k set, recorded at gradient_step
  int64_t gradient_k = 0, gradient_step = -1;
  struct Extra {
    virtual ~Extra() = default;
  };
  std::unique_ptr<Extra> extra;
};

class CompressorBase : public Compressor {
 public:
  CompressorBase(const CommSpec& spec, const CompressorContext& ctx, PlanRules rules, bool error_feedback)
      : spec_(spec), ctx_(ctx), rules_(rules), ef_(error_feedback) {}
  const char* name() const override { return spec_.compressor.c_str(); }
  void begin_step(int64_t step) override {
    step_ = step;
    stats_ = StepStats{};
    delivered_momentum_ = false;
  }
  std::map<std::string, double> step_stats() const override;
  std::unique_ptr<Reduction> start(Group& dp, Backend& be, const BucketReduce& b) final;
  bool compresses_momentum() const override { return spec_.compress == "momentum"; }
  void bind_momentum(const ParamLayout* layout, const float* exp_avg) override { momenta_[layout] = exp_avg; }
  bool delivered_momentum() const override { return delivered_momentum_; }

 protected:
  // The group's sum of the compressible pieces of acc[len] (this rank's contribution, residual
  // included) into sum[len]; for a reduce-scatter at least on this rank's shard [r shard, (r+1)
  // shard). With error feedback acc IS the residual buffer: leave in it what was not sent. Runs
  // with the group's kind tag set to the compressor's name.
  virtual void reduce(Group& dp, Backend& be, const BucketReduce& b, Bucket& st, float* acc, float* sum) = 0;
  // This rank's contribution before the selection: with error feedback the residual += the
  // bucket's gradient (returned: the residual), else the gradient itself. DGC overrides it.
  virtual float* accumulate(Group& dp, Backend& be, const BucketReduce& b, Bucket& st);
  // Density of a piece at this step: role_density or density, raised during an exponential warm-up.
  double density_of(const Piece& p) const;
  // k of a piece: ceil(density x len), at least 1.
  int64_t k_of(const Piece& p) const;
  Scratch& scratch(Backend& be);
  const CommSpec spec_;
  const CompressorContext ctx_;
  const PlanRules rules_;
  const bool ef_;
  int64_t step_ = 0;
  StepStats stats_;
  std::map<const ParamLayout*, const float*> momenta_;  // compress = "momentum": the optimizer's m per chunk

 private:
  bool dense_step() const { return spec_.warmup == "dense" && step_ <= spec_.warmup_steps; }
  void gradient_overlap(Backend& be, const BucketReduce& b, Bucket& st);
  void reduce_dense_pieces(Group& dp, Backend& be, const Bucket& st, float* acc, float* sum);
  void write_result(Group& dp, Backend& be, const BucketReduce& b, const float* sum);
  void local_momentum(Group& dp, Backend& be, const BucketReduce& b, const Bucket& st);
  bool delivered_momentum_ = false;
  std::map<std::tuple<uintptr_t, int64_t, int64_t, int>, Bucket> buckets_;
  std::unique_ptr<Scratch> scratch_;
  IdentityCompressor identity_;
};

// Scratch slots below 100 (the sparse collectives use 100 and up).
enum Slot : int { kSum = 1, kDense, kIdx, kVal, kTmp, kSamples, kP, kQ, kBits, kScales, kBlocks, kBlockVal, kGrad, kMomentum, kRoundingLoss };

// The pieces' selections of one bucket as pairs (scratch kIdx/kVal): exact top-k, or the threshold
// of a sample (DGC) with an exact fallback when it selects nothing or more than twice k.
SparsePairs select_topk(Backend& be, Scratch& s, const BucketPlan& plan, const float* acc,
                        const std::vector<int64_t>& ks, bool sampled, double sample_fraction, uint64_t seed,
                        double* fallbacks);

// The scaled signs of EF-SignSGD (sign_compressor.cpp) for `pieces` of acc: each piece's sign bits
// and its scale ||x||_1 / len all-gathered, every rank's decoded pieces added into sum in rank
// order; with error feedback acc keeps x - scale sign(x). Returns the elements sent (1 bit each).
// The sign compressor sends its pieces so, and the sparsifiers their small pieces with
// [comm] small_pieces = "sign".
double sign_exchange(Group& dp, Backend& be, Scratch& s, const std::vector<const Piece*>& pieces, float* acc,
                     float* sum, bool error_feedback);

std::shared_ptr<Compressor> make_sparse(const CommSpec& spec, const CompressorContext& ctx);
std::shared_ptr<Compressor> make_powersgd(const CommSpec& spec, const CompressorContext& ctx);
std::shared_ptr<Compressor> make_sign(const CommSpec& spec, const CompressorContext& ctx);

}  // namespace exatrain::parallel::compress
