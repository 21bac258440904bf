// The token shard file format (docs/data.md): a 64-byte little-endian header, then the tokens.
//
//   offset  size  field
//        0     8  magic "EXATOKS\0"
//        8     4  version (1)
//       12     4  token_bytes: 2 (uint16 tokens) or 4 (uint32 tokens)
//       16     8  token count
//       24     4  vocab_size: every token id is < vocab_size
//       28     4  header_bytes (64): where the tokens start
//       32    32  reserved, zero
//       64     -  token_count * token_bytes bytes of little-endian token ids
#pragma once
#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fileio.hpp"

namespace exatrain::data {

static_assert(std::endian::native == std::endian::little, "shards are little-endian");

inline constexpr char kShardMagic[8] = {'E', 'X', 'A', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint64_t kShardHeaderBytes = 64;

struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t tokens;
  uint32_t vocab_size;
  uint32_t header_bytes;
  uint8_t reserved[32];
};
static_assert(sizeof(ShardHeader) == kShardHeaderBytes);

// 2 bytes per token when every id fits in uint16, else 4.
inline uint32_t token_bytes_for_vocab(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Writes one shard: tokens are appended, the header is patched in at finish().
class ShardWriter {
 public:
  ShardWriter(const std::string& path, uint32_t vocab_size);
  void append(const uint32_t* tokens, uint64_t count);  // ids must be < vocab_size
  // Writes the header, fsyncs and closes; returns the file's SHA-256.
  std::string finish();
  uint64_t tokens() const { return tokens_; }

 private:
  OutputFile out_;
  uint32_t vocab_size_;
  uint32_t token_bytes_;
  uint64_t tokens_ = 0;
  std::vector<uint8_t> staging_;
};

// Reads and checks a header (magic, version, dtype, size of the file against the count).
// `file_size` is the size on disk; every error names `path`.
ShardHeader parse_shard_header(const std::string& path, const uint8_t* data, uint64_t file_size);

}  // namespace exatrain::data
