#include "telemetry/nvml.h"

#include <dlfcn.h>
#include <sys/resource.h>

namespace anatomy {

namespace {
// The few NVML types and entry points we use (ABI as documented in nvml.h, v2 entry points).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
using InitFn = nvmlReturn_t (*)();
using HandleFn = nvmlReturn_t (*)(unsigned int, nvmlDevice_t*);
using MemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using UtilFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);
using NameFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using ClockFn = nvmlReturn_t (*)(nvmlDevice_t, int, unsigned int*);  // type NVML_CLOCK_SM = 1; MHz
using MilliwattFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);
using ReasonsFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);
using ByPciFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using IndexFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*);
constexpr int kClockSm = 1;
using ShutdownFn = nvmlReturn_t (*)();
}  // namespace

Nvml::Nvml() {
  m_lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!m_lib) {
    m_why = "libnvidia-ml.so.1 not found (no NVIDIA driver)";
    return;
  }
  auto init = reinterpret_cast<InitFn>(dlsym(m_lib, "nvmlInit_v2"));
  m_get_handle = dlsym(m_lib, "nvmlDeviceGetHandleByIndex_v2");
  m_get_memory = dlsym(m_lib, "nvmlDeviceGetMemoryInfo");
  m_get_util = dlsym(m_lib, "nvmlDeviceGetUtilizationRates");
  m_get_name = dlsym(m_lib, "nvmlDeviceGetName");
  m_get_clock = dlsym(m_lib, "nvmlDeviceGetClockInfo");
  m_get_max_clock = dlsym(m_lib, "nvmlDeviceGetMaxClockInfo");
  m_get_power = dlsym(m_lib, "nvmlDeviceGetPowerUsage");
  m_get_power_limit = dlsym(m_lib, "nvmlDeviceGetEnforcedPowerLimit");
  // Renamed from "throttle" to "event" reasons in driver 535; the old name stays exported.
  m_get_reasons = dlsym(m_lib, "nvmlDeviceGetCurrentClocksEventReasons");
  if (!m_get_reasons) m_get_reasons = dlsym(m_lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
  m_get_by_pci = dlsym(m_lib, "nvmlDeviceGetHandleByPciBusId_v2");
  m_get_index = dlsym(m_lib, "nvmlDeviceGetIndex");
  m_shutdown = dlsym(m_lib, "nvmlShutdown");
  if (!init || !m_get_handle || !m_get_memory) {
    m_why = "libnvidia-ml.so.1 lacks the expected entry points";
    return;
  }
  if (init() != 0) {
    m_why = "nvmlInit failed";
    return;
  }
  m_ok = true;
}

Nvml::~Nvml() {
  if (m_ok && m_shutdown) reinterpret_cast<ShutdownFn>(m_shutdown)();
  if (m_lib) dlclose(m_lib);
}

std::optional<GpuMemory> Nvml::memory(unsigned device) const {
  if (!m_ok) return std::nullopt;
  nvmlDevice_t h = nullptr;
  if (reinterpret_cast<HandleFn>(m_get_handle)(device, &h) != 0) return std::nullopt;
  nvmlMemory_t m{};
  if (reinterpret_cast<MemoryFn>(m_get_memory)(h, &m) != 0) return std::nullopt;
  return GpuMemory{m.total, m.free, m.used};
}

std::optional<GpuUtilization> Nvml::utilization(unsigned device) const {
  if (!m_ok || !m_get_util) return std::nullopt;
  nvmlDevice_t h = nullptr;
  if (reinterpret_cast<HandleFn>(m_get_handle)(device, &h) != 0) return std::nullopt;
  nvmlUtilization_t u{};
  if (reinterpret_cast<UtilFn>(m_get_util)(h, &u) != 0) return std::nullopt;
  return GpuUtilization{u.gpu, u.memory};
}

std::optional<GpuClocks> Nvml::clocks(unsigned device) const {
  if (!m_ok || !m_get_clock || !m_get_max_clock || !m_get_power || !m_get_power_limit || !m_get_reasons)
    return std::nullopt;
  nvmlDevice_t h = nullptr;
  if (reinterpret_cast<HandleFn>(m_get_handle)(device, &h) != 0) return std::nullopt;
  unsigned sm = 0, max_sm = 0, mw = 0, limit_mw = 0;
  unsigned long long reasons = 0;
  if (reinterpret_cast<ClockFn>(m_get_clock)(h, kClockSm, &sm) != 0 ||
      reinterpret_cast<ClockFn>(m_get_max_clock)(h, kClockSm, &max_sm) != 0 ||
      reinterpret_cast<MilliwattFn>(m_get_power)(h, &mw) != 0 ||
      reinterpret_cast<MilliwattFn>(m_get_power_limit)(h, &limit_mw) != 0 ||
      reinterpret_cast<ReasonsFn>(m_get_reasons)(h, &reasons) != 0)
    return std::nullopt;
  return GpuClocks{sm, max_sm, mw / 1000.0, limit_mw / 1000.0, reasons};
}

std::optional<unsigned> Nvml::index_of_pci_bus(const std::string& bus_id) const {
  if (!m_ok || !m_get_by_pci || !m_get_index || bus_id.empty()) return std::nullopt;
  nvmlDevice_t h = nullptr;
  unsigned index = 0;
  if (reinterpret_cast<ByPciFn>(m_get_by_pci)(bus_id.c_str(), &h) != 0 ||
      reinterpret_cast<IndexFn>(m_get_index)(h, &index) != 0)
    return std::nullopt;
  return index;
}

std::string Nvml::device_name(unsigned device) const {
  if (!m_ok || !m_get_name) return "unknown";
  nvmlDevice_t h = nullptr;
  char buf[96] = {};
  if (reinterpret_cast<HandleFn>(m_get_handle)(device, &h) != 0) return "unknown";
  if (reinterpret_cast<NameFn>(m_get_name)(h, buf, sizeof buf) != 0) return "unknown";
  return buf;
}

const Nvml& process_nvml() {
  static const Nvml nvml;
  return nvml;
}

uint64_t process_peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace anatomy
