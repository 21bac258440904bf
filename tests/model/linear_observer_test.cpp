// The model's LinearObserver (model/linear_observer.hpp) shows every layer matrix's input and
// output gradient: for each matrix entry, sum over the micro-batches and rows of dy^T x must be
// exactly what backward accumulated in its gradient (dW = dy^T x for y = x W^T), which pins x, dy,
// their strides and the entry they are reported for. Fused q/k/v and gate/up, recomputation, and
// tensor parallelism (in-process ranks, with and without sequence parallelism): each rank's shard
// of a matrix gets its own shard's rows and columns (K-FAC's per-shard factors).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <thread>

#include "model/gpt.hpp"
#include "model_util.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

// Sums dy^T x per entry on the host (float64).
class Recorder final : public LinearObserver {
 public:
  explicit Recorder(Backend& be) : be_(be) {}
  bool observing() const override { return on; }
  void linear_backward(const ParamInfo& w, const float* x, int64_t ldx, const float* dy, int64_t ldy,
                       int64_t rows) override {
    const int64_t out = w.shard_shape[0], in = w.shard_shape[1];
    const std::vector<float> hx = host_copy(be_, x, (rows - 1) * ldx + in);
    const std::vector<float> hdy = host_copy(be_, dy, (rows - 1) * ldy + out);
    std::vector<double>& s = sums[&w];
    std::vector<double>& a = abs_sums[&w];
    s.resize(size_t(out * in), 0.0);
    a.resize(size_t(out * in), 0.0);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
          const double p = double(hdy[size_t(r * ldy + o)]) * hx[size_t(r * ldx + i)];
          s[size_t(o * in + i)] += p;
          a[size_t(o * in + i)] += std::abs(p);
        }
    calls[&w]++;
  }
  bool on = true;
  std::map<const ParamInfo*, std::vector<double>> sums;
  std::map<const ParamInfo*, std::vector<double>> abs_sums;  // sum |dy x|: the rounding bound's scale
  std::map<const ParamInfo*, int> calls;

 private:
  Backend& be_;
};

// Worst |sum dy^T x - gradient| over the layer matrices of g, relative to each one's largest
// gradient element; every matrix must have been reported `calls` times.
double worst_mismatch(Gpt& g, Backend& be, Recorder& rec, int calls, std::string* problems) {
  const std::vector<float> grads = host_copy(be, g.grads(), g.num_params());
  double worst_rel = 0;
  for (const ParamInfo& p : g.layout().entries()) {
    if (p.role != ParamRole::matrix) {
      if (rec.calls.count(&p)) *problems += p.name + " is no layer matrix; ";
      continue;
    }
    if (rec.calls[&p] != calls) *problems += p.name + " reported " + std::to_string(rec.calls[&p]) + " times; ";
    const std::vector<double>& s = rec.sums[&p];
    double worst = 0, scale = 0;
    for (int64_t k = 0; k < p.numel && size_t(k) < s.size(); k++) {
      worst = std::max(worst, std::abs(s[size_t(k)] - double(grads[size_t(p.offset + k)])));
      scale = std::max(scale, std::abs(double(grads[size_t(p.offset + k)])));
    }
    if (!(scale > 0)) *problems += p.name + " has no gradient; ";
    worst_rel = std::max(worst_rel, worst / scale);
  }
  return worst_rel;
}

