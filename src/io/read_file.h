// Reading a whole file a user named (config.json, a tokenizer's vocabulary, a data set): one that
// is not a regular file is refused at once, naming it, instead of being read. Opening a FIFO for
// reading would otherwise wait for a writer forever; a directory or a device is no JSON. The file
// is read, not memory-mapped: one cut short by another process meanwhile would end a mapping's
// reader with SIGBUS, and here it is an error naming it (Note [files that change while read]).
#pragma once
#include <string>

namespace anatomy {

// The file's bytes. Errors are one line beginning with `path` (after `flag` when one is given):
// "cannot open (No such file or directory)", "not a regular file (a FIFO, directory or device)",
// "cannot read (...)", "the file changed while it was read".
std::string read_regular_file(const std::string& path, const std::string& flag = "");

namespace detail {
// The same, calling `after_chunk` (when not null) after each chunk read: the tests change the
// file there.
std::string read_regular_file(const std::string& path, const std::string& flag, void (*after_chunk)());
}  // namespace detail

}  // namespace anatomy
