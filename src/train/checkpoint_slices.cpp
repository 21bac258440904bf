#include "train/checkpoint_slices.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace exatrain {

void for_each_run(const ParamInfo& p, int64_t lo, int64_t hi, const std::function<void(const SliceRun&)>& fn) {
  EXA_CHECK(0 <= lo && lo <= hi && hi <= p.numel, "checkpoint: elements [{}, {}) are outside the {} of {}'s shard",
            lo, hi, p.numel, p.name);
  if (lo == hi) return;
  const bool matrix = p.shard_shape.size() == 2;
  if (!(matrix && p.split_dim == 1)) {
    // Whole rows of the global tensor (or a piece of a vector): one contiguous run.
    int64_t start = 0;  // global flat index of shard element 0
    if (p.split_dim == 0) start = matrix ? p.shard_start * p.global_shape[1] : p.shard_start;
    fn({lo, start + lo, hi - lo});
    return;
  }
  // A block of columns [shard_start, shard_start + cols) of every row: one run per row touched.
  const int64_t cols = p.shard_shape[1], gcols = p.global_shape[1];
  for (int64_t i = lo; i < hi;) {
    const int64_t row = i / cols, col = i % cols;
    const int64_t n = std::min(hi - i, cols - col);
    fn({i, row * gcols + p.shard_start + col, n});
    i += n;
  }
}

void for_each_piece(const ParamInfo& p, int64_t lo, int64_t hi, uint64_t tensor_offset, int64_t max_piece,
                    const std::function<void(const FilePiece&)>& fn) {
  EXA_CHECK(max_piece > 0 && max_piece <= kMaxPieceFloats, "checkpoint: piece size {} not in [1, {}]", max_piece,
            kMaxPieceFloats);
  for_each_run(p, lo, hi, [&](const SliceRun& r) {
    for (int64_t k = 0; k < r.count; k += max_piece)
      fn({tensor_offset + uint64_t(r.global + k) * sizeof(float), r.local + k, int(std::min(max_piece, r.count - k))});
  });
}

}  // namespace exatrain
