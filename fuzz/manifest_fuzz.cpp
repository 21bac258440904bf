// The dataset manifest reader (src/data/manifest.cpp): every number an integer of its range, every
// name a plain file name, sizes consistent (shard bytes = 64 + tokens x token_bytes, no overflow).
#include <string>

#include "data/manifest.hpp"
#include "data/shard.hpp"
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  exatrain::fuzz::expect_clear_errors([&] {
    const exatrain::data::DatasetManifest m = exatrain::data::manifest_from_json(text, "fuzz/manifest.json");
    // What an accepted manifest promises the loader.
    uint64_t sum = 0;
    for (const auto& s : m.shards) {
      exatrain::fuzz::require(s.bytes == exatrain::data::kShardHeaderBytes + s.tokens * m.token_bytes, "shard bytes");
      sum += s.tokens;
    }
    exatrain::fuzz::require(sum == m.total_tokens, "total tokens");
    exatrain::fuzz::require(m.separator_id < m.vocab_size, "separator id");
  });
  return 0;
}
