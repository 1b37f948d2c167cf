#include <gtest/gtest.h>

#include "ops/backend.h"

TEST(CudaDevice, BackendStartsWhenADeviceIsPresent) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = anatomy::make_cuda_backend(0);
  EXPECT_EQ(be->device(), anatomy::Device::CUDA);
}
