// The memory ops of the device boundary, on every backend (op_harness.hpp): fill; release
// (whole pages returned to the system, shared pages filled, the free-range bounds honoured);
// f32 <-> bf16 conversion against an independent round-to-nearest-even reference; host staging
// memory; events and streams (host-synchronous: a wait on an unrecorded event is an error).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../test_util/error_of.hpp"
#include "backend/backend.hpp"
#include "core/check.hpp"
#include "op_harness.hpp"

using namespace exatrain;
using namespace exatrain::test;

namespace {

class MemoryOps : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { EXA_SKIP_IF_UNAVAILABLE(GetParam()); }
  Backend& be() { return backend_named(GetParam()); }
};

const uintptr_t kPage = uintptr_t(sysconf(_SC_PAGESIZE));

std::vector<float> download(Backend& be, const float* p, size_t n) {
  std::vector<float> h(n);
  be.download(h.data(), p, sizeof(float) * n);
  return h;
}

// ---- fill ----------------------------------------------------------------------------------------

TEST_P(MemoryOps, FillSetsExactlyTheRange) {
  const size_t n = 70001;
  Buf b(be(), Vec(n, 1.0));
  be().fill(b.p + 3, 2.5f, int64_t(n) - 10);
  be().fill(b.p, 9.0f, 0);  // nothing
  std::vector<float> got = download(be(), b.p, n);
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ(got[i], i >= 3 && i < n - 7 ? 2.5f : 1.0f) << "element " << i;
  be().fill(b.p + 1, std::numeric_limits<float>::quiet_NaN(), 1);
  got = download(be(), b.p, 3);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], 1.0f);
}

// ---- release -------------------------------------------------------------------------------------

// Whether page [pg, pg + kPage) is resident.
bool resident(uintptr_t pg) {
  unsigned char in = 0;
  EXPECT_EQ(mincore(reinterpret_cast<void*>(pg), kPage, &in), 0);
  return in & 1;
}

// release(x + first, last - first, fill, x + free_first, x + free_last) on a buffer of ones,
// checked against the contract (backend.hpp): a page touching [first, last) is returned when it
// lies inside [first, last) or inside the free range, and then is not resident and reads 0;
// the rest of [first, last) reads `fill`; everything else keeps its 1.
void check_release(Backend& be, int64_t first, int64_t last, int64_t free_first,
                   int64_t free_last, float fill) {
  SCOPED_TRACE(testing::Message() << "release [" << first << ", " << last << ") free range ["
                                  << free_first << ", " << free_last << ") fill " << fill);
  const int64_t per_page = int64_t(kPage / sizeof(float)), n = 12 * per_page + 100;
  Buf b(be, Vec(size_t(n), 1.0));  // written: every page resident
  float* x = b.p;
  be.release(x + first, last - first, fill, x + free_first, x + free_last);
  const uintptr_t lo = uintptr_t(x + first), hi = uintptr_t(x + last);
  const uintptr_t flo = uintptr_t(x + free_first), fhi = uintptr_t(x + free_last);
  auto returned = [&](uintptr_t pg) {
    return pg < hi && pg + kPage > lo &&
           ((lo <= pg && pg + kPage <= hi) || (flo <= pg && pg + kPage <= fhi));
  };
  int64_t n_returned = 0;
  for (uintptr_t pg = lo / kPage * kPage; pg < hi; pg += kPage) {  // before any read of them
    if (be.host_accessible()) {  // host pages (the CUDA backend only zeroes them: cuda_backend.cpp)
      EXPECT_EQ(resident(pg), !returned(pg)) << "page at offset " << int64_t(pg - uintptr_t(x));
    }
    n_returned += returned(pg);
  }
  std::vector<float> got = download(be, x, size_t(n));
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    const uintptr_t pg = uintptr_t(x + i) / kPage * kPage;
    const float want = returned(pg) ? 0.0f : (i >= first && i < last ? fill : 1.0f);
    const bool ok = std::isnan(want) ? std::isnan(got[size_t(i)]) : got[size_t(i)] == want;
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[size_t(i)] << " want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
  if (last - first >= 2 * per_page) {
    EXPECT_GE(n_returned, 1);  // the case returns some pages
  }
}

