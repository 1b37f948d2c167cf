// Builds without CUDA: no NCCL group, said plainly.
#include "core/error.h"
#include "dist/communicator.h"
#include "dist/launch.h"

namespace anatomy {

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Backend*>&) {
  fail("--nproc-per-node: this build has no CUDA, so no NCCL (use --device cpu for an in-process group)");
}

std::unique_ptr<Communicator> make_nccl_process_group(const LaunchEnv&, Backend&) {
  fail("a CUDA process group: this build has no CUDA, so no NCCL (use --device cpu: Gloo)");
}

}  // namespace anatomy
