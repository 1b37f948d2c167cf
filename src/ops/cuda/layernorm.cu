// LayerNorm over the last dim with the branch dropout and the residual add fused in front.
// Shapes: branch, residual, sum, y, dy, dsum, dbranch [rows, H]; mean, rstd F32 [rows];
// gamma, beta [H] in F32 (the master weights: Note [normalization parameters in fp32] in
// model/bert.cpp) or the storage type; dgamma, dbeta F32 [H].
//
// Forward:  sum = dropout(branch) + residual in fp32 (stored only when asked, rounded to the
//           storage type; the statistics are then taken from the stored values, else from the
//           fp32 sum, so that a half-precision run rounds once, at y); mean = E[sum];
//           rstd = 1/sqrt(E[(sum - mean)^2] + eps) (two passes); y = (sum - mean) rstd gamma + beta.
// Backward: from the output (Note [layernorm backward from its output] in the CPU twin):
//           xhat = (y - beta) / gamma (0 where gamma == 0), g = dy gamma;
//           dsum = rstd (g - mean(g) - xhat mean(g xhat)); dbranch = dropout_backward(dsum);
//           dgamma += sum_rows dy xhat; dbeta += sum_rows dy.
// The dropout index of element (r, j) is r*H + j, as in the CPU twin.
//
// Two paths: a warp per row with 16-byte packs held in registers when H is a multiple of the
// pack width (4 fp32, 8 half) and at most 1024; otherwise a block per row with scalar accesses.
// dgamma/dbeta are reduced in two deterministic stages: each block writes one partial row
// [dgamma | dbeta] to the scratch, reduce_partials sums them in a fixed order.
#include <algorithm>

#include "core/rng.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

// The branch dropout (Note [dropout bits] in core/rng.h) with the per-call key and threshold
// computed on the host. The warp path's packs start at multiples of W (4 or 8, since H % W == 0
// there): whole groups, one hash per four elements.
struct Drop {
  bool active;
  float scale;
  uint32_t thr;
  uint64_t key;
  __device__ __forceinline__ float factor(uint64_t i) const {
    if (!active) return 1.0f;
    return dropout_keep_key(key, i, thr) ? scale : 0.0f;
  }
  // f[j] = factor(i + j), j < W.
  template <int W>
  __device__ __forceinline__ void factors(float (&f)[W], uint64_t i) const {
    if (!active) {
#pragma unroll
      for (int j = 0; j < W; ++j) f[j] = 1.0f;
      return;
    }
    bool keep[W];
    dropout_keep_run<W>(keep, key, i, thr);
#pragma unroll
    for (int j = 0; j < W; ++j) f[j] = keep[j] ? scale : 0.0f;
  }
};
Drop make_drop(const DropoutSpec& d) {
  const float scale = d.p < 1.0f ? static_cast<float>(1.0 / (1.0 - static_cast<double>(d.p))) : 0.0f;
  return Drop{d.p > 0.0f, scale, dropout_threshold(d.p), dropout_key(d.seed, d.offset)};
}

constexpr int kWarpThreads = 128;   // 4 rows (warps) per block on the warp path
constexpr int kBlockThreads = 256;  // the block-per-row path
// The warp path holds up to 1024 elements per row (32 per lane): beyond that the half types
// spill (2048 bf16 at 8 packs per lane needs > 255 registers in backward).
constexpr int kMaxWarpH = 1024;
template <class T>
constexpr int kMaxPacksPerLane = kMaxWarpH / (32 * kVec<T>);

