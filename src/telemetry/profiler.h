// The op profiler: an observer of the backend (ops/observer.h) that, while enabled, times each
// op between marks and records its declared flops and bytes (telemetry/op_cost.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "telemetry/op_cost.h"

namespace anatomy {

const char* phase_name(Phase p);  // "forward", "backward", "optimizer", "data"

struct OpStat {
  std::string name;
  Phase phase = Phase::Forward;
  OpClass cls = OpClass::Elementwise;
  int64_t calls = 0;
  double time_ms = 0, flops = 0, bytes = 0;  // totals over the profiled steps
};

struct ProfileSummary {
  int steps = 0;
  double step_ms = 0;  // wall time of one step between its first and last mark, averaged
  double phase_ms[4] = {0, 0, 0, 0};  // per step: forward, backward, optimizer, data
  std::vector<OpStat> ops;            // per step, aggregated by (name, phase)
  // With several ranks (this rank's view, per step): the gradient reduction's buckets, the
  // collectives' time and the part of it that backward did not hide (Note [overlap timing] in
  // dist/communicator.h; the trainer fills these in).
  int ranks = 1;
  double reduce_buckets = 0, reduce_ms = 0, reduce_exposed_ms = 0;
  // NVML's SM clock read at the end of the profiled steps, and its maximum (0: no NVML; the
  // trainer fills these in): a rate compares with the ceilings at the clocks of each (Note [clock
  // and power] in telemetry/clocks.h).
  unsigned steps_sm_mhz = 0, max_sm_mhz = 0;
  double covered_ms() const;          // sum of op times per step
};

// Note [op observer] in ops/contract.cpp: while enabled (or probing memory) the profiler is the
// backend's observer. It brackets each op with timing marks (CUDA events on the GPU) and
// records the op's declared cost; the phase is the backend's (set_phase).
class OpProfiler final : public OpObserver {
 public:
  explicit OpProfiler(Backend& be) : m_be(be) {}
  ~OpProfiler() override;
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  void enable(bool on);
  bool enabled() const { return m_on; }
  // Marks the start and end of one step while enabled.
  void step_begin();
  void step_end();
  // Synchronizes, reads every mark, and aggregates what was recorded since enable(true).
  ProfileSummary summarize();

  // Note [memory growth probe]: memory that no allocator call asked for (kernels loaded on their
  // first launch, library handles' own buffers) shows up only in NVML. While a probe is set,
  // every op is followed by a synchronize and a reading of `used_bytes`; an op after which the
  // reading grew is recorded with the growth. Slow: the trainer sets it for the first step only.
  struct Growth {
    std::string op;
    Phase phase;
    int64_t bytes;
  };
  void probe_memory(std::function<int64_t()> used_bytes);  // an empty function turns it off
  const std::vector<Growth>& memory_growth() const { return m_growth; }

  void before(Backend& be, const OpEvent& e) override;
  void after(Backend& be, const OpEvent& e) override;

 private:
  struct Record {
    const char* name;
    Phase phase;
    OpCost cost;
    int begin, end;
  };

  void attach();  // observes the backend exactly while enabled or probing

  Backend& m_be;
  OpObserver* m_previous = nullptr;
  bool m_attached = false;
  bool m_on = false;
  int m_op_begin = -1;
  std::vector<Record> m_records;
  std::vector<std::pair<int, int>> m_steps;
  int m_step_begin = -1;
  std::function<int64_t()> m_probe;
  int64_t m_last_used = 0;
  std::vector<Growth> m_growth;
};

// The device's two ceilings, measured: a large bf16 (GPU) or f32 (CPU) matrix product and a
// large device-to-device copy (bytes read plus written). Allocates its buffers as Temporary.
struct Ceilings {
  double tflops = 0, gbps = 0;
  unsigned sm_mhz = 0;  // NVML's SM clock read just after measuring them (0: no NVML; the trainer's)
};
Ceilings measure_ceilings(Backend& be);

}  // namespace anatomy

namespace anatomy {
// profile.json (read by `anatomy report`) and the console table: per class % flops, % time,
// TFLOP/s, GB/s; per op the same; forward, backward and their ratio.
void write_profile(const std::string& path, const ProfileSummary& s, const Ceilings& c);
void print_profile(const ProfileSummary& s, const Ceilings& c);
}  // namespace anatomy
