// The exact (erf) GELU and its gradient on the device, for the kernels that apply them
// (elementwise.cu, reduce.cu's fused bias gradient, rotary.cu's GeGLU).
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

namespace anatomy::cuda {

// ---- the exact (erf) GELU: x Phi(x), its gradient Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2))
// Note [GELU in half precision]
// With fp32 storage Phi and phi come from erff and expf (transformers' formula to 1e-6). With
// bf16 / fp16 storage erf is Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, about fp32's own
// rounding of 1 + erf near 1) and one ex2 serves both erf and phi: ~18 instructions an element
// for the gradient instead of ~35 (erff selects between two coefficient sets, expf reduces its
// range), which made the GELU kernels instruction-bound (session20's ncu: 44 instructions an
// element, issue slots 74% busy). Over every finite bf16 input |x| < 1e4 the rounded results
// equal those of the erff formula except 3 of 35898 forward values (x = -3.14, -3.81, -4.41,
// where that formula's own 1 + erf cancels) and none of the gradient factors; fp16: 28 and 3
// (scripts/gelu_accuracy.py, an fp32 emulation of these steps); the GPU op twins and golden
// fixtures pass as before.
struct GeluParts {
  float cdf, pdf;  // Phi(x), phi(x)
};
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
template <class T>
__device__ __forceinline__ GeluParts gelu_parts(float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f;
  if constexpr (std::is_same_v<T, float>) {
    return {0.5f * (1.0f + erff(x * kInvSqrt2)), kInvSqrt2Pi * expf(-0.5f * x * x)};
  } else {
    const float z = x * kInvSqrt2;
    const float t = rcp_approx(fmaf(0.3275911f, fabsf(z), 1.0f));
    float poly = fmaf(t, 1.061405429f, -1.453152027f);
    poly = fmaf(poly, t, 1.421413741f);
    poly = fmaf(poly, t, -0.284496736f);
    poly = fmaf(poly, t, 0.254829592f);
    poly *= t;
    const float e = ex2_approx(-(z * z) * 1.44269504088896340736f);  // exp(-z^2) = exp(-x^2 / 2)
    const float erf_abs = fmaf(-poly, e, 1.0f);
    return {fmaf(0.5f, copysignf(erf_abs, z), 0.5f), kInvSqrt2Pi * e};
  }
}
// T: the storage type the result is rounded to (Note [GELU in half precision]).
template <class T>
__device__ __forceinline__ float gelu_value(float x) {
  // fp32: rounded in the order it always was (x * cdf would differ in the last bit).
  if constexpr (std::is_same_v<T, float>) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  return x * gelu_parts<T>(x).cdf;
}
template <class T>
__device__ __forceinline__ float gelu_grad(float dy, float x) {
  const GeluParts g = gelu_parts<T>(x);
  return dy * fmaf(x, g.pdf, g.cdf);
}

}  // namespace anatomy::cuda