// ---- kernels: warp per row --------------------------------------------------------------------
// Lane l holds packs l, l+32, ... (P of them at most) of its row: packs of W = 16/sizeof(T).
// sum (may be null: not stored) may alias branch: no __restrict__ on them; each element is
// read before it is written, by the same thread.
template <class T, class G, int P>
__global__ void __launch_bounds__(kWarpThreads) ln_forward_warp(
    T* __restrict__ y, T* sum, float* __restrict__ mean, float* __restrict__ rstd,
    const T* branch, const T* __restrict__ residual, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h, float eps, Drop drop) {
  constexpr int W = kVec<T>;
  using V = Pack<T, W>;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarpThreads / 32) + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together; no block barrier below
  const int packs = h / W;
  const size_t base = static_cast<size_t>(row) * h;
  float x[P][W];
  float s = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * 32 + lane;
    if (q < packs) {
      V b = reinterpret_cast<const V*>(branch + base)[q];
      V r{};
      if (residual) r = reinterpret_cast<const V*>(residual + base)[q];
      V o;
      float f[W];
      drop.factors<W>(f, base + static_cast<size_t>(q) * W);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        float v = to_f32(b.v[j]) * f[j];
        if (residual) v += to_f32(r.v[j]);
        o.v[j] = from_f32<T>(v);
        x[p][j] = sum ? to_f32(o.v[j]) : v;  // the statistics of what backward will see
        s += x[p][j];
      }
      if (sum) reinterpret_cast<V*>(sum + base)[q] = o;
    }
  }
  const float mu = warp_sum(s) / h;
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (p * 32 + lane < packs)
#pragma unroll
      for (int j = 0; j < W; ++j) ss += (x[p][j] - mu) * (x[p][j] - mu);
  const float rs = 1.0f / sqrtf(warp_sum(ss) / h + eps);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * 32 + lane;
    if (q < packs) {
      float g[W], bt[W];
      load_as_floats<W>(g, gamma + q * W);
      load_as_floats<W>(bt, beta + q * W);
      V o;
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = from_f32<T>((x[p][j] - mu) * rs * g[j] + bt[j]);
      reinterpret_cast<V*>(y + base)[q] = o;
    }
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Note [layernorm backward at bandwidth]
// At bert-large shapes (rows = 16384, H = 1024, bf16, the branch dropout fused) the backward
// moves 128 MB (dy and y in, dsum and dbranch out: ~32 us at 4 TB/s) and does little
// arithmetic, so it is a matter of keeping enough bytes in flight. A block of 8 warps, one
// block per SM (the launch bounds give each lane up to 255 registers), is a persistent grid:
// warp w of block b takes rows b*8 + w, then + gridDim*8, ... Each lane holds its 16-byte packs
// of a row (P of them) and, for half types, already the next row's packs and rstd (loads
// issued before the current row's arithmetic and shuffles, so the memory is never idle behind
// them); gamma, beta and 1/gamma are staged once per block in shared memory as floats (the
// first pass needs no division: g xhat = dy (y - beta)). dgamma/dbeta accumulate per lane in
// registers; at the end the block adds its warps in warp order (16-byte shared accesses) and
// writes its partial row [dgamma | dbeta] to partials[blockIdx.x] (disjoint rows per block),
// which reduce_partials sums in a fixed order. Grid size depends only on the SM count, so the
// result is bitwise the same run to run on a device.
// The per-row math is the CPU twin's: xhat = (y - beta) / gamma, g = dy gamma,
// dsum = rstd (g - mean(g) - xhat mean(g xhat)), recomputed in the second pass from the packed
// inputs instead of being kept as floats (fewer registers).
constexpr int kBwdThreads = 256;
constexpr int kBwdWarps = kBwdThreads / 32;

// 1/gamma, with 0 where |gamma| < FLT_MIN (that column's xhat is unknown; see the note). A
// subnormal gamma would give an infinite reciprocal.
__device__ __forceinline__ float inv_gamma(float g) { return fabsf(g) < 1.17549435e-38f ? 0.0f : 1.0f / g; }

// One row as a lane holds it: packs q = p*32 + lane (< packs) of dy and y, and rstd.
template <class T, int P>
struct RowIn {
  Pack<T, kVec<T>> d[P], x[P];
  float rs;
};

