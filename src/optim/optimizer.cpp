#include <cmath>
#include "optim/optimizer.h"

#include <algorithm>

#include "model/params.h"
#include "optim/adafactor.h"
#include "optim/adamw8bit.h"

namespace anatomy {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw" || s == "adamw_torch" || s == "adamw_torch_fused") return OptimizerKind::AdamW;
  if (s == "sgd") return OptimizerKind::Sgd;
  if (s == "adamw-8bit" || s == "adamw_8bit" || s == "adamw_bnb_8bit") return OptimizerKind::AdamW8bit;
  if (s == "adafactor") return OptimizerKind::Adafactor;
  fail("--optim: unknown optimizer '", s, "' (expected adamw, adamw-8bit, sgd or adafactor)");
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW: return "adamw";
    case OptimizerKind::Sgd: return "sgd";
    case OptimizerKind::AdamW8bit: return "adamw-8bit";
    case OptimizerKind::Adafactor: return "adafactor";
  }
  return "?";
}

size_t optimizer_state_bytes(OptimizerKind k, const ParamLayout& layout, bool sgd_momentum) {
  const size_t n = layout.total();
  switch (k) {
    case OptimizerKind::AdamW: return 8 * n;                     // two F32 moments
    case OptimizerKind::Sgd: return sgd_momentum ? 4 * n : 0;    // one F32 momentum buffer, with momentum
    case OptimizerKind::AdamW8bit: return adamw8bit_state_bytes(layout);
    case OptimizerKind::Adafactor: return adafactor_state_bytes(layout);
  }
  return 0;
}

namespace {

// The two groups as views: [0, decay_end) with weight decay, [decay_end, n) without.
struct Split {
  Tensor a, b;
};
Split split(const Tensor& t, size_t decay_end) {
  if (!t.defined()) return {};
  const int64_t n = static_cast<int64_t>(t.numel()), d = static_cast<int64_t>(decay_end);
  Tensor flat = t.view({n});
  return {flat.slice(0, d), flat.slice(d, n)};
}

class AdamW final : public Optimizer {
 public:
  AdamW(Backend& be, const OptimizerOptions& o, size_t n)
      : m_be(be), m_opt(o), m_m(be.allocator(), DType::F32, {static_cast<int64_t>(n)}, Category::OptimizerState),
        m_v(be.allocator(), DType::F32, {static_cast<int64_t>(n)}, Category::OptimizerState) {
    be.fill(m_m, 0.0f);
    be.fill(m_v, 0.0f);
  }
  void step(const ParamGroups& p, const GradTransform& g, float lr) override {
    ++m_steps;
    Split w = split(p.master, p.decay_end), h = split(p.half_copy, p.decay_end), gr = split(p.grads, p.decay_end);
    Split m = split(m_m, p.decay_end), v = split(m_v, p.decay_end);
    AdamWArgs args{lr, m_opt.beta1, m_opt.beta2, m_opt.eps, m_opt.weight_decay, m_steps};
    if (w.a.numel()) m_be.adamw_update(w.a, m.a, v.a, h.a, gr.a, g, args);
    args.weight_decay = 0.0f;
    if (w.b.numel()) m_be.adamw_update(w.b, m.b, v.b, h.b, gr.b, g, args);
  }
  std::vector<std::pair<std::string, Tensor>> state() override { return {{"exp_avg", m_m}, {"exp_avg_sq", m_v}}; }

 private:
  Backend& m_be;
  OptimizerOptions m_opt;
  Buffer m_m, m_v;
};

class Sgd final : public Optimizer {
 public:
  Sgd(Backend& be, const OptimizerOptions& o, size_t n) : m_be(be), m_opt(o) {
    if (o.momentum == 0.0f) return;  // plain SGD keeps no state
    m_buf = Buffer(be.allocator(), DType::F32, {static_cast<int64_t>(n)}, Category::OptimizerState);
    be.fill(m_buf, 0.0f);
  }
  void step(const ParamGroups& p, const GradTransform& g, float lr) override {
    ++m_steps;
    Split w = split(p.master, p.decay_end), h = split(p.half_copy, p.decay_end), gr = split(p.grads, p.decay_end);
    Split b = split(m_buf, p.decay_end);
    SgdArgs args{lr, m_opt.momentum, m_opt.weight_decay, false};
    if (w.a.numel()) m_be.sgd_update(w.a, b.a, h.a, gr.a, g, args);
    args.weight_decay = 0.0f;
    if (w.b.numel()) m_be.sgd_update(w.b, b.b, h.b, gr.b, g, args);
  }
  std::vector<std::pair<std::string, Tensor>> state() override {
    if (m_opt.momentum == 0.0f) return {};
    return {{"momentum_buffer", m_buf}};
  }

