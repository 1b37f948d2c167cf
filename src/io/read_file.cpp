#include "io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace anatomy {

namespace {

bool same_version(const struct stat& a, const struct stat& b) {
  return a.st_size == b.st_size && a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

}  // namespace

std::string read_regular_file(const std::string& path, const std::string& flag) {
  return detail::read_regular_file(path, flag, nullptr);
}

std::string detail::read_regular_file(const std::string& path, const std::string& flag, void (*after_chunk)()) {
  const std::string who = flag.empty() ? path : flag + " " + path;
  // O_NONBLOCK only for the open (a FIFO without a writer would block in it); reads of a
  // regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  ANATOMY_CHECK(fd >= 0, who, ": cannot open (", std::strerror(errno), ")");
  struct stat before {};
  const bool regular = ::fstat(fd, &before) == 0 && S_ISREG(before.st_mode);
  if (!regular) ::close(fd);
  ANATOMY_CHECK(regular, who, ": not a regular file (a FIFO, directory or device cannot be read as one)");
  std::string out;
  out.reserve(static_cast<size_t>(before.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      if (after_chunk) after_chunk();
      continue;
    }
    const int err = n < 0 ? errno : 0;
    struct stat after {};
    const bool unchanged = n < 0 || (::fstat(fd, &after) == 0 && same_version(before, after) &&
                                     out.size() == static_cast<size_t>(before.st_size));
    ::close(fd);
    ANATOMY_CHECK(n == 0, who, ": cannot read (", std::strerror(err), ")");
    // Note [files that change while read]: a file rewritten while it is read (a script
    // regenerating the data set) would give a mix of two versions, or a cut one, read as data.
    ANATOMY_CHECK(unchanged, who, ": the file changed while it was read (", before.st_size, " bytes when opened, ",
                  out.size(), " read); read it again once whatever writes it has finished");
    return out;
  }
}

}  // namespace anatomy
