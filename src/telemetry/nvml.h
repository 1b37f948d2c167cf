// NVML, loaded at run time (dlopen of the driver's libnvidia-ml.so.1), so the binary builds and
// runs where there is no driver. "GPU memory occupied" is NVML's used memory of the device:
// the number nvidia-smi shows, as the seed page reads it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace anatomy {

struct GpuMemory {
  uint64_t total = 0, free = 0, used = 0;  // bytes
};
struct GpuUtilization {
  unsigned gpu = 0, memory = 0;  // percent over the last sample period
};
// The SM clock, the board's power and why the clock is below its maximum (NVML's clocks event
// reasons, a bit mask: kClockPowerCap... in telemetry/clocks.h).
struct GpuClocks {
  unsigned sm_mhz = 0, max_sm_mhz = 0;
  double power_w = 0, power_limit_w = 0;
  uint64_t reasons = 0;
};

class Nvml {
 public:
  // Loads the library and initializes it; available() is false when either fails.
  Nvml();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return m_ok; }
  const std::string& why_unavailable() const { return m_why; }
  std::optional<GpuMemory> memory(unsigned device = 0) const;
  std::optional<GpuUtilization> utilization(unsigned device = 0) const;
  // nullopt when the driver lacks one of the five queries or refuses one.
  std::optional<GpuClocks> clocks(unsigned device = 0) const;
  std::string device_name(unsigned device = 0) const;
  // NVML's index of the board at PCI bus id `bus_id` (cuda_pci_bus_id's form); nullopt when
  // NVML does not know it.
  std::optional<unsigned> index_of_pci_bus(const std::string& bus_id) const;

 private:
  void* m_lib = nullptr;
  bool m_ok = false;
  std::string m_why;
  void* m_get_handle = nullptr;
  void* m_get_memory = nullptr;
  void* m_get_util = nullptr;
  void* m_get_name = nullptr;
  void* m_get_clock = nullptr;
  void* m_get_max_clock = nullptr;
  void* m_get_power = nullptr;
  void* m_get_power_limit = nullptr;
  void* m_get_reasons = nullptr;
  void* m_get_by_pci = nullptr;
  void* m_get_index = nullptr;
  void* m_shutdown = nullptr;
};

// The process's one NVML, loaded on first use and kept to the end (readers share it).
const Nvml& process_nvml();

// Peak resident set size of this process in bytes (getrusage), for CPU runs.
uint64_t process_peak_rss_bytes();

}  // namespace anatomy
