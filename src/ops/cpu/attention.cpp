// Multi-head self-attention, materialized per query row (the reference, not the fast path).
// Shapes: qkv [B, T, 3H], ctx [B, T, H], lse [B, heads, T], D = H / heads.
// Note [local attention window]: with window w > 0, query i sees key j only when |i - j| <= w
// (and the mask keeps j): ModernBERT's local layers, whose local_attention L gives w = L / 2, as
// transformers' bidirectional sliding-window mask has it (inclusive). A query that sees no key
// attends uniformly to all T keys, as a fully padded sequence does (transformers adds the most
// negative float to every score there, which leaves the softmax uniform).
//
// Note [packed attention]
// Training and evaluation on the batch's real tokens (Note [packed training] in model/bert.cpp)
// keep the hidden states packed: N rows, no padding. When every sequence of the batch is a
// prefix of real tokens followed by padding (right padding, as the data pipeline writes), its
// tokens are consecutive packed rows, sequence b the rows [offsets[b], offsets[b + 1]), and the
// packed attention ops read q|k|v and write the context there directly: no scatter into the
// padded [B, T] layout, no gather back, and no work on padding queries or keys. Everything else
// is the padded op's: scores, the softmax over the sequence's len_b keys (its valid keys),
// the lse in [B, heads, T] at (b, h, t) (0 for t >= len_b), and the dropout element index
// attention_dropout_index(b*heads + h, q, k, T) with the batch's padded T, so the kept elements
// are those of the padded run and the results equal its token rows. Rows from offsets[B] on
// (the packing's padding rows, Note [packed inference]) belong to no sequence: the forward
// writes zeros to their context and the backward to their dq|dk|dv, so they stay finite and
// add nothing to the weight gradients.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

namespace {

struct Layout {
  int64_t batch, seq, hidden, heads, d;
  const int32_t* mask;
  int64_t window;  // Note [local attention window]; 0: every key
  int64_t queries;  // Note [attention scope] in ops/op_args.h; 0: every query
  // Note [packed attention]: sequence b is rows [offsets[b], offsets[b + 1]) of packed qkv and
  // ctx, its tokens 0..len-1 (all valid keys); nullptr: the padded [B, T] layout under `mask`.
  const int32_t* offsets = nullptr;
  int64_t row(int64_t b, int64_t t) const { return offsets ? offsets[b] + t : b * seq + t; }
  // The tokens of sequence b (its queries, and the keys it can attend to).
  int64_t len(int64_t b) const { return offsets ? offsets[b + 1] - offsets[b] : seq; }
  // Whether query i is computed (the scope's first queries), else skipped.
  bool computed(int64_t i) const { return queries == 0 || i < queries; }
  // Offsets into qkv of head h's q, k, v for token (b, t).
  int64_t q(int64_t b, int64_t t, int64_t h) const { return row(b, t) * 3 * hidden + h * d; }
  int64_t k(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + hidden; }
  int64_t v(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + 2 * hidden; }
  int64_t o(int64_t b, int64_t t, int64_t h) const { return row(b, t) * hidden + h * d; }
  bool attends(int64_t b, int64_t query, int64_t key) const {
    if (window > 0 && (key - query > window || query - key > window)) return false;
    return !mask || mask[b * seq + key] != 0;
  }
  bool any_key(int64_t b, int64_t query) const {
    for (int64_t j = 0; j < len(b); ++j)
      if (attends(b, query, j)) return true;
    return false;
  }
};

template <class T>
double dot(const T* x, const T* y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * y[i];
  return s;
}

// P[j] for query row i of head (b, h), from the saved lse: exp(S_ij - lse_i), 0 where masked;
// 1/T everywhere when the sequence has no unmasked key.
template <class T>
void recompute_probs(double* p, const Layout& L, const T* qkv, int64_t b, int64_t h, int64_t i,
                     double lse, bool any, double scale) {
  const T* q = qkv + L.q(b, i, h);
  for (int64_t j = 0; j < L.len(b); ++j) {
    if (!any)
      p[j] = 1.0 / static_cast<double>(L.seq);
    else if (!L.attends(b, i, j))
      p[j] = 0.0;
    else
      p[j] = std::exp(dot(q, qkv + L.k(b, j, h), L.d) * scale - lse);
  }
}

// Queries t >= len(b) of a packed sequence get lse 0 and no ctx row (there is none); queries past
// the scope's a zero ctx row and an lse of +inf.
template <class T>
void forward(const Layout& L, T* ctx, T* lse, const T* qkv, const DropoutSpec& dropout) {
  const int64_t seq = L.seq;
  const double scale = 1.0 / std::sqrt(static_cast<double>(L.d));
  const DropoutMask drop(dropout);
  const int64_t rows = L.batch * L.heads * seq;
#pragma omp parallel if (rows * seq * L.d > kParallelWork)
  {
    std::vector<double> s(seq), out(L.d);
#pragma omp for
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t i = row % seq, bh = row / seq, h = bh % L.heads, b = bh / L.heads, keys = L.len(b);
      if (i >= keys) {
        lse[row] = static_cast<T>(0);
        continue;
      }
      if (!L.computed(i)) {
        lse[row] = static_cast<T>(INFINITY);
        std::fill(ctx + L.o(b, i, h), ctx + L.o(b, i, h) + L.d, static_cast<T>(0));
        continue;
      }
      const bool any = L.any_key(b, i);
      const T* q = qkv + L.q(b, i, h);
      double mx = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        s[j] = !any ? 0.0 : L.attends(b, i, j) ? dot(q, qkv + L.k(b, j, h), L.d) * scale : -INFINITY;
        mx = s[j] > mx ? s[j] : mx;
      }
      double total = 0;
      for (int64_t j = 0; j < keys; ++j) total += std::exp(s[j] - mx);  // exp(-inf) = 0
      const double l = mx + std::log(total);
      lse[row] = static_cast<T>(l);
      std::fill(out.begin(), out.end(), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        const double pd = std::exp(s[j] - l) * drop.factor(attention_dropout_index(bh, i, j, seq));
        if (pd == 0.0) continue;
        const T* v = qkv + L.v(b, j, h);
        for (int64_t c = 0; c < L.d; ++c) out[c] += pd * v[c];
      }
      T* o = ctx + L.o(b, i, h);
      for (int64_t c = 0; c < L.d; ++c) o[c] = static_cast<T>(out[c]);
    }
  }
}

