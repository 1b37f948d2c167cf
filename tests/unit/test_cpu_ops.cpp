// CpuBackend: the float ops against the double reference on fresh random inputs (outputs
// poisoned with NaN first), hand-checked small cases, and errors on bad input.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/cpu/reference.h"
#include "test_cpu_util.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

class CpuOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
};

// A naive triple loop: C = alpha * op(A) op(B) + beta * C.
std::vector<double> naive_gemm(const std::vector<double>& a, Trans ta, const std::vector<double>& b,
                               Trans tb, std::vector<double> c, int64_t M, int64_t N, int64_t K,
                               double alpha, double beta) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (ta == Trans::N ? a[i * K + k] : a[k * M + i]) *
             (tb == Trans::N ? b[k * N + j] : b[j * K + k]);
      c[i * N + j] = alpha * s + beta * c[i * N + j];
    }
  return c;
}

}  // namespace

TEST_F(CpuOps, MatmulAllTransposesAlphaBetaEpilogues) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t M = 5, N = 7, K = 6;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      for (Epilogue epi : {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu})
        for (float beta : {0.0f, 0.5f}) {
          auto a = randn<float>(rng, M * K), b = randn<float>(rng, K * N),
               bias = randn<float>(rng, N);
          auto c = beta == 0.0f ? poisoned(M * N) : randn<float>(rng, M * N);
          auto gelu_in = poisoned(M * N);
          const float alpha = 0.75f;
          auto want =
              naive_gemm(to_double(a), ta, to_double(b), tb, to_double(c), M, N, K, alpha, beta);
          if (beta == 0.0f)
            want = naive_gemm(to_double(a), ta, to_double(b), tb, std::vector<double>(M * N), M, N,
                              K, alpha, 0);
          std::vector<double> want_pre = want;
          for (int64_t i = 0; i < M * N; ++i) {
            if (epi != Epilogue::None) want_pre[i] = want[i] + bias[i % N];
            want[i] = epi == Epilogue::BiasGelu
                          ? 0.5 * want_pre[i] * (1 + std::erf(want_pre[i] / std::sqrt(2.0)))
                          : want_pre[i];
          }
          MatmulArgs args;
          args.alpha = alpha;
          args.beta = beta;
          args.epilogue = epi;
          if (epi != Epilogue::None) args.bias = host(bias, {N});
          if (epi == Epilogue::BiasGelu) args.gelu_in = host(gelu_in, {M, N});
          be->matmul(host(c, {M, N}), host(a, ta == Trans::N ? Shape{M, K} : Shape{K, M}), ta,
                     host(b, tb == Trans::N ? Shape{K, N} : Shape{N, K}), tb, args);
          const std::string what = std::string("C ta=") + (ta == Trans::T ? "T" : "N") +
                                   " tb=" + (tb == Trans::T ? "T" : "N") +
                                   " epi=" + std::to_string(int(epi)) +
                                   " beta=" + std::to_string(beta);
          expect_close(c, want, 1e-5, what);
          if (epi == Epilogue::BiasGelu) expect_close(gelu_in, want_pre, 1e-5, what + " gelu_in");
        }
}


