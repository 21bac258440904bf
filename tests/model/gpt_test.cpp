// Model-level properties: recomputation modes give identical gradients, the same seed gives
// bit-identical results, a pipeline split and a simulated tensor-parallel split reproduce the
// whole model, and bad configurations fail with a message naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "backend/half_convert.hpp"
#include "core/check.hpp"
#include "model/gpt.hpp"
#include "model_util.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

struct Result {
  float loss;
  std::vector<float> grads;
};

Result run_once(Backend& be, const ModelSpec& m, Recompute rc, int64_t B, unsigned data_seed,
                Precision precision = Precision::fp32, bool fp32_residual = false) {
  GptOptions o;
  o.model = m;
  o.recompute = rc;
  o.micro_batch = B;
  o.precision = precision;
  o.fp32_residual = fp32_residual;
  Gpt g(be, o);
  g.init_weights(42);
  auto tok = random_tokens(size_t(B * m.seq_len), m.vocab, data_seed);
  auto tgt = random_tokens(size_t(B * m.seq_len), m.vocab, data_seed + 1);
  g.zero_grad();
  float loss = g.forward(tok.data(), nullptr, tgt.data());
  g.backward(nullptr, 1.0f);
  return {loss, host_copy(be, g.grads(), g.num_params())};
}

// At fp32 and under bf16 with the residual stream in 16 bits or fp32: what a recomputation
// re-runs reads the same (rounded) values as the forward did, so the bits agree.
TEST(Gpt, RecomputeModesGiveIdenticalGradients) {
  auto be = make_cpu_backend(2, 0);
  for (auto [prec, fp32_residual] : {std::pair{Precision::fp32, false}, std::pair{Precision::bf16, false},
                                     std::pair{Precision::bf16, true}}) {
    for (auto m : {tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4),
                   tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2)}) {
      m.layers = 4;  // x32_ of a 16-bit residual serves layers in and out
      SCOPED_TRACE(std::string(to_string(prec)) + (fp32_residual ? " fp32 residual" : ""));
      Result none = run_once(*be, m, Recompute::none, 3, 7, prec, fp32_residual);
      Result sel = run_once(*be, m, Recompute::selective, 3, 7, prec, fp32_residual);
      Result full = run_once(*be, m, Recompute::full, 3, 7, prec, fp32_residual);
      EXPECT_GT(none.loss, 3.0f);  // ~ln(37) = 3.61 at init
      EXPECT_EQ(none.loss, sel.loss);
      EXPECT_EQ(none.loss, full.loss);
      EXPECT_EQ(none.grads, sel.grads);
      EXPECT_EQ(none.grads, full.grads);
    }
  }
}

// The residual stream in 16 bits (mixed precision's default) or fp32 (GptOptions::fp32_residual):
// the option is read (the results differ), and both stay near fp32: the loss within 1 %, every
// gradient within 5 % of the largest (a loose bound: a coarse check of the numerics). That
// the 16-bit buffers hold what they should is checked exactly by the recompute, pipeline-split
// and activation-slot tests, which compare runs at bf16 that use them differently.
TEST(Gpt, SixteenBitResidualStaysNearFp32) {
  auto be = make_cpu_backend(1);
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  m.layers = 4;
  const Result f32 = run_once(*be, m, Recompute::none, 2, 5);
  const Result r16 = run_once(*be, m, Recompute::none, 2, 5, Precision::bf16, false);
  const Result r32 = run_once(*be, m, Recompute::none, 2, 5, Precision::bf16, true);
  EXPECT_NE(r16.grads, r32.grads);
  float maxg = 0;
  for (float g : f32.grads) maxg = std::max(maxg, std::fabs(g));
  for (const Result* r : {&r16, &r32}) {
    EXPECT_NEAR(r->loss, f32.loss, 1e-2 * f32.loss);
    for (size_t i = 0; i < f32.grads.size(); i++) ASSERT_NEAR(r->grads[i], f32.grads[i], 0.05f * maxg) << i;
  }
}

