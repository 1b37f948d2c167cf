// Softmax cross-entropy, forward and backward in one pass: logits [B, C], labels I32 [B];
// losses F32 [B] = logsumexp(logits[b]) - logits[b, label]; dlogits = (softmax - onehot) * scale.
// And the regression and multi-label losses on float targets F32 [B, C].
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 128;  // 4 rows (warps) per block

// ---- kernels ------------------------------------------------------------------------------------
// A warp per row; lanes stride over the classes (C is 2 for the BERT classifier, so the work
// is launch-bound either way).
template <class T>
__global__ void cross_entropy_kernel(float* __restrict__ losses, T* __restrict__ dlogits, const T* __restrict__ logits,
                                     const int32_t* __restrict__ labels, int64_t batch, int64_t classes,
                                     float grad_scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= batch) return;
  const T* x = logits + row * classes;
  const int32_t label = labels[row];
  const bool valid = label >= 0 && label < classes;
  float mx = -INFINITY;
  for (int64_t c = lane; c < classes; c += 32) mx = fmaxf(mx, to_f32(x[c]));
  mx = warp_max(mx);
  float se = 0.0f;
  for (int64_t c = lane; c < classes; c += 32) se += expf(to_f32(x[c]) - mx);
  se = warp_sum(se);
  const float lse = mx + logf(se);
  if (lane == 0) losses[row] = valid ? lse - to_f32(x[label]) : NAN;
  if (dlogits) {
    const float inv = 1.0f / se;
    for (int64_t c = lane; c < classes; c += 32) {
      const float p = expf(to_f32(x[c]) - mx) * inv;
      dlogits[row * classes + c] = from_f32<T>(valid ? (p - (c == label ? 1.0f : 0.0f)) * grad_scale : NAN);
    }
  }
}

// A block per sequence, a warp per row (rows w, w + 4, ... of the sequence); each warp keeps its
// rows' losses in order and the block adds the four warps' sums in a fixed order, so the result
// does not depend on scheduling. Rows labelled -100 are not scored: zero gradient.
template <class T>
__global__ void token_cross_entropy_kernel(float* __restrict__ losses, T* __restrict__ dlogits,
                                           const T* __restrict__ logits, const int32_t* __restrict__ labels,
                                           int64_t per, int64_t classes, float loss_weight, float grad_scale) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float partial[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * per;
  float mine = 0.0f;
  bool bad = false;
  for (int64_t r = first + warp; r < first + per; r += kWarps) {
    const T* x = logits + r * classes;
    const int32_t label = labels[r];
    if (label == -100) {
      if (dlogits)
        for (int64_t c = lane; c < classes; c += 32) dlogits[r * classes + c] = from_f32<T>(0.0f);
      continue;
    }
    const bool valid = label >= 0 && label < classes;
    bad = bad || !valid;
    float mx = -INFINITY;
    for (int64_t c = lane; c < classes; c += 32) mx = fmaxf(mx, to_f32(x[c]));
    mx = warp_max(mx);
    float se = 0.0f;
    for (int64_t c = lane; c < classes; c += 32) se += expf(to_f32(x[c]) - mx);
    se = warp_sum(se);
    const float lse = mx + logf(se);
    if (valid) mine += lse - to_f32(x[label]);
    if (dlogits) {
      const float inv = 1.0f / se;
      for (int64_t c = lane; c < classes; c += 32) {
        const float p = expf(to_f32(x[c]) - mx) * inv;
        dlogits[r * classes + c] = from_f32<T>(valid ? (p - (c == label ? 1.0f : 0.0f)) * grad_scale : NAN);
      }
    }
  }
  if (lane == 0) partial[warp] = bad ? NAN : mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += partial[w];
    losses[blockIdx.x] = s * loss_weight;
  }
}

// A warp per row, as above; the row's loss is the mean over its classes (Note [float target
// losses] in ops/cpu/loss.cpp).
template <class T, bool kBinary>
__global__ void float_target_loss_kernel(float* __restrict__ losses, T* __restrict__ dlogits,
                                         const T* __restrict__ logits, const float* __restrict__ targets,
                                         int64_t batch, int64_t classes, float grad_scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= batch) return;
  const float inv_c = 1.0f / static_cast<float>(classes);
  float sum = 0.0f;
  for (int64_t c = lane; c < classes; c += 32) {
    const int64_t i = row * classes + c;
    const float x = to_f32(logits[i]), t = targets[i];
    float d;
    if (kBinary) {
      sum += fmaxf(x, 0.0f) - x * t + log1pf(expf(-fabsf(x)));
      d = 1.0f / (1.0f + expf(-x)) - t;
    } else {
      sum += (x - t) * (x - t);
      d = 2.0f * (x - t);
    }
    if (dlogits) dlogits[i] = from_f32<T>(d * inv_c * grad_scale);
  }
  sum = warp_sum(sum);
  if (lane == 0) losses[row] = sum * inv_c;
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                   float grad_scale, cudaStream_t s) {
  const int64_t classes = logits.dim(-1);
  const int64_t batch = classes ? static_cast<int64_t>(logits.numel()) / classes : 0;
  if (batch == 0) return;
  const unsigned grid = static_cast<unsigned>((batch + kThreads / 32 - 1) / (kThreads / 32));
  dispatch_float(logits.dtype, "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_kernel<T><<<grid, kThreads, 0, s>>>(losses.ptr<float>(), dlogits.defined() ? dlogits.ptr<T>() : nullptr,
                                                      logits.ptr<const T>(), labels.ptr<const int32_t>(), batch,
                                                      classes, grad_scale);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void token_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                         float loss_weight, float grad_scale, cudaStream_t s) {
  const int64_t classes = logits.dim(-1);
  const int64_t rows = classes ? static_cast<int64_t>(logits.numel()) / classes : 0;
  const int64_t batch = static_cast<int64_t>(losses.numel());
  if (batch == 0) return;
  dispatch_float(logits.dtype, "token_cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    token_cross_entropy_kernel<T><<<static_cast<unsigned>(batch), kThreads, 0, s>>>(
        losses.ptr<float>(), dlogits.defined() ? dlogits.ptr<T>() : nullptr, logits.ptr<const T>(),
        labels.ptr<const int32_t>(), rows / batch, classes, loss_weight, grad_scale);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void float_target_loss(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                       float grad_scale, bool binary, cudaStream_t s) {
  const int64_t classes = logits.dim(-1);
  const int64_t batch = classes ? static_cast<int64_t>(logits.numel()) / classes : 0;
  if (batch == 0) return;
  const unsigned grid = static_cast<unsigned>((batch + kThreads / 32 - 1) / (kThreads / 32));
  dispatch_float(logits.dtype, binary ? "bce_with_logits" : "mse_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* d = dlogits.defined() ? dlogits.ptr<T>() : nullptr;
    if (binary)
      float_target_loss_kernel<T, true><<<grid, kThreads, 0, s>>>(losses.ptr<float>(), d, logits.ptr<const T>(),
                                                                  targets.ptr<const float>(), batch, classes,
                                                                  grad_scale);
    else
      float_target_loss_kernel<T, false><<<grid, kThreads, 0, s>>>(losses.ptr<float>(), d, logits.ptr<const T>(),
                                                                   targets.ptr<const float>(), batch, classes,
                                                                   grad_scale);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
