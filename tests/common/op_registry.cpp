// The registry's entries (tests/common/op_registry.h): the twin/timing description of every
// backend op, and for the ops with a backward the float64 gradient check of the CPU reference.
#include "op_registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>

#include "../unit/test_cpu_util.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/cpu/reference.h"
#include "optim/adafactor.h"
#include "optim/adamw8bit.h"

namespace anatomy::test {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType F32 = DType::F32, I32 = DType::I32;

// ---- argument builders ---------------------------------------------------------------------------
std::vector<double> normal(Rng& r, size_t n, double scale) {
  std::vector<double> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}
OpArg in(Rng& r, const char* name, Shape s, double scale = 1.0) {
  return {name, true, F32, s, Fill::Normal, scale, normal(r, s.numel(), scale)};
}
OpArg in_f32(Rng& r, const char* name, Shape s, double scale = 1.0) {
  return {name, false, F32, s, Fill::Normal, scale, normal(r, s.numel(), scale)};
}
OpArg out(const char* name, Shape s, bool act = true) {
  OpArg a{name, act, F32, s, Fill::Output, 1.0, std::vector<double>(s.numel(), kNaN)};
  a.compared = true;
  return a;
}
// Updated in place from random values (F32 gradients that are accumulated, optimizer state).
OpArg acc_f32(Rng& r, const char* name, Shape s, double scale = 1.0) {
  OpArg a{name, false, F32, s, Fill::Accumulate, scale, normal(r, s.numel(), scale)};
  a.compared = true;
  return a;
}
OpArg given(const char* name, DType dt, Shape s, std::vector<double> v) {
  return {name, false, dt, s, Fill::Given, 1.0, std::move(v)};
}
OpArg ints(Rng& r, const char* name, Shape s, int64_t lo, int64_t hi) {
  std::vector<double> v(s.numel());
  for (auto& x : v) x = static_cast<double>(r.randint(lo, hi));
  return given(name, I32, s, std::move(v));
}
// Attention mask [B, T]: sequence b keeps its first T - b keys (the first sequence is full).
OpArg mask(const char* name, int64_t b, int64_t t) {
  std::vector<double> v(b * t);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j) v[i * t + j] = j < std::max<int64_t>(1, t - i) ? 1 : 0;
  return given(name, I32, {b, t}, std::move(v));
}
// n distinct rows out of r, in random order.
OpArg distinct_rows(Rng& rng, const char* name, int64_t n, int64_t r) {
  std::vector<int64_t> all(r);
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = r - 1; i > 0; --i) std::swap(all[i], all[rng.randint(0, i + 1)]);
  std::vector<double> v(all.begin(), all.begin() + n);
  return given(name, I32, {n}, std::move(v));
}
// The hidden size nearest above d.hidden whose head dim is even (rotary embeddings pair columns).
int64_t rotary_hidden(const OpDims& d) { return ((d.hidden / d.heads + 1) / 2) * 2 * d.heads; }
// The packed layout's row index (Backend::rotary_forward): about two thirds of the B*T rows.
OpArg rotary_rows(Rng& g, const OpDims& d) {
  return distinct_rows(g, "rows", std::max<int64_t>(1, 2 * d.rows() / 3), d.rows());
}
// An output of which the op writes some rows: random on both sides, so the rows it leaves agree.
OpArg packed_out(Rng& r, const char* name, Shape s) {
  OpArg a{name, true, F32, s, Fill::Accumulate, 1.0, normal(r, s.numel(), 1.0)};
  a.compared = true;
  return a;
}
DropoutSpec dropout(Rng& r, float p) { return DropoutSpec{p, r.next(), r.next() % 1000}; }

// A small BERT's parameter layout (the optimizers' segment tables come from it).
ParamLayout layout_of(const OpDims& d) {
  BertConfig c;
  c.vocab_size = d.vocab, c.hidden_size = d.hidden, c.num_hidden_layers = 1, c.num_attention_heads = d.heads;
  c.intermediate_size = d.ffn, c.max_position_embeddings = d.seq;
  return ParamLayout::for_sequence_classification(c);
}

// The optimizers' shared arguments: params updated in place, grads, the half copy, the norm.
void update_args(OpCase& c, Rng& r, int64_t n) {
  c.args.push_back(acc_f32(r, "params", {n}, 0.5));
  c.args.push_back(out("half_copy", {n}));
  c.args.push_back(in_f32(r, "grads", {n}, 2.0));
  // sum(g^2) of grads ~ 4n: clipping at max_norm 1 with inv_loss_scale 0.5 is active.
  c.args.push_back(given("norm_sq", F32, {1}, {4.0 * static_cast<double>(n)}));
}
GradTransform transform(const std::vector<Tensor>& t, size_t norm_index) {
  return GradTransform{t[norm_index], 0.5f, 1.0f, true};
}

// ---- gradient checks (float64, CPU reference) ---------------------------------------------------
// A Linear layer as the model calls it: y = gelu(x W^T + b), x [M, K], W [N, K].
// Backward: dpre = gelu'(pre) dy; dx = dpre W (NN); dW += dpre^T x (TN); db += colsum(dpre).
void linear_gradient(Rng& rng, Epilogue epi) {
  SCOPED_TRACE(epi == Epilogue::None ? "no epilogue" : epi == Epilogue::Bias ? "bias" : "bias+gelu");
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
  if (epi == Epilogue::BiasGelu) ref::gelu_backward(dpre.data(), dy.data(), pre.data(), dpre.size());
  std::vector<double> dx(M * K), dw(N * K, 0.0), db(N, 0.0);
  ref::matmul<double>(dx.data(), dpre.data(), Trans::N, w.data(), Trans::N, M, K, N, 1.0, 0.0, Epilogue::None,
                      nullptr, nullptr);
  ref::matmul<double>(dw.data(), dpre.data(), Trans::T, x.data(), Trans::N, N, K, M, 1.0, 1.0, Epilogue::None,
                      nullptr, nullptr);
  ref::bias_grad(db.data(), dpre.data(), M, N);
  expect_grad(x, dx, loss, "dx");
  expect_grad(w, dw, loss, "dW");
  if (epi != Epilogue::None) expect_grad(b, db, loss, "db");
}

