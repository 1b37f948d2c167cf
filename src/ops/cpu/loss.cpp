// Cross-entropy over logits [B, C] with integer labels [B], via a stable log-softmax.
#include <cmath>

#include "core/error.h"
#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

template <class T>
void cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* labels, int64_t batch,
                   int64_t classes, double grad_scale) {
  for (int64_t b = 0; b < batch; ++b)
    ANATOMY_CHECK(labels[b] >= 0 && labels[b] < classes, "label ", labels[b], " of sample ", b,
                  " is out of range for ", classes, " classes (labels must be in [0, ", classes,
                  "))");
#pragma omp parallel for if (batch * classes > kParallelWork)
  for (int64_t b = 0; b < batch; ++b) {
    const T* x = logits + b * classes;
    double mx = x[0];
    for (int64_t c = 1; c < classes; ++c) mx = x[c] > mx ? static_cast<double>(x[c]) : mx;
    double total = 0;
    for (int64_t c = 0; c < classes; ++c) total += std::exp(x[c] - mx);
    const double lse = mx + std::log(total);
    losses[b] = static_cast<T>(lse - x[labels[b]]);
    if (!dlogits) continue;
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(x[c] - lse) - (c == labels[b] ? 1.0 : 0.0);
      dlogits[b * classes + c] = static_cast<T>(p * grad_scale);
    }
  }
}

template void cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t,
                                   double);
template void cross_entropy<double>(double*, double*, const double*, const int32_t*, int64_t,
                                    int64_t, double);

}  // namespace anatomy::ref
