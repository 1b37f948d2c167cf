// The 8-bit AdamW and Adafactor optimizers on the CPU: the quantization maps, one-step agreement
// with fp32 AdamW and with a double-precision Adafactor written out here, exact state bytes
// (allocator == planner), and convergence on the learnable synthetic task against AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "../common/dirs.h"
#include "memory/planner.h"
#include "model/params.h"
#include "ops/backend.h"
#include "ops/optim_math.h"
#include "optim/adafactor.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "test_cpu_util.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {

Tensor host_u8(std::vector<uint8_t>& v) {
  return Tensor(v.data(), DType::U8, {static_cast<int64_t>(v.size())}, Device::CPU);
}
Tensor host_f32(std::vector<float>& v) {
  return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, Device::CPU);
}

// The largest gap between adjacent map entries around |x|: for x(u) = ((1+mu)^u - 1)/mu
// sampled with step du, the gap above x_lo is (x_lo + 1/mu)((1+mu)^du - 1).
double half_gap(double x, double mu, double du) {
  return 0.5 * (std::fabs(x) + 1.0 / mu) * std::expm1(std::log1p(mu) * du);
}

}  // namespace

TEST(Optimizers, NamesRoundTrip) {
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::Sgd, OptimizerKind::AdamW8bit, OptimizerKind::Adafactor})
    EXPECT_EQ(parse_optimizer(optimizer_name(k)), k);
  EXPECT_EQ(parse_optimizer("adamw_bnb_8bit"), OptimizerKind::AdamW8bit);
  EXPECT_THROW(parse_optimizer("lion"), Error);
}

TEST(Optimizers, QuantizationMapsRoundTripWithinHalfAStep) {
  ANATOMY_FRESH_RNG(rng);
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const std::array<float, 256> map = quantization_map(is_signed);
    const double mu = is_signed ? kQuantMuSigned : kQuantMuUnsigned, du = is_signed ? 1.0 / 127 : 1.0 / 255;
    // Sorted, exact endpoints and zero; built deterministically.
    EXPECT_TRUE(std::is_sorted(map.begin(), map.end()));
    EXPECT_EQ(std::adjacent_find(map.begin(), map.end()), map.end()) << "duplicate entries";
    EXPECT_EQ(map[255], 1.0f);
    EXPECT_EQ(map[0], is_signed ? -1.0f : 0.0f);
    if (is_signed) {
      EXPECT_EQ(map[127], 0.0f);
    }
    EXPECT_EQ(map, quantization_map(is_signed));
    for (int i = 0; i < 20000; ++i) {
      // Log-uniform magnitudes over 10 decades plus uniform ones.
      double x = i % 2 ? std::pow(10.0, -10.0 * rng.uniform()) : rng.uniform();
      if (is_signed && i % 3 == 0) x = -x;
      const int c = om::nearest_code(map.data(), static_cast<float>(x));
      // The binary search finds the nearest entry (brute force).
      int best = 0;
      for (int k = 1; k < 256; ++k)
        if (std::fabs(map[k] - static_cast<float>(x)) < std::fabs(map[best] - static_cast<float>(x))) best = k;
      ASSERT_FLOAT_EQ(std::fabs(map[c] - static_cast<float>(x)), std::fabs(map[best] - static_cast<float>(x))) << x;
      // Round trip through a block scale: error within half the local gap.
      const float absmax = 3.5f;
      const uint8_t q = om::quantize(map.data(), static_cast<float>(x * absmax), absmax, !is_signed);
      const double back = om::dequantize(map.data(), q, absmax) / absmax;
      const double bound = half_gap(x, mu, du) * 1.0001 + 1e-7;
      ASSERT_LE(std::fabs(back - x), bound) << "x " << x << " code " << int(q);
      // Relative error where the map is logarithmic (above 1e-3: at most ~5%; near 1: ~2.7%).
      if (std::fabs(x) >= 1e-3) {
        ASSERT_LE(std::fabs(back - x) / std::fabs(x), 0.055) << x;
      }
      if (std::fabs(x) >= 0.1) {
        ASSERT_LE(std::fabs(back - x) / std::fabs(x), 0.03) << x;
      }
    }
    // The block's absmax itself is stored exactly, zero stays zero, a zero scale gives zero.
    EXPECT_EQ(om::dequantize(map.data(), om::quantize(map.data(), 2.5f, 2.5f, !is_signed), 2.5f), 2.5f);
    EXPECT_EQ(om::dequantize(map.data(), om::quantize(map.data(), 0.0f, 2.5f, !is_signed), 2.5f), 0.0f);
    EXPECT_EQ(om::dequantize(map.data(), om::quantize(map.data(), 0.0f, 0.0f, !is_signed), 0.0f), 0.0f);
  }
  // A positive second moment never collapses to zero.
  const std::array<float, 256> u = quantization_map(false);
  EXPECT_EQ(om::quantize(u.data(), 1e-30f, 1.0f, true), 1);
}

