// The per-element math of the 8-bit AdamW update, shared by the CPU reference (ops/cpu) and
// the CUDA kernel (ops/cuda) so both run the same operations in the same order: with T = float
// they produce bit-identical parameters and codes for identical inputs.
//
// On the device every float operation goes through a correctly rounded intrinsic that nvcc
// never contracts into an FMA (it fuses a*b + c by default); sqrt and division are the
// IEEE-exact ones. On the host the same operations are plain IEEE float operations (the build
// does not target FMA hardware, so nothing is contracted there either).
#pragma once
#include <cmath>
#include <cstdint>

#include "ops/backend.h"

#if defined(__CUDACC__)
#define ANATOMY_HD __host__ __device__ __forceinline__
#else
#define ANATOMY_HD inline
#endif

namespace anatomy::om {

ANATOMY_HD float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ANATOMY_HD float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ANATOMY_HD float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ANATOMY_HD float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ANATOMY_HD float sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
ANATOMY_HD double mul(double a, double b) { return a * b; }
ANATOMY_HD double add(double a, double b) { return a + b; }
ANATOMY_HD double sub(double a, double b) { return a - b; }
ANATOMY_HD double div(double a, double b) { return a / b; }
ANATOMY_HD double sqrt(double a) {
#ifdef __CUDA_ARCH__
  return ::sqrt(a);
#else
  return std::sqrt(a);
#endif
}
// max ignoring NaN (as fmaxf), written out so both sides agree.
template <class T>
ANATOMY_HD T max_ignore_nan(T a, T b) {
  return (a != a || b > a) ? b : a;
}

// The factor applied to raw gradients (GradTransform in ops/backend.h), in T:
// inv_loss_scale * min(1, max_norm / (sqrt(norm_sq) * inv_loss_scale + 1e-6)); clip false:
// inv_loss_scale.
template <class T>
ANATOMY_HD T grad_factor(T norm_sq, bool clip, T inv_loss_scale, T max_norm) {
  if (!clip) return inv_loss_scale;
  const T c = div(max_norm, add(mul(sqrt(norm_sq), inv_loss_scale), T(1e-6)));
  return mul(inv_loss_scale, c < T(1) ? c : T(1));
}

// Quantization against a sorted 256-entry map, in three exact steps (so a caller may batch the
// search, as the CPU reference does, and still get the same codes):
// the normalized value, the number of entries below it (a branch-free binary search), and the
// nearest entry (ties to the lower index).
template <class T>
ANATOMY_HD T normalized(T x, T absmax) {
  return absmax > T(0) ? div(x, absmax) : T(0);  // a zero (or NaN) scale: everything is 0
}
template <class T>
ANATOMY_HD int count_below(const float* map, T x) {
  int i = 0;
  for (int step = 128; step > 0; step >>= 1) i += static_cast<int>(static_cast<T>(map[i + step - 1]) < x) * step;
  return i;
}
// `positive_nonzero`: a positive value never gets the code of 0 (the v map, so a second moment
// never collapses to zero under a nonzero first moment).
template <class T>
ANATOMY_HD uint8_t code_of(const float* map, T xn, int below, bool positive_nonzero) {
  // Branch-free: the two candidates collapse to one entry at either end of the map.
  const int hi = below < 256 ? below : 255, lo = below > 0 ? below - 1 : 0;
  const T d_lo = sub(xn, static_cast<T>(map[lo])), d_hi = sub(static_cast<T>(map[hi]), xn);
  int c = hi - static_cast<int>(d_lo <= d_hi) * (hi - lo);
  c += static_cast<int>(positive_nonzero && c == 0 && xn > T(0));
  return static_cast<uint8_t>(c);
}
// Index of the map entry nearest to x.
template <class T>
ANATOMY_HD int nearest_code(const float* map, T x) {
  return code_of(map, x, count_below(map, x), false);
}

// AdamW constants of one step, computed on the host in double and rounded to T once.
template <class T>
struct AdamConsts {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  T decay;        // 1 - lr * weight_decay
  T step_size;    // lr / (1 - beta1^step)
  T sqrt_bc2;     // sqrt(1 - beta2^step)
};
template <class T>
inline AdamConsts<T> adam_consts(const AdamWArgs& a) {
  const double b1 = a.beta1, b2 = a.beta2, step = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
  return {static_cast<T>(b1),
          static_cast<T>(1.0 - b1),
          static_cast<T>(b2),
          static_cast<T>(1.0 - b2),
          static_cast<T>(a.eps),
          static_cast<T>(1.0 - static_cast<double>(a.lr) * a.weight_decay),
          static_cast<T>(a.lr / bc1),
          static_cast<T>(std::sqrt(bc2))};
}

// PyTorch AdamW on one element, moments updated in place, the new parameter returned:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g; p = p (1 - lr wd) - step_size m / (sqrt(v)/sqrt(bc2) + eps).
template <class T>
ANATOMY_HD T adam_element(T p, T& m, T& v, T g, const AdamConsts<T>& c) {
  m = add(mul(c.beta1, m), mul(c.one_minus_beta1, g));
  v = add(mul(c.beta2, v), mul(c.one_minus_beta2, mul(g, g)));
  const T denom = add(div(sqrt(v), c.sqrt_bc2), c.eps);
  return sub(mul(p, c.decay), mul(c.step_size, div(m, denom)));
}

// Code of x in a block with the given absmax (see code_of).
template <class T>
ANATOMY_HD uint8_t quantize(const float* map, T x, T absmax, bool positive_nonzero) {
  const T xn = normalized(x, absmax);
  return code_of(map, xn, count_below(map, xn), positive_nonzero);
}
template <class T>
ANATOMY_HD T dequantize(const float* map, uint8_t code, T absmax) {
  return mul(static_cast<T>(map[code]), absmax);
}

}  // namespace anatomy::om