// Note [fused bias gradient]: the weight gradient dW = dY^T X with db = the column sums of dY in
// one call is the GEMM then bias_grad, bit for bit (the CPU golden tests rely on it), writing
// with beta 0 (both start as NaN) and accumulating with beta 1; and both against float64.
TEST_F(CpuOps, MatmulBiasGradIsTheGemmThenBiasGrad) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t rows = 37, out = 11, in = 9;
  for (float beta : {0.0f, 1.0f}) {
    SCOPED_TRACE("beta " + std::to_string(beta));
    auto dy = randn<float>(rng, rows * out), x = randn<float>(rng, rows * in);
    auto dw = beta == 0.0f ? poisoned(out * in) : randn<float>(rng, out * in);
    auto db = beta == 0.0f ? poisoned(out) : randn<float>(rng, out);
    auto dw_two = beta == 0.0f ? std::vector<float>(out * in, 0.0f) : dw;
    auto db_two = beta == 0.0f ? std::vector<float>(out, 0.0f) : db;
    std::vector<double> want_db = to_double(db_two);
    const auto want_dw = naive_gemm(to_double(dy), Trans::T, to_double(x), Trans::N, to_double(dw_two), out, in, rows,
                                    1.0, beta);
    ref::bias_grad(want_db.data(), to_double(dy).data(), rows, out);
    be->matmul(host(dw, {out, in}), host(dy, {rows, out}), Trans::T, host(x, {rows, in}), Trans::N,
               {1, beta, Epilogue::BiasGrad, host(db, {out}), {}});
    be->matmul(host(dw_two, {out, in}), host(dy, {rows, out}), Trans::T, host(x, {rows, in}), Trans::N,
               {1, beta, Epilogue::None, {}, {}});
    be->bias_grad(host(db_two, {out}), host(dy, {rows, out}));
    EXPECT_EQ(0, std::memcmp(dw.data(), dw_two.data(), dw.size() * sizeof(float))) << "dW differs from the GEMM";
    EXPECT_EQ(0, std::memcmp(db.data(), db_two.data(), db.size() * sizeof(float))) << "db differs from bias_grad";
    expect_close(dw, want_dw, 1e-5, "dW");
    expect_close(db, want_db, 1e-5, "db");
  }
}
TEST_F(CpuOps, MatmulShapeMismatchThrows) {
  std::vector<float> a(6), b(6), c(4);
  EXPECT_THROW(
      be->matmul(host(c, {2, 2}), host(a, {2, 3}), Trans::N, host(b, {2, 3}), Trans::N, {}), Error);
}

TEST_F(CpuOps, BiasGradAccumulates) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t R = 9, N = 70;  // N spans two column blocks
  auto dy = randn<float>(rng, R * N), db = randn<float>(rng, N);
  auto want = to_double(db);
  ref::bias_grad(want.data(), to_double(dy).data(), R, N);
  be->bias_grad(host(db, {N}), host(dy, {R, N}));
  expect_close(db, want, 1e-6, "db");
}

TEST_F(CpuOps, AttentionMatchesDoubleReference) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 6, H = 12;
  const int heads = 3;
  const DropoutSpec drop{0.2f, rng.next(), rng.next()};
  auto qkv = randn<float>(rng, B * T * 3 * H), dctx = randn<float>(rng, B * T * H);
  std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
  auto ctx = poisoned(B * T * H), lse = poisoned(B * heads * T), dqkv = poisoned(qkv.size());
  const auto db0 = randn<float>(rng, 3 * H);
  auto db = db0, want_db = db0;  // the q|k|v bias gradient: += the column sums of dqkv
  be->attention_forward(host(ctx, {B, T, H}), host(lse, {B, heads, T}), host(qkv, {B, T, 3 * H}),
                        host(mask, {B, T}), heads, drop);
  be->attention_backward(host(dqkv, {B, T, 3 * H}), host(dctx, {B, T, H}), host(qkv, {B, T, 3 * H}),
                         host(ctx, {B, T, H}), host(lse, {B, heads, T}), host(mask, {B, T}), heads,
                         drop, {}, host(db, {3 * H}));
  be->bias_grad(host(want_db, {3 * H}), host(dqkv, {B * T, 3 * H}));
  EXPECT_EQ(0, std::memcmp(db.data(), want_db.data(), db.size() * sizeof(float)));
  EXPECT_NE(db, db0);
  std::vector<double> ctx_d(ctx.size()), lse_d(lse.size()), dqkv_d(qkv.size());
  auto qkv_d = to_double(qkv);
  ref::attention_forward(ctx_d.data(), lse_d.data(), qkv_d.data(), mask.data(), B, T, H, heads,
                         drop);
  ref::attention_backward(dqkv_d.data(), to_double(dctx).data(), qkv_d.data(), ctx_d.data(),
                          lse_d.data(), mask.data(), B, T, H, heads, drop);
  expect_close(ctx, ctx_d, 1e-5, "ctx");
  expect_close(lse, lse_d, 1e-5, "lse");
  expect_close(dqkv, dqkv_d, 1e-4, "dqkv");
}

