// --precision fp8 on the CPU (Note [fp8 training] in core/fp8.h): the two formats' rounding, the
// delayed scaling's update, the fp8 GEMM's twin (quantize, then the F32 GEMM), and a model whose
// encoder Linears run in fp8: close to F32, the scales moved after a step, memory as planned.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "test_cpu_util.h"
#include "core/fp8.h"
#include "core/rng.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "ops/backend.h"
#include "ops/cpu/reference.h"

using namespace anatomy;

namespace {

constexpr Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;

std::vector<float> meta_row(float scale, Fp8Format f) {
  std::vector<float> m(kFp8MetaWidth);
  fp8_meta_init(m.data(), scale, f);
  return m;
}

}  // namespace

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  // E4M3: 3 mantissa bits, largest 448, smallest subnormal 2^-9.
  EXPECT_EQ(fp8_round(1.0625f, E4), 1.0f);    // halfway between 1 and 1.125: to the even 1
  EXPECT_EQ(fp8_round(1.1875f, E4), 1.25f);   // halfway between 1.125 and 1.25: to the even 1.25
  EXPECT_EQ(fp8_round(1.07f, E4), 1.125f);
  EXPECT_EQ(fp8_round(440.0f, E4), 448.0f);
  EXPECT_EQ(fp8_round(1e9f, E4), 448.0f);
  EXPECT_EQ(fp8_round(-500.0f, E4), -448.0f);
  EXPECT_EQ(fp8_round(std::ldexp(1.0f, -9), E4), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_round(std::ldexp(1.0f, -10), E4), 0.0f);                  // half the smallest: to even 0
  EXPECT_EQ(fp8_round(std::ldexp(3.0f, -10), E4), std::ldexp(1.0f, -8));  // 1.5 quanta: to 2
  // E5M2: 2 mantissa bits, largest 57344, smallest subnormal 2^-16.
  EXPECT_EQ(fp8_round(1.125f, E5), 1.0f);
  EXPECT_EQ(fp8_round(1.375f, E5), 1.5f);
  EXPECT_EQ(fp8_round(60000.0f, E5), 57344.0f);
  EXPECT_EQ(fp8_round(std::ldexp(1.0f, -16), E5), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_round(std::ldexp(1.0f, -18), E5), 0.0f);
  EXPECT_TRUE(std::isnan(fp8_round(std::nanf(""), E4)));
}

TEST(Fp8, EveryCodeDecodesAndEncodesBack) {
  for (Fp8Format f : {E4, E5}) {
    int finite = 0;
    for (int code = 0; code < 256; ++code) {
      const float v = fp8_decode(static_cast<uint8_t>(code), f);
      if (std::fabs(v) > fp8_max(f)) continue;  // E4M3's NaN, E5M2's infinities and NaNs
      if ((code & 0x7f) == 0x7f && f == E4) continue;
      ++finite;
      EXPECT_EQ(fp8_round(v, f), v) << code;
      EXPECT_EQ(fp8_encode(v, f), code) << code;  // -0 too: 0x80
    }
    EXPECT_EQ(finite, f == E4 ? 254 : 248);
  }
  EXPECT_EQ(fp8_decode(0x7e, E4), 448.0f);
  EXPECT_EQ(fp8_decode(0x7b, E5), 57344.0f);
}

TEST(Fp8, QuantizingRecordsAmaxAndScales) {
  std::vector<float> m = meta_row(4.0f, E4);
  const std::vector<float> x = {0.5f, -3.0f, 200.0f, 1e-4f};
  std::vector<float> q(x.size());
  ref::fp8_quantize(q.data(), x.data(), 4, m.data(), E4);
  EXPECT_EQ(m[Fp8Meta::kAmax], 200.0f);
  EXPECT_EQ(q[0], 0.5f);
  EXPECT_EQ(q[1], -3.0f);
  EXPECT_EQ(q[2], 448.0f / 4.0f);  // 800 saturates at 448 before the scale comes off
  EXPECT_EQ(q[3], 0.0f);           // 4e-4 is below half of 2^-9
  // A second micro-batch raises the amax only where it is larger; a NaN makes it NaN.
  const std::vector<float> y = {7.0f};
  ref::fp8_quantize(q.data(), y.data(), 1, m.data(), E4);
  EXPECT_EQ(m[Fp8Meta::kAmax], 200.0f);
  const std::vector<float> z = {std::nanf("")};
  ref::fp8_quantize(q.data(), z.data(), 1, m.data(), E4);
  EXPECT_TRUE(std::isnan(m[Fp8Meta::kAmax]));
}

