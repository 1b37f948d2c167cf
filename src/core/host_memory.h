#pragma once

#include <cstdint>

namespace anatomy {

// Memory this process may use in bytes: the machine's physical memory, or its container's
// (cgroup) limit when lower; int64 max when unknown.
int64_t host_memory_bytes();

}  // namespace anatomy
