// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include "ops/backend.h"

namespace anatomy {

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace anatomy
