#pragma once
#include <cuda_runtime.h>
#include "core/tensor.h"
#include "ops/backend.h"
namespace anatomy::cuda {
size_t attention_scratch_bytes(int64_t B, int64_t T, int heads, int head_dim, DType dt);
void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads, const DropoutSpec& d, void* scratch, cudaStream_t s);
void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx, const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& d, void* scratch, cudaStream_t s);
}
