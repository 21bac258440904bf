// Tokenizers: SentencePiece (Debian's libsentencepiece; BPE with byte fallback) or plain bytes.
// Both map one line of text to ids; a line ends with separator_id() (EOS for SentencePiece,
// the byte '\n' for the byte tokenizer) so generated text keeps its line structure.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace exatrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual uint32_t vocab_size() const = 0;
  virtual uint32_t separator_id() const = 0;          // appended after every line
  virtual std::string type() const = 0;               // "sentencepiece-bpe" | "byte"
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;  // appends
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;  // separator -> '\n'
};

// The byte tokenizer: id = byte value, vocabulary 256.
std::unique_ptr<Tokenizer> make_byte_tokenizer();
// A SentencePiece tokenizer from a serialized model (the bytes of tokenizer.model).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& source_name);

struct SentencePieceTrainOptions {
  uint32_t vocab_size = 8192;
  uint64_t seed = 1234;
  bool verbose = false;  // SentencePiece's own training log on stderr
};
// Trains a BPE model (byte fallback, identity normalisation) on `lines`; returns the
// serialized model. Deterministic: one thread, no internal sampling or shuffling (the caller
// passes an already bounded, deterministic sample) and a fixed random seed.
std::string train_sentencepiece(const std::vector<std::string>& lines,
                                const SentencePieceTrainOptions& options);

}  // namespace exatrain::data
