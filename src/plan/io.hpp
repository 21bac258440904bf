// Checkpoint I/O: time to write one checkpoint and the Young/Daly optimal checkpoint interval.
#pragma once
#include <optional>

#include "job/job.hpp"

namespace exatrain::plan {

// Bytes of one checkpoint: weights and the optimizer state (fp32 master weights and Adam moments
// under mixed precision: 4 + 4 + 4 bytes per parameter plus the 2-byte weights; fp32: 4 + 4 + 4).
double checkpoint_bytes(double parameters, Precision p);
// Seconds to write it through the file system's aggregate bandwidth.
double checkpoint_write_seconds(double parameters, Precision p, const MachineSpec& mach);
// Young/Daly first-order optimum: interval = sqrt(2 * C * M), with C the checkpoint write time
// and M = node_mtbf / nodes the machine's mean time between failures (Daly 2006, FGCS 22).
// nullopt when the machine gives no node MTBF.
std::optional<double> young_daly_interval_seconds(double checkpoint_s, int64_t nodes,
                                                  const MachineSpec& mach);

}  // namespace exatrain::plan