// Mixed precision: the observer sees the GEMM's input as the GEMM saw it (the kept 16-bit copy,
// widened) and the float32 dy, where the weight gradient's GEMM took dy rounded to 16 bits: each
// element then differs from sum dy^T x by at most u sum |dy x| (u = 2^-8, bf16's unit roundoff),
// plus float32 accumulation. A wrong input (another layer's, or overwritten scratch) is off by the
// whole gradient.
void check_observer(const ModelSpec& m, Recompute rc, Precision precision = Precision::fp32) {
  auto be = make_cpu_backend(2, 0);
  GptOptions o;
  o.model = m;
  o.recompute = rc;
  o.precision = precision;
  o.micro_batch = 2;
  Gpt g(*be, o);
  g.init_weights(5);
  Recorder rec(*be);
  g.set_linear_observer(&rec);
  g.zero_grad();
  const int micro_batches = 2;
  for (int mb = 0; mb < micro_batches; mb++) {
    auto tok = random_tokens(size_t(2 * m.seq_len), m.vocab, 11 + mb);
    auto tgt = random_tokens(size_t(2 * m.seq_len), m.vocab, 21 + mb);
    g.forward(tok.data(), nullptr, tgt.data());
    g.backward(nullptr, 0.5f);
  }
  const std::vector<float> grads = host_copy(*be, g.grads(), g.num_params());
  int matrices = 0;
  for (const ParamInfo& p : g.layout().entries()) {
    if (p.role != ParamRole::matrix) {
      EXPECT_EQ(rec.calls.count(&p), 0u) << p.name << " is no layer matrix";
      continue;
    }
    matrices++;
    ASSERT_EQ(rec.calls[&p], micro_batches) << p.name;
    const std::vector<double>& s = rec.sums.at(&p);
    const std::vector<double>& a = rec.abs_sums.at(&p);
    double worst = 0, scale = 0, worst_over_bound = 0;
    for (int64_t k = 0; k < p.numel; k++) {
      const double err = std::abs(s[size_t(k)] - double(grads[size_t(p.offset + k)]));
      worst = std::max(worst, err);
      scale = std::max(scale, std::abs(double(grads[size_t(p.offset + k)])));
      worst_over_bound = std::max(worst_over_bound, err / ((std::ldexp(1.0, -8) + 1e-5) * a[size_t(k)] + 1e-12));
    }
    EXPECT_GT(scale, 0) << p.name;
    if (precision == Precision::fp32)
      EXPECT_LT(worst, 1e-4 * scale) << p.name << ": sum dy^T x is not its gradient";
    else
      EXPECT_LE(worst_over_bound, 1.0) << p.name << ": sum dy^T x is not its gradient within bf16's rounding of dy";
  }
  EXPECT_EQ(matrices, int(m.layers) * (m.activation == Activation::swiglu ? 7 : 6));
}

}  // namespace

TEST(LinearObserver, InputsAndOutputGradientsGiveEachMatrixGradient) {
  check_observer(tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4), Recompute::none);
  check_observer(tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2), Recompute::full);
}

TEST(LinearObserver, MixedPrecisionShowsTheGemmsOwn16BitInputs) {
  check_observer(tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4), Recompute::none, Precision::bf16);
  check_observer(tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2), Recompute::full, Precision::bf16);
}

TEST(LinearObserver, EachTensorParallelShardSeesItsOwnRowsAndColumns) {
  for (bool sp : {false, true}) {
    const ModelSpec m = tiny_model(Activation::swiglu, Norm::rmsnorm, Position::rope, 2);
    const int tp = 2;
    InProcessHooks::Shared shared(tp);
    std::vector<double> worst(static_cast<size_t>(tp), 1.0);
    std::vector<std::string> found(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; r++)
      threads.emplace_back([&, r] {
        auto be = make_cpu_backend(1, 0);
        InProcessHooks hooks(shared, r);
        GptOptions o;
        o.model = m;
        o.micro_batch = 2;
        o.tp = {r, tp, sp};
        Gpt g(*be, o, &hooks);
        g.init_weights(5);
        Recorder rec(*be);
        g.set_linear_observer(&rec);
        g.zero_grad();
        auto tok = random_tokens(size_t(2 * m.seq_len), m.vocab, 11);
        auto tgt = random_tokens(size_t(2 * m.seq_len), m.vocab, 21);
        g.forward(tok.data(), nullptr, tgt.data());
        g.backward(nullptr, 1.0f);
        worst[size_t(r)] = worst_mismatch(g, *be, rec, 1, &found[size_t(r)]);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < tp; r++) {
      EXPECT_EQ(found[size_t(r)], "") << "rank " << r << (sp ? " (sp)" : "");
      EXPECT_LT(worst[size_t(r)], 1e-4) << "rank " << r << (sp ? " (sp)" : "");
    }
  }
}

TEST(LinearObserver, NotCalledWhenNotObserving) {
  auto be = make_cpu_backend(1, 0);
  const ModelSpec m = tiny_model(Activation::gelu, Norm::layernorm, Position::learned, 4);
  GptOptions o;
  o.model = m;
  Gpt g(*be, o);
  g.init_weights(5);
  Recorder rec(*be);
  rec.on = false;
  g.set_linear_observer(&rec);
  auto tok = random_tokens(size_t(m.seq_len), m.vocab, 1);
  g.forward(tok.data(), nullptr, tok.data());
  g.backward(nullptr, 1.0f);
  EXPECT_TRUE(rec.calls.empty());
}
