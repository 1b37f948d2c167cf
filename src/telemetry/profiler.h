// The op profiler: a Backend that forwards every call to the real one and, while enabled,
// brackets each op with timing marks (CUDA events on the GPU) and records its declared flops
// and bytes (telemetry/op_cost.h). The model always runs through it; disabled it only forwards.
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
  double covered_ms() const;          // sum of op times per step
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : m_in(inner) {}

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

  Backend& inner() { return m_in; }
  Device device() const override { return m_in.device(); }
  Allocator& allocator() override { return m_in.allocator(); }
  std::string name() const override { return m_in.name(); }
  void synchronize() override { m_in.synchronize(); }
  void* native_stream() override { return m_in.native_stream(); }
  void bind_to_thread() override { m_in.bind_to_thread(); }
  void set_allow_tf32(bool on) override { m_in.set_allow_tf32(on); }
  void set_phase(Phase p) override { m_phase = p; }
  int timing_mark() override { return m_in.timing_mark(); }
  double timing_elapsed_ms(int a, int b) override { return m_in.timing_elapsed_ms(a, b); }
  void timing_reset() override { m_in.timing_reset(); }

  void upload(const Tensor& dst, const void* host) override;
  void* host_alloc(size_t bytes) override { return m_in.host_alloc(bytes); }
  void host_free(void* p) override { m_in.host_free(p); }
  int upload_async(const Tensor& dst, const void* host) override;
  void wait_upload(int token) override { m_in.wait_upload(token); }
  void download(void* host, const Tensor& src) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& dst, float value) override;
  void matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const MatmulArgs& args) override;
  void bias_grad(const Tensor& db, const Tensor& dy) override;
  void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                         const DropoutSpec& dropout) override;
  void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                          const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout) override;
  void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd, const Tensor& branch,
                         const Tensor& residual, const Tensor& gamma, const Tensor& beta, float eps,
                         const DropoutSpec& d) override;
  void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                          const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma,
                          const Tensor& beta, const DropoutSpec& d) override;
  void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                     float grad_scale) override;
  void gelu_forward(const Tensor& y, const Tensor& x) override;
  void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) override;
  void tanh_forward(const Tensor& y, const Tensor& x) override;
  void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override;
  void relu_forward(const Tensor& y, const Tensor& x) override;
  void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override;
  void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) override;
  void dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) override;
  void add(const Tensor& y, const Tensor& a, const Tensor& b) override;
  void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                         const Tensor& pos, const Tensor& type) override;
  void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                          const Tensor& ids, const Tensor& type_ids) override;
  void select_token(const Tensor& out, const Tensor& x, int64_t t) override;
  void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) override;
  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) override;
  void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) override;
  void block_sum_squares(const Tensor& partials, const Tensor& x) override;
  void sum_blocks(const Tensor& out, const Tensor& partials) override;
  void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                    const Tensor& grads, const GradTransform& g, const AdamWArgs& a) override;
  void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                  const GradTransform& g, const SgdArgs& a) override;
  void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                        const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                        const GradTransform& g, const AdamWArgs& a) override;
  void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                        const Tensor& grads, const AdafactorTable& table, const GradTransform& g,
                        const AdafactorArgs& a) override;

 private:
  struct Record {
    const char* name;
    Phase phase;
    OpCost cost;
    int begin, end;
  };
  // Runs f between two marks when enabled.
  template <class F>
  void timed(const char* name, const OpCost& cost, F&& f);

  Backend& m_in;
  bool m_on = false;
  Phase m_phase = Phase::Forward;
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
};
Ceilings measure_ceilings(Backend& be);

}  // namespace anatomy

namespace anatomy {
// profile.json (read by `anatomy report`) and the console table: per class % flops, % time,
// TFLOP/s, GB/s; per op the same; forward, backward and their ratio.
void write_profile(const std::string& path, const ProfileSummary& s, const Ceilings& c);
void print_profile(const ProfileSummary& s, const Ceilings& c);
}  // namespace anatomy
