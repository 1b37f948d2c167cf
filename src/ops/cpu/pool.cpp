// Mean pooling over the attention mask (ModernBERT's classifier_pooling "mean").
//
// Note [empty mean pool]: a sequence whose mask keeps no token has nothing to average.
// transformers divides the zero sum by the zero count there and pools NaN, which then poisons the
// whole batch's loss and every gradient. Here the count is clamped to 1: such a sequence pools to
// exactly 0 (the head then sees its biases alone) and sends no gradient to the encoder, the same
// as the earlier pooling matrix whose row for it was all zeros. The CUDA kernels (ops/cuda/pool.cu)
// make the same choice.
#include <algorithm>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

namespace {

// The tokens of sequence b that the mask keeps (mask nullptr: all of them).
int64_t kept_tokens(const int32_t* mask, int64_t b, int64_t seq) {
  if (!mask) return seq;
  int64_t n = 0;
  for (int64_t t = 0; t < seq; ++t) n += mask[b * seq + t] != 0;
  return n;
}

}  // namespace

// Each sequence's sum in double, in token order; sequences in parallel (each owns its row of out).
template <class T>
void masked_mean_forward(T* out, const T* x, const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden) {
#pragma omp parallel for if (batch * seq * hidden > kParallelWork)
  for (int64_t b = 0; b < batch; ++b) {
    const double n = static_cast<double>(std::max<int64_t>(1, kept_tokens(mask, b, seq)));
    std::vector<double> acc(static_cast<size_t>(hidden), 0.0);
    for (int64_t t = 0; t < seq; ++t) {
      if (mask && mask[b * seq + t] == 0) continue;
      const T* row = x + (b * seq + t) * hidden;
      for (int64_t j = 0; j < hidden; ++j) acc[j] += row[j];
    }
    for (int64_t j = 0; j < hidden; ++j) out[b * hidden + j] = static_cast<T>(acc[j] / n);
  }
}

template <class T>
void masked_mean_backward(T* dx, const T* dout, const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden) {
#pragma omp parallel for if (batch * seq * hidden > kParallelWork)
  for (int64_t b = 0; b < batch; ++b) {
    const T n = static_cast<T>(std::max<int64_t>(1, kept_tokens(mask, b, seq)));
    for (int64_t t = 0; t < seq; ++t) {
      const bool kept = !mask || mask[b * seq + t] != 0;
      T* row = dx + (b * seq + t) * hidden;
      for (int64_t j = 0; j < hidden; ++j) row[j] = kept ? dout[b * hidden + j] / n : T(0);
    }
  }
}

#define ANATOMY_INSTANTIATE(T)                                                                    \
  template void masked_mean_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t); \
  template void masked_mean_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
