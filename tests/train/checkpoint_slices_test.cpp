// The offset arithmetic of sharded checkpoints (train/checkpoint_slices.hpp): which global elements
// and file bytes a rank's slice of a parameter covers, including tensors past 2^31 bytes, checked
// through a recording "writer" (no file: the 16 GiB tensor below is never allocated).
#include <gtest/gtest.h>

#include <climits>
#include <vector>

#include "core/check.hpp"
#include "train/checkpoint_slices.hpp"

using namespace exatrain;

namespace {

ParamInfo param(std::vector<int64_t> global, int split, int64_t local, int64_t start) {
  ParamInfo p;
  p.name = "w";
  p.global_shape = global;
  p.shard_shape = global;
  if (split >= 0) p.shard_shape[size_t(split)] = local;
  p.split_dim = split;
  p.shard_start = split >= 0 ? start : 0;
  p.numel = 1;
  for (int64_t d : p.shard_shape) p.numel *= d;
  return p;
}

std::vector<SliceRun> runs(const ParamInfo& p, int64_t lo, int64_t hi) {
  std::vector<SliceRun> out;
  for_each_run(p, lo, hi, [&](const SliceRun& r) { out.push_back(r); });
  return out;
}

void expect_run(const SliceRun& r, int64_t local, int64_t global, int64_t count) {
  EXPECT_EQ(r.local, local);
  EXPECT_EQ(r.global, global);
  EXPECT_EQ(r.count, count);
}

}  // namespace

TEST(CheckpointSlices, ColumnShardIsOneRunPerRowTouched) {
  // Global [3, 5]; this rank holds columns 2..3 ([3, 2], split 1); ZeRO gave it elements [1, 5).
  const auto r = runs(param({3, 5}, 1, 2, 2), 1, 5);
  ASSERT_EQ(r.size(), 3u);
  expect_run(r[0], 1, 0 * 5 + 3, 1);  // row 0, column 3
  expect_run(r[1], 2, 1 * 5 + 2, 2);  // row 1, columns 2-3
  expect_run(r[2], 4, 2 * 5 + 2, 1);  // row 2, column 2
}

TEST(CheckpointSlices, RowShardVectorAndReplicatedAreOneRun) {
  auto r = runs(param({4, 3}, 0, 2, 2), 1, 5);  // rows 2..3 of [4, 3]
  ASSERT_EQ(r.size(), 1u);
  expect_run(r[0], 1, 2 * 3 + 1, 4);
  r = runs(param({10}, 0, 5, 5), 0, 5);  // the second half of a vector
  ASSERT_EQ(r.size(), 1u);
  expect_run(r[0], 0, 5, 5);
  r = runs(param({4, 3}, -1, 0, 0), 3, 12);  // replicated: shard = global
  ASSERT_EQ(r.size(), 1u);
  expect_run(r[0], 3, 3, 9);
  EXPECT_TRUE(runs(param({4, 3}, -1, 0, 0), 5, 5).empty());
}

TEST(CheckpointSlices, RangeOutsideTheShardIsAnError) {
  EXPECT_THROW(runs(param({4, 3}, 0, 2, 2), 0, 7), Error);
}

TEST(CheckpointSlices, ColumnShardOfA16GiBTensorHasOffsetsPast2To31Bytes) {
  // [65536, 65536] float32 = 16 GiB; tp rank 1 of 2 holds columns 32768.. (a row-parallel weight).
  const int64_t n = 65536, half = 32768;
  const ParamInfo p = param({n, n}, 1, half, half);
  const uint64_t tensor_offset = 4096;  // the header
  int64_t pieces = 0, covered = 0, bad = 0;
  uint64_t last = 0;
  for_each_piece(p, 0, p.numel, tensor_offset, kMaxPieceFloats, [&](const FilePiece& f) {
    const int64_t row = pieces++;
    const uint64_t want = tensor_offset + uint64_t(row * n + half) * 4;
    bad += f.offset != want || f.local != row * half || f.count != half;
    covered += f.count;
    last = f.offset;
  });
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(pieces, n);
  EXPECT_EQ(covered, p.numel);
  EXPECT_EQ(last, tensor_offset + uint64_t((n - 1) * n + half) * 4);
  EXPECT_GT(last, uint64_t(1) << 33);  // far past what an int offset could say
}

TEST(CheckpointSlices, LongRunsAreCutIntoPiecesWhoseBytesFitAnInt) {
  // The second half of the rows of a [65536, 65536] tensor: one run of 2^31 floats (8 GiB) at
  // global element 2^31, cut into pieces of at most INT_MAX / 4 floats.
  const ParamInfo p = param({65536, 65536}, 0, 32768, 32768);
  std::vector<FilePiece> got;
  for_each_piece(p, 0, p.numel, 0, kMaxPieceFloats, [&](const FilePiece& f) { got.push_back(f); });
  ASSERT_EQ(got.size(), 5u);  // 4 full pieces of 536870911 floats + 4 floats
  uint64_t next = uint64_t(1) << 33;  // byte offset of global element 2^31
  int64_t local = 0;
  for (const FilePiece& f : got) {
    EXPECT_EQ(f.offset, next);
    EXPECT_EQ(f.local, local);
    EXPECT_LE(int64_t(f.count) * 4, int64_t(INT_MAX));
    next += uint64_t(f.count) * 4, local += f.count;
  }
  EXPECT_EQ(local, int64_t(1) << 31);
  EXPECT_EQ(got.back().count, 4);
  // A small piece limit cuts a column shard's rows too, each piece inside its row.
  int64_t small = 0;
  for_each_piece(param({3, 5}, 1, 2, 2), 0, 6, 0, 1, [&](const FilePiece& f) { small += f.count == 1; });
  EXPECT_EQ(small, 6);
}
