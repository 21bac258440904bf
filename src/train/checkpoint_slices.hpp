// Offset arithmetic of sharded checkpoints (train/checkpoint_io.hpp): where the elements a rank
// holds of one parameter lie in the global tensor, and in the safetensors file.
//
// A rank holds a flat element range [lo, hi) of its tensor-parallel shard of parameter p (row-major
// in p.shard_shape; ZeRO cuts the arena anywhere, so the range may start and end mid-row). In the
// global tensor (row-major in p.global_shape) those elements form runs: one run when the shard is
// whole rows (split_dim 0, a vector, or replicated), one run per row touched when the shard is a
// block of columns (split_dim 1). Runs are cut into pieces of at most max_piece floats so that
// no MPI count (nor its byte size) exceeds INT_MAX, whatever the tensor's size.
#pragma once
#include <climits>
#include <cstdint>
#include <functional>

#include "model/layout.hpp"

namespace exatrain {

struct SliceRun {
  int64_t local = 0;   // first element, flat index in the shard
  int64_t global = 0;  // first element, flat index in the global tensor
  int64_t count = 0;   // elements, contiguous in both
};

struct FilePiece {
  uint64_t offset = 0;  // bytes from the start of the file
  int64_t local = 0;    // first element, flat index in the shard
  int count = 0;        // float32 elements
};

// The most floats one MPI call moves: its byte count still fits an int.
inline constexpr int64_t kMaxPieceFloats = INT_MAX / 4;

// The runs of shard elements [lo, hi) of p, in order.
void for_each_run(const ParamInfo& p, int64_t lo, int64_t hi, const std::function<void(const SliceRun&)>& fn);

// The runs as float32 file pieces of at most max_piece elements; `tensor_offset` is the byte
// offset of the tensor's first element in the file.
void for_each_piece(const ParamInfo& p, int64_t lo, int64_t hi, uint64_t tensor_offset, int64_t max_piece,
                    const std::function<void(const FilePiece&)>& fn);

}  // namespace exatrain
