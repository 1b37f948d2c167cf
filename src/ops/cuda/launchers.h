// Host-callable launchers of the CUDA kernels, one section per kernel file. Each takes outputs
// first, then inputs, then options, then the stream, checks its launch, and assumes the backend
// contract (ops/contract.cpp) has validated devices, dtypes and shapes. Float tensors may be F32,
// BF16 or F16 (the compute dtype) unless a comment says F32; ids, labels and masks are I32.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/tensor.h"
#include "ops/op_args.h"

namespace anatomy::cuda {

// F32 scratch for two-stage (deterministic) column reductions: per-block partial sums are
// written here, then summed in a fixed order.
struct ReduceScratch {
  float* data = nullptr;
  size_t floats = 0;
};

// ---- rotary.cu (ModernBERT) --------------------------------------------------------------------
// rows (optional, I32 [N]): the packed layout of Backend::rotary_forward.
void rotary(const Tensor& y, const Tensor& x, int heads, float theta, bool inverse, const Tensor& rows,
            cudaStream_t s);
void geglu_forward(const Tensor& y, const Tensor& x, cudaStream_t s);
void geglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, cudaStream_t s);

// ---- fp8.cu (Note [fp8 training] in core/fp8.h) -------------------------------------------------
// dst [rows, ld] bytes (ld a multiple of 16, >= k; columns k.. zero) = fp8(x * meta's scale) of
// src seen as [rows, k] (transposed false: src is [rows, k]) or its transpose (src is [k, rows]);
// meta's amax raised to max |x|. meta: one F32 row of kFp8MetaWidth.
void fp8_quantize(uint8_t* dst, int64_t ld, const Tensor& src, int64_t rows, int64_t k, bool transposed,
                  float* meta, Fp8Format format, cudaStream_t s);
void fp8_scale_update(float* meta, int64_t rows, cudaStream_t s);

// ---- elementwise.cu ---------------------------------------------------------------------------
void gelu_forward(const Tensor& y, const Tensor& x, cudaStream_t s);
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, cudaStream_t s);
void tanh_forward(const Tensor& y, const Tensor& x, cudaStream_t s);
void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, cudaStream_t s);
void relu_forward(const Tensor& y, const Tensor& x, cudaStream_t s);
void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y, cudaStream_t s);
void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d, cudaStream_t s);
void add(const Tensor& y, const Tensor& a, const Tensor& b, cudaStream_t s);
void cast(const Tensor& dst, const Tensor& src, cudaStream_t s);  // any pair of F32/BF16/F16
void fill(const Tensor& dst, float value, cudaStream_t s);        // float dtypes and I32
// out [B, H] = x [B, T, H][:, t, :]; backward writes all of dx [B, T, H].
void select_token(const Tensor& out, const Tensor& x, int64_t t, cudaStream_t s);
void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t, cudaStream_t s);

// ---- pool.cu ------------------------------------------------------------------------------------
// Mean pooling over the mask (Backend::masked_mean_forward): out [B, H] from x [B, T, H];
// backward writes all of dx [B, T, H] from dout [B, H]. mask I32 [B, T] may be undefined.
void masked_mean_forward(const Tensor& out, const Tensor& x, const Tensor& mask, cudaStream_t s);
void masked_mean_backward(const Tensor& dx, const Tensor& dout, const Tensor& mask, cudaStream_t s);

// ---- rows.cu ------------------------------------------------------------------------------------
// Any dtype (the same on both sides), idx I32 [N]: gather out [N, C] <- in [R, C] rows idx;
// scatter out [R, C] rows idx <- in [N, C]. Rows named outside [0, R) are skipped.
void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx, cudaStream_t s);
void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx, cudaStream_t s);

// ---- reduce.cu ----------------------------------------------------------------------------------
// db F32 [N] += column sums of dy [M, N].
void bias_grad(const Tensor& db, const Tensor& dy, const ReduceScratch& scratch, cudaStream_t s);
// dx = gelu_backward(dy, x) (elementwise.cu's) and db F32 [N] += the column sums of dx [M, N] as
// stored, in one pass where 16-byte packs fit (Note [column sums at bandwidth]). dx may alias dy.
void gelu_backward_bias(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& db,
                        const ReduceScratch& scratch, cudaStream_t s);
// partials F32 [groups, stride]: out_k[j] += sum_g partials[g, k n + j] for j < n and each
// output k of out0, out1, out2 (stride >= n times the outputs up to the last given), summed in a
// fixed order (the same every run: Note [column sums at bandwidth]), in one launch. Any output
// may be nullptr (skipped).
void reduce_partials(float* out0, float* out1, float* out2, const float* partials, int groups, int64_t n,
                     int64_t stride, cudaStream_t s);