template <class T, int P>
__device__ __forceinline__ void load_row(RowIn<T, P>& in, const T* __restrict__ dy, const T* __restrict__ y,
                                         const float* __restrict__ rstd, int64_t row, int h, int lane) {
  using V = Pack<T, kVec<T>>;
  const int packs = h / kVec<T>;
  const size_t base = static_cast<size_t>(row) * h;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * 32 + lane;
    if (q < packs) {
      in.d[p] = reinterpret_cast<const V*>(dy + base)[q];
      in.x[p] = reinterpret_cast<const V*>(y + base)[q];
    }
  }
  in.rs = rstd[row];
}

// W consecutive floats of shared memory (16-byte aligned) into registers.
template <int W>
__device__ __forceinline__ void load_floats(float (&o)[W], const float* p) {
#pragma unroll
  for (int j = 0; j < W; j += 4) {
    const float4 v = reinterpret_cast<const float4*>(p)[j / 4];
    o[j] = v.x;
    o[j + 1] = v.y;
    o[j + 2] = v.z;
    o[j + 3] = v.w;
  }
}

// Per row, with t = y - beta (so g xhat = dy t, and no division in the first pass):
//   mean(g) and mean(dy t); then dsum = rstd (dy gamma - mean(g) - t / gamma mean(dy t)).
// dgamma accumulates dy t per column and is divided by gamma once, at the end. gamma, beta
// and 1/gamma sit in shared memory as floats (registers hold the rows and the column sums).
template <class T, class G, int P, bool kPrefetch>
__global__ void __launch_bounds__(kBwdThreads, 1) ln_backward_warp(
    T* __restrict__ dsum, T* __restrict__ dbranch, float* __restrict__ partials, const T* __restrict__ dy,
    const T* __restrict__ y, const float* __restrict__ rstd, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h, Drop drop) {
  constexpr int W = kVec<T>;
  using V = Pack<T, W>;
  // [2H] when partials: dgamma | dbeta (the end of the kernel); then gamma | beta | 1/gamma.
  extern __shared__ float4 shared4[];
  float* shared = reinterpret_cast<float*>(shared4);
  float* s_gamma = shared + (partials ? 2 * h : 0);
  float* s_beta = s_gamma + h;
  float* s_inv = s_beta + h;
  for (int c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = to_f32(gamma[c]);
    s_gamma[c] = g;
    s_beta[c] = to_f32(beta[c]);
    s_inv[c] = inv_gamma(g);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int packs = h / W;
  const float inv_h = 1.0f / h;
  float dg[P][W], db[P][W];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < W; ++j) dg[p][j] = db[p][j] = 0.0f;

  const int64_t step = static_cast<int64_t>(gridDim.x) * kBwdWarps;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kBwdWarps + warp;
  RowIn<T, P> cur;
  if (kPrefetch && row < rows) load_row(cur, dy, y, rstd, row, h, lane);
  for (; row < rows; row += step) {
    RowIn<T, P> next;
    if constexpr (kPrefetch) {
      if (row + step < rows) load_row(next, dy, y, rstd, row + step, h, lane);
    } else {
      load_row(cur, dy, y, rstd, row, h, lane);
    }
    const float rs = cur.rs;
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int q = p * 32 + lane;
      if (q < packs) {
        float gv[W], bv[W];
        load_floats<W>(gv, s_gamma + q * W);
        load_floats<W>(bv, s_beta + q * W);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float dyv = to_f32(cur.d[p].v[j]);
          const float t = to_f32(cur.x[p].v[j]) - bv[j];
          sg += dyv * gv[j];
          sgx += dyv * t;
          dg[p][j] += dyv * t;
          db[p][j] += dyv;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // the two warp sums interleaved
      sg += __shfl_xor_sync(0xffffffffu, sg, o);
      sgx += __shfl_xor_sync(0xffffffffu, sgx, o);
    }
    const float mg = sg * inv_h, mgx = sgx * inv_h;
    const size_t base = static_cast<size_t>(row) * h;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int q = p * 32 + lane;
      if (q < packs) {
        V o, ob;
        float f[W], gv[W], bv[W], iv[W];
        load_floats<W>(gv, s_gamma + q * W);
        load_floats<W>(bv, s_beta + q * W);
        load_floats<W>(iv, s_inv + q * W);
        if (dbranch) drop.factors<W>(f, base + static_cast<size_t>(q) * W);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float xhat = (to_f32(cur.x[p].v[j]) - bv[j]) * iv[j];
          const float d = rs * (to_f32(cur.d[p].v[j]) * gv[j] - mg - xhat * mgx);
          o.v[j] = from_f32<T>(d);
          if (dbranch) ob.v[j] = from_f32<T>(d * f[j]);
        }
        reinterpret_cast<V*>(dsum + base)[q] = o;
        if (dbranch) reinterpret_cast<V*>(dbranch + base)[q] = ob;
      }
    }
    if constexpr (kPrefetch) cur = next;
  }
  // dgamma = sum dy t / gamma: divide each column once.
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * 32 + lane;
    if (q < packs) {
      float iv[W];
      load_floats<W>(iv, s_inv + q * W);
#pragma unroll
      for (int j = 0; j < W; ++j) dg[p][j] *= iv[j];
    }
  }
  if (!partials) return;  // uniform across the grid
  // Warp order, 16 bytes at a time (W is a multiple of 4); each warp's columns are its own.
  for (int w = 0; w < kBwdWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int q = p * 32 + lane;
        if (q < packs)
#pragma unroll
          for (int j = 0; j < W; j += 4) {
            const int c4 = (q * W + j) / 4;
            float4 a = make_float4(dg[p][j], dg[p][j + 1], dg[p][j + 2], dg[p][j + 3]);
            float4 b = make_float4(db[p][j], db[p][j + 1], db[p][j + 2], db[p][j + 3]);
            if (w) {
              const float4 sa = shared4[c4], sb = shared4[h / 4 + c4];
              a = make_float4(sa.x + a.x, sa.y + a.y, sa.z + a.z, sa.w + a.w);
              b = make_float4(sb.x + b.x, sb.y + b.y, sb.z + b.z, sb.w + b.w);
            }
            shared4[c4] = a;
            shared4[h / 4 + c4] = b;
          }
      }
    }
    __syncthreads();
  }
  float* out = partials + static_cast<size_t>(blockIdx.x) * 2 * h;
  for (int c = threadIdx.x; c < 2 * h; c += blockDim.x) out[c] = shared[c];
}

