// LayerNorm over the last dim with the branch dropout and residual add fused in front.
// Shapes: branch, residual, sum, y, dy [rows, h]; mean, rstd [rows]; gamma, beta [h].
#include <cmath>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

template <class T>
void layernorm_forward(T* y, T* sum, T* mean, T* rstd, const T* branch, const T* residual,
                       const T* gamma, const T* beta, int64_t rows, int64_t h, double eps,
                       const DropoutSpec& branch_dropout) {
  const DropoutMask drop(branch_dropout);
#pragma omp parallel for if (rows * h > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * h;
    T* s = sum + base;
    double mu = 0;
    for (int64_t j = 0; j < h; ++j) {
      double x = branch[base + j] * drop.factor(static_cast<uint64_t>(base + j));
      if (residual) x += residual[base + j];
      s[j] = static_cast<T>(x);
      mu += s[j];  // stats from the stored sum, which backward reads
    }
    mu /= static_cast<double>(h);
    double var = 0;
    for (int64_t j = 0; j < h; ++j) var += (s[j] - mu) * (s[j] - mu);
    var /= static_cast<double>(h);
    const double rs = 1.0 / std::sqrt(var + eps);
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
    for (int64_t j = 0; j < h; ++j)
      y[base + j] = static_cast<T>((s[j] - mu) * rs * gamma[j] + static_cast<double>(beta[j]));
  }
}

template <class T>
void layernorm_backward(T* dsum, T* dbranch, T* dgamma, T* dbeta, const T* dy, const T* sum,
                        const T* mean, const T* rstd, const T* gamma, int64_t rows, int64_t h,
                        const DropoutSpec& branch_dropout) {
  const DropoutMask drop(branch_dropout);
#pragma omp parallel for if (rows * h > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * h;
    const double mu = mean[r], rs = rstd[r];
    double mg = 0, mgx = 0;  // mean(g), mean(g * xhat) with g = dy * gamma
    for (int64_t j = 0; j < h; ++j) {
      const double g = static_cast<double>(dy[base + j]) * gamma[j];
      mg += g;
      mgx += g * (sum[base + j] - mu) * rs;
    }
    mg /= static_cast<double>(h);
    mgx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      const double g = static_cast<double>(dy[base + j]) * gamma[j];
      const double xhat = (sum[base + j] - mu) * rs;
      const double d = rs * (g - mg - xhat * mgx);
      dsum[base + j] = static_cast<T>(d);
      if (dbranch)
        dbranch[base + j] = static_cast<T>(d * drop.factor(static_cast<uint64_t>(base + j)));
    }
  }
  if (dgamma)
    column_sums(dgamma, rows, h, [=](int64_t r, int64_t j) {
      return static_cast<double>(dy[r * h + j]) * (sum[r * h + j] - static_cast<double>(mean[r])) *
             static_cast<double>(rstd[r]);
    });
  if (dbeta)
    column_sums(dbeta, rows, h,
                [=](int64_t r, int64_t j) { return static_cast<double>(dy[r * h + j]); });
}

#define ANATOMY_INSTANTIATE(T)                                                                \
  template void layernorm_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*,  \
                                     int64_t, int64_t, double, const DropoutSpec&);           \
  template void layernorm_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                      const T*, int64_t, int64_t, const DropoutSpec&);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
