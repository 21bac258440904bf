// Shared helpers for model tests: tiny configs, random tokens, host copies of arenas.
#pragma once
#include <algorithm>
#include <barrier>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "model/gpt.hpp"
#include "model/parallel_hooks.hpp"

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

// In-process tensor parallelism: each rank runs in its own thread; a collective copies every
// rank's buffer into a shared slot, waits, and combines the slots in rank order.
class InProcessHooks final : public ParallelHooks {
 public:
  struct Shared {
    explicit Shared(int n) : size(n), sync(n), slots(size_t(n)) {}
    int size;
    std::barrier<> sync;
    std::vector<std::vector<float>> slots;
  };
  InProcessHooks(Shared& s, int rank) : s_(s), rank_(rank) {}
  void input_grad_allreduce(float* g, int64_t n) override { reduce(g, n, false); }
  void partial_sum_allreduce(float* d, int64_t n) override { reduce(d, n, false); }
  void vocab_max_allreduce(float* d, int64_t n) override { reduce(d, n, true); }
  void vocab_sum_allreduce(float* d, int64_t n) override { reduce(d, n, false); }
  void sp_all_gather(const float* local, float* full, int64_t n) override {
    s_.slots[size_t(rank_)].assign(local, local + n);
    s_.sync.arrive_and_wait();
    for (int r = 0; r < s_.size; r++)
      std::copy(s_.slots[size_t(r)].begin(), s_.slots[size_t(r)].end(), full + r * n);
    s_.sync.arrive_and_wait();
  }
  void sp_reduce_scatter(const float* full, float* local, int64_t n) override {
    s_.slots[size_t(rank_)].assign(full, full + n * s_.size);
    s_.sync.arrive_and_wait();
    for (int64_t i = 0; i < n; i++) {
      float acc = s_.slots[0][size_t(rank_ * n + i)];
      for (int r = 1; r < s_.size; r++) acc += s_.slots[size_t(r)][size_t(rank_ * n + i)];
      local[i] = acc;
    }
    s_.sync.arrive_and_wait();
  }

 private:
  void reduce(float* data, int64_t n, bool max) {
    s_.slots[size_t(rank_)].assign(data, data + n);
    s_.sync.arrive_and_wait();
    for (int64_t i = 0; i < n; i++) {
      float acc = s_.slots[0][size_t(i)];
      for (int r = 1; r < s_.size; r++)
        acc = max ? std::max(acc, s_.slots[size_t(r)][size_t(i)]) : acc + s_.slots[size_t(r)][size_t(i)];
      data[i] = acc;
    }
    s_.sync.arrive_and_wait();  // nobody refills a slot before every rank has read it
  }
  Shared& s_;
  int rank_;
};

}  // namespace exatrain::test
