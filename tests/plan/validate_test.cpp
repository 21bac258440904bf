// Validation machinery and the calibrated model's accuracy on the published runs.
#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>

#include "plan/validate.hpp"

using namespace exatrain::plan;

TEST(Validate, Spearman) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ties take the average rank: ranks (1.5,1.5,3) vs (1,2,3): rho = 0.866...
  EXPECT_NEAR(spearman({1, 1, 2}, {1, 2, 3}), std::sqrt(3.0) / 2, 1e-12);
}

TEST(Validate, PublishedRunsWithinTarget) {
  // The target: MAPE <= 10% over all usable rows, no source above 20%.
  std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/../shared/validation/published_runs.csv";
  if (!std::filesystem::exists(csv)) GTEST_SKIP() << csv << " is not present in this checkout";
  ValidationReport rep = validate_runs(csv);
  EXPECT_GE(rep.results.size(), 250u);
  EXPECT_LE(rep.mape_pct, 10.0);
  for (const auto& s : rep.sources) EXPECT_LE(s.mape_pct, 20.0) << s.source;
}

TEST(Validate, MissingCellsAreSkippedNotGuessed) {
  CsvRow row = {{"source", "x"}, {"model_name", "m"}, {"layers", "24"}, {"hidden", "2048"},
                {"heads", ""}, {"seq_len", "2048"}, {"vocab", "50257"}, {"notes", ""}};
  RunCase rc = case_from_row(row, 1);
  EXPECT_EQ(rc.skip_reason, "heads not stated");
}