TEST(Gpt, RecomputeSavesActivationMemory) {
  auto be = make_cpu_backend(1);
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  m.layers = 6;
  auto mem = [&](Recompute rc) {
    GptOptions o;
    o.model = m;
    o.recompute = rc;
    o.micro_batch = 2;
    return Gpt(*be, o).memory().activations;
  };
  EXPECT_LT(mem(Recompute::selective), mem(Recompute::none));
  EXPECT_LT(mem(Recompute::full), mem(Recompute::selective));
}

// The logits' rows are padded to a multiple of Gpt::kLogitsRowAlign (aligned rows for the head's
// GEMMs on cuBLASLt), per tensor-parallel slice; download_logits gives them dense, and only where the
// stage has the head.
TEST(Gpt, LogitsRowsArePaddedPerSliceAndDownloadedDense) {
  auto be = make_cpu_backend(1);
  GptOptions o;
  o.model = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);  // vocab 37
  o.micro_batch = 1;
  Gpt whole(*be, o);
  EXPECT_EQ(whole.logits_ld(), 64);
  const size_t n = size_t(o.model.seq_len);
  auto tok = random_tokens(n, o.model.vocab, 1), tgt = random_tokens(n, o.model.vocab, 2);
  whole.init_weights(3);
  whole.forward(tok.data(), nullptr, tgt.data());
  EXPECT_EQ(whole.download_logits().size(), n * size_t(o.model.vocab));
  o.model.vocab = 129;  // 129 -> 192; the tp = 2 slices (65 and 64 rows) -> 128 and 64
  EXPECT_EQ(Gpt(*be, o).logits_ld(), 192);
  NoParallelHooks hooks(*be);  // the slices' shapes only: no forward
  GptOptions slice = o;
  slice.tp = {0, 2, false};
  EXPECT_EQ(Gpt(*be, slice, &hooks).logits_ld(), 128);
  slice.tp = {1, 2, false};
  EXPECT_EQ(Gpt(*be, slice, &hooks).logits_ld(), 64);
  GptOptions first = o;
  first.stage = {0, 1, true, false};
  Gpt headless(*be, first);
  try {
    headless.download_logits();
    ADD_FAILURE() << "download_logits on a stage without the head did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("download_logits on a stage without the head (layers [0, 1))"),
              std::string::npos) << e.what();
  }
}

// The one mapping from a training precision to its 16-bit format (the weight copy and GEMM inputs
// here; the runtime's tp and pp messages use it too): fp16 computes in IEEE half, bf16 in bfloat16.
TEST(Gpt, HalfFormatOfEachPrecision) {
  EXPECT_EQ(half_format(Precision::bf16), Half::bf16);
  EXPECT_EQ(half_format(Precision::fp16), Half::f16);
  EXPECT_FALSE(half_format(Precision::fp32).has_value());
  EXPECT_FALSE(half_format(Precision::fp8).has_value());
}

