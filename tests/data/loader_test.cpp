// The memory-mapped loader: exact windows, shuffling, validation split, disjoint data-parallel
// ranks, exact resume from a cursor, and clear errors for missing/truncated/corrupt shards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"
#include "data/loader.hpp"
#include "data/shard.hpp"
#include "../test_util/temp_dir.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::data;

namespace {

// A dataset whose token i is (i * 7 + 3) % vocab, in shards of `shard_tokens`: every window's
// contents are known in closed form.
uint32_t pattern(uint64_t i, uint32_t vocab) { return uint32_t((i * 7 + 3) % vocab); }

void make_dataset(const std::string& dir, uint64_t tokens, uint32_t vocab, uint64_t shard_tokens) {
  std::filesystem::create_directories(dir);
  DatasetManifest m;
  m.tokenizer_type = "byte";
  m.vocab_size = vocab;
  m.separator_id = 10;
  m.token_bytes = token_bytes_for_vocab(vocab);
  for (uint64_t start = 0; start < tokens; start += shard_tokens) {
    ShardEntry e;
    e.file = "shard_" + std::to_string(m.shards.size()) + ".bin";
    ShardWriter w(dir + "/" + e.file, vocab);
    std::vector<uint32_t> ids;
    for (uint64_t i = start; i < std::min(tokens, start + shard_tokens); i++) {
      ids.push_back(pattern(i, vocab));
    }
    w.append(ids.data(), ids.size());
    e.tokens = ids.size();
    e.sha256 = w.finish();
    e.bytes = kShardHeaderBytes + e.tokens * m.token_bytes;
    m.total_tokens += e.tokens;
    m.shards.push_back(e);
  }
  write_file_atomic(dir + "/manifest.json", manifest_to_json(m));
}

// Which window a row holds (its first token identifies it), checking every token on the way.
uint64_t window_of(const int32_t* tokens, const int32_t* targets, int64_t L, uint32_t vocab,
                   uint64_t total_windows) {
  for (uint64_t w = 0; w < total_windows; w++) {
    bool match = true;
    for (int64_t t = 0; t < L && match; t++) {
      match = tokens[t] == int32_t(pattern(w * L + t, vocab)) &&
              targets[t] == int32_t(pattern(w * L + t + 1, vocab));
    }
    if (match) return w;
  }
  return UINT64_MAX;
}

}  // namespace

TEST(Loader, WindowsCrossShardsAndTargetsAreShifted) {
  TempDir dir;
  // vocab 1000 makes window contents unique; 1001 tokens, seq_len 10 -> 100 windows.
  make_dataset(dir.path, 1001, 1000, 64);  // 16 shards: windows straddle shard boundaries
  LoaderOptions o;
  o.seq_len = 10;
  o.val_fraction = 0.1;
  TokenLoader loader(dir.path, o);
  EXPECT_EQ(loader.train_windows(), 90u);
  EXPECT_EQ(loader.val_windows(), 10u);
  std::vector<int32_t> x(4 * 10), y(4 * 10);
  std::set<uint64_t> seen;
  for (int step = 0; step < 22; step++) {  // 22 * 4 = 88 of the 90 windows: one epoch
    loader.next_batch(x.data(), y.data(), 4);
    for (int b = 0; b < 4; b++) {
      uint64_t w = window_of(&x[b * 10], &y[b * 10], 10, 1000, 100);
      ASSERT_LT(w, 90u) << "a training row is not a training window";
      EXPECT_TRUE(seen.insert(w).second) << "window " << w << " seen twice in one epoch";
    }
  }
  EXPECT_EQ(loader.cursor().epoch, 0u);
  loader.next_batch(x.data(), y.data(), 4);  // only 2 left: the epoch ends, a new one begins
  EXPECT_EQ(loader.cursor().epoch, 1u);
  EXPECT_EQ(loader.cursor().position, 4u);
  // Validation windows are the held-out tail, never trained on.
  for (int k = 0; k < 5; k++) {
    loader.val_batch(k, x.data(), y.data(), 4);
    for (int b = 0; b < 4; b++) {
      uint64_t w = window_of(&x[b * 10], &y[b * 10], 10, 1000, 100);
      EXPECT_GE(w, 90u);
      EXPECT_LT(w, 100u);
    }
  }
}

TEST(Loader, ShuffleDependsOnSeedAndEpochOnly) {
  TempDir dir;
  make_dataset(dir.path, 4001, 1000, 4001);
  auto order = [&](uint64_t seed, int steps) {
    LoaderOptions o;
    o.seq_len = 8;
    o.seed = seed;
    TokenLoader loader(dir.path, o);
    std::vector<int32_t> x(8), y(8);
    std::vector<uint64_t> ws;
    for (int i = 0; i < steps; i++) {
      loader.next_batch(x.data(), y.data(), 1);
      ws.push_back(window_of(x.data(), y.data(), 8, 1000, 500));
    }
    return ws;
  };
  auto a = order(1, 50), b = order(1, 50), c = order(2, 50);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::vector<uint64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(a, sorted) << "windows come in file order: not shuffled";
}

