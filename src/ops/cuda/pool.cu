// Mean pooling over the attention mask (ModernBERT's classifier_pooling "mean"); the math and the
// empty-sequence choice are the CPU twin's (ops/cpu/pool.cpp, Note [empty mean pool]). Both
// kernels are deterministic without atomics: a forward block owns 32 columns of one sequence and
// sums its tokens in fp32 in a fixed order; a backward block counts its sequence's tokens with
// __syncthreads_count (an exact integer) and writes its share of dx.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kCols = 32, kGroups = 8;  // the forward's block: 32 columns x 8 token groups

// Grid (ceil(H / kCols), B), block (kCols, kGroups): thread (c, g) sums, in token order, the kept
// tokens t = g, g + kGroups, ... of column blockIdx.x * kCols + c; row g = 0 then adds the groups'
// sums in group order (fixed: the same bits every run) and divides by the kept count.
template <class T>
__global__ void masked_mean_forward_kernel(T* __restrict__ out, const T* __restrict__ x,
                                           const int32_t* __restrict__ mask, int64_t seq, int64_t hidden) {
  __shared__ float part[kGroups][kCols];
  __shared__ int64_t kept[kGroups];
  const int64_t b = blockIdx.y, j = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  float acc = 0.0f;
  int64_t n = 0;
  for (int64_t t = threadIdx.y; t < seq; t += kGroups) {
    if (mask && mask[b * seq + t] == 0) continue;
    ++n;
    if (j < hidden) acc += to_f32(x[(b * seq + t) * hidden + j]);
  }
  part[threadIdx.y][threadIdx.x] = acc;
  if (threadIdx.x == 0) kept[threadIdx.y] = n;
  __syncthreads();
  if (threadIdx.y != 0 || j >= hidden) return;
  float sum = 0.0f;
  int64_t total = 0;
  for (int g = 0; g < kGroups; ++g) {
    sum += part[g][threadIdx.x];
    total += kept[g];
  }
  out[b * hidden + j] = from_f32<T>(sum / static_cast<float>(total > 1 ? total : 1));
}

// Grid (blocks, B): the blocks of sequence b share its T * H elements of dx in a grid-stride loop.
template <class T>
__global__ void masked_mean_backward_kernel(T* __restrict__ dx, const T* __restrict__ dout,
                                            const int32_t* __restrict__ mask, int64_t seq, int64_t hidden) {
  const int64_t b = blockIdx.y;
  int64_t n = 0;
  for (int64_t t0 = 0; t0 < seq; t0 += blockDim.x) {  // uniform bounds: every thread reaches the count
    const int64_t t = t0 + threadIdx.x;
    n += __syncthreads_count(t < seq && (!mask || mask[b * seq + t] != 0));
  }
  const float nf = static_cast<float>(n > 1 ? n : 1);
  const size_t total = static_cast<size_t>(seq) * hidden;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  T* d = dx + b * seq * hidden;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t t = static_cast<int64_t>(i / hidden), j = static_cast<int64_t>(i % hidden);
    const bool kept = !mask || mask[b * seq + t] != 0;
    d[i] = kept ? from_f32<T>(to_f32(dout[b * hidden + j]) / nf) : from_f32<T>(0.0f);
  }
}

}  // namespace

void masked_mean_forward(const Tensor& out, const Tensor& x, const Tensor& mask, cudaStream_t s) {
  const int64_t batch = x.dim(0), seq = x.dim(1), hidden = x.dim(2);
  if (out.numel() == 0) return;
  const int32_t* m = mask.defined() ? mask.ptr<const int32_t>() : nullptr;
  const dim3 grid(static_cast<unsigned>((hidden + kCols - 1) / kCols), static_cast<unsigned>(batch));
  dispatch_float(x.dtype, "masked_mean_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    masked_mean_forward_kernel<<<grid, dim3(kCols, kGroups), 0, s>>>(out.ptr<T>(), x.ptr<const T>(), m, seq, hidden);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void masked_mean_backward(const Tensor& dx, const Tensor& dout, const Tensor& mask, cudaStream_t s) {
  const int64_t batch = dx.dim(0), seq = dx.dim(1), hidden = dx.dim(2);
  if (dx.numel() == 0) return;
  const int32_t* m = mask.defined() ? mask.ptr<const int32_t>() : nullptr;
  // Enough blocks per sequence to fill the device a few times over, never more than it needs.
  const unsigned per_seq = std::max(1u, grid_for(dx.numel(), kThreads) / static_cast<unsigned>(batch));
  const size_t need = (static_cast<size_t>(seq * hidden) + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(std::min<size_t>(per_seq, need)), static_cast<unsigned>(batch));
  dispatch_float(dx.dtype, "masked_mean_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    masked_mean_backward_kernel<<<grid, kThreads, 0, s>>>(dx.ptr<T>(), dout.ptr<const T>(), m, seq, hidden);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
