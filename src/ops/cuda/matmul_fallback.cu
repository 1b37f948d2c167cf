// A plain tiled matmul for what cuBLASLt declines (no algorithm for a shape, alignment or type
// combination). Same contract as Backend::matmul: C[M,N] = alpha op(A) op(B) + beta C (+ bias,
// then GELU with the pre-activation stored to gelu_in). fp32 accumulation; slow but exact.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kTile = 16;

// ---- kernels ------------------------------------------------------------------------------------
// Block (x, y) computes the 16x16 tile C[y*16.., x*16..]; op(A)[i,k] = A[i,k] or A[k,i].
template <class Tab, class Tc>
__global__ void matmul_tiled_kernel(Tc* __restrict__ c, Tab* __restrict__ gelu_in, const Tab* __restrict__ a,
                                    const Tab* __restrict__ b, const Tab* __restrict__ bias, bool ta, bool tb,
                                    int64_t m, int64_t n, int64_t k, float alpha, float beta, bool gelu) {
  __shared__ float as[kTile][kTile + 1], bs[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + ty, j = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    const int64_t ka = k0 + tx, kb = k0 + ty;
    as[ty][tx] = i < m && ka < k ? to_f32(ta ? a[ka * m + i] : a[i * k + ka]) : 0.0f;
    bs[ty][tx] = kb < k && j < n ? to_f32(tb ? b[j * k + kb] : b[kb * n + j]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kTile; ++q) acc += as[ty][q] * bs[q][tx];
    __syncthreads();
  }
  if (i >= m || j >= n) return;
  float pre = alpha * acc;
  if (beta != 0.0f) pre += beta * to_f32(c[i * n + j]);  // beta == 0: C is never read
  if (bias) pre += to_f32(bias[j]);
  if (gelu) {
    gelu_in[i * n + j] = from_f32<Tab>(pre);
    pre = 0.5f * pre * (1.0f + erff(pre * 0.70710678118654752440f));
  }
  c[i * n + j] = from_f32<Tc>(pre);
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void matmul_fallback(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                     int64_t k, const MatmulArgs& args, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
  const bool gelu = args.epilogue == Epilogue::BiasGelu;
  dispatch_float(a.dtype, "matmul", [&](auto ab) {
    using Tab = typename decltype(ab)::type;
    const Tab* bias = args.epilogue != Epilogue::None ? args.bias.ptr<const Tab>() : nullptr;
    Tab* gin = gelu ? args.gelu_in.ptr<Tab>() : nullptr;
    dispatch_float(c.dtype, "matmul", [&](auto cc) {
      using Tc = typename decltype(cc)::type;
      matmul_tiled_kernel<Tab, Tc><<<grid, dim3(kTile, kTile), 0, s>>>(
          c.ptr<Tc>(), gin, a.ptr<const Tab>(), b.ptr<const Tab>(), bias, ta == Trans::T, tb == Trans::T, m, n, k,
          args.alpha, args.beta, gelu);
    });
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
