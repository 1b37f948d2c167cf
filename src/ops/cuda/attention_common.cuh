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
//   Z_qk  = keep(b*heads + h, q, k) / (1 - p)   (Z = 1 without dropout; core/rng.h,
//                                               Note [attention dropout index])
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

#include "core/rng.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/common.cuh"

namespace anatomy::cuda::attn {

struct Params {
  const void* qkv = nullptr;      // [B, T, 3H], compute dtype
  void* ctx = nullptr;            // [B, T, H] (forward output; backward input O)
  float* lse = nullptr;           // [B, heads, T]
  const int32_t* mask = nullptr;  // [B, T] or null (every key valid)
  // Packed rows (Note [packed attention] in ops/cpu/attention.cpp): [B + 1], sequence b the rows
  // [offsets[b], offsets[b + 1]) of qkv, ctx, dctx, dqkv and dq_acc, all its tokens valid keys
  // (mask null); lse and dsum stay [B, heads, T] and the dropout index uses T. Null: the padded
  // layout, sequence b the rows [b T, (b + 1) T).
  const int32_t* offsets = nullptr;
  int rows = 0;  // packed: the rows of qkv (offsets[B] of them in sequences, the rest zeroed)
  const void* dctx = nullptr;     // [B, T, H]
  void* dqkv = nullptr;           // [B, T, 3H]
  float* dsum = nullptr;          // scratch [B, heads, T]: dO . O
  float* dq_acc = nullptr;        // scratch [B, T, H] F32: unscaled dQ accumulator (fast path)
  float* dbias = nullptr;         // F32 [3H] or null: += the column sums of dqkv as stored (fast path;
                                  // Note [attention bias gradient] in attention.cu)
  int B = 0, T = 0, heads = 0, D = 0, H = 0;
  // > 0: query q sees key k only when |q - k| <= window, and a query that sees no key attends
  // uniformly to all T keys (Note [local attention window], ops/cpu/attention.cpp). The
  // reference and flash kernels implement it (Note [window tiles], attention_flash.cu); F32
  // calls with a window take the reference kernels.
  int window = 0;
  // > 0: the caller reads only each sequence's first `queries` queries (Note [attention scope] in
  // ops/op_args.h). The wgmma kernels compute only the query tiles that hold them: the forward's
  // other CTAs write a zero context and an lse of +inf, the backward skips the later query tiles.
  // The other kernels compute every query, which the note allows.
  int queries = 0;
  float scale = 1.0f;
  // Dropout (Note [dropout bits] and Note [attention dropout index] in core/rng.h): the
  // element of (b*heads + h, q, k) is kept iff its 16-bit field of the group bits
  // dropout_mix(rng_key + group * kGolden) is >= thr.
  bool drop = false;
  float inv_keep = 1.0f;  // 1 / (1 - p)
  uint32_t thr = 0;       // dropout_threshold(p)
  uint32_t thr_m1 = 0;    // thr * 2^16 - 1 (keep4)
  uint64_t rng_key = 0;   // dropout_key(seed, offset)
};

// Sequence b's first row and its token count (T in the padded layout): the queries and keys
// past len do not exist in the packed layout and are neither read nor written.
struct SeqRows {
  size_t row0;
  int len;
};
__device__ __forceinline__ SeqRows seq_rows(const Params& p, int b) {
  if (p.offsets == nullptr) return {static_cast<size_t>(b) * p.T, p.T};
  const int r0 = p.offsets[b];
  return {static_cast<size_t>(r0), p.offsets[b + 1] - r0};
}
// Rows of qkv, ctx, dctx and dq_acc: the packed layout's p.rows, else B T (host, for TMA maps).
inline uint64_t total_rows(const Params& p) {
  return p.offsets != nullptr ? static_cast<uint64_t>(p.rows) : static_cast<uint64_t>(p.B) * p.T;
}

// The four keep decisions of a group's bits (dropout_field_keep(bits, f, thr), f = 0..3), with
// one compare each: field f of 32-bit word w is >= thr iff (the field in the top half of w) >
// thr * 2^16 - 1, exact for 1 <= thr <= 2^16 (p > 0), which saves shifting the top fields down.
__device__ __forceinline__ void keep4(bool (&k)[4], uint64_t bits, uint32_t thr_m1) {
  const uint32_t lo = static_cast<uint32_t>(bits), hi = static_cast<uint32_t>(bits >> 32);
  k[0] = (lo << 16) > thr_m1;
  k[1] = lo > thr_m1;
  k[2] = (hi << 16) > thr_m1;
  k[3] = hi > thr_m1;
}

// Element (bh, q, k) kept: one hash per element (the reference and row kernels; the flash
// kernels hash once per 2x2 block, see there).
__device__ __forceinline__ bool attn_keep(const Params& p, uint64_t bh, int q, int k) {
  return dropout_keep_key(p.rng_key, attention_dropout_index(bh, static_cast<uint64_t>(q), static_cast<uint64_t>(k),
                                                             static_cast<uint64_t>(p.T)),
                          p.thr);
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
// On Hopper builds (sm_90a) and devices, head dims 32 and 64 without a window take the wgmma
// kernel (attention_wgmma.cu); ANATOMY_ATTENTION_FWD="mma" / "mma64" the mma.sync kernel (128 /
// 64 queries a CTA) everywhere.
bool flash_forward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);
const char* flash_forward_kernel(const Params& p);   // "wgmma" or "mma" (by p.D, p.window)
const char* flash_backward_kernel(const Params& p);  // likewise: wgmma at 32 and 64 unless ANATOMY_ATTENTION_BWD=mma
bool wgmma_forward_supported(const Params& p);
int64_t tma_fallbacks();  // attention.h's attention_tma_fallbacks
void count_tma_fallback();  // a kernel that loads by TMA fell back to cp.async (no tensor map)
bool wgmma_forward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);
// Needs p.dsum filled and p.dq_acc zeroed beforehand; leaves unscaled dQ in p.dq_acc and
// writes dK, dV into p.dqkv.
bool flash_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);
bool wgmma_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s);  // attention_wgmma_bwd.cu
bool flash_supports(const Params& p);
// Whether the flash kernels' shared memory holds batches padded to T at head dim D (32, 64, 128).
bool flash_fits(int T, int D, int smem_limit);

// F32 cuBLAS path (attention_gemm.cu). S and dP are [heads, T, T] F32 scratch buffers of
// gemm_score_bytes(T, heads) each. The backward needs p.dsum filled; it overwrites p.dqkv.
size_t gemm_score_bytes(int64_t T, int heads);
void gemm_forward(const Params& p, float* S, const AttentionOptions& o, cudaStream_t s);
void gemm_backward(const Params& p, float* S, float* dP, const AttentionOptions& o, cudaStream_t s);

}  // namespace anatomy::cuda::attn
