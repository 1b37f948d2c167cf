// Optimizer kernels over flat F32 buffers: the gradient norm (sum of squares) and one fused
// update launch per optimizer. The clipping factor is computed on the device from norm_sq, so
// a step needs no host synchronization.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"
#include "ops/optim_math.h"

namespace anatomy::cuda {

namespace {

constexpr int kThreads = 256;

// g = grad * inv_loss_scale * clip, clip = min(1, max_norm / (sqrt(norm_sq) * inv_loss_scale + 1e-6))
// (ops/backend.h GradTransform). inf/NaN norms give clip 0 or NaN: the step is poisoned, not hidden
// (unless skip_nonfinite asks to skip it, skip_step below).
__device__ __forceinline__ float grad_factor(const float* norm_sq, float inv_loss_scale, float max_norm) {
  if (!norm_sq || max_norm <= 0.0f) return inv_loss_scale;
  const float norm = sqrtf(*norm_sq) * inv_loss_scale;
  return inv_loss_scale * fminf(1.0f, max_norm / (norm + 1e-6f));
}

// GradTransform::skip_nonfinite: the step is skipped (every kernel of the update returns before
// writing anything) when norm_sq is inf or NaN. Read by every thread; uniform across the grid,
// so whole blocks leave before any barrier.
__device__ __forceinline__ bool skip_step(const GradFactor& gf) {
  return gf.skip_nonfinite && !isfinite(*gf.norm_sq);
}

// ---- kernels ------------------------------------------------------------------------------------
// Note [canonical gradient norm] (optim/grad_norm.h): one thread block per norm block of
// kNormBlock elements, each thread a fixed stride, then a fixed tree; no atomics, so the partials
// and their sum do not depend on the launch or on how the buffer is sharded. An inf or NaN
// gradient makes the sum inf or NaN (the overflow check).
// W = 4: 16-byte loads for whole blocks of an aligned buffer (the short last block takes W = 1).
// The order within a block follows W, i.e. the buffer's alignment, which block-aligned shards of
// one buffer share.
template <int W>
__global__ void block_sum_squares_kernel(float* __restrict__ partials, const float* __restrict__ x, size_t n) {
  __shared__ float red[32];
  const size_t b = static_cast<size_t>(blockIdx.x) * kNormBlock;
  const size_t e = b + kNormBlock < n ? b + kNormBlock : n;
  float acc = 0.0f;
  if (W > 1 && e - b == kNormBlock) {
    const Pack<float, W>* v = reinterpret_cast<const Pack<float, W>*>(x + b);
    for (size_t p = threadIdx.x; p < kNormBlock / W; p += blockDim.x)
#pragma unroll
      for (int j = 0; j < W; ++j) acc += v[p].v[j] * v[p].v[j];
  } else {
    for (size_t i = b + threadIdx.x; i < e; i += blockDim.x) acc += x[i] * x[i];
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out[0] = sum of partials: one block, each thread a fixed stride in double, then a fixed tree.
__global__ void sum_blocks_kernel(float* __restrict__ out, const float* __restrict__ partials, size_t n) {
  __shared__ double red[32];
  double acc = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) acc += static_cast<double>(partials[i]);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  acc = warp_sum_double(acc);
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < nwarps ? red[lane] : 0.0;
    acc = warp_sum_double(acc);
    if (lane == 0) out[0] = static_cast<float>(acc);
  }
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
  if (skip_step(gf)) return;
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
  if (skip_step(gf)) return;
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

// ---- 8-bit AdamW --------------------------------------------------------------------------------
// One thread block per quantization block (kQuantBlock threads, one element each): dequantize,
// the AdamW step in fp32 (ops/optim_math.h, the CPU twin's exact operations), block absmax,
// re-quantize by binary search over the maps in shared memory. No atomics: the result does not
// depend on scheduling.
__device__ __forceinline__ float exact_grad_factor(const GradFactor& gf) {
  const bool clip = gf.norm_sq != nullptr && gf.max_norm > 0.0f;
  return om::grad_factor(clip ? *gf.norm_sq : 0.0f, clip, gf.inv_loss_scale, gf.max_norm);
}

template <class H>
__global__ void __launch_bounds__(kQuantBlock)
    adamw8bit_kernel(float* __restrict__ params, uint8_t* __restrict__ m_codes, uint8_t* __restrict__ v_codes,
                     float* __restrict__ m_absmax, float* __restrict__ v_absmax, H* __restrict__ half,
                     const float* __restrict__ grads, const float* __restrict__ qmap, size_t n, GradFactor gf,
                     om::AdamConsts<float> c) {
  if (skip_step(gf)) return;
  __shared__ float map[512];
  __shared__ float red[32];
  const int t = threadIdx.x;
  map[t] = qmap[t];
  map[t + kQuantBlock] = qmap[t + kQuantBlock];
  __syncthreads();
  const size_t b = blockIdx.x, i = b * kQuantBlock + t;
  const bool live = i < n;
  const float f = exact_grad_factor(gf);
  const float ma = m_absmax[b], va = v_absmax[b];
  float m = 0.0f, v = 0.0f;
  if (live) {
    m = om::dequantize(map, m_codes[i], ma);
    v = om::dequantize(map + 256, v_codes[i], va);
    const float p = om::adam_element(params[i], m, v, om::mul(grads[i], f), c);
    params[i] = p;
    if (half) half[i] = from_f32<H>(p);
  }
  // Every thread has read the old scales before the reductions' barriers; thread 0 writes after.
  const float am = block_max(live ? fabsf(m) : 0.0f, red);
  const float av = block_max(live ? v : 0.0f, red);
  if (live) {
    m_codes[i] = om::quantize(map, m, am, false);
    v_codes[i] = om::quantize(map + 256, v, av, true);
  }
  if (t == 0) {
    m_absmax[b] = am;
    v_absmax[b] = av;
  }
}

// ---- Adafactor ----------------------------------------------------------------------------------
// Four launches per step over all parameters (AdafactorSegment in ops/backend.h):
//   1. statistics: per row chunk, each row's mean of g^2 + eps1 (a warp per row) into the row
//      state; per 32-column strip, each column's mean over all rows (8 row lanes, summed in a
//      fixed order) into the column state; for 1-D parameters the full v, element-wise.
//   2. row dots: per row chunk, W_r = sum_j g_rj^2 / col_j (so sum over the row of the unclipped
//      update squared is W_r * mean(row) / row_r); 1-D: per-chunk partial sums of g^2 / v.
//   3. per segment (one block each): mean(row) and the update RMS, hence the clip scale.
//   4. apply: p = p - lr wd p - lr * g rsqrt(row_r / mean(row)) rsqrt(col_j) * scale.
// Every reduction has a fixed order (warp shuffles, block_sum, per-chunk partials): deterministic.
constexpr int kAfThreads = 256, kAfWarps = kAfThreads / 32, kAfStrip = 32;

struct AdafactorConsts {
  float beta2t, one_minus_beta2t, eps1, lr, lr_wd, clip_threshold;
};

// The last segment whose first chunk (strips: first strip) is at or before b.
__device__ __forceinline__ int find_segment(const AdafactorSegment* __restrict__ segs, int count, int64_t b,
                                            bool strips) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    const int64_t begin = strips ? segs[mid].strip_begin : segs[mid].chunk_begin;
    if (begin <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kAfThreads)
    adafactor_stats_kernel(float* __restrict__ state, const float* __restrict__ grads,
                           const AdafactorSegment* __restrict__ segs, int count, int64_t chunks, GradFactor gf,
                           AdafactorConsts c) {
  if (skip_step(gf)) return;
  const float f = grad_factor(gf.norm_sq, gf.inv_loss_scale, gf.max_norm);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x;
  if (b < chunks) {
    const AdafactorSegment sg = segs[find_segment(segs, count, b, false)];
    const int64_t local = b - sg.chunk_begin;
    const float* g = grads + sg.offset;
    if (sg.factored) {
      const int64_t r0 = local * sg.chunk, r1 = min(sg.rows, r0 + sg.chunk);
      for (int64_t r = r0 + warp; r < r1; r += kAfWarps) {
        float acc = 0.0f;
        for (int64_t j = lane; j < sg.cols; j += 32) {
          const float x = g[r * sg.cols + j] * f;
          acc += x * x + c.eps1;
        }
        acc = warp_sum(acc);
        if (lane == 0) {
          float& row = state[sg.row_state + r];
          row = c.beta2t * row + c.one_minus_beta2t * (acc / static_cast<float>(sg.cols));
        }
      }
    } else {
      const int64_t e0 = local * sg.chunk, e1 = min(sg.cols, e0 + sg.chunk);
      for (int64_t e = e0 + threadIdx.x; e < e1; e += kAfThreads) {
        const float x = g[e] * f;
        float& v = state[sg.row_state + e];
        v = c.beta2t * v + c.one_minus_beta2t * (x * x + c.eps1);
      }
    }
    return;
  }
  __shared__ float part[kAfWarps][kAfStrip];
  const int64_t q = b - chunks;
  const AdafactorSegment sg = segs[find_segment(segs, count, q, true)];
  const int64_t j = (q - sg.strip_begin) * kAfStrip + lane;
  const float* g = grads + sg.offset;
  float acc = 0.0f;
  if (j < sg.cols)
    for (int64_t r = warp; r < sg.rows; r += kAfWarps) {
      const float x = g[r * sg.cols + j] * f;
      acc += x * x + c.eps1;
    }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && j < sg.cols) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kAfWarps; ++k) sum += part[k][lane];
    float& col = state[sg.col_state + j];
    col = c.beta2t * col + c.one_minus_beta2t * (sum / static_cast<float>(sg.rows));
  }
}

