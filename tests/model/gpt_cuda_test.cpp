// One GPU against the CPU backend on the same weights and batches (issue 13's equivalence on a
// GPU): a Gpt forward + backward of both model families, every recomputation mode, on "cuda" and
// "cpu": losses, logits, gradients within float tolerance (the GPU sums in other orders; TF32 is
// off), and a second GPU run bit-identical to the first. Skips, saying why, without a GPU.
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

struct Result {
  std::vector<float> losses, grads, logits;
};

Result forward_backward(const std::string& backend, const ModelSpec& m, Recompute rc) {
  auto be = make_backend(backend, 2, 0);
  GptOptions o;
  o.model = m;
  o.recompute = rc;
  o.micro_batch = 2;
  Gpt g(*be, o);
  g.init_weights(42);
  g.zero_grad();
  const size_t n = size_t(2 * m.seq_len);
  auto tok = random_tokens(n, m.vocab, 1), tgt = random_tokens(n, m.vocab, 2);
  Result r;
  r.losses.push_back(g.forward(tok.data(), nullptr, tgt.data()));
  r.logits = g.download_logits();
  g.backward(nullptr, 1.0f);
  r.grads = host_copy(*be, g.grads(), g.num_params());
  return r;
}

// |got - want| <= tol (max |want|): the relative error of the whole vector, as the equivalence
// suite's 1e-5 but with room for another summation order over float32 (1e-4).
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0, err = 0;
  for (size_t i = 0; i < want.size(); i++) {
    scale = std::max(scale, double(std::fabs(want[i])));
    err = std::max(err, double(std::fabs(got[i] - want[i])));
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-30)) << what << ": max error " << err << " of max |value| " << scale;
}

TEST(GptCuda, OneGpuMatchesTheCpuBackendOnTheSameWeights) {
  std::string why;
  if (!cuda_backend_built()) GTEST_SKIP() << "this build has no CUDA backend (EXATRAIN_CUDA=OFF)";
  if (visible_cuda_devices(&why) == 0) GTEST_SKIP() << "backend cuda: " << why;
  for (auto m : {tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4),
                 tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2, false)}) {
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(testing::Message() << "activation " << int(m.activation) << " recompute " << to_string(rc));
      const Result cpu = forward_backward("cpu", m, rc), gpu = forward_backward("cuda", m, rc);
      const Result again = forward_backward("cuda", m, rc);
      expect_near_all(gpu.losses, cpu.losses, 1e-5, "loss");
      expect_near_all(gpu.logits, cpu.logits, 1e-4, "logits");
      expect_near_all(gpu.grads, cpu.grads, 1e-4, "gradients");
      EXPECT_EQ(gpu.grads, again.grads) << "two GPU runs differ";
      EXPECT_GT(cpu.losses[0], 3.0f);  // a real forward ran
    }
  }
}

}  // namespace
