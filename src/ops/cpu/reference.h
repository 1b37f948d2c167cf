// The math of every backend op on raw row-major arrays, templated on the scalar type T.
// CpuBackend calls the float instantiation; tests call the double one for finite-difference
// gradient checks. Reductions accumulate in double for both. Definitions live in the
// per-family .cpp files next to this header and are instantiated for float and double.
//
// Conventions: outputs first, then inputs, then sizes and options; "+=" says the output is
// accumulated into, every other output is overwritten. Optional inputs/outputs are nullptr.
// Dimensions are int64_t, element counts size_t. Options (DropoutSpec, ...) come from
// ops/backend.h and have the same meaning as there.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/backend.h"

namespace anatomy::ref {

// ---- tensor contractions (matmul.cpp) ---------------------------------------------------
// pre = alpha * op(A) op(B) + beta * C_old (+ bias[n] with Bias / BiasGelu);
// C = pre, or gelu(pre) with BiasGelu, which also stores pre into gelu_in [M, N].
// So beta scales the old C BEFORE the epilogue, as cuBLASLt does. With beta == 0 the old C
// is never read (NaN in C does not propagate). op(A) is [M, K]: A is [M, K] for Trans::N,
// [K, M] for Trans::T; op(B) is [K, N]: B is [K, N] for Trans::N, [N, K] for Trans::T.
// Epilogue::BiasGrad is not handled here: its reference is this GEMM, then bias_grad over A.
template <class T>
void matmul(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k,
            T alpha, T beta, Epilogue epilogue, const T* bias, T* gelu_in);
// db[n] += sum_r dy[r, n], dy [rows, n].
template <class T>
void bias_grad(T* db, const T* dy, int64_t rows, int64_t n);

// ---- fp8 (fp8.cpp; Note [fp8 training] in core/fp8.h) ------------------------------------
// out[i] = fp8_round(in[i] * scale) / scale with meta's scale (the value the fp8 GEMM sees, back
// on the input's scale); meta's amax of this step raised to max |in[i]|.
void fp8_quantize(float* out, const float* in, int64_t n, float* meta, Fp8Format format);
// The delayed scaling's step for rows x kFp8MetaWidth values (Backend::fp8_scale_update).
void fp8_scale_update(float* meta, int64_t rows);

// ---- attention (attention.cpp) ----------------------------------------------------------
// qkv [B, T, 3H] (per token [q | k | v], head h at columns [h*D, (h+1)*D) of each), mask
// I32 [B, T] (nullptr: attend everywhere), ctx [B, T, H], lse [B, heads, T].
// S = (q k^T) / sqrt(D); a key with mask 0 gets probability exactly 0 (score -inf). When all
// keys of a sequence are masked, the row attends uniformly (every score taken as the constant
// 0, lse = log T): Hugging Face's finfo.min mask gives the same uniform row. lse is the
// natural log-sum-exp of the masked scaled scores, always finite. P = exp(S - lse);
// Pd = P * keep / (1 - p) with the dropout index ((b*heads + h)*T + q)*T + k; ctx = Pd V.
template <class T>
void attention_forward(T* ctx, T* lse, const T* qkv, const int32_t* mask, int64_t batch,
                       int64_t seq, int64_t hidden, int heads, const DropoutSpec& dropout, int64_t window = 0, int64_t queries = 0);
// dqkv [B, T, 3H] (overwritten). Recomputes P from lse, then, per head:
//   dV = Pd^T dO;  dPd = dO V^T;  dP = dPd * keep / (1 - p);
//   dS = P * (dP - D), D_i = sum_j P_ij dP_ij (= dO_i . O_i, also with dropout);
//   dQ = dS K * scale;  dK = dS^T Q * scale.  Fully masked rows give dS = 0.
// ctx is accepted for the flash-style D = rowsum(dO * O); the reference computes D from P.
template <class T>
void attention_backward(T* dqkv, const T* dctx, const T* qkv, const T* ctx, const T* lse,
                        const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden, int heads,
                        const DropoutSpec& dropout, int64_t window = 0, int64_t queries = 0);
// window > 0: Note [local attention window] in attention.cpp. queries > 0 (Note [attention scope]
// in ops/op_args.h): the forward computes each sequence's first `queries` queries and gives the
// later ones a zero ctx and an lse of +inf; the backward skips them (their dq is zero).
// The packed forms (Note [packed attention] in attention.cpp): qkv [rows, 3H], ctx [rows, H],
// sequence b the rows [offsets[b], offsets[b + 1]), 1 to seq tokens each, lse [B, heads, seq];
// rows from offsets[B] on are zeroed (ctx; dqkv). check_packed_offsets throws on offsets that
// break this.
template <class T>
void attention_packed_forward(T* ctx, T* lse, const T* qkv, const int32_t* offsets, int64_t rows, int64_t batch,
                              int64_t seq, int64_t hidden, int heads, const DropoutSpec& dropout, int64_t window = 0, int64_t queries = 0);
template <class T>
void attention_packed_backward(T* dqkv, const T* dctx, const T* qkv, const T* lse, const int32_t* offsets,
                               int64_t rows, int64_t batch, int64_t seq, int64_t hidden, int heads,
                               const DropoutSpec& dropout, int64_t window = 0, int64_t queries = 0);
void check_packed_offsets(const int32_t* offsets, int64_t rows, int64_t batch, int64_t seq);

// ---- ModernBERT's rotary embeddings and gated GELU (rotary.cpp) --------------------------
// On q and k of qkv [B, T, 3H] (head dim D even; v copied): for token t, head h, d < D/2 and
// a = t * theta^(-2d/D), (x[d], x[d + D/2]) -> (x[d] cos a - x[d+D/2] sin a,
// x[d+D/2] cos a + x[d] sin a). inverse: the transposed rotation (backward). y may be x.
// With rows (n of them): the first n rows of [batch*seq, 3*hidden] only, row r at position
// rows[r] mod seq (Backend::rotary_forward's packed layout).
template <class T>
void rotary(T* y, const T* x, int64_t batch, int64_t seq, int64_t hidden, int heads, double theta, bool inverse,
            const int32_t* rows = nullptr, int64_t n = 0);
// x [rows, 2i] = [input | gate]: y [rows, i] = gelu(input) * gate;
// dx = [dy * gate * gelu'(input) | dy * gelu(input)].
template <class T>
void geglu_forward(T* y, const T* x, int64_t rows, int64_t i);
template <class T>
void geglu_backward(T* dx, const T* dy, const T* x, int64_t rows, int64_t i);

// ---- statistical normalizations (layernorm.cpp, loss.cpp) -------------------------------
// Over rows of width h: sum = dropout(branch) + residual (residual may be nullptr; dropout
// index = element index in [rows, h]); mean = E[sum]; rstd = 1 / sqrt(Var[sum] + eps)
// (biased variance, two passes); y = (sum - mean) * rstd * gamma + beta. sum may be nullptr
// (not stored; backward reads y instead).
template <class T>
void layernorm_forward(T* y, T* sum, T* mean, T* rstd, const T* branch, const T* residual,
                       const T* gamma, const T* beta, int64_t rows, int64_t h, double eps,
                       const DropoutSpec& branch_dropout);
// From the output (Note [layernorm backward from its output]): xhat = (y - beta) / gamma,
// g = dy * gamma:
//   dsum = rstd * (g - mean(g) - xhat * mean(g * xhat));  dbranch = dropout_backward(dsum)
//   (dbranch may be nullptr); dgamma += sum_rows dy * xhat; dbeta += sum_rows dy.
// A column whose gamma is exactly zero carries no information about xhat: it counts as xhat = 0
// (not exact there; see the note).
template <class T>
void layernorm_backward(T* dsum, T* dbranch, T* dgamma, T* dbeta, const T* dy, const T* y,
                        const T* rstd, const T* gamma, const T* beta, int64_t rows, int64_t h,
                        const DropoutSpec& branch_dropout);
// losses[b] = logsumexp(logits[b]) - logits[b, label[b]];
// dlogits = (softmax(logits) - onehot(label)) * grad_scale (dlogits may be nullptr).
// Throws anatomy::Error when a label is outside [0, classes).
template <class T>
void cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* labels, int64_t batch,
                   int64_t classes, double grad_scale);
