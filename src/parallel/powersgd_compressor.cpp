// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) as PyTorch's powerSGD_hook runs it: for
// every matrix M [n, m] of the bucket (whole rows of a 2-D entry, compressible by 2x), with error
// feedback M = residual + gradient:
//   P = M Q;  all-reduce P;  orthogonalise P (Gram-Schmidt);  Q = M^T P;  all-reduce Q;  M' = P Q^T
// (all the bucket's P in one all-reduce, all its Q in another), Q kept for the next step (warm
// start; the first Q is random normal from the seed, the same on every rank, orthogonalised), and
// residual = M - M' / P_ranks (PyTorch keeps input - the averaged approximation; our buckets hold
// each rank's 1/P share of the mean, so the sum's share is M' / P). Vectors, partial rows and
// matrices not worth it are all-reduced dense by CompressorBase.
#include <cmath>
#include <vector>

#include "core/splitmix.hpp"
#include "parallel/compress_common.hpp"

namespace exatrain::parallel::compress {
namespace {

struct PowerExtra final : Bucket::Extra {
  DeviceBuffer q;  // every matrix piece's Q [cols, r], back to back
};

class PowerSgd final : public CompressorBase {
 public:
  PowerSgd(const CommSpec& spec, const CompressorContext& ctx)
      : CompressorBase(spec, ctx, rules_of(spec), spec.error_feedback) {}

 protected:
  void reduce(Group& dp, Backend& be, const BucketReduce&, Bucket& st, float* acc, float* sum) override {
    const int64_t r = spec_.rank;
    int64_t p_size = 0, q_size = 0;
    for (const Piece& p : st.plan.pieces)
      if (!p.dense) p_size += p.rows * r, q_size += p.cols * r;
    if (!st.extra) st.extra = init_q(be, st, q_size);
    float* q_all = static_cast<PowerExtra&>(*st.extra).q.data();
    Scratch& s = scratch(be);
    float* p_all = s.floats(kP, p_size);
    int64_t pa = 0, qa = 0;
    for (const Piece& p : st.plan.pieces) {  // P = M Q
      if (p.dense) continue;
      be.gemm(false, false, p.rows, r, p.cols, 1.0f, acc + p.offset, p.cols, q_all + qa, r, 0.0f, p_all + pa, r);
      pa += p.rows * r, qa += p.cols * r;
    }
    dp.all_reduce_sum(p_all, p_size);
    pa = qa = 0;
    for (const Piece& p : st.plan.pieces) {  // orthogonalise P, Q = M^T P
      if (p.dense) continue;
      be.orthonormalize_columns(p_all + pa, p.rows, r);
      be.gemm(true, false, p.cols, r, p.rows, 1.0f, acc + p.offset, p.cols, p_all + pa, r, 0.0f, q_all + qa, r);
      pa += p.rows * r, qa += p.cols * r;
    }
    dp.all_reduce_sum(q_all, q_size);
    pa = qa = 0;
    float* share = s.floats(kTmp, st.plan.len);
    for (const Piece& p : st.plan.pieces) {  // M' = P Q^T; residual = M - M' / ranks
      if (p.dense) continue;
      be.gemm(false, true, p.rows, p.cols, r, 1.0f, p_all + pa, r, q_all + qa, r, 0.0f, sum + p.offset, p.cols);
      if (ef_) {
        be.copy(share, sum + p.offset, sizeof(float) * size_t(p.len));
        be.scale(share, -1.0f / float(dp.size()), p.len);
        be.add_inplace(acc + p.offset, share, p.len);
      }
      pa += p.rows * r, qa += p.cols * r;
      stats_.selected += double((p.rows + p.cols) * r);
    }
  }

 private:
  static PlanRules rules_of(const CommSpec& spec) {
    PlanRules rules;
    rules.matrix_rows = true;
    rules.min_compress = spec.min_compress;
    rules.rank = spec.rank;
    return rules;
  }

  // The first Q of every matrix: standard normal from (seed, bucket, element) by Box-Muller on
  // splitmix64 (identical on every rank), orthogonalised as PyTorch does for a fresh Q.
  std::unique_ptr<Bucket::Extra> init_q(Backend& be, const Bucket& st, int64_t q_size) {
    auto x = std::make_unique<PowerExtra>();
    x->q = DeviceBuffer(be, std::max<int64_t>(q_size, 1), "PowerSGD Q");
    HostBuffer<float> host(be, std::max<int64_t>(q_size, 1));
    uint64_t state = splitmix64_mix(ctx_.seed ^ 0x5057534744ull ^ (uint64_t(st.serial) << 20));
    for (int64_t i = 0; i < q_size; i++) {
      const double u1 = (double(splitmix64(state) >> 11) + 0.5) / 9007199254740992.0;
      const double u2 = double(splitmix64(state) >> 11) / 9007199254740992.0;
      host[i] = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    be.upload(x->q.data(), host.data(), sizeof(float) * size_t(q_size));
    int64_t qa = 0;
    for (const Piece& p : st.plan.pieces) {
      if (p.dense) continue;
      be.orthonormalize_columns(x->q.data() + qa, p.cols, spec_.rank);
      qa += p.cols * spec_.rank;
    }
    return x;
  }
};

}  // namespace

std::shared_ptr<Compressor> make_powersgd(const CommSpec& spec, const CompressorContext& ctx) {
  return std::make_shared<PowerSgd>(spec, ctx);
}

}  // namespace exatrain::parallel::compress
