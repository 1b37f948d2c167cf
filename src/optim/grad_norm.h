// The squared global gradient norm that clipping (and the fp16 overflow check) reads.
//
// Note [canonical gradient norm]
// The norm is summed in one order that depends only on the flat parameter vector: fixed blocks
// of kNormBlock elements (ops/backend.h), each block's squares summed in one fixed order into
// an F32 partial, the partials combined in one fixed order in double. Threads split blocks,
// never a block, and ZeRO's shard boundaries are multiples of kNormBlock (dist/communicator.h),
// so a sharded run computes exactly the partials a single rank computes, each on the rank that
// owns its block, and an all-reduce of partials that are zero everywhere but on their owner adds
// only exact zeros. Hence: on one machine the norm, the clip factor and every update are bit for
// bit the same for ZeRO stage 0 and 1 and for any thread count, on any CPU (the CPU sums a block
// in double in index order, where x*x is exact, so vector width and FMA cannot change it). The
// GPU sums each block with a fixed tree in F32: deterministic run to run and over stages, but
// not bitwise equal to the CPU's order (README: "What is bitwise reproducible").
#pragma once
#include <cstddef>

#include "memory/allocator.h"
#include "ops/backend.h"

namespace anatomy {

class GradNorm {
 public:
  // For gradients of `n` elements: F32 [1 + ceil(n / kNormBlock)] in Category::Other.
  GradNorm(Backend& be, size_t n);
  static size_t bytes(size_t n) { return 4 * (1 + blocks(n)); }
  static size_t blocks(size_t n) { return (n + kNormBlock - 1) / kNormBlock; }

  // norm_sq() = sum of grads^2 (F32 [n]).
  void compute(const Tensor& grads);
  // Sharded: the partials of elements [begin, end) of grads (begin a multiple of kNormBlock,
  // end too or the end of grads), zero for every other block; all-reduce partials() over the
  // ranks, then finish().
  void compute_range(const Tensor& grads, size_t begin, size_t end);
  const Tensor& partials() const { return m_partials; }
  void finish();

  const Tensor& norm_sq() const { return m_norm; }

 private:
  Backend& m_be;
  size_t m_n;
  Buffer m_buf;
  Tensor m_norm, m_partials;
};

}  // namespace anatomy
