// 1-bit compression with a scale and error feedback (EF-SignSGD: Karimireddy et al., "Error
// Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML 2019): every compressible
// piece x of this rank's accumulator is sent as sign bits and one scale, ||x||_1 / len (the
// scaled sign C(x) = (||x||_1 / d) sign(x) of the paper), and the residual keeps x - C(x). The bits
// (32 per int32 word, each piece starting a word) and the scales are all-gathered; every rank adds
// the P decoded pieces in rank order. Per rank (P - 1) (len / 32 words + pieces) on the wire: 1/32
// of an fp32 all-gather, P/64 of the ring all-reduce's bytes (a win below 64 ranks).
#include <cmath>
#include <vector>

#include "parallel/compress_common.hpp"

namespace exatrain::parallel::compress {
namespace {

class SignCompressor final : public CompressorBase {
 public:
  SignCompressor(const CommSpec& spec, const CompressorContext& ctx)
      : CompressorBase(spec, ctx, rules_of(spec), spec.error_feedback) {}

 protected:
  void reduce(Group& dp, Backend& be, const BucketReduce&, Bucket& st, float* acc, float* sum) override {
    std::vector<const Piece*> pieces;
    for (const Piece& p : st.plan.pieces)
      if (!p.dense) pieces.push_back(&p);
    stats_.selected += sign_exchange(dp, be, scratch(be), pieces, acc, sum, ef_) / 32.0;
  }

 private:
  static PlanRules rules_of(const CommSpec& spec) {
    PlanRules rules;
    rules.min_compress = spec.min_compress;
    return rules;
  }
};

}  // namespace

double sign_exchange(Group& dp, Backend& be, Scratch& s, const std::vector<const Piece*>& pieces, float* acc,
                     float* sum, bool error_feedback) {
  std::vector<int64_t> word_at;  // each piece's first word
  int64_t words = 0, elements = 0;
  for (const Piece* p : pieces) word_at.push_back(words), words += (p->len + 31) / 32, elements += p->len;
  const int64_t np = int64_t(pieces.size()), ranks = dp.size(), me = dp.rank();
  int32_t* bits = s.ints(kBits, words * ranks);
  float* scales = s.floats(kScales, np * ranks);
  HostBuffer<float> host(be, np * ranks);
  for (int64_t i = 0; i < np; i++) {
    const Piece& p = *pieces[size_t(i)];
    host[me * np + i] = float(be.sum_abs(acc + p.offset, p.len) / double(p.len));
    be.sign_pack(bits + me * words + word_at[size_t(i)], acc + p.offset, p.len);
  }
  be.upload(scales + me * np, host.data() + me * np, sizeof(float) * size_t(np));
  dp.all_gather(nullptr, bits, words, DType::i32);
  dp.all_gather(nullptr, scales, np, DType::f32);
  be.download(host.data(), scales, sizeof(float) * size_t(np * ranks));
  for (int64_t i = 0; i < np; i++) {
    const Piece& p = *pieces[size_t(i)];
    be.fill(sum + p.offset, 0.0f, p.len);
    for (int64_t r = 0; r < ranks; r++)
      be.sign_unpack_add(sum + p.offset, bits + r * words + word_at[size_t(i)], p.len, host[r * np + i]);
    if (error_feedback)
      be.sign_unpack_add(acc + p.offset, bits + me * words + word_at[size_t(i)], p.len, -host[me * np + i]);
  }
  return double(elements);
}

std::shared_ptr<Compressor> make_sign(const CommSpec& spec, const CompressorContext& ctx) {
  return std::make_shared<SignCompressor>(spec, ctx);
}

}  // namespace exatrain::parallel::compress