// Mixed precision keeps the GEMM inputs (ln1, att, ln2, fc_act per layer, lnf at the head) and the
// GEMM outputs the backward reads (qkv after rope, the MLP's pre-activation fc) in 16 bits instead
// of 32, and adds the float32 staging of one GEMM input (fwd32_: [N, max(C, HD, F)], also where the
// observer widens a kept input), of one kept output (wide32_: [N, max(QKV, FC)]) and the rounded
// output gradient (dy16_: [N, max(C, QKV, FC, Vp)] in 16 bits, Vp the logits' padded row width).
// With the residual stream in 16 bits (the default) also mid per layer and the inner layers'
// inputs (res[1..L-1]; the stage's input and output stay fp32), staged in mid32_ and x32_
// ([N, C] each). Exactly that difference, nothing else (no float32 lnf beside its copy); at fp32
// fp32_residual changes nothing.
TEST(Gpt, MixedPrecisionActivationBytesAreTheKeptTensorsIn16Bits) {
  auto be = make_cpu_backend(1);
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  m.vocab = 101;  // Vp = 128, wider than QKV (96): dy16_ is sized by the logits' padded rows
  for (int64_t L : {2, 4}) {
    m.layers = L;
    auto mem = [&](Precision p, bool fp32_residual) {
      GptOptions o;
      o.model = m;
      o.micro_batch = 2;
      o.precision = p;
      o.fp32_residual = fp32_residual;
      return Gpt(*be, o).memory().activations;
    };
    const int64_t N = 2 * m.seq_len, C = m.hidden, HD = m.hidden, F = m.ffn_hidden, QKV = 3 * m.hidden;
    const int64_t kept = L * (N * C + N * HD + N * C + N * F + N * QKV + N * F) + N * C;
    const int64_t Vp = (m.vocab + Gpt::kLogitsRowAlign - 1) / Gpt::kLogitsRowAlign * Gpt::kLogitsRowAlign;
    const int64_t staging = 4 * N * std::max({C, HD, F}) + 4 * N * std::max(QKV, F) +
                            2 * N * std::max({C, QKV, F, Vp});  // logits' padded rows
    // mid per layer and the inner layers' inputs; staged in mid32_ and x32_
    const int64_t residual = L * N * C + (L - 1) * N * C, residual_staging = 4 * N * C + 4 * N * C;
    const int64_t fp32 = mem(Precision::fp32, false);
    EXPECT_EQ(mem(Precision::bf16, true), fp32 - 2 * kept + staging) << L;
    EXPECT_EQ(mem(Precision::bf16, false), fp32 - 2 * kept + staging - 2 * residual + residual_staging) << L;
    EXPECT_EQ(mem(Precision::fp16, false), mem(Precision::bf16, false)) << L;
    EXPECT_EQ(mem(Precision::fp32, true), fp32) << L;
  }
}

// Mixed precision looks the token and position embeddings up through their 16-bit copy (as the
// GEMMs read the matrices; what lets ZeRO shard their fp32 masters): with every embedding master
// made representable in the 16-bit format and then moved by less than half a step of it (bf16
// 2^-10 of itself, fp16 2^-13), so that the copy rounds back to the same bits, the loss and the
// gradients are bit for bit unchanged; moved by more than a step (2^-6, 2^-9) the loss changes
// (the copy is read, not zeros); at fp32 the small move changes the loss.
TEST(Gpt, MixedPrecisionLooksUpTheEmbeddingsThroughTheSixteenBitCopy) {
  auto be = make_cpu_backend(1);
  const ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  auto run = [&](Precision p, int nudge_exp) {  // nudge_exp 0: no move
    GptOptions o;
    o.model = m;
    o.micro_batch = 2;
    o.precision = p;
    Gpt g(*be, o);
    g.init_weights(42);
    std::vector<float> w = host_copy(*be, g.params(), g.num_params());
    int embeddings = 0;
    for (const ParamInfo& e : g.layout().entries()) {
      if (e.role != ParamRole::embedding) continue;
      embeddings++;
      for (int64_t i = e.offset; i < e.offset + e.numel; i++) {
        float& x = w[size_t(i)];
        x = p == Precision::fp16 ? half_convert::f16_to_f32(half_convert::f32_to_f16(x))
                                 : half_convert::bf16_to_f32(half_convert::f32_to_bf16(x));
        if (nudge_exp != 0) x += std::ldexp(x, nudge_exp);
      }
    }
    EXPECT_EQ(embeddings, 2);  // wte and wpe
    be->upload(g.params(), w.data(), sizeof(float) * w.size());
    g.params_changed();
    auto tok = random_tokens(size_t(2 * m.seq_len), m.vocab, 5);
    auto tgt = random_tokens(size_t(2 * m.seq_len), m.vocab, 6);
    g.zero_grad();
    const float loss = g.forward(tok.data(), nullptr, tgt.data());
    g.backward(nullptr, 1.0f);
    return Result{loss, host_copy(*be, g.grads(), g.num_params())};
  };
  for (auto [p, below, above] : {std::tuple{Precision::bf16, -10, -6}, std::tuple{Precision::fp16, -13, -9}}) {
    const Result base = run(p, 0), small = run(p, below);
    EXPECT_EQ(base.loss, small.loss) << to_string(p);
    EXPECT_EQ(base.grads, small.grads) << to_string(p);
    EXPECT_NE(base.loss, run(p, above).loss) << to_string(p);
  }
  EXPECT_NE(run(Precision::fp32, 0).loss, run(Precision::fp32, -10).loss);
}

