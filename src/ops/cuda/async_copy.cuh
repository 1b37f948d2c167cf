// Ampere-style asynchronous copies into shared memory (cp.async, sm_80 and later) and named
// barriers, shared by the attention kernels and the LayerNorm backward's row pipeline: each thread
// copies 16-byte pieces, commits them as a group, and waits until at most N of its groups are in
// flight. A thread that reads back only what it copied itself needs no barrier after the wait.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace anatomy::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; when !pred, writes 16 zero bytes (src not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred = true) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// 4-byte async copy (through L1: 4-byte copies cannot bypass it), zero when !pred.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred = true) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// Barrier `id` (1-15; 0 is __syncthreads') over `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace anatomy::cuda
