// A SentencePiece model as a checkpoint or dataset carries it (tokenizer.model): loaded through
// libsentencepiece (src/data/tokenizer.cpp), then text encoded and the ids decoded.
#include <string>
#include <vector>

#include "data/tokenizer.hpp"
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  exatrain::fuzz::expect_clear_errors([&] {
    auto tok = exatrain::data::make_sentencepiece_tokenizer(bytes, "fuzz/tokenizer.model");
    std::vector<uint32_t> ids;
    tok->encode("And God said, Let there be light: and there was light. 1611 \xc3\xa9\xe2\x82\xac", ids);
    for (uint32_t id : ids) exatrain::fuzz::require(id < tok->vocab_size(), "encoded id in vocabulary");
    ids.push_back(tok->separator_id());
    (void)tok->decode(ids);
  });
  return 0;
}
