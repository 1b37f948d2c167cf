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

void ProfilingBackend::enable(bool on) {
  m_on = on;
  if (on) {
    m_records.clear();
    m_steps.clear();
    m_in.timing_reset();
  }
}

void ProfilingBackend::step_begin() {
  if (m_on) m_step_begin = m_in.timing_mark();
}
void ProfilingBackend::step_end() {
  if (m_on) m_steps.emplace_back(m_step_begin, m_in.timing_mark());
}

void ProfilingBackend::probe_memory(std::function<int64_t()> used_bytes) {
  m_probe = std::move(used_bytes);
  if (m_probe) {
    m_in.synchronize();
    m_last_used = m_probe();
  }
}

template <class F>
void ProfilingBackend::timed(const char* name, const OpCost& cost, F&& f) {
  if (m_probe) {
    f();
    m_in.synchronize();
    const int64_t now = m_probe();
    if (now > m_last_used) m_growth.push_back({name, m_phase, now - m_last_used});
    m_last_used = now;
    return;
  }
  if (!m_on) {
    f();
    return;
  }
  const int a = m_in.timing_mark();
  f();
  m_records.push_back({name, m_phase, cost, a, m_in.timing_mark()});
}

ProfileSummary ProfilingBackend::summarize() {
  m_in.synchronize();
  ProfileSummary s;
  s.steps = static_cast<int>(m_steps.size());
  const double per = s.steps ? 1.0 / s.steps : 1.0;
  for (auto [a, b] : m_steps) s.step_ms += m_in.timing_elapsed_ms(a, b) * per;
  std::map<std::pair<std::string, int>, OpStat> agg;
  for (const Record& r : m_records) {
    const double ms = m_in.timing_elapsed_ms(r.begin, r.end);
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

void ProfilingBackend::upload(const Tensor& dst, const void* host) {
  timed("upload", elementwise_cost(dst, 0, 0, 1, OpClass::Data), [&] { m_in.upload(dst, host); });
}
int ProfilingBackend::upload_async(const Tensor& dst, const void* host) {
  int token = 0;
  timed("upload", elementwise_cost(dst, 0, 0, 1, OpClass::Data), [&] { token = m_in.upload_async(dst, host); });
  return token;
}
void ProfilingBackend::download(void* host, const Tensor& src) {
  timed("download", elementwise_cost(src, 0, 1, 0, OpClass::Data), [&] { m_in.download(host, src); });
}
void ProfilingBackend::copy(const Tensor& dst, const Tensor& src) {
  timed("copy", elementwise_cost(dst, 0, 1, 1), [&] { m_in.copy(dst, src); });
}
void ProfilingBackend::cast(const Tensor& dst, const Tensor& src) {
  OpCost c{static_cast<double>(dst.numel()), static_cast<double>(dst.bytes() + src.bytes()), OpClass::Elementwise};
  timed("cast", c, [&] { m_in.cast(dst, src); });
}
void ProfilingBackend::fill(const Tensor& dst, float value) {
  timed("fill", elementwise_cost(dst, 0, 0, 1), [&] { m_in.fill(dst, value); });
}
void ProfilingBackend::matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const MatmulArgs& args) {
  const char* name = args.epilogue == Epilogue::BiasGelu ? "matmul+bias+gelu"
                     : args.epilogue == Epilogue::Bias   ? "matmul+bias"
                     : c.dtype == DType::F32 && a.dtype != DType::F32 ? "matmul (weight grad)"
                                                                      : "matmul";
  timed(name, matmul_cost(c, a, ta, b, args), [&] { m_in.matmul(c, a, ta, b, tb, args); });
}
void ProfilingBackend::bias_grad(const Tensor& db, const Tensor& dy) {
  OpCost c{static_cast<double>(dy.numel()), static_cast<double>(dy.bytes() + 2 * db.bytes()), OpClass::Elementwise};
  timed("bias_grad", c, [&] { m_in.bias_grad(db, dy); });
}
void ProfilingBackend::attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask,
                                         int heads, const DropoutSpec& d) {
  timed("attention", attention_cost(qkv, ctx, heads, false), [&] { m_in.attention_forward(ctx, lse, qkv, mask, heads, d); });
}
void ProfilingBackend::attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                          const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& d) {
  timed("attention", attention_cost(qkv, ctx, heads, true),
        [&] { m_in.attention_backward(dqkv, dctx, qkv, ctx, lse, mask, heads, d); });
}
void ProfilingBackend::layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                         const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                                         const Tensor& beta, float eps, const DropoutSpec& d) {
  timed("layernorm", layernorm_cost(y, residual.defined(), false, sum.defined()),
        [&] { m_in.layernorm_forward(y, sum, mean, rstd, branch, residual, gamma, beta, eps, d); });
}
void ProfilingBackend::layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                                          const Tensor& dbeta, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                                          const Tensor& gamma, const Tensor& beta, const DropoutSpec& d) {
  timed("layernorm", layernorm_cost(dy, dbranch.defined(), true),
        [&] { m_in.layernorm_backward(dsum, dbranch, dgamma, dbeta, dy, y, rstd, gamma, beta, d); });
}
void ProfilingBackend::cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                     const Tensor& labels, float grad_scale) {
  timed("cross_entropy", cross_entropy_cost(logits), [&] { m_in.cross_entropy(losses, dlogits, logits, labels, grad_scale); });
}
void ProfilingBackend::gelu_forward(const Tensor& y, const Tensor& x) {
  timed("gelu", elementwise_cost(y, 8, 1, 1), [&] { m_in.gelu_forward(y, x); });
}
void ProfilingBackend::gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  timed("gelu", elementwise_cost(dx, 12, 2, 1), [&] { m_in.gelu_backward(dx, dy, x); });
}
void ProfilingBackend::tanh_forward(const Tensor& y, const Tensor& x) {
  timed("tanh", elementwise_cost(y, 4, 1, 1), [&] { m_in.tanh_forward(y, x); });
}
void ProfilingBackend::tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  timed("tanh", elementwise_cost(dx, 3, 2, 1), [&] { m_in.tanh_backward(dx, dy, y); });
}
void ProfilingBackend::relu_forward(const Tensor& y, const Tensor& x) {
  timed("relu", elementwise_cost(y, 1, 1, 1), [&] { m_in.relu_forward(y, x); });
}
void ProfilingBackend::relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  timed("relu", elementwise_cost(dx, 1, 2, 1), [&] { m_in.relu_backward(dx, dy, y); });
}
void ProfilingBackend::dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) {
  timed("dropout", elementwise_cost(y, 2, 1, 1), [&] { m_in.dropout_forward(y, x, d); });
}
void ProfilingBackend::dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) {
  timed("dropout", elementwise_cost(dx, 2, 1, 1), [&] { m_in.dropout_backward(dx, dy, d); });
}
void ProfilingBackend::add(const Tensor& y, const Tensor& a, const Tensor& b) {
  timed("add", elementwise_cost(y, 1, 2, 1), [&] { m_in.add(y, a, b); });
}
void ProfilingBackend::embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                                         const Tensor& pos, const Tensor& type) {
  timed("embedding", elementwise_cost(e, 2, 3, 1), [&] { m_in.embedding_forward(e, ids, type_ids, word, pos, type); });
}
void ProfilingBackend::embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                                          const Tensor& ids, const Tensor& type_ids) {
  timed("embedding", elementwise_cost(de, 3, 4, 3), [&] { m_in.embedding_backward(dword, dpos, dtype, de, ids, type_ids); });
}
void ProfilingBackend::select_token(const Tensor& out, const Tensor& x, int64_t t) {
  timed("select_token", elementwise_cost(out, 0, 1, 1), [&] { m_in.select_token(out, x, t); });
}
void ProfilingBackend::select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) {
  timed("select_token", elementwise_cost(dx, 0, 0, 1), [&] { m_in.select_token_backward(dx, dout, t); });
}
void ProfilingBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  timed("gather_rows", elementwise_cost(out, 0, 1, 1), [&] { m_in.gather_rows(out, in, idx); });
}
void ProfilingBackend::scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  timed("scatter_rows", elementwise_cost(in, 0, 1, 1), [&] { m_in.scatter_rows(out, in, idx); });
}
void ProfilingBackend::block_sum_squares(const Tensor& partials, const Tensor& x) {
  timed("grad_norm", elementwise_cost(x, 2, 1, 0, OpClass::Optimizer), [&] { m_in.block_sum_squares(partials, x); });
}
void ProfilingBackend::sum_blocks(const Tensor& out, const Tensor& partials) {
  timed("grad_norm", elementwise_cost(partials, 1, 1, 0, OpClass::Optimizer), [&] { m_in.sum_blocks(out, partials); });
}
void ProfilingBackend::adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                                    const Tensor& grads, const GradTransform& g, const AdamWArgs& a) {
  OpCost c = elementwise_cost(params, 14, 4, 3, OpClass::Optimizer);
  c.bytes += static_cast<double>(half_copy.bytes());
  timed("adamw_update", c, [&] { m_in.adamw_update(params, m, v, half_copy, grads, g, a); });
}
void ProfilingBackend::sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                                  const Tensor& grads, const GradTransform& g, const SgdArgs& a) {
  OpCost c = elementwise_cost(params, 6, 3, 2, OpClass::Optimizer);
  c.bytes += static_cast<double>(half_copy.bytes());
  timed("sgd_update", c, [&] { m_in.sgd_update(params, momentum, half_copy, grads, g, a); });
}
void ProfilingBackend::adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                                        const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                                        const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                                        const AdamWArgs& a) {
  OpCost c = elementwise_cost(params, 24, 2, 1, OpClass::Optimizer);  // params and grads F32, params written
  c.bytes += 4.0 * static_cast<double>(m_codes.numel()) + static_cast<double>(half_copy.bytes());  // codes read + written
  timed("adamw8bit_update", c,
        [&] { m_in.adamw8bit_update(params, m_codes, v_codes, m_absmax, v_absmax, half_copy, grads, qmap, g, a); });
}
void ProfilingBackend::adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch,
                                        const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                                        const GradTransform& g, const AdafactorArgs& a) {
  OpCost c = elementwise_cost(params, 12, 3, 1, OpClass::Optimizer);  // grads read twice (statistics, update)
  c.bytes += static_cast<double>(state.bytes() * 2 + half_copy.bytes());
  timed("adafactor_update", c, [&] { m_in.adafactor_update(params, state, scratch, half_copy, grads, table, g, a); });
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
  std::printf("  measured ceilings: %.0f TFLOP/s (matrix product), %.0f GB/s (device copy)\n", c.tflops, c.gbps);
  std::printf("  per op (ms/step, TFLOP/s, GB/s):\n");
  std::vector<OpStat> ops = s.ops;
  std::sort(ops.begin(), ops.end(), [](const OpStat& a, const OpStat& b) { return a.time_ms > b.time_ms; });
  for (const auto& o : ops)
    std::printf("    %-22s %-9s %5lld calls %9.3f ms %8.1f %8.1f\n", o.name.c_str(), phase_name(o.phase),
                static_cast<long long>(o.calls), o.time_ms, o.flops / (o.time_ms * 1e-3) / 1e12,
                o.bytes / (o.time_ms * 1e-3) / 1e9);
}

}  // namespace anatomy
