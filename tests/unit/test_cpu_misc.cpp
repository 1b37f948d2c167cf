// CpuBackend: optimizer updates by hand arithmetic, gradient clipping, data movement across
// dtypes, and one-line errors on bad input.
#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/backend.h"
#include "ops/cpu/reference.h"
#include "test_cpu_util.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

class CpuMisc : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
};

// Runs f, expects anatomy::Error, and returns its message (which must be one line).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  ADD_FAILURE() << "expected anatomy::Error";
  return "";
}

}  // namespace

TEST_F(CpuMisc, GradientNormSumsBlocksThenPartials) {
  // Two blocks and a short third: partials are the blocks' sums, their sum the norm.
  std::vector<float> x(2 * kNormBlock + 3, 0.0f), out = {10};
  x[0] = 1;
  x[kNormBlock] = 2;
  x[2 * kNormBlock + 2] = 3;
  std::vector<float> partials(3, -1.0f);
  be->block_sum_squares(host(partials, {3}), host(x, {static_cast<int64_t>(x.size())}));
  EXPECT_EQ(partials, (std::vector<float>{1, 4, 9}));
  be->sum_blocks(host(out, {1}), host(partials, {3}));
  EXPECT_EQ(out[0], 14.0f);  // overwritten, not accumulated
}

TEST_F(CpuMisc, AdamWOneStepByHand) {
  // p = 1, g = 0.5, lr 0.1, wd 0.01, step 1: decay -> 0.999; m = (1-b1) 0.5, v = (1-b2) 0.25;
  // mhat = 0.5, vhat = 0.25; p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8). The betas are the float
  // values AdamWArgs holds (1 - 0.9f is 0.1 only to 2.4e-7; PyTorch's betas are doubles).
  const double b1 = 0.9f, b2 = 0.999f, lr = 0.1f, wd = 0.01f, eps = 1e-8f;
  std::vector<float> p = {1}, m = {0}, v = {0}, g = {0.5f};
  AdamWArgs a;
  a.lr = 0.1f;
  a.weight_decay = 0.01f;
  GradTransform t;
  t.max_norm = 0;  // no clipping, norm_sq unused
  be->adamw_update(host(p, {1}), host(m, {1}), host(v, {1}), Tensor(), host(g, {1}), t, a);
  EXPECT_NEAR(p[0], (1 - lr * wd) - lr * 0.5 / (0.5 + eps), 1e-7);
  EXPECT_NEAR(p[0], 0.899, 1e-6);
  EXPECT_NEAR(m[0], (1 - b1) * 0.5, 1e-9);
  EXPECT_NEAR(v[0], (1 - b2) * 0.25, 1e-11);
  // Step 2 with g = -0.5.
  g[0] = -0.5f;
  a.step = 2;
  const double p1 = p[0], m2 = b1 * m[0] - (1 - b1) * 0.5, v2 = b2 * v[0] + (1 - b2) * 0.25;
  be->adamw_update(host(p, {1}), host(m, {1}), host(v, {1}), Tensor(), host(g, {1}), t, a);
  const double mh = m2 / (1 - b1 * b1), vh = v2 / (1 - b2 * b2);
  EXPECT_NEAR(m[0], m2, 1e-9);
  EXPECT_NEAR(p[0], p1 * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + eps), 1e-7);
}

