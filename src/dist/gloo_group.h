// The CPU process group: Gloo's TCP transport between processes, rendezvous through rank 0's
// TcpStore (dist/bootstrap.h), failures through its watch (Note [failure watch]).
#pragma once
#include <memory>

#include "dist/communicator.h"

namespace anatomy {

struct LaunchEnv;

// A communicator of env.world_size processes (one when not launched: no sockets at all).
std::unique_ptr<Communicator> make_gloo_group(const LaunchEnv& env);

}  // namespace anatomy
