// Each backend's allocations: alloc_bytes touches every page (zeroed, resident at once);
// alloc_bytes_lazy returns zeroed, 64-byte aligned memory of which no page is resident until it
// is written (mincore), and free_bytes releases either kind. On every backend (op_harness.hpp).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "op_harness.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {
// Pages of [p, p + bytes) resident in memory.
int64_t resident_pages(const void* p, size_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(p) / page * page, hi = (uintptr_t(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> in((hi - lo) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()), 0);
  int64_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

class BackendMemory : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { EXA_SKIP_IF_UNAVAILABLE(GetParam()); }
};

TEST_P(BackendMemory, LazyAllocationIsZeroAndNotResidentUntilWritten) {
  auto be = make_backend(GetParam(), 1, 0);
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), bytes = 64 * page;
  float* eager = static_cast<float*>(be->alloc_bytes(bytes));
  float* lazy = static_cast<float*>(be->alloc_bytes_lazy(bytes));
  EXPECT_EQ(uintptr_t(lazy) % 64, 0u);
  EXPECT_EQ(uintptr_t(eager) % 64, 0u);
  // Residency is a property of host pages: checked where device memory is host memory (not on
  // the CUDA backend, whose host_accessible() is false); the zeros and writes everywhere.
  const bool host_pages = be->host_accessible();
  if (host_pages) {
    EXPECT_GE(resident_pages(eager, bytes), 64);  // (65 when it does not start a page)
    EXPECT_EQ(resident_pages(lazy, bytes), 0);
  }
  const float one = 1.0f, two = 2.0f;  // one page written at each end: two pages resident
  be->upload(lazy, &one, sizeof(float));
  be->upload(lazy + bytes / sizeof(float) - 1, &two, sizeof(float));
  if (host_pages) {
    EXPECT_EQ(resident_pages(lazy, bytes), 2);
  }
  std::vector<float> back(bytes / sizeof(float), -1.0f);  // reads see zeros elsewhere
  be->download(back.data(), lazy, bytes);
  double sum = 0;
  for (size_t i = 1; i + 1 < back.size(); i++) sum += back[i];
  EXPECT_EQ(sum, 0.0);
  EXPECT_EQ(back.front(), 1.0f);
  EXPECT_EQ(back.back(), 2.0f);
  be->download(back.data(), eager, bytes);
  for (size_t i = 0; i < back.size(); i += 997) sum += back[i];
  EXPECT_EQ(sum, 0.0);
  be->free_bytes(lazy);
  be->free_bytes(eager);
  be->free_bytes(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendMemory, testing::ValuesIn(backend_names()),
                         backend_test_name);

}  // namespace
