// Hopper's tensor memory accelerator (TMA) and shared-memory barriers (mbarrier), for the wgmma
// attention forward (attention_wgmma.cu) and backward (attention_wgmma_bwd.cu). Built for sm_90a
// only: on other architectures the device bodies are empty and the kernels that use them are
// never launched.
//
// Note [tma key tiles]
// A K or V tile is one TMA copy: a box of BC rows x D columns of qkv viewed as a 2-D tensor
// [rows][3H] (16-bit), written into shared memory with the hardware swizzle that matches
// attention_tiles.cuh's swz<D> (128-byte rows at D = 64, 64-byte rows at D = 32), so the tensor
// cores read it as before. Rows past the tensor's end arrive as zeros; rows past a sequence's end
// (the next sequence's keys in the packed layout, the next batch's in the padded one) arrive as
// they are and get probability 0 from the key bias (-inf past the sequence's tokens). Unlike
// cp.async's zero fill, a non-finite value there (an fp16 overflow) would reach this sequence
// as NaN (0 x inf); the batch's loss is then non-finite anyway, and the step is skipped.
// Each stage has two barriers: `full` completes when its tile's bytes have landed (the issuing
// thread arms it with the byte count), `empty` when every consumer warp has finished with the
// tile (one arrival per warp, after its last product on the tile completed). A barrier completes
// phase n on its n-th round; waiting for parity n & 1 waits for that phase.
// Measured against cp.async with a CTA barrier per tile (B 32, T 512, D 64, H200): 185 -> 220
// TFLOP/s with dropout 0.1, 243 -> 306 without (bench/results/2026-11-27-h200/session16/loadab.md).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace anatomy::cuda::attn {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes the barriers' initialization visible to the async proxy (the TMA unit); before the
// CTA-wide barrier that publishes them.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}

// One arrival that also expects `bytes` of TMA transactions before the phase can complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Box (col, row) of the 2-D tensor map into shared memory at dst; completes on barrier bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int col, int row, uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
#endif
}

// Adds the f32 box at shared address src (swizzled as the map says) into the tensor at box
// (col, row), element by element atomically, as one bulk group of this thread.
__device__ __forceinline__ void tma_reduce_add_2d(uint32_t src, const CUtensorMap* map, int col, int row) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n"
               "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(src)
               : "memory");
#endif
}

// This thread's bulk groups: all but the newest N have finished reading shared memory (READ) or
// completed.
template <int N, bool READ>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (READ)
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
  else
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Host (in attention_wgmma.cu), false when the driver has no TMA (then the caller loads another
// way): a row-major matrix [rows][cols] of 16-bit elements (of f32 ones with `f32`; row stride
// `cols` elements) in boxes of box_rows x box_cols, swizzled for rows of the box's width in bytes
// (64 or 128).
bool make_tile_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                   uint32_t box_cols, bool f32 = false);

}  // namespace anatomy::cuda::attn