// B = 3 sequences: full, padded (last two keys masked), and all padding (uniform rows).
void attention_gradient(Rng& rng, float p, int64_t window = 0) {
  SCOPED_TRACE("dropout " + std::to_string(p) + " window " + std::to_string(window));
  const int64_t B = 3, T = 5, H = 8;
  const int heads = 2;
  const DropoutSpec drop{p, rng.next(), rng.next()};
  auto qkv = randn(rng, B * T * 3 * H), dctx = randn(rng, B * T * H);
  std::vector<int32_t> mask = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  auto forward = [&](std::vector<double>& ctx, std::vector<double>& lse) {
    ref::attention_forward(ctx.data(), lse.data(), qkv.data(), mask.data(), B, T, H, heads, drop, window);
  };
  auto loss = [&] {
    std::vector<double> ctx(B * T * H), lse(B * heads * T);
    forward(ctx, lse);
    return dot(ctx, dctx);
  };
  std::vector<double> ctx(B * T * H), lse(B * heads * T), dqkv(qkv.size(), NAN);
  forward(ctx, lse);
  for (double l : lse) ASSERT_TRUE(std::isfinite(l));
  ref::attention_backward(dqkv.data(), dctx.data(), qkv.data(), ctx.data(), lse.data(), mask.data(), B, T, H, heads,
                          drop, window);
  expect_grad(qkv, dqkv, loss, "dqkv");
  if (window > 0) {  // query 0 of sequence 0 sees keys 0..window alone: its lse is theirs
    for (int h = 0; h < heads; ++h) {
      double mx = -INFINITY, total = 0;
      std::vector<double> sc;
      for (int64_t j = 0; j <= window; ++j) {
        double d = 0;
        for (int64_t c = 0; c < H / heads; ++c) d += qkv[h * (H / heads) + c] * qkv[j * 3 * H + H + h * (H / heads) + c];
        sc.push_back(d / std::sqrt(static_cast<double>(H / heads)));
        mx = std::max(mx, sc.back());
      }
      for (double v : sc) total += std::exp(v - mx);
      EXPECT_NEAR(lse[h * T], mx + std::log(total), 1e-12);
    }
  }
  // The fully masked sequence attends uniformly: lse = log T, and q, k get no gradient.
  for (int h = 0; h < heads; ++h)
    for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(lse[(2 * heads + h) * T + t], std::log(5.0), 1e-12);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < 2 * H; ++c) EXPECT_EQ(dqkv[(2 * T + t) * 3 * H + c], 0.0);
}

void layernorm_gradient(Rng& rng) {
  const int64_t R = 3, Hd = 6;
  const DropoutSpec drop{0.25f, rng.next(), rng.next()};
  auto branch = randn(rng, R * Hd), residual = randn(rng, R * Hd), gamma = randn(rng, Hd), beta = randn(rng, Hd),
       dy = randn(rng, R * Hd);
  const double eps = 1e-5;
  auto forward = [&](std::vector<double>& y, std::vector<double>& sum, std::vector<double>& mean,
                     std::vector<double>& rstd) {
    ref::layernorm_forward(y.data(), sum.data(), mean.data(), rstd.data(), branch.data(), residual.data(),
                           gamma.data(), beta.data(), R, Hd, eps, drop);
  };
  auto loss = [&] {
    std::vector<double> y(R * Hd), sum(R * Hd), mean(R), rstd(R);
    forward(y, sum, mean, rstd);
    return dot(y, dy);
  };
  std::vector<double> y(R * Hd), sum(R * Hd), mean(R), rstd(R);
  forward(y, sum, mean, rstd);
  std::vector<double> dsum(R * Hd), dbranch(R * Hd), dgamma(Hd, 0.0), dbeta(Hd, 0.0);
  ref::layernorm_backward(dsum.data(), dbranch.data(), dgamma.data(), dbeta.data(), dy.data(), y.data(), rstd.data(),
                          gamma.data(), beta.data(), R, Hd, drop);
  expect_grad(branch, dbranch, loss, "dbranch");
  expect_grad(residual, dsum, loss, "dresidual (= dsum)");
  expect_grad(gamma, dgamma, loss, "dgamma");
  expect_grad(beta, dbeta, loss, "dbeta");
}

void cross_entropy_gradient(Rng& rng) {
  const int64_t B = 4, C = 3;
  auto logits = randn(rng, B * C, 2.0);
  std::vector<int32_t> labels(B);
  for (auto& l : labels) l = static_cast<int32_t>(rng.randint(0, C));
  const double grad_scale = 0.37;
  auto loss = [&] {
    std::vector<double> losses(B);
    ref::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), labels.data(), B, C, grad_scale);
    double s = 0;
    for (double l : losses) s += l;
    return s * grad_scale;
  };
  std::vector<double> losses(B), dlogits(B * C);
  ref::cross_entropy(losses.data(), dlogits.data(), logits.data(), labels.data(), B, C, grad_scale);
  expect_grad(logits, dlogits, loss, "dlogits");
}

// Labels with every third row not scored (-100), two sequences.
void token_cross_entropy_gradient(Rng& rng) {
  const int64_t B = 2, R = 6, C = 5;
  auto logits = randn(rng, R * C, 2.0);
  std::vector<int32_t> labels(R);
  for (int64_t r = 0; r < R; ++r) labels[r] = r % 3 == 2 ? ref::kIgnoreIndex : static_cast<int32_t>(rng.randint(0, C));
  const double w = 0.7, grad_scale = 0.37;
  auto loss = [&] {
    std::vector<double> losses(B);
    ref::token_cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), labels.data(), B, R, C, w,
                             grad_scale);
    return (losses[0] + losses[1]) / w * grad_scale;
  };
  std::vector<double> losses(B), dlogits(R * C);
  ref::token_cross_entropy(losses.data(), dlogits.data(), logits.data(), labels.data(), B, R, C, w, grad_scale);
  expect_grad(logits, dlogits, loss, "dlogits");
}

// Targets in [0, 1] serve both losses (the binary cross-entropy needs them there).
void float_target_gradient(Rng& rng, bool binary) {
  const int64_t B = 4, C = 3;
  auto logits = randn(rng, B * C, 2.0);
  std::vector<double> targets(B * C);
  for (auto& t : targets) t = static_cast<double>(rng.randint(0, 1001)) / 1000.0;
  const double grad_scale = 0.37;
  auto loss = [&] {
    std::vector<double> losses(B);
    ref::float_target_loss(losses.data(), static_cast<double*>(nullptr), logits.data(), targets.data(), B, C,
                           grad_scale, binary);
    double s = 0;
    for (double l : losses) s += l;
    return s * grad_scale;
  };
  std::vector<double> losses(B), dlogits(B * C);
  ref::float_target_loss(losses.data(), dlogits.data(), logits.data(), targets.data(), B, C, grad_scale, binary);
  expect_grad(logits, dlogits, loss, "dlogits");
}

void embedding_gradient(Rng& rng) {
  const int64_t B = 2, T = 3, Hd = 4, V = 5, P = 4, TV = 2;
  auto word = randn(rng, V * Hd), pos = randn(rng, P * Hd), type = randn(rng, TV * Hd), de = randn(rng, B * T * Hd);
  std::vector<int32_t> ids = {1, 3, 1, 4, 1, 0}, type_ids = {0, 0, 1, 1, 1, 0};
  auto loss = [&] {
    std::vector<double> e(B * T * Hd);
    ref::embedding_forward(e.data(), ids.data(), type_ids.data(), word.data(), pos.data(), type.data(), B, T, Hd, V,
                           P, TV);
    return dot(e, de);
  };
  std::vector<double> dword(V * Hd, 0.0), dpos(P * Hd, 0.0), dtype(TV * Hd, 0.0);
  ref::embedding_backward(dword.data(), dpos.data(), dtype.data(), de.data(), ids.data(), type_ids.data(), B, T, Hd, V,
                          P, TV);
  expect_grad(word, dword, loss, "dword");
  expect_grad(pos, dpos, loss, "dpos");
  expect_grad(type, dtype, loss, "dtype");
}

