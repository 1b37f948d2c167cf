// Column reductions over [rows, n] matrices, deterministic: stage 1 writes one partial row per
// row chunk into a scratch, stage 2 sums the partial rows in a fixed order. No atomics, so the
// result is bit-identical run to run (for the bias gradients and, through reduce_partials, the
// LayerNorm and token-type gradients).
//
// Note [column sums at bandwidth]
// bias_grad reads dy [M, N] once (bert-large: M = 16384, N up to 4096, 134 MB in bf16), so it
// should run at the memory's rate. The vector kernel gives each lane one 16-byte pack of
// columns (8 bf16 / 4 fp32) and each of a block's 8 warps its own rows, so one load
// instruction of a warp reads 512 contiguous bytes of a row, and each lane keeps kUnroll
// loads in flight before it adds them (in row order). A block covers 32 packs of columns and
// one chunk of rows; the grid is one full wave (kColBlocksPerSm blocks per SM, guaranteed by
// the launch bounds), chunks of equal size, so no SM waits on a straggler. The block combines
// its warps in warp order in shared memory and writes one partial row (or, with one chunk,
// adds straight into db). Stage 2 (reduce_partials) spreads the groups of each column over 8
// warps (warp w sums groups w, w + 8, ... in order, then warp 0 adds the 8 slices in order):
// the same fixed order every run, but 8x the parallelism of one thread per column, whose
// serial chain of loads dominated when there are hundreds of groups.
// Shapes whose width is not a multiple of the pack (or unaligned pointers) take the scalar
// kernel: thread per column, same two stages.
#include <algorithm>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gelu.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kColWarps = kThreads / 32;  // rows in flight per block in the vector kernel
constexpr int kColBlocksPerSm = 4;        // launch bounds: <= 64 registers per thread
constexpr int64_t kMinChunk = 8 * kColWarps;  // rows per block at least (8 per warp)

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

// The rows a column sum reads, by 16-byte pack index i (row * packs per row + pack column):
// load() issues a pack's loads, value() makes the pack that is summed. PlainRows sums dy
// itself (bias_grad); GeluBackRows makes dx = gelu'(x) dy, stores it and sums it as stored
// (gelu_backward_bias: the GELU backward and the bias gradient of the layer before it in one
// pass). dx may alias dy (in place): a pack is read before it is written, by the same thread.
template <class T>
struct PlainRows {
  static constexpr int kUnroll = 4;  // loads in flight per lane
  using V = Pack<T, kVec<T>>;
  struct In {
    V d;
  };
  const T* __restrict__ dy;
  __device__ __forceinline__ In load(int64_t i) const { return {reinterpret_cast<const V*>(dy)[i]}; }
  __device__ __forceinline__ V value(const In& in, int64_t) const { return in.d; }
};
template <class T>
struct GeluBackRows {
  static constexpr int kUnroll = 2;  // two packs a load: as many bytes in flight as PlainRows
  using V = Pack<T, kVec<T>>;
  struct In {
    V d, x;
  };
  T* dx;
  const T* dy;
  const T* __restrict__ x;
  __device__ __forceinline__ In load(int64_t i) const {
    return {reinterpret_cast<const V*>(dy)[i], reinterpret_cast<const V*>(x)[i]};
  }
  __device__ __forceinline__ V value(const In& in, int64_t i) const {
    V o;
#pragma unroll
    for (int j = 0; j < kVec<T>; ++j) o.v[j] = from_f32<T>(gelu_grad<T>(to_f32(in.d.v[j]), to_f32(in.x.v[j])));
    reinterpret_cast<V*>(dx)[i] = o;
    return o;
  }
};

// Note [column sums at bandwidth]. Block (x, y): columns [x*32W, (x+1)*32W), rows
// [y*chunk, (y+1)*chunk); lane l owns columns x*32W + l*W .. +W, warp w rows r0 + w + 8k.
// Requires n % W == 0 and 16-byte aligned rows.
template <class T, class Rows>
__global__ void __launch_bounds__(kThreads, kColBlocksPerSm) column_sum_vec_kernel(
    float* __restrict__ db, float* __restrict__ partials, Rows src, int64_t rows, int64_t n, int64_t chunk) {
  constexpr int W = kVec<T>;
  constexpr int kTile = 32 * W;  // columns per block
  constexpr int U = Rows::kUnroll;
  __shared__ alignas(16) float red[kColWarps][kTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t c0 = tile0 + static_cast<int64_t>(lane) * W;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc[W];
#pragma unroll
  for (int j = 0; j < W; ++j) acc[j] = 0.0f;
  if (c0 < n) {  // n % W == 0: a live lane's pack lies wholly inside the row
    const int64_t stride = n / W;  // packs per row
    const int64_t col = c0 / W;
    int64_t r = r0 + warp;
    for (; r + (U - 1) * kColWarps < r1; r += U * kColWarps) {
      typename Rows::In v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = src.load((r + u * kColWarps) * stride + col);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const auto o = src.value(v[u], (r + u * kColWarps) * stride + col);
#pragma unroll
        for (int j = 0; j < W; ++j) acc[j] += to_f32(o.v[j]);
      }
    }
    for (; r < r1; r += kColWarps) {
      const auto o = src.value(src.load(r * stride + col), r * stride + col);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += to_f32(o.v[j]);
    }
  }
  // Every warp stores its W sums per lane (zeros for dead lanes), 16 bytes at a time.
#pragma unroll
  for (int j = 0; j < W; j += 4)
    *reinterpret_cast<float4*>(&red[warp][lane * W + j]) = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
  __syncthreads();
  const int t = threadIdx.x;
  const int64_t c = tile0 + t;
  if (t < kTile && c < n) {
    float s = red[0][t];
#pragma unroll
    for (int w = 1; w < kColWarps; ++w) s += red[w][t];
    if (partials)
      partials[static_cast<int64_t>(blockIdx.y) * n + c] = s;
    else
      db[c] += s;
  }
}

