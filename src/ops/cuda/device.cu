// Device discovery for the CUDA backend.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "ops/backend.h"
#include "ops/cuda/common.cuh"

namespace anatomy {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_pci_bus_id(int device) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return id;
}

bool cuda_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: leave no sticky error behind
    return false;
  }
  return n > 0;
}

namespace cuda {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

int sm_count() {
  constexpr int kMaxDevices = 64;
  static thread_local int cached[kMaxDevices] = {};
  int dev = 0;
  ANATOMY_CUDA_CHECK(cudaGetDevice(&dev));
  int n = dev < kMaxDevices ? cached[dev] : 0;
  if (n == 0) {
    ANATOMY_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev < kMaxDevices) cached[dev] = n;
  }
  return n;
}

}  // namespace cuda

}  // namespace anatomy
