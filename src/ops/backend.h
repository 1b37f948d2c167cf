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

namespace anatomy {

enum class Trans : uint8_t { N, T };
// Which part of a training step issues an op (set by the model and trainer; the profiler reads it).
enum class Phase : uint8_t { Forward, Backward, Optimizer, Data };
enum class Epilogue : uint8_t { None, Bias, BiasGelu };

struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

struct MatmulArgs {
  float alpha = 1.0f;
  float beta = 0.0f;  // C = alpha * op(A) op(B) + beta * C
  Epilogue epilogue = Epilogue::None;
  Tensor bias;     // [N], compute dtype; with Bias / BiasGelu
  Tensor gelu_in;  // [M, N], compute dtype; with BiasGelu: receives the pre-activation
};

struct AdamWArgs {
  float lr = 5e-5f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};

struct SgdArgs {
  float lr = 1e-2f, momentum = 0.9f, weight_decay = 0.0f;
  bool nesterov = false;
};

// Block-wise 8-bit AdamW (Note [8-bit AdamW] in optim/adamw8bit.h): the moments are U8 codes
// into a 256-entry quantization map, with one F32 absmax per block of kQuantBlock values.
inline constexpr int64_t kQuantBlock = 256;

// Adafactor with an explicit learning rate (Hugging Face: scale_parameter=False,
// relative_step=False, warmup_init=False, beta1=None).
struct AdafactorArgs {
  float lr = 1e-3f, weight_decay = 0.0f;
  float decay_rate = -0.8f;      // beta2_t = 1 - step^decay_rate
  float eps1 = 1e-30f;           // added to g^2 in the second-moment statistics
  float clip_threshold = 1.0f;   // the update is divided by max(1, RMS(update) / clip_threshold)
  int64_t step = 1;              // 1-based
};

// One parameter of the flat buffer as Adafactor sees it (all fields in elements; built by
// adafactor_table in optim/adafactor.h). Factored (2-D [rows, cols]): running row means of
// g^2 + eps1 at state[row_state, +rows) and column means at state[col_state, +cols).
// Unfactored (1-D): rows == 1, cols == numel, the full second moment at state[row_state, +cols).
// The last five fields are the CUDA kernels' work decomposition (the CPU reference ignores
// them): F32 scratch at scratch[scratch, ...) (factored: per-row sums [rows] then 2 scalars;
// unfactored: per-chunk partial sums [chunks] then 2 scalars); the segment covers `chunks`
// chunks of `chunk` rows (factored) or `chunk` elements (unfactored) starting at chunk index
// chunk_begin over all segments, and ceil(cols / 32) column strips from strip_begin (factored).
struct AdafactorSegment {
  int64_t offset = 0, rows = 0, cols = 0;
  int64_t factored = 0, decay = 0;
  int64_t row_state = 0, col_state = -1;
  int64_t scratch = 0, chunk = 0, chunks = 0, chunk_begin = 0, strip_begin = 0;
};
inline constexpr int64_t kAdafactorSegmentFields = 12;
static_assert(sizeof(AdafactorSegment) == kAdafactorSegmentFields * sizeof(int64_t));

// The segment table on the backend's device (I64 [count, kAdafactorSegmentFields], the
// AdafactorSegment array) with the totals the host needs to size the launches.
struct AdafactorTable {
  Tensor segments;
  int64_t count = 0, chunks = 0, strips = 0;
};

// How the optimizer turns raw accumulated gradients into the gradient it applies:
// g = grad * inv_loss_scale * clip, clip = min(1, max_norm / (||grad * inv_loss_scale|| + 1e-6)).
// norm_sq is an F32 [1] tensor on the backend's device holding sum(grad^2) (unscaled),
// so the update needs no host synchronization. max_norm <= 0 disables clipping.
// skip_nonfinite (fp16 overflow): the update reads norm_sq on the device and, when it is inf
// or NaN, leaves params, optimizer state and the half copy untouched (norm_sq must then be
// defined whatever max_norm says); the decision needs no host synchronization either.
// Elements per partial sum of the gradient norm; ZeRO's shard boundaries are multiples of it.
inline constexpr int64_t kNormBlock = 4096;

struct GradTransform {
  Tensor norm_sq;
  float inv_loss_scale = 1.0f;
  float max_norm = 1.0f;
  bool skip_nonfinite = false;
};

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
  virtual void set_phase(Phase) {}

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
  virtual void upload(const Tensor& dst, const void* host) = 0;    // host bytes -> dst
  // Note [asynchronous uploads]: the trainer's batches go through page-locked staging memory
  // (host_alloc) and upload_async, which enqueues the copy in stream order and returns at once;
  // the staging block may be rewritten only after wait_upload(token) returns. So a step never
  // waits for the device between micro-batches. The CPU copies synchronously (token 0).
  virtual void* host_alloc(size_t bytes) { return ::operator new(bytes); }
  virtual void host_free(void* p) { ::operator delete(p); }
  virtual int upload_async(const Tensor& dst, const void* host) {
    upload(dst, host);
    return 0;
  }
  virtual void wait_upload(int /*token*/) {}
  virtual void download(void* host, const Tensor& src) = 0;        // src -> host bytes
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;     // same dtype and size
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;     // between float dtypes
  virtual void fill(const Tensor& dst, float value) = 0;