// ---- kernels: block per row (any H) -----------------------------------------------------------
template <class T, class G>
__global__ void __launch_bounds__(kBlockThreads) ln_forward_block(
    T* __restrict__ y, T* sum, float* __restrict__ mean, float* __restrict__ rstd,
    const T* branch, const T* __restrict__ residual, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h, float eps, Drop drop) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const size_t base = static_cast<size_t>(row) * h;
  // The fp32 sum of column c: stored rounded (and re-read by this same thread), or recomputed.
  auto value = [&](int c) {
    float v = to_f32(branch[base + c]) * drop.factor(base + c);
    if (residual) v += to_f32(residual[base + c]);
    return v;
  };
  float s = 0.0f;
  for (int c = threadIdx.x; c < h; c += blockDim.x) {
    float v = value(c);
    if (sum) {
      sum[base + c] = from_f32<T>(v);
      v = to_f32(sum[base + c]);
    }
    s += v;
  }
  const float mu = block_sum(s, red) / h;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < h; c += blockDim.x) {
    const float d = (sum ? to_f32(sum[base + c]) : value(c)) - mu;
    ss += d * d;
  }
  const float rs = 1.0f / sqrtf(block_sum(ss, red) / h + eps);
  for (int c = threadIdx.x; c < h; c += blockDim.x)
    y[base + c] = from_f32<T>(((sum ? to_f32(sum[base + c]) : value(c)) - mu) * rs * to_f32(gamma[c]) + to_f32(beta[c]));
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Blocks stride over rows; thread t owns columns c = t, t + blockDim, ... < H of the block's
// partial row: both part[c] (dgamma) and part[H + c] (dbeta), which it alone zeroes, reads and
// writes, so no barrier is needed for them. (Zeroing [0, 2H) by thread index instead handed
// part[H + c] to another thread without a barrier: a race that compute-sanitizer's serialized
// schedule exposed as wrong dbeta.)
template <class T, class G>
__global__ void __launch_bounds__(kBlockThreads) ln_backward_block(
    T* __restrict__ dsum, T* __restrict__ dbranch, float* __restrict__ partials, const T* __restrict__ dy,
    const T* __restrict__ y, const float* __restrict__ rstd, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h, Drop drop) {
  __shared__ float red[32];
  float* part = partials ? partials + static_cast<size_t>(blockIdx.x) * 2 * h : nullptr;
  if (part)
    for (int c = threadIdx.x; c < h; c += blockDim.x) part[c] = part[h + c] = 0.0f;
  const float inv_h = 1.0f / h;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * h;
    const float rs = rstd[row];
    float sg = 0.0f, sgx = 0.0f;  // as the warp path: t = y - beta, g xhat = dy t
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      const float dyv = to_f32(dy[base + c]), t = to_f32(y[base + c]) - to_f32(beta[c]);
      sg += dyv * to_f32(gamma[c]);
      sgx += dyv * t;
      if (part) {
        part[c] += dyv * t;  // divided by gamma below
        part[h + c] += dyv;
      }
    }
    const float mg = block_sum(sg, red) * inv_h, mgx = block_sum(sgx, red) * inv_h;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      const float gv = to_f32(gamma[c]);
      const float xhat = (to_f32(y[base + c]) - to_f32(beta[c])) * inv_gamma(gv);
      const float d = rs * (to_f32(dy[base + c]) * gv - mg - xhat * mgx);
      dsum[base + c] = from_f32<T>(d);
      if (dbranch) dbranch[base + c] = from_f32<T>(d * drop.factor(base + c));
    }
  }
  if (part)  // each thread its own columns, as above
    for (int c = threadIdx.x; c < h; c += blockDim.x) part[c] *= inv_gamma(to_f32(gamma[c]));
}

