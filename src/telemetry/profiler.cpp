#include "telemetry/profiler.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

#include "memory/allocator.h"

namespace anatomy {

double ProfileSummary::covered_ms() const {
  double s = 0;
  for (const auto& o : ops) s += o.time_ms;
  return s;
}

OpProfiler::~OpProfiler() {
  if (m_attached) m_be.set_observer(m_previous);
}

// Observing only while enabled or probing: an unobserved op computes no cost and calls nothing.
void OpProfiler::attach() {
  const bool want = m_on || static_cast<bool>(m_probe);
  if (want == m_attached) return;
  if (want) {
    m_previous = m_be.observer();
    m_be.set_observer(this);
  } else {
    m_be.set_observer(m_previous);
  }
  m_attached = want;
}

void OpProfiler::enable(bool on) {
  m_on = on;
  attach();
  if (on) {
    m_records.clear();
    m_steps.clear();
    m_be.timing_reset();
  }
}

void OpProfiler::step_begin() {
  if (m_on) m_step_begin = m_be.timing_mark();
}
void OpProfiler::step_end() {
  if (m_on) m_steps.emplace_back(m_step_begin, m_be.timing_mark());
}

void OpProfiler::probe_memory(std::function<int64_t()> used_bytes) {
  m_probe = std::move(used_bytes);
  attach();
  if (m_probe) {
    m_be.synchronize();
    m_last_used = m_probe();
  }
}

// With a memory probe set, ops are not timed (each is followed by a synchronize).
void OpProfiler::before(Backend& be, const OpEvent&) {
  if (m_on && !m_probe) m_op_begin = be.timing_mark();
}

void OpProfiler::after(Backend& be, const OpEvent& e) {
  if (m_probe) {
    be.synchronize();
    const int64_t now = m_probe();
    if (now > m_last_used) m_growth.push_back({e.name, e.phase, now - m_last_used});
    m_last_used = now;
    return;
  }
  if (m_on) m_records.push_back({e.name, e.phase, e.cost, m_op_begin, be.timing_mark()});
}

ProfileSummary OpProfiler::summarize() {
  m_be.synchronize();
  ProfileSummary s;
  s.steps = static_cast<int>(m_steps.size());
  const double per = s.steps ? 1.0 / s.steps : 1.0;
  for (auto [a, b] : m_steps) s.step_ms += m_be.timing_elapsed_ms(a, b) * per;
  std::map<std::pair<std::string, int>, OpStat> agg;
  for (const Record& r : m_records) {
    const double ms = m_be.timing_elapsed_ms(r.begin, r.end);
    OpStat& o = agg[{r.name, static_cast<int>(r.phase)}];
    o.name = r.name;
    o.phase = r.phase;
    o.cls = r.cost.cls;
    o.calls += 1;
    o.time_ms += ms * per;
    o.flops += r.cost.flops * per;
    o.bytes += r.cost.bytes * per;
    s.phase_ms[static_cast<int>(r.phase)] += ms * per;
  }
  for (auto& [k, o] : agg) {
    o.calls = static_cast<int64_t>(o.calls * per + 0.5);
    s.ops.push_back(o);
  }
  return s;
}

Ceilings measure_ceilings(Backend& be) {
  const bool gpu = be.device() == Device::CUDA;
  const int64_t n = gpu ? 8192 : 1024;
  const DType dt = gpu ? DType::BF16 : DType::F32;
  Ceilings c;
  {
    Buffer a(be.allocator(), dt, {n, n}, Category::Temporary), b(be.allocator(), dt, {n, n}, Category::Temporary),
        out(be.allocator(), dt, {n, n}, Category::Temporary);
    be.fill(a, 0.5f);  // constant inputs run a little faster than random ones; a ceiling, not a claim
    be.fill(b, 0.25f);
    for (int i = 0; i < 2; ++i) be.matmul(out, a, Trans::N, b, Trans::T, {});
    be.synchronize();
    be.timing_reset();
    const int reps = gpu ? 10 : 2;
    const int m0 = be.timing_mark();
    for (int i = 0; i < reps; ++i) be.matmul(out, a, Trans::N, b, Trans::T, {});
    const int m1 = be.timing_mark();
    be.synchronize();
    c.tflops = 2.0 * n * n * n * reps / (be.timing_elapsed_ms(m0, m1) * 1e-3) / 1e12;
  }
  {
    const int64_t bytes = gpu ? (int64_t{1} << 30) : (int64_t{64} << 20);
    Buffer a(be.allocator(), DType::F32, {bytes / 4}, Category::Temporary), b(be.allocator(), DType::F32, {bytes / 4}, Category::Temporary);
    be.fill(a, 1.0f);
    be.copy(b, a);
    be.synchronize();
    be.timing_reset();
    const int reps = 5;
    const int m0 = be.timing_mark();
    for (int i = 0; i < reps; ++i) be.copy(b, a);
    const int m1 = be.timing_mark();
    be.synchronize();
    c.gbps = 2.0 * bytes * reps / (be.timing_elapsed_ms(m0, m1) * 1e-3) / 1e9;
  }
  be.timing_reset();
  return c;
}

}  // namespace anatomy

namespace anatomy {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Data: return "data";
  }
  return "?";
}

namespace {
struct ClassTotals {
  double flops = 0, bytes = 0, ms = 0;
};
std::array<ClassTotals, kNumOpClasses> by_class(const ProfileSummary& s) {
  std::array<ClassTotals, kNumOpClasses> t{};
  for (const auto& o : s.ops) {
    auto& c = t[static_cast<int>(o.cls)];
    c.flops += o.flops;
    c.bytes += o.bytes;
    c.ms += o.time_ms;
  }
  return t;
}
}  // namespace

