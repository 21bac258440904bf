#include "parallel/compressor.hpp"

namespace exatrain::parallel {

std::unique_ptr<Reduction> IdentityCompressor::start(Group& dp, Backend&, const BucketReduce& b) {
  if (b.kind == ReduceKind::all_reduce) {
    if (b.blocking) {
      dp.all_reduce_sum(b.data, b.n);
      return nullptr;
    }
    return std::make_unique<RequestReduction>(dp, dp.iall_reduce_sum(b.data, b.n));
  }
  const bool in_place = b.out == b.data;
  if (b.blocking) {
    dp.reduce_scatter_sum(in_place ? nullptr : b.data, b.out, b.shard);
    return nullptr;
  }
  return std::make_unique<RequestReduction>(dp, dp.ireduce_scatter_sum(in_place ? nullptr : b.data, b.out, b.shard));
}

namespace {

class Bf16Reduction final : public Reduction {
 public:
  Bf16Reduction(Group& dp, Backend& be, const BucketReduce& b) : dp_(dp), be_(be), b_(b) {
    const bool rs = b.kind == ReduceKind::reduce_scatter;
    const int64_t in_n = rs ? b.shard * dp.size() : b.n;
    out_n_ = rs ? b.shard : b.n;
    in_ = static_cast<uint16_t*>(be.alloc_bytes(sizeof(uint16_t) * size_t(in_n)));
    out_ = rs ? static_cast<uint16_t*>(be.alloc_bytes(sizeof(uint16_t) * size_t(out_n_))) : in_;
    be.f32_to_half(Half::bf16, in_, b.data, in_n);
    req_ = rs ? dp.ireduce_scatter(in_, out_, b.shard, DType::bf16) : dp.iall_reduce(in_, b.n, DType::bf16);
  }
  ~Bf16Reduction() override {
    wait();
    if (out_ != in_) be_.free_bytes(out_);
    be_.free_bytes(in_);
  }
  bool test() override {
    if (!done_ && dp_.test(req_)) unpack();
    return done_;
  }
  void wait() override {
    if (done_) return;
    dp_.wait(req_);
    unpack();
  }

 private:
  void unpack() {
    be_.half_to_f32(Half::bf16, b_.kind == ReduceKind::reduce_scatter ? b_.out : b_.data, out_, out_n_);
    done_ = true;
  }
  Group& dp_;
  Backend& be_;
  BucketReduce b_;
  uint16_t *in_ = nullptr, *out_ = nullptr;
  int64_t out_n_ = 0;
  Request req_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Reduction> Bf16ReduceCompressor::start(Group& dp, Backend& be, const BucketReduce& b) {
  if (dp.size() == 1) return IdentityCompressor().start(dp, be, b);  // a group of one: nothing to round
  auto r = std::make_unique<Bf16Reduction>(dp, be, b);
  if (!b.blocking) return r;
  r->wait();
  return nullptr;
}

}  // namespace exatrain::parallel
