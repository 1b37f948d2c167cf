// Fused multi-head self-attention for the CUDA backend: entry points, the reference
// kernels (every dtype, head_dim <= 128, fp32 math; the fallback, and every dtype under
// ANATOMY_ATTENTION=reference), and the small passes around the backward (Dsum = rowsum(dO * O),
// dQ conversion). F32 runs on cuBLAS (attention_gemm.cu; with a local window, on the reference kernels),
// BF16/F16 with D 32, 64 or 128 on attention_flash.cu (with or without a window).
// The math and the masking convention are in attention_common.cuh.
#include "ops/backend_memory.h"
#include "ops/cuda/attention.h"

#include <cmath>
#include <type_traits>

#include "core/rng.h"
#include "ops/cuda/attention_common.cuh"

namespace anatomy::cuda {
namespace attn {

namespace {

// ---- reference kernels -------------------------------------------------------------------
// One block of 4 warps owns kRows rows (queries, or keys in the dK/dV kernel) of one (b, h),
// two rows per warp. The other side streams through shared memory in tiles of 32 rows; lane
// j of a warp computes the score against partner j of the tile (a D-long dot product out of
// shared memory), and the products with the partner rows are summed with the lane's score
// broadcast by shuffles, lane l accumulating output columns l, l+32, l+64, l+96.
constexpr int kRows = 8;
constexpr int kRowsPerWarp = 2;
constexpr int kTile = 32;
constexpr int kThreads = 128;
constexpr int kMaxD = 128;
constexpr int kCols = kMaxD / 32;

// True in every thread when batch b has at least one valid key.
__device__ bool block_any_valid(const int32_t* mask, int b, int T) {
  if (mask == nullptr) return true;
  int any = 0;
  for (int k = threadIdx.x; k < T; k += blockDim.x) any |= mask[static_cast<size_t>(b) * T + k] != 0;
  return __syncthreads_or(any) != 0;
}

// Masked, scaled score (natural-log domain) for raw dot product `dot` of query q with key k.
__device__ __forceinline__ float ref_score(float dot, const Params& p, int b, int q, int k, bool uniform) {
  bool valid = p.mask == nullptr || p.mask[static_cast<size_t>(b) * p.T + k] != 0;
  if (p.window > 0 && (q - k > p.window || k - q > p.window)) valid = false;
  return valid ? dot * p.scale : (uniform ? 0.0f : -INFINITY);
}

// Whether query q's row is uniform: with a window, when no key within it is valid; without
// one, the whole batch's answer (block_uniform).
__device__ bool row_uniform(const Params& p, int b, int q, bool block_uniform) {
  if (p.window <= 0) return block_uniform;
  if (q >= p.T) return false;
  const int lo = q - p.window > 0 ? q - p.window : 0, hi = q + p.window < p.T - 1 ? q + p.window : p.T - 1;
  for (int k = lo; k <= hi; ++k)
    if (p.mask == nullptr || p.mask[static_cast<size_t>(b) * p.T + k] != 0) return false;
  return true;
}

// rows[r][d] = x[token row0 + r][d] for the kRows rows (zeros past T), x = base + t*stride.
template <class T, int N, int LD>
__device__ void load_rows(float (*rows)[LD], const T* base, size_t stride, int row0, int T_, int D) {
  for (int i = threadIdx.x; i < N * D; i += blockDim.x) {
    int r = i / D, d = i - r * D, t = row0 + r;
    rows[r][d] = t < T_ ? to_float(base[static_cast<size_t>(t) * stride + d]) : 0.0f;
  }
}

// Forward: two passes over the keys. Pass 1: lse per query row (each lane keeps a running
// max/sum over its keys, combined across the warp at the end). Pass 2: O = sum_k P Z v_k.
template <class T>
__global__ void __launch_bounds__(kThreads) ref_forward_kernel(Params p) {
  __shared__ float qs[kRows][kMaxD];
  __shared__ float ks[kTile][kMaxD + 1];
  __shared__ float vs[kTile][kMaxD + 1];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = p.D, T_ = p.T;
  const size_t rs = 3 * static_cast<size_t>(p.H);
  const T* qb = static_cast<const T*>(p.qkv) + static_cast<size_t>(b) * T_ * rs + h * D;
  const T* kb = qb + p.H;
  const T* vb = qb + 2 * p.H;
  const bool uniform = !block_any_valid(p.mask, b, T_);
  load_rows<T, kRows>(qs, qb, rs, q0, T_, D);
  bool uni[kRowsPerWarp];
  for (int r = 0; r < kRowsPerWarp; ++r) uni[r] = row_uniform(p, b, q0 + warp * kRowsPerWarp + r, uniform);

  float m[kRowsPerWarp], l[kRowsPerWarp];
  for (int r = 0; r < kRowsPerWarp; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  for (int k0 = 0; k0 < T_; k0 += kTile) {
    __syncthreads();
    load_rows<T, kTile>(ks, kb, rs, k0, T_, D);
    __syncthreads();
    const int k = k0 + lane;
    if (k >= T_) continue;
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot = fmaf(qs[row][d], ks[lane][d], dot);
      float s = ref_score(dot, p, b, q0 + row, k, uni[r]);
      if (s > m[r]) {
        l[r] = l[r] * expf(m[r] - s) + 1.0f;
        m[r] = s;
      } else if (s != -INFINITY) {
        l[r] += expf(s - m[r]);
      }
    }
  }
  float lse[kRowsPerWarp];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float mx = m[r];
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = m[r] == -INFINITY ? 0.0f : l[r] * expf(m[r] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    lse[r] = mx + logf(sum);
    const int q = q0 + warp * kRowsPerWarp + r;
    if (lane == 0 && q < T_) p.lse[(static_cast<size_t>(b) * p.heads + h) * T_ + q] = lse[r];
  }

  float acc[kRowsPerWarp][kCols] = {};
  for (int k0 = 0; k0 < T_; k0 += kTile) {
    __syncthreads();
    load_rows<T, kTile>(ks, kb, rs, k0, T_, D);
    load_rows<T, kTile>(vs, vb, rs, k0, T_, D);
    __syncthreads();
    const int k = k0 + lane;
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, q = q0 + row;
      float pz = 0.0f;
      if (k < T_) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(qs[row][d], ks[lane][d], dot);
        pz = expf(ref_score(dot, p, b, q, k, uni[r]) - lse[r]);
        if (p.drop) pz = attn_keep(p, static_cast<uint64_t>(b) * p.heads + h, q, k) ? pz * p.inv_keep : 0.0f;
      }
      for (int j = 0; j < kTile; ++j) {
        float pj = __shfl_sync(0xffffffffu, pz, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (lane + 32 * c < D) acc[r][c] = fmaf(pj, vs[j][lane + 32 * c], acc[r][c]);
      }
    }
  }
  T* ctx = static_cast<T*>(p.ctx);
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int q = q0 + warp * kRowsPerWarp + r;
    if (q >= T_) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (lane + 32 * c < D)
        ctx[(static_cast<size_t>(b) * T_ + q) * p.H + h * D + lane + 32 * c] = from_float<T>(acc[r][c]);
  }
}

// Backward, query side: dQ_q = scale * sum_k dS_qk k_k, one pass over the keys.
template <class T>
__global__ void __launch_bounds__(kThreads) ref_backward_q_kernel(Params p) {
  __shared__ float qs[kRows][kMaxD];
  __shared__ float dos[kRows][kMaxD];
  __shared__ float ks[kTile][kMaxD + 1];
  __shared__ float vs[kTile][kMaxD + 1];
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = p.D, T_ = p.T;
  const size_t rs = 3 * static_cast<size_t>(p.H);
  const T* qb = static_cast<const T*>(p.qkv) + static_cast<size_t>(b) * T_ * rs + h * D;
  const T* kb = qb + p.H;
  const T* vb = qb + 2 * p.H;
  const T* dob = static_cast<const T*>(p.dctx) + static_cast<size_t>(b) * T_ * p.H + h * D;
  const bool uniform = !block_any_valid(p.mask, b, T_);
  load_rows<T, kRows>(qs, qb, rs, q0, T_, D);
  load_rows<T, kRows>(dos, dob, p.H, q0, T_, D);
  bool uni[kRowsPerWarp];
  for (int r = 0; r < kRowsPerWarp; ++r) uni[r] = row_uniform(p, b, q0 + warp * kRowsPerWarp + r, uniform);
  float lse[kRowsPerWarp], dsum[kRowsPerWarp];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int q = q0 + warp * kRowsPerWarp + r;
    const size_t idx = (static_cast<size_t>(b) * p.heads + h) * T_ + q;
    lse[r] = q < T_ ? p.lse[idx] : 0.0f;
    dsum[r] = q < T_ ? p.dsum[idx] : 0.0f;
  }
  float acc[kRowsPerWarp][kCols] = {};
  for (int k0 = 0; k0 < T_; k0 += kTile) {
    __syncthreads();
    load_rows<T, kTile>(ks, kb, rs, k0, T_, D);
    load_rows<T, kTile>(vs, vb, rs, k0, T_, D);
    __syncthreads();
    const int k = k0 + lane;
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, q = q0 + row;
      float ds = 0.0f;
      if (k < T_ && q < T_) {
        float dot = 0.0f, dpd = 0.0f;
        for (int d = 0; d < D; ++d) {
          dot = fmaf(qs[row][d], ks[lane][d], dot);
          dpd = fmaf(dos[row][d], vs[lane][d], dpd);
        }
        float pr = expf(ref_score(dot, p, b, q, k, uni[r]) - lse[r]);
        if (p.drop) dpd = attn_keep(p, static_cast<uint64_t>(b) * p.heads + h, q, k) ? dpd * p.inv_keep : 0.0f;
        ds = pr * (dpd - dsum[r]);
      }
      for (int j = 0; j < kTile; ++j) {
        float dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (lane + 32 * c < D) acc[r][c] = fmaf(dj, ks[j][lane + 32 * c], acc[r][c]);
      }
    }
  }
  T* dqkv = static_cast<T*>(p.dqkv);
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int q = q0 + warp * kRowsPerWarp + r;
    if (q >= T_) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (lane + 32 * c < D)
        dqkv[(static_cast<size_t>(b) * T_ + q) * rs + h * D + lane + 32 * c] = from_float<T>(acc[r][c] * p.scale);
  }
}

