// The CPU backend's optimizer updates besides AdamW and momentum (cpu_backend.cpp): SGD, Lion,
// LAMB and Adafactor, and the symmetric eigen-solvers of the matrix optimizers (inverse roots,
// SOAP's eigenbases), each as
// backend/backend.hpp states it. Elementwise loops are OpenMP
// parallel; every reduction (LAMB's norms, Adafactor's means and RMS) is summed in double in a
// fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include <cblas.h>
#include <lapacke.h>

#include "backend/cpu/cpu_backend.hpp"

namespace exatrain {

namespace {

// Sum of squares of x[n] in double, serially in index order (a fixed order; entries a whole-entry
// update sees are at most a few million elements).
double sum_sq(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace

void CpuBackend::sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                            bool nesterov, float weight_decay, float grad_scale) {
  // torch.optim.SGD's order: d_p = grad + wd p; buf = momentum buf + d_p; nesterov d_p + momentum buf.
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i] * grad_scale + weight_decay * param[i];
    const float b = momentum * buf[i] + g;
    buf[i] = b;
    param[i] -= lr * (nesterov ? g + momentum * b : b);
  }
}

void CpuBackend::lion_update(float* param, const float* grad, float* m, int64_t n, float lr, float beta1,
                             float beta2, float weight_decay, float grad_scale) {
  const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i] * grad_scale;
    const float c = beta1 * m[i] + (1.0f - beta1) * g;
    const float sign = c > 0 ? 1.0f : (c < 0 ? -1.0f : 0.0f);  // torch.sign: 0 at 0
    param[i] = param[i] * decay - lr * sign;
    m[i] = beta2 * m[i] + (1.0f - beta2) * g;
  }
}

void CpuBackend::lamb_update(float* param, const float* grad, float* m, float* v, float* r, int64_t n,
                             const LambStep& s) {
  const float bc2_sqrt = std::sqrt(s.bc2);
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    r[i] = (m[i] / s.bc1) / (std::sqrt(v[i]) / bc2_sqrt + s.eps) + s.weight_decay * param[i];
  }
  const double p_norm = std::sqrt(sum_sq(param, n)), r_norm = std::sqrt(sum_sq(r, n));
  const float trust = p_norm > 0 && r_norm > 0 ? float(p_norm / r_norm) : 1.0f;
  const float step = s.lr * trust;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) param[i] -= step * r[i];
}

void CpuBackend::adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m,
                                  float* u, int64_t rows, int64_t cols, const AdafactorStep& s) {
  const int64_t n = rows * cols;
  const float b2 = s.beta2t, gs = s.grad_scale;
  if (v) {
    // Unfactored: U = g / sqrt(v).
#pragma omp parallel for schedule(static) if (n >= min_work_)
    for (int64_t i = 0; i < n; i++) {
      const float g = grad[i] * gs;
      v[i] = b2 * v[i] + (1.0f - b2) * (g * g + s.eps1);
      u[i] = g / std::sqrt(v[i]);
    }
  } else {
    // Factored: row means (each row in order), column means (rows in order, per column).
    std::vector<double> col_sum(size_t(cols), 0.0);
    for (int64_t i = 0; i < rows; i++) {
      double rs = 0;
      for (int64_t j = 0; j < cols; j++) {
        const float g = grad[i * cols + j] * gs;
        const float sq = g * g + s.eps1;
        rs += sq;
        col_sum[size_t(j)] += sq;
      }
      row[i] = b2 * row[i] + (1.0f - b2) * float(rs / double(cols));
    }
    double row_mean = 0;
    for (int64_t i = 0; i < rows; i++) {
      row_mean += row[i];
    }
    row_mean /= double(rows);
    for (int64_t j = 0; j < cols; j++) col[j] = b2 * col[j] + (1.0f - b2) * float(col_sum[size_t(j)] / double(rows));
#pragma omp parallel for schedule(static) if (n >= min_work_)
    for (int64_t i = 0; i < rows; i++) {
      const float r_factor = 1.0f / std::sqrt(float(row[i] / row_mean));
      for (int64_t j = 0; j < cols; j++) u[i * cols + j] = grad[i * cols + j] * gs * r_factor / std::sqrt(col[j]);
    }
  }
  // Update clipping by the RMS of U, then the learning rate, the first moment, the decay.
  const double rms = std::sqrt(sum_sq(u, n) / double(n));
  const float scale = s.lr / float(std::max(1.0, rms / double(s.clip)));
  const float decay = 1.0f - s.lr * s.weight_decay;
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    float step = u[i] * scale;
    if (m) step = m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * step;
    param[i] = param[i] * decay - step;
  }
}

