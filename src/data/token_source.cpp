#include "data/token_source.hpp"

#include "core/check.hpp"
#include "data/loader.hpp"

namespace exatrain {

InMemoryTokenStream::InMemoryTokenStream(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {
  EXA_CHECK(tokens_.size() >= 2, "token stream: needs at least 2 tokens, got {}", tokens_.size());
}

void InMemoryTokenStream::next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) {
  const uint64_t n = tokens_.size();
  for (int64_t b = 0; b < B; b++) {
    for (int64_t t = 0; t < T; t++) {
      inputs[b * T + t] = tokens_[(pos_ + uint64_t(t)) % n];
      targets[b * T + t] = tokens_[(pos_ + uint64_t(t) + 1) % n];
    }
    pos_ = (pos_ + uint64_t(T)) % n;
  }
}

void LoaderSource::next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) {
  EXA_CHECK(T == loader_.seq_len(), "train: batch of {} tokens asked of a loader of sequences of {}", T,
            loader_.seq_len());
  loader_.next_batch(inputs, targets, B);
}

uint64_t LoaderSource::position() const { return loader_.cursor().position; }

void LoaderSource::seek(uint64_t) { EXA_FAIL("train: restore the loader through its cursor JSON"); }

}  // namespace exatrain