// Backward, key side: dK_k = scale * sum_q dS_qk q_q and dV_k = sum_q P_qk Z_qk dO_q, one
// pass over the queries (P recomputed from lse).
template <class T>
__global__ void __launch_bounds__(kThreads) ref_backward_kv_kernel(Params p) {
  __shared__ float ks[kRows][kMaxD];
  __shared__ float vs[kRows][kMaxD];
  __shared__ float qs[kTile][kMaxD + 1];
  __shared__ float dos[kTile][kMaxD + 1];
  __shared__ float lse_s[kTile], dsum_s[kTile];
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = p.D, T_ = p.T;
  const size_t rs = 3 * static_cast<size_t>(p.H);
  const T* qb = static_cast<const T*>(p.qkv) + static_cast<size_t>(b) * T_ * rs + h * D;
  const T* kb = qb + p.H;
  const T* vb = qb + 2 * p.H;
  const T* dob = static_cast<const T*>(p.dctx) + static_cast<size_t>(b) * T_ * p.H + h * D;
  const size_t bh = static_cast<size_t>(b) * p.heads + h;
  const bool uniform = !block_any_valid(p.mask, b, T_);
  load_rows<T, kRows>(ks, kb, rs, k0, T_, D);
  load_rows<T, kRows>(vs, vb, rs, k0, T_, D);
  float dk[kRowsPerWarp][kCols] = {}, dv[kRowsPerWarp][kCols] = {};
  for (int qt = 0; qt < T_; qt += kTile) {
    __syncthreads();
    load_rows<T, kTile>(qs, qb, rs, qt, T_, D);
    load_rows<T, kTile>(dos, dob, p.H, qt, T_, D);
    if (threadIdx.x < kTile) {
      const int q = qt + threadIdx.x;
      lse_s[threadIdx.x] = q < T_ ? p.lse[bh * T_ + q] : 0.0f;
      dsum_s[threadIdx.x] = q < T_ ? p.dsum[bh * T_ + q] : 0.0f;
    }
    __syncthreads();
    const int q = qt + lane;
    const bool uq = row_uniform(p, b, q, uniform);
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r, k = k0 + row;
      float pz = 0.0f, ds = 0.0f;
      if (k < T_ && q < T_) {
        float dot = 0.0f, dpd = 0.0f;
        for (int d = 0; d < D; ++d) {
          dot = fmaf(ks[row][d], qs[lane][d], dot);
          dpd = fmaf(vs[row][d], dos[lane][d], dpd);
        }
        float pr = expf(ref_score(dot, p, b, q, k, uq) - lse_s[lane]);
        pz = pr;
        if (p.drop) {
          const bool keep = attn_keep(p, bh, q, k);
          pz = keep ? pr * p.inv_keep : 0.0f;
          dpd = keep ? dpd * p.inv_keep : 0.0f;
        }
        ds = pr * (dpd - dsum_s[lane]);
      }
      for (int j = 0; j < kTile; ++j) {
        float pj = __shfl_sync(0xffffffffu, pz, j);
        float dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (lane + 32 * c < D) {
            dv[r][c] = fmaf(pj, dos[j][lane + 32 * c], dv[r][c]);
            dk[r][c] = fmaf(dj, qs[j][lane + 32 * c], dk[r][c]);
          }
      }
    }
  }
  T* dqkv = static_cast<T*>(p.dqkv);
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int k = k0 + warp * kRowsPerWarp + r;
    if (k >= T_) continue;
    T* row = dqkv + (static_cast<size_t>(b) * T_ + k) * rs + h * D;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (lane + 32 * c < D) {
        row[p.H + lane + 32 * c] = from_float<T>(dk[r][c] * p.scale);
        row[2 * p.H + lane + 32 * c] = from_float<T>(dv[r][c]);
      }
  }
}

