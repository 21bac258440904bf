#include "plan/pipeline.hpp"

#include <algorithm>
#include <numeric>

namespace exatrain::plan {

double bubble_fraction(const Plan& p) {
  return double(p.pp - 1) / (double(p.vp) * double(p.micro_batches()));
}

double bubble_time(const std::vector<double>& t, int64_t vp) {
  if (t.size() <= 1) return 0;
  double sum = std::accumulate(t.begin(), t.end(), 0.0);
  double max = *std::max_element(t.begin(), t.end());
  return (sum - max) / double(vp);
}

}  // namespace exatrain::plan
