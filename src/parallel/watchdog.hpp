// Watchdog: a thread that notices when this rank has been inside one communication call for
// longer than a timeout and reports "rank r waits in op k of group g" (k counts the calls made on
// that group, identical on every member when they call in the same order, so comparing the
// reports of all ranks shows which rank never arrived). With abort_on_stall it then ends the
// process with exit code 75; mpirun sees a rank exit without MPI_Finalize and kills the rest, so
// a stalled job ends instead of hanging until the batch system's wall clock.
//
// A rank that dies (kill -9, OOM killer) is detected by Open MPI itself: mpirun reports
// "process rank r ... exited on signal 9" and terminates the others. The watchdog covers the other
// failure: every process alive but one never entering the collective (deadlock, stuck I/O).
//
// Time this process did not run (SIGSTOP, a suspended VM: a gap between two polls of more than
// the poll interval + 1 s) is not counted as a wait, so a frozen rank, once resumed, does not
// report its own freeze and stays the one missing from the reports.
//
// The watchdog thread never calls MPI, so MPI_THREAD_FUNNELED (or even SINGLE) suffices.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace exatrain::parallel {

class Watchdog {
 public:
  // timeout_s > 0. The thread polls every min(timeout/4, 0.25 s).
  Watchdog(int world_rank, double timeout_s, bool abort_on_stall);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Called by Group around every blocking call / wait: op_index is the group's call counter.
  void enter(const std::string& group, int64_t op_index, const char* op_name);
  void leave();

  // Number of stalls reported so far (for tests that run with abort_on_stall = false).
  int64_t stalls_reported() const { return stalls_.load(); }

 private:
  void run();

  int world_rank_;
  double timeout_s_;
  bool abort_on_stall_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // Current call, guarded by mu_. start_ns == 0: not inside a call.
  int64_t start_ns_ = 0;
  std::string group_;
  int64_t op_index_ = 0;
  const char* op_name_ = "";
  bool reported_ = false;
  std::atomic<int64_t> stalls_{0};
  std::thread thread_;
};

// A raw MPI call outside the Groups (e.g. a double all-reduce on the world communicator) watched
// like theirs: enter on construction, leave on destruction; a null watchdog does nothing. Keep the
// scope around the one call only.
class WatchdogScope {
 public:
  WatchdogScope(Watchdog* w, const std::string& group, int64_t op_index, const char* op_name) : w_(w) {
    if (w_) w_->enter(group, op_index, op_name);
  }
  ~WatchdogScope() {
    if (w_) w_->leave();
  }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  Watchdog* w_;
};

}  // namespace exatrain::parallel
