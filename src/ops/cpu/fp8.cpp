// The CPU twin of the fp8 GEMM's operands and of the delayed scaling (Note [fp8 training] in
// core/fp8.h): quantizing to the format and back, so the F32 GEMM that follows multiplies the
// values the GPU's fp8 GEMM multiplies (the scales are powers of two: exact rescalings).
#include <algorithm>
#include <cmath>

#include "ops/cpu/reference.h"

namespace anatomy::ref {

void fp8_quantize(float* out, const float* in, int64_t n, float* meta, Fp8Format format) {
  const float scale = meta[Fp8Meta::kScale], inv = meta[Fp8Meta::kScaleInv];
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(in[i]);
    amax = std::max(amax, std::fabs(in[i]));
    out[i] = fp8_round(in[i] * scale, format) * inv;
  }
  // A NaN input leaves a NaN amax, as the GPU's max over the bits does; the update skips it.
  meta[Fp8Meta::kAmax] = nan ? std::nanf("") : std::max(meta[Fp8Meta::kAmax], amax);
}

void fp8_scale_update(float* meta, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* m = meta + r * kFp8MetaWidth;
    float amax = 0.0f;
    for (int i = 0; i < kFp8History; ++i) {
      const float a = m[Fp8Meta::kAmax + i];
      if (std::isfinite(a)) amax = std::max(amax, a);
    }
    const float scale = fp8_scale_for(amax, m[Fp8Meta::kFormatMax], m[Fp8Meta::kScale]);
    m[Fp8Meta::kScale] = scale;
    m[Fp8Meta::kScaleInv] = 1.0f / scale;
    for (int i = kFp8History - 1; i > 0; --i) m[Fp8Meta::kAmax + i] = m[Fp8Meta::kAmax + i - 1];
    m[Fp8Meta::kAmax] = 0.0f;
  }
}

}  // namespace anatomy::ref
