// Built when the CUDA backend is off: the CPU engine still links and says why there is no GPU.
#include "ops/backend.h"

namespace anatomy {

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_pci_bus_id(int) { return {}; }

std::unique_ptr<Backend> make_cuda_backend(int) {
  fail("--device cuda: this build of anatomy has no CUDA backend (configure with -DANATOMY_CUDA=ON)");
}

}  // namespace anatomy