TEST_P(MemoryOps, ReleaseReturnsWholePagesAndFillsSharedOnes) {
  const int64_t P = int64_t(kPage / sizeof(float));
  // Pages shared with live data on both ends: those parts are filled, the inner pages returned.
  check_release(be(), P / 2 + 3, 5 * P + 7, P / 2 + 3, 5 * P + 7, 0.5f);
  // The free range covers the shared pages too: they are returned whole.
  check_release(be(), P / 2 + 3, 5 * P + 7, 0, 8 * P + 5, 0.5f);
  // Free range covering one end only; NaN fill (released ZeRO-3 parameters).
  check_release(be(), P + 1, 7 * P - 1, 1, 7 * P - 1, std::numeric_limits<float>::quiet_NaN());
  // Inside one page: nothing returned, all filled.
  check_release(be(), 2 * P + 5, 2 * P + 50, 2 * P + 5, 2 * P + 50, -3.0f);
  // Nothing at all.
  check_release(be(), 3 * P, 3 * P, 3 * P, 3 * P, 7.0f);
}

TEST_P(MemoryOps, ReleaseOutsideItsFreeRangeIsAnError) {
  Buf b(be(), size_t(4096));
  const std::string msg = error_of([&] { be().release(b.p + 10, 100, 0.0f, b.p + 20, b.p + 200); });
  EXPECT_NE(msg.find("outside the free range"), std::string::npos) << msg;
  const std::string msg2 = error_of([&] { be().release(b.p + 10, 100, 0.0f, b.p, b.p + 50); });
  EXPECT_NE(msg2.find("outside the free range"), std::string::npos) << msg2;
}

// ---- bf16 ----------------------------------------------------------------------------------------

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest bf16, ties to even, by comparing the distances to the two neighbours in
// double (both differences are exact); beyond the largest finite bf16 the upper neighbour is
// 2^128, as IEEE rounding with an unbounded exponent (then it becomes infinity).
uint16_t reference_bf16(uint32_t u) {
  const uint32_t down = u & 0xffff0000u, up = down + 0x10000u;  // toward / away from zero
  if (down == u) return uint16_t(u >> 16);
  const double f = bits_to_float(u), d = bits_to_float(down);
  const bool overflows = (down & 0x7fffffffu) == 0x7f7f0000u;
  const double uv = overflows ? std::copysign(std::ldexp(1.0, 128), f) : double(bits_to_float(up));
  const double ed = std::fabs(f - d), eu = std::fabs(uv - f);
  if (ed != eu) return uint16_t((ed < eu ? down : up) >> 16);
  return uint16_t(((down >> 16) & 1u) ? up >> 16 : down >> 16);
}

