// Shape arithmetic of a model that the model, the planner and the runtime must agree on, kept
// here (below all three) so that each computes it with one definition.
#pragma once
#include <cstdint>

namespace exatrain {

// The vocabulary rows tensor-parallel rank `rank` of `tp` holds in the vocabulary-parallel
// embedding and LM head: ceil(vocab / tp) rows each, the last rank(s) the remainder. The
// vocabulary is NOT padded to a multiple of tp (Megatron pads it to a multiple of
// make_vocab_size_divisible_by * tp, which adds logits the softmax sees): the model stays the
// tp = 1 model, slices may differ by a few rows. The planner counts the same rows.
struct VocabSlice {
  int64_t start = 0, rows = 0;
};
VocabSlice vocab_slice(int64_t vocab, int64_t tp, int64_t rank);

}  // namespace exatrain