TEST(Loader, DataParallelRanksReadDisjointPartsOfTheSameOrder) {
  TempDir dir;
  make_dataset(dir.path, 3001, 1000, 500);
  const int64_t L = 6, B = 3;
  LoaderOptions o;
  o.seq_len = L;
  o.seed = 99;
  TokenLoader single(dir.path, o);  // one rank with the global batch of 2 ranks
  o.dp_size = 2;
  o.dp_rank = 0;
  TokenLoader rank0(dir.path, o);
  o.dp_rank = 1;
  TokenLoader rank1(dir.path, o);
  std::vector<int32_t> gx(2 * B * L), gy(2 * B * L), x0(B * L), y0(B * L), x1(B * L), y1(B * L);
  for (int step = 0; step < 200; step++) {  // several epochs
    single.next_batch(gx.data(), gy.data(), 2 * B);
    rank0.next_batch(x0.data(), y0.data(), B);
    rank1.next_batch(x1.data(), y1.data(), B);
    ASSERT_TRUE(std::equal(x0.begin(), x0.end(), gx.begin())) << "step " << step;
    ASSERT_TRUE(std::equal(x1.begin(), x1.end(), gx.begin() + B * L)) << "step " << step;
    ASSERT_TRUE(std::equal(y1.begin(), y1.end(), gy.begin() + B * L)) << "step " << step;
    ASSERT_NE(x0, x1);
  }
  // Validation batches are split between ranks the same way.
  single.val_batch(1, gx.data(), gy.data(), 2 * B);
  rank1.val_batch(1, x1.data(), y1.data(), B);
  EXPECT_TRUE(std::equal(x1.begin(), x1.end(), gx.begin() + B * L));
}

TEST(Loader, RestoredCursorContinuesWithExactlyTheSameTokens) {
  TempDir dir;
  make_dataset(dir.path, 2001, 1000, 300);
  LoaderOptions o;
  o.seq_len = 16;
  o.seed = 5;
  TokenLoader a(dir.path, o);
  std::vector<int32_t> x(4 * 16), y(4 * 16);
  std::string saved;
  std::vector<std::vector<int32_t>> after;
  for (int step = 0; step < 60; step++) {  // 118 train windows / 4 per step: crosses epochs
    if (step == 23) saved = a.cursor_json();
    a.next_batch(x.data(), y.data(), 4);
    if (step >= 23) {
      after.push_back(x);
      after.push_back(y);
    }
  }
  TokenLoader b(dir.path, o);
  b.restore_cursor(saved);
  for (size_t i = 0; i < after.size(); i += 2) {
    b.next_batch(x.data(), y.data(), 4);
    ASSERT_EQ(x, after[i]) << "resumed step " << 23 + i / 2;
    ASSERT_EQ(y, after[i + 1]);
  }
  // A cursor from other settings is refused, naming what differs.
  o.seq_len = 8;
  TokenLoader c(dir.path, o);
  std::string err = error_of([&] { c.restore_cursor(saved); });
  EXPECT_NE(err.find("seq_len = 16 but this loader has seq_len = 8"), std::string::npos) << err;
}

TEST(Loader, MissingShardIsNamed) {
  TempDir dir;
  make_dataset(dir.path, 1000, 500, 400);
  std::filesystem::remove(dir / "shard_1.bin");
  std::string err = error_of([&] { TokenLoader(dir.path, LoaderOptions{}); });
  EXPECT_NE(err.find("token shard " + (dir / "shard_1.bin") + " is missing"), std::string::npos)
      << err;
}

TEST(Loader, TruncatedShardNamesExpectedAndActualSize) {
  TempDir dir;
  make_dataset(dir.path, 1000, 500, 400);
  ASSERT_EQ(::truncate((dir / "shard_0.bin").c_str(), 500), 0);
  std::string err = error_of([&] { TokenLoader(dir.path, LoaderOptions{}); });
  EXPECT_NE(err.find(dir / "shard_0.bin"), std::string::npos) << err;
  EXPECT_NE(err.find("500 bytes on disk, expected 864"), std::string::npos) << err;
}