void CpuBackend::adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1,
                                float beta2, float eps, float bc1, float bc2, float grad_scale) {
  const float bc2_sqrt = std::sqrt(bc2);
#pragma omp parallel for schedule(static) if (n >= min_work_)
  for (int64_t i = 0; i < n; i++) {
    const float g = grad[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    out[i] = (m[i] / bc1) / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

namespace {

// A symmetric A [n, n] (float, row-major) in double: its eigenvalues w ascending and, in place of
// a, its eigenvectors in the columns (LAPACK's dsyevd, divide and conquer). Double because float32
// eigenvalues of a Gram matrix lose the small ones that an inverse root amplifies most.
bool eigh(std::vector<double>& a, std::vector<double>& w, const float* A, int64_t n) {
  a.resize(static_cast<size_t>(n * n)), w.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n * n; i++) a[size_t(i)] = A[i];
  return LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', lapack_int(n), a.data(), lapack_int(n), w.data()) == 0;
}

// Stores x into out as floats when every value is finite and within float's range.
bool store_finite(float* out, const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v) || std::fabs(v) > 3.4e38) return false;
  for (size_t i = 0; i < x.size(); i++) out[i] = float(x[i]);
  return true;
}

}  // namespace

// out = (Q diag(r)) Q^T by dgemm, r_k = (max(w_k, 0) + eps)^(-1/p).
bool CpuBackend::sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) {
  std::vector<double> q, w;
  if (!eigh(q, w, A, n)) return false;
  std::vector<double> qr(q), res(static_cast<size_t>(n * n));
  for (int64_t k = 0; k < n; k++) w[size_t(k)] = std::pow(std::max(w[size_t(k)], 0.0) + eps, -1.0 / double(p));
  for (int64_t i = 0; i < n; i++)
    for (int64_t k = 0; k < n; k++) qr[size_t(i * n + k)] *= w[size_t(k)];
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(n), 1.0, qr.data(), int(n), q.data(), int(n),
              0.0, res.data(), int(n));
  return store_finite(out, res);
}

// dsyevd's columns in reverse: eigenvalues descending, as SOAP's torch.flip of eigh's.
bool CpuBackend::sym_eigenbasis(float* Q, const float* A, int64_t n) {
  std::vector<double> q, w;
  if (!eigh(q, w, A, n)) return false;
  std::vector<double> flipped(q.size());
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) flipped[size_t(i * n + j)] = q[size_t(i * n + (n - 1 - j))];
  return store_finite(Q, flipped);
}

bool CpuBackend::power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) {
  const size_t nn = static_cast<size_t>(n * n);
  std::vector<double> a(A, A + nn), q(Q, Q + nn), aq(nn), est(static_cast<size_t>(n), 0.0);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0, a.data(), int(n), q.data(),
              int(n), 0.0, aq.data(), int(n));
  for (int64_t i = 0; i < n; i++)  // est_j = q_j^T (A q)_j
    for (int64_t j = 0; j < n; j++) est[size_t(j)] += q[size_t(i * n + j)] * aq[size_t(i * n + j)];
  for (double e : est)  // a NaN would break the sort's strict weak ordering
    if (!std::isfinite(e)) return false;
  std::vector<int64_t> ord(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; j++) ord[size_t(j)] = j;
  std::stable_sort(ord.begin(), ord.end(), [&](int64_t x, int64_t y) { return est[size_t(x)] > est[size_t(y)]; });
  std::vector<double> p(nn), tau(static_cast<size_t>(n));  // p = A Q_sorted: the sorted columns of A Q
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) p[size_t(i * n + j)] = aq[size_t(i * n + ord[size_t(j)])];
  if (LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, lapack_int(n), lapack_int(n), p.data(), lapack_int(n), tau.data()) != 0 ||
      LAPACKE_dorgqr(LAPACK_ROW_MAJOR, lapack_int(n), lapack_int(n), lapack_int(n), p.data(), lapack_int(n),
                     tau.data()) != 0)
    return false;
  if (!store_finite(Q, p)) return false;
  std::copy(ord.begin(), ord.end(), order);
  return true;
}

void CpuBackend::permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order,
                                const int64_t* col_order) {
  const std::vector<float> old(a, a + rows * cols);
  for (int64_t i = 0; i < rows; i++) {
    const int64_t si = row_order ? row_order[i] : i;
    for (int64_t j = 0; j < cols; j++) a[i * cols + j] = old[size_t(si * cols + (col_order ? col_order[j] : j))];
  }
}

// dsyevd's eigenvalues (ascending) clamped at 0, and its eigenvectors, as kfac-pytorch's
// torch.linalg.eigh + clamp.
bool CpuBackend::sym_eigh(float* Q, float* d, const float* A, int64_t n) {
  std::vector<double> q, w;
  if (!eigh(q, w, A, n)) return false;
  for (double& x : w) x = std::max(x, 0.0);
  std::vector<float> qf(q.size());
  if (!store_finite(qf.data(), q) || !store_finite(d, w)) return false;
  std::copy(qf.begin(), qf.end(), Q);
  return true;
}

void CpuBackend::eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                                     float damping) {
#pragma omp parallel for schedule(static) if (rows * cols >= min_work_)
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) V[i * cols + j] /= dg[i] * da[j] + damping;
}

}  // namespace exatrain