// ---- dispatch helpers ---------------------------------------------------------------------------
// Packs per lane for the warp path (1, 2, 4 or 8), or 0 when the block path must run.
template <class T>
int packs_per_lane(int h, std::initializer_list<const void*> ptrs) {
  constexpr int W = kVec<T>;
  if (h % W != 0 || h > kMaxWarpH) return 0;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return 0;
  const int need = (h / W + 31) / 32;
  int p = 1;
  while (p < need) p *= 2;
  return p;
}

template <class T, int P, class F>
void with_packs(int p, F&& f) {
  if constexpr (P <= kMaxPacksPerLane<T>) {
    if (p == P)
      f(std::integral_constant<int, P>{});
    else
      with_packs<T, P * 2>(p, f);
  }
}

// Calls f(TypeTag<G>{}) with G the parameters' storage type: float, or T itself.
template <class T, class F>
void with_param_type(const Tensor& gamma, F&& f) {
  if (gamma.dtype == DType::F32)
    f(TypeTag<float>{});
  else
    f(TypeTag<T>{});
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------
void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                       const Tensor& branch, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                       float eps, const DropoutSpec& d, cudaStream_t s) {
  const int h = static_cast<int>(y.dim(-1));
  const int64_t rows = h ? static_cast<int64_t>(y.numel()) / h : 0;
  if (rows == 0) return;
  const Drop drop = make_drop(d);
  dispatch_float(y.dtype, "layernorm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* yp = y.ptr<T>();
    T* sp = sum.defined() ? sum.ptr<T>() : nullptr;
    const T* bp = branch.ptr<const T>();
    const T* rp = residual.defined() ? residual.ptr<const T>() : nullptr;
    with_param_type<T>(gamma, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      const G* gp = gamma.ptr<const G>();
      const G* btp = beta.ptr<const G>();
      const int p = packs_per_lane<T>(h, {yp, sp, bp, rp, gp, btp});
      if (p == 0) {
        ln_forward_block<T, G><<<static_cast<unsigned>(rows), kBlockThreads, 0, s>>>(
            yp, sp, mean.ptr<float>(), rstd.ptr<float>(), bp, rp, gp, btp, rows, h, eps, drop);
      } else {
        const unsigned grid = static_cast<unsigned>((rows + kWarpThreads / 32 - 1) / (kWarpThreads / 32));
        with_packs<T, 1>(p, [&](auto pc) {
          ln_forward_warp<T, G, decltype(pc)::value><<<grid, kWarpThreads, 0, s>>>(
              yp, sp, mean.ptr<float>(), rstd.ptr<float>(), bp, rp, gp, btp, rows, h, eps, drop);
        });
      }
    });
    ANATOMY_CUDA_LAUNCH_CHECK();
  });
}

