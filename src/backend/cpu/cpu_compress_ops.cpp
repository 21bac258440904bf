// The CPU backend's gradient-compression ops (backend/backend.hpp, "gradient compression"):
// top-k by magnitude, the sampled threshold and the selection above it, gather/scatter by index
// and by block, 1-bit signs, Gram-Schmidt for PowerSGD, and index-list arithmetic. Index lists
// are checked against the buffer they address (they may come from another rank). Selections are
// serial (radix selection: O(n)); elementwise loops are OpenMP parallel with no order dependence;
// scatters run in index-list order, so repeated indices add up in a fixed order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "core/check.hpp"
#include "core/splitmix.hpp"

namespace exatrain {
namespace {

// |x| as a selection key: a NaN sorts first (it must reach the gradient norm, which stops or
// skips the step), so the order is total.
inline float magnitude(float v) {
  const float a = std::fabs(v);
  return a != a ? INFINITY : a;
}

void check_indices(const char* op, const int32_t* idx, int64_t k, int64_t n) {
  for (int64_t i = 0; i < k; i++)
    EXA_CHECK(idx[i] >= 0 && idx[i] < n, "{}: index {} = {} outside the buffer of {} elements", op, i, idx[i], n);
}

void check_blocks(const char* op, const int32_t* blocks, int64_t kb, int64_t n, int64_t block) {
  EXA_CHECK(block >= 1, "{}: block size {} < 1", op, block);
  const int64_t nb = (n + block - 1) / block;
  for (int64_t j = 0; j < kb; j++)
    EXA_CHECK(blocks[j] >= 0 && blocks[j] < nb, "{}: block {} = {} outside the {} blocks of {} elements", op, j,
              blocks[j], nb, n);
}

// topk_abs's contract by nth_element over an index array (larger magnitude first, then the lower
// index), then a sort of the k chosen indices: for small n.
void topk_abs_small(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto before = [x](int32_t a, int32_t b) {
    const float ma = magnitude(x[a]), mb = magnitude(x[b]);
    return ma > mb || (ma == mb && a < b);
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
  std::sort(order.begin(), order.begin() + k);
  for (int64_t i = 0; i < k; i++) {
    idx[i] = int32_t(base + order[size_t(i)]);
    val[i] = x[order[size_t(i)]];
  }
}

}  // namespace

// The k largest magnitudes by radix selection on the magnitudes' bits (for a float >= 0, and for
// +inf, which is a NaN's key, the IEEE bits order as the values do): a histogram of the top 16 bits
// finds the bin holding the k-th largest key, a histogram of the low 16 bits inside that bin the key
// T itself; a last pass in index order takes every key above T and the first (lowest-index) keys
// equal to T until k are taken, which is the contract's tie rule and leaves the output ascending
// without a sort. Three passes over x instead of nth_element's random access through an index
// array of n: the split-and-reduce collective (which selects in its dense region) on 16M floats at 2
// ranks went from 0.72x / 1.36x / 3.7x of the dense all-reduce's time to 0.58x / 0.68x / 1.17x at
// densities 0.1% / 1% / 10% (bench_sparse_collectives, docs/compression.md).
void CpuBackend::topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) {
  EXA_CHECK(k >= 0 && k <= n && base >= 0 && base + n <= (int64_t(1) << 31),
            "topk_abs: k = {} of n = {} at base {} (expected 0 <= k <= n, base + n <= 2^31)", k, n, base);
  if (k == 0) return;
  // Below 2^17 elements the two 2^16-bin histograms would cost more than the selection itself
  // (block top-k selects among block counts, top-k among pieces from 1,024 elements): nth_element.
  if (n < (int64_t(1) << 17)) return topk_abs_small(idx, val, x, n, k, base);
  auto key = [x](int64_t i) {
    const float m = magnitude(x[i]);
    uint32_t bits;
    std::memcpy(&bits, &m, sizeof bits);
    return bits;
  };
  // The bin (of `shift`-bit-shifted keys matching `prefix` above it) holding the `rank`-th largest
  // key (rank from 1); rank becomes the rank inside that bin.
  std::vector<int64_t> hist(size_t(1) << 16);
  auto select_bin = [&](int shift, uint32_t prefix, int64_t& rank) {
    std::fill(hist.begin(), hist.end(), 0);
    for (int64_t i = 0; i < n; i++) {
      const uint32_t kx = key(i);
      if (shift == 0 && (kx >> 16) != prefix) continue;
      hist[(kx >> shift) & 0xffffu]++;
    }
    uint32_t b = 0xffffu;
    while (rank > hist[b]) rank -= hist[b--];
    return b;
  };
  int64_t rank = k;
  const uint32_t high = select_bin(16, 0, rank);
  const uint32_t threshold = (high << 16) | select_bin(0, high, rank);
  // `rank` keys equal to the threshold are taken (the lowest indices), every key above it.
  int64_t out = 0, equal_left = rank;
  for (int64_t i = 0; i < n && out < k; i++) {
    const uint32_t kx = key(i);
    if (kx < threshold || (kx == threshold && equal_left-- <= 0)) continue;
    idx[out] = int32_t(base + i), val[out] = x[i], out++;
  }
}

void CpuBackend::sample_abs(float* out, const float* x, int64_t n, int64_t s, uint64_t seed) {
  EXA_CHECK(s >= 1 && s <= n, "sample_abs: {} samples of {} elements (expected 1 <= samples <= n)", s, n);
  for (int64_t j = 0; j < s; j++) {
    const int64_t lo = j * n / s, hi = (j + 1) * n / s;  // hi > lo since s <= n
    const uint64_t r = splitmix64_mix(seed ^ splitmix64_mix(uint64_t(j) + 0x9e3779b97f4a7c15ull));
    out[j] = magnitude(x[lo + int64_t(r % uint64_t(hi - lo))]);
  }
}

int64_t CpuBackend::select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold,
                                        int64_t cap, int64_t base) {
  EXA_CHECK(base >= 0 && base + n <= (int64_t(1) << 31), "select_abs_at_least: {} elements at base {} (expected "
            "base + n <= 2^31)", n, base);
  int64_t count = 0;
  for (int64_t i = 0; i < n; i++) {
    if (magnitude(x[i]) < threshold) continue;
    if (count < cap) idx[count] = int32_t(base + i), val[count] = x[i];
    count++;
  }
  return count;
}