// A range marked released (ZeRO 3 after a pass: Gpt::half_written(begin, end, false)) under a
// caller that keeps the 16-bit copy itself is refused, not converted from the fp32 arena.
TEST(Gpt, ARangeMarkedReleasedIsRefusedWhenTheCopyIsKeptOutside) {
  auto be = make_cpu_backend(1);
  const ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  GptOptions o;
  o.model = m;
  o.precision = Precision::bf16;
  Gpt g(*be, o);
  g.init_weights(1);
  auto tok = random_tokens(size_t(m.seq_len), m.vocab, 2);
  g.forward(tok.data(), nullptr, tok.data());  // converts every entry
  g.keep_half_externally();
  g.forward(tok.data(), nullptr, tok.data());  // the copy is current: fine
  g.half_written(0, g.num_params(), false);
  EXPECT_THROW(
      try { g.forward(tok.data(), nullptr, tok.data()); } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("under ZeRO 3 a unit is read only between its gather"), std::string::npos)
            << e.what();
        throw;
      },
      std::exception);
}

TEST(Gpt, SameSeedIsBitIdenticalDifferentSeedIsNot) {
  auto be = make_cpu_backend(2, 0);
  ModelSpec m = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2);
  Result a = run_once(*be, m, Recompute::none, 2, 3);
  Result b = run_once(*be, m, Recompute::none, 2, 3);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grads, b.grads);
  Result c = run_once(*be, m, Recompute::none, 2, 4);
  EXPECT_NE(a.loss, c.loss);
}

// Bit identity holds for a fixed thread count only: OpenBLAS computes the edge blocks of a
// split GEMM with different kernels. Across thread counts results agree to float rounding.
TEST(Gpt, ThreadCountChangesResultsOnlyByRounding) {
  ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  m.hidden = 128;  // large enough that GEMMs are split across threads
  m.ffn_hidden = 512;
  m.vocab = 301;
  auto one = make_cpu_backend(1, 0);
  Result a = run_once(*one, m, Recompute::none, 4, 8);
  auto three = make_cpu_backend(3, 0);
  Result b = run_once(*three, m, Recompute::none, 4, 8);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * a.loss);
  float maxg = 0;
  for (float g : a.grads) maxg = std::max(maxg, std::fabs(g));
  for (size_t i = 0; i < a.grads.size(); i++)
    ASSERT_NEAR(a.grads[i], b.grads[i], 1e-5f * maxg) << i;
}