TEST(Fp8, TheUpdateTakesThePowerOfTwoUnderTheHistorysLargestFiniteAmax) {
  std::vector<float> m = meta_row(1.0f, E4);
  std::vector<float> e = meta_row(1.0f, E5);
  std::vector<float> none = meta_row(8.0f, E4);
  m[Fp8Meta::kAmax] = 3.0f;                        // this step
  m[Fp8Meta::kAmax + 5] = 20.0f;                   // five steps ago: the largest
  m[Fp8Meta::kAmax + 7] = std::numeric_limits<float>::infinity();  // skipped
  e[Fp8Meta::kAmax] = 1e-3f;
  none[Fp8Meta::kAmax + 1] = std::nanf("");  // nothing finite: the scale stays
  std::vector<float> all = m;
  all.insert(all.end(), e.begin(), e.end());
  all.insert(all.end(), none.begin(), none.end());
  ref::fp8_scale_update(all.data(), 3);
  const float* r0 = all.data();
  const float* r1 = r0 + kFp8MetaWidth;
  const float* r2 = r1 + kFp8MetaWidth;
  EXPECT_EQ(r0[Fp8Meta::kScale], 16.0f);  // 448 / 20 = 22.4 -> 16
  EXPECT_EQ(r0[Fp8Meta::kScaleInv], 1.0f / 16.0f);
  EXPECT_EQ(r1[Fp8Meta::kScale], std::ldexp(1.0f, 25));  // 57344 / 1e-3 = 5.7e7 -> 2^25
  EXPECT_EQ(r2[Fp8Meta::kScale], 8.0f);
  // The history moved by one: this step's amax is cleared and now one step old.
  EXPECT_EQ(r0[Fp8Meta::kAmax], 0.0f);
  EXPECT_EQ(r0[Fp8Meta::kAmax + 1], 3.0f);
  EXPECT_EQ(r0[Fp8Meta::kAmax + 6], 20.0f);
  EXPECT_TRUE(std::isinf(r0[Fp8Meta::kAmax + 8]));
  // The oldest entry falls off the end.
  std::vector<float> old = meta_row(1.0f, E4);
  old[Fp8Meta::kAmax + kFp8History - 1] = 400.0f;
  ref::fp8_scale_update(old.data(), 1);
  EXPECT_EQ(old[Fp8Meta::kScale], 1.0f);  // 448 / 400 -> 1
  ref::fp8_scale_update(old.data(), 1);
  EXPECT_EQ(old[Fp8Meta::kScale], 1.0f);  // nothing left: kept
}

namespace {

struct Mat {
  Buffer buf;
  std::vector<float> host;
};
Mat random_mat(Backend& be, Shape s, Rng& rng, double scale) {
  Mat m{Buffer(be.allocator(), DType::F32, s, Category::Other), std::vector<float>(s.numel())};
  for (auto& v : m.host) v = static_cast<float>(rng.normal() * scale);
  be.upload(m.buf.tensor(), m.host.data());
  return m;
}

}  // namespace

