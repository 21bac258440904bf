// The guarded CPU backend's guard: host code that reads or writes device memory outside an op
// dies with a message naming the allocation, the offset and the last op; host-access scopes
// open and close access and are reference-counted per page with each other and with ops; an
// op whose shape arguments overrun an allocation is an error; faults elsewhere reach the
// handler that was installed before; every mapping is gone after free_bytes or the backend's
// destruction. (The ops' results on this backend: ops_test.cpp and memory_ops_test.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "../test_util/error_of.hpp"
#include "backend/backend.hpp"
#include "core/check.hpp"

using namespace exatrain;

namespace {

const int64_t kPageFloats = int64_t(sysconf(_SC_PAGESIZE)) / int64_t(sizeof(float));

// Death tests re-execute the test binary (the "threadsafe" style): forking a process whose
// OpenMP team exists leaves the child's team broken.
class Guarded : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The dying child leaves no core file in the working directory.
void no_core_dump() {
  struct rlimit r = {0, 0};
  setrlimit(RLIMIT_CORE, &r);
}

bool mapped(const void* p) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  unsigned char in = 0;
  return mincore(reinterpret_cast<void*>(uintptr_t(p) / page * page), 1, &in) == 0;
}

float host_read(const float* p) { return *static_cast<const volatile float*>(p); }
void host_write(float* p, float v) { *static_cast<volatile float*>(p) = v; }

TEST_F(Guarded, HostReadOutsideAnyOpDiesNamingAllocationOffsetAndLastOp) {
  EXPECT_DEATH(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);
        float* p = be->alloc(1024);
        be->label(p, "gradient arena");
        be->zero(p, 4096);
        host_read(p + 5);
      },
      "guarded backend: host code touched device memory at 0x[0-9a-f]+ \\(a read; allocation "
      "\"gradient arena\" of 4096 bytes, offset 20\\) outside any backend op \\(the last op was "
      "zero\\)");
}

TEST_F(Guarded, HostWriteOutsideAnyOpDies) {
  EXPECT_DEATH(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);
        float* p = be->alloc(1000);
        be->label(p, "activations");
        host_write(p + 999, 1.0f);
      },
      "host code touched device memory at 0x[0-9a-f]+ \\(a write; allocation \"activations\" of "
      "4000 bytes, offset 3996\\) outside any backend op \\(no op has run yet\\)");
}

TEST_F(Guarded, GuardPagesCatchAccessJustOutsideAnAllocation) {
  const std::string past = std::to_string(kPageFloats * 4);
  EXPECT_DEATH(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);
        float* p = be->alloc(kPageFloats);
        be->label(p, "one page");
        host_read(p + kPageFloats);
      },
      "allocation \"one page\" of " + past + " bytes, offset " + past + ", past its end\\)");
  EXPECT_DEATH(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);
        float* p = be->alloc(16);
        host_read(p - 1);
      },
      "allocation \"\\(no label\\)\" of 64 bytes, offset -4, in the guard page before it\\)");
}

TEST_F(Guarded, DevicePointerPassedAsHostSourceDiesInsideTheOp) {
  EXPECT_DEATH(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);
        float* a = be->alloc(16);
        float* b = be->alloc(16);
        be->label(b, "source");
        be->upload(a, b, 64);  // b is device memory: upload declares only its destination
      },
      "allocation \"source\" of 64 bytes, offset 0\\) inside op upload but outside the ranges it "
      "declared");
}

TEST_F(Guarded, HostAccessScopeAllowsAccessUntilItEnds) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* p = be->alloc(4096);
  be->label(p, "bucket");
  const int64_t t = be->begin_host_access(p + 100, 400 * sizeof(float));
  EXPECT_NE(t, 0);
  host_write(p + 100, 3.0f);  // as MPI would, inside the scope
  host_write(p + 499, 4.0f);
  EXPECT_EQ(host_read(p + 100), 3.0f);
  be->end_host_access(t);
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(p + 100);
      },
      "allocation \"bucket\" of 16384 bytes, offset 400\\) outside any backend op");
  float got[2];
  be->download(&got[0], p + 100, sizeof(float));
  be->download(&got[1], p + 499, sizeof(float));
  EXPECT_EQ(got[0], 3.0f);
  EXPECT_EQ(got[1], 4.0f);
  // Host memory and empty ranges need no scope: token 0, and ending it does nothing.
  float host[4] = {};
  EXPECT_EQ(be->begin_host_access(host, sizeof host), 0);
  EXPECT_EQ(be->begin_host_access(p, 0), 0);
  be->end_host_access(0);
  be->free_bytes(p);
}

TEST_F(Guarded, OverlappingHostAccessScopesKeepEachOthersPages) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* p = be->alloc(4 * kPageFloats);
  be->label(p, "overlap");
  const int64_t wide = be->begin_host_access(p, 2 * kPageFloats * sizeof(float));  // pages 0, 1
  const int64_t narrow = be->begin_host_access(p + 10, 4 * sizeof(float));         // page 0
  be->end_host_access(wide);
  host_write(p + 10, 1.0f);  // page 0: still open through `narrow`
  host_write(p, 2.0f);       // (page granularity: the whole page)
  EXPECT_EQ(host_read(p + 10), 1.0f);
  const std::string page1 = std::to_string((kPageFloats + 5) * 4);
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(p + kPageFloats + 5);
      },
      "allocation \"overlap\" of [0-9]+ bytes, offset " + page1 + "\\) outside any backend op");
  be->end_host_access(narrow);
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(p + 10);
      },
      "allocation \"overlap\" of [0-9]+ bytes, offset 40\\) outside any backend op");
  be->free_bytes(p);
}