bool is_nan_bf16(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

TEST_P(MemoryOps, Bf16RoundsToNearestEvenKeepsNanInfAndDenormals) {
  std::vector<uint32_t> in = {
      0x00000000u, 0x80000000u,              // +-0
      0x7f800000u, 0xff800000u,              // +-Inf
      0x7fc00000u, 0xffc00001u, 0x7f800001u,  // NaNs; the last would round to Inf by bits
      0x7fbfffffu, 0x7f80ffffu,
      0x3f808000u, 0x3f818000u,              // ties: to even (down), to even (up)
      0x3f808001u, 0x3f807fffu,              // just above / below a tie
      0x00000001u, 0x80000001u, 0x007fffffu,  // denormals
      0x00008000u, 0x00018000u, 0x00007fffu,  // denormal ties and below
      0x7f7fffffu, 0xff7fffffu, 0x7f7f7fffu, 0x7f7f8000u,  // overflow to Inf / stay finite
      0x00800000u, 0x3f800000u, 0xc0490fdbu};  // normal min, 1, -pi
  std::mt19937 rng(41);
  for (int i = 0; i < 100000; i++) in.push_back(uint32_t(rng()));
  for (int i = 0; i < 20000; i++) in.push_back((uint32_t(rng()) & 0xffff0000u) | 0x8000u);  // ties
  const int64_t n = int64_t(in.size());
  std::vector<float> f(in.size());
  std::memcpy(f.data(), in.data(), 4 * in.size());
  Buf src(be(), size_t(n));
  be().upload(src.p, f.data(), 4 * size_t(n));
  auto* dst = static_cast<uint16_t*>(be().alloc_bytes(2 * size_t(n)));
  be().f32_to_bf16(dst, src.p, n);
  std::vector<uint16_t> got(in.size());
  be().download(got.data(), dst, 2 * size_t(n));
  be().free_bytes(dst);
  int bad = 0;
  for (size_t i = 0; i < in.size(); i++) {
    const bool nan = std::isnan(bits_to_float(in[i]));
    const bool ok = nan ? is_nan_bf16(got[i]) && (got[i] >> 15) == (in[i] >> 31)
                        : got[i] == reference_bf16(in[i]);
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << std::hex << "f32 0x" << in[i] << " -> bf16 0x" << got[i] << ", want 0x"
                    << (nan ? 0x7fc0u : reference_bf16(in[i]));
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(got[2], 0x7f80u);   // Inf stays Inf
  EXPECT_EQ(got[19], 0x7f80u);  // the largest float rounds to Inf
  EXPECT_EQ(got[9], 0x3f80u);   // tie, even below
  EXPECT_EQ(got[10], 0x3f82u);  // tie, even above
}

TEST_P(MemoryOps, Bf16ToF32IsExactForEveryPattern) {
  const int64_t n = 1 << 16;
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) h[size_t(i)] = uint16_t(i);
  auto* src = static_cast<uint16_t*>(be().alloc_bytes(2 * size_t(n)));
  be().upload(src, h.data(), 2 * size_t(n));
  Buf dst(be(), size_t(n));
  be().bf16_to_f32(dst.p, src, n);
  std::vector<uint32_t> got(static_cast<size_t>(n));
  be().download(got.data(), dst.p, 4 * size_t(n));
  be().free_bytes(src);
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(got[size_t(i)], uint32_t(i) << 16) << "bf16 " << i;
}

// ---- host staging memory -------------------------------------------------------------------------

TEST_P(MemoryOps, HostStagingMemoryIsAlignedWritableAndCopiesBothWays) {
  for (size_t bytes : {size_t(0), size_t(1), size_t(1000003)}) {
    auto* p = static_cast<unsigned char*>(be().alloc_host(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(uintptr_t(p) % 64, 0u);
    for (size_t i = 0; i < bytes; i++) p[i] = static_cast<unsigned char>(i * 7);
    for (size_t i = 0; i < bytes; i++) ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7));
    be().free_host(p);
  }
  const int64_t n = 5000;
  HostBuffer<float> out(be(), n), back(be(), n);
  for (int64_t i = 0; i < n; i++) out[i] = float(i) * 0.5f;
  DeviceBuffer d(be(), n, "staging test");
  be().upload(d.data(), out.data(), sizeof(float) * size_t(n));
  be().download(back.data(), d.data(), sizeof(float) * size_t(n));
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(back[i], out[i]);
}

// ---- streams and events --------------------------------------------------------------------------

TEST_P(MemoryOps, EventsMustBeRecordedBeforeAWaitOrSynchronize) {
  auto e = be().create_event();
  auto s = be().create_stream();
  std::string msg = error_of([&] { be().wait(*s, *e); });
  EXPECT_NE(msg.find("never recorded"), std::string::npos) << msg;
  msg = error_of([&] { be().synchronize(*e); });
  EXPECT_NE(msg.find("never recorded"), std::string::npos) << msg;
  Buf b(be(), size_t(100));
  be().fill(b.p, 4.0f, 100);  // on the compute stream, then the event after it
  be().record(*e, be().compute_stream());
  EXPECT_NO_THROW(be().wait(*s, *e));
  EXPECT_NO_THROW(be().synchronize(*e));
  be().synchronize();
  EXPECT_EQ(download(be(), b.p, 100)[99], 4.0f);
}

INSTANTIATE_TEST_SUITE_P(Backends, MemoryOps, testing::ValuesIn(backend_names()), backend_test_name);

}  // namespace
