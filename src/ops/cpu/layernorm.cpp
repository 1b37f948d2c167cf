// LayerNorm over the last dim with the branch dropout and residual add fused in front.
// Shapes: branch, residual, sum, y, dy [rows, h]; mean, rstd [rows]; gamma, beta [h].
//
// Note [layernorm backward from its output]
// Backward needs xhat = (sum - mean) * rstd for every element. Instead of saving the input sum
// (one [rows, h] tensor per LayerNorm: two per encoder layer, 2 * B*T*H elements), it is read
// back from the output the model saves anyway (the next op's input): y = xhat * gamma + beta,
// so xhat = (y - beta) / gamma. Only rstd (a float per row) is kept besides. The error this
// adds is the storage rounding of y divided by |gamma|: LayerNorm weights stay near 1 in BERT
// (initialized to 1; the trainer notes any loaded weight below 1e-3 in magnitude). A column whose
// gamma is zero (or, on the GPU, below FLT_MIN) has y = beta whatever xhat was: xhat is unknown
// there and counted as 0, which zeroes that column's dgamma and leaves out its share
// xhat_j * mean(g * xhat) of every other element's dsum -- the gradient is then not exact.
// Forward may then skip storing sum: its statistics are taken from the rounded values in
// registers, the same numbers it would have stored.
#include <cmath>
#include <vector>

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
    std::vector<T> row(sum ? 0 : static_cast<size_t>(h));
    T* s = sum ? sum + base : row.data();
    double mu = 0;
    for (int64_t j = 0; j < h; ++j) {
      double x = branch[base + j] * drop.factor(static_cast<uint64_t>(base + j));
      if (residual) x += residual[base + j];
      s[j] = static_cast<T>(x);
      mu += s[j];  // stats from the sum rounded to T, as stored
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

// xhat of element (r, j) from the output.
template <class T>
static double xhat_from_output(const T* y, const T* gamma, const T* beta, int64_t i, int64_t j) {
  const double g = gamma[j];
  return g == 0.0 ? 0.0 : (static_cast<double>(y[i]) - static_cast<double>(beta[j])) / g;
}

template <class T>
void layernorm_backward(T* dsum, T* dbranch, T* dgamma, T* dbeta, const T* dy, const T* y,
                        const T* rstd, const T* gamma, const T* beta, int64_t rows, int64_t h,
                        const DropoutSpec& branch_dropout) {
  const DropoutMask drop(branch_dropout);
#pragma omp parallel for if (rows * h > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * h;
    const double rs = rstd[r];
    double mg = 0, mgx = 0;  // mean(g), mean(g * xhat) with g = dy * gamma
    for (int64_t j = 0; j < h; ++j) {
      const double g = static_cast<double>(dy[base + j]) * gamma[j];
      mg += g;
      mgx += g * xhat_from_output(y, gamma, beta, base + j, j);
    }
    mg /= static_cast<double>(h);
    mgx /= static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      const double g = static_cast<double>(dy[base + j]) * gamma[j];
      const double d = rs * (g - mg - xhat_from_output(y, gamma, beta, base + j, j) * mgx);
      dsum[base + j] = static_cast<T>(d);
      if (dbranch)
        dbranch[base + j] = static_cast<T>(d * drop.factor(static_cast<uint64_t>(base + j)));
    }
  }
  if (dgamma)
    column_sums(dgamma, rows, h, [=](int64_t r, int64_t j) {
      return static_cast<double>(dy[r * h + j]) * xhat_from_output(y, gamma, beta, r * h + j, j);
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
