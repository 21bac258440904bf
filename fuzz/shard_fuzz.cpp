// A token shard (src/data/shard.cpp) through the memory-mapped loader (src/data/loader.cpp): the
// input is the shard file; the manifest beside it is made to agree with what the shard's header
// claims (its token count, token width and vocabulary), so the loader maps the file, checks the
// header against its size, scans the ids and reads training and validation batches from it.
#include <cstring>
#include <string>
#include <vector>

#include "core/sha256.hpp"
#include "data/loader.hpp"
#include "data/manifest.hpp"
#include "data/shard.hpp"
#include "harness.hpp"

using namespace exatrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clear_errors([&] { data::parse_shard_header("fuzz/shard_00000.bin", data, size); });
  data::ShardHeader h{};
  std::memcpy(&h, data, std::min(size, sizeof(h)));
  const uint32_t tb = h.token_bytes == 4 ? 4 : 2;
  data::DatasetManifest m;
  m.tokenizer_type = "byte";
  m.vocab_size = h.vocab_size;
  m.separator_id = 0;
  m.token_bytes = tb;
  data::ShardEntry e;
  e.file = "shard_00000.bin";
  e.tokens = size >= 64 ? (size - 64) / tb : 0;
  e.bytes = 64 + e.tokens * tb;
  e.sha256 = sha256_hex(bytes);
  m.shards.push_back(e);
  m.total_tokens = e.tokens;
  fuzz::write_scratch("shard_00000.bin", bytes);
  fuzz::write_scratch("manifest.json", data::manifest_to_json(m));
  fuzz::expect_clear_errors([&] {
    data::LoaderOptions o;
    o.seq_len = 3;
    o.val_fraction = 0.25;
    o.step_windows = 2;
    data::TokenLoader loader(fuzz::scratch_dir(), o);
    std::vector<int32_t> tokens(6), targets(6);
    for (int i = 0; i < 3; i++) loader.next_batch(tokens.data(), targets.data(), 2);
    loader.val_batch(0, tokens.data(), targets.data(), 2);
    for (int32_t t : tokens) fuzz::require(t >= 0 && uint32_t(t) < loader.vocab_size(), "token id in vocabulary");
  });
  return 0;
}
