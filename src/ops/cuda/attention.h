// Fused multi-head self-attention on the GPU (attention.cu, attention_flash.cu, attention_wgmma.cu,
// attention_wgmma_bwd.cu, attention_gemm.cu). The math and the masking convention are in
// attention_common.cuh.
//
// Paths: BF16/F16 with head_dim 32, 64 or 128 take the flash kernels (on Hopper, head dims 32 and 64
// without a window on wgmma: the backward at both, the forward at 64; see
// attention_forward_kernel); F32 takes the cuBLAS path (strided
// batched GEMMs per sample with the [heads, T, T] score matrix in scratch); everything else,
// and every dtype under ANATOMY_ATTENTION=reference, takes the scalar reference kernels.
// `scratch` must hold attention_scratch_bytes(...) bytes (ops/backend_memory.h).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/tensor.h"
#include "ops/cuda/launchers.h"
#include "ops/op_args.h"

namespace anatomy::cuda {

struct AttentionOptions {
  // cuBLAS workspace for the F32 GEMM path (the backend lends its cuBLASLt workspace: both
  // run in order on one stream). Null / 0: cuBLAS runs without a workspace.
  void* cublas_workspace = nullptr;
  size_t cublas_workspace_bytes = 0;
  // Let the F32 GEMM path use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
  bool allow_tf32 = false;
};

size_t attention_scratch_bytes(int64_t B, int64_t T, int heads, int head_dim, DType dt);
// scope (Note [attention scope] in ops/op_args.h): with a window (ModernBERT's local layers) the
// flash kernels for BF16/F16 (head_dim 32, 64, 128), the reference kernels otherwise; the queries
// are honoured by the wgmma kernels (Params::queries). ANATOMY_ATTENTION_QUERIES=all computes
// every query, for A/Bs.
void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                       const DropoutSpec& d, void* scratch, cudaStream_t s, const AttentionOptions& opt = {},
                       AttentionScope scope = {});
// dbias (F32 [3H], optional) += the column sums of dqkv as stored: the flash kernels add them as
// they write dqkv (Note [attention bias gradient] in attention.cu), the other paths run bias_grad
// over dqkv with `reduce` (its scratch) after.
void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                        const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& d, void* scratch,
                        cudaStream_t s, const AttentionOptions& opt = {}, AttentionScope scope = {},
                        const Tensor& dbias = {},
                        const ReduceScratch& reduce = {});

// The kernel family attention_forward takes on the current device for this dtype, head dim and
// window: "wgmma" (Hopper, attention_wgmma.cu), "mma" (attention_flash.cu), "gemm" (F32 through
// cuBLAS) or "reference" (ANATOMY_ATTENTION=reference, or what the others do not cover).
const char* attention_forward_kernel(DType dt, int64_t head_dim, int window);
const char* attention_backward_kernel(DType dt, int64_t head_dim, int window);  // likewise
// Calls of the wgmma forward or backward that fell back from TMA to cp.async tiles because the
// driver refused the tensor map (Note [tma key tiles]); 0 on a working Hopper setup.
int64_t attention_tma_fallbacks();

// Packed rows (Note [packed attention] in ops/cpu/attention.cpp), on the flash kernels only:
// BF16/F16, head dim 32, 64 or 128, not under ANATOMY_ATTENTION=reference. qkv [N, 3H],
// offsets I32 [B + 1], lse [B, heads, T]; the backward's scratch as attention_scratch_bytes(B, T, ...).
bool packed_attention_supported(DType dt, int64_t T, int64_t head_dim);
void attention_packed_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets, int heads,
                              const DropoutSpec& d, cudaStream_t s, AttentionScope scope = {});
void attention_packed_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& d, void* scratch,
                               cudaStream_t s, AttentionScope scope = {}, const Tensor& dbias = {});  // dbias as above

}  // namespace anatomy::cuda
