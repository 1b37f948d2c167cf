// The factory for the CUDA backend (cuda_available() lives in device.cu).
#include "ops/backend.h"
#include "ops/cuda/cuda_backend.h"

namespace anatomy {

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  ANATOMY_CHECK(cuda_available(), "--device cuda: no CUDA device is visible to this process");
  return std::make_unique<cuda::CudaBackend>(device_index);
}

}  // namespace anatomy
