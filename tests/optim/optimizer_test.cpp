// The Optimizer's entry states (state of an entry's own shape, for matrix optimizers): allocated
// for the entries a region holds whole and zeroed, counted in state_bytes, refused for an entry a
// region cuts, and handed to update() with the entry; checked through the tests' GramAdamW
// (tests/test_util/gram_adamw.hpp) against a host computation of its factors and its update.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.hpp"
#include "optim/optimizer.hpp"

#include "../test_util/error_of.hpp"
#include "../test_util/gram_adamw.hpp"

using namespace exatrain;

namespace {

// q [4, 3] (matrix), ln [3] (norm), fc [2, 3] (matrix): 21 arena elements.
ParamLayout small_layout() {
  ParamLayout l;
  auto add = [&](const char* name, std::vector<int64_t> shape, ParamRole role) {
    ParamInfo p;
    p.name = name, p.global_shape = shape, p.shard_shape = shape, p.role = role, p.decay = role == ParamRole::matrix;
    l.add(p);
  };
  add("h.0.attn.q_proj.weight", {4, 3}, ParamRole::matrix);
  add("h.0.ln_1.weight", {3}, ParamRole::norm);
  add("h.0.mlp.fc1.weight", {2, 3}, ParamRole::matrix);
  return l;
}

std::vector<float> download(Backend& be, const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  be.download(h.data(), p, sizeof(float) * size_t(n));
  return h;
}

// Values of element i of a step's gradient / the initial weights (distinct, of either sign).
float grad_at(int step, int64_t i) { return float(std::sin(0.7 * double(i) + 1.3 * step)); }
float weight_at(int64_t i) { return float(std::cos(0.4 * double(i))); }

}  // namespace

