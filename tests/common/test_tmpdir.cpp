// Each build's unit tests keep their files under that build (<build>/test_tmp/), not in a /tmp
// shared by every build on the machine: GoogleTest's TempDir() reads TEST_TMPDIR, set here at
// process start unless the caller set it. Two suites running at once (two checkouts, or CI beside
// a developer's build) then never remove or overwrite each other's directories.
#include <sys/stat.h>

#include <cstdlib>

namespace {

const bool kTestTmpdirSet = [] {
  if (std::getenv("TEST_TMPDIR") == nullptr) {
    ::mkdir(ANATOMY_TEST_TMPDIR, 0755);  // exists already after the first test: fine
    ::setenv("TEST_TMPDIR", ANATOMY_TEST_TMPDIR "/", 0);
  }
  return true;
}();

}  // namespace