// Note [fused bias gradient]: the packed attention backward's dbias adds the column sums of the
// dqkv it wrote (the padded one: AttentionMatchesDoubleReference), bit for bit what bias_grad adds.
TEST_F(CpuOps, PackedAttentionBackwardAddsTheColumnSumsOfDqkv) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 5, H = 8, N = 7;  // sequences of 4 and 2 tokens, then 1 padding row
  const int heads = 2;
  const DropoutSpec drop{0.2f, rng.next(), rng.next()};
  std::vector<int32_t> offsets = {0, 4, 6};
  auto qkv = randn<float>(rng, N * 3 * H), dctx = randn<float>(rng, N * H);
  auto ctx = poisoned(N * H), lse = poisoned(B * heads * T), dqkv = poisoned(qkv.size());
  const auto db0 = randn<float>(rng, 3 * H);
  auto db = db0, want = db0;
  be->attention_packed_forward(host(ctx, {N, H}), host(lse, {B, heads, T}), host(qkv, {N, 3 * H}),
                               host(offsets, {B + 1}), heads, drop, 16 + 4);
  be->attention_packed_backward(host(dqkv, {N, 3 * H}), host(dctx, {N, H}), host(qkv, {N, 3 * H}), host(ctx, {N, H}),
                                host(lse, {B, heads, T}), host(offsets, {B + 1}), heads, drop, 16 + 4, {},
                                host(db, {3 * H}));
  be->bias_grad(host(want, {3 * H}), host(dqkv, {N, 3 * H}));
  EXPECT_EQ(0, std::memcmp(db.data(), want.data(), db.size() * sizeof(float)));
  EXPECT_NE(db, db0);
}

// Note [attention scope] (ops/op_args.h): the CPU twin computes each sequence's first `queries`
// queries, as every query does, gives the later ones a zero context and an lse of +inf, and with
// dctx zero past them its backward equals the backward of every query; padded and packed.
TEST_F(CpuOps, AttentionScopeComputesTheFirstQueries) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 6, H = 8, N = 9;  // packed: sequences of 6 and 3 tokens
  const int heads = 2, queries = 2;
  const DropoutSpec drop{0.2f, rng.next(), rng.next()};
  std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, offsets = {0, 6, 9};
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "padded");
    const int64_t rows = packed ? N : B * T;
    auto qkv = randn<float>(rng, rows * 3 * H), dctx = randn<float>(rng, rows * H);
    auto query = [&](int64_t r) { return packed ? (r < 6 ? r : r - 6) : r % T; };
    for (int64_t r = 0; r < rows; ++r)
      if (query(r) >= queries) std::fill(dctx.begin() + r * H, dctx.begin() + (r + 1) * H, 0.0f);
    std::vector<float> ctx[2], lse[2], dqkv[2];
    for (int scoped = 0; scoped < 2; ++scoped) {
      ctx[scoped] = poisoned(rows * H), lse[scoped] = poisoned(B * heads * T), dqkv[scoped] = poisoned(qkv.size());
      const AttentionScope scope{0, scoped ? queries : 0};
      const Tensor c = host(ctx[scoped], {rows, H}), l = host(lse[scoped], {B, heads, T}), d = host(dqkv[scoped], {rows, 3 * H});
      if (packed) {
        const int64_t pairs = scoped ? 2 * 6 + 2 * 3 : 36 + 9;
        be->attention_packed_forward(c, l, host(qkv, {N, 3 * H}), host(offsets, {B + 1}), heads, drop, pairs, scope);
        be->attention_packed_backward(d, host(dctx, {N, H}), host(qkv, {N, 3 * H}), c, l, host(offsets, {B + 1}), heads,
                                      drop, pairs, scope);
      } else {
        be->attention_forward(c.view({B, T, H}), l, host(qkv, {B, T, 3 * H}), host(mask, {B, T}), heads, drop, scope);
        be->attention_backward(d.view({B, T, 3 * H}), host(dctx, {B, T, H}), host(qkv, {B, T, 3 * H}), c.view({B, T, H}),
                               l, host(mask, {B, T}), heads, drop, scope);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = packed ? (r < 6 ? 0 : 1) : r / T, q = query(r);
      for (int64_t j = 0; j < H; ++j)
        EXPECT_EQ(ctx[1][r * H + j], q < queries ? ctx[0][r * H + j] : 0.0f) << "row " << r;
      for (int h = 0; h < heads; ++h) {
        const size_t li = static_cast<size_t>((b * heads + h) * T + q);
        EXPECT_EQ(lse[1][li], q < queries ? lse[0][li] : INFINITY) << "row " << r;
      }
    }
    EXPECT_EQ(dqkv[1], dqkv[0]);
  }
}

