// ModernBERT's element-wise pieces: rotary position embeddings on q and k, and the gated GELU.
#include <cmath>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

template <class T>
void rotary(T* y, const T* x, int64_t batch, int64_t seq, int64_t hidden, int heads, double theta, bool inverse,
            const int32_t* packed, int64_t n) {
  const int64_t d = hidden / heads, half = d / 2, rows = packed ? n : batch * seq;
  std::vector<double> freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j)
    freq[j] = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
  // The inverse rotation is the rotation by -a.
  const double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for if (rows * hidden > kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const double t = static_cast<double>((packed ? packed[r] : r) % seq);
    const T* xr = x + r * 3 * hidden;
    T* yr = y + r * 3 * hidden;
    for (int64_t part = 0; part < 2; ++part)  // q, then k
      for (int64_t h = 0; h < heads; ++h) {
        const T* xh = xr + part * hidden + h * d;
        T* yh = yr + part * hidden + h * d;
        for (int64_t j = 0; j < half; ++j) {
          const double a = t * freq[j], c = std::cos(a), s = sign * std::sin(a);
          const double x1 = xh[j], x2 = xh[j + half];
          yh[j] = static_cast<T>(x1 * c - x2 * s);
          yh[j + half] = static_cast<T>(x2 * c + x1 * s);
        }
      }
    if (y != x)
      for (int64_t c = 0; c < hidden; ++c) yr[2 * hidden + c] = xr[2 * hidden + c];
  }
}

template <class T>
void geglu_forward(T* y, const T* x, int64_t rows, int64_t i) {
#pragma omp parallel for if (rows * i > kParallelWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < i; ++c) {
      const double in = x[r * 2 * i + c], gate = x[r * 2 * i + i + c];
      y[r * i + c] = static_cast<T>(gelu_value(in) * gate);
    }
}

template <class T>
void geglu_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t i) {
#pragma omp parallel for if (rows * i > kParallelWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < i; ++c) {
      const double in = x[r * 2 * i + c], gate = x[r * 2 * i + i + c], g = dy[r * i + c];
      dx[r * 2 * i + c] = static_cast<T>(g * gate * gelu_derivative(in));
      dx[r * 2 * i + i + c] = static_cast<T>(g * gelu_value(in));
    }
}

#define ANATOMY_INSTANTIATE(T)                                                                  \
  template void rotary<T>(T*, const T*, int64_t, int64_t, int64_t, int, double, bool, const int32_t*, int64_t); \
  template void geglu_forward<T>(T*, const T*, int64_t, int64_t);                            \
  template void geglu_backward<T>(T*, const T*, const T*, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
