#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace anatomy {
namespace {

std::string errno_str() { return std::strerror(errno); }

// "a/b/" -> "a/b": parent_path() and sibling names must not see a trailing slash.
std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string parent_dir(const std::string& path) {
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

void fsync_path(const std::string& path, int flags, std::string_view what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  ANATOMY_CHECK(fd >= 0, path, ": cannot open ", what, " to fsync: ", errno_str());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); nothing more can be done there.
  ANATOMY_CHECK(rc == 0 || err == EINVAL, path, ": fsync failed: ", std::strerror(err));
}

}  // namespace

void fsync_parent_dir(const std::string& path) {
  fsync_path(parent_dir(strip_trailing_slashes(path)), O_RDONLY | O_DIRECTORY, "directory");
}

// ---- AtomicFile --------------------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : m_path(strip_trailing_slashes(std::move(path))) {
  ANATOMY_CHECK(!m_path.empty(), "cannot write a file with an empty path");
  std::vector<char> tmpl(m_path.begin(), m_path.end());
  for (char c : std::string_view(".tmp-XXXXXX")) tmpl.push_back(c);
  tmpl.push_back('\0');
  m_fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  ANATOMY_CHECK(m_fd >= 0, m_path, ": cannot create a temporary file next to it: ", errno_str());
  m_tmp = tmpl.data();
  // mkstemp makes 0600; a saved model or config should be readable like any other output.
  ::fchmod(m_fd, 0644);
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : m_path(std::move(o.m_path)), m_tmp(std::move(o.m_tmp)), m_fd(o.m_fd), m_committed(o.m_committed) {
  o.m_fd = -1;
  o.m_committed = true;  // the moved-from object owns nothing to clean up
}

AtomicFile::~AtomicFile() {
  if (m_fd >= 0) ::close(m_fd);
  if (!m_committed && !m_tmp.empty()) ::unlink(m_tmp.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  ANATOMY_CHECK(m_fd >= 0 && !m_committed, m_path, ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(m_fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ANATOMY_CHECK(w > 0, m_path, ": write failed: ", w < 0 ? errno_str() : std::string("wrote 0 bytes"));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  ANATOMY_CHECK(m_fd >= 0 && !m_committed, m_path, ": commit called twice");
  ANATOMY_CHECK(::fsync(m_fd) == 0, m_path, ": fsync failed: ", errno_str());
  int rc = ::close(m_fd);
  m_fd = -1;
  ANATOMY_CHECK(rc == 0, m_path, ": close failed: ", errno_str());
  ANATOMY_CHECK(::rename(m_tmp.c_str(), m_path.c_str()) == 0, m_path, ": cannot rename ", m_tmp,
                " into place: ", errno_str());
  m_committed = true;
  fsync_parent_dir(m_path);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

// ---- AtomicDir ---------------------------------------------------------------------------

AtomicDir::AtomicDir(std::string path) : m_path(strip_trailing_slashes(std::move(path))) {
  ANATOMY_CHECK(!m_path.empty(), "cannot write a directory with an empty path");
  std::error_code ec;
  auto st = fs::status(m_path, ec);
  ANATOMY_CHECK(!fs::exists(st) || fs::is_directory(st), m_path,
                ": exists and is not a directory; refusing to replace it");
  fs::create_directories(parent_dir(m_path), ec);
  ANATOMY_CHECK(!ec, m_path, ": cannot create its parent directory: ", ec.message());
  std::vector<char> tmpl(m_path.begin(), m_path.end());
  for (char c : std::string_view(".tmp-XXXXXX")) tmpl.push_back(c);
  tmpl.push_back('\0');
  ANATOMY_CHECK(::mkdtemp(tmpl.data()) != nullptr, m_path,
                ": cannot create a staging directory next to it: ", errno_str());
  m_staging = tmpl.data();
  ::chmod(m_staging.c_str(), 0755);
}

AtomicDir::AtomicDir(AtomicDir&& o) noexcept
    : m_path(std::move(o.m_path)), m_staging(std::move(o.m_staging)), m_committed(o.m_committed) {
  o.m_committed = true;
}

AtomicDir::~AtomicDir() {
  if (m_committed || m_staging.empty()) return;
  std::error_code ec;
  fs::remove_all(m_staging, ec);  // best effort; destructors never throw
}

std::string AtomicDir::file(std::string_view name) const { return m_staging + "/" + std::string(name); }

void AtomicDir::commit() {
  ANATOMY_CHECK(!m_committed, m_path, ": commit called twice");
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(m_staging, ec)) {
    if (e.is_regular_file()) fsync_path(e.path().string(), O_RDONLY, "file");
    else if (e.is_directory()) fsync_path(e.path().string(), O_RDONLY | O_DIRECTORY, "directory");
  }
  ANATOMY_CHECK(!ec, m_staging, ": cannot list the staging directory: ", ec.message());
  fsync_path(m_staging, O_RDONLY | O_DIRECTORY, "directory");

  auto st = fs::symlink_status(m_path, ec);
  if (!fs::exists(st)) {
    ANATOMY_CHECK(::rename(m_staging.c_str(), m_path.c_str()) == 0, m_path, ": cannot rename ", m_staging,
                  " into place: ", errno_str());
    m_committed = true;
    fsync_parent_dir(m_path);
    return;
  }
  ANATOMY_CHECK(fs::is_directory(st), m_path, ": exists and is not a directory; refusing to replace it");

  // One atomic swap: afterwards m_staging holds the old directory.
  if (::renameat2(AT_FDCWD, m_staging.c_str(), AT_FDCWD, m_path.c_str(), RENAME_EXCHANGE) == 0) {
    m_committed = true;
    fsync_parent_dir(m_path);
    fs::remove_all(m_staging, ec);
    ANATOMY_CHECK(!ec, m_staging, ": cannot remove the replaced directory: ", ec.message());
    return;
  }
  ANATOMY_CHECK(errno == EINVAL || errno == ENOSYS, m_path, ": cannot swap in ", m_staging, ": ",
                errno_str());

  // No RENAME_EXCHANGE here: move the old one aside, then move the new one in. A crash between
  // the two renames leaves the old directory at "<path>.old-XXXXXX" and the new one staged.
  std::vector<char> tmpl(m_path.begin(), m_path.end());
  for (char c : std::string_view(".old-XXXXXX")) tmpl.push_back(c);
  tmpl.push_back('\0');
  ANATOMY_CHECK(::mkdtemp(tmpl.data()) != nullptr, m_path, ": cannot reserve a name for the old directory: ",
                errno_str());
  std::string old = tmpl.data();
  ANATOMY_CHECK(::rename(m_path.c_str(), old.c_str()) == 0, m_path, ": cannot move the old directory aside: ",
                errno_str());
  if (::rename(m_staging.c_str(), m_path.c_str()) != 0) {
    int err = errno;
    ::rename(old.c_str(), m_path.c_str());  // put the old one back
    fail(m_path, ": cannot rename ", m_staging, " into place: ", std::strerror(err));
  }
  m_committed = true;
  fsync_parent_dir(m_path);
  fs::remove_all(old, ec);
  ANATOMY_CHECK(!ec, old, ": cannot remove the replaced directory: ", ec.message());
}

}  // namespace anatomy
