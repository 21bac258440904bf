#include "job/model_shapes.hpp"

#include <algorithm>

namespace exatrain {

VocabSlice vocab_slice(int64_t vocab, int64_t tp, int64_t rank) {
  const int64_t per = (vocab + tp - 1) / tp;
  const int64_t start = std::min(vocab, per * rank);
  return {start, std::min(vocab, start + per) - start};
}

}  // namespace exatrain