// The twin's GEMM multiplies the quantized operands: equal to the F32 GEMM of fp8_round'ed values,
// near (not equal to) the exact product, with both amaxes recorded.
TEST(Fp8, TheCpuGemmMultipliesTheQuantizedOperands) {
  ANATOMY_FRESH_RNG(rng);
  auto be = make_cpu_backend(1);
  const int64_t M = 7, N = 5, K = 33;
  Mat a = random_mat(*be, {M, K}, rng, 1.0), b = random_mat(*be, {N, K}, rng, 0.05);
  Buffer c(be->allocator(), DType::F32, {M, N}, Category::Other);
  Buffer meta(be->allocator(), DType::F32, {2, kFp8MetaWidth}, Category::Other);
  std::vector<float> m = meta_row(2.0f, E4), mb = meta_row(1024.0f, E4);
  m.insert(m.end(), mb.begin(), mb.end());
  be->upload(meta.tensor(), m.data());
  MatmulArgs args;
  args.fp8_a = {meta.tensor().slice(0, 1).view({kFp8MetaWidth}), E4};
  args.fp8_b = {meta.tensor().slice(1, 2).view({kFp8MetaWidth}), E4};
  be->matmul(c.tensor(), a.buf.tensor(), Trans::N, b.buf.tensor(), Trans::T, args);
  std::vector<float> got(M * N), after(2 * kFp8MetaWidth);
  be->download(got.data(), c.tensor());
  be->download(after.data(), meta.tensor());
  double err = 0, norm = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double q = 0, exact = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float x = a.host[i * K + k], w = b.host[j * K + k];
        q += double(fp8_round(x * 2.0f, E4) / 2.0f) * double(fp8_round(w * 1024.0f, E4) / 1024.0f);
        exact += double(x) * double(w);
      }
      EXPECT_NEAR(got[i * N + j], q, 1e-5 * (1 + std::fabs(q)));
      err += (q - exact) * (q - exact);
      norm += exact * exact;
    }
  const double rel = std::sqrt(err / norm);
  EXPECT_GT(rel, 1e-4);  // it did quantize
  EXPECT_LT(rel, 0.06);  // E4M3's 3 mantissa bits: a few percent
  float amax_a = 0, amax_b = 0;
  for (float v : a.host) amax_a = std::max(amax_a, std::fabs(v));
  for (float v : b.host) amax_b = std::max(amax_b, std::fabs(v));
  EXPECT_EQ(after[Fp8Meta::kAmax], amax_a);
  EXPECT_EQ(after[kFp8MetaWidth + Fp8Meta::kAmax], amax_b);
}

TEST(Fp8, TheContractRefusesHalfAnOperandPairAndTwoE5M2) {
  auto be = make_cpu_backend(1);
  Allocator& al = be->allocator();
  Buffer a(al, DType::F32, {4, 16}, Category::Other), b(al, DType::F32, {8, 16}, Category::Other);
  Buffer c(al, DType::F32, {4, 8}, Category::Other), meta(al, DType::F32, {2, kFp8MetaWidth}, Category::Other);
  Buffer shortm(al, DType::F32, {7}, Category::Other);
  const Tensor r0 = meta.tensor().slice(0, 1).view({kFp8MetaWidth}), r1 = meta.tensor().slice(1, 2).view({kFp8MetaWidth});
  auto call = [&](Fp8Operand x, Fp8Operand y) {
    MatmulArgs args;
    args.fp8_a = x;
    args.fp8_b = y;
    be->matmul(c.tensor(), a.tensor(), Trans::N, b.tensor(), Trans::T, args);
  };
  auto error = [&](Fp8Operand x, Fp8Operand y) {
    try {
      call(x, y);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error({r0, E4}, {}), "matmul: fp8 needs the scaling rows of both A and B");
  EXPECT_EQ(error({r0, E5}, {r1, E5}), "matmul: fp8 GEMMs take at most one E5M2 operand");
  EXPECT_EQ(error({shortm.tensor(), E4}, {r1, E4}),
            str_cat("matmul: A's fp8 scaling row [7] has 7 elements, expected ", kFp8MetaWidth));
  EXPECT_EQ(error({r0, E4}, {r1, E5}), "accepted");
}

namespace {

struct Fp8Run {
  std::vector<float> grads, losses, meta;
  CategoryBytes peak;
};

// Two forward/backward calls of bert-tiny on one batch (the weights unchanged), the fp8 scales
// updated in between: the second runs at the scales the first measured.
Fp8Run two_calls(const ModelShape& shape) {
  auto be = make_cpu_backend(1);
  BertConfig cfg = BertConfig::preset("bert-tiny");
  Fp8Run out;
  {
    BertForSequenceClassification model(*be, cfg, shape);
    model.init_weights(5);
    model.set_dropout_seed(9);
    const int64_t B = shape.max_batch, T = shape.max_seq;
    Rng rng(17);
    std::vector<int32_t> ids, types(B * T, 0), mask, labels;
    for (int64_t i = 0; i < B * T; ++i) {
      ids.push_back(static_cast<int32_t>(rng.randint(1, cfg.vocab_size)));
      mask.push_back(i % T < T - 3 * (i / T) ? 1 : 0);
    }
    for (int64_t b = 0; b < B; ++b) labels.push_back(static_cast<int32_t>(b % cfg.num_labels));
    Allocator& al = be->allocator();
    Buffer d_ids(al, DType::I32, {B, T}, Category::Other), d_types(al, DType::I32, {B, T}, Category::Other);
    Buffer d_mask(al, DType::I32, {B, T}, Category::Other), d_labels(al, DType::I32, {B}, Category::Other);
    be->upload(d_ids, ids.data());
    be->upload(d_types, types.data());
    be->upload(d_mask, mask.data());
    be->upload(d_labels, labels.data());
    for (int call = 0; call < 2; ++call) {
      model.zero_grads();
      model.forward_backward({d_ids, d_types, d_mask, d_labels}, 1.0f / static_cast<float>(B), 0);
      model.fp8_scale_update();
    }
    out.grads = model.grads_to_host();
    out.losses.resize(static_cast<size_t>(B));
    be->download(out.losses.data(), model.losses());
    out.peak = be->allocator().stats().peak();
  }
  return out;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    n += double(want[i]) * want[i];
  }
  return std::sqrt(e / n);
}

}  // namespace

