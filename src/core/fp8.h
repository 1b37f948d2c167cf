// The two 8-bit float formats of --precision fp8 and their per-tensor scaling state.
//
// Note [fp8 training]
// With --precision fp8 the encoder layers' four Linear layers (q|k|v, attention output, FFN in
// and out) multiply in fp8, in the style of NVIDIA's Transformer Engine "hybrid" recipe: inputs
// and weights in E4M3 (4 exponent bits, 3 mantissa bits, largest 448), output gradients in E5M2
// (5 and 2, largest 57344), or in E4M3 too with --fp8-format e4m3 (the recipe's "E4M3" format;
// ModelShape::fp8_grads); products accumulate in F32 (the forward in the tensor cores' fast
// mode) and the results come out in bf16. So the forward (x W^T) and the data gradient (dY W)
// run in fp8; the weight gradients (dY^T X) stay in bf16: their operands would need transposed
// fp8 copies (cuBLASLt's fp8 GEMMs on Hopper take K-major operands only), and with this
// engine's transposing quantizer they measured 4.6x slower than bf16 (bert-large batch 32:
// 61.0 ms vs 13.2 ms a step, bench/results/2026-11-27-h200/session14-fp8/). Everything else
// stays as in bf16: activations are stored in bf16, master weights and the optimizer in F32,
// embeddings, LayerNorm, attention and the heads in bf16. Evaluation runs the bf16 forward.
// The backend's fp8 matmul still takes any operand layout (the transposing quantizer).
//
// Each tensor that enters an fp8 GEMM (site x role: input, weight, output gradient) has one
// meta row of kFp8MetaWidth F32 values (Fp8Meta below): it is quantized as
// q = round_to_format(x * scale), saturating at the format's largest value, and the GEMM scales
// its F32 sums by scale_inv_a * scale_inv_b. The scale is *delayed*: the quantizing kernel
// records max |x| of this step (amax, a max over micro-batches) and uses the scale computed
// from earlier steps; after each optimizer step fp8_scale_update sets
//   scale = 2^floor(log2(format_max / max(amax of this step and the kFp8History - 1 before)))
// (a power of two, so quantizing and unquantizing are exact rescalings and the CPU twin's
// quantize-then-multiply equals the GPU's multiply-then-rescale), and shifts the history.
// Rows whose history holds no finite positive amax keep their scale. The first step runs at
// scale 1 (Transformer Engine's start as well): gradients below E5M2's smallest subnormal
// (2^-16; E4M3's, 2^-9, with --fp8-format e4m3, which loses most of them) are lost in that step
// only. Scaling state is per process (not reduced across
// data-parallel ranks: each rank scales its own activations and gradients) and is not saved in
// checkpoints (a resumed run starts again from scale 1).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/rng.h"  // ANATOMY_HD

namespace anatomy {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

ANATOMY_HD float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

// Amax history length, this step's included (Transformer Engine's default is 1024).
inline constexpr int kFp8History = 1024;
// One meta row: [scale_inv, scale, format max, amax of this step, amax of the earlier steps...,
// padding]. Rows are 64 floats wide multiples, so each row's scale_inv (the pointer the GEMM
// reads) is 256-byte aligned: cuBLASLt refuses to launch fp8 GEMMs on misaligned scale
// pointers (measured: CUBLAS_STATUS_NOT_SUPPORTED at the launch, after its heuristic accepted).
struct Fp8Meta {
  static constexpr int kScaleInv = 0, kScale = 1, kFormatMax = 2, kAmax = 3;
  static constexpr int kWidth = (kAmax + kFp8History + 63) / 64 * 64;
};
inline constexpr int kFp8MetaWidth = Fp8Meta::kWidth;

// A fresh scaling row: `scale`, its inverse, the format's max, no amax recorded.
inline void fp8_meta_init(float* row, float scale, Fp8Format f) {
  std::fill(row, row + kFp8MetaWidth, 0.0f);
  row[Fp8Meta::kScale] = scale;
  row[Fp8Meta::kScaleInv] = 1.0f / scale;
  row[Fp8Meta::kFormatMax] = fp8_max(f);
}

// The delayed scale for amax (the history's max): a power of two with amax * scale <= max.
// Returns `old` when amax is not a finite positive number.
ANATOMY_HD float fp8_scale_for(float amax, float format_max, float old) {
  if (!(amax > 0.0f) || !(amax <= 3.0e38f)) return old;
  const float e = floorf(log2f(format_max / amax));
  return exp2f(fminf(fmaxf(e, -126.0f), 126.0f));
}

// ---- host rounding (the CPU twin, and the tests' reference for the GPU's conversion) ----------
namespace fp8_detail {
struct Fmt {
  int mant, bias;
};
inline Fmt fmt_of(Fp8Format f) { return f == Fp8Format::E4M3 ? Fmt{3, 7} : Fmt{2, 15}; }
}  // namespace fp8_detail

// x rounded to the nearest value of the format (ties to even), saturated to +-max; NaN stays NaN.
inline float fp8_round(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const fp8_detail::Fmt m = fp8_detail::fmt_of(f);
  const float a = std::fabs(x), max = fp8_max(f);
  if (a >= max) return std::copysign(max, x);
  if (a == 0.0f) return x;
  int e = 0;
  std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1): the leading bit is 2^(e-1)
  const int lead = std::max(e - 1, 1 - m.bias);  // subnormals share the smallest normal's quantum
  const float quantum = std::ldexp(1.0f, lead - m.mant);
  const float r = std::nearbyint(a / quantum) * quantum;  // the default rounding: to nearest, ties even
  return std::copysign(std::fmin(r, max), x);
}

// The format's bit pattern of a value fp8_round returned (sign, exponent, mantissa).
inline uint8_t fp8_encode(float v, Fp8Format f) {
  const fp8_detail::Fmt m = fp8_detail::fmt_of(f);
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  if (std::isnan(v)) return 0x7f;  // a NaN in both formats
  const float a = std::fabs(fp8_round(v, f));
  if (a == 0.0f) return sign;
  int e = 0;
  std::frexp(a, &e);
  int exp_field = e - 1 + m.bias;
  if (exp_field <= 0) {  // subnormal: a = mantissa * 2^(1 - bias - mant)
    const int mant = static_cast<int>(std::ldexp(a, m.bias - 1 + m.mant));
    return static_cast<uint8_t>(sign | mant);
  }
  const int mant = static_cast<int>(std::ldexp(a, -(e - 1) + m.mant)) - (1 << m.mant);
  return static_cast<uint8_t>(sign | exp_field << m.mant | mant);
}

inline float fp8_decode(uint8_t bits, Fp8Format f) {
  const fp8_detail::Fmt m = fp8_detail::fmt_of(f);
  const int exp_field = (bits & 0x7f) >> m.mant, mant = bits & ((1 << m.mant) - 1);
  const float a = exp_field == 0 ? std::ldexp(static_cast<float>(mant), 1 - m.bias - m.mant)
                                 : std::ldexp(static_cast<float>((1 << m.mant) + mant), exp_field - m.bias - m.mant);
  return bits & 0x80 ? -a : a;
}

}  // namespace anatomy