// ---- layernorm.cu -------------------------------------------------------------------------------
// Rows of width H: sum = dropout(branch) + residual; y = LN(sum) * gamma + beta;
// mean, rstd F32 [rows]. residual and sum (then not stored) may be undefined.
void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                       const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                       const Tensor& beta, float eps, const DropoutSpec& d, cudaStream_t s);
// From the output y (xhat = (y - beta) / gamma): dsum; dbranch (may be undefined) =
// dropout_backward(dsum); dgamma, dbeta F32 [H] (+=, may be undefined); dbias F32 [H] (+=, may
// be undefined; needs dbranch) the column sums of dbranch as stored. Through two-stage
// reductions in `scratch` (needs at least 3H floats with dbias, else 2H).
void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                        const Tensor& dbeta, const Tensor& dbias, const Tensor& dy, const Tensor& y,
                        const Tensor& rstd, const Tensor& gamma, const Tensor& beta, const DropoutSpec& d,
                        const ReduceScratch& scratch, cudaStream_t s);

// ---- loss.cu ------------------------------------------------------------------------------------
// logits [B, C], labels I32 [B]; losses F32 [B]; dlogits [B, C] (may be undefined). A label
// outside [0, C) yields NaN loss and NaN gradients for its row (the CPU twin throws).
void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                   const Tensor& labels, float grad_scale, cudaStream_t s);
// Per-token cross-entropy (Backend::token_cross_entropy): logits [R, V], labels I32 [R] (-100:
// not scored), losses F32 [B] with R / B rows per sequence. A scored label outside [0, V) yields
// NaN for its sequence's loss and its row's gradients (the CPU twin throws).
void token_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                         float loss_weight, float grad_scale, cudaStream_t s);
// The float-target losses (Note [float target losses] in ops/cpu/loss.cpp): targets F32 [B, C];
// binary false: squared error, true: binary cross-entropy with logits.
void float_target_loss(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                       float grad_scale, bool binary, cudaStream_t s);

// ---- embedding.cu -------------------------------------------------------------------------------
// e [B*T, H] = word[ids] + pos[t] + type[type_ids]; type_ids may be undefined (all 0). An id out
// of range gives a NaN row (the CPU twin throws; a kernel cannot).
void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                       const Tensor& pos, const Tensor& type, cudaStream_t s);
// F32 tables' gradients (+=, each may be undefined) from de [B*T, H].
void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                        const Tensor& ids, const Tensor& type_ids, const ReduceScratch& scratch,
                        cudaStream_t s);

// ---- optimizer.cu -------------------------------------------------------------------------------
// out F32 [1] += sum x^2, x F32. inf/NaN in x propagate into out (the overflow check relies on it).
void block_sum_squares(const Tensor& partials, const Tensor& x, cudaStream_t s);
void sum_blocks(const Tensor& out, const Tensor& partials, cudaStream_t s);
// g = grads * inv_loss_scale * clip with clip read from norm_sq on the device (nullptr or
// max_norm <= 0: no clipping). See GradTransform in ops/op_args.h.
struct GradFactor {
  const float* norm_sq = nullptr;
  float inv_loss_scale = 1.0f;
  float max_norm = 0.0f;
  bool skip_nonfinite = false;  // GradTransform::skip_nonfinite (norm_sq then non-null)
};
void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                  const Tensor& grads, const GradFactor& g, const AdamWArgs& a, cudaStream_t s);
void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                const Tensor& grads, const GradFactor& g, const SgdArgs& a, cudaStream_t s);
// Block-wise 8-bit AdamW (Backend::adamw8bit_update): one block of kQuantBlock threads per
// quantization block; codes U8, absmax F32 [ceil(n / kQuantBlock)], qmap F32 [512].
void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                      const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                      const GradFactor& g, const AdamWArgs& a, cudaStream_t s);
// Adafactor over every segment of the (device-resident) table: four launches in all.
void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                      const Tensor& grads, const AdafactorTable& t, const GradFactor& g, const AdafactorArgs& a,
                      cudaStream_t s);

// ---- matmul_fallback.cu -------------------------------------------------------------------------
// The same contract as Backend::matmul for shapes or dtype combinations cuBLASLt has no
// algorithm for (a simple tiled kernel, fp32 accumulation). m, n, k as in the contract.
void matmul_fallback(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m,
                     int64_t n, int64_t k, const MatmulArgs& args, cudaStream_t s);

}  // namespace anatomy::cuda
