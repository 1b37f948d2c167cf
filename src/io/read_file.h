// Reading a whole small file a user named (config.json, a tokenizer's vocabulary): one that is
// not a regular file is refused at once, naming it, instead of being read. Opening a FIFO for
// reading would otherwise wait for a writer forever; a directory or a device is no JSON.
#pragma once
#include <string>

namespace anatomy {

// The file's bytes. Errors are one line beginning with `path`: "cannot open (No such file or
// directory)", "not a regular file (a FIFO, directory or device)", "cannot read (...)".
std::string read_regular_file(const std::string& path);

}  // namespace anatomy