TEST_F(CpuOps, AttentionHandCase) {
  // One head of width 1, two keys: scores [0, ln 3] -> probs [1/4, 3/4]; ctx = 4/4 + 3*8/4 = 7.
  std::vector<float> qkv = {1, 0, 4, 0, std::log(3.0f), 8}, ctx = poisoned(2), lse = poisoned(2);
  std::vector<int32_t> mask = {1, 1};
  be->attention_forward(host(ctx, {1, 2, 1}), host(lse, {1, 1, 2}), host(qkv, {1, 2, 3}),
                        host(mask, {1, 2}), 1, {});
  EXPECT_NEAR(ctx[0], 7.0, 1e-5);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
  // Masking key 1 leaves all the weight on key 0.
  mask = {1, 0};
  be->attention_forward(host(ctx, {1, 2, 1}), host(lse, {1, 1, 2}), host(qkv, {1, 2, 3}),
                        host(mask, {1, 2}), 1, {});
  EXPECT_NEAR(ctx[0], 4.0, 1e-6);
  EXPECT_NEAR(lse[0], 0.0, 1e-6);
}

TEST_F(CpuOps, LayerNormMatchesDoubleReference) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t R = 5, Hd = 70;
  const DropoutSpec drop{0.1f, rng.next(), rng.next()};
  auto branch = randn<float>(rng, R * Hd), residual = randn<float>(rng, R * Hd),
       gamma = randn<float>(rng, Hd), beta = randn<float>(rng, Hd), dy = randn<float>(rng, R * Hd);
  // Backward divides by gamma (Note [layernorm backward from its output]): keep |gamma| >= 0.25,
  // as LayerNorm weights are in practice, so float rounding of y is not magnified.
  for (auto& g : gamma) g = std::copysign(0.25f + std::fabs(g), g);
  auto dgamma = randn<float>(rng, Hd), dbeta = randn<float>(rng, Hd);
  auto y = poisoned(R * Hd), sum = poisoned(R * Hd), mean = poisoned(R), rstd = poisoned(R),
       dsum = poisoned(R * Hd), dbranch = poisoned(R * Hd);
  be->layernorm_forward(host(y, {R, Hd}), host(sum, {R, Hd}), host(mean, {R}), host(rstd, {R}),
                        host(branch, {R, Hd}), host(residual, {R, Hd}), host(gamma, {Hd}),
                        host(beta, {Hd}), 1e-12f, drop);
  std::vector<double> y_d(y.size()), sum_d(y.size()), mean_d(R), rstd_d(R), dsum_d(y.size()),
      dbranch_d(y.size()), dgamma_d = to_double(dgamma), dbeta_d = to_double(dbeta);
  ref::layernorm_forward(y_d.data(), sum_d.data(), mean_d.data(), rstd_d.data(),
                         to_double(branch).data(), to_double(residual).data(),
                         to_double(gamma).data(), to_double(beta).data(), R, Hd, 1e-12f, drop);
  expect_close(y, y_d, 1e-5, "y");
  expect_close(sum, sum_d, 1e-6, "sum");
  expect_close(mean, mean_d, 1e-5, "mean");
  expect_close(rstd, rstd_d, 1e-5, "rstd");
  be->layernorm_backward(host(dsum, {R, Hd}), host(dbranch, {R, Hd}), host(dgamma, {Hd}),
                         host(dbeta, {Hd}), host(dy, {R, Hd}), host(y, {R, Hd}), host(rstd, {R}),
                         host(gamma, {Hd}), host(beta, {Hd}), drop);
  ref::layernorm_backward(dsum_d.data(), dbranch_d.data(), dgamma_d.data(), dbeta_d.data(),
                          to_double(dy).data(), y_d.data(), rstd_d.data(), to_double(gamma).data(),
                          to_double(beta).data(), R, Hd, drop);
  expect_close(dsum, dsum_d, 1e-4, "dsum");
  expect_close(dbranch, dbranch_d, 1e-4, "dbranch");
  expect_close(dgamma, dgamma_d, 1e-4, "dgamma");
  expect_close(dbeta, dbeta_d, 1e-5, "dbeta");
}