// Per-token cross-entropy (Backend::token_cross_entropy): rows with label kIgnoreIndex are not
// scored; losses[b] = loss_weight * sum of the scored rows' losses of sequence b (rows / batch
// rows each). Throws when a scored label is outside [0, classes).
inline constexpr int32_t kIgnoreIndex = -100;
template <class T>
void token_cross_entropy(T* losses, T* dlogits, const T* logits, const int32_t* labels, int64_t batch, int64_t rows,
                         int64_t classes, double loss_weight, double grad_scale);
// The float-target losses (Note [float target losses] in loss.cpp): binary false is the squared
// error of transformers' regression head, true the binary cross-entropy with logits of its
// multi-label head; per sample the mean over the classes. dlogits may be nullptr.
template <class T>
void float_target_loss(T* losses, T* dlogits, const T* logits, const T* targets, int64_t batch, int64_t classes,
                       double grad_scale, bool binary);

// ---- element-wise (elementwise.cpp, embedding.cpp) --------------------------------------
// y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  dx = dy * (Phi(x) + x phi(x)).
template <class T>
void gelu_forward(T* y, const T* x, size_t n);
template <class T>
void gelu_backward(T* dx, const T* dy, const T* x, size_t n);
// dx = dy * (1 - y^2), y = tanh(x).
template <class T>
void tanh_forward(T* y, const T* x, size_t n);
template <class T>
void tanh_backward(T* dx, const T* dy, const T* y, size_t n);
// y = max(x, 0); dx = y > 0 ? dy : 0.
template <class T>
void relu_forward(T* y, const T* x, size_t n);
template <class T>
void relu_backward(T* dx, const T* dy, const T* y, size_t n);
// y[i] = keep(i) ? x[i] / (1 - p) : 0 (p == 0: y = x). Backward is the same map on dy.
template <class T>
void dropout_forward(T* y, const T* x, size_t n, const DropoutSpec& d);
template <class T>
void dropout_backward(T* dx, const T* dy, size_t n, const DropoutSpec& d);
template <class T>
void add(T* y, const T* a, const T* b, size_t n);
// out[b, :] = x[b, t, :] for x [B, T, H]; backward: dx[:, t, :] = dout, the rest zero.
template <class T>
void select_token(T* out, const T* x, int64_t batch, int64_t seq, int64_t hidden, int64_t t);
template <class T>
void select_token_backward(T* dx, const T* dout, int64_t batch, int64_t seq, int64_t hidden,
                           int64_t t);