template <class T>
void backward(const Layout& L, T* dqkv, const T* dctx, const T* qkv, const T* lse, const DropoutSpec& dropout) {
  const int64_t D = L.d, seq = L.seq;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const DropoutMask drop(dropout);
  // One (b, h) per iteration: it owns its dq/dk/dv columns, so threads never collide.
#pragma omp parallel if (L.batch * L.heads * seq * seq * D > kParallelWork)
  {
    std::vector<double> p(seq), dp(seq), dq(D), dk(seq * D), dv(seq * D);
#pragma omp for
    for (int64_t bh = 0; bh < L.batch * L.heads; ++bh) {
      const int64_t h = bh % L.heads, b = bh / L.heads, keys = L.len(b);
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int64_t i = 0; i < keys; ++i) {
        if (!L.computed(i)) {  // a zero dctx row: dq = 0, nothing into dk and dv
          std::fill(dqkv + L.q(b, i, h), dqkv + L.q(b, i, h) + D, static_cast<T>(0));
          continue;
        }
        const int64_t row = bh * seq + i;
        const bool any = L.any_key(b, i);
        const T* q = qkv + L.q(b, i, h);
        const T* dout = dctx + L.o(b, i, h);
        recompute_probs(p.data(), L, qkv, b, h, i, static_cast<double>(lse[row]), any, scale);
        double rowsum = 0;  // D_i = sum_j P_ij dP_ij
        for (int64_t j = 0; j < keys; ++j) {
          const double f = drop.factor(attention_dropout_index(bh, i, j, seq));
          const T* v = qkv + L.v(b, j, h);
          if (p[j] != 0.0 && f != 0.0)
            for (int64_t c = 0; c < D; ++c) dv[j * D + c] += p[j] * f * dout[c];
          dp[j] = f == 0.0 ? 0.0 : dot(dout, v, D) * f;
          rowsum += p[j] * dp[j];
        }
        std::fill(dq.begin(), dq.end(), 0.0);
        if (any) {
          for (int64_t j = 0; j < keys; ++j) {
            const double ds = p[j] * (dp[j] - rowsum) * scale;
            if (ds == 0.0) continue;
            const T* k = qkv + L.k(b, j, h);
            for (int64_t c = 0; c < D; ++c) {
              dq[c] += ds * k[c];
              dk[j * D + c] += ds * q[c];
            }
          }
        }
        T* dqo = dqkv + L.q(b, i, h);
        for (int64_t c = 0; c < D; ++c) dqo[c] = static_cast<T>(dq[c]);
      }
      for (int64_t j = 0; j < keys; ++j) {
        T* dko = dqkv + L.k(b, j, h);
        T* dvo = dqkv + L.v(b, j, h);
        for (int64_t c = 0; c < D; ++c) {
          dko[c] = static_cast<T>(dk[j * D + c]);
          dvo[c] = static_cast<T>(dv[j * D + c]);
        }
      }
    }
  }
}

}  // namespace

