// Note [test memory cap] (tests/common/memory_cap.cpp): the cap is in place in every test
// process, and it stops an allocation past it with bad_alloc instead of letting it take the machine.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <new>
#include <vector>

TEST(MemoryCap, BoundsEveryTestProcess) {
  const char* env = std::getenv("ANATOMY_TEST_MEMORY_CAP_MB");
  const long mb = env ? std::atol(env) : ANATOMY_TEST_MEMORY_CAP_MB;
  if (mb <= 0) GTEST_SKIP() << "no cap in this run (ANATOMY_TEST_MEMORY_CAP_MB=0)";
  rlimit r{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &r), 0);
  EXPECT_EQ(r.rlim_cur, static_cast<rlim_t>(mb) << 20);
  EXPECT_THROW(std::vector<char>(static_cast<size_t>(mb) << 20), std::bad_alloc);
}
