// Shared pieces of the attention kernels (attention.cu: host entry points, reference
// kernels, pre/post passes; attention_flash.cu: the tensor-core fast path for BF16/F16;
// attention_gemm.cu: the cuBLAS path for F32).
//
// Problem (per batch b, head h; D = head_dim, H = heads*D, scale = 1/sqrt(D)):
//   q_t = qkv[b, t, 0*H + h*D : +D],  k_t = qkv[b, t, 1*H + h*D : +D],  v_t = qkv[b, t, 2*H + h*D : +D]
//   s_qk  = scale * q_q . k_k                 if mask[b, k] != 0
//         = -inf                              if mask[b, k] == 0 and batch b has a valid key
//         = 0 (constant)                      if batch b has no valid key at all
//           (Hugging Face adds finfo.min to every score, which makes such a row uniform)
//   lse_q = log sum_k exp(s_qk)               -> lse[b, h, q] (undropped)
//   P_qk  = exp(s_qk - lse_q)
//   Z_qk  = keep(i) / (1 - p), i = ((b*heads + h)*T + q)*T + k   (Z = 1 without dropout)
//   ctx[b, q, h*D : +D] = O_q = sum_k P_qk Z_qk v_k
// Backward (dO = dctx):
//   dV_k = sum_q P_qk Z_qk dO_q
//   dP_qk = Z_qk (dO_q . v_k),  Dsum_q = sum_k P_qk dP_qk = dO_q . O_q
//   dS_qk = P_qk (dP_qk - Dsum_q)            (as autograd through softmax does, also for
//                                             the constant rows of a fully masked batch)
//   dQ_q = scale * sum_k dS_qk k_k,  dK_k = scale * sum_q dS_qk q_q
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/attention.h"

namespace anatomy::cuda::attn {

struct Params {
  const void* qkv = nullptr;      // [B, T, 3H], compute dtype
  void* ctx = nullptr;            // [B, T, H] (forward output; backward input O)
  float* lse = nullptr;           // [B, heads, T]
  const int32_t* mask = nullptr;  // [B, T] or null (every key valid)
  const void* dctx = nullptr;     // [B, T, H]
  void* dqkv = nullptr;           // [B, T, 3H]
  float* dsum = nullptr;          // scratch [B, heads, T]: dO . O
  float* dq_acc = nullptr;        // scratch [B, T, H] F32: unscaled dQ accumulator (fast path)
  int B = 0, T = 0, heads = 0, D = 0, H = 0;
  float scale = 1.0f;
  // Dropout: element i is kept iff hi32(mix(rng_base + i)) >= thr_hi (see keep()).
  bool drop = false;
  float inv_keep = 1.0f;  // 1 / (1 - p)
  uint32_t thr_hi = 0;
  uint64_t rng_base = 0;
};

// anatomy::dropout_keep(seed, offset, i, p) with the loop invariants hoisted:
//   h = mix64(base + i), base = seed*0x9e37.. + mix64(offset + 0x632b..);
//   keep iff float(h >> 40) * 2^-24 >= p  <=>  (h >> 40) >= ceil(p * 2^24) =: thr
//                                          <=>  hi32(h) >= thr << 8.
// The last step of mix64 (h = z ^ (z >> 31)) leaves bits 40..63 unchanged, so it is skipped,
// and only the high word of the last product is needed.
__device__ __forceinline__ bool dropout_keep_fast(uint64_t z, uint32_t thr_hi) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint32_t>(z >> 32) >= thr_hi;
}

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Fast path (attention_flash.cu). Each returns false (launching nothing) when the shape or
// dtype is not one it handles; then the caller uses the reference kernels.
// is_bf16: element type is bf16 (else fp16). smem_limit: the device's opt-in maximum.
bool flash_forward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);
// Needs p.dsum filled and p.dq_acc zeroed beforehand; leaves unscaled dQ in p.dq_acc and
// writes dK, dV into p.dqkv.
bool flash_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);
bool flash_supports(const Params& p);

// F32 cuBLAS path (attention_gemm.cu). S and dP are [heads, T, T] F32 scratch buffers of
// gemm_score_bytes(T, heads) each. The backward needs p.dsum filled; it overwrites p.dqkv.
size_t gemm_score_bytes(int64_t T, int heads);
void gemm_forward(const Params& p, float* S, const AttentionOptions& o, cudaStream_t s);
void gemm_backward(const Params& p, float* S, float* dP, const AttentionOptions& o, cudaStream_t s);

}  // namespace anatomy::cuda::attn
