// Shared by the fuzz targets: loaders that only take a path get the input through a memfd, so no
// file is ever written to disk and each input costs two syscalls.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace anatomy::fuzz {

// An anonymous in-memory file holding the input, named by its /proc/self/fd path.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    m_fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (m_fd < 0) std::abort();
    size_t done = 0;
    while (done < size) {
      ssize_t w = ::write(m_fd, data + done, size - done);
      if (w <= 0) std::abort();
      done += static_cast<size_t>(w);
    }
    m_path = "/proc/self/fd/" + std::to_string(m_fd);
  }
  ~MemFile() { ::close(m_fd); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return m_path; }

 private:
  int m_fd = -1;
  std::string m_path;
};

}  // namespace anatomy::fuzz

// A broken invariant is a finding: abort so libFuzzer records the input.
#define FUZZ_EXPECT(cond)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
