#include "io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace anatomy {

std::string read_regular_file(const std::string& path) {
  // O_NONBLOCK only for the open (a FIFO without a writer would block in it); reads of a
  // regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  ANATOMY_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!regular) ::close(fd);
  ANATOMY_CHECK(regular, path, ": not a regular file (a FIFO, directory or device cannot be read as one)");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      ANATOMY_CHECK(n == 0, path, ": cannot read (", std::strerror(err), ")");
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace anatomy