template <class T>
void attention_forward(T* ctx, T* lse, const T* qkv, const int32_t* mask, int64_t batch,
                       int64_t seq, int64_t hidden, int heads, const DropoutSpec& dropout, int64_t window,
                       int64_t queries) {
  forward(Layout{batch, seq, hidden, heads, hidden / heads, mask, window, queries}, ctx, lse, qkv, dropout);
}

template <class T>
void attention_backward(T* dqkv, const T* dctx, const T* qkv, const T* ctx, const T* lse,
                        const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden, int heads,
                        const DropoutSpec& dropout, int64_t window, int64_t queries) {
  (void)ctx;
  backward(Layout{batch, seq, hidden, heads, hidden / heads, mask, window, queries}, dqkv, dctx, qkv, lse, dropout);
}

// Note [packed attention]: ANATOMY_CHECKs the offsets (the CPU trusts no device index).
template <class T>
void attention_packed_forward(T* ctx, T* lse, const T* qkv, const int32_t* offsets, int64_t rows, int64_t batch,
                              int64_t seq, int64_t hidden, int heads, const DropoutSpec& dropout, int64_t window,
                              int64_t queries) {
  check_packed_offsets(offsets, rows, batch, seq);
  forward(Layout{batch, seq, hidden, heads, hidden / heads, nullptr, window, queries, offsets}, ctx, lse, qkv, dropout);
  std::fill(ctx + offsets[batch] * hidden, ctx + rows * hidden, static_cast<T>(0));
}

template <class T>
void attention_packed_backward(T* dqkv, const T* dctx, const T* qkv, const T* lse, const int32_t* offsets,
                               int64_t rows, int64_t batch, int64_t seq, int64_t hidden, int heads,
                               const DropoutSpec& dropout, int64_t window, int64_t queries) {
  check_packed_offsets(offsets, rows, batch, seq);
  backward(Layout{batch, seq, hidden, heads, hidden / heads, nullptr, window, queries, offsets}, dqkv, dctx, qkv, lse,
           dropout);
  std::fill(dqkv + offsets[batch] * 3 * hidden, dqkv + rows * 3 * hidden, static_cast<T>(0));
}

void check_packed_offsets(const int32_t* offsets, int64_t rows, int64_t batch, int64_t seq) {
  ANATOMY_CHECK(offsets[0] == 0, "attention: packed offsets start at ", offsets[0], ", not 0");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = offsets[b + 1] - offsets[b];
    ANATOMY_CHECK(len >= 1 && len <= seq, "attention: packed sequence ", b, " has ", len, " tokens, not 1 to ", seq);
  }
  ANATOMY_CHECK(offsets[batch] <= rows, "attention: packed offsets end at row ", offsets[batch], " of ", rows);
}

#define ANATOMY_INSTANTIATE(T)                                                                      \
  template void attention_forward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t,   \
                                     int, const DropoutSpec&, int64_t, int64_t);                    \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const T*, const int32_t*,   \
                                      int64_t, int64_t, int64_t, int, const DropoutSpec&, int64_t, int64_t); \
  template void attention_packed_forward<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t,     \
                                            int64_t, int64_t, int, const DropoutSpec&, int64_t, int64_t); \
  template void attention_packed_backward<T>(T*, const T*, const T*, const T*, const int32_t*,      \
                                             int64_t, int64_t, int64_t, int64_t, int,               \
                                             const DropoutSpec&, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