// Split 1 + 3 of 4 layers, at fp32 and at bf16 with the residual stream in 16 bits (the first
// stage rounds its output as the whole model rounds that layer's) or fp32: the same loss, bit for
// bit, with the stage output handed on in fp32 (as pipeline_dtype = "fp32" sends it).
TEST(Gpt, PipelineStagesReproduceTheWholeModel) {
  auto be = make_cpu_backend(2, 0);
  for (auto [prec, fp32_residual, tie] : {std::tuple{Precision::fp32, false, true}, std::tuple{Precision::fp32, false, false},
                                          std::tuple{Precision::bf16, false, true}, std::tuple{Precision::bf16, true, true}}) {
    SCOPED_TRACE(std::string(to_string(prec)) + (fp32_residual ? " fp32 residual" : "") + (tie ? " tied" : ""));
    ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4, tie);
    m.layers = 4;
    const int64_t B = 2, N = B * m.seq_len;
    auto tok = random_tokens(size_t(N), m.vocab, 5);
    auto tgt = random_tokens(size_t(N), m.vocab, 6);
    GptOptions whole;
    whole.model = m;
    whole.micro_batch = B;
    whole.precision = prec;
    whole.fp32_residual = fp32_residual;
    Gpt w(*be, whole);
    w.init_weights(9);
    w.zero_grad();
    const float loss = w.forward(tok.data(), nullptr, tgt.data());
    w.backward(nullptr, 1.0f);
    auto wg = host_copy(*be, w.grads(), w.num_params());

    GptOptions s0 = whole, s1 = whole;
    s0.stage = {0, 1, true, false};
    s1.stage = {1, 4, false, true};
    Gpt a(*be, s0), b(*be, s1);
    a.init_weights(9);
    b.init_weights(9);
    a.zero_grad();
    b.zero_grad();
    a.forward(tok.data(), nullptr, nullptr);
    const float loss2 = b.forward(nullptr, a.output(), tgt.data());
    b.backward(nullptr, 1.0f);
    a.backward(b.input_grad(), 1.0f);
    EXPECT_EQ(loss, loss2);
    auto ag = host_copy(*be, a.grads(), a.num_params());
    auto bg = host_copy(*be, b.grads(), b.num_params());
    size_t checked = 0;
    for (const ParamInfo& p : w.layout().entries()) {
      std::vector<float> want(wg.begin() + p.offset, wg.begin() + p.offset + p.numel);
      std::vector<float> got(size_t(p.numel), 0.0f);
      for (auto* st : {&a, &b}) {  // a tied wte lives in both stages: gradients add up
        for (const ParamInfo& q : st->layout().entries()) {
          if (q.name != p.name) continue;
          const auto& g = st == &a ? ag : bg;
          for (int64_t i = 0; i < p.numel; i++) got[size_t(i)] += g[size_t(q.offset + i)];
          checked++;
        }
      }
      for (int64_t i = 0; i < p.numel; i++)
        ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-6f + 1e-5f * std::fabs(want[size_t(i)]))
            << p.name << "[" << i << "]";
    }
    EXPECT_EQ(checked, w.layout().entries().size() + (tie ? 1 : 0));
  }
}

TEST(Gpt, ActivationSlotsHoldSeveralMicroBatchesInFlight) {
  // 1F1B keeps several micro-batches between forward and backward: forward A (slot 0),
  // forward B (slot 1), backward B, backward A must equal A then B one at a time.
  // At fp32 and at bf16 (the residual stream in 16 bits: the shared staging serves both slots).
  auto be = make_cpu_backend(2, 0);
  for (auto [rc, prec] : {std::pair{Recompute::none, Precision::fp32}, std::pair{Recompute::selective, Precision::fp32},
                          std::pair{Recompute::full, Precision::fp32}, std::pair{Recompute::none, Precision::bf16},
                          std::pair{Recompute::full, Precision::bf16}}) {
    ModelSpec m = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2);
    m.layers = 3;
    const size_t n = size_t(2 * m.seq_len);
    auto ta = random_tokens(n, m.vocab, 31), ya = random_tokens(n, m.vocab, 32);
    auto tb = random_tokens(n, m.vocab, 33), yb = random_tokens(n, m.vocab, 34);
    GptOptions o;
    o.model = m;
    o.micro_batch = 2;
    o.recompute = rc;
    o.precision = prec;
    Gpt seq(*be, o);
    seq.init_weights(3);
    seq.zero_grad();
    const float la = seq.forward(ta.data(), nullptr, ya.data());
    seq.backward(nullptr, 0.5f);
    const float lb = seq.forward(tb.data(), nullptr, yb.data());
    seq.backward(nullptr, 0.5f);
    auto want = host_copy(*be, seq.grads(), seq.num_params());

    o.activation_slots = 2;
    Gpt inflight(*be, o);
    inflight.init_weights(3);
    inflight.zero_grad();
    EXPECT_EQ(inflight.forward(ta.data(), nullptr, ya.data(), 0), la);
    EXPECT_EQ(inflight.forward(tb.data(), nullptr, yb.data(), 1), lb);
    inflight.backward(nullptr, 0.5f, 1);
    inflight.backward(nullptr, 0.5f, 0);
    auto got = host_copy(*be, inflight.grads(), inflight.num_params());
    float maxg = 0;
    for (float g : want) maxg = std::max(maxg, std::fabs(g));
    for (size_t i = 0; i < got.size(); i++)  // only the summation order of A and B differs
      ASSERT_NEAR(got[i], want[i], 1e-6f * maxg) << i << " recompute " << to_string(rc) << " " << to_string(prec);
    EXPECT_THROW(inflight.forward(ta.data(), nullptr, ya.data(), 2), Error);
  }
}