// y = f(x) element-wise; backward(dx, dy, x, y) is checked against differences of sum(w * y).
void elementwise_gradient(Rng& rng, const std::function<void(double*, const double*, size_t)>& fwd,
                          const std::function<void(double*, const double*, const double*, const double*, size_t)>& bwd) {
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
  expect_grad(x, dx, loss, "dx");
}

void select_token_gradient(Rng& rng) {
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

// B = 3 sequences: every token, two of four, and none (Note [empty mean pool]: out 0, dx 0);
// then without a mask (every token counts).
void masked_mean_gradient(Rng& rng) {
  const int64_t B = 3, T = 4, Hd = 3;
  auto x = randn(rng, B * T * Hd), w = randn(rng, B * Hd);
  const std::vector<int32_t> mask = {1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0};
  for (const int32_t* m : {mask.data(), static_cast<const int32_t*>(nullptr)}) {
    SCOPED_TRACE(m ? "mask" : "no mask");
    auto loss = [&] {
      std::vector<double> out(B * Hd);
      ref::masked_mean_forward(out.data(), x.data(), m, B, T, Hd);
      return dot(out, w);
    };
    std::vector<double> dx(x.size(), NAN);
    ref::masked_mean_backward(dx.data(), w.data(), m, B, T, Hd);
    expect_grad(x, dx, loss, "dx");
    std::vector<double> out(B * Hd, NAN);
    ref::masked_mean_forward(out.data(), x.data(), m, B, T, Hd);
    for (int64_t j = 0; j < Hd; ++j) {  // sequence 1 averages tokens 1 and 3
      const double want = m ? (x[(T + 1) * Hd + j] + x[(T + 3) * Hd + j]) / 2
                            : (x[T * Hd + j] + x[(T + 1) * Hd + j] + x[(T + 2) * Hd + j] + x[(T + 3) * Hd + j]) / 4;
      EXPECT_NEAR(out[Hd + j], want, 1e-15);
    }
    if (!m) continue;
    for (int64_t j = 0; j < Hd; ++j) EXPECT_EQ(out[2 * Hd + j], 0.0);
    for (int64_t i = 2 * T * Hd; i < 3 * T * Hd; ++i) EXPECT_EQ(dx[i], 0.0);
  }
}

// The mean-pooling mask [B, T]: sequence i keeps token j when j % (i + 2) != 1, holes inside the
// sequence; the last sequence (of two or more) keeps none (Note [empty mean pool]).
OpArg pool_mask(int64_t b, int64_t t) {
  std::vector<double> v(b * t);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < t; ++j) v[i * t + j] = (b > 1 && i == b - 1) || j % (i + 2) == 1 ? 0 : 1;
  return given("mask", I32, {b, t}, std::move(v));
}

// The packed reference equals the padded one (whose gradients attention_gradient checks) on
// every token row: B = 3 sequences of 6, 4 and 1 tokens padded to T = 6, two rows after them.
// Padding rows carry dctx 0 in the padded run, as in the model (nothing reads their outputs).
void packed_attention_matches_padded(Rng& rng, float p, int64_t window = 0) {
  SCOPED_TRACE("packed: dropout " + std::to_string(p) + " window " + std::to_string(window));
  const int64_t B = 3, T = 6, H = 8, W = 3 * H;
  const int heads = 2;
  const std::vector<int32_t> offsets = {0, 6, 10, 11}, lens = {6, 4, 1};
  const int64_t N = offsets[B] + 2;
  const DropoutSpec drop{p, rng.next(), rng.next()};
  std::vector<int32_t> mask(B * T, 0);
  auto qkv = randn(rng, N * W), dctx = randn(rng, N * H);
  std::vector<double> pad_qkv(B * T * W, 0.0), pad_dctx(B * T * H, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < lens[b]; ++t) {
      mask[b * T + t] = 1;
      std::copy_n(qkv.begin() + (offsets[b] + t) * W, W, pad_qkv.begin() + (b * T + t) * W);
      std::copy_n(dctx.begin() + (offsets[b] + t) * H, H, pad_dctx.begin() + (b * T + t) * H);
    }
  std::vector<double> ctx(N * H, kNaN), lse(B * heads * T, kNaN), dqkv(N * W, kNaN);
  std::vector<double> pad_ctx(B * T * H), pad_lse(B * heads * T), pad_dqkv(B * T * W);
  ref::attention_packed_forward(ctx.data(), lse.data(), qkv.data(), offsets.data(), N, B, T, H, heads, drop, window);
  ref::attention_packed_backward(dqkv.data(), dctx.data(), qkv.data(), lse.data(), offsets.data(), N, B, T, H, heads,
                                 drop, window);
  ref::attention_forward(pad_ctx.data(), pad_lse.data(), pad_qkv.data(), mask.data(), B, T, H, heads, drop, window);
  ref::attention_backward(pad_dqkv.data(), pad_dctx.data(), pad_qkv.data(), pad_ctx.data(), pad_lse.data(), mask.data(),
                          B, T, H, heads, drop, window);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < heads; ++h) {
        const size_t i = static_cast<size_t>((b * heads + h) * T + t);
        EXPECT_EQ(lse[i], t < lens[b] ? pad_lse[i] : 0.0) << "lse b " << b << " h " << h << " t " << t;
      }
      if (t >= lens[b]) continue;
      for (int64_t c = 0; c < H; ++c)
        EXPECT_NEAR(ctx[(offsets[b] + t) * H + c], pad_ctx[(b * T + t) * H + c], 1e-12) << "ctx b " << b << " t " << t;
      for (int64_t c = 0; c < W; ++c)
        EXPECT_NEAR(dqkv[(offsets[b] + t) * W + c], pad_dqkv[(b * T + t) * W + c], 1e-12) << "dqkv b " << b << " t " << t;
    }
  for (int64_t i = offsets[B] * H; i < N * H; ++i) EXPECT_EQ(ctx[i], 0.0) << "ctx of a row after the sequences";
  for (int64_t i = offsets[B] * W; i < N * W; ++i) EXPECT_EQ(dqkv[i], 0.0) << "dqkv of a row after the sequences";
}

