// Watchdog without MPI: a call held past the timeout is reported once; time the process was
// frozen (SIGSTOP) is not counted as a wait. Each case runs in a forked child, so the frozen
// process is the child, not the test runner; the child's exit code is its number of reports.
#include "parallel/watchdog.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace exatrain::parallel {
namespace {

using namespace std::chrono_literals;

// Forks a child that enters one call with a 2 s timeout, stays in it 0.5 s (its watchdog thread
// is polling by then, as on a rank that has run for a while), optionally freezes itself for
// `frozen_s`, then stays in the call `held_after` more and leaves. Returns the number of stalls
// its watchdog reported (the child's exit code).
int reports_of_child(double frozen_s, std::chrono::milliseconds held_after) {
  pid_t child = fork();
  if (child == 0) {
    Watchdog watchdog(/*world_rank=*/0, /*timeout_s=*/2.0, /*abort_on_stall=*/false);
    watchdog.enter("dp", 7, "wait");
    std::this_thread::sleep_for(500ms);
    if (frozen_s > 0) raise(SIGSTOP);
    std::this_thread::sleep_for(held_after);
    watchdog.leave();
    _exit(static_cast<int>(watchdog.stalls_reported()));
  }
  EXPECT_GT(child, 0) << "fork failed";
  int status = 0;
  if (frozen_s > 0) {
    EXPECT_EQ(waitpid(child, &status, WUNTRACED), child);
    EXPECT_TRUE(WIFSTOPPED(status));
    std::this_thread::sleep_for(std::chrono::duration<double>(frozen_s));
    kill(child, SIGCONT);
  }
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

TEST(Watchdog, ACallHeldPastTheTimeoutIsReportedOnce) {
  EXPECT_EQ(reports_of_child(0, 2000ms), 1);
}

TEST(Watchdog, ACallShorterThanTheTimeoutIsNotReported) {
  EXPECT_EQ(reports_of_child(0, 500ms), 0);
}

// The case of a rank frozen with SIGSTOP inside a collective and resumed by mpirun's SIGCONT
// before its SIGTERM: 0.5 s in the call, 4 s frozen (two timeouts), 0.5 s after: no report.
TEST(Watchdog, TimeTheProcessWasFrozenIsNotAWait) {
  EXPECT_EQ(reports_of_child(4.0, 500ms), 0);
}

// After the freeze the clock runs again: held 3 s more, the call is reported.
TEST(Watchdog, AfterAFreezeARealStallIsStillReported) {
  EXPECT_EQ(reports_of_child(4.0, 3000ms), 1);
}

}  // namespace
}  // namespace exatrain::parallel
