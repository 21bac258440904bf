#include "parallel/comm.hpp"

#include <chrono>
#include <climits>

#include "core/check.hpp"

namespace exatrain::parallel {

void CommLedger::add(const std::string& kind, int64_t sent_bytes) {
  bytes[kind] += sent_bytes;
  calls[kind] += 1;
}

void CommLedger::reset() {
  bytes.clear();
  calls.clear();
  seconds.clear();
}

int64_t CommLedger::total_bytes() const {
  int64_t t = 0;
  for (auto& [k, b] : bytes) t += b;
  return t;
}

std::vector<Request> Group::post_p2p(const std::vector<P2pCall>& calls) {
  std::vector<Request> out;
  out.reserve(calls.size());
  for (const P2pCall& c : calls)
    out.push_back(c.send ? isend(c.buf, c.n, c.t, c.peer, c.tag, c.kind) : irecv(c.buf, c.n, c.t, c.peer, c.tag));
  return out;
}

std::map<std::string, double> comm_breakdown_s(const CommLedger& ledger) {
  std::map<std::string, double> out{
      {"tp_comm", 0}, {"cp_comm", 0}, {"dp_comm", 0}, {"pp_comm", 0}, {"pp_bubble", 0}};
  for (const auto& [kind, sec] : ledger.seconds) {
    std::string group = kind.substr(0, kind.find('_'));
    if (kind == "pp_recv") out["pp_bubble"] += sec;
    else if (group == "tp" || group == "cp" || group == "dp" || group == "pp") out[group + "_comm"] += sec;
  }
  return out;
}

}  // namespace exatrain::parallel
