// Where training tokens come from. The trainer asks for micro-batches of B sequences of T
// tokens with their next-token targets; the data engineer's memory-mapped loader implements
// the same interface.
#pragma once
#include <cstdint>
#include <vector>

namespace exatrain {
namespace data {
class TokenLoader;
}

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // inputs, targets: host arrays [B*T]; targets[i] is the token after inputs[i].
  virtual void next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) = 0;
  // Opaque resumable position (saved in checkpoints).
  virtual uint64_t position() const = 0;
  virtual void seek(uint64_t position) = 0;
};

// A token stream held in memory, read sequentially: each sequence is T+1 consecutive tokens,
// consecutive sequences advance by T; wraps around at the end.
class InMemoryTokenStream final : public TokenSource {
 public:
  explicit InMemoryTokenStream(std::vector<int32_t> tokens);
  void next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) override;
  uint64_t position() const override { return pos_; }
  void seek(uint64_t position) override { pos_ = position % tokens_.size(); }

 private:
  std::vector<int32_t> tokens_;
  uint64_t pos_ = 0;
};

// The memory-mapped loader (data/loader.hpp) as a TokenSource: asks of it batches of its own
// sequence length only (anything else is an error naming both). Its resumable position is the
// loader's cursor JSON (TokenLoader::cursor_json / restore_cursor), so seek() is refused.
class LoaderSource final : public TokenSource {
 public:
  explicit LoaderSource(data::TokenLoader& loader) : loader_(loader) {}
  void next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) override;
  uint64_t position() const override;
  void seek(uint64_t position) override;

 private:
  data::TokenLoader& loader_;
};

}  // namespace exatrain
