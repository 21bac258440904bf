// The memory-mapped token loader (docs/data.md, "Loader semantics").
//
// The shards of a dataset form one token stream of T tokens. It is cut into W = (T-1)/L
// windows of L+1 tokens (L = seq_len; window w starts at token w*L), so inputs are tokens
// [0, L) of a window and targets tokens [1, L+1). The last V windows (val_fraction of them, at
// least one) are held out for validation; the others are shuffled per epoch by a seeded
// permutation. Each call to next_batch takes the next batch*dp_size windows of the permutation
// and rank r reads windows [r*batch, (r+1)*batch) of them, so the ranks read disjoint parts and
// the order of windows seen does not depend on dp_size. The cursor (epoch, position) is all the
// state: saving and restoring it resumes exactly.
//
// Owns (room data/): tokenizers, `data prepare`, the shard format, the dataset manifest, this
// loader, TokenSource and its implementations (token_source.hpp). Host memory only.
// May use: core/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fileio.hpp"
#include "data/manifest.hpp"

namespace exatrain::data {

struct LoaderOptions {
  int64_t seq_len = 256;
  uint64_t seed = 1234;
  double val_fraction = 0.05;    // 0 = no validation windows
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  // Windows one optimizer step reads, all ranks together (the global batch; 0: one call's batch x
  // dp_size). An epoch ends only at a step boundary, so where it ends, and thus the order of the
  // tokens, does not depend on dp or on how the step is cut into micro-batches.
  int64_t step_windows = 0;
  bool verify_checksums = true;  // sha256 of every shard + a scan of all ids at open
};

struct DataCursor {
  uint64_t epoch = 0;
  uint64_t position = 0;  // windows of this epoch's permutation consumed, all ranks together
};

class TokenLoader {
 public:
  TokenLoader(const std::string& dataset_dir, const LoaderOptions& options);
  ~TokenLoader();

  // tokens_out, targets_out: [batch, seq_len] row-major; targets are the next tokens.
  void next_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch);
  // The index-th validation batch of this rank (stateless; wraps around the held-out windows).
  void val_batch(int64_t index, int32_t* tokens_out, int32_t* targets_out, int64_t batch) const;

  DataCursor cursor() const { return cursor_; }
  // The cursor as JSON, with the settings it is valid for (checked by restore_cursor).
  std::string cursor_json() const;
  void restore_cursor(const std::string& json);

  const DatasetManifest& manifest() const { return manifest_; }
  uint64_t total_tokens() const { return manifest_.total_tokens; }
  uint32_t vocab_size() const { return manifest_.vocab_size; }
  uint64_t train_windows() const { return train_windows_; }
  uint64_t val_windows() const { return val_windows_; }
  int64_t seq_len() const { return options_.seq_len; }

 private:
  void read_window(uint64_t window, int32_t* tokens_out, int32_t* targets_out) const;
  void copy_tokens(uint64_t first, uint64_t count, uint32_t* out) const;  // across shards
  void shuffle_for_epoch(uint64_t epoch);

  std::string dir_;
  LoaderOptions options_;
  DatasetManifest manifest_;
  std::vector<std::unique_ptr<MappedFile>> shards_;
  std::vector<uint64_t> shard_start_;  // first global token index of each shard
  uint64_t train_windows_ = 0, val_windows_ = 0;
  std::vector<uint64_t> permutation_;  // of the training windows, for permutation_epoch_
  uint64_t permutation_epoch_ = UINT64_MAX;
  DataCursor cursor_;
};

}  // namespace exatrain::data
