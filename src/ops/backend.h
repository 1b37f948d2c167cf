// The backend interface: every op the BERT forward and backward needs, once for the CPU
// (ops/cpu, the fp32 reference) and once for CUDA (ops/cuda). The model is written once
// against this interface.
//
// Conventions (all ops):
// - Tensors are contiguous row-major views; outputs come first, then inputs, then options.
// - "Activation" tensors are in the run's compute dtype (F32, or BF16/F16 in mixed
//   precision); parameter tensors passed to forward ops are in the compute dtype too (the
//   half copy); parameter gradients are F32 and are always ACCUMULATED into (+=): the
//   trainer zeroes them at the start of each accumulation cycle.
// - Linear layers follow Hugging Face: weight [out, in], y = x W^T + b.
// - Dropout is counter-based (core/rng.h, Note [dropout bits]): element i of a dropout site
//   with spec (p, seed, offset) is kept iff dropout_keep(seed, offset, i, p); kept values are
//   scaled by 1/(1-p). Backward regenerates the mask; nothing is stored. p == 0 means identity.
// - Attention masks are I32 [B, T], 1 = attend to this key, 0 = padding (Hugging Face).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "memory/allocator.h"
#include "ops/observer.h"
#include "ops/op_args.h"

namespace anatomy {

// Note [backend contract]: every op below is a non-virtual entry point defined in
// ops/contract.cpp. It checks devices, dtypes and shapes once, against the one written contract
// there (so the CPU and CUDA backends fail the same misuse with the same words), reports the op
// to the observer if one is set, and calls the protected virtual *_impl, which a backend
// implements assuming the contract holds. Adding an op: its declaration and *_impl here, its
// entry point (contract, profile name, cost) in ops/contract.cpp, one *_impl per backend over its
// kernels, and one entry in tests/common/op_registry.cpp, which tests and times it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual std::string name() const = 0;
  virtual void synchronize() = 0;
  // The CUDA stream every op of this backend runs on (a cudaStream_t), for libraries that enqueue
  // on it (NCCL); nullptr on the CPU.
  virtual void* native_stream() { return nullptr; }
  // Makes this backend's device the calling thread's current one (CUDA devices are per thread);
  // a data-parallel rank calls it first on its own thread.
  virtual void bind_to_thread() {}
  // Let F32 contractions use TF32 tensor cores (--precision tf32); the CPU ignores it.
  virtual void set_allow_tf32(bool) {}
  // Times the matrix products planned so far against the library's other algorithms and keeps
  // the faster ones (Note [gemm tuning] in ops/cuda/matmul.cpp), with `scratch` (device memory of
  // `bytes` that holds nothing now) for their operands; returns a markdown report. Empty: this
  // backend has nothing to tune (the CPU).
  virtual std::string tune_matmuls(void* /*scratch*/, size_t /*bytes*/) { return {}; }
  // The activation dtypes this backend computes in (the CPU: F32 only).
  virtual bool computes_in(DType dt) const = 0;

  // The phase the ops issued from now on belong to (the model and trainer set it).
  void set_phase(Phase p) { m_phase = p; }
  Phase phase() const { return m_phase; }
  // Every op is reported to `o` (nullptr: none) until it is replaced; the observer must outlive
  // its attachment.
  void set_observer(OpObserver* o) { m_observer = o; }
  OpObserver* observer() const { return m_observer; }

  // ---- timing marks (the op profiler) -------------------------------------------------
  // A mark records "now" in the backend's stream order: CUDA events on the GPU, the host
  // clock on the CPU (whose ops are synchronous). elapsed_ms is valid after synchronize().
  virtual int timing_mark() {
    m_host_marks.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(m_host_marks.size()) - 1;
  }
  virtual double timing_elapsed_ms(int a, int b) {
    return std::chrono::duration<double, std::milli>(m_host_marks[b] - m_host_marks[a]).count();
  }
  virtual void timing_reset() { m_host_marks.clear(); }

  // ---- graph capture (CUDA graphs) ------------------------------------------------------
  // begin_capture: the ops issued until end_capture are recorded instead of run, with their
  // arguments (pointers, scalars, dropout specs) frozen; replay() then runs the recording
  // again in stream order, as often as wanted. Only device work may be recorded: no upload,
  // download or synchronize in between, and every buffer an op grows on first use (the
  // attention scratch) must have been sized by an eager run first. begin_capture returns
  // false when the backend cannot record (the CPU): the ops then simply run.
  virtual bool begin_capture() { return false; }
  virtual void end_capture() {}
  virtual void replay() {}

