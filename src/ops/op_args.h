// The arguments of the backend's ops (ops/backend.h): transposes, epilogues, dropout specs and
// the optimizers' settings. Kept apart from the Backend class so the CUDA kernels (which read
// these structs, not the class) do not recompile when the class changes.
#pragma once
#include <cstdint>

#include "core/fp8.h"
#include "core/tensor.h"

namespace anatomy {

enum class Trans : uint8_t { N, T };
// Note [fused bias gradient]: BiasGrad is the weight-gradient GEMM of a Linear layer with a bias,
// dW = dY^T X (ta = T), carrying db = column sums of dY = sum over K of op(A)'s rows. The bias
// gradient follows C: with beta 1 it is accumulated (db += ...), with beta 0 overwritten, so the
// call means what a GEMM with beta then bias_grad meant. cuBLASLt's BGRADB epilogue only writes
// its vector; the CUDA backend lets it write db directly when beta is 0 and otherwise into a
// scratch vector added to db afterwards ([M] floats: a few microseconds instead of reading dY
// again). Without a cuBLASLt kernel for the epilogue it runs the GEMM and the bias_grad kernel.
// Measured on the H100 (bench/results/2026-11-25-h100/session7-epilogue/), bf16, 16384 rows: the
// epilogue slows the GEMM by more than the separate reduction costs (bert-large's four Linear
// weight gradients: GEMM + bias_grad 0.077 / 0.196 / 0.231 / 0.181 ms, fused 0.083 / 0.203 /
// 0.255 / 0.191 ms; the step 83.3 -> 84.5 ms), so the CUDA backend runs it unfused by default
// (CudaBackend::set_fused_bias_grad); the op stays one call, and the model does not choose.
// Where another pass already writes dY, that pass sums it instead, at no extra read: the
// LayerNorm backward's dbias (the column sums of dbranch), gelu_backward's dbias (of dx) and the
// attention backward's dbias (of dqkv; Note [attention bias gradient] in ops/cuda/attention.cu).
// The BERT layer takes all four of its bias gradients so (H200, bf16 step: the first three 1.1 ms
// of 74.9 in session 18, q|k|v 0.4 ms more in session 19); BiasGrad stays for the heads.
enum class Epilogue : uint8_t { None, Bias, BiasGelu, BiasGrad };

struct DropoutSpec {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Note [attention scope]
// Which (query, key) pairs an attention call computes. window > 0: query i sees key j only when
// |i - j| <= window (ModernBERT's local layers; Note [local attention window] in
// ops/cpu/attention.cpp); 0: every key the mask keeps. queries > 0: the caller reads only the
// first `queries` queries of each sequence (a head on the first token reads query 0 of the last
// layer: Note [last layer on the first tokens] in model/bert.cpp); 0: every query. Then:
//   - the forward computes at least those queries; each later query of the sequence gets either
//     its value or a zero context and an lse of +inf (an implementation may round up to its
//     query tile: the CUDA wgmma kernels to 128 queries, the CPU twin computes exactly these);
//   - the backward needs dctx to be zero on the later queries and may skip them: their dq is
//     zero and they add nothing to dk and dv. With either forward result they add exactly zero
//     (a zero dctx gives dP = 0 and Dsum = 0, and an lse of +inf gives P = 0), so any forward and
//     backward kernels pair up.
struct AttentionScope {
  int window = 0;
  int queries = 0;
};

// One operand of an fp8 GEMM (Note [fp8 training] in core/fp8.h): its scaling row, F32
// [kFp8MetaWidth] on the op's device (read for the scale, its amax raised), and its format.
struct Fp8Operand {
  Tensor meta;
  Fp8Format format = Fp8Format::E4M3;
  bool defined() const { return meta.data != nullptr; }
};

struct MatmulArgs {
  // {alpha, beta, epilogue, bias, gelu_in}, as the call sites spell it; fp8 operands set apart.
  MatmulArgs(float alpha_ = 1.0f, float beta_ = 0.0f, Epilogue epilogue_ = Epilogue::None, Tensor bias_ = {},
             Tensor gelu_in_ = {})
      : alpha(alpha_), beta(beta_), epilogue(epilogue_), bias(bias_), gelu_in(gelu_in_) {}
  float alpha = 1.0f;
  float beta = 0.0f;  // C = alpha * op(A) op(B) + beta * C
  Epilogue epilogue = Epilogue::None;
  Tensor bias;     // [N], compute dtype; with Bias / BiasGelu. BiasGrad: F32 [M], the bias gradient
  Tensor gelu_in;  // [M, N], compute dtype; with BiasGelu: receives the pre-activation
  // Both defined: op(A) and op(B) are quantized to fp8 with these rows and multiplied in fp8
  // (Note [fp8 training]); the epilogue and C are as without them.
  Fp8Operand fp8_a, fp8_b;
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

}  // namespace anatomy