// ---- backward pre- and post-passes -------------------------------------------------------
// 8 bf16 / fp16 elements of O and of dO (16 bytes each), multiplied and summed.
template <class T>
__device__ __forceinline__ float dot8(uint4 a, uint4 b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 u, v;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      u = make_float2(__uint_as_float(x[i] << 16), __uint_as_float(x[i] & 0xffff0000u));
      v = make_float2(__uint_as_float(y[i] << 16), __uint_as_float(y[i] & 0xffff0000u));
    } else {
      u = __half22float2(*reinterpret_cast<const __half2*>(&x[i]));
      v = __half22float2(*reinterpret_cast<const __half2*>(&y[i]));
    }
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
  }
  return acc;
}

// dsum[b, h, t] = dO[b, t, h*D : +D] . O[b, t, h*D : +D]; one warp per token (b, t) of the
// padded [B, T] grid, which packed rows (Note [packed attention]) skip past the sequence's end.
// With zero_dq, also zeroes the token's row of the F32 dQ accumulator.
// VEC (bf16 / fp16 where dsum_vec_fits): lane l reads 8 consecutive elements of O and dO a step
// (chunks l, l + 32, ... of the row's H / 8) and the D / 8 lanes of a head sum theirs by shuffles;
// otherwise each lane reads single elements, head by head, summed over the warp. At bert-large's
// sizes the vector form took the backward op from 0.440 to 0.399 ms with the dQ conversion's
// 8-byte stores (bench/results/2026-11-28-h200/session22/).
template <class T, bool VEC = false>
__global__ void __launch_bounds__(256) dsum_kernel(Params p, bool zero_dq) {
  const int64_t bt = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (bt >= static_cast<int64_t>(p.B) * p.T) return;
  const int b = static_cast<int>(bt / p.T), t = static_cast<int>(bt - static_cast<int64_t>(b) * p.T);
  const SeqRows sq = seq_rows(p, b);
  if (t >= sq.len) return;
  const int64_t tok = static_cast<int64_t>(sq.row0) + t;
  const T* o = static_cast<const T*>(p.ctx) + tok * p.H;
  const T* dout = static_cast<const T*>(p.dctx) + tok * p.H;
  float* dsum = p.dsum + static_cast<size_t>(b) * p.heads * p.T + t;  // head h at dsum[h * T]
  if constexpr (VEC) {
    static_assert(sizeof(T) == 2, "8 elements a 16-byte load");
    const uint4* o8 = reinterpret_cast<const uint4*>(o);
    const uint4* dout8 = reinterpret_cast<const uint4*>(dout);
    const int L = p.D / 8, chunks = p.H / 8;
    for (int c0 = 0; c0 < chunks; c0 += 32) {  // uniform trip count: every lane takes part in the shuffles
      const int c = c0 + lane;
      float acc = c < chunks ? dot8<T>(o8[c], dout8[c]) : 0.0f;
      for (int off = L / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (c < chunks && (lane & (L - 1)) == 0) dsum[static_cast<size_t>(c / L) * p.T] = acc;
    }
  } else {
    for (int h = 0; h < p.heads; ++h) {
      float acc = 0.0f;
      for (int d = lane; d < p.D; d += 32) acc = fmaf(to_float(o[h * p.D + d]), to_float(dout[h * p.D + d]), acc);
      for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
      if (lane == 0) dsum[static_cast<size_t>(h) * p.T] = acc;
    }
  }
  if (zero_dq) {
    float4* row = reinterpret_cast<float4*>(p.dq_acc + tok * p.H);  // H % 4 == 0 on this path
    for (int i = lane; i < p.H / 4; i += 32) row[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The vector dsum's shapes: D = 8 L with L a power of two up to 32, H % 8 == 0, rows 16-byte aligned.
bool dsum_vec_fits(const Params& p) {
  const int L = p.D / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(p.ctx) | reinterpret_cast<uintptr_t>(p.dctx)) % 16 == 0;
  return p.D % 8 == 0 && L >= 1 && L <= 32 && (L & (L - 1)) == 0 && p.H % 8 == 0 && aligned;
}

// Note [attention bias gradient]
// The q|k|v bias gradient is the column sums of dqkv as stored (what cuBLASLt's BGRADB epilogue
// or the bias_grad kernel would sum after the fact). The flash backward takes them where dqkv is
// written: each warp of a key tile sums its dK and dV rows (the 16-bit values it stores), the
// CTA adds its warps' sums in shared memory and one partial a column to dbias
// (store_key_grads in attention_tiles.cuh); the dQ conversion below sums its column strip over
// its rows and adds one partial a column a block. The additions are F32 atomics, so the order of
// the partial sums, and the last bits, vary from run to run. What they cost is their number into
// the same addresses: with one partial a warp instead of a CTA (8x as many), bert-large's
// attention backward took 1.2 ms more a step (H200, session 19, call 1).

// dqkv[row, 0:H] = scale * dq_acc[row, :] over the rows of qkv: a block is 32 column quads x 8
// rows (grid x over the quads, y over the rows); packed rows from offsets[B] on get zeros in all
// of q|k|v (Note [packed attention]). With p.dbias, dbias[0:H] += the block's column sums.
// (Done instead by the wgmma backward's last CTA of each head, from L2, it was correct and 7 us
// slower at bert-large's shape: bench/results/2026-11-29-h200/session31/call6-...-not-kept/.)
template <class T>
__global__ void __launch_bounds__(256) dq_convert_kernel(Params p) {
  const int64_t rows = p.offsets ? p.rows : static_cast<int64_t>(p.B) * p.T;
  const int64_t used = p.offsets ? p.offsets[p.B] : rows;
  const int h4 = p.H / 4;  // H % 4 == 0 on this path
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, quad = blockIdx.x * 32 + tx;
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool vec8 = reinterpret_cast<uintptr_t>(p.dqkv) % 8 == 0;  // then every 4-column group is (H % 4 == 0)
  if (quad < h4) {
    for (int64_t tok = static_cast<int64_t>(blockIdx.y) * 8 + ty; tok < rows; tok += static_cast<int64_t>(gridDim.y) * 8) {
      T* out = static_cast<T*>(p.dqkv) + tok * 3 * p.H + 4 * quad;
      if (tok >= used) {
        for (int third = 0; third < 3; ++third)
          for (int e = 0; e < 4; ++e) out[third * p.H + e] = from_float<T>(0.0f);
        continue;
      }
      const float4 v = reinterpret_cast<const float4*>(p.dq_acc)[tok * h4 + quad];
      const float f[4] = {v.x, v.y, v.z, v.w};
      T stored[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        stored[e] = from_float<T>(f[e] * p.scale);
        sum[e] += to_float(stored[e]);  // the value as stored
      }
      if (vec8) {
        *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(stored);
      } else {
        for (int e = 0; e < 4; ++e) out[e] = stored[e];
      }
    }
  }
  if (p.dbias == nullptr) return;  // uniform across the block
  __shared__ float part[8][32][4];
  for (int e = 0; e < 4; ++e) part[ty][tx][e] = sum[e];
  __syncthreads();
  if (ty != 0 || quad >= h4) return;
  for (int e = 0; e < 4; ++e) {
    float s = 0.0f;
    for (int r = 0; r < 8; ++r) s += part[r][tx][e];
    atomicAdd(p.dbias + 4 * quad + e, s);
  }
}

// Packed forward: ctx rows from offsets[B] on (in no sequence) are zeroed.
template <class T>
__global__ void __launch_bounds__(256) zero_tail_rows_kernel(Params p) {
  const int64_t begin = static_cast<int64_t>(p.offsets[p.B]) * p.H, end = static_cast<int64_t>(p.rows) * p.H;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    static_cast<T*>(p.ctx)[i] = from_float<T>(0.0f);
}

// ---- host helpers ------------------------------------------------------------------------
void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  ANATOMY_CHECK(e == cudaSuccess, "attention: launching ", what, " failed: ", cudaGetErrorString(e));
}

size_t align_up(size_t n) { return (n + 255) & ~static_cast<size_t>(255); }

// ANATOMY_ATTENTION=reference forces the reference kernels (tests, debugging).
bool force_reference() { return env_is("ANATOMY_ATTENTION", "reference"); }

// Note [attention scope]: the window, and the queries unless ANATOMY_ATTENTION_QUERIES=all (every
// query computed, for A/Bs).
void set_scope(Params& p, AttentionScope scope) {
  p.window = scope.window;
  p.queries = env_is("ANATOMY_ATTENTION_QUERIES", "all") ? 0 : scope.queries;
}

int smem_optin_limit() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 48 * 1024;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 48 * 1024;
  return v;
}

// Fills the shape part of Params. The arguments' devices, dtypes and shapes were checked by the
// backend's contract (attention_forward / attention_backward in ops/contract.cpp); what is
// checked here are this kernel family's own limits.
Params make_params(const Tensor& qkv, const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& d) {
  Params p;
  p.B = static_cast<int>(qkv.dim(0));
  p.T = static_cast<int>(qkv.dim(1));
  p.H = static_cast<int>(qkv.dim(2) / 3);
  p.heads = heads;
  p.D = p.H / heads;
  ANATOMY_CHECK(p.D >= 1 && p.D <= kMaxD, "attention: head_dim ", p.D, " is not supported (at most ", kMaxD, ")");
  ANATOMY_CHECK(qkv.dim(0) <= 65535 && heads <= 65535 && qkv.dim(1) < (1 << 30),
                "attention: shape ", qkv.shape.str(), " is too large");
  if (mask.defined()) p.mask = mask.ptr<const int32_t>();
  p.qkv = qkv.data;
  p.lse = lse.ptr<float>();
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  if (d.p > 0.0f) {
    p.drop = true;
    p.inv_keep = 1.0f / (1.0f - d.p);
    p.thr = dropout_threshold(d.p);  // >= 1 since p > 0
    p.thr_m1 = static_cast<uint32_t>(static_cast<uint64_t>(p.thr) * 65536u - 1u);
    p.rng_key = dropout_key(d.seed, d.offset);
  }
  return p;
}

dim3 ref_grid(const Params& p) {
  return dim3(static_cast<unsigned>((p.T + kRows - 1) / kRows), static_cast<unsigned>(p.heads),
              static_cast<unsigned>(p.B));
}

template <class T>
void ref_forward(const Params& p, cudaStream_t s) {
  ref_forward_kernel<T><<<ref_grid(p), kThreads, 0, s>>>(p);
  check_launch("attention reference forward");
}

// The F32 cuBLAS path's two [heads, T, T] buffers, after the Dsum part of the scratch.
float* gemm_buffer(void* scratch, const Params& p, int which) {
  const size_t dsum_bytes = align_up(static_cast<size_t>(p.B) * p.heads * p.T * sizeof(float));
  return reinterpret_cast<float*>(static_cast<char*>(scratch) + dsum_bytes + which * align_up(gemm_score_bytes(p.T, p.heads)));
}

// true: the flash kernels ran, and took p.dbias (when set); false: the reference kernels, which
// leave it to the caller.
template <class T>
bool backward_passes(const Params& p, bool fast, bool is_bf16, cudaStream_t s) {
  const int64_t tokens = static_cast<int64_t>(p.B) * p.T;
  const unsigned blocks = static_cast<unsigned>((tokens + 7) / 8);
  if constexpr (sizeof(T) == 2) {
    if (dsum_vec_fits(p)) dsum_kernel<T, true><<<blocks, 256, 0, s>>>(p, fast);
    else dsum_kernel<T><<<blocks, 256, 0, s>>>(p, fast);
  } else {
    dsum_kernel<T><<<blocks, 256, 0, s>>>(p, fast);
  }
  check_launch("attention dsum");
  if (fast && flash_backward(p, is_bf16, smem_optin_limit(), s)) {
    check_launch("attention flash backward");
    const int64_t rows = p.offsets ? p.rows : tokens;
    const unsigned gx = static_cast<unsigned>((p.H / 4 + 31) / 32);
    const int64_t gy = std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, 132 * 8 / gx));
    dq_convert_kernel<T><<<dim3(gx, static_cast<unsigned>(gy)), 256, 0, s>>>(p);
    check_launch("attention dq convert");
    return true;
  }
  ANATOMY_CHECK(p.offsets == nullptr, "attention: the packed backward has no flash kernel for T ", p.T, ", head dim ",
                p.D);  // the reference kernels read the padded layout
  ref_backward_q_kernel<T><<<ref_grid(p), kThreads, 0, s>>>(p);
  check_launch("attention reference backward (dq)");
  ref_backward_kv_kernel<T><<<ref_grid(p), kThreads, 0, s>>>(p);
  check_launch("attention reference backward (dk, dv)");
  return false;
}

}  // namespace
}  // namespace attn