TEST_F(CpuMisc, AdamWMatchesDoubleReferenceAndWritesHalfCopy) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t n = 100;
  auto p = randn<float>(rng, n), m = randn<float>(rng, n, 0.1), g = randn<float>(rng, n, 1000);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 0.01);
  auto pd = to_double(p), md = to_double(m), vd = to_double(v);
  std::vector<float> norm_sq = {0};
  norm_sq_of(*be, norm_sq, g);
  std::vector<uint16_t> half(n, 0xffff);
  Tensor half_t(half.data(), DType::BF16, Shape{n}, Device::CPU);
  GradTransform t{host(norm_sq, {1}), 1.0f / 1024, 1.0f};
  AdamWArgs a;
  a.weight_decay = 0.01f;
  a.lr = 1e-3f;
  a.step = 3;
  be->adamw_update(host(p, {n}), host(m, {n}), host(v, {n}), half_t, host(g, {n}), t, a);
  ref::adamw_update(pd.data(), md.data(), vd.data(), to_double(g).data(), n,
                    ref::grad_factor(norm_sq[0], 1.0 / 1024, 1.0), a);
  expect_close(p, pd, 1e-6, "params");
  expect_close(m, md, 1e-6, "m");
  expect_close(v, vd, 1e-6, "v");
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(half[i], f32_to_bf16(p[i]));
}

TEST_F(CpuMisc, ClippingScalesTheGradient) {
  // grads [3, 4] * 1024 with inv_loss_scale 1/1024: true norm 5, max_norm 1 -> g = [0.6, 0.8]
  // (times 5 / (5 + 1e-6)). SGD without momentum and lr 1 applies -g.
  std::vector<float> p = {0, 0}, g = {3 * 1024.0f, 4 * 1024.0f}, norm_sq = {0};
  norm_sq_of(*be, norm_sq, g);
  SgdArgs a;
  a.lr = 1;
  a.momentum = 0;
  GradTransform t{host(norm_sq, {1}), 1.0f / 1024, 1.0f};
  be->sgd_update(host(p, {2}), Tensor(), Tensor(), host(g, {2}), t, a);
  const double c = 1.0 / (5 + 1e-6);
  EXPECT_NEAR(p[0], -3 * c, 1e-6);
  EXPECT_NEAR(p[1], -4 * c, 1e-6);
  // Below max_norm, nothing is clipped: only the loss scale is undone.
  p = {0, 0};
  t.max_norm = 10;
  be->sgd_update(host(p, {2}), Tensor(), Tensor(), host(g, {2}), t, a);
  EXPECT_NEAR(p[0], -3, 1e-6);
  EXPECT_NEAR(p[1], -4, 1e-6);
}

TEST_F(CpuMisc, SgdMomentumAndNesterovByHand) {
  GradTransform t;
  t.max_norm = 0;
  SgdArgs a;
  a.lr = 0.1f;
  a.momentum = 0.9f;
  a.weight_decay = 0.5f;
  std::vector<float> p = {1}, buf = {0}, g = {2};
  // Step 1: g' = 2 + 0.5 * 1 = 2.5, buf = 2.5, p = 1 - 0.25 = 0.75.
  be->sgd_update(host(p, {1}), host(buf, {1}), Tensor(), host(g, {1}), t, a);
  EXPECT_NEAR(buf[0], 2.5, 1e-6);
  EXPECT_NEAR(p[0], 0.75, 1e-6);
  // Step 2: g' = 2 + 0.375 = 2.375, buf = 2.25 + 2.375 = 4.625, p = 0.75 - 0.4625.
  be->sgd_update(host(p, {1}), host(buf, {1}), Tensor(), host(g, {1}), t, a);
  EXPECT_NEAR(buf[0], 4.625, 1e-6);
  EXPECT_NEAR(p[0], 0.2875, 1e-6);
  // Nesterov: buf = 0.9 * 4.625 + g', step g' + 0.9 * buf.
  a.nesterov = true;
  const double gp = 2 + 0.5 * 0.2875, b = 0.9 * 4.625 + gp;
  be->sgd_update(host(p, {1}), host(buf, {1}), Tensor(), host(g, {1}), t, a);
  EXPECT_NEAR(buf[0], b, 1e-5);
  EXPECT_NEAR(p[0], 0.2875 - 0.1 * (gp + 0.9 * b), 1e-5);
}

