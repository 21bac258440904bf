// Shared helpers for model tests: tiny configs, random tokens, host copies of arenas.
#pragma once
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "model/gpt.hpp"

namespace exatrain::test {

inline ModelSpec tiny_model(Activation act, Norm norm, Position pos, int64_t kv_heads,
                            bool tie = true) {
  ModelSpec m;
  m.layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = kv_heads;
  m.ffn_hidden = 64;
  m.seq_len = 8;
  m.vocab = 37;  // odd: the tp=2 vocabulary slices are 19 and 18 rows
  m.activation = act;
  m.norm = norm;
  m.position = pos;
  m.tie_embeddings = tie;
  return m;
}

inline std::vector<int32_t> random_tokens(size_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

inline std::vector<float> host_copy(Backend& be, const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  be.download(h.data(), p, sizeof(float) * size_t(n));
  return h;
}

// The elements of a (possibly sharded) parameter, in shard order, read from a global tp=1
// arena `global` with the tp=1 entry `g` and the shard entry `s`.
inline std::vector<float> slice_of_global(const std::vector<float>& global, const ParamInfo& g,
                                          const ParamInfo& s) {
  std::vector<float> out(size_t(s.numel));
  const int64_t rows = s.shard_shape[0], cols = s.numel / rows;
  const int64_t gcols = g.global_shape.size() > 1 ? g.global_shape[1] : 1;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      int64_t gr = r + (s.split_dim == 0 ? s.shard_start : 0);
      int64_t gc = c + (s.split_dim == 1 ? s.shard_start : 0);
      out[size_t(r * cols + c)] = global[size_t(g.offset + gr * gcols + gc)];
    }
  return out;
}

}  // namespace exatrain::test