__global__ void __launch_bounds__(kAfThreads)
    adafactor_rowdot_kernel(float* __restrict__ scratch, const float* __restrict__ state,
                            const float* __restrict__ grads, const AdafactorSegment* __restrict__ segs, int count,
                            GradFactor gf) {
  if (skip_step(gf)) return;
  __shared__ float red[32];
  const float f = grad_factor(gf.norm_sq, gf.inv_loss_scale, gf.max_norm);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x;
  const AdafactorSegment sg = segs[find_segment(segs, count, b, false)];
  const int64_t local = b - sg.chunk_begin;
  const float* g = grads + sg.offset;
  if (sg.factored) {
    const float* col = state + sg.col_state;
    const int64_t r0 = local * sg.chunk, r1 = min(sg.rows, r0 + sg.chunk);
    for (int64_t r = r0 + warp; r < r1; r += kAfWarps) {
      float acc = 0.0f;
      for (int64_t j = lane; j < sg.cols; j += 32) {
        const float x = g[r * sg.cols + j] * f;
        acc += x * x / col[j];
      }
      acc = warp_sum(acc);
      if (lane == 0) scratch[sg.scratch + r] = acc;
    }
  } else {
    const float* v = state + sg.row_state;
    const int64_t e0 = local * sg.chunk, e1 = min(sg.cols, e0 + sg.chunk);
    float acc = 0.0f;
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kAfThreads) {
      const float x = g[e] * f;
      acc += x * x / v[e];
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) scratch[sg.scratch + local] = acc;
  }
}