  // ---- tensor contractions -------------------------------------------------------------
  // C[M,N] = alpha * op(A) op(B) + beta * C (+ bias, GELU per args.epilogue).
  // A, B in the compute dtype; C in the compute dtype or F32 (parameter gradients).
  virtual void matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                      const MatmulArgs& args) = 0;
  // db[N] += sum over rows of dy[M, N].
  virtual void bias_grad(const Tensor& db, const Tensor& dy) = 0;

  // ---- attention -----------------------------------------------------------------------
  // qkv [B, T, 3H] with per token [q | k | v], head h at columns [h*D, (h+1)*D) of each.
  // ctx [B, T, H]; lse F32 [B, heads, T] = log-sum-exp of the scaled, masked scores.
  // scale = 1/sqrt(D). Dropout (on the probabilities) with element index
  // attention_dropout_index(b*heads + h, q, k, T) (Note [attention dropout index] in core/rng.h).
  virtual void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv,
                                 const Tensor& mask, int heads, const DropoutSpec& dropout) = 0;
  virtual void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                                  const Tensor& ctx, const Tensor& lse, const Tensor& mask,
                                  int heads, const DropoutSpec& dropout) = 0;

  // ---- statistical normalizations ------------------------------------------------------
  // sum = dropout(branch) + residual (residual may be undefined: then sum = dropout(branch));
  // y = (sum - mean) * rstd * gamma + beta over the last dim. mean, rstd F32 [rows].
  // gamma, beta in the compute dtype. sum may be undefined (then it is not stored).
  virtual void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& branch, const Tensor& residual,
                                 const Tensor& gamma, const Tensor& beta, float eps,
                                 const DropoutSpec& branch_dropout) = 0;
  // From forward's output y and rstd (Note [layernorm backward from its output] in
  // ops/cpu/layernorm.cpp): dsum = dL/dsum; dbranch (if defined) = dropout_backward(dsum);
  // dgamma, dbeta F32 (+=).
  virtual void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                                  const Tensor& dbeta, const Tensor& dy, const Tensor& y,
                                  const Tensor& rstd, const Tensor& gamma, const Tensor& beta,
                                  const DropoutSpec& branch_dropout) = 0;
  // Cross-entropy over logits [B, C] with I32 labels [B]: losses F32 [B] (per sample);
  // dlogits = (softmax - onehot) * grad_scale (grad_scale = loss_scale / total batch).
  virtual void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                             const Tensor& labels, float grad_scale) = 0;

  // ---- element-wise --------------------------------------------------------------------
  virtual void gelu_forward(const Tensor& y, const Tensor& x) = 0;  // exact erf GELU
  virtual void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) = 0;
  virtual void tanh_forward(const Tensor& y, const Tensor& x) = 0;
  virtual void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) = 0;
  // y = max(x, 0); dx = dy where y > 0, else 0 (from the output, as tanh; in place allowed).
  virtual void relu_forward(const Tensor& y, const Tensor& x) = 0;
  virtual void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) = 0;
  virtual void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) = 0;
  virtual void dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) = 0;
  // y = a + b (same shape and dtype).
  virtual void add(const Tensor& y, const Tensor& a, const Tensor& b) = 0;
  // e[B*T, H] = word[ids] + pos[t] + type[type_ids]; ids, type_ids I32 [B, T].
  virtual void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids,
                                 const Tensor& word, const Tensor& pos, const Tensor& type) = 0;
  // F32 gradients (+=) from de [B*T, H].
  virtual void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype,
                                  const Tensor& de, const Tensor& ids, const Tensor& type_ids) = 0;
  // out[B, H] = x[B, T, H][:, t, :]; backward writes dx[:, t, :] = dout and zeroes the rest.
  virtual void select_token(const Tensor& out, const Tensor& x, int64_t t) = 0;
  virtual void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) = 0;
  // Row copies between a padded [R, C] layout and a packed [N, C] one (Note [packed inference]
  // in model/bert.cpp); any dtype, the same on both sides; idx I32 [N] with values in [0, R)
  // (the CPU checks; a CUDA kernel skips a row out of range).
  // gather: out[i, :] = in[idx[i], :].
  virtual void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) = 0;
  // scatter: out[idx[i], :] = in[i, :]; rows of out that idx does not name are left as they are
  // (the caller zero-fills them when it needs zeros). idx must not repeat a row.
  virtual void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) = 0;

  // ---- optimizer -----------------------------------------------------------------------
  // The squared gradient norm in one canonical order (Note [canonical gradient norm] in
  // optim/grad_norm.h), in two ops:
  // partials F32 [ceil(n / kNormBlock)]: partials[k] = sum of x^2 over x[k*kNormBlock, (k+1)*kNormBlock),
  // each block in one fixed order whatever the threads (double on the CPU), rounded to F32.
  virtual void block_sum_squares(const Tensor& partials, const Tensor& x) = 0;
  // out F32 [1] = sum of partials F32 [n], in one fixed order (double accumulation).
  virtual void sum_blocks(const Tensor& out, const Tensor& partials) = 0;
  // In place on F32 params/grads/moments of equal size; half_copy (if defined) receives
  // the updated params in its dtype (the compute copy in mixed precision).
  virtual void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v,
                            const Tensor& half_copy, const Tensor& grads, const GradTransform& g,
                            const AdamWArgs& a) = 0;
  virtual void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                          const Tensor& grads, const GradTransform& g, const SgdArgs& a) = 0;
  // Block-wise 8-bit AdamW (Note [8-bit AdamW] in optim/adamw8bit.h) over F32 params and
  // grads [n]: m_codes, v_codes U8 [n] and m_absmax, v_absmax F32 [ceil(n / kQuantBlock)] are
  // dequantized, updated in fp32 with the AdamW math of adamw_update, and re-quantized in
  // place. qmap F32 [512]: the signed map of m (entries 0..255) then the unsigned map of v,
  // each sorted ascending. half_copy as in adamw_update.
  virtual void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                                const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                                const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                                const AdamWArgs& a) = 0;
  // Adafactor over whole flat F32 params and grads: every parameter of `table` is updated in
  // place (weight decay where its segment says so); state F32 holds the second-moment
  // statistics, scratch F32 the kernels' reductions (AdafactorSegment). half_copy as in
  // adamw_update (over the whole flat buffer).
  virtual void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch,
                                const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                                const GradTransform& g, const AdafactorArgs& a) = 0;

 protected:
  std::vector<std::chrono::steady_clock::time_point> m_host_marks;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// True when this build has the CUDA backend and a CUDA device is present.
bool cuda_available();
int cuda_device_count();  // 0 without a CUDA backend or device
// Throws anatomy::Error when the build has no CUDA backend or no device is present.
std::unique_ptr<Backend> make_cuda_backend(int device_index = 0);

}  // namespace anatomy