// Mean pooling (pool.cpp): n_b = max(1, tokens of sequence b with mask != 0; mask nullptr: all T);
// out[b, :] = sum of those rows of x [B, T, H] / n_b (in double); dx[b, t, :] = dout[b, :] / n_b
// where the mask keeps token t, else 0.
template <class T>
void masked_mean_forward(T* out, const T* x, const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden);
template <class T>
void masked_mean_backward(T* dx, const T* dout, const int32_t* mask, int64_t batch, int64_t seq, int64_t hidden);
// Row copies of row_bytes bytes each (rows.cpp; any element type), n rows named by idx:
// gather: out row i = in row idx[i]; scatter: out row idx[i] = in row i. idx is trusted here
// (the backend checks it against the row count).
void gather_rows(void* out, const void* in, const int32_t* idx, int64_t n, size_t row_bytes);
void scatter_rows(void* out, const void* in, const int32_t* idx, int64_t n, size_t row_bytes);
// e[b*T + t, :] = word[ids[b, t]] + pos[t] + type[type_ids[b, t]] (type_ids nullptr: all 0).
// Throws anatomy::Error for an id >= vocab, a type id >= type_vocab, or seq > max_pos.
template <class T>
void embedding_forward(T* e, const int32_t* ids, const int32_t* type_ids, const T* word,
                       const T* pos, const T* type, int64_t batch, int64_t seq, int64_t hidden,
                       int64_t vocab, int64_t max_pos, int64_t type_vocab);
