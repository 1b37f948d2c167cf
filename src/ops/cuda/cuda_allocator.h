// The device allocator: cudaMalloc/cudaFree behind the tagged Allocator, so every device byte is
// counted in its Category. Out-of-memory comes back as nullptr (Allocator::allocate turns it into
// an anatomy::Error carrying the per-category table), never as an abort.
#pragma once
#include <cstddef>

#include "memory/allocator.h"

namespace anatomy::cuda {

// Free and total bytes of the current device as cudaMemGetInfo reports them (the CUDA context
// and other processes' allocations are already subtracted from free).
struct DeviceMemory {
  size_t free = 0, total = 0;
};
DeviceMemory device_memory();

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : m_device(device) {}
  Device device() const override { return Device::CUDA; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_deallocate(void* p) noexcept override;
  std::string oom_hint(size_t bytes) const override;

 private:
  int m_device;
};

}  // namespace anatomy::cuda