 private:
  Backend& m_be;
  OptimizerOptions m_opt;
  Buffer m_buf;
};

}  // namespace

std::unique_ptr<Optimizer> Optimizer::create(Backend& be, const OptimizerOptions& o, const ParamLayout& layout) {
  const size_t n = layout.total();
  std::unique_ptr<Optimizer> opt;
  switch (o.kind) {
    case OptimizerKind::AdamW: opt = std::make_unique<AdamW>(be, o, n); break;
    case OptimizerKind::Sgd: opt = std::make_unique<Sgd>(be, o, n); break;
    case OptimizerKind::AdamW8bit: opt = make_adamw8bit(be, o, layout); break;
    case OptimizerKind::Adafactor: opt = make_adafactor(be, o, layout); break;
  }
  ANATOMY_CHECK(opt, "internal error: optimizer kind");
  opt->m_kind = o.kind;
  return opt;
}

std::unique_ptr<Optimizer> Optimizer::create_for_range(Backend& be, const OptimizerOptions& o, size_t n) {
  range_state_bytes(o.kind, n);  // refuses the shape-structured optimizers
  std::unique_ptr<Optimizer> opt;
  if (o.kind == OptimizerKind::AdamW) opt = std::make_unique<AdamW>(be, o, n);
  else opt = std::make_unique<Sgd>(be, o, n);
  opt->m_kind = o.kind;
  return opt;
}

size_t Optimizer::range_state_bytes(OptimizerKind k, size_t n, bool sgd_momentum) {
  ANATOMY_CHECK(k == OptimizerKind::AdamW || k == OptimizerKind::Sgd, "--optim ", optimizer_name(k),
                ": --zero-stage 1 shards element-wise optimizer state only (adamw or sgd)");
  return (k == OptimizerKind::AdamW ? 8 : sgd_momentum ? 4 : 0) * n;
}

Schedule parse_schedule(const std::string& s) {
  if (s == "linear") return Schedule::Linear;
  if (s == "constant") return Schedule::Constant;
  if (s == "cosine") return Schedule::Cosine;
  if (s == "polynomial") return Schedule::Polynomial;
  fail("unknown learning-rate schedule '", s, "' (expected linear, constant, cosine or polynomial)");
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::Linear: return "linear";
    case Schedule::Constant: return "constant";
    case Schedule::Cosine: return "cosine";
    case Schedule::Polynomial: return "polynomial";
  }
  return "?";
}

float scheduled_lr(Schedule schedule, float lr, int64_t k, int64_t total, int64_t warmup) {
  if (k < warmup) return lr * static_cast<float>(k) / static_cast<float>(std::max<int64_t>(1, warmup));  // as transformers
  if (schedule == Schedule::Constant) return lr;
  if (schedule == Schedule::Linear) {
    const double left = static_cast<double>(total - k) / static_cast<double>(std::max<int64_t>(1, total - warmup));
    return static_cast<float>(lr * std::max(0.0, left));
  }
  // transformers' cosine (half a cycle; cosine_with_restarts with one cycle is the same curve)
  // and polynomial (power 1, down to lr_end = 1e-7, held there after the last step).
  const double progress = static_cast<double>(k - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  if (schedule == Schedule::Cosine) return static_cast<float>(lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress))));
  constexpr double lr_end = 1e-7;
  if (lr <= lr_end) return lr;
  if (k > total) return static_cast<float>(lr_end);
  return static_cast<float>((lr - lr_end) * (1.0 - progress) + lr_end);
}

}  // namespace anatomy
