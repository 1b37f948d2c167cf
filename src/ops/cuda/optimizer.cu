// Optimizer kernels over flat F32 buffers: the gradient norm (sum of squares) and one fused
// update launch per optimizer. The clipping factor is computed on the device from norm_sq, so
// a step needs no host synchronization.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;

// g = grad * inv_loss_scale * clip, clip = min(1, max_norm / (sqrt(norm_sq) * inv_loss_scale + 1e-6))
// (ops/backend.h GradTransform). inf/NaN norms give clip 0 or NaN: the step is poisoned, not hidden.
__device__ __forceinline__ float grad_factor(const float* norm_sq, float inv_loss_scale, float max_norm) {
  if (!norm_sq || max_norm <= 0.0f) return inv_loss_scale;
  const float norm = sqrtf(*norm_sq) * inv_loss_scale;
  return inv_loss_scale * fminf(1.0f, max_norm / (norm + 1e-6f));
}

// ---- kernels ------------------------------------------------------------------------------------
// out[0] += sum x^2: grid-stride (W-wide packs, then the tail), block reduction, one atomic per
// block. No filtering: an inf or NaN gradient makes the sum inf or NaN (the overflow check).
template <int W>
__global__ void sum_squares_kernel(float* __restrict__ out, const float* __restrict__ x, size_t n) {
  __shared__ float red[32];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t packs = n / W;
  float acc = 0.0f;
  for (size_t p = tid; p < packs; p += stride) {
    Pack<float, W> v = reinterpret_cast<const Pack<float, W>*>(x)[p];
#pragma unroll
    for (int j = 0; j < W; ++j) acc += v.v[j] * v.v[j];
  }
  for (size_t i = packs * W + tid; i < n; i += stride) acc += x[i] * x[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

struct AdamParams {
  float lr, beta1, beta2, eps, decay;  // decay = 1 - lr * weight_decay
  float step_size;                     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;                  // 1 / sqrt(1 - beta2^step)
};

// PyTorch AdamW: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= step_size * m / (sqrt(v) / sqrt(bc2) + eps); half[i] = p (when given).
template <class H, int W>
__global__ void adamw_kernel(float* __restrict__ params, float* __restrict__ m, float* __restrict__ v,
                             H* __restrict__ half, const float* __restrict__ grads, size_t n, GradFactor gf,
                             AdamParams a) {
  const float f = grad_factor(gf.norm_sq, gf.inv_loss_scale, gf.max_norm);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto update = [&](float& p, float& mi, float& vi, float g) {
    g *= f;
    p *= a.decay;
    mi = a.beta1 * mi + (1.0f - a.beta1) * g;
    vi = a.beta2 * vi + (1.0f - a.beta2) * g * g;
    p -= a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
  };
  const size_t packs = n / W;
  using F = Pack<float, W>;
  for (size_t q = tid; q < packs; q += stride) {
    F p = reinterpret_cast<F*>(params)[q], mm = reinterpret_cast<F*>(m)[q], vv = reinterpret_cast<F*>(v)[q];
    const F g = reinterpret_cast<const F*>(grads)[q];
#pragma unroll
    for (int j = 0; j < W; ++j) update(p.v[j], mm.v[j], vv.v[j], g.v[j]);
    reinterpret_cast<F*>(params)[q] = p;
    reinterpret_cast<F*>(m)[q] = mm;
    reinterpret_cast<F*>(v)[q] = vv;
    if (half) {
      Pack<H, W> h;
#pragma unroll
      for (int j = 0; j < W; ++j) h.v[j] = from_f32<H>(p.v[j]);
      reinterpret_cast<Pack<H, W>*>(half)[q] = h;
    }
  }
  for (size_t i = packs * W + tid; i < n; i += stride) {
    float p = params[i], mi = m[i], vi = v[i];
    update(p, mi, vi, grads[i]);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (half) half[i] = from_f32<H>(p);
  }
}

struct SgdParams {
  float lr, momentum, weight_decay;
  bool nesterov;
};

// PyTorch SGD (dampening 0): g = grad f + wd p; buf = mu buf + g; p -= lr (nesterov ? g + mu buf : buf);
// without momentum (buf == nullptr) p -= lr g.
template <class H>
__global__ void sgd_kernel(float* __restrict__ params, float* __restrict__ buf, H* __restrict__ half,
                           const float* __restrict__ grads, size_t n, GradFactor gf, SgdParams a) {
  const float f = grad_factor(gf.norm_sq, gf.inv_loss_scale, gf.max_norm);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = params[i];
    float g = grads[i] * f + a.weight_decay * p;
    if (buf) {
      const float b = a.momentum * buf[i] + g;
      buf[i] = b;
      g = a.nesterov ? g + a.momentum * b : b;
    }
    p -= a.lr * g;
    params[i] = p;
    if (half) half[i] = from_f32<H>(p);
  }
}

// Calls f(TypeTag<H>{}) for the half copy's dtype (float with a null pointer when undefined).
template <class F>
void dispatch_half(const Tensor& half_copy, F&& f) {
  if (!half_copy.defined())
    f(TypeTag<float>{});
  else
    dispatch_float(half_copy.dtype, "optimizer half_copy", f);
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void sum_squares(const Tensor& out, const Tensor& x, cudaStream_t s) {
  const size_t n = x.numel();
  if (n == 0) return;
  if (aligned16(x.data))
    sum_squares_kernel<4><<<grid_for(n / 4 + 1, kThreads, 4), kThreads, 0, s>>>(out.ptr<float>(), x.ptr<const float>(), n);
  else
    sum_squares_kernel<1><<<grid_for(n, kThreads, 4), kThreads, 0, s>>>(out.ptr<float>(), x.ptr<const float>(), n);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                  const Tensor& grads, const GradFactor& g, const AdamWArgs& a, cudaStream_t s) {
  const size_t n = params.numel();
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
  const AdamParams ap{a.lr,
                      a.beta1,
                      a.beta2,
                      a.eps,
                      static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay),
                      static_cast<float>(a.lr / bc1),
                      static_cast<float>(1.0 / std::sqrt(bc2))};
  dispatch_half(half_copy, [&](auto tag) {
    using H = typename decltype(tag)::type;
    H* hp = half_copy.defined() ? half_copy.ptr<H>() : nullptr;
    const bool vec = aligned16(params.data) && aligned16(m.data) && aligned16(v.data) && aligned16(grads.data) &&
                     (!hp || aligned16(hp));
    if (vec)
      adamw_kernel<H, 4><<<grid_for(n / 4 + 1, kThreads, 4), kThreads, 0, s>>>(
          params.ptr<float>(), m.ptr<float>(), v.ptr<float>(), hp, grads.ptr<const float>(), n, g, ap);
    else
      adamw_kernel<H, 1><<<grid_for(n, kThreads, 4), kThreads, 0, s>>>(params.ptr<float>(), m.ptr<float>(),
                                                                       v.ptr<float>(), hp, grads.ptr<const float>(),
                                                                       n, g, ap);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                const GradFactor& g, const SgdArgs& a, cudaStream_t s) {
  const size_t n = params.numel();
  if (n == 0) return;
  float* buf = a.momentum != 0.0f ? momentum.ptr<float>() : nullptr;
  const SgdParams sp{a.lr, a.momentum, a.weight_decay, a.nesterov};
  dispatch_half(half_copy, [&](auto tag) {
    using H = typename decltype(tag)::type;
    H* hp = half_copy.defined() ? half_copy.ptr<H>() : nullptr;
    sgd_kernel<H><<<grid_for(n, kThreads, 4), kThreads, 0, s>>>(params.ptr<float>(), buf, hp, grads.ptr<const float>(),
                                                                n, g, sp);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
