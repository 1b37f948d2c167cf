// Which rank this process is, read from the launcher that started it (torchrun, mpirun, srun,
// or `anatomy train --nproc-per-node N`, which sets torchrun's variables), and the process group
// built from it: Gloo on the CPU, NCCL on CUDA, both rendezvousing through dist/bootstrap.h.
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "dist/communicator.h"

namespace anatomy {

class Backend;

struct LaunchEnv {
  std::string launcher = "none";  // none, torchrun, mpirun or srun
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // MASTER_PORT as the launcher gave it
  int bootstrap_port = 0;  // where rank 0's store listens: Note [bootstrap port]
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // ANATOMY_DIST_TIMEOUT (seconds)
  bool by_anatomy = false;  // a rank `anatomy train --nproc-per-node N` started (ANATOMY_NPROC_AGENT)
  bool torchrun_agent = false;  // torchrun's agent started it (TORCHELASTIC_RUN_ID), not variables set by hand
  bool launched() const { return launcher != "none"; }
};

// Reads the process environment. Throws a one-line Error naming the variable when a launcher's
// variables are inconsistent (a rank outside the world, a missing MASTER_ADDR, ...).
LaunchEnv detect_launch();
// The same, from an explicit set of variables (tests).
LaunchEnv detect_launch(const std::map<std::string, std::string>& env);

// The group of this process: Gloo over TCP for a CPU backend, NCCL on the backend's stream for
// CUDA (device LOCAL_RANK). Collective order and determinism: Note [process group sums] in
// dist/gloo_group.cpp. A launch of world size 1 still gets a group (of one).
std::unique_ptr<Communicator> make_process_group(const LaunchEnv& env, Backend& backend);

// Note [failure before the group]: this process, rank env.rank of an srun or torchrun job, failed
// with `error` before joining its group: the ranks that wait for it are told and end with the
// error instead of waiting out the rendezvous timeout. Rank 0 serves the store that tells them
// until each has seen it; another rank tells rank 0's store once it answers; either for at most
// TcpStore::kTellFailureFor (or the timeout, if shorter). Never throws; a store it cannot reach
// leaves the others to their timeout, as before.
void tell_group_of_failure(const LaunchEnv& env, const std::string& error) noexcept;

// The NCCL half (dist/nccl_group.cpp; nccl_stub.cpp without CUDA).
std::unique_ptr<Communicator> make_nccl_process_group(const LaunchEnv& env, Backend& backend);

}  // namespace anatomy
