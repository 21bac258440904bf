// manifest.json of a prepared dataset directory: what the shards are and their checksums.
// Written last by `exatrain data prepare`, so a directory with a manifest is complete.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace exatrain::data {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kTokenizerModelName = "tokenizer.model";
// Limits on the dataset's small files (refused unread above them).
inline constexpr uint64_t kMaxManifestBytes = uint64_t(64) << 20;     // ~ 300 bytes per shard
inline constexpr uint64_t kMaxTokenizerBytes = uint64_t(256) << 20;   // SentencePiece models: a few MB

struct ShardEntry {
  std::string file;  // relative to the dataset directory
  uint64_t tokens = 0;
  uint64_t bytes = 0;
  std::string sha256;
};

struct InputEntry {
  std::string path;
  uint64_t bytes = 0;       // uncompressed bytes read
  uint64_t lines = 0;
  uint64_t file_bytes = 0;  // size on disk (compressed size for .xz/.gz): the cache key
};

struct DatasetManifest {
  std::string tokenizer_type;    // "sentencepiece-bpe" | "byte"
  std::string tokenizer_file;    // "" for the byte tokenizer
  std::string tokenizer_sha256;  // "" for the byte tokenizer
  uint32_t vocab_size = 0;
  uint32_t separator_id = 0;     // appended after every input line
  uint32_t token_bytes = 2;
  uint64_t total_tokens = 0;
  std::vector<ShardEntry> shards;
  std::vector<InputEntry> inputs;
  // Settings that produced it (for reproducing the directory).
  uint32_t vocab_size_requested = 0;
  uint64_t sample_lines = 0;
  uint64_t sample_lines_used = 0;
  uint64_t seed = 0;
  uint64_t shard_tokens = 0;
};

std::string manifest_to_json(const DatasetManifest& m);  // deterministic text
DatasetManifest manifest_from_json(const std::string& text, const std::string& source_name);
DatasetManifest read_manifest(const std::string& dataset_dir);

// The bytes of the dataset's tokenizer.model, checked against the manifest's sha256 ("" for the
// byte tokenizer).
std::string read_dataset_tokenizer_model(const std::string& dataset_dir);
// Loads the dataset's tokenizer (checks the tokenizer file's checksum).
std::unique_ptr<Tokenizer> open_dataset_tokenizer(const std::string& dataset_dir);

}  // namespace exatrain::data
