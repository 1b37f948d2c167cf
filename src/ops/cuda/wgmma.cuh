// Hopper's warpgroup matrix multiply (wgmma) and what goes with it, for the attention kernels
// (attention_wgmma.cu: forward; attention_wgmma_bwd.cu: backward). Built for sm_90a only: on other
// architectures the bodies are empty and the kernels are never launched (wgmma_forward_supported).
//
// Shared memory descriptors (PTX "matrix descriptor"): start address >> 4 in bits 0-13, the
// leading byte offset >> 4 in 16-29, the stride byte offset >> 4 in 32-45, the swizzle in 62-63
// (1: 128-byte, D = 64; 2: 64-byte, D = 32). The tiles of attention_tiles.cuh are the canonical
// swizzled layouts when 1024-byte aligned: 8-row atoms of 8 * 2D bytes one after the other. For
// the K-major operands the stride offset is that atom (the leading one is unused); for V
// (MN-major, the head dim one swizzle row wide) the atom is the stride between 8-key groups and
// the leading offset is unused; both fields get the atom. A k-step of 16 moves the start 32 bytes
// along the row (K-major) or 16 rows down (V).
// An MN-major A operand (the transpose bit, 16-bit types only) is described the same way.
#pragma once
#include <cstdint>

namespace anatomy::cuda::attn {

// m64n16k16, A and B from shared memory: d = A B, or d += A B when accumulate. Both operands
// K-major, or with MN both MN-major (the transpose bits).
template <bool BF16, bool MN = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[8], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANATOMY_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7}, " \
               "%8, %9, p, 1, 1, %11, %11;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
               : "l"(a), "l"(b), "r"(accumulate), "n"(MN ? 1 : 0))
  if constexpr (BF16) ANATOMY_WGMMA("bf16"); else ANATOMY_WGMMA("f16");
#undef ANATOMY_WGMMA
#endif
}

// m64n32k16, A and B from shared memory: d = A B, or d += A B when accumulate. Both operands
// K-major, or with MN both MN-major (the transpose bits).
template <bool BF16, bool MN = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANATOMY_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "%16, %17, p, 1, 1, %19, %19;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]) \
               : "l"(a), "l"(b), "r"(accumulate), "n"(MN ? 1 : 0))
  if constexpr (BF16) ANATOMY_WGMMA("bf16"); else ANATOMY_WGMMA("f16");
#undef ANATOMY_WGMMA
#endif
}

// m64n32k16, A from registers (the accumulator layout packed to 16 bits), B from shared memory,
// MN-major (trans-b): d += A B.
template <bool BF16>
__device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANATOMY_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
               "{%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
  if constexpr (BF16) ANATOMY_WGMMA("bf16"); else ANATOMY_WGMMA("f16");
#undef ANATOMY_WGMMA
#endif
}

// m64n64k16, A and B from shared memory: d = A B, or d += A B when accumulate. Both operands
// K-major, or with MN both MN-major (the transpose bits).
template <bool BF16, bool MN = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANATOMY_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "%32, %33, p, 1, 1, %35, %35;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
                 "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
                 "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "l"(a), "l"(b), "r"(accumulate), "n"(MN ? 1 : 0))
  if constexpr (BF16) ANATOMY_WGMMA("bf16"); else ANATOMY_WGMMA("f16");
#undef ANATOMY_WGMMA
#endif
}

// m64n64k16, A from registers (the accumulator layout packed to 16 bits), B from shared memory,
// MN-major (trans-b) unless KB (K-major, like the shared-memory forms): d = A B, or d += A B when
// accumulate.
template <bool BF16, bool KB = false>
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate = 1) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ANATOMY_WGMMA(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
               "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
                 "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
                 "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(KB ? 0 : 1))
  if constexpr (BF16) ANATOMY_WGMMA("bf16"); else ANATOMY_WGMMA("f16");
#undef ANATOMY_WGMMA
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// The registers of an async product are read (or, for its A operand, rewritten) only after its
// wait: the compiler may neither move their uses above this point nor reuse them before it.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}
// Shared memory written by ordinary stores (cp.async included) becomes visible to the tensor
// cores' async reads (each writer fences its own writes; a barrier follows).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Descriptor of a swizzled [rows][D] tile at shared address `addr` (above).
template <int D>
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  constexpr uint64_t atom = 8 * 2 * D, swizzle = D == 64 ? 1 : 2;
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | ((atom >> 4) << 16) | ((atom >> 4) << 32) | (swizzle << 62);
}

}  // namespace anatomy::cuda::attn
