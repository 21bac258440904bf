#include <gtest/gtest.h>

#include "core/check.hpp"

TEST(Check, MessageCarriesFileAndLine) {
  try {
    EXA_CHECK(1 + 1 == 3, "expected {} got {}", 3, 2);
    FAIL() << "no throw";
  } catch (const exatrain::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("expected 3 got 2"), std::string::npos);
    EXPECT_NE(msg.find("check_test.cpp:"), std::string::npos);
  }
}
