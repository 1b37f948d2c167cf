// `--nproc-per-node N` without a launcher: this process becomes torchrun's agent for one node.
// It starts N copies of a command with torchrun's environment, forwards SIGINT/SIGTERM to them,
// and when one fails ends the others.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "dist/launch.h"

namespace anatomy {

struct SpawnOptions {
  int nproc = 1;
  std::vector<std::string> argv;  // argv[0]: the program (a path; "/proc/self/exe" for this one)
  std::chrono::milliseconds settle{std::chrono::seconds(2)};  // a failure to SIGTERM of the rest
  std::chrono::milliseconds grace{std::chrono::seconds(5)};   // SIGTERM to SIGKILL
};

// Runs the N processes to their end. Each gets RANK = LOCAL_RANK = r, WORLD_SIZE =
// LOCAL_WORLD_SIZE = N, MASTER_ADDR = 127.0.0.1 and a free MASTER_PORT. Returns 0 when every
// process exited 0; else the status of the first that failed (128 + signal for a killed one),
// after ending the others (those still running after `settle` get SIGTERM, then SIGKILL
// after `grace`). Their output is this
// process's: each rank's error line appears as it prints it.
int spawn_local(const SpawnOptions& opt);

// What `anatomy train` does with its processes. Under a launcher (RANK, OMPI_COMM_WORLD_RANK or
// SLURM_PROCID set): rank_main(its environment), after checking --nproc-per-node against the
// launcher's processes per node. Without one, and with nproc_per_node > 1 and spawn: this
// process spawns nproc_per_node copies of itself (same arguments) and returns their status.
// Otherwise rank_main of a group of one.
int run_ranks(int nproc_per_node, char** argv, const std::function<int(const LaunchEnv&)>& rank_main, bool spawn);

// A TCP port on 127.0.0.1 that nothing listens on right now.
int free_local_port();

}  // namespace anatomy