__global__ void __launch_bounds__(kAfThreads)
    adafactor_segment_kernel(float* __restrict__ scratch, const float* __restrict__ state,
                             const AdafactorSegment* __restrict__ segs, GradFactor gf, AdafactorConsts c) {
  if (skip_step(gf)) return;
  __shared__ float red[32];
  const AdafactorSegment sg = segs[blockIdx.x];
  float* w = scratch + sg.scratch;
  float mean_row = 1.0f, sumsq;
  int64_t slots;  // where the two scalars go
  if (sg.factored) {
    const float* row = state + sg.row_state;
    float acc = 0.0f;
    for (int64_t r = threadIdx.x; r < sg.rows; r += kAfThreads) acc += row[r];
    mean_row = block_sum(acc, red) / static_cast<float>(sg.rows);
    acc = 0.0f;
    for (int64_t r = threadIdx.x; r < sg.rows; r += kAfThreads) acc += w[r] * (mean_row / row[r]);
    sumsq = block_sum(acc, red);
    slots = sg.rows;
  } else {
    float acc = 0.0f;
    for (int64_t k = threadIdx.x; k < sg.chunks; k += kAfThreads) acc += w[k];
    sumsq = block_sum(acc, red);
    slots = sg.chunks;
  }
  if (threadIdx.x == 0) {
    const float rms = sqrtf(sumsq / static_cast<float>(sg.rows * sg.cols));
    w[slots] = mean_row;
    w[slots + 1] = 1.0f / fmaxf(1.0f, rms / c.clip_threshold);
  }
}

