// GradTransform::skip_nonfinite on any backend: one update of each optimizer from a fixed
// starting state (params, optimizer state, a BF16 half copy), with norm_sq set on the backend's
// device, and the bytes of every tensor afterwards. Shared by the CPU tests (tests/unit) and the
// GPU twin (tests/cuda).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "memory/allocator.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/backend.h"
#include "optim/adafactor.h"
#include "optim/adamw8bit.h"

namespace anatomy::test {

enum class SkipOpt { AdamW, Sgd, AdamW8bit, Adafactor };
inline const char* skip_opt_name(SkipOpt o) {
  switch (o) {
    case SkipOpt::AdamW: return "adamw";
    case SkipOpt::Sgd: return "sgd";
    case SkipOpt::AdamW8bit: return "adamw-8bit";
    case SkipOpt::Adafactor: return "adafactor";
  }
  return "?";
}
inline constexpr SkipOpt kSkipOpts[] = {SkipOpt::AdamW, SkipOpt::Sgd, SkipOpt::AdamW8bit, SkipOpt::Adafactor};

// The tensors one update touches, as bytes, by name.
struct SkipSnapshot {
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> bytes;
  const std::vector<uint8_t>& at(const std::string& n) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == n) return bytes[i];
    static const std::vector<uint8_t> none;
    return none;
  }
};

// A small layout (about 15k parameters, a few factored matrices and vectors): big enough for
// several 8-bit blocks and Adafactor chunks, small enough for the CPU reference.
inline ParamLayout skip_test_layout() {
  BertConfig c = BertConfig::preset("bert-tiny");
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  return ParamLayout::for_sequence_classification(c);
}

// Sum of squares of the gradients of skip_run (a realistic finite norm_sq).
inline float skip_test_norm_sq(uint64_t seed) {
  const size_t n = skip_test_layout().total();
  Rng rng(seed + 1);
  double ss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = rng.normal() * 0.3;
    ss += static_cast<double>(static_cast<float>(g)) * static_cast<float>(g);
  }
  return static_cast<float>(ss);
}

