#include "telemetry/sampler.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

namespace anatomy {

void NvmlSampler::start() {
  if (!m_nvml.available() || m_run.exchange(true)) return;
  m_thread = std::thread([this] {
    std::ofstream out(m_path);
    const double t0 = sampler_now_s();
    while (m_run.load()) {
      const double now = sampler_now_s();
      nlohmann::json j = {{"t_s", now - t0}};
      if (auto m = m_nvml.memory(m_device)) j["gpu_memory_used_mb"] = m->used >> 20;
      if (auto u = m_nvml.utilization(m_device)) {
        j["gpu_util_pct"] = u->gpu;
        j["mem_util_pct"] = u->memory;
      }
      if (auto c = m_nvml.clocks(m_device)) {
        j["sm_clock_mhz"] = c->sm_mhz;
        j["power_w"] = c->power_w;
        j["clock_event_reasons"] = c->reasons;
        std::lock_guard<std::mutex> lock(m_mutex);
        m_clocks.push_back({now, *c});
      }
      out << j.dump() << "\n" << std::flush;
      std::this_thread::sleep_for(std::chrono::duration<double>(m_period));
    }
  });
}

void NvmlSampler::stop() {
  m_run.store(false);
  if (m_thread.joinable()) m_thread.join();
}

std::vector<ClockSample> NvmlSampler::clock_samples() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_clocks;
}

}  // namespace anatomy
