// Initialisation and the weight-decay set, decided here from the parameter NAMES (not from the
// layout's own init_std / decay fields): GPT-2 init N(0, 0.02) for matrices and embeddings,
// N(0, 0.02 / sqrt(2 L)) for the residual output projections (o_proj, fc2 / down_proj), zero
// biases, unit norm weights; AdamW decay on matrices and embeddings only.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/gpt.hpp"
#include "model_util.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

enum class Kind { bias, norm_weight, residual_projection, matrix };

Kind kind_of(const std::string& name) {
  if (name.ends_with(".bias")) return Kind::bias;
  if (name.starts_with("ln_f.") || name.find(".ln_") != std::string::npos) return Kind::norm_weight;
  if (name.ends_with("o_proj.weight") || name.ends_with("fc2.weight") ||
      name.ends_with("down_proj.weight"))
    return Kind::residual_projection;
  return Kind::matrix;
}

void check_init(const ModelSpec& m) {
  auto be = make_cpu_backend(2);
  GptOptions o;
  o.model = m;
  o.micro_batch = 1;
  Gpt g(*be, o);
  g.init_weights(1234);
  const std::vector<float> w = host_copy(*be, g.params(), g.num_params());
  const double std_res = 0.02 / std::sqrt(2.0 * double(m.layers));
  int seen[4] = {0, 0, 0, 0};
  for (const ParamInfo& p : g.layout().entries()) {
    SCOPED_TRACE(p.name);
    const Kind k = kind_of(p.name);
    seen[int(k)]++;
    const float* x = w.data() + p.offset;
    if (k == Kind::bias || k == Kind::norm_weight) {
      const float want = k == Kind::bias ? 0.0f : 1.0f;
      for (int64_t i = 0; i < p.numel; i++) ASSERT_EQ(x[i], want) << "element " << i;
      EXPECT_FALSE(p.decay) << "biases and norm weights are not decayed";
      continue;
    }
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < p.numel; i++) sum += x[i];
    const double mean = sum / double(p.numel);
    for (int64_t i = 0; i < p.numel; i++) sq += (x[i] - mean) * (x[i] - mean);
    const double sd = std::sqrt(sq / double(p.numel - 1));
    const double want = k == Kind::residual_projection ? std_res : 0.02;
    // >= 16k elements each: the sample std's relative error is ~1/sqrt(2n) < 0.6 %.
    EXPECT_NEAR(sd / want, 1.0, 0.03) << "sample std " << sd << " over " << p.numel;
    EXPECT_LT(std::abs(mean), 4.0 * want / std::sqrt(double(p.numel))) << "mean " << mean;
    EXPECT_TRUE(p.decay) << "matrices and embeddings are decayed";
  }
  EXPECT_EQ(seen[int(Kind::residual_projection)], 2 * m.layers);
  // q, k, v and the MLP inputs (fc1; or gate and up) per layer, wte, wpe (learned), lm_head
  // (untied): every matrix was checked above.
  const int64_t mlp_inputs = m.activation == Activation::gelu ? 1 : 2;
  EXPECT_EQ(seen[int(Kind::matrix)], (3 + mlp_inputs) * m.layers + 1 +
                                         (m.position == Position::learned ? 1 : 0) +
                                         (m.tie_embeddings ? 0 : 1));
  EXPECT_EQ(seen[int(Kind::norm_weight)], 2 * m.layers + 1);
}

TEST(GptInit, Gpt2StyleStdsZeroBiasesUnitNormsAndDecaySet) {
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4,
                           /*tie=*/false);
  m.layers = 4;
  m.hidden = 256;
  m.ffn_hidden = 1024;
  m.seq_len = 64;
  m.vocab = 1000;
  check_init(m);
}

TEST(GptInit, LlamaStyleStdsAndDecaySet) {
  ModelSpec m = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2);
  m.layers = 4;
  m.hidden = 256;
  m.ffn_hidden = 704;
  m.seq_len = 64;
  m.vocab = 1000;
  check_init(m);
}

}  // namespace