// Note [layernorm backward from its output]: backward reads xhat back from y. It must agree
// with the textbook backward from the saved input, here written out in double, and forward
// without a stored sum must give the same outputs as with one.
TEST_F(CpuOps, LayerNormBackwardFromOutputEqualsBackwardFromInput) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t R = 7, Hd = 48;
  const DropoutSpec drop{0.2f, rng.next(), rng.next()};
  auto branch = randn<float>(rng, R * Hd), residual = randn<float>(rng, R * Hd), dy = randn<float>(rng, R * Hd);
  std::vector<float> gamma(Hd), beta = randn<float>(rng, Hd);
  for (auto& g : gamma) g = static_cast<float>(0.5 + rng.uniform());  // trained LayerNorm weights stay away from 0
  auto y = poisoned(R * Hd), y2 = poisoned(R * Hd), sum = poisoned(R * Hd), mean = poisoned(R), rstd = poisoned(R);
  be->layernorm_forward(host(y, {R, Hd}), host(sum, {R, Hd}), host(mean, {R}), host(rstd, {R}), host(branch, {R, Hd}),
                        host(residual, {R, Hd}), host(gamma, {Hd}), host(beta, {Hd}), 1e-12f, drop);
  be->layernorm_forward(host(y2, {R, Hd}), Tensor(), host(mean, {R}), host(rstd, {R}), host(branch, {R, Hd}),
                        host(residual, {R, Hd}), host(gamma, {Hd}), host(beta, {Hd}), 1e-12f, drop);
  EXPECT_EQ(y, y2);
  auto dsum = poisoned(R * Hd);
  std::vector<float> dgamma(Hd, 0.0f), dbeta(Hd, 0.0f);
  be->layernorm_backward(host(dsum, {R, Hd}), Tensor(), host(dgamma, {Hd}), host(dbeta, {Hd}), host(dy, {R, Hd}),
                         host(y, {R, Hd}), host(rstd, {R}), host(gamma, {Hd}), host(beta, {Hd}), {});
  for (int64_t r = 0; r < R; ++r) {
    double mu = 0, var = 0, mg = 0, mgx = 0;
    for (int64_t j = 0; j < Hd; ++j) mu += sum[r * Hd + j];
    mu /= Hd;
    for (int64_t j = 0; j < Hd; ++j) var += (sum[r * Hd + j] - mu) * (sum[r * Hd + j] - mu);
    const double rs = 1.0 / std::sqrt(var / Hd + 1e-12);
    for (int64_t j = 0; j < Hd; ++j) {
      const double g = static_cast<double>(dy[r * Hd + j]) * gamma[j];
      mg += g / Hd;
      mgx += g * (sum[r * Hd + j] - mu) * rs / Hd;
    }
    for (int64_t j = 0; j < Hd; ++j) {
      const double xhat = (sum[r * Hd + j] - mu) * rs;
      const double want = rs * (static_cast<double>(dy[r * Hd + j]) * gamma[j] - mg - xhat * mgx);
      EXPECT_NEAR(dsum[r * Hd + j], want, 1e-4 * (1 + std::fabs(want))) << "row " << r << " col " << j;
    }
  }
}

TEST_F(CpuOps, LayerNormBackwardWithAZeroGammaColumnStaysFinite) {
  const int64_t R = 2, Hd = 4;
  std::vector<float> x = {1, 2, 3, 4, -1, 0, 5, 2}, gamma = {1, 0, 2, 1}, beta = {0, 3, 0, 1}, dy = {1, 1, 1, 1, 2, -1, 0, 1};
  auto y = poisoned(R * Hd), mean = poisoned(R), rstd = poisoned(R), dsum = poisoned(R * Hd);
  std::vector<float> dgamma(Hd, 0.0f), dbeta(Hd, 0.0f);
  be->layernorm_forward(host(y, {R, Hd}), Tensor(), host(mean, {R}), host(rstd, {R}), host(x, {R, Hd}), Tensor(),
                        host(gamma, {Hd}), host(beta, {Hd}), 1e-5f, {});
  be->layernorm_backward(host(dsum, {R, Hd}), Tensor(), host(dgamma, {Hd}), host(dbeta, {Hd}), host(dy, {R, Hd}),
                         host(y, {R, Hd}), host(rstd, {R}), host(gamma, {Hd}), host(beta, {Hd}), {});
  for (float v : dsum) EXPECT_TRUE(std::isfinite(v));  // finite, though not exact in these rows (see the note)
  EXPECT_EQ(dgamma[1], 0.0f);  // the column whose gamma is zero: xhat counted as 0
  EXPECT_FLOAT_EQ(dbeta[1], 0.0f);  // dy of column 1 sums to 1 - 1
  EXPECT_FLOAT_EQ(dbeta[0], 3.0f);
}

