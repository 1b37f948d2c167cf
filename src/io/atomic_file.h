// Crash-safe writes: a file or a directory appears at its final path whole, or not at all.
//
// Note [Atomic replace]: we write into a temporary sibling (same directory, so the same file
// system), fsync its contents, rename(2) it over the target, then fsync the parent directory so
// the rename itself is durable. A crash at any point leaves either the old target or the new
// one, plus perhaps a stale "*.tmp-XXXXXX" sibling that the next write ignores.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace anatomy {

// A file that appears at `path` only on commit(). Move-only; destroying an uncommitted
// AtomicFile removes its temporary file and leaves `path` untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, close, rename over `path`, fsync the directory. Call once.
  void commit();

  const std::string& path() const { return m_path; }
  const std::string& temp_path() const { return m_tmp; }

 private:
  std::string m_path;
  std::string m_tmp;
  int m_fd = -1;
  bool m_committed = false;
};

// Writes `contents` to `path` atomically.
void write_file_atomic(const std::string& path, std::string_view contents);

// A directory that appears at `path` only on commit(), replacing an existing directory there
// in one step (renameat2 RENAME_EXCHANGE; two renames where the file system lacks it).
// Write the files into staging(); an uncommitted AtomicDir removes its staging directory.
class AtomicDir {
 public:
  explicit AtomicDir(std::string path);
  ~AtomicDir();
  AtomicDir(AtomicDir&& o) noexcept;
  AtomicDir& operator=(AtomicDir&&) = delete;
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& staging() const { return m_staging; }
  // staging() + "/" + name
  std::string file(std::string_view name) const;
  // fsyncs every regular file in staging and staging itself, swaps it into place, removes the
  // old directory, fsyncs the parent. Call once.
  void commit();

  const std::string& path() const { return m_path; }

 private:
  std::string m_path;
  std::string m_staging;
  bool m_committed = false;
};

// fsyncs the directory holding `path` (so a rename or create there is durable).
void fsync_parent_dir(const std::string& path);

}  // namespace anatomy