// Block x: columns j = x*32 + lane of the [0, width) output range (width = n times the outputs);
// warp w sums partials[g*stride + j] for g = w, w + 8, ... in order; warp 0 then adds the
// warps' sums in warp order and accumulates into out0[j] (j < n), out1[j - n] or out2[j - 2n].
__global__ void __launch_bounds__(kThreads) reduce_partials_kernel(float* __restrict__ out0, float* __restrict__ out1,
                                                                   float* __restrict__ out2,
                                                                   const float* __restrict__ partials, int groups,
                                                                   int64_t n, int64_t width, int64_t stride) {
  constexpr int kWarps = kThreads / 32, kLoads = 8;
  __shared__ float red[kWarps][33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float acc = 0.0f;
  if (j < width) {
    const float* p = partials + j;
    int g = warp;
    for (; g + (kLoads - 1) * kWarps < groups; g += kLoads * kWarps) {
      float v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) v[u] = p[static_cast<int64_t>(g + u * kWarps) * stride];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) acc += v[u];
    }
    for (; g < groups; g += kWarps) acc += p[static_cast<int64_t>(g) * stride];
  }
  red[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || j >= width) return;
  float s = red[0][lane];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) s += red[w][lane];
  const int k = j < n ? 0 : j < 2 * n ? 1 : 2;  // the output: j < width, so out_k is given or skipped (nullptr)
  float* out = k == 0 ? out0 : k == 1 ? out1 : out2;
  if (out) out[j - k * n] += s;
}

// Column blocks, then enough row chunks to fill one wave of the device (vector kernel: its
// launch bounds guarantee kColBlocksPerSm blocks per SM), as the scratch allows; then stage 2.
template <class T, class Launch>
void column_sums(const Tensor& db, int64_t rows, int64_t n, bool vec, const ReduceScratch& scratch, cudaStream_t s,
                 Launch&& launch) {
  constexpr int W = kVec<T>;
  const int64_t tile = vec ? 32 * W : kThreads;
  const int64_t col_blocks = (n + tile - 1) / tile;
  const int64_t slots = static_cast<int64_t>(vec ? kColBlocksPerSm : 4) * sm_count();
  int64_t chunks = (slots + col_blocks - 1) / col_blocks;
  chunks = std::min<int64_t>({chunks, vec ? (rows + kMinChunk - 1) / kMinChunk : rows,
                              static_cast<int64_t>(scratch.floats) / n, 65535});
  if (chunks < 1) chunks = 1;
  const int64_t chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + chunk - 1) / chunk;
  float* partials = chunks > 1 ? scratch.data : nullptr;
  launch(dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks)), partials, chunk);
  ANATOMY_CUDA_LAUNCH_CHECK();
  if (partials) reduce_partials(db.ptr<float>(), nullptr, nullptr, partials, static_cast<int>(chunks), n, n, s);
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void reduce_partials(float* out0, float* out1, float* out2, const float* partials, int groups, int64_t n,
                     int64_t stride, cudaStream_t s) {
  const int64_t width = (out2 ? 3 : out1 ? 2 : 1) * n;
  if (width == 0 || (!out0 && !out1 && !out2)) return;
  const unsigned grid = static_cast<unsigned>((width + 31) / 32);
  reduce_partials_kernel<<<grid, kThreads, 0, s>>>(out0, out1, out2, partials, groups, n, width, stride);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void bias_grad(const Tensor& db, const Tensor& dy, const ReduceScratch& scratch, cudaStream_t s) {
  const int64_t n = dy.dim(-1);
  const int64_t rows = n ? static_cast<int64_t>(dy.numel()) / n : 0;
  if (n == 0 || rows == 0) return;
  dispatch_float(dy.dtype, "bias_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = n % kVec<T> == 0 && aligned16(dy.data);
    column_sums<T>(db, rows, n, vec, scratch, s, [&](dim3 grid, float* partials, int64_t chunk) {
      if (vec)
        column_sum_vec_kernel<T><<<grid, kThreads, 0, s>>>(db.ptr<float>(), partials, PlainRows<T>{dy.ptr<const T>()},
                                                           rows, n, chunk);
      else
        column_sum_kernel<T><<<grid, kThreads, 0, s>>>(db.ptr<float>(), partials, dy.ptr<const T>(), rows, n, chunk);
    });
  });
}

void gelu_backward_bias(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& db,
                        const ReduceScratch& scratch, cudaStream_t s) {
  const int64_t n = dx.dim(-1);
  const int64_t rows = n ? static_cast<int64_t>(dx.numel()) / n : 0;
  if (n == 0 || rows == 0) return;
  dispatch_float(dx.dtype, "gelu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n % kVec<T> != 0 || !aligned16(dx.data) || !aligned16(dy.data) || !aligned16(x.data)) {
      gelu_backward(dx, dy, x, s);  // the element-wise kernel, then the column sums of what it wrote
      bias_grad(db, dx, scratch, s);
      return;
    }
    const GeluBackRows<T> src{dx.ptr<T>(), dy.ptr<const T>(), x.ptr<const T>()};
    column_sums<T>(db, rows, n, true, scratch, s, [&](dim3 grid, float* partials, int64_t chunk) {
      column_sum_vec_kernel<T><<<grid, kThreads, 0, s>>>(db.ptr<float>(), partials, src, rows, n, chunk);
    });
  });
}

}  // namespace anatomy::cuda
