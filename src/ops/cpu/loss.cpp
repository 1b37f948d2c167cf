// Cross-entropy over logits [B, C] with integer labels [B], via a stable log-softmax; the losses
// on float targets of the regression and multi-label heads.
#include <algorithm>
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

template <class T>
void token_cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* labels, int64_t batch, int64_t rows,
                         int64_t classes, double loss_weight, double grad_scale) {
  for (int64_t r = 0; r < rows; ++r)
    ANATOMY_CHECK(labels[r] == kIgnoreIndex || (labels[r] >= 0 && labels[r] < classes), "label ", labels[r], " of row ",
                  r, " is out of range for ", classes, " classes (labels must be in [0, ", classes, ") or -100)");
  const int64_t per = rows / batch;
  for (int64_t b = 0; b < batch; ++b) {
    double sum = 0;
    for (int64_t r = b * per; r < (b + 1) * per; ++r) {
      const T* x = logits + r * classes;
      T* d = dlogits ? dlogits + r * classes : nullptr;
      if (labels[r] == kIgnoreIndex) {
        if (d) std::fill(d, d + classes, T(0));
        continue;
      }
      double mx = x[0];
      for (int64_t c = 1; c < classes; ++c) mx = std::max(mx, static_cast<double>(x[c]));
      double total = 0;
      for (int64_t c = 0; c < classes; ++c) total += std::exp(x[c] - mx);
      const double lse = mx + std::log(total);
      sum += lse - x[labels[r]];
      if (d)
        for (int64_t c = 0; c < classes; ++c)
          d[c] = static_cast<T>((std::exp(x[c] - lse) - (c == labels[r] ? 1.0 : 0.0)) * grad_scale);
    }
    losses[b] = static_cast<T>(sum * loss_weight);
  }
}

template void token_cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                                         double, double);
template void token_cross_entropy<double>(double*, double*, const double*, const int32_t*, int64_t, int64_t, int64_t,
                                          double, double);

// Note [float target losses]
// transformers' sequence-classification heads on float labels: problem_type "regression" takes
// MSELoss over the B x C logits (num_labels 1: over B), "multi_label_classification"
// BCEWithLogitsLoss over B x C; both means over every element. anatomy keeps a loss per sample
// (the trainer averages samples), so a sample's loss is the mean over its C columns and the
// gradient of element (b, c) carries 1/C: the batch mean is then transformers' loss exactly.
// The binary cross-entropy in its stable form, for t in [0, 1]:
//   -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))) = max(x, 0) - x t + log(1 + exp(-|x|)),
// with derivative sigmoid(x) - t.
template <class T>
void float_target_loss(T* losses, T* dlogits, const T* logits, const T* targets, int64_t batch, int64_t classes,
                       double grad_scale, bool binary) {
  const double inv_c = 1.0 / static_cast<double>(classes);
  for (int64_t b = 0; b < batch; ++b) {
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) {
      const int64_t i = b * classes + c;
      const double x = logits[i], t = targets[i];
      double d;
      if (binary) {
        sum += std::max(x, 0.0) - x * t + std::log1p(std::exp(-std::abs(x)));
        d = 1.0 / (1.0 + std::exp(-x)) - t;
      } else {
        sum += (x - t) * (x - t);
        d = 2.0 * (x - t);
      }
      if (dlogits) dlogits[i] = static_cast<T>(d * inv_c * grad_scale);
    }
    losses[b] = static_cast<T>(sum * inv_c);
  }
}

template void float_target_loss<float>(float*, float*, const float*, const float*, int64_t, int64_t, double, bool);
template void float_target_loss<double>(double*, double*, const double*, const double*, int64_t, int64_t, double,
                                        bool);

}  // namespace anatomy::ref