// 8-bit AdamW against fp32 AdamW over several steps (with weight decay, clipping and a loss scale):
// the first step is exact up to rounding (zero moments quantize exactly); later steps differ by
// the moments' quantization error only.
TEST(Optimizers, AdamW8bitTracksAdamW) {
  ANATOMY_FRESH_RNG(rng);
  auto be = make_cpu_backend();
  const size_t n = 3000;  // not a multiple of the block
  const float loss_scale = 256.0f;
  std::vector<float> p0 = test::to_float(test::randn(rng, n, 0.5));
  std::vector<float> p32 = p0, p8 = p0, m(n, 0.0f), v(n, 0.0f);
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  std::vector<uint8_t> mq(n), vq(n);
  std::vector<float> mabs(blocks, 0.0f), vabs(blocks, 0.0f);
  const std::array<float, 512> qmap_a = adamw8bit_qmap();
  std::vector<float> qmap(qmap_a.begin(), qmap_a.end());
  std::vector<float> norm(1);
  AdamWArgs a;
  a.lr = 1e-3f, a.weight_decay = 0.01f;
  double max_rel = 0, max_mrel = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // Gradients with a per-block spread of scales, as real layers have.
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i)
      g[i] = static_cast<float>(rng.normal() * loss_scale * std::pow(10.0, -2.0 * static_cast<double>(i % 7) / 7));
    double ss = 0;
    for (float x : g) ss += static_cast<double>(x) * x;
    norm[0] = static_cast<float>(ss);
    const GradTransform gt{host_f32(norm), 1.0f / loss_scale, 1.0f};
    a.step = step;
    const std::vector<float> before32 = p32, before8 = p8;
    be->adamw_update(host_f32(p32), host_f32(m), host_f32(v), Tensor{}, host_f32(g), gt, a);
    be->adamw8bit_update(host_f32(p8), host_u8(mq), host_u8(vq), host_f32(mabs), host_f32(vabs), Tensor{},
                         host_f32(g), host_f32(qmap), gt, a);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d32 = static_cast<double>(p32[i]) - before32[i], d8 = static_cast<double>(p8[i]) - before8[i];
      num += (d8 - d32) * (d8 - d32);
      den += d32 * d32;
    }
    const double rel = std::sqrt(num / den);
    // Step 1 differs only by float rounding (of parameters ~0.5 moved by ~1e-3).
    EXPECT_LT(rel, step == 1 ? 2e-4 : 0.04) << "relative update error";
    max_rel = std::max(max_rel, rel);
    // The dequantized moments are close to the fp32 ones.
    double mnum = 0, mden = 0;
    for (size_t i = 0; i < n; ++i) {
      const double mi = om::dequantize(qmap.data(), mq[i], mabs[i / kQuantBlock]);
      mnum += (mi - m[i]) * (mi - m[i]);
      mden += static_cast<double>(m[i]) * m[i];
    }
    EXPECT_LT(std::sqrt(mnum / mden), 0.04) << "relative first-moment error";
    max_mrel = std::max(max_mrel, std::sqrt(mnum / mden));
  }
  std::printf("8-bit vs fp32 AdamW over 6 steps: relative update error <= %.4f, first moment <= %.4f\n", max_rel,
              max_mrel);
}

