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

}  // namespace exatrain::parallel