  // ---- data movement -------------------------------------------------------------------
  void upload(const Tensor& dst, const void* host);  // host bytes -> dst
  // Note [asynchronous uploads]: the trainer's batches go through page-locked staging memory
  // (host_alloc) and upload_async, which enqueues the copy in stream order and returns at once;
  // the staging block may be rewritten only after wait_copy(token) returns. So a step never
  // waits for the device between micro-batches. download_async is the way back: the step's
  // figures reach page-locked memory in stream order, readable once wait_copy(token) returns,
  // while later work queued behind them runs on (Note [a step in flight] in train/trainer.cpp).
  // The CPU copies synchronously (token 0).
  virtual void* host_alloc(size_t bytes) { return ::operator new(bytes); }
  virtual void host_free(void* p) { ::operator delete(p); }
  int upload_async(const Tensor& dst, const void* host);
  int download_async(void* host, const Tensor& src);
  virtual void wait_copy(int /*token*/) {}
  void download(void* host, const Tensor& src);     // src -> host bytes
  void copy(const Tensor& dst, const Tensor& src);  // same dtype and size
  void cast(const Tensor& dst, const Tensor& src);  // between float dtypes
  void fill(const Tensor& dst, float value);

  // ---- tensor contractions -------------------------------------------------------------
  // C[M,N] = alpha * op(A) op(B) + beta * C (+ bias, GELU per args.epilogue).
  // A, B in the compute dtype; C in the compute dtype or F32 (parameter gradients).
  // Epilogue::BiasGrad (Note [fused bias gradient] in ops/op_args.h): the weight gradient
  // C = A^T B (ta = T, alpha 1, beta 0 or 1) with args.bias F32 [M] = beta * bias + the column
  // sums of A [K, M]: the GEMM and bias_grad(bias, A) in one call.
  void matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const MatmulArgs& args);
  // db[N] += sum over rows of dy[M, N].
  void bias_grad(const Tensor& db, const Tensor& dy);
  // The delayed scaling's step (Note [fp8 training] in core/fp8.h): for each row of meta F32
  // [rows, kFp8MetaWidth], the scale (and its inverse) from the largest finite amax of the
  // history, then the history shifted by one with this step's amax cleared.
  void fp8_scale_update(const Tensor& meta);

  // ---- attention -----------------------------------------------------------------------
  // qkv [B, T, 3H] with per token [q | k | v], head h at columns [h*D, (h+1)*D) of each.
  // ctx [B, T, H]; lse F32 [B, heads, T] = log-sum-exp of the scaled, masked scores.
  // scale = 1/sqrt(D). Dropout (on the probabilities) with element index
  // attention_dropout_index(b*heads + h, q, k, T) (Note [attention dropout index] in core/rng.h).
  // scope: the key window and the queries the caller reads (Note [attention scope] in
  // ops/op_args.h); {} computes every query on every key the mask keeps.
  void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                         const DropoutSpec& dropout, AttentionScope scope = {});
  // dbias F32 [3H] (if defined) += the column sums of dqkv as stored: the q|k|v bias gradient,
  // taken where dqkv is written (Note [fused bias gradient] in ops/op_args.h).
  void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                          const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout,
                          AttentionScope scope = {}, const Tensor& dbias = Tensor());
  // Attention on packed rows (Note [packed attention] in ops/cpu/attention.cpp): qkv [N, 3H],
  // ctx [N, H]; sequence b is rows [offsets[b], offsets[b + 1]) of offsets I32 [B + 1], 1 to T
  // tokens, every one a valid key; lse F32 [B, heads, T] as above, 0 past a sequence's end; the
  // dropout index that of the padded [B, T] batch. Rows from offsets[B] on get a zero ctx
  // (forward) and a zero dqkv (backward). pairs = the (query, key) pairs the scope asks for, the
  // host's count for the op's cost (the offsets live on the device): sum over b of len_b^2, or
  // of min(len_b, scope.queries) len_b. Only where packed_attention_supported().
  void attention_packed_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets,
                                int heads, const DropoutSpec& dropout, int64_t pairs, AttentionScope scope = {});
  void attention_packed_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                 const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& dropout,
                                 int64_t pairs, AttentionScope scope = {}, const Tensor& dbias = Tensor());  // dbias as above
  // Whether the packed attention runs here for activations of `dt`, batches padded to `seq` and
  // head dim `head_dim` (the CPU: always; CUDA: where its flash kernels do). Where it does not,
  // the model keeps attention on the padded layout (scatter, attention, gather).
  virtual bool packed_attention_supported(DType dt, int64_t seq, int64_t head_dim) const {
    (void)dt, (void)seq, (void)head_dim;
    return true;
  }
  // Rotary position embeddings (ModernBERT) on q and k of qkv [B, T, 3H], head dim D even, the
  // position of a token its index t in the sequence: for head h and d < D/2, with
  // a = t * theta^(-2d/D), (x[d], x[d + D/2]) -> (x[d] cos a - x[d + D/2] sin a,
  // x[d + D/2] cos a + x[d] sin a); v is copied. y may be x.
  // With `rows` (I32 [N], N <= B*T: DeviceBatch::token_rows) the op runs on the packed layout
  // (Note [packed training] in model/bert.cpp): only the first N rows of the [B*T, 3H] view,
  // row r at position rows[r] mod T (its index in its padded sequence); the other rows of y are
  // left as they are.
  void rotary_forward(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows = Tensor());
  // The transposed (inverse) rotation of dy: dx = R^T dy. dx may be dy.
  void rotary_backward(const Tensor& dx, const Tensor& dy, int heads, float theta, const Tensor& rows = Tensor());

  // ---- statistical normalizations ------------------------------------------------------
  // sum = dropout(branch) + residual (residual may be undefined: then sum = dropout(branch));
  // y = (sum - mean) * rstd * gamma + beta over the last dim. mean, rstd F32 [rows].
  // gamma, beta both F32 or both of the compute dtype. sum may be undefined (then it is not
  // stored, and the statistics are those of the unrounded sum).
  void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                         const Tensor& branch, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                         float eps, const DropoutSpec& branch_dropout);
  // From forward's output y and rstd (Note [layernorm backward from its output] in
  // ops/cpu/layernorm.cpp): dsum = dL/dsum; dbranch (if defined) = dropout_backward(dsum);
  // dgamma, dbeta F32 (+=). dbias F32 [H] (if defined; needs dbranch) += the column sums of
  // dbranch: the bias gradient of the layer whose output was the branch, in the same pass.
  void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                          const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma,
                          const Tensor& beta, const DropoutSpec& branch_dropout, const Tensor& dbias = Tensor());
  // Cross-entropy over logits [B, C] with I32 labels [B]: losses F32 [B] (per sample);
  // dlogits = (softmax - onehot) * grad_scale (grad_scale = loss_scale / total batch).
  void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                     float grad_scale);
  // The losses on float targets F32 [B, C] of transformers' regression and multi-label heads
  // (Note [float target losses] in ops/cpu/loss.cpp), per sample the mean over the C columns,
  // so that the batch mean is transformers' mean over B*C elements:
  //   mse_loss:        losses[b] = mean_c (x - t)^2;  dlogits = 2 (x - t) / C * grad_scale.
  //   bce_with_logits: losses[b] = mean_c max(x, 0) - x t + log(1 + exp(-|x|));
  //                    dlogits = (sigmoid(x) - t) / C * grad_scale.
  // dlogits may be undefined (evaluation).
  void mse_loss(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                float grad_scale);
  void bce_with_logits(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                       float grad_scale);

  // Cross-entropy per token over logits [R, V] (R = B*T rows, B = losses' length) with I32 labels
  // [R], where label -100 (transformers' ignore_index) means the row is not scored (masked-LM:
  // every token but the masked ones): losses[b] = loss_weight * sum over the scored rows of
  // sequence b of logsumexp(x) - x[label]; dlogits = (softmax - onehot) * grad_scale on scored
  // rows, 0 on the others. dlogits may be undefined.
  void token_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                           float loss_weight, float grad_scale);

  // ---- element-wise --------------------------------------------------------------------
  void gelu_forward(const Tensor& y, const Tensor& x);  // exact erf GELU
  // dbias F32 [C] (if defined) += the column sums of dx viewed as [R, C]: the bias gradient of
  // the layer whose output was x, in the same pass.
  void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias = Tensor());
  // Gated GELU (ModernBERT's MLP): x [R, 2I] = [input | gate], y [R, I] = gelu(input) * gate;
  // dx [R, 2I] = [dy * gate * gelu'(input) | dy * gelu(input)] (overwritten).
  void geglu_forward(const Tensor& y, const Tensor& x);
  void geglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
  void tanh_forward(const Tensor& y, const Tensor& x);
  void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);
  // y = max(x, 0); dx = dy where y > 0, else 0 (from the output, as tanh; in place allowed).
  void relu_forward(const Tensor& y, const Tensor& x);
  void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y);
  void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d);
  void dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d);
  // y = a + b (same shape and dtype).
  void add(const Tensor& y, const Tensor& a, const Tensor& b);
  // e[B*T, H] = word[ids] + pos[t] + type[type_ids]; ids, type_ids I32 [B, T]; the tables F32
  // (summed in fp32, rounded once) or of e's dtype.
  void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                         const Tensor& pos, const Tensor& type);
  // F32 gradients (+=) from de [B*T, H]; an undefined table gradient is skipped.
  void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                          const Tensor& ids, const Tensor& type_ids);
  // out[B, H] = x[B, T, H][:, t, :]; backward writes dx[:, t, :] = dout and zeroes the rest.
  void select_token(const Tensor& out, const Tensor& x, int64_t t);
  void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t);
  // Mean pooling over the attention mask (ModernBERT's classifier_pooling "mean"): x [B, T, H],
  // mask I32 [B, T] (undefined: every token counts), n_b = the number of tokens of sequence b
  // whose mask is nonzero: out[b, :] = (sum of those x[b, t, :]) / max(1, n_b), summed in fp32 in
  // token order and rounded once to out's dtype. Backward writes all of dx [B, T, H]:
  // dx[b, t, :] = dout[b, :] / n_b where the mask is nonzero, else 0. A sequence without a token
  // pools to 0 and gets no gradient (Note [empty mean pool] in ops/cpu/pool.cpp).
  void masked_mean_forward(const Tensor& out, const Tensor& x, const Tensor& mask);
  void masked_mean_backward(const Tensor& dx, const Tensor& dout, const Tensor& mask);
  // Row copies between a padded [R, C] layout and a packed [N, C] one (Note [packed inference]
  // in model/bert.cpp); any dtype, the same on both sides; idx I32 [N] with values in [0, R)
  // (the CPU checks; a CUDA kernel skips a row out of range).
  // gather: out[i, :] = in[idx[i], :].
  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx);
  // scatter: out[idx[i], :] = in[i, :]; rows of out that idx does not name are left as they are
  // (the caller zero-fills them when it needs zeros). idx must not repeat a row.
  void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx);

  // ---- optimizer -----------------------------------------------------------------------
  // The squared gradient norm in one canonical order (Note [canonical gradient norm] in
  // optim/grad_norm.h), in two ops:
  // partials F32 [ceil(n / kNormBlock)]: partials[k] = sum of x^2 over x[k*kNormBlock, (k+1)*kNormBlock),
  // each block in one fixed order whatever the threads (double on the CPU), rounded to F32.
  void block_sum_squares(const Tensor& partials, const Tensor& x);
  // out F32 [1] = sum of partials F32 [n], in one fixed order (double accumulation).
  void sum_blocks(const Tensor& out, const Tensor& partials);
  // In place on F32 params/grads/moments of equal size; half_copy (if defined) receives
  // the updated params in its dtype (the compute copy in mixed precision).
  void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                    const Tensor& grads, const GradTransform& g, const AdamWArgs& a);
  void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                  const GradTransform& g, const SgdArgs& a);
  // Block-wise 8-bit AdamW (Note [8-bit AdamW] in optim/adamw8bit.h) over F32 params and
  // grads [n]: m_codes, v_codes U8 [n] and m_absmax, v_absmax F32 [ceil(n / kQuantBlock)] are
  // dequantized, updated in fp32 with the AdamW math of adamw_update, and re-quantized in
  // place. qmap F32 [512]: the signed map of m (entries 0..255) then the unsigned map of v,
  // each sorted ascending. half_copy as in adamw_update.
  void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                        const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                        const GradTransform& g, const AdamWArgs& a);
  // Adafactor over whole flat F32 params and grads: every parameter of `table` is updated in
  // place (weight decay where its segment says so); state F32 holds the second-moment
  // statistics, scratch F32 the kernels' reductions (AdafactorSegment). half_copy as in
  // adamw_update (over the whole flat buffer).
  void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                        const Tensor& grads, const AdafactorTable& table, const GradTransform& g,
                        const AdafactorArgs& a);

 protected:
  // The implementations: called only after the contract holds (Note [backend contract]).
  virtual void upload_impl(const Tensor& dst, const void* host) = 0;
  virtual int upload_async_impl(const Tensor& dst, const void* host) {
    upload_impl(dst, host);
    return 0;
  }
  virtual void download_impl(void* host, const Tensor& src) = 0;
  virtual int download_async_impl(void* host, const Tensor& src) {
    download_impl(host, src);
    return 0;
  }
  virtual void copy_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void cast_impl(const Tensor& dst, const Tensor& src) = 0;
  virtual void fill_impl(const Tensor& dst, float value) = 0;
  virtual void matmul_impl(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                           const MatmulArgs& args) = 0;
  virtual void fp8_scale_update_impl(const Tensor& meta) = 0;
  virtual void bias_grad_impl(const Tensor& db, const Tensor& dy) = 0;
  virtual void attention_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask,
                                      int heads, const DropoutSpec& dropout, AttentionScope scope) = 0;
  virtual void attention_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                       const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout,
                                       AttentionScope scope, const Tensor& dbias) = 0;
  virtual void attention_packed_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv,
                                             const Tensor& offsets, int heads, const DropoutSpec& dropout,
                                             AttentionScope scope) = 0;
  virtual void attention_packed_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                                              const Tensor& ctx, const Tensor& lse, const Tensor& offsets, int heads,
                                              const DropoutSpec& dropout, AttentionScope scope, const Tensor& dbias) = 0;
  virtual void rotary_forward_impl(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows) = 0;
  virtual void rotary_backward_impl(const Tensor& dx, const Tensor& dy, int heads, float theta,
                                    const Tensor& rows) = 0;
  virtual void layernorm_forward_impl(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                                      const Tensor& beta, float eps, const DropoutSpec& branch_dropout) = 0;
  virtual void layernorm_backward_impl(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                                       const Tensor& dbeta, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                                       const Tensor& gamma, const Tensor& beta, const DropoutSpec& branch_dropout,
                                       const Tensor& dbias) = 0;
  virtual void cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                  const Tensor& labels, float grad_scale) = 0;
  virtual void mse_loss_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                             float grad_scale) = 0;
  virtual void token_cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                        const Tensor& labels, float loss_weight, float grad_scale) = 0;
  virtual void bce_with_logits_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) = 0;
  virtual void gelu_forward_impl(const Tensor& y, const Tensor& x) = 0;
  virtual void gelu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias) = 0;
  virtual void geglu_forward_impl(const Tensor& y, const Tensor& x) = 0;
  virtual void geglu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x) = 0;
  virtual void tanh_forward_impl(const Tensor& y, const Tensor& x) = 0;
  virtual void tanh_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) = 0;
  virtual void relu_forward_impl(const Tensor& y, const Tensor& x) = 0;
  virtual void relu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) = 0;
  virtual void dropout_forward_impl(const Tensor& y, const Tensor& x, const DropoutSpec& d) = 0;
  virtual void dropout_backward_impl(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) = 0;
  virtual void add_impl(const Tensor& y, const Tensor& a, const Tensor& b) = 0;
  virtual void embedding_forward_impl(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                                      const Tensor& pos, const Tensor& type) = 0;
  virtual void embedding_backward_impl(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                                       const Tensor& ids, const Tensor& type_ids) = 0;
  virtual void select_token_impl(const Tensor& out, const Tensor& x, int64_t t) = 0;
  virtual void select_token_backward_impl(const Tensor& dx, const Tensor& dout, int64_t t) = 0;
  virtual void masked_mean_forward_impl(const Tensor& out, const Tensor& x, const Tensor& mask) = 0;
  virtual void masked_mean_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& mask) = 0;
  virtual void gather_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) = 0;
  virtual void scatter_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) = 0;
  virtual void block_sum_squares_impl(const Tensor& partials, const Tensor& x) = 0;
  virtual void sum_blocks_impl(const Tensor& out, const Tensor& partials) = 0;
  virtual void adamw_update_impl(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                                 const Tensor& grads, const GradTransform& g, const AdamWArgs& a) = 0;
  virtual void sgd_update_impl(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                               const Tensor& grads, const GradTransform& g, const SgdArgs& a) = 0;
  virtual void adamw8bit_update_impl(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                                     const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                                     const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                                     const AdamWArgs& a) = 0;
  virtual void adafactor_update_impl(const Tensor& params, const Tensor& state, const Tensor& scratch,
                                     const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                                     const GradTransform& g, const AdafactorArgs& a) = 0;

  std::vector<std::chrono::steady_clock::time_point> m_host_marks;

 private:
  // Runs `run` bracketed by the observer's calls (the cost is computed only when one is set).
  template <class Cost, class Run>
  void observed(const char* name, Cost&& cost, Run&& run) {
    if (!m_observer) return run();
    const OpEvent e{name, m_phase, cost()};
    m_observer->before(*this, e);
    run();
    m_observer->after(*this, e);
  }

  Phase m_phase = Phase::Forward;
  OpObserver* m_observer = nullptr;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();
int cuda_device_count();  // 0 without a CUDA backend or device
// CUDA device `device`'s PCI bus id ("0000:1B:00.0"), by which NVML finds the same board whatever
// CUDA_VISIBLE_DEVICES renumbered; empty without a CUDA backend or that device.
std::string cuda_pci_bus_id(int device);
// Throws anatomy::Error when the build has no CUDA backend or no device is present.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);

}  // namespace anatomy