namespace {

// Adafactor as Hugging Face writes it (explicit lr, no momentum), for one parameter in double.
struct RefAdafactorParam {
  int64_t rows, cols;  // rows == 0: a 1-D parameter of cols values
  std::vector<double> p, row, col, v;
  void step(const std::vector<double>& grad, double lr, double wd, int64_t step, double clip_threshold) {
    const double beta2t = 1.0 - std::pow(static_cast<double>(step), -0.8), eps1 = 1e-30;
    const size_t n = grad.size();
    std::vector<double> update(n);
    for (size_t i = 0; i < n; ++i) update[i] = grad[i] * grad[i] + eps1;
    if (rows > 0) {
      for (int64_t i = 0; i < rows; ++i) {
        double mean = 0;
        for (int64_t j = 0; j < cols; ++j) mean += update[i * cols + j];
        row[i] = beta2t * row[i] + (1 - beta2t) * mean / static_cast<double>(cols);
      }
      for (int64_t j = 0; j < cols; ++j) {
        double mean = 0;
        for (int64_t i = 0; i < rows; ++i) mean += update[i * cols + j];
        col[j] = beta2t * col[j] + (1 - beta2t) * mean / static_cast<double>(rows);
      }
      double row_mean = 0;
      for (double r : row) row_mean += r;
      row_mean /= static_cast<double>(rows);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          update[i * cols + j] = 1.0 / std::sqrt(row[i] / row_mean) / std::sqrt(col[j]) * grad[i * cols + j];
    } else {
      for (size_t i = 0; i < n; ++i) {
        v[i] = beta2t * v[i] + (1 - beta2t) * update[i];
        update[i] = grad[i] / std::sqrt(v[i]);
      }
    }
    double ss = 0;
    for (double u : update) ss += u * u;
    const double denom = std::max(1.0, std::sqrt(ss / static_cast<double>(n)) / clip_threshold);
    for (size_t i = 0; i < n; ++i) {
      const double u = update[i] / denom * lr;
      p[i] += -wd * lr * p[i];
      p[i] += -u;
    }
  }
};

}  // namespace