TEST_F(Guarded, AnOpOverAHostAccessScopeDoesNotEndIt) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* p = be->alloc(2 * kPageFloats);
  be->label(p, "in flight");
  const int64_t t = be->begin_host_access(p, 64);
  be->fill(p, 1.5f, 2 * kPageFloats);  // opens and closes pages 0 and 1 around the scope's page 0
  EXPECT_EQ(host_read(p + 3), 1.5f);   // still open
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(p + kPageFloats);
      },
      "allocation \"in flight\" of [0-9]+ bytes, offset [0-9]+\\) outside any backend op \\(the "
      "last op was fill\\)");
  be->end_host_access(t);
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(p + 3);
      },
      "allocation \"in flight\" of [0-9]+ bytes, offset 12\\) outside any backend op");
  be->free_bytes(p);
}

TEST_F(Guarded, OpOverrunningAnAllocationIsAnErrorAndLeavesTheBackendUsable) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* p = be->alloc(1024);
  float* q = be->alloc(1024);
  be->label(p, "small");
  std::string msg = error_of([&] { be->fill(p, 0.0f, 1025); });
  EXPECT_NE(msg.find("fill declares 4100 bytes at offset 0 of allocation \"small\" of 4096 bytes"),
            std::string::npos) << msg;
  msg = error_of([&] { be->add(q, q, p + 1, 1024); });  // the third range overruns
  EXPECT_NE(msg.find("add declares 4096 bytes at offset 4 of allocation \"small\""),
            std::string::npos) << msg;
  be->fill(p, 2.0f, 1024);  // the failed ops closed what they had opened
  be->add(q, p, p, 1024);
  float got = 0;
  be->download(&got, q + 1023, sizeof got);
  EXPECT_EQ(got, 4.0f);
  EXPECT_DEATH(
      {
        no_core_dump();
        host_read(q);
      },
      "outside any backend op \\(the last op was download\\)");
  be->free_bytes(p);
  be->free_bytes(q);
}

TEST_F(Guarded, MisuseOfScopesAndFreeIsAnError) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* p = be->alloc(256);
  be->label(p, "comm buffer");
  const int64_t t = be->begin_host_access(p, 1024);
  std::string msg = error_of([&] { be->free_bytes(p); });
  EXPECT_NE(msg.find("allocation \"comm buffer\" while 1 host-access scope(s) on it are still open"),
            std::string::npos) << msg;
  be->end_host_access(t);
  msg = error_of([&] { be->end_host_access(t); });
  EXPECT_NE(msg.find("is not open (ended twice"), std::string::npos) << msg;
  float host = 0;
  msg = error_of([&] { be->free_bytes(&host); });
  EXPECT_NE(msg.find("not a live guarded allocation"), std::string::npos) << msg;
  msg = error_of([&] { be->free_bytes(p + 1); });
  EXPECT_NE(msg.find("not a live guarded allocation"), std::string::npos) << msg;
  be->free_bytes(p);
  msg = error_of([&] { be->free_bytes(p); });  // twice
  EXPECT_NE(msg.find("not a live guarded allocation"), std::string::npos) << msg;
}

TEST_F(Guarded, FreeAndDestructionUnmapEverything) {
  auto be = make_backend("cpu-guarded", 1, 0);
  float* a = be->alloc(10);
  auto* b = static_cast<float*>(be->alloc_bytes_lazy(1 << 20));
  float* c = be->alloc(3 * kPageFloats);
  const int64_t t = be->begin_host_access(c, 16);  // left open: destruction ends it
  EXPECT_TRUE(mapped(a) && mapped(b) && mapped(c));
  be->free_bytes(a);
  EXPECT_FALSE(mapped(a));
  be.reset();
  EXPECT_FALSE(mapped(b));
  EXPECT_FALSE(mapped(c));
  EXPECT_FALSE(mapped(c + 2 * kPageFloats));
  (void)t;
}

// A previous handler that announces itself (async-signal-safe: write and _exit only).
void previous_handler(int, siginfo_t*, void*) {
  const char m[] = "the previous handler ran\n";
  [[maybe_unused]] ssize_t w = write(STDERR_FILENO, m, sizeof m - 1);
  _exit(3);
}

TEST_F(Guarded, FaultsOutsideGuardedMemoryGoToThePreviousHandler) {
  auto fault_elsewhere = [] {
    void* q = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    host_write(static_cast<float*>(q), 1.0f);
  };
  EXPECT_EXIT(
      {
        no_core_dump();
        struct sigaction sa = {};
        sa.sa_sigaction = previous_handler;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, nullptr);
        auto be = make_backend("cpu-guarded", 1, 0);  // installs its handler over this one
        be->alloc(16);
        fault_elsewhere();
      },
      testing::ExitedWithCode(3), "the previous handler ran");
  EXPECT_EXIT(
      {
        no_core_dump();
        auto be = make_backend("cpu-guarded", 1, 0);  // over the default action
        fault_elsewhere();
      },
      testing::KilledBySignal(SIGSEGV), "");
}

}  // namespace
