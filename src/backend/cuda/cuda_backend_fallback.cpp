// CudaBackend's host fallbacks: ops without a CUDA kernel yet copy their operands to the host, run
// the CPU backend's code on them (the same results as the CPU backend, errors included: an index
// out of range is the CPU op's error) and copy the results back. Each synchronises the compute
// stream. Which ops: cuda_backend.hpp; why: they are not on the path of GPT-2 with AdamW, and the
// LAPACK ones (dsyevd, dgeqrf/dorgqr in double) would need cuSOLVER's double-precision solvers,
// whose n (<= a few thousand) rarely pays for the GPU (docs/cuda.md: future work).
#include "backend/cuda/cuda_backend_impl.hpp"

namespace exatrain {

void CudaBackend::permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order,
                                 const int64_t* col_order) {
  // A kernel over device copies of the host index arrays, into scratch, then back into a.
  const int64_t n = rows * cols;
  if (n <= 0) return;
  std::vector<int64_t> ro(row_order ? row_order : nullptr, row_order ? row_order + rows : nullptr);
  std::vector<int64_t> co(col_order ? col_order : nullptr, col_order ? col_order + cols : nullptr);
  for (int64_t v : ro) EXA_CHECK(v >= 0 && v < rows, "permute_matrix: row index {} outside [0, {})", v, rows);
  for (int64_t v : co) EXA_CHECK(v >= 0 && v < cols, "permute_matrix: column index {} outside [0, {})", v, cols);
  const cuda::Scratch scratch(alloc_, sizeof(float) * size_t(n));
  cuda::Scratch rows_dev, cols_dev;
  if (!ro.empty()) rows_dev = cuda::Scratch(alloc_, sizeof(int64_t) * ro.size()), device(rows_dev.get<int64_t>(), ro);
  if (!co.empty()) cols_dev = cuda::Scratch(alloc_, sizeof(int64_t) * co.size()), device(cols_dev.get<int64_t>(), co);
  cuda::permute_matrix(cs(), scratch.get<float>(), a, rows, cols, rows_dev.get<int64_t>(), cols_dev.get<int64_t>());
  launched("permute_matrix");
  copy(a, scratch.get(), sizeof(float) * size_t(n));
}

void CudaBackend::lamb_update(float* param, const float* grad, float* m, float* v, float* scratch, int64_t n,
                              const LambStep& s) {
  auto p = host(param, n), g = host(grad, n), hm = host(m, n), hv = host(v, n), r = host(scratch, n);
  cpu().lamb_update(p.data(), g.data(), hm.data(), hv.data(), r.data(), n, s);
  device(param, p), device(m, hm), device(v, hv), device(scratch, r);
}

void CudaBackend::adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m,
                                   float* scratch, int64_t rows, int64_t cols, const AdafactorStep& s) {
  const int64_t n = rows * cols;
  auto p = host(param, n), g = host(grad, n), u = host(scratch, n);
  std::vector<float> hr = row ? host(row, rows) : std::vector<float>(), hc = col ? host(col, cols) : std::vector<float>();
  std::vector<float> hv = v ? host(v, n) : std::vector<float>(), hm = m ? host(m, n) : std::vector<float>();
  cpu().adafactor_update(p.data(), g.data(), row ? hr.data() : nullptr, col ? hc.data() : nullptr,
                         v ? hv.data() : nullptr, m ? hm.data() : nullptr, u.data(), rows, cols, s);
  device(param, p), device(scratch, u);
  if (row) device(row, hr);
  if (col) device(col, hc);
  if (v) device(v, hv);
  if (m) device(m, hm);
}

bool CudaBackend::sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) {
  auto a = host(A, n * n), o = host(out, n * n);
  if (!cpu().sym_inverse_root(o.data(), a.data(), n, eps, p)) return false;
  device(out, o);
  return true;
}

bool CudaBackend::sym_eigenbasis(float* Q, const float* A, int64_t n) {
  auto a = host(A, n * n), q = host(Q, n * n);
  if (!cpu().sym_eigenbasis(q.data(), a.data(), n)) return false;
  device(Q, q);
  return true;
}

bool CudaBackend::power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) {
  auto a = host(A, n * n), q = host(Q, n * n);
  if (!cpu().power_qr_refresh(q.data(), a.data(), n, order)) return false;  // order: host memory already
  device(Q, q);
  return true;
}

