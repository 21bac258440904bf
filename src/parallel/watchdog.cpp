#include "parallel/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/check.hpp"

namespace exatrain::parallel {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Watchdog::Watchdog(int world_rank, double timeout_s, bool abort_on_stall)
    : world_rank_(world_rank), timeout_s_(timeout_s), abort_on_stall_(abort_on_stall) {
  EXA_CHECK(timeout_s > 0, "watchdog timeout must be > 0 s, got {}", timeout_s);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::enter(const std::string& group, int64_t op_index, const char* op_name) {
  std::lock_guard<std::mutex> lock(mu_);
  start_ns_ = now_ns();
  group_ = group;
  op_index_ = op_index;
  op_name_ = op_name;
  reported_ = false;
}

void Watchdog::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  start_ns_ = 0;
}

void Watchdog::run() {
  auto poll = std::chrono::duration<double>(std::min(timeout_s_ / 4, 0.25));
  // A gap between two polls longer than the poll interval plus kUnobservedSlackS is time this
  // process did not run (SIGSTOP, a suspended VM or container): it is not counted as a wait.
  // Otherwise a rank frozen inside a call would, once resumed (Open MPI sends SIGCONT before
  // SIGTERM when it ends a job), report the time it was frozen as a wait of its own, and the
  // frozen rank would no longer be the one missing from the reports. A thread merely starved
  // for less than the slack keeps its time counted, so a real stall is still reported.
  constexpr double kUnobservedSlackS = 1.0;
  const int64_t poll_ns = static_cast<int64_t>(poll.count() * 1e9);
  const int64_t slack_ns = static_cast<int64_t>(kUnobservedSlackS * 1e9);
  std::unique_lock<std::mutex> lock(mu_);
  int64_t last_poll_ns = now_ns();
  while (!stop_) {
    cv_.wait_for(lock, poll);
    const int64_t polled_ns = now_ns();
    const int64_t gap_ns = polled_ns - last_poll_ns;
    last_poll_ns = polled_ns;
    if (start_ns_ != 0 && gap_ns > poll_ns + slack_ns)
      start_ns_ = std::min(polled_ns, start_ns_ + gap_ns - poll_ns);
    if (stop_ || start_ns_ == 0 || reported_) continue;
    double waited = (now_ns() - start_ns_) * 1e-9;
    if (waited < timeout_s_) continue;
    reported_ = true;
    stalls_++;
    std::fprintf(stderr,
                 "exatrain watchdog: rank %d waits in op %lld of group %s (%s) for %.1f s "
                 "(timeout %.1f s)\n",
                 world_rank_, static_cast<long long>(op_index_), group_.c_str(), op_name_, waited,
                 timeout_s_);
    std::fflush(stderr);
    // _Exit: no destructors, no MPI_Finalize (which would wait for the stalled peers).
    if (abort_on_stall_) std::_Exit(75);
  }
}

}  // namespace exatrain::parallel