// Runs tp ranks in threads and compares loss, logits and every gradient with tp = 1. Under
// sequence parallelism, gradients flagged sp_partial_grad are summed over ranks first (what
// the runtime's all-reduce does).
void check_tensor_parallel(const ModelSpec& m, int tp, bool sequence_parallel) {
  const int64_t B = 2, N = B * m.seq_len;
  auto tok = random_tokens(size_t(N), m.vocab, 21);
  auto tgt = random_tokens(size_t(N), m.vocab, 22);
  auto be1 = make_cpu_backend(1);
  GptOptions o;
  o.model = m;
  o.micro_batch = B;
  Gpt ref(*be1, o);
  ref.init_weights(5);
  ref.zero_grad();
  const float ref_loss = ref.forward(tok.data(), nullptr, tgt.data());
  auto ref_logits = ref.download_logits();
  ref.backward(nullptr, 1.0f);
  auto ref_grads = host_copy(*be1, ref.grads(), ref.num_params());

  InProcessHooks::Shared shared(tp);
  std::vector<float> losses(static_cast<size_t>(tp));
  std::vector<std::string> errors(static_cast<size_t>(tp));
  std::vector<std::vector<float>> grads(static_cast<size_t>(tp));
  std::vector<ParamLayout> layouts(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; r++) {
    threads.emplace_back([&, r] {
      auto be = make_cpu_backend(1);
      InProcessHooks hooks(shared, r);
      GptOptions so = o;
      so.tp = {r, tp, sequence_parallel};
      Gpt g(*be, so, &hooks);
      g.init_weights(5);
      g.zero_grad();
      losses[size_t(r)] = g.forward(tok.data(), nullptr, tgt.data());
      auto lg = g.download_logits();  // this rank's vocab columns
      for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < g.vocab_local(); v++) {
          float want = ref_logits[size_t(n * m.vocab + g.vocab_start() + v)];
          float got = lg[size_t(n * g.vocab_local() + v)];
          if (std::fabs(got - want) > 1e-5f + 1e-4f * std::fabs(want)) errors[size_t(r)] += "logit ";
        }
      g.backward(nullptr, 1.0f);
      grads[size_t(r)] = host_copy(*be, g.grads(), g.num_params());
      layouts[size_t(r)] = g.layout();
    });
  }
  for (auto& t : threads) t.join();
  int flagged = 0;
  for (int r = 0; r < tp; r++) {
    EXPECT_NEAR(losses[size_t(r)], ref_loss, 1e-5f * ref_loss) << "rank " << r;
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    for (const ParamInfo& s : layouts[size_t(r)].entries()) {
      std::vector<float> got(grads[size_t(r)].begin() + s.offset,
                             grads[size_t(r)].begin() + s.offset + s.numel);
      if (s.sp_partial_grad) {  // sum the partial gradients of all ranks
        flagged++;
        for (int q = 0; q < tp; q++) {
          if (q == r) continue;
          const ParamInfo& e = layouts[size_t(q)].find(s.name);
          for (int64_t i = 0; i < s.numel; i++) got[size_t(i)] += grads[size_t(q)][size_t(e.offset + i)];
        }
      }
      auto want = slice_of_global(ref_grads, ref.layout().find(s.name), s);
      double maxw = 0;
      for (float x : want) maxw = std::max(maxw, double(std::fabs(x)));
      for (int64_t i = 0; i < s.numel; i++)
        ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-4 * maxw + 1e-7)
            << "rank " << r << " " << s.name << "[" << i << "]";
    }
  }
  EXPECT_EQ(flagged > 0, sequence_parallel);
}

TEST(Gpt, SimulatedTensorParallelMatchesSingleRank) {
  check_tensor_parallel(tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4), 2, false);
  check_tensor_parallel(tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2, false), 2, false);
}