TEST_F(CpuOps, LayerNormHandCaseWithoutResidual) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25.
  std::vector<float> x = {1, 2, 3, 4}, gamma = {1, 1, 2, 1}, beta = {0, 0, 0, 1};
  auto y = poisoned(4), sum = poisoned(4), mean = poisoned(1), rstd = poisoned(1);
  be->layernorm_forward(host(y, {1, 4}), host(sum, {1, 4}), host(mean, {1}), host(rstd, {1}),
                        host(x, {1, 4}), Tensor(), host(gamma, {4}), host(beta, {4}), 1e-5f, {});
  const double rs = 1.0 / std::sqrt(1.25 + 1e-5);
  EXPECT_NEAR(mean[0], 2.5, 1e-6);
  EXPECT_NEAR(rstd[0], rs, 1e-6);
  EXPECT_NEAR(y[0], -1.5 * rs, 1e-6);
  EXPECT_NEAR(y[2], 2 * 0.5 * rs, 1e-6);
  EXPECT_NEAR(y[3], 1.5 * rs + 1, 1e-6);
  EXPECT_EQ(sum, x);
}

TEST_F(CpuOps, CrossEntropyHandCase) {
  // logits log[1, 2, 3]: softmax [1/6, 2/6, 3/6].
  std::vector<float> logits = {0, std::log(2.0f), std::log(3.0f), 5, 5, 5};
  std::vector<int32_t> labels = {2, 0};
  auto losses = poisoned(2), dlogits = poisoned(6);
  be->cross_entropy(host(losses, {2}), host(dlogits, {2, 3}), host(logits, {2, 3}),
                    host(labels, {2}), 0.5f);
  EXPECT_NEAR(losses[0], std::log(2.0), 1e-6);
  EXPECT_NEAR(losses[1], std::log(3.0), 1e-6);
  const double want[6] = {0.5 / 6, 0.5 * 2 / 6, 0.5 * (0.5 - 1), 0.5 * (1.0 / 3 - 1),
                          0.5 / 3, 0.5 / 3};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(dlogits[i], want[i], 1e-6) << i;
}

TEST_F(CpuOps, CrossEntropyStableForLargeLogits) {
  std::vector<float> logits = {1000, 0, -1000}, losses = poisoned(1), dlogits = poisoned(3);
  std::vector<int32_t> labels = {1};
  be->cross_entropy(host(losses, {1}), host(dlogits, {1, 3}), host(logits, {1, 3}),
                    host(labels, {1}), 1.0f);
  EXPECT_NEAR(losses[0], 1000.0, 1e-3);
  EXPECT_NEAR(dlogits[0], 1.0, 1e-6);
  EXPECT_NEAR(dlogits[1], -1.0, 1e-6);
}

TEST_F(CpuOps, ElementwiseMatchDoubleReference) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t n = 257;
  const DropoutSpec drop{0.3f, rng.next(), rng.next()};
  auto x = randn<float>(rng, n, 2.0), x2 = randn<float>(rng, n), dy = randn<float>(rng, n);
  const auto xd = to_double(x), x2d = to_double(x2), dyd = to_double(dy);
  std::vector<double> want(n), y_tanh(n);
  const Shape s{n};
  auto out = poisoned(n);
  be->gelu_forward(host(out, s), host(x, s));
  ref::gelu_forward(want.data(), xd.data(), n);
  expect_close(out, want, 1e-6, "gelu");
  out = poisoned(n);
  be->gelu_backward(host(out, s), host(dy, s), host(x, s));
  ref::gelu_backward(want.data(), dyd.data(), xd.data(), n);
  expect_close(out, want, 1e-6, "gelu_backward");
  auto y = poisoned(n);
  be->tanh_forward(host(y, s), host(x, s));
  ref::tanh_forward(y_tanh.data(), xd.data(), n);
  expect_close(y, y_tanh, 1e-6, "tanh");
  out = poisoned(n);
  be->tanh_backward(host(out, s), host(dy, s), host(y, s));
  ref::tanh_backward(want.data(), dyd.data(), to_double(y).data(), n);
  expect_close(out, want, 1e-6, "tanh_backward");
  // ReLU, against max(x, 0) and its mask written out here (inputs of both signs).
  auto r = poisoned(n);
  be->relu_forward(host(r, s), host(x, s));
  for (int64_t i = 0; i < n; ++i) want[i] = std::max(xd[i], 0.0);
  expect_close(r, want, 0, "relu");
  out = poisoned(n);
  be->relu_backward(host(out, s), host(dy, s), host(r, s));
  for (int64_t i = 0; i < n; ++i) want[i] = xd[i] > 0 ? dyd[i] : 0.0;
  expect_close(out, want, 0, "relu_backward");
  out = poisoned(n);
  be->dropout_forward(host(out, s), host(x, s), drop);
  ref::dropout_forward(want.data(), xd.data(), n, drop);
  expect_close(out, want, 1e-6, "dropout");
  out = poisoned(n);
  be->dropout_backward(host(out, s), host(dy, s), drop);
  ref::dropout_backward(want.data(), dyd.data(), n, drop);
  expect_close(out, want, 1e-6, "dropout_backward");
  out = poisoned(n);
  be->add(host(out, s), host(x, s), host(x2, s));
  ref::add(want.data(), xd.data(), x2d.data(), n);
  expect_close(out, want, 1e-6, "add");
}