// One update of `opt` on `be` from the state drawn from `seed`; returns the bytes of params,
// the optimizer state and the half copy after it (before: with `before` set, no update runs).
inline SkipSnapshot skip_run(Backend& be, SkipOpt opt, uint64_t seed, float norm_sq, bool skip, float max_norm,
                             bool before = false) {
  const ParamLayout lay = skip_test_layout();
  const size_t n = lay.total();
  const int64_t ni = static_cast<int64_t>(n);
  Rng rng(seed);
  std::vector<float> p(n), m(n), v(n), mom(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = static_cast<float>(rng.normal() * 0.05);
    m[i] = static_cast<float>(rng.normal() * 1e-3);
    v[i] = static_cast<float>((0.5 + rng.uniform()) * 1e-6);
    mom[i] = static_cast<float>(rng.normal() * 1e-3);
  }
  Rng grng(seed + 1);  // the gradients of skip_test_norm_sq
  std::vector<float> g(n);
  for (auto& x : g) x = static_cast<float>(grng.normal() * 0.3);
  std::vector<uint16_t> half(n);
  for (size_t i = 0; i < n; ++i) half[i] = f32_to_bf16(p[i]);

  Allocator& al = be.allocator();
  std::vector<Buffer> bufs;
  bufs.reserve(16);
  SkipSnapshot snap;
  std::vector<Tensor> tracked;
  auto make = [&](DType dt, const void* data, int64_t count) {
    bufs.emplace_back(al, dt, Shape{count}, Category::Other);
    be.upload(bufs.back().tensor(), data);
    return bufs.back().tensor();
  };
  auto track = [&](const std::string& name, const Tensor& t) {
    snap.names.push_back(name);
    tracked.push_back(t);
  };
  const Tensor tp = make(DType::F32, p.data(), ni), tg = make(DType::F32, g.data(), ni);
  const Tensor th = make(DType::BF16, half.data(), ni);
  const float norm_host[1] = {norm_sq};
  const Tensor tn = make(DType::F32, norm_host, 1);
  track("params", tp);
  track("half", th);
  GradTransform gt{tn, 1.0f / 4.0f, max_norm};
  gt.skip_nonfinite = skip;

  switch (opt) {
    case SkipOpt::AdamW: {
      const Tensor tm = make(DType::F32, m.data(), ni), tv = make(DType::F32, v.data(), ni);
      track("m", tm);
      track("v", tv);
      AdamWArgs a;
      a.lr = 1e-3f, a.weight_decay = 0.01f, a.step = 3;
      if (!before) be.adamw_update(tp, tm, tv, th, tg, gt, a);
      break;
    }
    case SkipOpt::Sgd: {
      const Tensor tm = make(DType::F32, mom.data(), ni);
      track("momentum", tm);
      SgdArgs a;
      a.lr = 1e-2f, a.momentum = 0.9f, a.weight_decay = 0.01f;
      if (!before) be.sgd_update(tp, tm, th, tg, gt, a);
      break;
    }
    case SkipOpt::AdamW8bit: {
      const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
      std::vector<uint8_t> mc(n), vc(n);
      for (size_t i = 0; i < n; ++i) {
        mc[i] = static_cast<uint8_t>(rng.randint(0, 256));
        vc[i] = static_cast<uint8_t>(rng.randint(1, 256));
      }
      std::vector<float> ma(blocks), va(blocks);
      for (size_t b = 0; b < blocks; ++b) {
        ma[b] = static_cast<float>((0.5 + rng.uniform()) * 1e-3);
        va[b] = static_cast<float>((0.5 + rng.uniform()) * 1e-6);
      }
      const std::array<float, 512> qmap = adamw8bit_qmap();
      const int64_t nb = static_cast<int64_t>(blocks);
      const Tensor tmc = make(DType::U8, mc.data(), ni), tvc = make(DType::U8, vc.data(), ni);
      const Tensor tma = make(DType::F32, ma.data(), nb), tva = make(DType::F32, va.data(), nb);
      const Tensor tq = make(DType::F32, qmap.data(), 512);
      track("m_codes", tmc);
      track("v_codes", tvc);
      track("m_absmax", tma);
      track("v_absmax", tva);
      AdamWArgs a;
      a.lr = 1e-3f, a.weight_decay = 0.01f, a.step = 3;
      if (!before) be.adamw8bit_update(tp, tmc, tvc, tma, tva, th, tg, tq, gt, a);
      break;
    }
    case SkipOpt::Adafactor: {
      const AdafactorPlan plan = adafactor_plan(lay);
      std::vector<float> state(static_cast<size_t>(plan.state_floats));
      for (auto& x : state) x = static_cast<float>((0.5 + rng.uniform()) * 1e-6);
      const std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(plan.scratch_floats, 1)), 0.0f);
      const int64_t count = static_cast<int64_t>(plan.segments.size());
      const Tensor ts = make(DType::F32, state.data(), static_cast<int64_t>(state.size()));
      const Tensor tscr = make(DType::F32, scratch.data(), static_cast<int64_t>(scratch.size()));
      const Tensor tseg = make(DType::I64, plan.segments.data(), count * kAdafactorSegmentFields);
      track("state", ts);
      const AdafactorTable table{tseg.view({count, kAdafactorSegmentFields}), count, plan.chunks, plan.strips};
      AdafactorArgs a;
      a.lr = 1e-2f, a.weight_decay = 0.01f, a.step = 3;
      if (!before) be.adafactor_update(tp, ts, tscr, th, tg, table, gt, a);
      break;
    }
  }
  for (const Tensor& t : tracked) {
    std::vector<uint8_t> out(t.bytes());
    be.download(out.data(), t);
    snap.bytes.push_back(std::move(out));
  }
  be.synchronize();
  return snap;
}

// The F32 values of a snapshot entry (params, moments, state).
inline std::vector<float> skip_floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

inline constexpr float kSkipNonfinite[] = {std::numeric_limits<float>::infinity(),
                                           -std::numeric_limits<float>::infinity(),
                                           std::numeric_limits<float>::quiet_NaN()};

}  // namespace anatomy::test
