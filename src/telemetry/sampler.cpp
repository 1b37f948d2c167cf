#include "telemetry/sampler.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

namespace anatomy {

void NvmlSampler::start() {
  if (!m_nvml.available() || m_run.exchange(true)) return;
  m_thread = std::thread([this] {
    std::ofstream out(m_path);
    const auto t0 = std::chrono::steady_clock::now();
    while (m_run.load()) {
      nlohmann::json j = {{"t_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
      if (auto m = m_nvml.memory(0)) j["gpu_memory_used_mb"] = m->used >> 20;
      if (auto u = m_nvml.utilization(0)) {
        j["gpu_util_pct"] = u->gpu;
        j["mem_util_pct"] = u->memory;
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

}  // namespace anatomy
