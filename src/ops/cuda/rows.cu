// Row gathers and scatters between a padded [R, C] layout and a packed [N, C] one (Note [packed
// inference] in model/bert.cpp). Rows are moved as raw bytes, so one kernel serves every dtype:
// each thread copies one unit (16, 8, 4, 2 or 1 bytes, the widest that the row width and both
// base pointers allow) of one row.
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;

// ---- kernels ------------------------------------------------------------------------------------
// Gather: dst row i <- src row idx[i]. Scatter: dst row idx[i] <- src row i. `units` per row; rows
// named out of [0, padded_rows) are skipped (a kernel cannot throw; the CPU twin does).
template <class U, bool Gather>
__global__ void row_copy_kernel(U* __restrict__ dst, const U* __restrict__ src, const int32_t* __restrict__ idx,
                                int64_t n, int64_t units, int64_t padded_rows) {
  const size_t total = static_cast<size_t>(n) * units;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = static_cast<int64_t>(i / units), u = static_cast<int64_t>(i % units);
    const int64_t other = idx[row];
    if (other < 0 || other >= padded_rows) continue;
    if (Gather)
      dst[row * units + u] = src[other * units + u];
    else
      dst[other * units + u] = src[row * units + u];
  }
}

template <bool Gather>
void launch_row_copy(void* dst, const void* src, const int32_t* idx, int64_t n, size_t row_bytes, int64_t padded_rows,
                     cudaStream_t s) {
  if (n == 0 || row_bytes == 0) return;
  const uintptr_t both = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | row_bytes;
  auto go = [&](auto unit) {
    using U = decltype(unit);
    const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
    row_copy_kernel<U, Gather><<<grid_for(static_cast<size_t>(n) * units, kThreads), kThreads, 0, s>>>(
        static_cast<U*>(dst), static_cast<const U*>(src), idx, n, units, padded_rows);
  };
  if (both % 16 == 0) go(uint4{});
  else if (both % 8 == 0) go(uint2{});
  else if (both % 4 == 0) go(uint32_t{});
  else if (both % 2 == 0) go(uint16_t{});
  else go(uint8_t{});
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx, cudaStream_t s) {
  const int64_t cols = out.dim(-1), n = idx.dim(0);
  launch_row_copy<true>(out.data, in.data, idx.ptr<const int32_t>(), n, static_cast<size_t>(cols) * dtype_size(out.dtype),
                        cols ? static_cast<int64_t>(in.numel()) / cols : 0, s);
}

void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx, cudaStream_t s) {
  const int64_t cols = in.dim(-1), n = idx.dim(0);
  launch_row_copy<false>(out.data, in.data, idx.ptr<const int32_t>(), n, static_cast<size_t>(cols) * dtype_size(in.dtype),
                         cols ? static_cast<int64_t>(out.numel()) / cols : 0, s);
}

}  // namespace anatomy::cuda
