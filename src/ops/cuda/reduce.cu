// Column reductions over [rows, n] matrices, deterministic: stage 1 writes one partial row per
// row chunk into a scratch, stage 2 sums the partial rows in a fixed order. No atomics, so the
// result is bit-identical run to run (for the bias gradients and, through reduce_partials, the
// LayerNorm and token-type gradients).
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;

// ---- kernels ------------------------------------------------------------------------------------
// Block (x, y) sums column j = x*256 + tid over rows [y*chunk, (y+1)*chunk). With one chunk it
// adds straight into db; otherwise it writes partials[y, j].
template <class T>
__global__ void column_sum_kernel(float* __restrict__ db, float* __restrict__ partials, const T* __restrict__ dy,
                                  int64_t rows, int64_t n, int64_t chunk) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc = 0.0f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f32(dy[r * n + j]);
  if (partials)
    partials[static_cast<int64_t>(blockIdx.y) * n + j] = acc;
  else
    db[j] += acc;
}

// Thread j < 2n: out0[j] (j < n) or out1[j - n] += sum_g partials[g*stride + j].
__global__ void reduce_partials_kernel(float* __restrict__ out0, float* __restrict__ out1,
                                       const float* __restrict__ partials, int groups, int64_t n,
                                       int64_t stride) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float* out = j < n ? out0 : out1;
  if (j >= 2 * n || !out) return;
  float acc = 0.0f;
  for (int g = 0; g < groups; ++g) acc += partials[static_cast<int64_t>(g) * stride + j];
  out[j < n ? j : j - n] += acc;
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void reduce_partials(float* out0, float* out1, const float* partials, int groups, int64_t n, int64_t stride,
                     cudaStream_t s) {
  const int64_t width = out1 ? 2 * n : n;
  if (width == 0 || (!out0 && !out1)) return;
  const unsigned grid = static_cast<unsigned>((width + kThreads - 1) / kThreads);
  reduce_partials_kernel<<<grid, kThreads, 0, s>>>(out0, out1, partials, groups, n, stride);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void bias_grad(const Tensor& db, const Tensor& dy, const ReduceScratch& scratch, cudaStream_t s) {
  const int64_t n = dy.dim(-1);
  const int64_t rows = n ? static_cast<int64_t>(dy.numel()) / n : 0;
  if (n == 0 || rows == 0) return;
  // Enough row chunks to give the device ~4 blocks per SM, as the scratch allows.
  const int64_t col_blocks = (n + kThreads - 1) / kThreads;
  int64_t chunks = (4 * sm_count() + col_blocks - 1) / col_blocks;
  chunks = std::min<int64_t>({chunks, rows, static_cast<int64_t>(scratch.floats) / n, 65535});
  if (chunks < 1) chunks = 1;
  const int64_t chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + chunk - 1) / chunk;
  float* partials = chunks > 1 ? scratch.data : nullptr;
  dispatch_float(dy.dtype, "bias_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    column_sum_kernel<<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks)), kThreads, 0, s>>>(
        db.ptr<float>(), partials, dy.ptr<const T>(), rows, n, chunk);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
  if (partials) reduce_partials(db.ptr<float>(), nullptr, partials, static_cast<int>(chunks), n, n, s);
}

}  // namespace anatomy::cuda