size_t attention_scratch_bytes(int64_t B, int64_t T, int heads, int head_dim, DType dt) {
  return anatomy::attention_scratch_bytes(B, T, heads, head_dim, dt);  // ops/backend_memory.h
}

void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                       const DropoutSpec& d, void* scratch, cudaStream_t s, const AttentionOptions& opt,
                       AttentionScope scope) {
  attn::Params p = attn::make_params(qkv, lse, mask, heads, d);
  attn::set_scope(p, scope);
  // The F32 cuBLAS path has no window; the flash kernels do (Note [window tiles]).
  const bool reference = attn::force_reference() || (p.window > 0 && qkv.dtype == DType::F32);
  p.ctx = ctx.data;
  if (p.B == 0 || p.T == 0) return;
  const bool is_bf16 = qkv.dtype == DType::BF16;
  if (qkv.dtype == DType::F32 && !reference) {
    ANATOMY_CHECK(scratch != nullptr, "attention: the F32 forward needs scratch memory");
    attn::gemm_forward(p, attn::gemm_buffer(scratch, p, 0), opt, s);
    return;
  }
  if (qkv.dtype != DType::F32 && !reference && attn::flash_forward(p, is_bf16, attn::smem_optin_limit(), s)) {
    attn::check_launch("attention flash forward");
    return;
  }
  switch (qkv.dtype) {
    case DType::F32: attn::ref_forward<float>(p, s); break;
    case DType::BF16: attn::ref_forward<__nv_bfloat16>(p, s); break;
    case DType::F16: attn::ref_forward<__half>(p, s); break;
    default: fail("attention: unsupported dtype");
  }
}

