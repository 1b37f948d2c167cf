// Finite-difference gradient checks of the CPU reference ops, run in double: each backward
// is checked against central differences of L = sum(w * forward(x)) with random weights w.
#include <gtest/gtest.h>

#include "ops/cpu/reference.h"
#include "test_cpu_util.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

// A Linear layer as the model calls it: y = gelu(x W^T + b), x [M, K], W [N, K].
// Backward: dpre = gelu'(pre) dy; dx = dpre W (NN); dW += dpre^T x (TN); db += colsum(dpre).
void linear_grad_check(Epilogue epi) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t M = 3, N = 4, K = 5;
  auto x = randn(rng, M * K), w = randn(rng, N * K), b = randn(rng, N), dy = randn(rng, M * N);
  auto forward = [&](std::vector<double>& y, std::vector<double>& pre) {
    ref::matmul(y.data(), x.data(), Trans::N, w.data(), Trans::T, M, N, K, 1.0, 0.0, epi,
                epi == Epilogue::None ? nullptr : b.data(), pre.data());
  };
  auto loss = [&] {
    std::vector<double> y(M * N), pre(M * N);
    forward(y, pre);
    return dot(y, dy);
  };
  std::vector<double> y(M * N), pre(M * N), dpre = dy;
  forward(y, pre);
  if (epi == Epilogue::BiasGelu)
    ref::gelu_backward(dpre.data(), dy.data(), pre.data(), dpre.size());
  std::vector<double> dx(M * K), dw(N * K, 0.0), db(N, 0.0);
  ref::matmul<double>(dx.data(), dpre.data(), Trans::N, w.data(), Trans::N, M, K, N, 1.0, 0.0,
                      Epilogue::None, nullptr, nullptr);
  ref::matmul<double>(dw.data(), dpre.data(), Trans::T, x.data(), Trans::N, N, K, M, 1.0, 1.0,
                      Epilogue::None, nullptr, nullptr);
  ref::bias_grad(db.data(), dpre.data(), M, N);
  expect_grad(x, dx, loss, "dx");
  expect_grad(w, dw, loss, "dW");
  if (epi != Epilogue::None) expect_grad(b, db, loss, "db");
}

}  // namespace

TEST(CpuGrad, Linear) { linear_grad_check(Epilogue::None); }
TEST(CpuGrad, LinearBias) { linear_grad_check(Epilogue::Bias); }
TEST(CpuGrad, LinearBiasGelu) { linear_grad_check(Epilogue::BiasGelu); }

namespace {

// B = 3 sequences: full, padded (last two keys masked), and all padding (uniform rows).
void attention_grad_check(float p) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 3, T = 5, H = 8;
  const int heads = 2;
  const DropoutSpec drop{p, rng.next(), rng.next()};
  auto qkv = randn(rng, B * T * 3 * H), dctx = randn(rng, B * T * H);
  std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  auto forward = [&](std::vector<double>& ctx, std::vector<double>& lse) {
    ref::attention_forward(ctx.data(), lse.data(), qkv.data(), mask.data(), B, T, H, heads, drop);
  };
  auto loss = [&] {
    std::vector<double> ctx(B * T * H), lse(B * heads * T);
    forward(ctx, lse);
    return dot(ctx, dctx);
  };
  std::vector<double> ctx(B * T * H), lse(B * heads * T), dqkv(qkv.size(), NAN);
  forward(ctx, lse);
  for (double l : lse) ASSERT_TRUE(std::isfinite(l));
  ref::attention_backward(dqkv.data(), dctx.data(), qkv.data(), ctx.data(), lse.data(), mask.data(),
                          B, T, H, heads, drop);
  expect_grad(qkv, dqkv, loss, "dqkv");
  // The fully masked sequence attends uniformly: lse = log T, and q, k get no gradient.
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(lse[(2 * heads + h) * T + t], std::log(5.0), 1e-12);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < 2 * H; ++c) EXPECT_EQ(dqkv[(2 * T + t) * 3 * H + c], 0.0);
}

}  // namespace

TEST(CpuGrad, AttentionWithPaddingMask) { attention_grad_check(0.0f); }
TEST(CpuGrad, AttentionWithPaddingMaskAndDropout) { attention_grad_check(0.3f); }

TEST(CpuGrad, LayerNormWithResidualAndDropout) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t R = 3, Hd = 6;
  const DropoutSpec drop{0.25f, rng.next(), rng.next()};
  auto branch = randn(rng, R * Hd), residual = randn(rng, R * Hd), gamma = randn(rng, Hd),
       beta = randn(rng, Hd), dy = randn(rng, R * Hd);
  const double eps = 1e-5;
  auto forward = [&](std::vector<double>& y, std::vector<double>& sum, std::vector<double>& mean,
                     std::vector<double>& rstd) {
    ref::layernorm_forward(y.data(), sum.data(), mean.data(), rstd.data(), branch.data(),
                           residual.data(), gamma.data(), beta.data(), R, Hd, eps, drop);
  };
  auto loss = [&] {
    std::vector<double> y(R * Hd), sum(R * Hd), mean(R), rstd(R);
    forward(y, sum, mean, rstd);
    return dot(y, dy);
  };
  std::vector<double> y(R * Hd), sum(R * Hd), mean(R), rstd(R);
  forward(y, sum, mean, rstd);
  std::vector<double> dsum(R * Hd), dbranch(R * Hd), dgamma(Hd, 0.0), dbeta(Hd, 0.0);
  ref::layernorm_backward(dsum.data(), dbranch.data(), dgamma.data(), dbeta.data(), dy.data(),
                          y.data(), rstd.data(), gamma.data(), beta.data(), R, Hd, drop);
  expect_grad(branch, dbranch, loss, "dbranch");
  expect_grad(residual, dsum, loss, "dresidual (= dsum)");
  expect_grad(gamma, dgamma, loss, "dgamma");
  expect_grad(beta, dbeta, loss, "dbeta");
}