// The share of the reduction's time that ran while backward still computed.
double overlap_pct(const ProfileSummary& s) {
  return s.reduce_ms > 0 ? 100 * std::max(0.0, s.reduce_ms - s.reduce_exposed_ms) / s.reduce_ms : 0;
}

void write_profile(const std::string& path, const ProfileSummary& s, const Ceilings& c) {
  nlohmann::json j;
  j["steps_profiled"] = s.steps;
  j["step_time_ms"] = s.step_ms;
  j["ops_time_ms"] = s.covered_ms();
  j["forward_ms"] = s.phase_ms[0];
  j["backward_ms"] = s.phase_ms[1];
  j["optimizer_ms"] = s.phase_ms[2];
  j["data_ms"] = s.phase_ms[3];
  j["ceilings"] = {{"tflops", c.tflops}, {"gbps", c.gbps}};
  if (s.steps_sm_mhz && c.sm_mhz)
    j["sm_clock_mhz"] = {{"profiled_steps", s.steps_sm_mhz}, {"ceilings", c.sm_mhz}, {"max", s.max_sm_mhz}};
  if (s.ranks > 1)
    j["gradient_reduction"] = {{"ranks", s.ranks},
                               {"buckets_per_step", s.reduce_buckets},
                               {"reduce_ms", s.reduce_ms},
                               {"exposed_ms", s.reduce_exposed_ms},
                               {"hidden_pct", overlap_pct(s)}};
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& o : s.ops)
    ops.push_back({{"name", o.name}, {"class", std::string(op_class_name(o.cls))}, {"phase", phase_name(o.phase)},
                   {"calls", o.calls}, {"time_ms", o.time_ms}, {"flops", o.flops}, {"bytes", o.bytes}});
  j["ops"] = ops;
  const auto t = by_class(s);
  double F = 0, M = 0;
  for (const auto& x : t) {
    F += x.flops;
    M += x.ms;
  }
  nlohmann::json classes = nlohmann::json::array();
  for (int i = 0; i < kNumOpClasses; ++i) {
    const auto& x = t[i];
    if (x.ms <= 0) continue;
    classes.push_back({{"class", std::string(op_class_name(static_cast<OpClass>(i)))},
                       {"flops_pct", F > 0 ? 100 * x.flops / F : 0},
                       {"time_pct", 100 * x.ms / M},
                       {"time_ms", x.ms},
                       {"tflops", x.flops / (x.ms * 1e-3) / 1e12},
                       {"gbps", x.bytes / (x.ms * 1e-3) / 1e9}});
  }
  j["classes"] = classes;
  write_file_atomic(path, j.dump(2) + "\n");
}

void print_profile(const ProfileSummary& s, const Ceilings& c) {
  const auto t = by_class(s);
  double F = 0, M = 0;
  for (const auto& x : t) {
    F += x.flops;
    M += x.ms;
  }
  std::printf("\nTime anatomy (%d profiled steps; one step %.2f ms, its ops add up to %.2f ms = %.1f%%):\n", s.steps,
              s.step_ms, s.covered_ms(), 100 * s.covered_ms() / std::max(s.step_ms, 1e-9));
  std::printf("  %-26s %8s %8s %10s %9s %9s\n", "class", "%flops", "%time", "ms/step", "TFLOP/s", "GB/s");
  for (int i = 0; i < kNumOpClasses; ++i) {
    const auto& x = t[i];
    if (x.ms <= 0) continue;
    std::printf("  %-26s %8.2f %8.2f %10.3f %9.1f %9.1f\n", std::string(op_class_name(static_cast<OpClass>(i))).c_str(),
                F > 0 ? 100 * x.flops / F : 0, 100 * x.ms / M, x.ms, x.flops / (x.ms * 1e-3) / 1e12,
                x.bytes / (x.ms * 1e-3) / 1e9);
  }
  std::printf("  forward %.2f ms, backward %.2f ms (backward/forward = %.2f), optimizer %.2f ms, data %.2f ms\n",
              s.phase_ms[0], s.phase_ms[1], s.phase_ms[1] / std::max(s.phase_ms[0], 1e-9), s.phase_ms[2], s.phase_ms[3]);
  if (s.ranks > 1)
    std::printf("  gradient reduction (%d ranks): %.0f buckets, %.2f ms of collectives per step, %.2f ms after "
                "backward ended: %.0f%% hidden behind backward\n",
                s.ranks, s.reduce_buckets, s.reduce_ms, s.reduce_exposed_ms, overlap_pct(s));
  std::printf("  measured ceilings: %.0f TFLOP/s (matrix product), %.0f GB/s (device copy)\n", c.tflops, c.gbps);
  if (s.steps_sm_mhz && c.sm_mhz)
    std::printf("  SM clock (NVML): %u MHz at the end of the profiled steps, %u MHz after the ceilings, %u at most;"
                " a step held at the power limit runs its ops at the lower clock\n",
                s.steps_sm_mhz, c.sm_mhz, s.max_sm_mhz);
  std::printf("  per op (ms/step, TFLOP/s, GB/s):\n");
  std::vector<OpStat> ops = s.ops;
  std::sort(ops.begin(), ops.end(), [](const OpStat& a, const OpStat& b) { return a.time_ms > b.time_ms; });
  for (const auto& o : ops)
    std::printf("    %-22s %-9s %5lld calls %9.3f ms %8.1f %8.1f\n", o.name.c_str(), phase_name(o.phase),
                static_cast<long long>(o.calls), o.time_ms, o.flops / (o.time_ms * 1e-3) / 1e12,
                o.bytes / (o.time_ms * 1e-3) / 1e9);
}

}  // namespace anatomy