// The encoder's Linears in fp8 (the CPU twin's arithmetic): loss and gradients near F32's, the
// memory the planner predicts, the scaling rows allocated as optimizer state.
TEST(Fp8, BertTrainsNearF32WithItsLinearsInFp8) {
  const ModelShape f32{4, 16, DType::F32, CheckpointPolicy::None, true, GradientPlacement::Own};
  ModelShape f8 = f32;
  f8.fp8 = true;
  ModelShape e4 = f8;
  e4.fp8_grads = Fp8Format::E4M3;  // --fp8-format e4m3
  const Fp8Run a = two_calls(f32), b = two_calls(f8), c = two_calls(e4);
  const double loss_err = rel_error(b.losses, a.losses), grad_err = rel_error(b.grads, a.grads);
  const double e4_grad_err = rel_error(c.grads, a.grads);
  std::printf("fp8 vs f32: loss %.2e, gradients %.2e (relative); with E4M3 gradients %.2e\n", loss_err, grad_err,
              e4_grad_err);
  EXPECT_GT(grad_err, 0.0);  // fp8 changed something
  EXPECT_LT(loss_err, 0.005) << loss_err;
  EXPECT_LT(grad_err, 0.05) << grad_err;
  // One more mantissa bit in the output gradients: the data gradients land closer to F32's.
  EXPECT_GT(e4_grad_err, 0.0);
  EXPECT_LT(e4_grad_err, grad_err);
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  EXPECT_EQ(fp8_meta_bytes(cfg, f8), size_t{2} * 4 * 3 * kFp8MetaWidth * 4);  // 2 layers x 4 sites x 3 roles
  const MemoryPlan plan = plan_memory({cfg, f8, OptimizerKind::AdamW, Device::CPU});
  for (Category c : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
    EXPECT_EQ(b.peak[c], plan.bytes[c]) << category_name(c);
  EXPECT_EQ(b.peak[Category::OptimizerState], static_cast<int64_t>(fp8_meta_bytes(cfg, f8)));
  EXPECT_EQ(a.peak[Category::OptimizerState], 0);
}

// The CUDA plan counts the fp8 operand scratch: bert-large's largest is the FFN-out forward's
// X [16384, 4096] and W [1024, 4096] bytes (and the FFN-in data gradient's, the same size).
TEST(Fp8, TheCudaPlanHoldsTheLargestOperandPair) {
  const BertConfig cfg = BertConfig::preset("bert-large");
  ModelShape s{32, 512, DType::BF16, CheckpointPolicy::None, true, GradientPlacement::Own};
  const MemoryPlan bf16 = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CUDA});
  s.fp8 = true;
  const MemoryPlan fp8 = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CUDA});
  EXPECT_EQ(fp8_layer_scratch_bytes(cfg, s), size_t{16384 + 1024} * 4096);
  EXPECT_EQ(fp8.bytes[Category::Temporary] - bf16.bytes[Category::Temporary], (16384 + 1024) * int64_t{4096});
  EXPECT_EQ(fp8.bytes[Category::OptimizerState] - bf16.bytes[Category::OptimizerState],
            int64_t{24} * 4 * 3 * kFp8MetaWidth * 4);
}