TEST(Loader, CorruptedShardFailsItsChecksum) {
  TempDir dir;
  make_dataset(dir.path, 1000, 500, 400);
  {
    std::fstream f(dir / "shard_2.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put(char(0x01));
  }
  std::string err = error_of([&] { TokenLoader(dir.path, LoaderOptions{}); });
  EXPECT_NE(err.find("token shard " + (dir / "shard_2.bin") + " is corrupted: sha256"),
            std::string::npos)
      << err;
}

TEST(Loader, TokenIdOutsideTheVocabularyIsRejected) {
  TempDir dir;
  make_dataset(dir.path, 1000, 500, 1000);
  // A buggy producer: id 600 >= vocab 500 at token 10, with a matching checksum.
  std::string path = dir / "shard_0.bin";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    uint16_t bad = 600;
    f.seekp(64 + 2 * 10);
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  DatasetManifest m = read_manifest(dir.path);
  m.shards[0].sha256 = sha256_file(path);
  write_file_atomic(dir / "manifest.json", manifest_to_json(m));
  std::string err = error_of([&] { TokenLoader(dir.path, LoaderOptions{}); });
  EXPECT_NE(err.find(path + ": token 10 has id 600, outside the vocabulary (size 500)"),
            std::string::npos)
      << err;
  // Without the scan at open, reading the window that holds it fails the same way.
  LoaderOptions o;
  o.verify_checksums = false;
  o.seq_len = 32;
  o.val_fraction = 0;
  TokenLoader loader(dir.path, o);
  std::vector<int32_t> x(32), y(32);
  err = error_of([&] {
    for (int i = 0; i < 31; i++) loader.next_batch(x.data(), y.data(), 1);
  });
  EXPECT_NE(err.find("token 10 has id 600, outside the vocabulary (size 500)"), std::string::npos)
      << err;
}

TEST(Loader, TooSmallDatasetSaysWhy) {
  TempDir dir;
  make_dataset(dir.path, 50, 500, 50);
  LoaderOptions o;
  o.seq_len = 64;
  std::string err = error_of([&] { TokenLoader(dir.path, o); });
  EXPECT_NE(err.find("is too small: 50 tokens make 0 windows of seq_len 64"), std::string::npos)
      << err;
}

TEST(Loader, LargeVocabularyUsesFourByteTokens) {
  TempDir dir;
  make_dataset(dir.path, 801, 70000, 100);  // vocab > 65536: uint32 shards
  EXPECT_EQ(read_manifest(dir.path).token_bytes, 4u);
  EXPECT_EQ(file_size_or_throw(dir / "shard_0.bin"), 64u + 4 * 100);
  LoaderOptions o;
  o.seq_len = 8;
  o.val_fraction = 0;
  TokenLoader loader(dir.path, o);
  std::vector<int32_t> x(8), y(8);
  for (int i = 0; i < 100; i++) {
    loader.next_batch(x.data(), y.data(), 1);
    EXPECT_LT(window_of(x.data(), y.data(), 8, 70000, 100), 100u);
  }
}

TEST(Loader, StepsReadTheSameWindowsWhateverDpAndMicroBatches) {
  // A step of G = 8 windows read as 8 micro-batches of 1 on one rank, as 2 micro-batches of 2 on
  // each of 2 ranks, and as one batch of 4 on each of 2 ranks: every step reads the same set of
  // windows, also across epoch boundaries (500 / 6 = 83 windows: an epoch is 10 steps + 3 skipped,
  // and a micro-batch-wise boundary would cut the step differently for each reading).
  TempDir dir;
  make_dataset(dir.path, 500, 1000, 500);
  const int64_t L = 6, G = 8;
  auto windows_per_step = [&](int64_t dp, int64_t batch, int steps) {
    std::vector<std::unique_ptr<TokenLoader>> ranks;
    for (int64_t r = 0; r < dp; r++) {
      LoaderOptions o;
      o.seq_len = L, o.seed = 7, o.dp_rank = r, o.dp_size = dp, o.step_windows = G;
      ranks.push_back(std::make_unique<TokenLoader>(dir.path, o));
    }
    std::vector<std::vector<uint64_t>> out;
    std::vector<int32_t> x(size_t(batch * L)), y(size_t(batch * L));
    for (int s = 0; s < steps; s++) {
      std::vector<uint64_t> ws;
      for (int64_t mb = 0; mb < G / (batch * dp); mb++)
        for (auto& loader : ranks) {
          loader->next_batch(x.data(), y.data(), batch);
          for (int64_t b = 0; b < batch; b++) ws.push_back(window_of(&x[size_t(b * L)], &y[size_t(b * L)], L, 1000, 500));
        }
      std::sort(ws.begin(), ws.end());
      out.push_back(ws);
    }
    return out;
  };
  const auto one = windows_per_step(1, 1, 35), two = windows_per_step(2, 2, 35), whole = windows_per_step(2, 4, 35);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, whole);
  // Without step_windows, the epoch boundary of micro-batches of 1 differs: the check above can fail.
  LoaderOptions o;
  o.seq_len = L, o.seed = 7;
  TokenLoader micro(dir.path, o);
  std::vector<int32_t> x(static_cast<size_t>(L)), y(static_cast<size_t>(L));
  std::vector<uint64_t> step10;
  for (int s = 0; s < 11 * G; s++) {
    micro.next_batch(x.data(), y.data(), 1);
    if (s >= 10 * G) step10.push_back(window_of(x.data(), y.data(), L, 1000, 500));
  }
  std::sort(step10.begin(), step10.end());
  EXPECT_NE(step10, one[10]);
}
