// The CPU backend's optimizer updates besides AdamW and momentum (cpu_backend.cpp): SGD, Lion,
// LAMB and Adafactor, and the symmetric inverse root of the matrix optimizers, each as
// backend/backend.hpp states it. Elementwise loops are OpenMP
// parallel; every reduction (LAMB's norms, Adafactor's means and RMS) is summed in double in a
// fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

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

// LAPACK's dsyevd (divide and conquer, eigenvalues ascending, eigenvectors in the columns of the
// row-major a) in double: float32 eigenvalues of a Gram matrix lose the small ones that the root
// amplifies most. out = Q diag(r) Q^T by a double loop (n is at most max_preconditioner_dim).
bool CpuBackend::sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) {
  std::vector<double> a(static_cast<size_t>(n * n)), w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n * n; i++) a[size_t(i)] = A[i];
  if (LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', lapack_int(n), a.data(), lapack_int(n), w.data()) != 0) return false;
  std::vector<double> r(static_cast<size_t>(n)), res(static_cast<size_t>(n * n), 0.0);
  for (int64_t k = 0; k < n; k++) r[size_t(k)] = std::pow(std::max(w[size_t(k)], 0.0) + eps, -1.0 / double(p));
#pragma omp parallel for schedule(static) if (n * n * n >= min_work_)
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t k = 0; k < n; k++) s += a[size_t(i * n + k)] * r[size_t(k)] * a[size_t(j * n + k)];
      res[size_t(i * n + j)] = s;
    }
  for (double x : res)
    if (!std::isfinite(x) || std::fabs(x) > 3.4e38) return false;
  for (int64_t i = 0; i < n * n; i++) out[i] = float(res[size_t(i)]);
  return true;
}

}  // namespace exatrain
