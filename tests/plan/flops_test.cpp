// FLOP and parameter counts against the closed forms of Narayanan et al. SC21 (App. A) and the
// published parameter counts of released models.
#include <gtest/gtest.h>

#include "plan/flops.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {
ModelSpec gpt(int64_t l, int64_t h, int64_t a, int64_t s, int64_t v) {
  ModelSpec m;
  m.layers = l; m.hidden = h; m.heads = a; m.kv_heads = a; m.ffn_hidden = 4 * h;
  m.seq_len = s; m.vocab = v;
  return m;
}
ModelSpec llama3_8b() {
  ModelSpec m;
  m.layers = 32; m.hidden = 4096; m.heads = 32; m.kv_heads = 8; m.ffn_hidden = 14336;
  m.seq_len = 8192; m.vocab = 128256; m.activation = Activation::swiglu; m.norm = Norm::rmsnorm;
  m.position = Position::rope; m.tie_embeddings = false; m.bias = false;
  return m;
}
}  // namespace

TEST(Flops, ModelFlopsMatchMegatron72Formula) {
  for (auto m : {gpt(96, 12288, 96, 2048, 51200), gpt(128, 25600, 160, 2048, 51200),
                 gpt(24, 2304, 24, 2048, 51200)}) {
    double B = 1536, s = m.seq_len, l = m.layers, h = m.hidden, V = m.vocab;
    double expected = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    EXPECT_NEAR(model_flops_per_step(m, 1536) / expected, 1.0, 1e-12);
  }
}

TEST(Flops, FullRecomputeHardwareFlopsMatchMegatron96Formula) {
  auto m = gpt(105, 20480, 128, 2048, 51200);
  double B = 2240, s = 2048, l = 105, h = 20480, V = 51200;
  double expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  EXPECT_NEAR(hardware_flops_per_step(m, 2240, Recompute::full) / expected, 1.0, 1e-12);
  EXPECT_EQ(hardware_flops_per_step(m, 2240, Recompute::none), model_flops_per_step(m, 2240));
  // Selective recomputation re-runs only the attention core: 4*s*h per token per layer.
  EXPECT_DOUBLE_EQ(recompute_flops_per_step(m, 2240, Recompute::selective), B * s * l * 4 * s * h);
}

TEST(Flops, GptParametersMatchMegatronFormulaPlusFinalNorm) {
  // P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) counts layers and embeddings; the final
  // LayerNorm (2h) is the only term it leaves out.
  auto m = gpt(96, 12288, 96, 2048, 51200);
  double l = 96, h = 12288, V = 51200, s = 2048;
  double formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  EXPECT_NEAR(double(total_parameters(m)) / (formula + 2 * h), 1.0, 1e-14);
}

TEST(Flops, PublishedParameterCounts) {
  // GPT-2 small (Hugging Face openai-community/gpt2): 124,439,808 parameters.
  EXPECT_EQ(total_parameters(gpt(12, 768, 12, 1024, 50257)), 124439808);
  // Llama 3 8B (meta-llama/Meta-Llama-3-8B): 8,030,261,248 parameters.
  EXPECT_EQ(total_parameters(llama3_8b()), 8030261248);
}

TEST(Flops, BiasesAndNormsFollowTheirOwnKeys) {
  // GPT-2 small without linear biases: 12 layers x (QKV 3h + out-proj h + fc1 4h + fc2 h) fewer.
  ModelSpec m = gpt(12, 768, 12, 1024, 50257);
  m.bias = false;
  EXPECT_EQ(total_parameters(m), 124439808 - 12 * (3 * 768 + 768 + 4 * 768 + 768));
  // RMSNorm on a GELU model: the 2 per layer + ln_f norms lose their bias vectors (h each).
  m.bias = true;
  m.norm = Norm::rmsnorm;
  EXPECT_EQ(total_parameters(m), 124439808 - (2 * 12 + 1) * 768);
  // Llama 3 8B with biases on every linear layer (SwiGLU: gate, up and down): q 4096 + k, v
  // 1024 each + o 4096 + gate, up 14336 each + down 4096 per layer.
  ModelSpec l = llama3_8b();
  l.bias = true;
  EXPECT_EQ(total_parameters(l), 8030261248 + 32 * (4096 + 2 * 1024 + 4096 + 2 * 14336 + 4096));
}

TEST(Flops, GqaAndSwigluCounts) {
  auto m = llama3_8b();
  double h = 4096, kv = 1024, f = 14336;
  EXPECT_DOUBLE_EQ(layer_gemm_flops_per_token(m), 2 * (h * (h + 2 * kv) + h * h + 3 * h * f));
  EXPECT_DOUBLE_EQ(layer_attention_flops_per_token(m), 4 * 8192 * h);
}
