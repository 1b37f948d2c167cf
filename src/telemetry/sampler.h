// A background thread that samples NVML (memory used, utilization) during training and
// appends one JSON line per sample to a file.
#pragma once
#include <atomic>
#include <string>
#include <thread>

#include "telemetry/nvml.h"

namespace anatomy {

class NvmlSampler {
 public:
  NvmlSampler(const Nvml& nvml, std::string path, double period_s) : m_nvml(nvml), m_path(std::move(path)), m_period(period_s) {}
  ~NvmlSampler() { stop(); }
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;
  void start();
  void stop();

 private:
  const Nvml& m_nvml;
  std::string m_path;
  double m_period;
  std::atomic<bool> m_run{false};
  std::thread m_thread;
};

}  // namespace anatomy
