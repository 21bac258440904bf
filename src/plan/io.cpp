#include "plan/io.hpp"

#include <cmath>

namespace exatrain::plan {

double checkpoint_bytes(double parameters, Precision p) {
  double per_param = p == Precision::fp32 ? 12.0 : 14.0;
  return parameters * per_param;
}

double checkpoint_write_seconds(double parameters, Precision p, const MachineSpec& mach) {
  if (mach.storage_bw_gbs <= 0) return 0;
  return checkpoint_bytes(parameters, p) / (mach.storage_bw_gbs * 1e9);
}

std::optional<double> young_daly_interval_seconds(double checkpoint_s, int64_t nodes,
                                                  const MachineSpec& mach) {
  if (!mach.node_mtbf_hours || *mach.node_mtbf_hours <= 0 || nodes <= 0) return std::nullopt;
  double system_mtbf_s = *mach.node_mtbf_hours * 3600.0 / double(nodes);
  return std::sqrt(2.0 * checkpoint_s * system_mtbf_s);
}

}  // namespace exatrain::plan