TEST_F(CpuOps, GeluHandValues) {
  std::vector<float> x = {-1, 0, 1, 3}, y = poisoned(4);
  be->gelu_forward(host(y, {4}), host(x, {4}));
  EXPECT_NEAR(y[0], -0.15865525393145707, 1e-7);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_NEAR(y[2], 0.8413447460685429, 1e-7);
  EXPECT_NEAR(y[3], 2.9959502258159849, 1e-6);
}

TEST_F(CpuOps, DropoutKeepsAboutOneMinusPAndScales) {
  const int64_t n = 20000;
  std::vector<float> x(n, 1.0f), y = poisoned(n), dx = poisoned(n);
  const DropoutSpec d{0.25f, 7, 3};
  be->dropout_forward(host(y, {n}), host(x, {n}), d);
  be->dropout_backward(host(dx, {n}), host(x, {n}), d);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(y[i] == 0.0f || std::abs(y[i] - 1.0f / 0.75f) < 1e-6) << y[i];
    ASSERT_EQ(y[i], dx[i]);  // backward regenerates the same mask
    kept += y[i] != 0.0f;
  }
  EXPECT_NEAR(double(kept) / n, 0.75, 0.02);
  DropoutSpec other = d;
  other.offset = 4;
  auto y2 = poisoned(n);
  be->dropout_forward(host(y2, {n}), host(x, {n}), other);
  EXPECT_NE(y, y2);  // another offset is another mask
}

TEST_F(CpuOps, EmbeddingMatchesDoubleReference) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 4, Hd = 66, V = 7, P = 5, TV = 2;
  auto word = randn<float>(rng, V * Hd), pos = randn<float>(rng, P * Hd),
       type = randn<float>(rng, TV * Hd), de = randn<float>(rng, B * T * Hd),
       dword = randn<float>(rng, V * Hd), dpos = randn<float>(rng, P * Hd),
       dtype = randn<float>(rng, TV * Hd);
  std::vector<int32_t> ids(B * T), type_ids(B * T);
  for (auto& i : ids) i = static_cast<int32_t>(rng.randint(0, V));
  for (auto& i : type_ids) i = static_cast<int32_t>(rng.randint(0, TV));
  auto e = poisoned(B * T * Hd);
  std::vector<double> e_d(e.size()), dword_d = to_double(dword), dpos_d = to_double(dpos),
                                     dtype_d = to_double(dtype);
  be->embedding_forward(host(e, {B * T, Hd}), host(ids, {B, T}), host(type_ids, {B, T}),
                        host(word, {V, Hd}), host(pos, {P, Hd}), host(type, {TV, Hd}));
  ref::embedding_forward(e_d.data(), ids.data(), type_ids.data(), to_double(word).data(),
                         to_double(pos).data(), to_double(type).data(), B, T, Hd, V, P, TV);
  expect_close(e, e_d, 1e-6, "e");
  be->embedding_backward(host(dword, {V, Hd}), host(dpos, {P, Hd}), host(dtype, {TV, Hd}),
                         host(de, {B * T, Hd}), host(ids, {B, T}), host(type_ids, {B, T}));
  ref::embedding_backward(dword_d.data(), dpos_d.data(), dtype_d.data(), to_double(de).data(),
                          ids.data(), type_ids.data(), B, T, Hd, V, P, TV);
  expect_close(dword, dword_d, 1e-6, "dword");
  expect_close(dpos, dpos_d, 1e-6, "dpos");
  expect_close(dtype, dtype_d, 1e-6, "dtype");
}