// ---- the entries ---------------------------------------------------------------------------------
std::vector<OpEntry> build_registry() {
  using T = const std::vector<Tensor>&;
  std::vector<OpEntry> r;
  auto add = [&](const char* op, std::function<OpCase(const OpDims&, Rng&)> build,
                 std::function<void(Rng&)> gradient = nullptr, bool half = true) {
    r.push_back(OpEntry{op, std::move(build), half, std::move(gradient)});
  };

  // ---- data movement: bytes through the host and back, compared exactly ----
  add("upload", [](const OpDims& d, Rng& g) {
    auto host = std::make_shared<std::vector<float>>(test::to_float(normal(g, d.rows() * d.hidden, 1.0)));
    return OpCase{{out("dst", {d.rows(), d.hidden}, false)}, [host](Backend& be, T t) { be.upload(t[0], host->data()); },
                  0, 0};
  }, nullptr, false);
  add("upload_async", [](const OpDims& d, Rng& g) {
    auto host = std::make_shared<std::vector<float>>(test::to_float(normal(g, d.rows() * d.hidden, 1.0)));
    return OpCase{{out("dst", {d.rows(), d.hidden}, false)},
                  [host](Backend& be, T t) { be.wait_copy(be.upload_async(t[0], host->data())); }, 0, 0};
  }, nullptr, false);
  add("download_async", [](const OpDims& d, Rng& g) {
    return OpCase{{in_f32(g, "src", {d.rows(), d.hidden}), out("dst", {d.rows(), d.hidden}, false)},
                  [](Backend& be, T t) {
                    float* h = static_cast<float*>(be.host_alloc(t[0].bytes()));  // page-locked on the GPU
                    be.wait_copy(be.download_async(h, t[0]));
                    be.upload(t[1], h);
                    be.host_free(h);
                  },
                  0, 0};
  }, nullptr, false);
  add("download", [](const OpDims& d, Rng& g) {
    return OpCase{{in_f32(g, "src", {d.rows(), d.hidden}), out("dst", {d.rows(), d.hidden}, false)},
                  [](Backend& be, T t) {
                    std::vector<float> h(t[0].numel());
                    be.download(h.data(), t[0]);
                    be.upload(t[1], h.data());
                  },
                  0, 0};
  }, nullptr, false);
  add("copy", [](const OpDims& d, Rng& g) {
    return OpCase{{out("dst", {d.rows(), d.hidden}), in(g, "src", {d.rows(), d.hidden})},
                  [](Backend& be, T t) { be.copy(t[0], t[1]); }, 0, 0};
  });
  add("cast", [](const OpDims& d, Rng& g) {
    return OpCase{{out("dst", {d.rows(), d.hidden}, false), in(g, "src", {d.rows(), d.hidden})},
                  [](Backend& be, T t) { be.cast(t[0], t[1]); }, 0, 0};
  });
  add("fill", [](const OpDims& d, Rng&) {
    return OpCase{{out("dst", {d.rows(), d.hidden})}, [](Backend& be, T t) { be.fill(t[0], 0.375f); }, 0, 0};
  });

  // ---- tensor contractions ----
  add("matmul", [](const OpDims& d, Rng& g) {
    // The FFN's first Linear with its fused bias + GELU: C[R, F] = gelu(x W^T + b); then its
    // weight gradient with the fused bias gradient (Note [fused bias gradient]), accumulated:
    // dW[F, H] += dpre^T x, db[F] += the column sums of dpre.
    const int64_t R = d.rows(), H = d.hidden, F = d.ffn;
    return OpCase{{out("C", {R, F}), in(g, "x", {R, H}), in(g, "W", {F, H}, 0.2), in(g, "b", {F}), out("gelu_in", {R, F}),
                   acc_f32(g, "dW", {F, H}), acc_f32(g, "db", {F}), in(g, "dpre", {R, F})},
                  [](Backend& be, T t) {
                    be.matmul(t[0], t[1], Trans::N, t[2], Trans::T, MatmulArgs{1, 0, Epilogue::BiasGelu, t[3], t[4]});
                    be.matmul(t[5], t[7], Trans::T, t[1], Trans::N, MatmulArgs{1, 1, Epilogue::BiasGrad, t[6], {}});
                  }};
  }, [](Rng& g) {
    for (Epilogue e : {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu}) linear_gradient(g, e);
  });
  add("fp8_scale_update", [](const OpDims&, Rng& g) {
    // Three rows (Note [fp8 training]): E4M3 and E5M2 over amax histories spanning decades, and
    // one with no amax yet (its scale, 4, stays).
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) {
      std::vector<float> fresh(kFp8MetaWidth);
      fp8_meta_init(fresh.data(), r == 2 ? 4.0f : 1.0f, r == 1 ? Fp8Format::E5M2 : Fp8Format::E4M3);
      std::vector<double> row(fresh.begin(), fresh.end());
      if (r < 2)
        for (int i = 0; i < kFp8History; ++i) row[Fp8Meta::kAmax + i] = std::exp(3.0 * g.normal() - (r ? 8.0 : 0.0));
      v.insert(v.end(), row.begin(), row.end());
    }
    OpArg meta = given("meta", F32, {3, kFp8MetaWidth}, std::move(v));
    meta.compared = true;
    return OpCase{{meta}, [](Backend& be, T t) { be.fp8_scale_update(t[0]); }, 0, 0};
  }, nullptr, false);
  add("bias_grad", [](const OpDims& d, Rng& g) {
    return OpCase{{acc_f32(g, "db", {d.hidden}), in(g, "dy", {d.rows(), d.hidden})},
                  [](Backend& be, T t) { be.bias_grad(t[0], t[1]); }};
  }, [](Rng& g) { linear_gradient(g, Epilogue::Bias); });

  // ---- attention ----
  auto attention_args = [](const OpDims& d, Rng& g) {
    const int64_t B = d.batch, S = d.seq, H = d.hidden;
    return std::vector<OpArg>{out("ctx", {B, S, H}), out("lse", {B, d.heads, S}, false), in(g, "qkv", {B, S, 3 * H}),
                              mask("mask", B, S)};
  };
  add("attention_forward", [=](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.1f);
    const int heads = static_cast<int>(d.heads), window = static_cast<int>(d.window);
    return OpCase{attention_args(d, g),
                  [=](Backend& be, T t) { be.attention_forward(t[0], t[1], t[2], t[3], heads, drop, {window}); }};
  }, [](Rng& g) {
    attention_gradient(g, 0.0f);
    attention_gradient(g, 0.0f, 1);
  });
  add("attention_backward", [=](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.1f);
    const int heads = static_cast<int>(d.heads), window = static_cast<int>(d.window);
    OpCase c{attention_args(d, g), nullptr};
    c.args.push_back(out("dqkv", {d.batch, d.seq, 3 * d.hidden}));
    c.args.push_back(in(g, "dctx", {d.batch, d.seq, d.hidden}));
    c.args.push_back(acc_f32(g, "dbias", {3 * d.hidden}));  // the column sums of dqkv
    c.run = [=](Backend& be, T t) {
      be.attention_forward(t[0], t[1], t[2], t[3], heads, drop, {window});
      be.attention_backward(t[4], t[5], t[2], t[0], t[1], t[3], heads, drop, {window}, t[6]);
    };
    return c;
  }, [](Rng& g) {
    attention_gradient(g, 0.3f);
    attention_gradient(g, 0.3f, 2);
  });
  // Packed rows (Note [packed attention] in ops/cpu/attention.cpp): head dim 32, 64 or 128 (the
  // flash kernels' on CUDA), the largest that d.hidden / d.heads reaches; sequence b holds
  // 1 + (T - 1)(B - b) / B tokens (the first all T), and 3 rows follow the last sequence (the
  // packing's padding rows).
  struct Packed {
    int64_t B, T, H, N;
    int heads, window;
    std::vector<double> offsets;
    int64_t pairs = 0;
  };
  auto packed_dims = [](const OpDims& d) {
    Packed p{d.batch, d.seq, 0, 0, static_cast<int>(d.heads), static_cast<int>(d.window), {0.0}};
    const int64_t dh = d.hidden / d.heads;
    p.H = p.heads * (dh >= 128 ? 128 : dh >= 64 ? 64 : 32);
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t len = 1 + (p.T - 1) * (p.B - b) / p.B;
      p.offsets.push_back(p.offsets.back() + static_cast<double>(len));
      p.pairs += len * len;
    }
    p.N = static_cast<int64_t>(p.offsets.back()) + 3;
    return p;
  };
  auto packed_args = [](const Packed& p, Rng& g) {
    return std::vector<OpArg>{out("ctx", {p.N, p.H}), out("lse", {p.B, p.heads, p.T}, false),
                              in(g, "qkv", {p.N, 3 * p.H}), given("offsets", I32, {p.B + 1}, p.offsets)};
  };
  add("attention_packed_forward", [=](const OpDims& d, Rng& g) {
    const Packed p = packed_dims(d);
    const DropoutSpec drop = dropout(g, 0.1f);
    return OpCase{packed_args(p, g), [=](Backend& be, T t) {
                    be.attention_packed_forward(t[0], t[1], t[2], t[3], p.heads, drop, p.pairs, {p.window});
                  }};
  }, [](Rng& g) {
    packed_attention_matches_padded(g, 0.0f);
    packed_attention_matches_padded(g, 0.2f, 1);
  });
  r.back().f32_on_cuda = false;
  add("attention_packed_backward", [=](const OpDims& d, Rng& g) {
    const Packed p = packed_dims(d);
    const DropoutSpec drop = dropout(g, 0.1f);
    OpCase c{packed_args(p, g), nullptr};
    c.args.push_back(out("dqkv", {p.N, 3 * p.H}));
    c.args.push_back(in(g, "dctx", {p.N, p.H}));
    c.args.push_back(acc_f32(g, "dbias", {3 * p.H}));  // the column sums of dqkv
    c.run = [=](Backend& be, T t) {
      be.attention_packed_forward(t[0], t[1], t[2], t[3], p.heads, drop, p.pairs, {p.window});
      be.attention_packed_backward(t[4], t[5], t[2], t[0], t[1], t[3], p.heads, drop, p.pairs, {p.window}, t[6]);
    };
    return c;
  }, [](Rng& g) {
    packed_attention_matches_padded(g, 0.3f);
    packed_attention_matches_padded(g, 0.3f, 2);
  });
  r.back().f32_on_cuda = false;
  // ---- ModernBERT's rotary embeddings and gated GELU ----
  auto rotary_grad = [](Rng& g) {  // the rotation's gradient is its transpose
    const int64_t B = 2, S = 5, H = 12;
    const int heads = 3;
    auto x = randn(g, B * S * 3 * H), w = randn(g, B * S * 3 * H);
    std::vector<double> dx(x.size(), NAN);
    auto loss = [&] {
      std::vector<double> y(x.size());
      ref::rotary(y.data(), x.data(), B, S, H, heads, 160000.0, false);
      return dot(y, w);
    };
    ref::rotary(dx.data(), w.data(), B, S, H, heads, 160000.0, true);
    expect_grad(x, dx, loss, "dx");
    // The packed layout: packed row r is padded row rows[r], rotated at that row's position.
    const std::vector<int32_t> rows{7, 0, 9, 3, 5, 1};
    std::vector<double> padded(x.size()), packed(x.size(), 0.0), src(x.size(), 0.0);
    ref::rotary(padded.data(), x.data(), B, S, H, heads, 160000.0, false);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(x.begin() + rows[r] * 3 * H, 3 * H, src.begin() + static_cast<int64_t>(r) * 3 * H);
    ref::rotary(packed.data(), src.data(), B, S, H, heads, 160000.0, false, rows.data(),
                static_cast<int64_t>(rows.size()));
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t c = 0; c < 3 * H; ++c)
        EXPECT_NEAR(packed[r * 3 * H + c], padded[rows[r] * 3 * H + c], 1e-12) << "packed row " << r << " col " << c;
  };
  add("rotary_forward", [](const OpDims& d, Rng& g) {
    const int heads = static_cast<int>(d.heads);
    const Shape s{d.batch, d.seq, 3 * rotary_hidden(d)};
    return OpCase{{out("y", s), in(g, "x", s), packed_out(g, "y_packed", s), rotary_rows(g, d)},
                  [=](Backend& be, T t) {
                    be.rotary_forward(t[0], t[1], heads, 10000.0f);
                    be.rotary_forward(t[2], t[1], heads, 10000.0f, t[3]);
                  }};
  }, rotary_grad);
  add("rotary_backward", [](const OpDims& d, Rng& g) {
    const int heads = static_cast<int>(d.heads);
    const Shape s{d.batch, d.seq, 3 * rotary_hidden(d)};
    return OpCase{{out("dx", s), in(g, "dy", s), packed_out(g, "dx_packed", s), rotary_rows(g, d)},
                  [=](Backend& be, T t) {
                    be.rotary_backward(t[0], t[1], heads, 160000.0f);
                    be.rotary_backward(t[2], t[1], heads, 160000.0f, t[3]);
                  }};
  }, rotary_grad);
  auto geglu_grad = [](Rng& g) {
    const int64_t R = 3, I = 5;
    auto x = randn(g, R * 2 * I, 2.0), w = randn(g, R * I);
    std::vector<double> dx(x.size(), NAN);
    auto loss = [&] {
      std::vector<double> y(R * I);
      ref::geglu_forward(y.data(), x.data(), R, I);
      return dot(y, w);
    };
    ref::geglu_backward(dx.data(), w.data(), x.data(), R, I);
    expect_grad(x, dx, loss, "dx");
  };
  add("geglu_forward", [](const OpDims& d, Rng& g) {
    return OpCase{{out("y", {d.rows(), d.ffn}), in(g, "x", {d.rows(), 2 * d.ffn}, 2.0)},
                  [](Backend& be, T t) { be.geglu_forward(t[0], t[1]); }};
  }, geglu_grad);
  add("geglu_backward", [](const OpDims& d, Rng& g) {
    return OpCase{{out("dx", {d.rows(), 2 * d.ffn}), in(g, "dy", {d.rows(), d.ffn}), in(g, "x", {d.rows(), 2 * d.ffn}, 2.0)},
                  [](Backend& be, T t) { be.geglu_backward(t[0], t[1], t[2]); }};
  }, geglu_grad);

  // ---- statistical normalizations ----
  auto layernorm_args = [](const OpDims& d, Rng& g) {
    const int64_t R = d.rows(), H = d.hidden;
    // LayerNorm weights near 1, as trained ones are: backward recovers the normalized input from
    // the output by dividing by gamma (Note [layernorm backward from its output]), which a
    // half-precision output cannot support where gamma is near 0.
    OpArg gamma = in(g, "gamma", {H}, 0.2);
    for (double& x : gamma.values) x += 1.0;
    return std::vector<OpArg>{out("y", {R, H}),        out("sum", {R, H}),     out("mean", {R}, false),
                              out("rstd", {R}, false), in(g, "branch", {R, H}), in(g, "residual", {R, H}),
                              gamma,                   in(g, "beta", {H})};
  };
  add("layernorm_forward", [=](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.1f);
    return OpCase{layernorm_args(d, g), [=](Backend& be, T t) {
                    be.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], 1e-12f, drop);
                  }};
  }, [](Rng& g) { layernorm_gradient(g); });
  add("layernorm_backward", [=](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.1f);
    OpCase c{layernorm_args(d, g), nullptr};
    const int64_t R = d.rows(), H = d.hidden;
    c.args.push_back(out("dsum", {R, H}));
    c.args.push_back(out("dbranch", {R, H}));
    c.args.push_back(acc_f32(g, "dgamma", {H}));
    c.args.push_back(acc_f32(g, "dbeta", {H}));
    c.args.push_back(in(g, "dy", {R, H}));
    c.args.push_back(acc_f32(g, "dbias", {H}));  // the column sums of dbranch
    c.run = [=](Backend& be, T t) {
      be.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], 1e-12f, drop);
      be.layernorm_backward(t[8], t[9], t[10], t[11], t[12], t[0], t[3], t[6], t[7], drop, t[13]);
    };
    return c;
  }, [](Rng& g) { layernorm_gradient(g); });
  add("cross_entropy", [](const OpDims& d, Rng& g) {
    const int64_t B = d.rows(), C = d.classes;
    return OpCase{{out("losses", {B}, false), out("dlogits", {B, C}), in(g, "logits", {B, C}, 2.0),
                   ints(g, "labels", {B}, 0, C)},
                  [](Backend& be, T t) { be.cross_entropy(t[0], t[1], t[2], t[3], 0.25f); }};
  }, [](Rng& g) { cross_entropy_gradient(g); });
  add("token_cross_entropy", [](const OpDims& d, Rng& g) {
    const int64_t B = d.batch, R = d.rows(), C = d.vocab;
    std::vector<double> labels(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) labels[r] = r % 4 == 1 ? -100.0 : static_cast<double>(g.randint(0, C));
    return OpCase{{out("losses", {B}, false), out("dlogits", {R, C}), in(g, "logits", {R, C}, 2.0),
                   given("labels", I32, {R}, std::move(labels))},
                  [](Backend& be, T t) { be.token_cross_entropy(t[0], t[1], t[2], t[3], 0.5f, 0.25f); }};
  }, [](Rng& g) { token_cross_entropy_gradient(g); });
  // Targets: real values for the squared error, multi-hot 0/1 for the binary cross-entropy.
  add("mse_loss", [](const OpDims& d, Rng& g) {
    const int64_t B = d.rows(), C = d.classes;
    return OpCase{{out("losses", {B}, false), out("dlogits", {B, C}), in(g, "logits", {B, C}, 2.0),
                   in_f32(g, "targets", {B, C}, 2.0)},
                  [](Backend& be, T t) { be.mse_loss(t[0], t[1], t[2], t[3], 0.25f); }};
  }, [](Rng& g) { float_target_gradient(g, false); });
  add("bce_with_logits", [](const OpDims& d, Rng& g) {
    const int64_t B = d.rows(), C = d.classes;
    std::vector<double> hot(static_cast<size_t>(B * C));
    for (auto& v : hot) v = static_cast<double>(g.randint(0, 2));
    return OpCase{{out("losses", {B}, false), out("dlogits", {B, C}), in(g, "logits", {B, C}, 2.0),
                   given("targets", F32, {B, C}, std::move(hot))},
                  [](Backend& be, T t) { be.bce_with_logits(t[0], t[1], t[2], t[3], 0.25f); }};
  }, [](Rng& g) { float_target_gradient(g, true); });

  // ---- element-wise ----
  auto unary = [&](const char* op, void (Backend::*f)(const Tensor&, const Tensor&), std::function<void(Rng&)> grad) {
    add(op, [f](const OpDims& d, Rng& g) {
      return OpCase{{out("y", {d.rows(), d.ffn}), in(g, "x", {d.rows(), d.ffn}, 2.0)},
                    [f](Backend& be, T t) { (be.*f)(t[0], t[1]); }};
    }, std::move(grad));
  };
  auto binary = [&](const char* op, void (Backend::*f)(const Tensor&, const Tensor&, const Tensor&),
                    std::function<void(Rng&)> grad) {
    add(op, [f](const OpDims& d, Rng& g) {
      return OpCase{{out("y", {d.rows(), d.ffn}), in(g, "a", {d.rows(), d.ffn}, 2.0), in(g, "b", {d.rows(), d.ffn}, 0.9)},
                    [f](Backend& be, T t) { (be.*f)(t[0], t[1], t[2]); }};
    }, std::move(grad));
  };
  auto gelu_grad = [](Rng& g) {
    elementwise_gradient(
        g, [](double* y, const double* x, size_t n) { ref::gelu_forward(y, x, n); },
        [](double* dx, const double* dy, const double* x, const double*, size_t n) { ref::gelu_backward(dx, dy, x, n); });
  };
  auto tanh_grad = [](Rng& g) {
    elementwise_gradient(
        g, [](double* y, const double* x, size_t n) { ref::tanh_forward(y, x, n); },
        [](double* dx, const double* dy, const double*, const double* y, size_t n) { ref::tanh_backward(dx, dy, y, n); });
  };
  auto relu_grad = [](Rng& g) {  // inputs kept off the kink at 0, where no finite difference holds
    std::vector<double> x = randn(g, 40, 2.0), w = randn(g, 40), y(40), dx(40);
    for (double& v : x) v = v < 0 ? std::min(v, -1e-2) : std::max(v, 1e-2);
    auto loss = [&] {
      std::vector<double> out(x.size());
      ref::relu_forward(out.data(), x.data(), x.size());
      return dot(out, w);
    };
    ref::relu_forward(y.data(), x.data(), x.size());
    ref::relu_backward(dx.data(), w.data(), y.data(), x.size());
    expect_grad(x, dx, loss, "dx");
  };
  auto dropout_grad = [](Rng& g) {
    const DropoutSpec d{0.4f, g.next(), g.next() % 1000};
    elementwise_gradient(
        g, [d](double* y, const double* x, size_t n) { ref::dropout_forward(y, x, n, d); },
        [d](double* dx, const double* dy, const double*, const double*, size_t n) { ref::dropout_backward(dx, dy, n, d); });
  };
  unary("gelu_forward", &Backend::gelu_forward, gelu_grad);
  add("gelu_backward", [](const OpDims& d, Rng& g) {  // with the column sums of dx (a bias gradient)
    return OpCase{{out("dx", {d.rows(), d.ffn}), in(g, "dy", {d.rows(), d.ffn}, 2.0), in(g, "x", {d.rows(), d.ffn}, 0.9),
                   out("dx_alone", {d.rows(), d.ffn}), acc_f32(g, "dbias", {d.ffn})},
                  [](Backend& be, T t) {
                    be.gelu_backward(t[3], t[1], t[2]);
                    be.gelu_backward(t[0], t[1], t[2], t[4]);
                  }};
  }, gelu_grad);
  unary("tanh_forward", &Backend::tanh_forward, tanh_grad);
  binary("tanh_backward", &Backend::tanh_backward, tanh_grad);
  unary("relu_forward", &Backend::relu_forward, relu_grad);
  binary("relu_backward", &Backend::relu_backward, relu_grad);
  binary("add", &Backend::add, nullptr);
  add("dropout_forward", [](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.25f);
    return OpCase{{out("y", {d.rows(), d.ffn}), in(g, "x", {d.rows(), d.ffn})},
                  [drop](Backend& be, T t) { be.dropout_forward(t[0], t[1], drop); }};
  }, dropout_grad);
  add("dropout_backward", [](const OpDims& d, Rng& g) {
    const DropoutSpec drop = dropout(g, 0.25f);
    return OpCase{{out("dx", {d.rows(), d.ffn}), in(g, "dy", {d.rows(), d.ffn})},
                  [drop](Backend& be, T t) { be.dropout_backward(t[0], t[1], drop); }};
  }, dropout_grad);
  add("embedding_forward", [](const OpDims& d, Rng& g) {
    const int64_t B = d.batch, S = d.seq, H = d.hidden;
    return OpCase{{out("e", {B * S, H}), ints(g, "ids", {B, S}, 0, d.vocab), ints(g, "type_ids", {B, S}, 0, 2),
                   in(g, "word", {d.vocab, H}), in(g, "pos", {S + 3, H}), in(g, "type", {2, H})},
                  [](Backend& be, T t) { be.embedding_forward(t[0], t[1], t[2], t[3], t[4], t[5]); }};
  }, [](Rng& g) { embedding_gradient(g); });
  add("embedding_backward", [](const OpDims& d, Rng& g) {
    const int64_t B = d.batch, S = d.seq, H = d.hidden;
    return OpCase{{acc_f32(g, "dword", {d.vocab, H}), acc_f32(g, "dpos", {S + 3, H}), acc_f32(g, "dtype", {2, H}),
                   in(g, "de", {B * S, H}), ints(g, "ids", {B, S}, 0, d.vocab), ints(g, "type_ids", {B, S}, 0, 2)},
                  [](Backend& be, T t) { be.embedding_backward(t[0], t[1], t[2], t[3], t[4], t[5]); }};
  }, [](Rng& g) { embedding_gradient(g); });
  add("select_token", [](const OpDims& d, Rng& g) {
    return OpCase{{out("out", {d.batch, d.hidden}), in(g, "x", {d.batch, d.seq, d.hidden})},
                  [](Backend& be, T t) { be.select_token(t[0], t[1], 0); }, 0, 0};
  }, [](Rng& g) { select_token_gradient(g); });
  add("select_token_backward", [](const OpDims& d, Rng& g) {
    return OpCase{{out("dx", {d.batch, d.seq, d.hidden}), in(g, "dout", {d.batch, d.hidden})},
                  [](Backend& be, T t) { be.select_token_backward(t[0], t[1], 1); }, 0, 0};
  }, [](Rng& g) { select_token_gradient(g); });
  add("masked_mean_forward", [](const OpDims& d, Rng& g) {
    return OpCase{{out("out", {d.batch, d.hidden}), in(g, "x", {d.batch, d.seq, d.hidden}), pool_mask(d.batch, d.seq)},
                  [](Backend& be, T t) { be.masked_mean_forward(t[0], t[1], t[2]); }};
  }, [](Rng& g) { masked_mean_gradient(g); });
  add("masked_mean_backward", [](const OpDims& d, Rng& g) {
    return OpCase{{out("dx", {d.batch, d.seq, d.hidden}), in(g, "dout", {d.batch, d.hidden}),
                   pool_mask(d.batch, d.seq)},
                  [](Backend& be, T t) { be.masked_mean_backward(t[0], t[1], t[2]); }};
  }, [](Rng& g) { masked_mean_gradient(g); });
  add("gather_rows", [](const OpDims& d, Rng& g) {
    const int64_t n = d.rows() / 2;
    return OpCase{{out("out", {n, d.hidden}), in(g, "in", {d.rows(), d.hidden}), distinct_rows(g, "idx", n, d.rows())},
                  [](Backend& be, T t) { be.gather_rows(t[0], t[1], t[2]); }, 0, 0};
  });
  add("scatter_rows", [](const OpDims& d, Rng& g) {
    const int64_t n = d.rows() / 2;
    OpArg dst = in(g, "out", {d.rows(), d.hidden});  // rows idx does not name keep their values
    dst.compared = true;
    return OpCase{{dst, in(g, "in", {n, d.hidden}), distinct_rows(g, "idx", n, d.rows())},
                  [](Backend& be, T t) { be.scatter_rows(t[0], t[1], t[2]); }, 0, 0};
  });

  // ---- optimizer ----
  add("block_sum_squares", [](const OpDims& d, Rng& g) {
    const int64_t blocks = (d.params + kNormBlock - 1) / kNormBlock;
    return OpCase{{out("partials", {blocks}, false), in_f32(g, "x", {d.params})},
                  [](Backend& be, T t) { be.block_sum_squares(t[0], t[1]); }};
  }, nullptr, false);
  add("sum_blocks", [](const OpDims& d, Rng& g) {
    return OpCase{{out("out", {1}, false), in_f32(g, "partials", {d.params / 100})},
                  [](Backend& be, T t) { be.sum_blocks(t[0], t[1]); }};
  }, nullptr, false);
  add("adamw_update", [](const OpDims& d, Rng& g) {
    OpCase c;
    update_args(c, g, d.params);
    c.args.push_back(acc_f32(g, "m", {d.params}, 0.1));
    OpArg v = acc_f32(g, "v", {d.params}, 0.1);
    for (auto& x : v.values) x = x * x;
    c.args.push_back(v);
    AdamWArgs a;
    a.lr = 1e-2f, a.weight_decay = 0.01f, a.step = 3;
    c.run = [a](Backend& be, T t) { be.adamw_update(t[0], t[4], t[5], t[1], t[2], transform(t, 3), a); };
    return c;
  }, nullptr, true);
  add("sgd_update", [](const OpDims& d, Rng& g) {
    OpCase c;
    update_args(c, g, d.params);
    c.args.push_back(acc_f32(g, "momentum", {d.params}, 0.1));
    SgdArgs a;
    a.lr = 1e-2f, a.momentum = 0.9f, a.weight_decay = 0.01f, a.nesterov = true;
    c.run = [a](Backend& be, T t) { be.sgd_update(t[0], t[4], t[1], t[2], transform(t, 3), a); };
    return c;
  }, nullptr, true);
  add("adamw8bit_update", [](const OpDims& d, Rng& g) {
    OpCase c;
    update_args(c, g, d.params);
    const int64_t n = d.params, blocks = (n + kQuantBlock - 1) / kQuantBlock;
    // Codes may round to a neighbour where the two backends' fp32 values straddle a midpoint.
    OpArg m_codes = ints(g, "m_codes", {n}, 0, 256), v_codes = ints(g, "v_codes", {n}, 0, 256);
    m_codes.dtype = v_codes.dtype = DType::U8;
    m_codes.compared = v_codes.compared = true;
    m_codes.tol = v_codes.tol = 1e-3;
    OpArg m_absmax = acc_f32(g, "m_absmax", {blocks}, 0.1), v_absmax = acc_f32(g, "v_absmax", {blocks}, 0.1);
    for (auto* a : {&m_absmax, &v_absmax})
      for (auto& x : a->values) x = std::fabs(x) + 1e-3;
    const auto map = adamw8bit_qmap();
    c.args.insert(c.args.end(), {m_codes, v_codes, m_absmax, v_absmax,
                                 given("qmap", F32, {512}, std::vector<double>(map.begin(), map.end()))});
    AdamWArgs a;
    a.lr = 1e-2f, a.weight_decay = 0.01f, a.step = 3;
    c.run = [a](Backend& be, T t) {
      be.adamw8bit_update(t[0], t[4], t[5], t[6], t[7], t[1], t[2], t[8], transform(t, 3), a);
    };
    c.tol_f32 = 1e-4;  // a code that rounds the other way moves its parameter
    return c;
  }, nullptr, true);
  add("adafactor_update", [](const OpDims& d, Rng& g) {
    const ParamLayout layout = layout_of(d);
    const AdafactorPlan plan = adafactor_plan(layout);
    const int64_t n = static_cast<int64_t>(layout.total());
    OpCase c;
    update_args(c, g, n);
    // Between the layout's parameters lie alignment gaps that no segment covers: zeros in the
    // parameters, as in a model's flat buffer, and not poisoned in the half copy (the CPU copies
    // every element, the CUDA kernels each segment's).
    std::vector<bool> covered(static_cast<size_t>(n), false);
    for (const AdafactorSegment& s : plan.segments)
      std::fill_n(covered.begin() + s.offset, s.rows * s.cols, true);
    for (size_t i = 0; i < covered.size(); ++i)
      if (!covered[i]) c.args[0].values[i] = c.args[1].values[i] = 0.0;
    OpArg state = acc_f32(g, "state", {plan.state_floats}, 0.1);
    for (auto& x : state.values) x = x * x;
    std::vector<double> segs;
    for (const AdafactorSegment& s : plan.segments)
      for (int64_t f : {s.offset, s.rows, s.cols, s.factored, s.decay, s.row_state, s.col_state, s.scratch, s.chunk,
                        s.chunks, s.chunk_begin, s.strip_begin})
        segs.push_back(static_cast<double>(f));
    const int64_t count = static_cast<int64_t>(plan.segments.size());
    c.args.insert(c.args.end(), {state, given("scratch", F32, {plan.scratch_floats},
                                              std::vector<double>(plan.scratch_floats, 0.0)),
                                 given("segments", DType::I64, {count, kAdafactorSegmentFields}, segs)});
    AdafactorArgs a;
    a.lr = 1e-2f, a.weight_decay = 0.01f, a.step = 3;
    const int64_t chunks = plan.chunks, strips = plan.strips;
    c.run = [=](Backend& be, T t) {
      be.adafactor_update(t[0], t[4], t[5], t[1], t[2], AdafactorTable{t[6], count, chunks, strips}, transform(t, 3), a);
    };
    c.tol_f32 = 1e-4;  // reductions in another order
    return c;
  }, nullptr, true);
  return r;
}