TEST(Optimizers, AdafactorMatchesADoublePrecisionReference) {
  ANATOMY_FRESH_RNG(rng);
  auto be = make_cpu_backend();
  const int64_t R = 37, C = 23, N1 = 29;
  // A hand-made table: a decayed [R, C] matrix at 0, then an undecayed [N1] vector at 856.
  std::vector<AdafactorSegment> segs(2);
  segs[0].offset = 0, segs[0].rows = R, segs[0].cols = C, segs[0].factored = 1, segs[0].decay = 1;
  segs[0].row_state = 0, segs[0].col_state = R;
  segs[1].offset = 856, segs[1].rows = 1, segs[1].cols = N1, segs[1].factored = 0, segs[1].decay = 0;
  segs[1].row_state = R + C;
  const size_t n = 856 + N1;
  std::vector<float> state(R + C + N1, 0.0f), scratch(1, 0.0f);
  const AdafactorTable table{Tensor(segs.data(), DType::I64, {2, kAdafactorSegmentFields}, Device::CPU), 2, 0, 0};

  for (float clip_threshold : {1.0f, 0.3f}) {
    SCOPED_TRACE("clip_threshold " + std::to_string(clip_threshold));
    std::fill(state.begin(), state.end(), 0.0f);
    std::vector<float> p = test::to_float(test::randn(rng, n, 0.5));
    RefAdafactorParam mat{R, C, {}, std::vector<double>(R, 0.0), std::vector<double>(C, 0.0), {}};
    RefAdafactorParam vec{0, N1, {}, {}, {}, std::vector<double>(N1, 0.0)};
    mat.p.assign(p.begin(), p.begin() + R * C);
    vec.p.assign(p.begin() + 856, p.end());
    const float loss_scale = 64.0f, max_norm = 2.0f, lr = 1e-2f, wd = 0.1f;
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<float> g = test::to_float(test::randn(rng, n, loss_scale * 0.3));
      double ss = 0;
      for (size_t i = 0; i < n; ++i)
        if (i < static_cast<size_t>(R * C) || i >= 856) ss += static_cast<double>(g[i]) * g[i];
      std::vector<float> norm{static_cast<float>(ss)};
      const double clip = std::min(1.0, max_norm / (std::sqrt(static_cast<double>(norm[0])) / loss_scale + 1e-6));
      auto scaled = [&](size_t lo, size_t hi) {
        std::vector<double> out;
        for (size_t i = lo; i < hi; ++i) out.push_back(static_cast<double>(g[i]) / loss_scale * clip);
        return out;
      };
      mat.step(scaled(0, R * C), lr, wd, step, clip_threshold);
      vec.step(scaled(856, n), lr, 0.0, step, clip_threshold);
      AdafactorArgs a;
      a.lr = lr, a.weight_decay = wd, a.step = step, a.clip_threshold = clip_threshold;
      be->adafactor_update(host_f32(p), host_f32(state), host_f32(scratch), Tensor{}, host_f32(g), table,
                           GradTransform{host_f32(norm), 1.0f / loss_scale, max_norm}, a);
    }
    std::vector<double> want(n, 0.0);
    std::vector<float> got(n, 0.0f);
    for (int64_t i = 0; i < R * C; ++i) want[i] = mat.p[i], got[i] = p[i];
    for (int64_t i = 0; i < N1; ++i) want[856 + i] = vec.p[i], got[856 + i] = p[856 + i];
    test::expect_close(got, want, 1e-5, "params");
    std::vector<double> want_state;
    for (double x : mat.row) want_state.push_back(x);
    for (double x : mat.col) want_state.push_back(x);
    for (double x : vec.v) want_state.push_back(x);
    test::expect_close(state, want_state, 1e-5, "state");
  }
}

TEST(Optimizers, AdafactorPlanFactorsEveryMatrix) {
  const ParamLayout lay = ParamLayout::for_sequence_classification(BertConfig::preset("bert-tiny"));
  const AdafactorPlan plan = adafactor_plan(lay);
  ASSERT_EQ(plan.segments.size(), lay.params().size());
  int64_t floats = 0;
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const ParamInfo& p = lay.params()[i];
    const AdafactorSegment& s = plan.segments[i];
    EXPECT_EQ(s.offset, static_cast<int64_t>(p.offset)) << p.name;
    EXPECT_EQ(s.factored, p.shape.rank == 2 ? 1 : 0) << p.name;
    EXPECT_EQ(s.decay, p.decay ? 1 : 0) << p.name;
    EXPECT_EQ(s.rows * s.cols, static_cast<int64_t>(p.numel())) << p.name;
    floats += s.factored ? s.rows + s.cols : s.cols;
  }
  EXPECT_EQ(plan.state_floats, floats);
}

namespace {

TrainOptions tiny(const std::string& out, OptimizerKind k) {
  TrainOptions o;
  o.preset = "bert-tiny";
  o.device = DeviceChoice::Cpu;
  o.seq_len = 32;
  o.num_samples = 64;
  o.per_device_train_batch_size = 8;
  o.logging_steps = 0;
  o.output_dir = anatomy::testing_dirs::fresh_dir(out);
  o.save_model = false;
  o.disable_progress_bar = true;
  o.optim.kind = k;
  return o;
}

}  // namespace

