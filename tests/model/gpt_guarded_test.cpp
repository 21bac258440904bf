// The model never dereferences device memory: a Gpt forward + backward on the guarded CPU
// backend (device memory PROT_NONE outside ops; any host access aborts the test) gives
// bit-identical losses, gradients, parameters and logits to the CPU backend on the same
// weights and batches, for both model families, every recomputation mode, two micro-batches
// in flight (1F1B slots, gradient accumulation), lazily allocated arenas and a two-stage
// pipeline split (device input and output gradient handed between stages).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/gpt.hpp"
#include "model_util.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

struct Run {
  std::vector<float> losses, grads, params, logits;
};

// Two micro-batches in slots 0 and 1, backward in 1F1B order, gradients accumulated.
Run whole_model(const std::string& backend, const ModelSpec& m, Recompute rc, bool lazy) {
  auto be = make_backend(backend, 2, 0);
  GptOptions o;
  o.model = m;
  o.recompute = rc;
  o.micro_batch = 2;
  o.activation_slots = 2;
  o.lazy_grads = lazy;
  Gpt g(*be, o);
  g.init_weights(42);
  if (!lazy) g.zero_grad();  // lazy arenas start at zero and are never zeroed whole
  const size_t n = size_t(2 * m.seq_len);
  auto ta = random_tokens(n, m.vocab, 1), ya = random_tokens(n, m.vocab, 2);
  auto tb = random_tokens(n, m.vocab, 3), yb = random_tokens(n, m.vocab, 4);
  Run r;
  r.losses.push_back(g.forward(ta.data(), nullptr, ya.data(), 0));
  r.losses.push_back(g.forward(tb.data(), nullptr, yb.data(), 1));
  r.logits = g.download_logits(1);
  g.backward(nullptr, 0.5f, 1);
  g.backward(nullptr, 0.5f, 0);
  r.grads = host_copy(*be, g.grads(), g.num_params());
  r.params = host_copy(*be, g.params(), g.num_params());
  return r;
}

// Stages [0, 1) (embedding) and [1, 2) (head): the activation and its gradient cross as
// device pointers.
Run two_stages(const std::string& backend, const ModelSpec& m) {
  auto be = make_backend(backend, 2, 0);
  GptOptions s0, s1;
  s0.model = s1.model = m;
  s0.micro_batch = s1.micro_batch = 2;
  s0.stage = {0, 1, true, false};
  s1.stage = {1, 2, false, true};
  Gpt a(*be, s0), b(*be, s1);
  a.init_weights(9);
  b.init_weights(9);
  a.zero_grad();
  b.zero_grad();
  const size_t n = size_t(2 * m.seq_len);
  auto tok = random_tokens(n, m.vocab, 5), tgt = random_tokens(n, m.vocab, 6);
  Run r;
  a.forward(tok.data(), nullptr, nullptr);
  r.losses.push_back(b.forward(nullptr, a.output(), tgt.data()));
  b.backward(nullptr, 1.0f);
  a.backward(b.input_grad(), 1.0f);
  r.grads = host_copy(*be, a.grads(), a.num_params());
  auto bg = host_copy(*be, b.grads(), b.num_params());
  r.grads.insert(r.grads.end(), bg.begin(), bg.end());
  return r;
}

void expect_identical(const Run& cpu, const Run& guarded) {
  EXPECT_EQ(cpu.losses, guarded.losses);
  EXPECT_EQ(cpu.grads, guarded.grads);
  EXPECT_EQ(cpu.params, guarded.params);
  EXPECT_EQ(cpu.logits, guarded.logits);
  for (float l : cpu.losses) EXPECT_GT(l, 3.0f);  // ~ln(37) at init: a real forward ran
  float gmax = 0;
  for (float g : cpu.grads) gmax = std::max(gmax, std::fabs(g));
  EXPECT_GT(gmax, 0.0f);  // and a real backward
}

TEST(GptGuarded, ForwardBackwardBitIdenticalToCpuBackend) {
  for (auto m : {tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4),
                 tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2, false)}) {
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(testing::Message() << "activation " << int(m.activation) << " recompute "
                                      << to_string(rc));
      expect_identical(whole_model("cpu", m, rc, false), whole_model("cpu-guarded", m, rc, false));
    }
  }
}

TEST(GptGuarded, LazyArenasAndPipelineStagesBitIdenticalToCpuBackend) {
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4, false);
  expect_identical(whole_model("cpu", m, Recompute::none, true),
                   whole_model("cpu-guarded", m, Recompute::none, true));
  expect_identical(two_stages("cpu", m), two_stages("cpu-guarded", m));
}

}  // namespace
