#include "parallel/optimizer_comm.hpp"

namespace exatrain::parallel {

void GroupReplicaComm::all_reduce_sum(float* buf, int64_t n, const std::string& kind) {
  const std::string from = dp_.name() + "_all_reduce";
  const int64_t bytes = ledger_.bytes[from], calls = ledger_.calls[from];
  const double seconds = ledger_.seconds[from];
  dp_.all_reduce_sum(buf, n);
  ledger_.bytes[kind] += ledger_.bytes[from] - bytes;
  ledger_.calls[kind] += ledger_.calls[from] - calls;
  ledger_.seconds[kind] += ledger_.seconds[from] - seconds;
  ledger_.bytes[from] = bytes, ledger_.calls[from] = calls, ledger_.seconds[from] = seconds;
}

}  // namespace exatrain::parallel