TEST_F(CpuMisc, CastFillCopyAcrossDtypes) {
  std::vector<float> src = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-8f}, back = poisoned(5);
  std::vector<uint16_t> bf(5), hf(5);
  Tensor bf_t(bf.data(), DType::BF16, Shape{5}, Device::CPU);
  Tensor hf_t(hf.data(), DType::F16, Shape{5}, Device::CPU);
  be->cast(bf_t, host(src, {5}));
  be->cast(hf_t, host(src, {5}));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(bf[i], f32_to_bf16(src[i]));
    EXPECT_EQ(hf[i], f32_to_f16(src[i]));
  }
  be->cast(host(back, {5}), hf_t);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[i], f16_to_f32(hf[i]));
  be->cast(hf_t, bf_t);  // half to half goes through float
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hf[i], f32_to_f16(bf16_to_f32(bf[i])));

  be->fill(bf_t, 0.5f);
  for (uint16_t h : bf) EXPECT_EQ(bf16_to_f32(h), 0.5f);
  std::vector<int32_t> ids(3), ids2(3);
  be->fill(host(ids, {3}), 7);
  EXPECT_EQ(ids, std::vector<int32_t>(3, 7));
  be->copy(host(ids2, {3}), host(ids, {3}));
  EXPECT_EQ(ids2, ids);
  std::vector<float> up = poisoned(5), down(5);
  be->upload(host(up, {5}), src.data());
  be->download(down.data(), host(up, {5}));
  EXPECT_EQ(down, src);
  EXPECT_THROW(be->cast(host(ids, {3}), Tensor(back.data(), DType::F32, Shape{3}, Device::CPU)),
               Error);
  EXPECT_THROW(be->copy(bf_t, host(src, {5})), Error);
}

TEST_F(CpuMisc, LabelOutOfRangeIsAOneLineError) {
  std::vector<float> logits(6), losses(2), dlogits(6);
  for (int32_t bad : {3, -100}) {
    std::vector<int32_t> labels = {0, bad};
    const std::string m = error_of([&] {
      be->cross_entropy(host(losses, {2}), host(dlogits, {2, 3}), host(logits, {2, 3}),
                        host(labels, {2}), 1.0f);
    });
    EXPECT_NE(m.find("label " + std::to_string(bad)), std::string::npos) << m;
    EXPECT_NE(m.find("3 classes"), std::string::npos) << m;
  }
}

TEST_F(CpuMisc, TokenIdOutOfVocabIsAOneLineError) {
  const int64_t V = 5, Hd = 2;
  std::vector<float> word(V * Hd), pos(4 * Hd), type(2 * Hd), e(2 * Hd);
  std::vector<int32_t> ids = {1, 5}, type_ids = {0, 0};
  std::string m = error_of([&] {
    be->embedding_forward(host(e, {2, Hd}), host(ids, {1, 2}), host(type_ids, {1, 2}),
                          host(word, {V, Hd}), host(pos, {4, Hd}), host(type, {2, Hd}));
  });
  EXPECT_NE(m.find("token id 5"), std::string::npos) << m;
  EXPECT_NE(m.find("vocab_size 5"), std::string::npos) << m;
  ids = {1, 2};
  type_ids = {0, 2};
  m = error_of([&] {
    be->embedding_forward(host(e, {2, Hd}), host(ids, {1, 2}), host(type_ids, {1, 2}),
                          host(word, {V, Hd}), host(pos, {4, Hd}), host(type, {2, Hd}));
  });
  EXPECT_NE(m.find("token type id 2"), std::string::npos) << m;
}

TEST_F(CpuMisc, WrongDtypeIsRejected) {
  std::vector<uint16_t> x(4), y(4);
  Tensor xt(x.data(), DType::BF16, Shape{4}, Device::CPU),
      yt(y.data(), DType::BF16, Shape{4}, Device::CPU);
  const std::string m = error_of([&] { be->gelu_forward(yt, xt); });
  EXPECT_NE(m.find("BF16"), std::string::npos) << m;
  std::vector<float> f(4);
  Tensor gpu(f.data(), DType::F32, Shape{4}, Device::CUDA);
  EXPECT_THROW(be->tanh_forward(host(f, {4}), gpu), Error);
}