namespace {
const char* kernel_family(DType dt, int64_t head_dim, int window, bool forward) {
  if (attn::force_reference()) return "reference";
  if (dt == DType::F32) return window > 0 ? "reference" : "gemm";
  if ((dt != DType::BF16 && dt != DType::F16) || (head_dim != 32 && head_dim != 64 && head_dim != 128)) return "reference";
  attn::Params p;
  p.D = static_cast<int>(head_dim);
  p.window = window;
  return forward ? attn::flash_forward_kernel(p) : attn::flash_backward_kernel(p);
}
}  // namespace

const char* attention_forward_kernel(DType dt, int64_t head_dim, int window) {
  return kernel_family(dt, head_dim, window, true);
}
const char* attention_backward_kernel(DType dt, int64_t head_dim, int window) {
  return kernel_family(dt, head_dim, window, false);
}
int64_t attention_tma_fallbacks() { return attn::tma_fallbacks(); }

void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                        const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& d, void* scratch,
                        cudaStream_t s, const AttentionOptions& opt, AttentionScope scope, const Tensor& dbias,
                        const ReduceScratch& reduce) {
  attn::Params p = attn::make_params(qkv, lse, mask, heads, d);
  attn::set_scope(p, scope);
  const bool reference = attn::force_reference() || (p.window > 0 && qkv.dtype == DType::F32);
  ANATOMY_CHECK(scratch != nullptr, "attention: backward needs scratch memory");
  p.ctx = ctx.data;
  p.dctx = dctx.data;
  p.dqkv = dqkv.data;
  p.dbias = dbias.defined() ? dbias.ptr<float>() : nullptr;
  if (p.B == 0 || p.T == 0) return;
  p.dsum = static_cast<float*>(scratch);
  const size_t dsum_bytes = attn::align_up(static_cast<size_t>(p.B) * p.heads * p.T * sizeof(float));
  p.dq_acc = reinterpret_cast<float*>(static_cast<char*>(scratch) + dsum_bytes);
  const bool fast = qkv.dtype != DType::F32 && !reference && attn::flash_supports(p);
  const bool is_bf16 = qkv.dtype == DType::BF16;
  const bool summed = [&] {
    switch (qkv.dtype) {
      case DType::F32:
        if (reference) {
          attn::backward_passes<float>(p, false, false, s);
        } else {
          const int64_t tokens = static_cast<int64_t>(p.B) * p.T;
          attn::dsum_kernel<float><<<static_cast<unsigned>((tokens + 7) / 8), 256, 0, s>>>(p, false);
          attn::check_launch("attention dsum");
          attn::gemm_backward(p, attn::gemm_buffer(scratch, p, 0), attn::gemm_buffer(scratch, p, 1), opt, s);
        }
        return false;
      case DType::BF16: return attn::backward_passes<__nv_bfloat16>(p, fast, is_bf16, s);
      case DType::F16: return attn::backward_passes<__half>(p, fast, is_bf16, s);
      default: fail("attention: unsupported dtype");
    }
  }();
  // The kernels that do not take the sums (reference, F32 through cuBLAS): the column sums after.
  if (dbias.defined() && !summed) bias_grad(dbias, dqkv, reduce, s);
}

