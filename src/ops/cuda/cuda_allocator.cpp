#include "ops/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include "ops/cuda/check.h"

namespace anatomy::cuda {

DeviceMemory device_memory() {
  DeviceMemory m;
  ANATOMY_CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

void* CudaAllocator::raw_allocate(size_t bytes) {
  // Allocations are rare (once per run, Note [allocation policy]), so selecting the device each
  // time costs nothing and keeps a multi-GPU process from allocating on the wrong one.
  ANATOMY_CUDA_CHECK(cudaSetDevice(m_device));
  void* p = nullptr;
  cudaError_t s = cudaMalloc(&p, bytes);
  if (s == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // clear the sticky-until-read error so the next launch check is clean
    return nullptr;
  }
  ANATOMY_CUDA_CHECK(s);
  return p;
}

void CudaAllocator::raw_deallocate(void* p) noexcept {
  (void)cudaSetDevice(m_device);
  (void)cudaFree(p);  // destructors never throw; a failing free means the context is already gone
}

std::string CudaAllocator::oom_hint(size_t bytes) const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return str_cat("cudaMalloc of ", bytes, " bytes failed on device ", m_device);
  }
  return str_cat("cudaMalloc of ", bytes / 1048576.0, " MiB failed on device ", m_device, " with ",
                 free / 1048576.0, " MiB free of ", total / 1048576.0, " MiB");
}

}  // namespace anatomy::cuda