TEST(Gpt, SimulatedSequenceParallelMatchesSingleRank) {
  check_tensor_parallel(tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4), 2, true);
  check_tensor_parallel(tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 4, false), 4, true);
}

TEST(Gpt, SimulatedTensorAndSequenceParallelWithoutBiases) {
  // model.bias = false: no linear-layer biases (Llama), so the sequence-parallel partial gradients
  // are the norms only; GELU + layernorm without biases too (norm biases stay).
  ModelSpec llama = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2, false);
  llama.bias = false;
  check_tensor_parallel(llama, 2, false);
  check_tensor_parallel(llama, 2, true);
  ModelSpec gelu = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  gelu.bias = false;
  check_tensor_parallel(gelu, 4, true);
}

// Records the layer-boundary hooks (what a DP/ZeRO runtime would use).
class RecordingHooks final : public ParallelHooks {
 public:
  void input_grad_allreduce(float*, int64_t) override {}
  void partial_sum_allreduce(float*, int64_t) override {}
  void vocab_max_allreduce(float*, int64_t) override {}
  void vocab_sum_allreduce(float*, int64_t) override {}
  void sp_all_gather(const float*, float*, int64_t) override {}
  void sp_reduce_scatter(const float*, float*, int64_t) override {}
  void before_layer(int64_t l, Pass p) override { log += fmt::format("<{}{} ", l, name(p)); }
  void after_layer(int64_t l, Pass p) override { log += fmt::format(">{}{} ", l, name(p)); }
  static char name(Pass p) { return p == Pass::forward ? 'f' : p == Pass::backward ? 'b' : 'r'; }
  std::string log;
};

TEST(Gpt, LayerBoundaryHooksComeInExecutionOrder) {
  auto be = make_cpu_backend(1);
  GptOptions o;
  o.model = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  o.recompute = Recompute::full;
  RecordingHooks hooks;
  Gpt g(*be, o, &hooks);
  g.init_weights(1);
  auto tok = random_tokens(size_t(o.model.seq_len), o.model.vocab, 2);
  g.forward(tok.data(), nullptr, tok.data());
  g.backward(nullptr, 1.0f);
  EXPECT_EQ(hooks.log,
            "<-1f >-1f <0f >0f <1f >1f <-2f >-2f "       // embedding, layers 0 and 1, head
            "<-2b >-2b <1r >1r <1b >1b <0r >0r <0b >0b "  // head, recompute + backward per layer
            "<-1b >-1b ");                                // embedding
}

TEST(Gpt, InitIsIndependentOfTheSplit) {
  auto be = make_cpu_backend(1);
  ModelSpec m = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2, false);
  GptOptions o;
  o.model = m;
  Gpt whole(*be, o);
  whole.init_weights(77);
  auto wp = host_copy(*be, whole.params(), whole.num_params());
  InProcessHooks::Shared shared(2);
  InProcessHooks hooks(shared, 1);
  o.tp = {1, 2};
  Gpt shard(*be, o, &hooks);
  shard.init_weights(77);
  auto sp = host_copy(*be, shard.params(), shard.num_params());
  for (const ParamInfo& s : shard.layout().entries()) {
    auto want = slice_of_global(wp, whole.layout().find(s.name), s);
    EXPECT_EQ(std::vector<float>(sp.begin() + s.offset, sp.begin() + s.offset + s.numel), want)
        << s.name;
  }
}

TEST(Gpt, BadConfigurationsNameTheProblem) {
  auto be = make_cpu_backend(1);
  GptOptions o;
  o.model = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 3);
  try {
    Gpt g(*be, o);
    FAIL() << "kv_heads = 3 with heads = 4 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.kv_heads = 3 must divide model.heads = 4"),
              std::string::npos) << e.what();
  }
  o.model.kv_heads = 4;
  auto tok = random_tokens(size_t(o.model.seq_len), o.model.vocab, 1);
  tok[3] = 99;
  Gpt g(*be, o);
  try {
    g.forward(tok.data(), nullptr, tok.data());
    FAIL() << "token 99 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 99 at position 3 is outside the vocabulary [0, 37)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