// Host values -> bytes of `dt`.
std::vector<uint8_t> encode(const std::vector<double>& v, DType dt) {
  std::vector<uint8_t> b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    void* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::F32: { const float f = static_cast<float>(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::BF16: { const uint16_t h = f32_to_bf16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::F16: { const uint16_t h = f32_to_f16(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::I32: { const int32_t x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::I64: { const int64_t x = static_cast<int64_t>(v[i]); std::memcpy(p, &x, 8); break; }
      case DType::U8: { const uint8_t x = static_cast<uint8_t>(v[i]); std::memcpy(p, &x, 1); break; }
      default: ADD_FAILURE() << "no host encoding for " << dtype_name(dt);
    }
  }
  return b;
}

double decode(const uint8_t* p, DType dt) {
  switch (dt) {
    case DType::F32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    case DType::I32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::I64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
    case DType::U8: return *p;
    default: ADD_FAILURE() << "no host decoding for " << dtype_name(dt); return kNaN;
  }
}

}  // namespace

OpDims bench_dims() {
  OpDims d;
  d.batch = 32, d.seq = 128, d.hidden = 768, d.heads = 12, d.vocab = 30522, d.classes = 2, d.ffn = 3072;
  d.params = int64_t{1} << 24;
  return d;
}

OpDims odd_dims() {
  OpDims d;
  d.batch = 3, d.seq = 7, d.hidden = 30, d.heads = 2, d.vocab = 23, d.classes = 5, d.ffn = 101;
  d.window = 2;
  d.params = 3 * kNormBlock + 77;
  return d;
}

const std::vector<OpEntry>& op_registry() {
  static const std::vector<OpEntry> r = build_registry();
  return r;
}

const OpEntry* find_op(const std::string& op) {
  for (const OpEntry& e : op_registry())
    if (op == e.op) return &e;
  return nullptr;
}

std::vector<double> arg_values(const OpArg& a, DType dt) {
  std::vector<double> v = a.values;
  const DType t = a.act ? dt : a.dtype;
  if (t == DType::F32 || t == DType::BF16 || t == DType::F16)
    for (auto& x : v) x = decode(encode({x}, t).data(), t);
  return v;
}

CaseTensors make_tensors(Backend& be, const OpCase& c, DType dt, const std::vector<std::vector<double>>& values) {
  CaseTensors out;
  out.buffers.reserve(c.args.size());
  const DType act = be.computes_in(dt) ? dt : DType::F32;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const OpArg& a = c.args[i];
    const DType t = a.act ? act : a.dtype;
    out.buffers.emplace_back(be.allocator(), t, a.shape, Category::Temporary);
    const std::vector<uint8_t> bytes = encode(values[i], t);
    be.upload(out.buffers.back(), bytes.data());
    out.tensors.push_back(out.buffers.back().tensor());
  }
  return out;
}

std::vector<double> read_values(Backend& be, const Tensor& t) {
  std::vector<uint8_t> bytes(t.bytes());
  be.download(bytes.data(), t);
  std::vector<double> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = decode(bytes.data() + i * dtype_size(t.dtype), t.dtype);
  return v;
}

double normalized_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return std::numeric_limits<double>::infinity();
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace anatomy::test
