// ModernBERT's element-wise ops on the GPU: rotary position embeddings on q and k, and the gated
// GELU. The math is that of the CPU reference (ops/cpu/rotary.cpp), in fp32.
#include "ops/cuda/common.cuh"
#include "ops/cuda/gelu.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per (row, q|k, head, pair d < D/2); v columns are copied by the (row, c) threads
// of a second grid-stride range. In place is safe: each pair is read and written by one thread.
template <class T>
__global__ void rotary_kernel(T* y, const T* x, const int32_t* packed, int64_t rows, int64_t seq, int64_t hidden,
                              int d, float log_theta, float sign, bool copy_v) {
  const int half = d / 2;
  const int64_t pairs = rows * hidden;  // rows * 2 parts * hidden/2 pairs
  const int64_t copies = copy_v ? rows * hidden : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs + copies; i += stride) {
    if (i >= pairs) {
      const int64_t k = i - pairs, r = k / hidden, c = k % hidden;
      y[r * 3 * hidden + 2 * hidden + c] = x[r * 3 * hidden + 2 * hidden + c];
      continue;
    }
    const int64_t r = i / hidden, rest = i % hidden;  // rest: part * hidden/2 + head * half + j
    const int64_t part = rest / (hidden / 2), in_part = rest % (hidden / 2);
    const int64_t h = in_part / half, j = in_part % half;
    const float freq = expf(-2.0f * static_cast<float>(j) / static_cast<float>(d) * log_theta);
    float sn, cs;
    sincosf(static_cast<float>((packed ? packed[r] : r) % seq) * freq, &sn, &cs);
    sn *= sign;
    const int64_t base = r * 3 * hidden + part * hidden + h * d;
    const float x1 = to_f32(x[base + j]), x2 = to_f32(x[base + j + half]);
    y[base + j] = from_f32<T>(x1 * cs - x2 * sn);
    y[base + j + half] = from_f32<T>(x2 * cs + x1 * sn);
  }
}

template <class T>
__global__ void geglu_forward_kernel(T* y, const T* x, int64_t rows, int64_t inter) {
  const int64_t n = rows * inter, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t r = k / inter, c = k % inter;
    y[k] = from_f32<T>(gelu_value<T>(to_f32(x[r * 2 * inter + c])) * to_f32(x[r * 2 * inter + inter + c]));
  }
}

template <class T>
__global__ void geglu_backward_kernel(T* dx, const T* dy, const T* x, int64_t rows, int64_t inter) {
  const int64_t n = rows * inter, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const int64_t r = k / inter, c = k % inter;
    const float in = to_f32(x[r * 2 * inter + c]), gate = to_f32(x[r * 2 * inter + inter + c]), g = to_f32(dy[k]);
    const GeluParts gp = gelu_parts<T>(in);
    dx[r * 2 * inter + c] = from_f32<T>(g * gate * (gp.cdf + in * gp.pdf));
    dx[r * 2 * inter + inter + c] = from_f32<T>(g * in * gp.cdf);
  }
}

}  // namespace

void rotary(const Tensor& y, const Tensor& x, int heads, float theta, bool inverse, const Tensor& packed,
            cudaStream_t s) {
  const int64_t rows = packed.defined() ? packed.dim(0) : x.dim(0) * x.dim(1), seq = x.dim(1), hidden = x.dim(2) / 3;
  const bool copy_v = y.data != x.data;
  const size_t n = static_cast<size_t>(rows * hidden * (copy_v ? 2 : 1));
  if (n == 0) return;
  dispatch_float(x.dtype, "rotary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    rotary_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(y.ptr<T>(), x.ptr<const T>(),
                                                               packed.defined() ? packed.ptr<const int32_t>() : nullptr,
                                                               rows, seq, hidden,
                                                               static_cast<int>(hidden / heads), logf(theta),
                                                               inverse ? -1.0f : 1.0f, copy_v);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void geglu_forward(const Tensor& y, const Tensor& x, cudaStream_t s) {
  const int64_t inter = y.dim(-1), rows = static_cast<int64_t>(y.numel()) / (inter ? inter : 1);
  if (y.numel() == 0) return;
  dispatch_float(x.dtype, "geglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    geglu_forward_kernel<T><<<grid_for(y.numel(), kThreads), kThreads, 0, s>>>(y.ptr<T>(), x.ptr<const T>(), rows,
                                                                              inter);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void geglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, cudaStream_t s) {
  const int64_t inter = dy.dim(-1), rows = static_cast<int64_t>(dy.numel()) / (inter ? inter : 1);
  if (dy.numel() == 0) return;
  dispatch_float(x.dtype, "geglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    geglu_backward_kernel<T><<<grid_for(dy.numel(), kThreads), kThreads, 0, s>>>(
        dx.ptr<T>(), dy.ptr<const T>(), x.ptr<const T>(), rows, inter);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
