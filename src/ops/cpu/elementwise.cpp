// Element-wise ops: activations, dropout, add, and the [CLS] token select.
#include <cmath>
#include <cstring>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

namespace {
// f(i) for every i in [0, n), in parallel (a signed index for OpenMP).
template <class F>
void for_each_index(size_t n, F f) {
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) f(i);
}
}  // namespace

template <class T>
void gelu_forward(T* y, const T* x, size_t n) {
  for_each_index(n, [=](int64_t i) { y[i] = gelu_value(x[i]); });
}

template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, size_t n) {
  for_each_index(n, [=](int64_t i) { dx[i] = static_cast<T>(dy[i] * gelu_derivative(x[i])); });
}

template <class T>
void tanh_forward(T* y, const T* x, size_t n) {
  for_each_index(n, [=](int64_t i) { y[i] = std::tanh(x[i]); });
}

template <class T>
void tanh_backward(T* dx, const T* dy, const T* y, size_t n) {
  for_each_index(n, [=](int64_t i) { dx[i] = dy[i] * (T(1) - y[i] * y[i]); });
}

template <class T>
void relu_forward(T* y, const T* x, size_t n) {
  for_each_index(n, [=](int64_t i) { y[i] = x[i] > T(0) ? x[i] : T(0); });
}

template <class T>
void relu_backward(T* dx, const T* dy, const T* y, size_t n) {
  for_each_index(n, [=](int64_t i) { dx[i] = y[i] > T(0) ? dy[i] : T(0); });
}

template <class T>
void dropout_forward(T* y, const T* x, size_t n, const DropoutSpec& d) {
  const DropoutMask drop(d);
  for_each_index(
      n, [=](int64_t i) { y[i] = static_cast<T>(x[i] * drop.factor(static_cast<uint64_t>(i))); });
}

template <class T>
void dropout_backward(T* dx, const T* dy, size_t n, const DropoutSpec& d) {
  dropout_forward(dx, dy, n, d);  // the same mask and scale: dx = dy * factor
}

template <class T>
void add(T* y, const T* a, const T* b, size_t n) {
  for_each_index(n, [=](int64_t i) { y[i] = a[i] + b[i]; });
}

template <class T>
void select_token(T* out, const T* x, int64_t batch, int64_t seq, int64_t hidden, int64_t t) {
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(out + b * hidden, x + (b * seq + t) * hidden, sizeof(T) * hidden);
}

template <class T>
void select_token_backward(T* dx, const T* dout, int64_t batch, int64_t seq, int64_t hidden,
                           int64_t t) {
  std::memset(dx, 0, sizeof(T) * batch * seq * hidden);
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(dx + (b * seq + t) * hidden, dout + b * hidden, sizeof(T) * hidden);
}

#define ANATOMY_INSTANTIATE(T)                                                     \
  template void gelu_forward<T>(T*, const T*, size_t);                             \
  template void gelu_backward<T>(T*, const T*, const T*, size_t);                  \
  template void tanh_forward<T>(T*, const T*, size_t);                             \
  template void tanh_backward<T>(T*, const T*, const T*, size_t);                  \
  template void relu_forward<T>(T*, const T*, size_t);                             \
  template void relu_backward<T>(T*, const T*, const T*, size_t);                  \
  template void dropout_forward<T>(T*, const T*, size_t, const DropoutSpec&);      \
  template void dropout_backward<T>(T*, const T*, size_t, const DropoutSpec&);     \
  template void add<T>(T*, const T*, const T*, size_t);                            \
  template void select_token<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void select_token_backward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
