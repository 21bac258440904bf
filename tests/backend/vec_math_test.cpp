// The vectorisable exp/tanh/sigmoid used by the CPU kernels against libm.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/vec_math.hpp"

using namespace exatrain;

TEST(VecMath, ExpWithinFourUlpOnTheFloatRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.5f; x += 0.001953125f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(vm::exp(x)) - want) / want);
  }
  EXPECT_LT(worst, 4.8e-7);  // 4 ulp of float
}

TEST(VecMath, ExpClampsInsteadOfOverflowing) {
  EXPECT_GE(vm::exp(-1000.0f), 0.0f);
  EXPECT_LT(vm::exp(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isfinite(vm::exp(1000.0f)));
  EXPECT_EQ(vm::exp(0.0f), 1.0f);
}

TEST(VecMath, TanhAndSigmoid) {
  double worst_t = 0, worst_s = 0;
  for (float x = -20.0f; x <= 20.0f; x += 0.0009765625f) {
    worst_t = std::max(worst_t, std::fabs(double(vm::tanh(x)) - std::tanh(double(x))));
    worst_s = std::max(worst_s, std::fabs(double(vm::sigmoid(x)) - 1.0 / (1.0 + std::exp(-double(x)))));
  }
  EXPECT_LT(worst_t, 3e-7);  // absolute: tanh is used as (1 + tanh) in GELU
  EXPECT_LT(worst_s, 3e-7);
  EXPECT_EQ(vm::tanh(60.0f), 1.0f);
  EXPECT_EQ(vm::tanh(-60.0f), -1.0f);
}