TEST(Optimizers, StateBytesEqualThePlanExactly) {
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  const ParamLayout lay = ParamLayout::for_sequence_classification(cfg);
  const int64_t n = static_cast<int64_t>(lay.total());
  for (OptimizerKind k : {OptimizerKind::AdamW8bit, OptimizerKind::Adafactor}) {
    SCOPED_TRACE(optimizer_name(k));
    TrainOptions o = tiny("anatomy_optim_mem", k);
    o.max_steps = 1;
    TrainResult r = train(o);
    const int64_t state = static_cast<int64_t>(optimizer_state_bytes(k, lay));
    EXPECT_EQ(r.peak_bytes[Category::OptimizerState], state);
    const MemoryPlan plan = plan_memory({cfg, {8, 32, DType::F32, CheckpointPolicy::None, true}, k, Device::CPU});
    for (int c = 0; c < kNumCategories; ++c)
      EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
    const double per_param = static_cast<double>(state) / static_cast<double>(n);
    if (k == OptimizerKind::AdamW8bit) {
      EXPECT_EQ(state, 2 * n + 8 * static_cast<int64_t>(adamw8bit_blocks(lay)) + 2048);
      EXPECT_GT(per_param, 2.0);
      EXPECT_LT(per_param, 2.05);
    } else {
      EXPECT_LT(per_param, 0.1);  // rows + cols per matrix: a few hundredths of a byte per parameter
    }
  }
}

TEST(Optimizers, PlannerCountsTheStateForEveryPreset) {
  for (const char* preset : {"bert-tiny", "bert-base", "bert-large"}) {
    SCOPED_TRACE(preset);
    const BertConfig cfg = BertConfig::preset(preset);
    const ParamLayout lay = ParamLayout::for_sequence_classification(cfg);
    const double n = static_cast<double>(lay.total());
    for (OptimizerKind k : {OptimizerKind::AdamW8bit, OptimizerKind::Adafactor}) {
      const MemoryPlan p = plan_memory({cfg, {4, 512, DType::BF16, CheckpointPolicy::None, true}, k, Device::CUDA});
      const int64_t state = p.bytes[Category::OptimizerState];
      EXPECT_EQ(state, static_cast<int64_t>(optimizer_state_bytes(k, lay))) << optimizer_name(k);
      if (k == OptimizerKind::AdamW8bit) {
        EXPECT_GT(state / n, 2.0);
        EXPECT_LT(state / n, 2.04);
      } else {
        EXPECT_LT(state / n, 0.08);
      }
    }
    // The 8-bit optimizer is a lever for an AdamW plan that does not fit.
    PlanInput in{cfg, {64, 512, DType::BF16, CheckpointPolicy::None, true}, OptimizerKind::AdamW, Device::CUDA};
    const int64_t total = plan_memory(in).total();
    in.optimizer = OptimizerKind::AdamW8bit;
    EXPECT_LT(plan_memory(in).total(), total);
  }
}

// The learnable task of Train.LossFallsOnTheLearnableTask (bert-tiny, seq 32, batch 16, lr 1e-3,
// linear decay), shortened to 60 steps, where AdamW's loss has fallen from 0.69 to about 0.04:
// each optimizer must end below 0.2 and within 0.05 of AdamW's last-step loss.
TEST(Optimizers, ConvergeOnTheLearnableTaskLikeAdamW) {
  auto run = [](OptimizerKind k) {
    TrainOptions o = tiny(std::string("anatomy_conv_") + optimizer_name(k), k);
    o.dataset = "learnable";
    o.num_samples = 1024;
    o.per_device_train_batch_size = 16;
    o.max_steps = 60;
    o.learning_rate = 1e-3f;
    return train(o);
  };
  const TrainResult adamw = run(OptimizerKind::AdamW);
  EXPECT_LT(adamw.last_loss, 0.2);
  for (OptimizerKind k : {OptimizerKind::AdamW8bit, OptimizerKind::Adafactor}) {
    const TrainResult r = run(k);
    RecordProperty(optimizer_name(k), std::to_string(r.last_loss));
    std::printf("%-10s first %.4f last %.4f (adamw last %.4f)\n", optimizer_name(k), r.first_loss, r.last_loss,
                adamw.last_loss);
    EXPECT_GT(r.first_loss, 0.6) << optimizer_name(k);
    EXPECT_LT(r.last_loss, 0.2) << optimizer_name(k);
    EXPECT_LT(r.last_loss, adamw.last_loss + 0.05) << optimizer_name(k);
  }
}