// ---- packed rows (Note [packed attention] in ops/cpu/attention.cpp) --------------------------
bool packed_attention_supported(DType dt, int64_t T, int64_t head_dim) {
  if (dt == DType::F32 || attn::force_reference() || T <= 0 || T >= (1 << 30)) return false;
  return attn::flash_fits(static_cast<int>(T), static_cast<int>(head_dim), attn::smem_optin_limit());
}

namespace {

// The packed call's Params: B, T from lse [B, heads, T]; N rows of qkv [N, 3H].
attn::Params packed_params(const Tensor& qkv, const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& d,
                           AttentionScope scope) {
  const int64_t n = qkv.dim(0);
  ANATOMY_CHECK(lse.dim(0) <= 65535 && heads <= 65535 && lse.dim(2) < (1 << 30) && n < (int64_t{1} << 31),
                "attention: packed shape ", qkv.shape.str(), " with lse ", lse.shape.str(), " is too large");
  // make_params reads B, T, H from a [B, T, 3H] view; the packed rows are its storage.
  attn::Params p = attn::make_params(Tensor(qkv.data, qkv.dtype, {lse.dim(0), lse.dim(2), qkv.dim(1)}, qkv.device), lse,
                                     Tensor(), heads, d);
  p.offsets = offsets.ptr<const int32_t>();
  p.rows = static_cast<int>(n);
  attn::set_scope(p, scope);
  return p;
}

}  // namespace

