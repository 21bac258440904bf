#include "data/tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "core/check.hpp"

namespace exatrain::data {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  uint32_t vocab_size() const override { return 256; }
  uint32_t separator_id() const override { return '\n'; }
  std::string type() const override { return "byte"; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string s;
    s.reserve(ids.size());
    for (uint32_t id : ids) {
      EXA_CHECK(id < 256, "byte tokenizer: id {} is outside the vocabulary (size 256)", id);
      s.push_back(char(id));
    }
    return s;
  }
};

// libsentencepiece reports most problems as a Status but throws from within (its darts trie
// refuses a crafted model's zero-length piece with an exception, found by fuzz/tokenizer_fuzz.cpp):
// such an exception becomes an Error naming the model and the call.
template <class F>
auto sentencepiece_call(const std::string& source, const char* what, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    EXA_FAIL("SentencePiece model {}: {} failed inside libsentencepiece: {}", source, what, e.what());
  }
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& model_bytes, const std::string& source) : source_(source) {
    auto status = sentencepiece_call(source_, "loading", [&] { return sp_.LoadFromSerializedProto(model_bytes); });
    EXA_CHECK(status.ok(), "cannot load SentencePiece model {}: {}", source, status.ToString());
    EXA_CHECK(sp_.eos_id() >= 0, "SentencePiece model {} has no end-of-sentence piece", source);
  }
  uint32_t vocab_size() const override { return uint32_t(sp_.GetPieceSize()); }
  uint32_t separator_id() const override { return uint32_t(sp_.eos_id()); }
  std::string type() const override { return "sentencepiece-bpe"; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    auto status =
        sentencepiece_call(source_, "encode", [&] { return sp_.Encode(absl::string_view(text.data(), text.size()), &ids); });
    EXA_CHECK(status.ok(), "SentencePiece encode failed: {}", status.ToString());
    for (int id : ids) out.push_back(uint32_t(id));
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    // Decode line by line so that each separator becomes a newline.
    std::string text;
    std::vector<int> line;
    auto flush = [&] {
      std::string piece;
      auto status = sentencepiece_call(source_, "decode", [&] { return sp_.Decode(line, &piece); });
      EXA_CHECK(status.ok(), "SentencePiece decode failed: {}", status.ToString());
      text += piece;
      line.clear();
    };
    for (uint32_t id : ids) {
      EXA_CHECK(id < vocab_size(), "token id {} is outside the vocabulary (size {})", id,
                vocab_size());
      if (id == separator_id()) {
        flush();
        text += '\n';
      } else {
        line.push_back(int(id));
      }
    }
    flush();
    return text;
  }

 private:
  std::string source_;  // where the model came from, for messages
  sentencepiece::SentencePieceProcessor sp_;
};

// Feeds our in-memory sample to the trainer (so it never reads files or samples by itself).
class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return index_ >= lines_.size(); }
  void Next() override { index_++; }
  const std::string& value() const override { return lines_[index_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t index_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& source_name) {
  return std::make_unique<SentencePieceTokenizer>(model_bytes, source_name);
}

std::string train_sentencepiece(const std::vector<std::string>& lines,
                                const SentencePieceTrainOptions& options) {
  EXA_CHECK(!lines.empty(), "no text to train the tokenizer on (all inputs are empty)");
  EXA_CHECK(options.vocab_size >= 300,
            "--vocab-size {} is too small for a BPE tokenizer with byte fallback (256 byte "
            "pieces + specials); use at least 300, or --tokenizer byte",
            options.vocab_size);
  sentencepiece::SetRandomGeneratorSeed(unsigned(options.seed));
  // Settings in the style of Llama's tokenizer: BPE, byte fallback (no unknown tokens), no
  // normalisation (decode(encode(x)) == x), digits split.
  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"hard_vocab_limit", "false"},  // a small input may support fewer pieces: not an error
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"max_sentence_length", "8192"},
      // Determinism: our caller samples; the trainer must take every line, in order, on one
      // thread (its multi-threaded loops and input shuffling are the sources of variation).
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", "1"},
      {"minloglevel", options.verbose ? "0" : "1"},
  };
  VectorIterator it(lines);
  std::string model;
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  EXA_CHECK(status.ok(), "SentencePiece training failed: {}", status.ToString());
  return model;
}

}  // namespace exatrain::data
