// A background thread that samples NVML during training: memory used and utilization (one JSON
// line per sample to a file), and the SM clock, power and clock event reasons, kept in memory for
// the run's summary (Note [clock and power]).
#pragma once
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/clocks.h"
#include "telemetry/nvml.h"

namespace anatomy {

class NvmlSampler {
 public:
  NvmlSampler(const Nvml& nvml, std::string path, double period_s, unsigned device = 0)
      : m_nvml(nvml), m_path(std::move(path)), m_period(period_s), m_device(device) {}
  ~NvmlSampler() { stop(); }
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;
  void start();
  void stop();
  // The clock samples so far (a copy: the thread may still be adding).
  std::vector<ClockSample> clock_samples() const;

 private:
  const Nvml& m_nvml;
  std::string m_path;
  double m_period;
  unsigned m_device;
  std::atomic<bool> m_run{false};
  std::thread m_thread;
  mutable std::mutex m_mutex;
  std::vector<ClockSample> m_clocks;
};

}  // namespace anatomy