void attention_packed_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets, int heads,
                              const DropoutSpec& d, cudaStream_t s, AttentionScope scope) {
  attn::Params p = packed_params(qkv, lse, offsets, heads, d, scope);
  p.ctx = ctx.data;
  if (p.B == 0) return;
  ANATOMY_CHECK(attn::flash_forward(p, qkv.dtype == DType::BF16, attn::smem_optin_limit(), s),
                "attention: the packed forward has no kernel for ", qkv.shape.str(), " ", dtype_name(qkv.dtype));
  attn::check_launch("attention packed forward");
  const int64_t tail = static_cast<int64_t>(p.rows) * p.H;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((tail + 255) / 256, 132 * 4));
  switch (qkv.dtype) {
    case DType::BF16: attn::zero_tail_rows_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(p); break;
    case DType::F16: attn::zero_tail_rows_kernel<__half><<<blocks, 256, 0, s>>>(p); break;
    default: fail("attention: the packed forward is BF16 or F16");
  }
  attn::check_launch("attention packed tail");
}

void attention_packed_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& d, void* scratch,
                               cudaStream_t s, AttentionScope scope, const Tensor& dbias) {
  attn::Params p = packed_params(qkv, lse, offsets, heads, d, scope);
  ANATOMY_CHECK(scratch != nullptr, "attention: backward needs scratch memory");
  p.ctx = ctx.data;
  p.dctx = dctx.data;
  p.dqkv = dqkv.data;
  p.dbias = dbias.defined() ? dbias.ptr<float>() : nullptr;  // the flash kernels, the only ones here, take it
  if (p.B == 0) return;
  p.dsum = static_cast<float*>(scratch);
  const size_t dsum_bytes = attn::align_up(static_cast<size_t>(p.B) * p.heads * p.T * sizeof(float));
  p.dq_acc = reinterpret_cast<float*>(static_cast<char*>(scratch) + dsum_bytes);
  ANATOMY_CHECK(qkv.dtype != DType::F32 && attn::flash_supports(p),
                "attention: the packed backward has no kernel for ", qkv.shape.str(), " ", dtype_name(qkv.dtype));
  if (qkv.dtype == DType::BF16)
    attn::backward_passes<__nv_bfloat16>(p, true, true, s);
  else
    attn::backward_passes<__half>(p, true, false, s);
}

}  // namespace anatomy::cuda
