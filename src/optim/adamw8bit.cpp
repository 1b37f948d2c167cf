#include "optim/adamw8bit.h"

#include <cmath>
#include <vector>

#include "model/params.h"
#include "ops/optim_math.h"

namespace anatomy {

std::array<float, 256> quantization_map(bool is_signed) {
  std::array<float, 256> map{};
  const double mu = is_signed ? kQuantMuSigned : kQuantMuUnsigned, log1p_mu = std::log1p(mu);
  auto expand = [&](double u) { return std::copysign(std::expm1(std::fabs(u) * log1p_mu) / mu, u); };
  for (int k = 0; k < 256; ++k) {
    double u;
    if (is_signed)
      u = k < 127 ? -static_cast<double>(127 - k) / 127.0 : static_cast<double>(k - 127) / 128.0;
    else
      u = static_cast<double>(k) / 255.0;
    map[k] = static_cast<float>(expand(u));
  }
  // Exact endpoints and zero (expm1 of the endpoints is within an ulp of them already).
  if (is_signed) {
    map[0] = -1.0f, map[127] = 0.0f, map[255] = 1.0f;
  } else {
    map[0] = 0.0f, map[255] = 1.0f;
  }
  return map;
}

std::array<float, 512> adamw8bit_qmap() {
  std::array<float, 512> q{};
  const std::array<float, 256> s = quantization_map(true), u = quantization_map(false);
  for (int k = 0; k < 256; ++k) q[k] = s[k], q[256 + k] = u[k];
  return q;
}

namespace {

size_t blocks_of(size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }

class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(Backend& be, const OptimizerOptions& o, const ParamLayout& layout)
      : m_be(be), m_opt(o), m_n(layout.total()), m_d(layout.decay_end()), m_blocks_a(blocks_of(m_d)),
        m_mq(be.allocator(), DType::U8, {static_cast<int64_t>(m_n)}, Category::OptimizerState),
        m_vq(be.allocator(), DType::U8, {static_cast<int64_t>(m_n)}, Category::OptimizerState),
        m_mabs(be.allocator(), DType::F32, {static_cast<int64_t>(adamw8bit_blocks(layout))}, Category::OptimizerState),
        m_vabs(be.allocator(), DType::F32, {static_cast<int64_t>(adamw8bit_blocks(layout))}, Category::OptimizerState),
        m_qmap(be.allocator(), DType::F32, {512}, Category::OptimizerState) {
    const std::array<float, 512> q = adamw8bit_qmap();
    be.upload(m_qmap, q.data());
    // Zero moments: absmax 0, and the codes of 0.0 (so the codes are meaningful from the start).
    be.fill(m_mabs, 0.0f);
    be.fill(m_vabs, 0.0f);
    std::vector<uint8_t> codes(m_n, static_cast<uint8_t>(om::nearest_code(q.data(), 0.0f)));
    be.upload(m_mq, codes.data());
    std::fill(codes.begin(), codes.end(), static_cast<uint8_t>(om::nearest_code(q.data() + 256, 0.0f)));
    be.upload(m_vq, codes.data());
  }

  void step(const ParamGroups& p, const GradTransform& g, float lr) override {
    ANATOMY_CHECK(p.master.numel() == m_n && p.decay_end == m_d, "adamw-8bit: parameters of ", p.master.numel(),
                  " elements (decay group ", p.decay_end, ") do not match the optimizer's ", m_n, " (", m_d, ")");
    ++m_steps;
    AdamWArgs args{lr, m_opt.beta1, m_opt.beta2, m_opt.eps, m_opt.weight_decay, m_steps};
    const int64_t n = static_cast<int64_t>(m_n), d = static_cast<int64_t>(m_d), ba = static_cast<int64_t>(m_blocks_a);
    const int64_t nb = static_cast<int64_t>(m_mabs.tensor().numel());
    auto part = [](const Tensor& t, int64_t lo, int64_t hi) {
      return t.defined() ? t.view({static_cast<int64_t>(t.numel())}).slice(lo, hi) : Tensor();
    };
    // Group 1 [0, d) with weight decay, blocks [0, ba); group 2 [d, n) without, blocks [ba, nb).
    if (d > 0)
      m_be.adamw8bit_update(part(p.master, 0, d), part(m_mq, 0, d), part(m_vq, 0, d), part(m_mabs, 0, ba),
                            part(m_vabs, 0, ba), part(p.half_copy, 0, d), part(p.grads, 0, d), m_qmap, g, args);
    args.weight_decay = 0.0f;
    if (n > d)
      m_be.adamw8bit_update(part(p.master, d, n), part(m_mq, d, n), part(m_vq, d, n), part(m_mabs, ba, nb),
                            part(m_vabs, ba, nb), part(p.half_copy, d, n), part(p.grads, d, n), m_qmap, g, args);
  }

  std::vector<std::pair<std::string, Tensor>> state() override {
    return {{"exp_avg_codes", m_mq},
            {"exp_avg_absmax", m_mabs},
            {"exp_avg_sq_codes", m_vq},
            {"exp_avg_sq_absmax", m_vabs},
            {"qmap", m_qmap}};
  }

 private:
  Backend& m_be;
  OptimizerOptions m_opt;
  size_t m_n, m_d, m_blocks_a;
  Buffer m_mq, m_vq, m_mabs, m_vabs, m_qmap;
};

}  // namespace

size_t adamw8bit_blocks(const ParamLayout& layout) {
  return blocks_of(layout.decay_end()) + blocks_of(layout.total() - layout.decay_end());
}

size_t adamw8bit_state_bytes(const ParamLayout& layout) {
  return 2 * layout.total() + 2 * sizeof(float) * adamw8bit_blocks(layout) + 512 * sizeof(float);
}

std::unique_ptr<Optimizer> make_adamw8bit(Backend& be, const OptimizerOptions& o, const ParamLayout& layout) {
  return std::make_unique<AdamW8bit>(be, o, layout);
}

}  // namespace anatomy
