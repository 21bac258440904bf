#include "data/loader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/json_fields.hpp"
#include "core/splitmix.hpp"
#include "core/sha256.hpp"
#include "data/shard.hpp"

namespace exatrain::data {

namespace fs = std::filesystem;

namespace {

// First position of an id >= vocab in tokens[0, count), or count when all are valid.
template <typename T>
uint64_t find_bad_id(const uint8_t* bytes, uint64_t count, uint32_t vocab) {
  const T* t = reinterpret_cast<const T*>(bytes);  // shard data starts 64-byte aligned
  uint64_t bad = 0;
  for (uint64_t i = 0; i < count; i++) bad |= uint64_t(t[i] >= vocab);  // vectorised scan
  if (!bad) return count;
  for (uint64_t i = 0; i < count; i++) {
    if (t[i] >= vocab) return i;
  }
  return count;
}
}  // namespace

TokenLoader::TokenLoader(const std::string& dataset_dir, const LoaderOptions& options)
    : dir_(dataset_dir), options_(options), manifest_(read_manifest(dataset_dir)) {
  const int64_t L = options.seq_len;
  EXA_CHECK(L > 0, "loader: seq_len must be positive, got {}", L);
  EXA_CHECK(options.dp_size > 0 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
            "loader: dp_rank {} is not in [0, dp_size {})", options.dp_rank, options.dp_size);
  EXA_CHECK(options.val_fraction >= 0 && options.val_fraction < 1,
            "loader: val_fraction {} is not in [0, 1)", options.val_fraction);

  uint64_t start = 0;
  for (const ShardEntry& e : manifest_.shards) {
    std::string path = (fs::path(dataset_dir) / e.file).string();
    EXA_CHECK(fs::exists(path), "token shard {} is missing (listed in {}/{})", path, dataset_dir,
              kManifestName);
    uint64_t actual = file_size_or_throw(path);
    EXA_CHECK(actual == e.bytes,
              "token shard {} is truncated or damaged: {} bytes on disk, expected {} "
              "(manifest: {} tokens)",
              path, actual, e.bytes, e.tokens);
    auto file = std::make_unique<MappedFile>(path);
    ShardHeader h = parse_shard_header(path, file->data(), file->size());
    EXA_CHECK(h.tokens == e.tokens && h.token_bytes == manifest_.token_bytes &&
                  h.vocab_size == manifest_.vocab_size,
              "token shard {}: header (tokens {}, token_bytes {}, vocab {}) disagrees with the "
              "manifest (tokens {}, token_bytes {}, vocab {})",
              path, h.tokens, h.token_bytes, h.vocab_size, e.tokens, manifest_.token_bytes,
              manifest_.vocab_size);
    if (options.verify_checksums) {
      Sha256 hash;
      hash.update(file->data(), file->size());
      std::string sum = hash.hex_digest();
      EXA_CHECK(sum == e.sha256, "token shard {} is corrupted: sha256 {} but the manifest says {}",
                path, sum, e.sha256);
      const uint8_t* body = file->data() + kShardHeaderBytes;
      uint64_t bad = h.token_bytes == 2 ? find_bad_id<uint16_t>(body, h.tokens, h.vocab_size)
                                        : find_bad_id<uint32_t>(body, h.tokens, h.vocab_size);
      EXA_CHECK(bad == h.tokens,
                "token shard {}: token {} has id {}, outside the vocabulary (size {})", path, bad,
                h.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(body)[bad]
                                   : reinterpret_cast<const uint32_t*>(body)[bad],
                h.vocab_size);
    }
    shard_start_.push_back(start);
    start += e.tokens;
    shards_.push_back(std::move(file));
  }

  const uint64_t T = manifest_.total_tokens;
  const uint64_t W = T > 0 ? (T - 1) / uint64_t(L) : 0;
  val_windows_ = options.val_fraction > 0
                     ? std::max<uint64_t>(1, uint64_t(std::floor(W * options.val_fraction)))
                     : 0;
  EXA_CHECK(W > val_windows_,
            "dataset {} is too small: {} tokens make {} windows of seq_len {}, and {} are held "
            "out for validation, leaving none to train on",
            dataset_dir, T, W, L, val_windows_);
  train_windows_ = W - val_windows_;
}

TokenLoader::~TokenLoader() = default;

void TokenLoader::copy_tokens(uint64_t first, uint64_t count, uint32_t* out) const {
  // The shard holding token `first`: the last one whose start is <= first.
  size_t s = size_t(std::upper_bound(shard_start_.begin(), shard_start_.end(), first) -
                    shard_start_.begin()) - 1;
  while (count > 0) {
    const ShardEntry& e = manifest_.shards[s];
    uint64_t local = first - shard_start_[s];
    uint64_t n = std::min(count, e.tokens - local);  // the run inside this shard
    const uint8_t* body = shards_[s]->data() + kShardHeaderBytes;
    for (uint64_t k = 0; k < n; k++) {
      uint32_t id;
      if (manifest_.token_bytes == 2) {
        uint16_t v;
        std::memcpy(&v, body + 2 * (local + k), 2);
        id = v;
      } else {
        std::memcpy(&id, body + 4 * (local + k), 4);
      }
      EXA_CHECK(id < manifest_.vocab_size,
                "token shard {}/{}: token {} has id {}, outside the vocabulary (size {})", dir_,
                e.file, local + k, id, manifest_.vocab_size);
      out[k] = id;
    }
    out += n;
    first += n;
    count -= n;
    s++;
  }
}

void TokenLoader::read_window(uint64_t window, int32_t* tokens_out, int32_t* targets_out) const {
  const int64_t L = options_.seq_len;
  std::vector<uint32_t> span(size_t(L) + 1);  // tokens [w*L, w*L + L]
  copy_tokens(window * uint64_t(L), uint64_t(L) + 1, span.data());
  for (int64_t t = 0; t < L; t++) {
    tokens_out[t] = int32_t(span[size_t(t)]);
    targets_out[t] = int32_t(span[size_t(t) + 1]);
  }
}

void TokenLoader::shuffle_for_epoch(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  permutation_.resize(train_windows_);
  for (uint64_t i = 0; i < train_windows_; i++) permutation_[i] = i;
  uint64_t rng = options_.seed ^ (0xd1b54a32d192ed03ull * (epoch + 1));
  for (uint64_t i = train_windows_ - 1; i > 0; i--) {  // Fisher-Yates
    uint64_t j = splitmix64(rng) % (i + 1);
    std::swap(permutation_[i], permutation_[j]);
  }
  permutation_epoch_ = epoch;
}

void TokenLoader::next_batch(int32_t* tokens_out, int32_t* targets_out, int64_t batch) {
  EXA_CHECK(batch > 0, "loader: batch must be positive, got {}", batch);
  const uint64_t global = uint64_t(batch) * uint64_t(options_.dp_size);
  EXA_CHECK(global <= train_windows_,
            "dataset {} is too small: a global batch of {} x {} ranks windows of seq_len {} "
            "needs {}, but only {} training windows exist",
            dir_, batch, options_.dp_size, options_.seq_len, global, train_windows_);
  const uint64_t step = options_.step_windows > 0 ? uint64_t(options_.step_windows) : global;
  EXA_CHECK(step % global == 0 && step <= train_windows_,
            "dataset {}: a step of {} windows (the global batch) must be a multiple of batch {} x {} ranks and "
            "fit the {} training windows", dir_, step, batch, options_.dp_size, train_windows_);
  // An epoch ends at a step boundary when a whole step no longer fits; the rest of it is skipped.
  if (cursor_.position % step == 0 && cursor_.position + step > train_windows_) {
    cursor_.epoch++;
    cursor_.position = 0;
  }
  shuffle_for_epoch(cursor_.epoch);
  const int64_t L = options_.seq_len;
  const uint64_t mine = cursor_.position + uint64_t(options_.dp_rank) * uint64_t(batch);
  // Never past the permutation, whatever the cursor was restored to.
  EXA_CHECK(cursor_.position <= train_windows_ && global <= train_windows_ - cursor_.position,
            "dataset {}: the data cursor (epoch {}, position {}) leaves fewer than the {} windows of a batch in the "
            "epoch's {} training windows", dir_, cursor_.epoch, cursor_.position, global, train_windows_);
  for (int64_t b = 0; b < batch; b++) {
    read_window(permutation_[mine + uint64_t(b)], tokens_out + b * L, targets_out + b * L);
  }
  cursor_.position += global;
}

void TokenLoader::val_batch(int64_t index, int32_t* tokens_out, int32_t* targets_out,
                            int64_t batch) const {
  EXA_CHECK(val_windows_ > 0, "loader: no validation windows (val_fraction is 0)");
  EXA_CHECK(index >= 0 && batch > 0, "loader: bad validation batch {} of size {}", index, batch);
  const int64_t L = options_.seq_len;
  const uint64_t first = (uint64_t(index) * uint64_t(options_.dp_size) + uint64_t(options_.dp_rank)) *
                         uint64_t(batch);
  for (int64_t b = 0; b < batch; b++) {
    uint64_t w = train_windows_ + (first + uint64_t(b)) % val_windows_;
    read_window(w, tokens_out + b * L, targets_out + b * L);
  }
}

std::string TokenLoader::cursor_json() const {
  nlohmann::json j = {{"epoch", cursor_.epoch},
                      {"position", cursor_.position},
                      {"seed", options_.seed},
                      {"seq_len", options_.seq_len},
                      {"train_windows", train_windows_},
                      {"total_tokens", manifest_.total_tokens},
                      {"first_shard_sha256",
                       manifest_.shards.empty() ? "" : manifest_.shards.front().sha256}};
  return j.dump();
}

void TokenLoader::restore_cursor(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    EXA_FAIL("data cursor is not valid JSON: {}", e.what());
  }
  EXA_CHECK(j.is_object(), "data cursor is not a JSON object: {}", json_shown(j));
  auto expect = [&](const char* key, const nlohmann::json& mine) {
    EXA_CHECK(j.contains(key), "data cursor has no \"{}\": {}", key, text);
    EXA_CHECK(j[key] == mine,
              "data cursor was saved with {} = {} but this loader has {} = {}: resuming would "
              "not see the same tokens (same dataset {} and settings needed)",
              key, j[key].dump(), key, mine.dump(), dir_);
  };
  expect("seed", options_.seed);
  expect("seq_len", options_.seq_len);
  expect("train_windows", train_windows_);
  expect("total_tokens", manifest_.total_tokens);
  expect("first_shard_sha256", manifest_.shards.empty() ? "" : manifest_.shards.front().sha256);
  EXA_CHECK(j.contains("epoch") && j.contains("position"), "data cursor lacks epoch/position: {}",
            text);
  const uint64_t epoch = json_to_uint(j["epoch"], "data cursor \"epoch\"", 0, uint64_t(1) << 62);
  const uint64_t position = json_to_uint(j["position"], "data cursor \"position\"", 0, train_windows_);
  // Checkpoints are saved between steps, so the position is a whole number of steps into the
  // epoch; anywhere else, the next step would read past the epoch's permutation.
  const uint64_t step = options_.step_windows > 0 ? uint64_t(options_.step_windows) : 1;
  EXA_CHECK(position % step == 0,
            "data cursor \"position\" = {} is not at a step boundary: expected a multiple of the global batch "
            "({} windows per step) in [0, {}] (a damaged trainer state, or a run with another global_batch)",
            position, step, train_windows_);
  cursor_.epoch = epoch;
  cursor_.position = position;
}

}  // namespace exatrain::data
