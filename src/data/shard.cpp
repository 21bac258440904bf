#include "data/shard.hpp"

#include <cstring>

#include "core/check.hpp"

namespace exatrain::data {

ShardWriter::ShardWriter(const std::string& path, uint32_t vocab_size)
    : out_(path), vocab_size_(vocab_size), token_bytes_(token_bytes_for_vocab(vocab_size)) {
  uint8_t zeros[kShardHeaderBytes] = {};
  out_.write(zeros, sizeof(zeros));  // placeholder, patched in finish()
}

void ShardWriter::append(const uint32_t* tokens, uint64_t count) {
  staging_.resize(count * token_bytes_);
  for (uint64_t i = 0; i < count; i++) {
    EXA_CHECK(tokens[i] < vocab_size_, "token id {} is outside the vocabulary (size {}) in {}",
              tokens[i], vocab_size_, out_.path());
    if (token_bytes_ == 2) {
      uint16_t t = uint16_t(tokens[i]);
      std::memcpy(&staging_[2 * i], &t, 2);
    } else {
      std::memcpy(&staging_[4 * i], &tokens[i], 4);
    }
  }
  out_.write(staging_.data(), staging_.size());
  tokens_ += count;
}

std::string ShardWriter::finish() {
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, 8);
  h.version = kShardVersion;
  h.token_bytes = token_bytes_;
  h.tokens = tokens_;
  h.vocab_size = vocab_size_;
  h.header_bytes = uint32_t(kShardHeaderBytes);
  out_.pwrite(&h, sizeof(h), 0);
  out_.sync_and_close();
  return sha256_file(out_.path());
}

ShardHeader parse_shard_header(const std::string& path, const uint8_t* data, uint64_t file_size) {
  EXA_CHECK(file_size >= kShardHeaderBytes,
            "token shard {} is truncated: {} bytes, smaller than the {}-byte header", path,
            file_size, kShardHeaderBytes);
  ShardHeader h;
  std::memcpy(&h, data, sizeof(h));
  EXA_CHECK(std::memcmp(h.magic, kShardMagic, 8) == 0,
            "{} is not an exatrain token shard (bad magic number)", path);
  EXA_CHECK(h.version == kShardVersion, "token shard {} has format version {}, expected {}", path,
            h.version, kShardVersion);
  EXA_CHECK(h.token_bytes == 2 || h.token_bytes == 4,
            "token shard {} has token_bytes {}, expected 2 or 4", path, h.token_bytes);
  EXA_CHECK(h.header_bytes == kShardHeaderBytes, "token shard {} has header_bytes {}, expected {}",
            path, h.header_bytes, kShardHeaderBytes);
  // The count comes from the file: compare it with the size by division, so that no product wraps
  // (2^63 tokens of 2 bytes would otherwise "need" 64 bytes and the loader read past the mapping).
  const uint64_t body = file_size - kShardHeaderBytes;
  EXA_CHECK(body % h.token_bytes == 0 && h.tokens == body / h.token_bytes,
            "token shard {} is truncated or damaged: {} bytes on disk hold {} tokens of {} bytes, but the header "
            "says {} tokens", path, file_size, body / h.token_bytes, h.token_bytes, h.tokens);
  return h;
}

}  // namespace exatrain::data
