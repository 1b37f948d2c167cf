// Optimizer updates and the gradient-norm reduction they read (GradTransform in backend.h).
#include <cmath>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

template <class T>
void sum_squares(T* out, const T* x, size_t n) {
  double s = 0;
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for reduction(+ : s) if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) s += static_cast<double>(x[i]) * x[i];
  out[0] = static_cast<T>(out[0] + s);
}

double grad_factor(double norm_sq, double inv_loss_scale, double max_norm) {
  double clip = 1.0;
  if (max_norm > 0) {
    const double norm = std::sqrt(norm_sq) * inv_loss_scale;
    clip = std::fmin(1.0, max_norm / (norm + 1e-6));
  }
  return inv_loss_scale * clip;
}

template <class T>
void adamw_update(T* params, T* m, T* v, const T* grads, size_t n, double factor,
                  const AdamWArgs& a) {
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const double step = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    const double g = grads[i] * factor;
    double p = params[i];
    p -= lr * wd * p;  // decoupled weight decay, on the pre-update parameter
    const double mi = b1 * m[i] + (1.0 - b1) * g;
    const double vi = b2 * v[i] + (1.0 - b2) * g * g;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params[i] = static_cast<T>(p);
  }
}

template <class T>
void sgd_update(T* params, T* buf, const T* grads, size_t n, double factor, const SgdArgs& a) {
  const double lr = a.lr, mom = a.momentum, wd = a.weight_decay;
  const int64_t count = static_cast<int64_t>(n);
#pragma omp parallel for if (count > kParallelWork)
  for (int64_t i = 0; i < count; ++i) {
    double g = grads[i] * factor + wd * params[i];
    if (mom != 0.0) {
      const double b = mom * buf[i] + g;
      buf[i] = static_cast<T>(b);
      g = a.nesterov ? g + mom * b : b;
    }
    params[i] = static_cast<T>(params[i] - lr * g);
  }
}

#define ANATOMY_INSTANTIATE(T)                                                           \
  template void sum_squares<T>(T*, const T*, size_t);                                    \
  template void adamw_update<T>(T*, T*, T*, const T*, size_t, double, const AdamWArgs&); \
  template void sgd_update<T>(T*, T*, const T*, size_t, double, const SgdArgs&);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