TEST(CpuGrad, CrossEntropy) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 4, C = 3;
  auto logits = randn(rng, B * C, 2.0);
  std::vector<int32_t> labels(B);
  for (auto& l : labels) l = static_cast<int32_t>(rng.randint(0, C));
  const double grad_scale = 0.37;
  auto loss = [&] {
    std::vector<double> losses(B);
    ref::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), labels.data(),
                       B, C, grad_scale);
    double s = 0;
    for (double l : losses) s += l;
    return s * grad_scale;
  };
  std::vector<double> losses(B), dlogits(B * C);
  ref::cross_entropy(losses.data(), dlogits.data(), logits.data(), labels.data(), B, C, grad_scale);
  expect_grad(logits, dlogits, loss, "dlogits");
}

TEST(CpuGrad, Embedding) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 3, Hd = 4, V = 5, P = 4, TV = 2;
  auto word = randn(rng, V * Hd), pos = randn(rng, P * Hd), type = randn(rng, TV * Hd),
       de = randn(rng, B * T * Hd);
  std::vector<int32_t> ids = {1, 3, 1, 4, 1, 0}, type_ids = {0, 0, 1, 1, 1, 0};
  auto loss = [&] {
    std::vector<double> e(B * T * Hd);
    ref::embedding_forward(e.data(), ids.data(), type_ids.data(), word.data(), pos.data(),
                           type.data(), B, T, Hd, V, P, TV);
    return dot(e, de);
  };
  std::vector<double> dword(V * Hd, 0.0), dpos(P * Hd, 0.0), dtype(TV * Hd, 0.0);
  ref::embedding_backward(dword.data(), dpos.data(), dtype.data(), de.data(), ids.data(),
                          type_ids.data(), B, T, Hd, V, P, TV);
  expect_grad(word, dword, loss, "dword");
  expect_grad(pos, dpos, loss, "dpos");
  expect_grad(type, dtype, loss, "dtype");
}

namespace {
// y = f(x) element-wise; backward(dx, dy, x, y) is checked against differences of sum(w * y).
void elementwise_grad_check(
    const std::string& what, const std::function<void(double*, const double*, size_t)>& fwd,
    const std::function<void(double*, const double*, const double*, const double*, size_t)>& bwd) {
  ANATOMY_FRESH_RNG(rng);
  const size_t n = 40;
  auto x = randn(rng, n, 2.0), w = randn(rng, n);
  auto loss = [&] {
    std::vector<double> y(n);
    fwd(y.data(), x.data(), n);
    return dot(y, w);
  };
  std::vector<double> y(n), dx(n);
  fwd(y.data(), x.data(), n);
  bwd(dx.data(), w.data(), x.data(), y.data(), n);
  expect_grad(x, dx, loss, what);
}
}  // namespace

TEST(CpuGrad, Gelu) {
  elementwise_grad_check(
      "gelu", [](double* y, const double* x, size_t n) { ref::gelu_forward(y, x, n); },
      [](double* dx, const double* dy, const double* x, const double*, size_t n) {
        ref::gelu_backward(dx, dy, x, n);
      });
}

TEST(CpuGrad, Tanh) {
  elementwise_grad_check(
      "tanh", [](double* y, const double* x, size_t n) { ref::tanh_forward(y, x, n); },
      [](double* dx, const double* dy, const double*, const double* y, size_t n) {
        ref::tanh_backward(dx, dy, y, n);
      });
}

TEST(CpuGrad, Dropout) {
  const DropoutSpec d{0.4f, 1234, 56};
  elementwise_grad_check(
      "dropout", [d](double* y, const double* x, size_t n) { ref::dropout_forward(y, x, n, d); },
      [d](double* dx, const double* dy, const double*, const double*, size_t n) {
        ref::dropout_backward(dx, dy, n, d);
      });
}

TEST(CpuGrad, SelectToken) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 3, Hd = 4, t = 1;
  auto x = randn(rng, B * T * Hd), w = randn(rng, B * Hd);
  auto loss = [&] {
    std::vector<double> out(B * Hd);
    ref::select_token(out.data(), x.data(), B, T, Hd, t);
    return dot(out, w);
  };
  std::vector<double> dx(x.size(), NAN);
  ref::select_token_backward(dx.data(), w.data(), B, T, Hd, t);
  expect_grad(x, dx, loss, "dx");
}