bool CudaBackend::sym_eigh(float* Q, float* d, const float* A, int64_t n) {
  auto a = host(A, n * n), q = host(Q, n * n), hd = host(d, n);
  if (!cpu().sym_eigh(q.data(), hd.data(), a.data(), n)) return false;
  device(Q, q), device(d, hd);
  return true;
}

// ---- gradient compression ------------------------------------------------------------------------

void CudaBackend::topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) {
  auto hx = host(x, n);
  std::vector<int32_t> hi(size_t(std::max<int64_t>(k, 0)));
  std::vector<float> hv(hi.size());
  cpu().topk_abs(hi.data(), hv.data(), hx.data(), n, k, base);
  device(idx, hi), device(val, hv);
}

void CudaBackend::sample_abs(float* out, const float* x, int64_t n, int64_t s, uint64_t seed) {
  auto hx = host(x, n);
  std::vector<float> ho(size_t(std::max<int64_t>(s, 0)));
  cpu().sample_abs(ho.data(), hx.data(), n, s, seed);
  device(out, ho);
}

int64_t CudaBackend::select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold,
                                         int64_t cap, int64_t base) {
  auto hx = host(x, n);
  std::vector<int32_t> hi(size_t(std::max<int64_t>(cap, 0)));
  std::vector<float> hv(hi.size());
  const int64_t count = cpu().select_abs_at_least(hi.data(), hv.data(), hx.data(), n, threshold, cap, base);
  hi.resize(size_t(std::min(count, cap))), hv.resize(hi.size());
  device(idx, hi), device(val, hv);
  return count;
}

void CudaBackend::gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) {
  auto hx = host(x, n);
  auto hi = host(idx, k);
  std::vector<float> ho(hi.size());
  cpu().gather(ho.data(), hx.data(), n, hi.data(), k);
  device(out, ho);
}

void CudaBackend::scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) {
  auto hx = host(x, n);
  auto hi = host(idx, k);
  auto hv = host(val, k);
  cpu().scatter_add(hx.data(), n, hi.data(), hv.data(), k, base);
  device(x, hx);
}

void CudaBackend::scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) {
  auto hx = host(x, n);
  auto hi = host(idx, k);
  cpu().scatter_fill(hx.data(), n, hi.data(), k, value);
  device(x, hx);
}

void CudaBackend::block_sum_squares(float* out, const float* x, int64_t n, int64_t block) {
  auto hx = host(x, n);
  std::vector<float> ho(size_t(block >= 1 ? (n + block - 1) / block : 0));
  cpu().block_sum_squares(ho.data(), hx.data(), n, block);
  device(out, ho);
}

void CudaBackend::gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb,
                                int64_t block) {
  auto hx = host(x, n);
  auto hb = host(blocks, kb);
  std::vector<float> ho(size_t(std::max<int64_t>(kb * block, 0)));
  cpu().gather_blocks(ho.data(), hx.data(), n, hb.data(), kb, block);
  device(out, ho);
}

void CudaBackend::scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                                     int64_t block) {
  auto hx = host(x, n);
  auto hb = host(blocks, kb);
  auto hv = host(val, kb * block);
  cpu().scatter_add_blocks(hx.data(), n, hb.data(), hv.data(), kb, block);
  device(x, hx);
}

void CudaBackend::fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) {
  auto hx = host(x, n);
  auto hb = host(blocks, kb);
  cpu().fill_blocks(hx.data(), n, hb.data(), kb, block, value);
  device(x, hx);
}

void CudaBackend::sign_pack(int32_t* bits, const float* x, int64_t n) {
  auto hx = host(x, n);
  std::vector<int32_t> hb(size_t((std::max<int64_t>(n, 0) + 31) / 32));
  cpu().sign_pack(hb.data(), hx.data(), n);
  device(bits, hb);
}

void CudaBackend::sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) {
  auto hx = host(x, n);
  auto hb = host(bits, (n + 31) / 32);
  cpu().sign_unpack_add(hx.data(), hb.data(), n, scale);
  device(x, hx);
}

void CudaBackend::orthonormalize_columns(float* P, int64_t rows, int64_t cols) {
  auto hp = host(P, rows * cols);
  cpu().orthonormalize_columns(hp.data(), rows, cols);
  device(P, hp);
}

int64_t CudaBackend::count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) {
  auto ha = host(a, ka);
  auto hb = host(b, kb);
  return cpu().count_common(ha.data(), ka, hb.data(), kb);
}

void CudaBackend::count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) {
  auto hi = host(idx, k);
  cpu().count_below(below, hi.data(), k, bounds, nb);  // below and bounds: host memory
}

}  // namespace exatrain