// dword[ids] += de, dpos[t] += de, dtype[type_ids] += de (any of the three may be nullptr).
template <class T>
void embedding_backward(T* dword, T* dpos, T* dtype, const T* de, const int32_t* ids,
                        const int32_t* type_ids, int64_t batch, int64_t seq, int64_t hidden,
                        int64_t vocab, int64_t max_pos, int64_t type_vocab);

// ---- optimizer (optimizer.cpp) ----------------------------------------------------------
// partials[k] = sum of x^2 over block k of `block` elements (the last may be short), each
// block in index order in double; out[0] = sum of partials[0..n) in index order in double.
template <class T>
void block_sum_squares(T* partials, const T* x, size_t n, size_t block);
template <class T>
void sum_blocks(T* out, const T* partials, size_t n);
// The factor applied to raw gradients (GradTransform in backend.h): inv_loss_scale * clip,
// clip = max_norm > 0 ? min(1, max_norm / (sqrt(norm_sq) * inv_loss_scale + 1e-6)) : 1.
double grad_factor(double norm_sq, double inv_loss_scale, double max_norm);
// PyTorch AdamW with g = grads * factor:
//   p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
template <class T>
void adamw_update(T* params, T* m, T* v, const T* grads, size_t n, double factor,
                  const AdamWArgs& a);
// PyTorch SGD (dampening 0) with g = grads * factor + wd * p; buf = momentum * buf + g
// (buffers start at zero, so the first step gives buf = g as PyTorch does);
// p -= lr * (nesterov ? g + momentum * buf : buf). momentum == 0: p -= lr * g, buf untouched
// (may be nullptr).
template <class T>
void sgd_update(T* params, T* buf, const T* grads, size_t n, double factor, const SgdArgs& a);
// Block-wise 8-bit AdamW (Backend::adamw8bit_update, Note [8-bit AdamW] in
// optim/adamw8bit.h): per block of kQuantBlock values, dequantize m and v (code -> map entry
// times the block's absmax), apply adamw_update's math in T with g = grads * factor, store the
// new absmax (max |m|, max v over the block) and the nearest codes. With T = float the math is
// ops/optim_math.h's, the same operations as the CUDA kernel. qmap: signed map then unsigned.
template <class T>
void adamw8bit_update(float* params, uint8_t* m_codes, uint8_t* v_codes, float* m_absmax, float* v_absmax,
                      const float* grads, const float* qmap, size_t n, T factor, const AdamWArgs& a);
// Adafactor (Hugging Face, explicit lr, no momentum) over the parameters of `segs` (the
// AdafactorSegment fields offset, rows, cols, factored, decay, row_state, col_state), math in
// double. With g = grads * factor and beta2t = 1 - step^decay_rate:
//   factored [R, C]: row = beta2t row + (1-beta2t) mean_j(g^2 + eps1), col likewise over i;
//     u = g * rsqrt(row_i / mean(row)) * rsqrt(col_j);
//   unfactored: v = beta2t v + (1-beta2t) (g^2 + eps1); u = g * rsqrt(v);
//   u /= max(1, RMS(u) / clip_threshold); p -= lr * wd * p (decay segments); p -= lr * u.
template <class T>
void adafactor_update(T* params, T* state, const T* grads, const AdafactorSegment* segs, size_t count,
                      double factor, const AdafactorArgs& a);

}  // namespace anatomy::ref
