// The fused bias + exact GELU GEMM (Note [fused exact GELU] in gemm_gelu.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace anatomy::cuda {

// Row-major c [m, n] = gelu(pre), pre [m, n] = alpha a [m, k] b [n, k]^T + bias [n] (stored),
// all of `dtype`, contiguous. workspace: device memory the kernel may use.
struct GeluGemmArgs {
  void* c;
  void* pre;
  const void* a;
  const void* b;
  const void* bias;
  int64_t m, n, k;
  float alpha;
  DType dtype;
  void* workspace;
  size_t workspace_bytes;
};
// true: done in one kernel. false: nothing ran (no CUTLASS in this build, not an sm_90 device,
// a dtype, shape or alignment it does not cover, or ANATOMY_GELU_GEMM unset or off); run the two
// passes.
bool gemm_bias_gelu(const GeluGemmArgs& args, cudaStream_t s);
// Whether this build has the kernel, ANATOMY_GELU_GEMM picks one and the device runs it (sm_90);
// and how many calls it has run in this process (the tests check that it was taken).
bool gelu_gemm_available();
int64_t gelu_gemm_calls();

}  // namespace anatomy::cuda
