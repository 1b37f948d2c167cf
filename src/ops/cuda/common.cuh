// Device-side helpers shared by the kernel files: element conversions, 16-byte packs, warp and
// block reductions, dtype dispatch and grid sizing. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/tensor.h"
#include "ops/cuda/check.h"

namespace anatomy::cuda {

// ---- element conversions (all arithmetic is fp32; storage may be half) ---------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
// Round to nearest even, as core/dtype.h does on the host, so CPU and GPU casts agree bit for bit.
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// W consecutive elements moved as one 16-byte (or narrower) access.
template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};
template <class T>
constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte access

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// W consecutive elements of type G (a float or a half type) from p as floats, in 16-byte loads
// when W elements span whole 16-byte units (p is then 16-byte aligned): parameters stored in
// fp32 beside activations of a half type read as fast as those of the activations' type.
template <int W, class G>
__device__ __forceinline__ void load_as_floats(float (&o)[W], const G* __restrict__ p) {
  if constexpr (std::is_same_v<G, float> && W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W / 4; ++k) {
      const float4 v = reinterpret_cast<const float4*>(p)[k];
      o[4 * k] = v.x;
      o[4 * k + 1] = v.y;
      o[4 * k + 2] = v.z;
      o[4 * k + 3] = v.w;
    }
  } else {
    const Pack<G, W> v = *reinterpret_cast<const Pack<G, W>*>(p);
#pragma unroll
    for (int j = 0; j < W; ++j) o[j] = to_f32(v.v[j]);
  }
}

// ---- reductions ------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats. Safe to call repeatedly: the leading barrier protects reuse.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// ---- dtype dispatch ----------------------------------------------------------------------------
template <class T>
struct TypeTag {
  using type = T;
};
// Calls f(TypeTag<T>{}) with T the storage type of a float dtype.
template <class F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(TypeTag<float>{}); return;
    case DType::BF16: f(TypeTag<__nv_bfloat16>{}); return;
    case DType::F16: f(TypeTag<__half>{}); return;
    default: fail(op, ": dtype ", dtype_name(t), " is not a float dtype (F32, BF16, F16)");
  }
}

// ---- grid sizing --------------------------------------------------------------------------------
// Multiprocessors of the current device (cached per device: read once, asked per launch).
int sm_count();
// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the
// device a few times over, never more than the work needs.
inline unsigned grid_for(size_t n, int threads, int waves = 8) {
  size_t need = (n + threads - 1) / threads;
  size_t cap = static_cast<size_t>(sm_count()) * waves;
  size_t g = need < cap ? need : cap;
  return static_cast<unsigned>(g ? g : 1);
}

// Whether environment variable `name` is set to `value`: the kernel variants' switches
// (ANATOMY_ATTENTION_*, ANATOMY_LN_BWD), read on every call so that tests can flip them; no
// allocation. In device.cu.
bool env_is(const char* name, const char* value);

}  // namespace anatomy::cuda
