// Device memory a backend allocates for itself, shared by the backends and the memory planner
// (which must know it before any device exists).
//
// Fused attention backward scratch: D = rowsum(dO * O) per (b, head, query) in F32,
// plus, for half-precision inputs, an F32 accumulator for dQ. Each part is 256-byte aligned.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace anatomy {

inline size_t attention_scratch_bytes(int64_t B, int64_t T, int heads, int head_dim, DType dt) {
  auto align = [](size_t n) { return (n + 255) & ~static_cast<size_t>(255); };
  const size_t dsum = align(static_cast<size_t>(B) * heads * T * sizeof(float));
  const size_t dq = dt == DType::F32 ? 0 : align(static_cast<size_t>(B) * T * heads * head_dim * sizeof(float));
  return dsum + dq;
}

// The CUDA backend's fixed allocations, made once when it starts.
inline constexpr size_t kCudaLtWorkspaceBytes = size_t{32} << 20;  // cuBLASLt workspace (Category::Workspace)
inline constexpr size_t kCudaReduceScratchBytes = size_t{4} << 20;  // column-reduction partials (Temporary)

}  // namespace anatomy
