// fp8 operands and the delayed scaling (Note [fp8 training] in core/fp8.h).
//
// fp8_quantize writes one GEMM operand the way cuBLASLt's fp8 kernels on Hopper read it: rows of
// the inner dimension K, contiguous ("TN": both operands K-major), padded with zeros to Kp, a
// multiple of 16. A stored [rows, K] tensor is a plain conversion; a stored [K, rows] one (the
// weight gradient's dY^T and X^T, the data gradient's W^T) goes through a shared-memory tile.
// Each value is multiplied by the row's scale and converted with saturation (cvt ... satfinite);
// the largest |x| is raised into the row's amax by an integer max over the float bits (|x|'s
// bits order like the values, and a NaN's lie above infinity's, so a NaN is kept).
#include <cuda_fp8.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kTile = 32;

template <Fp8Format F>
__device__ __forceinline__ uint16_t to_fp8x2(float a, float b) {
  constexpr __nv_fp8_interpretation_t kind = F == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
}

__device__ __forceinline__ void raise_amax(unsigned bits, float* meta) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, o));
  if ((threadIdx.x & 31) == 0 && bits) atomicMax(reinterpret_cast<unsigned*>(meta + Fp8Meta::kAmax), bits);
}

__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// src [rows, k] -> dst [rows, ld]: each thread converts 8 consecutive values of a row.
template <Fp8Format F, class T>
__global__ void quantize_rows(uint8_t* __restrict__ dst, int64_t ld, const T* __restrict__ src, int64_t rows,
                              int64_t k, float* meta) {
  const float scale = meta[Fp8Meta::kScale];
  const int64_t chunks = ld / 8, n = rows * chunks;
  const bool vec = k % 8 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  unsigned amax = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks, c0 = (i % chunks) * 8;
    float v[8];
    if (vec && c0 + 8 <= k) {
      const Pack<T, 8> p = *reinterpret_cast<const Pack<T, 8>*>(src + r * k + c0);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_f32(p.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = c0 + j < k ? to_f32(src[r * k + c0 + j]) : 0.0f;
    }
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      amax = max(amax, max(abs_bits(v[2 * j]), abs_bits(v[2 * j + 1])));
      w[j] = to_fp8x2<F>(v[2 * j] * scale, v[2 * j + 1] * scale);
    }
    *reinterpret_cast<uint2*>(dst + r * ld + c0) = make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
  }
  raise_amax(amax, meta);
}

// src [k, rows] -> dst [rows, ld]: 32 x 32 tiles through shared memory, blocks of 32 x 8.
template <Fp8Format F, class T>
__global__ void quantize_cols(uint8_t* __restrict__ dst, int64_t ld, const T* __restrict__ src, int64_t rows,
                              int64_t k, float* meta) {
  __shared__ float tile[kTile][kTile + 1];
  const float scale = meta[Fp8Meta::kScale];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  unsigned amax = 0;
#pragma unroll
  for (int j = 0; j < kTile; j += 8) {
    const int64_t kk = k0 + ty + j, r = r0 + tx;
    const float v = kk < k && r < rows ? to_f32(src[kk * rows + r]) : 0.0f;
    amax = max(amax, abs_bits(v));
    tile[ty + j][tx] = v;
  }
  __syncthreads();
  // Each thread writes two neighbouring bytes of a row (16 threads cover a row's 32 bytes).
  const int pair = tx & 15, row_in = tx >> 4;
#pragma unroll
  for (int j = 0; j < kTile; j += 16) {
    const int rr = ty * 2 + row_in + j;
    const int64_t r = r0 + rr, kk = k0 + 2 * pair;
    if (r < rows && kk < ld)
      *reinterpret_cast<uint16_t*>(dst + r * ld + kk) = to_fp8x2<F>(tile[2 * pair][rr] * scale,
                                                                     tile[2 * pair + 1][rr] * scale);
  }
  raise_amax(amax, meta);
}

// One block per meta row: the scale from the history's largest finite amax, then the shift.
constexpr int kUpdateThreads = 256;
constexpr int kPerThread = (kFp8History + kUpdateThreads - 1) / kUpdateThreads;

__global__ void scale_update(float* meta) {
  __shared__ float red[32];
  float* m = meta + static_cast<int64_t>(blockIdx.x) * kFp8MetaWidth;
  float h[kPerThread];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = threadIdx.x * kPerThread + j;
    h[j] = i < kFp8History ? m[Fp8Meta::kAmax + i] : 0.0f;
    if (isfinite(h[j])) amax = fmaxf(amax, h[j]);
  }
  amax = block_max(amax, red);  // also the barrier between the reads above and the writes below
  if (threadIdx.x == 0) {
    const float scale = fp8_scale_for(amax, m[Fp8Meta::kFormatMax], m[Fp8Meta::kScale]);
    m[Fp8Meta::kScale] = scale;
    m[Fp8Meta::kScaleInv] = 1.0f / scale;
    m[Fp8Meta::kAmax] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = threadIdx.x * kPerThread + j;
    if (i + 1 < kFp8History) m[Fp8Meta::kAmax + i + 1] = h[j];
  }
}

}  // namespace

void fp8_quantize(uint8_t* dst, int64_t ld, const Tensor& src, int64_t rows, int64_t k, bool transposed,
                  float* meta, Fp8Format format, cudaStream_t s) {
  if (rows == 0 || ld == 0) return;  // nothing to write (an empty grid is not a launch)
  dispatch_float(src.dtype, "fp8_quantize", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = src.ptr<T>();
    auto launch = [&](auto kernel_rows, auto kernel_cols) {
      if (!transposed) {
        constexpr int threads = 256;
        kernel_rows<<<grid_for(static_cast<size_t>(rows * (ld / 8)), threads), threads, 0, s>>>(dst, ld, p, rows, k,
                                                                                                  meta);
      } else {
        const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>((ld + kTile - 1) / kTile));
        kernel_cols<<<grid, dim3(kTile, 8), 0, s>>>(dst, ld, p, rows, k, meta);
      }
    };
    if (format == Fp8Format::E4M3)
      launch(quantize_rows<Fp8Format::E4M3, T>, quantize_cols<Fp8Format::E4M3, T>);
    else
      launch(quantize_rows<Fp8Format::E5M2, T>, quantize_cols<Fp8Format::E5M2, T>);
  });
  ANATOMY_CUDA_CHECK(cudaGetLastError());
}

void fp8_scale_update(float* meta, int64_t rows, cudaStream_t s) {
  if (rows == 0) return;
  scale_update<<<static_cast<unsigned>(rows), kUpdateThreads, 0, s>>>(meta);
  ANATOMY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace anatomy::cuda