template <class H>
__global__ void __launch_bounds__(kAfThreads)
    adafactor_apply_kernel(float* __restrict__ params, H* __restrict__ half, const float* __restrict__ state,
                           const float* __restrict__ scratch, const float* __restrict__ grads,
                           const AdafactorSegment* __restrict__ segs, int count, GradFactor gf, AdafactorConsts c) {
  if (skip_step(gf)) return;
  const float f = grad_factor(gf.norm_sq, gf.inv_loss_scale, gf.max_norm);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x;
  const AdafactorSegment sg = segs[find_segment(segs, count, b, false)];
  const int64_t local = b - sg.chunk_begin;
  const float* g = grads + sg.offset;
  float* p = params + sg.offset;
  H* h = half ? half + sg.offset : nullptr;
  const float lr_wd = sg.decay ? c.lr_wd : 0.0f;
  auto apply = [&](int64_t i, float u) {
    float x = p[i];
    x = x - lr_wd * x;
    x = x - c.lr * u;
    p[i] = x;
    if (h) h[i] = from_f32<H>(x);
  };
  if (sg.factored) {
    const float* row = state + sg.row_state;
    const float* col = state + sg.col_state;
    const float mean_row = scratch[sg.scratch + sg.rows], scale = scratch[sg.scratch + sg.rows + 1];
    const int64_t r0 = local * sg.chunk, r1 = min(sg.rows, r0 + sg.chunk);
    for (int64_t r = r0 + warp; r < r1; r += kAfWarps) {
      const float rf = rsqrtf(row[r] / mean_row) * scale;
      for (int64_t j = lane; j < sg.cols; j += 32) {
        const int64_t i = r * sg.cols + j;
        apply(i, g[i] * f * rf * rsqrtf(col[j]));
      }
    }
  } else {
    const float* v = state + sg.row_state;
    const float scale = scratch[sg.scratch + sg.chunks + 1];
    const int64_t e0 = local * sg.chunk, e1 = min(sg.cols, e0 + sg.chunk);
    for (int64_t e = e0 + threadIdx.x; e < e1; e += kAfThreads) apply(e, g[e] * f * rsqrtf(v[e]) * scale);
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void block_sum_squares(const Tensor& partials, const Tensor& x, cudaStream_t s) {
  const size_t n = x.numel();
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + kNormBlock - 1) / kNormBlock);
  if (aligned16(x.data))
    block_sum_squares_kernel<4><<<blocks, kThreads, 0, s>>>(partials.ptr<float>(), x.ptr<const float>(), n);
  else
    block_sum_squares_kernel<1><<<blocks, kThreads, 0, s>>>(partials.ptr<float>(), x.ptr<const float>(), n);
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void sum_blocks(const Tensor& out, const Tensor& partials, cudaStream_t s) {
  sum_blocks_kernel<<<1, 1024, 0, s>>>(out.ptr<float>(), partials.ptr<const float>(), partials.numel());
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

void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                      const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                      const GradFactor& g, const AdamWArgs& a, cudaStream_t s) {
  const size_t n = params.numel();
  if (n == 0) return;
  const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
  const om::AdamConsts<float> c = om::adam_consts<float>(a);
  dispatch_half(half_copy, [&](auto tag) {
    using H = typename decltype(tag)::type;
    H* hp = half_copy.defined() ? half_copy.ptr<H>() : nullptr;
    adamw8bit_kernel<H><<<static_cast<unsigned>(blocks), kQuantBlock, 0, s>>>(
        params.ptr<float>(), m_codes.ptr<uint8_t>(), v_codes.ptr<uint8_t>(), m_absmax.ptr<float>(),
        v_absmax.ptr<float>(), hp, grads.ptr<const float>(), qmap.ptr<const float>(), n, g, c);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                      const Tensor& grads, const AdafactorTable& t, const GradFactor& g, const AdafactorArgs& a,
                      cudaStream_t s) {
  if (t.count == 0) return;
  const double beta2t = 1.0 - std::pow(static_cast<double>(a.step), static_cast<double>(a.decay_rate));
  const AdafactorConsts c{static_cast<float>(beta2t),
                          static_cast<float>(1.0 - beta2t),
                          a.eps1,
                          a.lr,
                          static_cast<float>(static_cast<double>(a.lr) * a.weight_decay),
                          a.clip_threshold};
  const auto* segs = t.segments.ptr<const AdafactorSegment>();
  const int count = static_cast<int>(t.count);
  float* st = state.ptr<float>();
  float* scr = scratch.ptr<float>();
  adafactor_stats_kernel<<<static_cast<unsigned>(t.chunks + t.strips), kAfThreads, 0, s>>>(
      st, grads.ptr<const float>(), segs, count, t.chunks, g, c);
  ANATOMY_CUDA_LAUNCH_CHECK();
  adafactor_rowdot_kernel<<<static_cast<unsigned>(t.chunks), kAfThreads, 0, s>>>(scr, st, grads.ptr<const float>(),
                                                                                 segs, count, g);
  ANATOMY_CUDA_LAUNCH_CHECK();
  adafactor_segment_kernel<<<static_cast<unsigned>(count), kAfThreads, 0, s>>>(scr, st, segs, g, c);
  ANATOMY_CUDA_LAUNCH_CHECK();
  dispatch_half(half_copy, [&](auto tag) {
    using H = typename decltype(tag)::type;
    H* hp = half_copy.defined() ? half_copy.ptr<H>() : nullptr;
    adafactor_apply_kernel<H><<<static_cast<unsigned>(t.chunks), kAfThreads, 0, s>>>(
        params.ptr<float>(), hp, st, scr, grads.ptr<const float>(), segs, count, g, c);
  });
  ANATOMY_CUDA_LAUNCH_CHECK();
}

}  // namespace anatomy::cuda
