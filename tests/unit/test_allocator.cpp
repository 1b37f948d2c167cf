#include <gtest/gtest.h>

#include "memory/allocator.h"

using namespace anatomy;

TEST(Allocator, TracksCurrentAndPeakPerCategory) {
  CpuAllocator a;
  {
    Buffer w(a, DType::F32, Shape{1000}, Category::Weights);
    Buffer g(a, DType::F32, Shape{500}, Category::Gradients);
    EXPECT_EQ(a.stats().per_category[int(Category::Weights)].current, 4000);
    EXPECT_EQ(a.stats().per_category[int(Category::Gradients)].current, 2000);
    { Buffer t(a, DType::BF16, Shape{10, 10}, Category::Temporary); }
    EXPECT_EQ(a.stats().per_category[int(Category::Temporary)].current, 0);
    EXPECT_EQ(a.stats().per_category[int(Category::Temporary)].peak, 200);
    EXPECT_EQ(a.stats().total.current, 6000);
  }
  EXPECT_EQ(a.stats().total.current, 0);
  EXPECT_EQ(a.stats().total.peak, 6200);
}

TEST(Allocator, OutOfMemoryIsAnErrorWithTheTable) {
  CpuAllocator a;
  a.set_limit(1 << 20);
  Buffer w(a, DType::F32, Shape{1000}, Category::Weights);
  try {
    Buffer big(a, DType::F32, Shape{1 << 20}, Category::Activations);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory"), std::string::npos);
    EXPECT_NE(m.find("weights"), std::string::npos);
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_EQ(a.stats().per_category[int(Category::Activations)].current, 0);
}

TEST(Arena, CarvesAlignedAndResets) {
  CpuAllocator a;
  Arena ar(a, 4096, Category::Activations);
  Tensor x = ar.take(DType::F32, Shape{3});
  Tensor y = ar.take(DType::F32, Shape{3});
  EXPECT_EQ(static_cast<char*>(y.data) - static_cast<char*>(x.data), 256);
  EXPECT_THROW(ar.take(DType::F32, Shape{2000}), Error);
  ar.reset_to(0);
  EXPECT_EQ(ar.take(DType::F32, Shape{3}).data, x.data);
}
