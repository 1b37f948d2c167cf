// Device memory a backend allocates for itself, shared by the backends and the memory planner
// (which must know it before any device exists).
//
// Fused attention scratch (forward and backward share one buffer), each part 256-byte aligned:
// - D = rowsum(dO * O) per (b, head, query) in F32 (backward);
// - F32: the cuBLAS path's score and dP matrices of ONE sample, 2 x [heads, T, T] F32 (the
//   path loops over the batch, reusing them); its cuBLAS workspace is the backend's cuBLASLt
//   workspace (kCudaLtWorkspaceBytes below), not part of this;
// - BF16/F16: an F32 accumulator [B, T, H] for dQ (flash backward).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace anatomy {

inline size_t attention_scratch_bytes(int64_t B, int64_t T, int heads, int head_dim, DType dt) {
  auto align = [](size_t n) { return (n + 255) & ~static_cast<size_t>(255); };
  const size_t dsum = align(static_cast<size_t>(B) * heads * T * sizeof(float));
  if (dt == DType::F32) return dsum + 2 * align(static_cast<size_t>(heads) * T * T * sizeof(float));
  return dsum + align(static_cast<size_t>(B) * T * heads * head_dim * sizeof(float));
}

// The fp8 GEMM's operands (Note [fp8 training] in core/fp8.h) for C [M, N] = op(A) op(B) with
// inner size K: op(A) as [M, Kp] and op(B)^T as [N, Kp] bytes, Kp = K rounded up to 16 (the
// padding is zero), each 256-byte aligned. The backend grows one buffer to the largest call's.
inline size_t fp8_scratch_bytes(int64_t M, int64_t N, int64_t K) {
  auto align = [](size_t n) { return (n + 255) & ~static_cast<size_t>(255); };
  const size_t kp = static_cast<size_t>((K + 15) / 16 * 16);
  return align(static_cast<size_t>(M) * kp) + align(static_cast<size_t>(N) * kp);
}

// The CUDA backend's fixed allocations, made once when it starts.
inline constexpr size_t kCudaLtWorkspaceBytes = size_t{32} << 20;  // cuBLASLt workspace (Category::Workspace)
inline constexpr size_t kCudaReduceScratchBytes = size_t{4} << 20;  // column-reduction partials (Temporary)

}  // namespace anatomy
