// The clock and power summary of the steady steps (Note [clock and power] in telemetry/clocks.h).
#include <gtest/gtest.h>

#include <vector>

#include "telemetry/clocks.h"

using namespace anatomy;

namespace {
ClockSample at(double t, unsigned mhz, double watts, uint64_t reasons) {
  ClockSample s;
  s.t_s = t;
  s.c = GpuClocks{mhz, 1980, watts, 700.0, reasons};
  return s;
}
}  // namespace

TEST(Clocks, TheSummaryTakesTheWindowsSamplesOnly) {
  const std::vector<ClockSample> v = {
      at(0.0, 1980, 120.0, 0x1),             // idle, before the window
      at(1.0, 1725, 690.0, kClockPowerCap),  //
      at(1.1, 1710, 695.0, kClockPowerCap),  //
      at(1.2, 1755, 680.0, 0),               //
      at(1.3, 1650, 699.0, kClockPowerCap | kClockSwThermal),
      at(5.0, 1980, 90.0, 0x1),  // after
  };
  const auto s = summarize_clocks(v, 1.0, 1.3);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->samples, 4);
  EXPECT_DOUBLE_EQ(s->sm_median_mhz, 1717.5);  // 1650 1710 | 1725 1755
  EXPECT_DOUBLE_EQ(s->power_median_w, 692.5);  // 680 690 | 695 699
  EXPECT_DOUBLE_EQ(s->sm_max_mhz, 1980.0);
  EXPECT_DOUBLE_EQ(s->power_limit_w, 700.0);
  EXPECT_DOUBLE_EQ(s->power_capped, 0.75);
  EXPECT_DOUBLE_EQ(s->thermal, 0.25);
  EXPECT_EQ(clock_summary_line(*s),
            "SM clock 1718 MHz median (max 1980), power 692 W median of a 700 W limit; power cap on 75% of the "
            "samples, thermal slowdown on 25%");
}

TEST(Clocks, NoSampleInTheWindowGivesNoSummary) {
  EXPECT_FALSE(summarize_clocks({}, 0.0, 10.0).has_value());
  EXPECT_FALSE(summarize_clocks({at(0.5, 1980, 100.0, 0)}, 1.0, 2.0).has_value());
  const auto one = summarize_clocks({at(1.5, 1800, 650.0, 0)}, 1.0, 2.0);
  ASSERT_TRUE(one.has_value());
  EXPECT_DOUBLE_EQ(one->sm_median_mhz, 1800.0);
  EXPECT_EQ(one->power_capped, 0.0);
  EXPECT_EQ(clock_summary_line(*one).find("thermal"), std::string::npos);
}