void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                        const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma, const Tensor& beta,
                        const DropoutSpec& d, const ReduceScratch& scratch, cudaStream_t s) {
  const int h = static_cast<int>(dy.dim(-1));
  const int64_t rows = h ? static_cast<int64_t>(dy.numel()) / h : 0;
  if (rows == 0) return;
  const Drop drop = make_drop(d);
  const bool reduce = dgamma.defined() || dbeta.defined();
  // Partial rows: as many blocks as keep the device busy, as the scratch allows.
  const int64_t cap = static_cast<int64_t>(scratch.floats) / (2 * static_cast<int64_t>(h));
  ANATOMY_CHECK(!reduce || cap >= 1, "internal error: layernorm_backward scratch of ", scratch.floats,
                " floats is below 2H = ", 2 * h);
  dispatch_float(dy.dtype, "layernorm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dsp = dsum.ptr<T>();
    T* dbp = dbranch.defined() ? dbranch.ptr<T>() : nullptr;
    const T* dyp = dy.ptr<const T>();
    const T* yp = y.ptr<const T>();
    with_param_type<T>(gamma, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      const G* gp = gamma.ptr<const G>();
      const G* btp = beta.ptr<const G>();
      const int p = packs_per_lane<T>(h, {dsp, dbp, dyp, yp, gp, btp});
      // The warp path is a persistent grid of one 8-warp block per SM (Note [layernorm backward
      // at bandwidth]); the block path a block per row, at most 4 per SM when it reduces.
      int64_t blocks = p ? std::min<int64_t>((rows + kBwdWarps - 1) / kBwdWarps, sm_count()) : rows;
      if (reduce) blocks = std::min<int64_t>({blocks, 4 * static_cast<int64_t>(sm_count()), cap});
      blocks = std::max<int64_t>(blocks, 1);
      float* partials = reduce ? scratch.data : nullptr;
      if (p == 0) {
        ln_backward_block<T, G><<<static_cast<unsigned>(blocks), kBlockThreads, 0, s>>>(
            dsp, dbp, partials, dyp, yp, rstd.ptr<const float>(), gp, btp, rows, h, drop);
      } else {
        // [dgamma | dbeta] partials when reducing, then gamma | beta | 1/gamma: <= 20 KiB.
        const size_t smem = ((reduce ? 2 : 0) + 3) * static_cast<size_t>(h) * sizeof(float);
        // Prefetching the next row costs 2P more 16-byte packs per lane: affordable for the half
        // types (P <= 4 at H <= 1024), not for fp32 (P = 8 would spill).
        constexpr bool kPrefetch = sizeof(T) == 2;
        with_packs<T, 1>(p, [&](auto pc) {
          ln_backward_warp<T, G, decltype(pc)::value, kPrefetch>
              <<<static_cast<unsigned>(blocks), kBwdThreads, smem, s>>>(dsp, dbp, partials, dyp, yp,
                                                                          rstd.ptr<const float>(), gp, btp, rows, h, drop);
        });
      }
      ANATOMY_CUDA_LAUNCH_CHECK();
      if (reduce)
        reduce_partials(dgamma.defined() ? dgamma.ptr<float>() : nullptr, dbeta.defined() ? dbeta.ptr<float>() : nullptr,
                        partials, static_cast<int>(blocks), h, 2 * static_cast<int64_t>(h), s);
    });
  });
}

}  // namespace anatomy::cuda
