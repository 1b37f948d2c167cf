// Note [test memory cap]
// Every unit test runs under an address-space limit (RLIMIT_AS), so a test that goes wrong by
// allocating (a runaway buffer, GoogleTest diffing two large strings) fails with bad_alloc in
// its own process instead of taking the machine, and the CLI processes a test starts inherit the
// limit. The cap is compiled in (ANATOMY_TEST_MEMORY_CAP_MB, a CMake cache variable chosen from
// the measured peaks, see CMakeLists.txt) and can be changed for one run with the environment
// variable of the same name (0: no cap, e.g. where a CUDA driver reserves address space). It is
// the soft limit: a test that starts a program known to reserve address space it never touches
// (headless Chromium) raises it for that program alone.
//
// With ANATOMY_TEST_PEAK_LOG set, each test process appends one line when it ends: the tests it
// ran (its --gtest_filter, one test under ctest), its peak resident and virtual memory, and the
// largest peak resident memory of the processes it started (scripts/test.sh prints the largest).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#ifndef ANATOMY_TEST_MEMORY_CAP_MB
#define ANATOMY_TEST_MEMORY_CAP_MB 0
#endif

namespace {

long status_kb(const char* field) {  // a "VmPeak:"-style line of /proc/self/status, in kB
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + key.size());
  return -1;
}

class PeakLog : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* path = std::getenv("ANATOMY_TEST_PEAK_LOG");
    if (!path || !*path) return;
    rusage children{};
    getrusage(RUSAGE_CHILDREN, &children);
    char line[1024];
    std::snprintf(line, sizeof line, "%s rss_kb %ld vm_kb %ld children_rss_kb %ld\n",
                  ::testing::GTEST_FLAG(filter).c_str(), status_kb("VmHWM"), status_kb("VmPeak"), children.ru_maxrss);
    if (FILE* f = std::fopen(path, "a")) {  // one short write in append mode: whole lines under ctest -j
      std::fputs(line, f);
      std::fclose(f);
    }
  }
};

long cap_mb() {
  if (const char* env = std::getenv("ANATOMY_TEST_MEMORY_CAP_MB")) return std::atol(env);
  return ANATOMY_TEST_MEMORY_CAP_MB;
}

const bool kInstalled = [] {
  if (const long mb = cap_mb(); mb > 0) {
    rlimit r{};
    getrlimit(RLIMIT_AS, &r);
    r.rlim_cur = static_cast<rlim_t>(mb) << 20;  // the soft limit; the hard one stays as it was
    if (r.rlim_max != RLIM_INFINITY && r.rlim_cur > r.rlim_max) r.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_AS, &r) != 0) std::perror("memory cap: setrlimit(RLIMIT_AS)");
  }
  ::testing::AddGlobalTestEnvironment(new PeakLog);
  return true;
}();

}  // namespace