TEST(OptimizerEntryStates, LiveWithTheEntriesARegionHoldsWholeAndStartAtZero) {
  auto be = make_cpu_backend(1);
  const ParamLayout l = small_layout();
  DeviceBuffer params(*be, 21), grads(*be, 21);
  test::GramAdamW opt(*be);
  // Region 0 holds q and ln whole, region 1 fc.
  opt.init_state({{&l, 0, 15, params.data(), grads.data()}, {&l, 15, 21, params.data() + 15, grads.data() + 15}});
  const std::vector<EntryStateTensor>& t = opt.entry_state_tensors();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].entry->name, "h.0.attn.q_proj.weight");
  EXPECT_EQ(t[0].spec.name, "gram");
  EXPECT_EQ(t[0].spec.shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(t[1].spec.name, "col_sum");
  EXPECT_EQ(t[1].spec.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(t[2].entry->name, "h.0.mlp.fc1.weight");
  EXPECT_EQ(t[2].spec.shape, (std::vector<int64_t>{2, 2}));
  for (const EntryStateTensor& e : t)
    for (float v : download(*be, e.data, e.numel())) EXPECT_EQ(v, 0.0f);
  // Two per-element tensors over 21 elements, and 16 + 3 + 4 + 3 entry-state floats.
  EXPECT_EQ(opt.state_bytes(), int64_t(sizeof(float)) * (2 * 21 + 16 + 3 + 4 + 3));
}

TEST(OptimizerEntryStates, ARegionThatCutsAnEntryWithEntryStatesIsRefused) {
  auto be = make_cpu_backend(1);
  const ParamLayout l = small_layout();
  DeviceBuffer params(*be, 21), grads(*be, 21);
  test::GramAdamW opt(*be);
  const std::string err = error_of([&] { opt.init_state({{&l, 0, 6, params.data(), grads.data()}}); });
  EXPECT_NE(err.find("optimizer gram_adamw: region 0 holds arena elements [0, 6) of h.0.attn.q_proj.weight "
                     "(elements [0, 12)), whose state \"gram\" needs the whole entry"), std::string::npos)
      << err;
  // The same cut of an entry without entry states (AdamW) is what ZeRO 1 does every day.
  AdamW adamw(*be, {});
  EXPECT_EQ(error_of([&] { adamw.init_state({{&l, 0, 6, params.data(), grads.data()}}); }), "");
}

// Two steps of GramAdamW against AdamW on the same weights and gradients: their difference is the
// entry states' part of the update, computed here on the host (double) from the formulas in
// gram_adamw.hpp; the factors after two steps likewise.
TEST(OptimizerEntryStates, UpdateSeesEachEntrysOwnFactorsAcrossSteps) {
  auto be = make_cpu_backend(1);
  const ParamLayout l = small_layout();
  const int64_t N = l.total();
  DeviceBuffer pa(*be, N), pg(*be, N), grads(*be, N);
  std::vector<float> w(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; i++) w[size_t(i)] = weight_at(i);
  be->upload(pa.data(), w.data(), sizeof(float) * w.size());
  be->upload(pg.data(), w.data(), sizeof(float) * w.size());
  AdamW adamw(*be, {0.9f, 0.95f, 1e-8f, 0.1f});
  test::GramAdamW gram(*be);
  adamw.init_state({{&l, 0, N, pa.data(), grads.data()}});
  gram.init_state({{&l, 0, N, pg.data(), grads.data()}});
  // Host reference of the factors of q [4, 3] (offset 0).
  std::vector<double> G(4 * 4, 0.0), C(3, 0.0);
  const float lr = 0.01f, scale = 0.5f;
  for (int step = 1; step <= 2; step++) {
    std::vector<float> g(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; i++) g[size_t(i)] = grad_at(step, i);
    be->upload(grads.data(), g.data(), sizeof(float) * g.size());
    const std::vector<float> before = download(*be, pg.data(), N), before_adam = download(*be, pa.data(), N);
    adamw.step({{&l, 0, N, pa.data(), grads.data()}}, {step, lr, scale});
    gram.step({{&l, 0, N, pg.data(), grads.data()}}, {step, lr, scale});
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) {
        double dot = 0;
        for (int k = 0; k < 3; k++) dot += double(g[size_t(3 * i + k)]) * g[size_t(3 * j + k)];
        G[size_t(4 * i + j)] = 0.9 * G[size_t(4 * i + j)] + scale * scale * dot / 3.0;
      }
    for (int k = 0; k < 3; k++) {
      double col = 0;
      for (int i = 0; i < 4; i++) col += g[size_t(3 * i + k)];
      C[size_t(k)] = 0.9 * C[size_t(k)] + scale * col;
    }
    const std::vector<float> a = download(*be, pa.data(), N), b = download(*be, pg.data(), N);
    const double k = double(lr) * test::GramAdamW::kCoupling;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++) {
        double gg = 0;  // (gram G)[i, j] with this step's gram
        for (int r = 0; r < 4; r++) gg += G[size_t(4 * i + r)] * g[size_t(3 * r + j)];
        // The two runs started this step from weights that differ by what the factors did before,
        // so their decoupled weight decays (lr * 0.1 * W) differ by that much.
        const size_t e = size_t(3 * i + j);
        const double want = (double(b[e]) - before[e]) - (double(a[e]) - before_adam[e]) +
                            double(lr) * 0.1 * (double(before[e]) - before_adam[e]);
        EXPECT_NEAR(want, -k * (gg * scale + C[size_t(j)]), 2e-6) << "step " << step << " q[" << i << "," << j << "]";
      }
    // ln (a norm: no entry states) moves exactly as AdamW's.
    for (int64_t i = 12; i < 15; i++)
      EXPECT_FLOAT_EQ(b[size_t(i)] - before[size_t(i)], a[size_t(i)] - before_adam[size_t(i)]) << "ln " << i;
  }
  const std::vector<float> gq = download(*be, gram.entry_state_tensors()[0].data, 16);
  for (int i = 0; i < 16; i++) EXPECT_NEAR(gq[size_t(i)], G[size_t(i)], 1e-6) << "gram[" << i << "]";
  const std::vector<float> cq = download(*be, gram.entry_state_tensors()[1].data, 3);
  for (int i = 0; i < 3; i++) EXPECT_NEAR(cq[size_t(i)], C[size_t(i)], 1e-6) << "col_sum[" << i << "]";
}