TEST_F(CpuOps, SelectTokenAndBackward) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 3, Hd = 4;
  auto x = randn<float>(rng, B * T * Hd), out = poisoned(B * Hd), dx = poisoned(B * T * Hd);
  be->select_token(host(out, {B, Hd}), host(x, {B, T, Hd}), 0);
  be->select_token_backward(host(dx, {B, T, Hd}), host(out, {B, Hd}), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < Hd; ++j) {
        if (t == 0) {
          EXPECT_EQ(out[b * Hd + j], x[(b * T) * Hd + j]);
        }
        EXPECT_EQ(dx[(b * T + t) * Hd + j], t == 0 ? x[(b * T) * Hd + j] : 0.0f);
      }
}

// Shapes above ref::kParallelWork, so the OpenMP paths run (a race would show as a mismatch).
TEST_F(CpuOps, ParallelPathsMatchDoubleReference) {
  ANATOMY_FRESH_RNG(rng);
  const int64_t B = 2, T = 32, H = 64, R = B * T;
  const int heads = 2;
  const DropoutSpec drop{0.1f, rng.next(), rng.next()};
  auto qkv = randn<float>(rng, B * T * 3 * H), dctx = randn<float>(rng, R * H);
  std::vector<int32_t> mask(B * T, 1);
  for (int64_t t = 20; t < T; ++t) mask[T + t] = 0;
  auto ctx = poisoned(R * H), lse = poisoned(B * heads * T), dqkv = poisoned(qkv.size());
  be->attention_forward(host(ctx, {B, T, H}), host(lse, {B, heads, T}), host(qkv, {B, T, 3 * H}),
                        host(mask, {B, T}), heads, drop);
  be->attention_backward(host(dqkv, {B, T, 3 * H}), host(dctx, {B, T, H}), host(qkv, {B, T, 3 * H}),
                         host(ctx, {B, T, H}), host(lse, {B, heads, T}), host(mask, {B, T}), heads,
                         drop);
  std::vector<double> ctx_d(ctx.size()), lse_d(lse.size()), dqkv_d(qkv.size());
  const auto qkv_d = to_double(qkv);
  ref::attention_forward(ctx_d.data(), lse_d.data(), qkv_d.data(), mask.data(), B, T, H, heads,
                         drop);
  ref::attention_backward(dqkv_d.data(), to_double(dctx).data(), qkv_d.data(), ctx_d.data(),
                          lse_d.data(), mask.data(), B, T, H, heads, drop);
  expect_close(ctx, ctx_d, 1e-5, "ctx");
  expect_close(dqkv, dqkv_d, 1e-4, "dqkv");

  const int64_t Hd = 768;  // LayerNorm, bias_grad, dropout and the gradient norm at 64 x 768
  auto x = randn<float>(rng, R * Hd), gamma = randn<float>(rng, Hd), beta = randn<float>(rng, Hd);
  auto y = poisoned(R * Hd), sum = poisoned(R * Hd), mean = poisoned(R), rstd = poisoned(R);
  be->layernorm_forward(host(y, {R, Hd}), host(sum, {R, Hd}), host(mean, {R}), host(rstd, {R}),
                        host(x, {R, Hd}), Tensor(), host(gamma, {Hd}), host(beta, {Hd}), 1e-12f,
                        drop);
  std::vector<double> y_d(y.size()), sum_d(y.size()), mean_d(R), rstd_d(R);
  ref::layernorm_forward<double>(y_d.data(), sum_d.data(), mean_d.data(), rstd_d.data(),
                                 to_double(x).data(), nullptr, to_double(gamma).data(),
                                 to_double(beta).data(), R, Hd, 1e-12f, drop);
  expect_close(y, y_d, 1e-5, "layernorm y");
  std::vector<float> db(Hd, 0.0f), ss = {0};
  std::vector<double> db_d(Hd, 0.0);
  be->bias_grad(host(db, {Hd}), host(y, {R, Hd}));
  ref::bias_grad(db_d.data(), to_double(y).data(), R, Hd);
  expect_close(db, db_d, 1e-6, "bias_grad");
  norm_sq_of(*be, ss, x);
  double ss_d = 0;
  for (float v : x) ss_d += double(v) * v;
  EXPECT_NEAR(ss[0], ss_d, 1e-6 * ss_d);
}
