// The SM clock and board power of the steady steps, from NVML samples (NvmlSampler in
// telemetry/sampler.h), summarized for the run's summary and train_results.json.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "telemetry/nvml.h"

namespace anatomy {

// NVML's clocks event reasons (nvmlClocksEventReason*): why the clock is below its maximum.
inline constexpr uint64_t kClockPowerCap = 0x4, kClockHwSlowdown = 0x8, kClockSwThermal = 0x20,
                          kClockHwThermal = 0x40, kClockPowerBrake = 0x80;

struct ClockSample {
  double t_s = 0;  // steady_clock seconds (sampler_now_s)
  GpuClocks c;
};

// Note [clock and power]
// A GPU at its board power limit lowers its SM clock until it draws no more. The profiler's
// ceilings and each op's timing come from short bursts at whatever clock the device holds then;
// a long run of dense products can hold the limit and run every op at a lower clock. bert-large
// bf16 batch 32 on an H200 (700 W) did: anatomy's steady steps at 1725 MHz median against the
// PyTorch loop's 1965 of 1980, both at ~690 W with the power cap raised
// (bench/results/2026-11-28-h200/session26/call1-tests-power/power.md). So the summary reports the
// clock and power of the steady steps (the second half, the steps steady samples/s counts): a
// faster kernel that draws more power may make the step no faster there.
struct ClockSummary {
  int samples = 0;
  double sm_median_mhz = 0, sm_max_mhz = 0, power_median_w = 0, power_limit_w = 0;
  // Shares of the samples with the software power cap or the hardware power brake raised, and
  // with a thermal slowdown raised.
  double power_capped = 0, thermal = 0;
};
// Over the samples with from_s <= t_s <= to_s; nullopt when there are none.
std::optional<ClockSummary> summarize_clocks(const std::vector<ClockSample>& samples, double from_s, double to_s);
// "SM clock 1725 MHz median (max 1980), power 692 W median of a 700 W limit; power cap on 100% of
// the samples" (the thermal share only when nonzero).
std::string clock_summary_line(const ClockSummary& s);
// Seconds on the clock of ClockSample::t_s.
double sampler_now_s();

}  // namespace anatomy
