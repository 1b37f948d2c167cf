#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

#include "ops/backend.h"
#include "telemetry/nvml.h"
#include "train/setup.h"

TEST(CudaDevice, BackendStartsWhenADeviceIsPresent) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = anatomy::make_cuda_backend(0);
  EXPECT_EQ(be->device(), anatomy::Device::CUDA);
}

// Each CUDA device is found in NVML by its PCI bus id (nvml_index_of): the board NVML names at
// that index is the one CUDA names. (Their total memories differ: NVML counts what the driver
// reserves, 143771 against 143155 MiB on an H200.)
TEST(CudaDevice, NvmlFindsEachCudaDeviceByItsPciBusId) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  anatomy::Nvml nvml;
  if (!nvml.available()) GTEST_SKIP() << nvml.why_unavailable();
  for (int d = 0; d < anatomy::cuda_device_count(); ++d) {
    SCOPED_TRACE("CUDA device " + std::to_string(d));
    const std::string bus = anatomy::cuda_pci_bus_id(d);
    ASSERT_FALSE(bus.empty());
    const auto index = nvml.index_of_pci_bus(bus);
    ASSERT_TRUE(index.has_value()) << "NVML does not know PCI bus " << bus;
    EXPECT_EQ(anatomy::nvml_index_of(d), *index);
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    EXPECT_EQ(nvml.device_name(*index), std::string(prop.name));
    EXPECT_TRUE(nvml.memory(*index).has_value());
  }
  EXPECT_TRUE(anatomy::cuda_pci_bus_id(anatomy::cuda_device_count()).empty()) << "a device past the last has no bus id";
}
