#include "core/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace anatomy {

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : std::numeric_limits<int64_t>::max();
  // A container's memory limit (cgroup v2, else v1) is what the process may really use: beyond
  // it the kernel kills the run rather than failing an allocation. "max" or a huge v1 figure
  // means no limit.
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit);
    long long v = 0;
    if (in >> v && v > 0) {
      bytes = std::min<int64_t>(bytes, v);
      break;
    }
  }
  return bytes;
}

}  // namespace anatomy