void CpuBackend::gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) {
  check_indices("gather", idx, k, n);
  for (int64_t i = 0; i < k; i++) out[i] = x[idx[i]];
}

void CpuBackend::scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) {
  for (int64_t i = 0; i < k; i++)
    EXA_CHECK(idx[i] - base >= 0 && idx[i] - base < n, "scatter_add: index {} = {} outside [{}, {})", i, idx[i], base,
              base + n);
  for (int64_t i = 0; i < k; i++) x[idx[i] - base] += val[i];
}

void CpuBackend::scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) {
  check_indices("scatter_fill", idx, k, n);
  for (int64_t i = 0; i < k; i++) x[idx[i]] = value;
}

void CpuBackend::block_sum_squares(float* out, const float* x, int64_t n, int64_t block) {
  EXA_CHECK(block >= 1, "block_sum_squares: block size {} < 1", block);
  const int64_t nb = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t b = 0; b < nb; b++) {
    double s = 0;
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); i++) s += double(x[i]) * double(x[i]);
    out[b] = float(s);
  }
}

void CpuBackend::gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb,
                               int64_t block) {
  check_blocks("gather_blocks", blocks, kb, n, block);
  for (int64_t j = 0; j < kb; j++) {
    const int64_t at = int64_t(blocks[j]) * block, len = std::min(block, n - at);
    std::memcpy(out + j * block, x + at, sizeof(float) * size_t(len));
    std::fill(out + j * block + len, out + (j + 1) * block, 0.0f);
  }
}

void CpuBackend::scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                                    int64_t block) {
  check_blocks("scatter_add_blocks", blocks, kb, n, block);
  for (int64_t j = 0; j < kb; j++) {
    const int64_t at = int64_t(blocks[j]) * block, len = std::min(block, n - at);
    for (int64_t i = 0; i < len; i++) x[at + i] += val[j * block + i];
  }
}

void CpuBackend::fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) {
  check_blocks("fill_blocks", blocks, kb, n, block);
  for (int64_t j = 0; j < kb; j++) {
    const int64_t at = int64_t(blocks[j]) * block;
    std::fill(x + at, x + std::min(n, at + block), value);
  }
}

double CpuBackend::sum_abs(const float* x, int64_t n) {
  // Fixed-size chunks summed in index order: the result does not depend on the thread count.
  const int64_t chunk = 1 << 14, chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(size_t(std::max<int64_t>(chunks, 1)), 0.0);
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t c = 0; c < chunks; c++) {
    double s = 0;
    for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); i++) s += std::fabs(double(x[i]));
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

void CpuBackend::sign_pack(int32_t* bits, const float* x, int64_t n) {
  const int64_t words = (n + 31) / 32;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t w = 0; w < words; w++) {
    uint32_t word = 0;
    for (int64_t j = 0; j < 32 && w * 32 + j < n; j++)
      if (x[w * 32 + j] >= 0) word |= uint32_t(1) << j;
    std::memcpy(&bits[w], &word, 4);
  }
}

void CpuBackend::sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) {
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    uint32_t word;
    std::memcpy(&word, &bits[i / 32], 4);
    x[i] += (word >> (i % 32)) & 1u ? scale : -scale;
  }
}

void CpuBackend::orthonormalize_columns(float* P, int64_t rows, int64_t cols) {
  std::vector<double> a(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) a[size_t(i)] = P[i];
  auto at = [&](int64_t r, int64_t c) -> double& { return a[size_t(r * cols + c)]; };
  for (int64_t c = 0; c < cols; c++) {
    double norm = 0;
    for (int64_t r = 0; r < rows; r++) norm += at(r, c) * at(r, c);
    norm = std::sqrt(norm);
    if (norm > 0)
      for (int64_t r = 0; r < rows; r++) at(r, c) /= norm;
    for (int64_t d = c + 1; d < cols; d++) {
      double dot = 0;
      for (int64_t r = 0; r < rows; r++) dot += at(r, c) * at(r, d);
      for (int64_t r = 0; r < rows; r++) at(r, d) -= dot * at(r, c);
    }
  }
  for (int64_t i = 0; i < rows * cols; i++) P[i] = float(a[size_t(i)]);
}

int64_t CpuBackend::count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) {
  int64_t i = 0, j = 0, common = 0;
  while (i < ka && j < kb) {
    if (a[i] < b[j]) i++;
    else if (b[j] < a[i]) j++;
    else common++, i++, j++;
  }
  return common;
}

void CpuBackend::count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) {
  for (int64_t r = 0; r < nb; r++)
    below[r] = int64_t(std::lower_bound(idx, idx + k, bounds[r], [](int32_t v, int64_t b) { return v < b; }) - idx);
}

}  // namespace exatrain
