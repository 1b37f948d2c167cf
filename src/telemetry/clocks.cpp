#include "telemetry/clocks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace anatomy {

double sampler_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::optional<ClockSummary> summarize_clocks(const std::vector<ClockSample>& samples, double from_s, double to_s) {
  std::vector<double> sm, power;
  ClockSummary s;
  for (const ClockSample& x : samples) {
    if (x.t_s < from_s || x.t_s > to_s) continue;
    sm.push_back(x.c.sm_mhz);
    power.push_back(x.c.power_w);
    s.sm_max_mhz = std::max(s.sm_max_mhz, static_cast<double>(x.c.max_sm_mhz));
    s.power_limit_w = std::max(s.power_limit_w, x.c.power_limit_w);
    if (x.c.reasons & (kClockPowerCap | kClockPowerBrake)) s.power_capped += 1;
    if (x.c.reasons & (kClockSwThermal | kClockHwThermal)) s.thermal += 1;
  }
  if (sm.empty()) return std::nullopt;
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  s.samples = static_cast<int>(sm.size());
  s.sm_median_mhz = median(sm);
  s.power_median_w = median(power);
  s.power_capped /= s.samples;
  s.thermal /= s.samples;
  return s;
}

std::string clock_summary_line(const ClockSummary& s) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf,
                        "SM clock %.0f MHz median (max %.0f), power %.0f W median of a %.0f W limit; power cap on "
                        "%.0f%% of the samples",
                        s.sm_median_mhz, s.sm_max_mhz, s.power_median_w, s.power_limit_w, 100.0 * s.power_capped);
  if (s.thermal > 0)
    std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), ", thermal slowdown on %.0f%%", 100.0 * s.thermal);
  return buf;
}

}  // namespace anatomy
