// Scalar helpers shared by the CPU reference files (not part of the backend interface).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/rng.h"
#include "ops/backend.h"

namespace anatomy::ref {

// Loops with less work than this (elements, or multiply-adds) run on one thread: a parallel
// region costs microseconds, and far more when the cores are oversubscribed.
inline constexpr int64_t kParallelWork = 1 << 15;

// Exact GELU: x * Phi(x), Phi the standard normal CDF.
template <class T>
inline T gelu_value(T x) {
  return static_cast<T>(0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)));
}
// d gelu / dx = Phi(x) + x phi(x).
template <class T>
inline T gelu_derivative(T x) {
  double xd = x;
  double cdf = 0.5 * (1.0 + std::erf(xd * 0.70710678118654752440));
  double pdf = 0.39894228040143267794 * std::exp(-0.5 * xd * xd);
  return static_cast<T>(cdf + xd * pdf);
}

// The factor dropout multiplies element i by: 0 when dropped, 1 / (1 - p) when kept.
// p == 0 is the identity; p >= 1 drops everything. The mask is dropout_keep (Note [dropout
// bits] in core/rng.h) with the per-call key and threshold computed once.
class DropoutMask {
 public:
  explicit DropoutMask(const DropoutSpec& d)
      : m_active(d.p > 0.0f), m_key(dropout_key(d.seed, d.offset)), m_thr(dropout_threshold(d.p)),
        m_scale(d.p < 1.0f ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0) {}
  bool active() const { return m_active; }
  double factor(uint64_t i) const {
    if (!m_active) return 1.0;
    return dropout_keep_key(m_key, i, m_thr) ? m_scale : 0.0;
  }

 private:
  bool m_active;
  uint64_t m_key;
  uint32_t m_thr;
  double m_scale;
};

// out[j] += sum_r x[r * n + j] for x [rows, n], summed in double. Each thread owns a block of
// columns and walks the rows in order, so the result does not depend on the thread count.
template <class T, class F>
void column_sums(T* out, int64_t rows, int64_t n, F value) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (rows * n > kParallelWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double acc[kBlock] = {};
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < n ? j0 + kBlock : n;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += value(r, j);
    for (int64_t j = j0; j < j1; ++j) out[j] = static_cast<T>(out[j] + acc[j - j0]);
  }
}

}  // namespace anatomy::ref
