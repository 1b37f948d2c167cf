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
#include "ops/cuda/async_copy.cuh"
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
// moves 128 MB (dy and y in, dsum and dbranch out: ~32 us at 4 TB/s), with some 40 instructions
// an element (two passes, the dropout hash, the column sums), so it needs both bytes in flight
// and warps to issue from. A first version (a warp per row, each lane holding 32 columns of every
// column sum: 240 registers, 8 warps per SM) took 73.7 us (1.8 TB/s) on the H200, and adding
// the bias gradient's sums to it would have spilled.
// So a row is spread over a group of L threads, one 16-byte pack each (P packs at most; L is the
// row's packs rounded up to a warp, at most 128: 24 column sums a thread at H = 1024 bf16), and
// the rows come ahead by cp.async into a ring of kStages [dy row | y row] stages per group in
// shared memory, rstd into each thread's own slot: each thread copies, waits for and reads back
// only its own packs, so the ring needs no barrier. Measured (session18/call3, B 16384 x 1024
// bf16, dropout and the bias gradient fused): 70.1 us with 6 stages, 2 blocks of 256 threads
// per SM; 70.9 with 4; 77.6 holding the next row in registers (512 threads, 1 block per SM);
// 79.2 at 3 blocks per SM without staging (80 registers, spills). Against the first kernel
// plus the separate bias gradient (73.7 + 15.9 us) that is 19.5 us a call saved.
// BERT's widths in half precision (H 768 and 1024) compile the width in (HC): the group's warps,
// the ring's offsets and the pack tests become constants, 1616 -> 1040 static instructions, and
// the call 70.0 -> 62.0 us (dropout and the bias gradient fused; session21/call2).
// The row's two sums meet in shared memory behind a barrier of the group's L threads only
// (bar.sync with a thread count, barrier 1 + group), double-buffered by row parity so that one
// barrier a row suffices: a thread writes a buffer again only after the next row's barrier,
// which every thread of the group reaches after reading it.
// Persistent grid: group g of block b takes rows b*G + g, then + gridDim*G, ... (G groups a
// block); gamma, beta and 1/gamma are staged once per block in shared memory as floats (the
// first pass needs no division: g xhat = dy (y - beta)). The column sums (dgamma, dbeta and,
// when asked, dbias: the sums of dbranch as stored, the bias gradient of the layer that produced
// the branch) accumulate per thread in registers; at the end the block adds its groups in group
// order (16-byte shared accesses) and writes one partial row [dgamma | dbeta (| dbias)] to
// partials[blockIdx.x], which reduce_partials sums in a fixed order. Grid size depends only on
// the SM count and the width, so the result is bitwise the same run to run on a device.
// The per-row math is the CPU twin's: xhat = (y - beta) / gamma, g = dy gamma,
// dsum = rstd (g - mean(g) - xhat mean(g xhat)), recomputed in the second pass from the packed
// inputs instead of being kept as floats (fewer registers).
constexpr int kMaxGroupThreads = 128;  // L at most
constexpr int kMaxGroupWarps = kMaxGroupThreads / 32;
// The two shapes of the group kernel: P = 1 (every half-type width, fp32 up to 512) rows
// staged kStages deep by cp.async, 2 blocks of 256 threads per SM; P = 2 (fp32 past 512) a
// block of 512 threads per SM holding the next row in registers.
constexpr int kStages = 6;
// Note [layernorm backward, two packs a thread]
// Session 20's Nsight Compute run of the kernel above at bert-large's shape (16384 x 1024 bf16,
// dropout and the bias gradient fused) counted 64 instructions an element with the issue slots
// 59% busy: a thread's row work is one 8-element pack, and the per-row costs (the ring's copies
// and wait, the two warp sums, the group barrier, the row offsets) are paid for 8 elements. At
// H = 1024 in half precision a row goes instead to 64 threads of two packs (eight groups a
// block pair, 16 elements a thread for the same per-row costs; 48 column sums a thread in
// registers), the ring 4 stages deep so that two blocks of 256 threads still fit an SM.
// Measured on the H200 in three same-call A/Bs (bench/results/2026-11-28-h200/session26/call3-5):
// 3.19-3.25 -> 3.05-3.08 ms a bert-large step (66 -> 62 us a call), less than halving the
// per-row costs would give if they were most of the time. ANATOMY_LN_BWD=one-pack: the one-pack
// kernel, for A/B. The groups' column sums add the rows in another grouping than the one-pack's:
// the same run to run, not bitwise the one-pack's.
constexpr int kStagesTwoPacks = 4;

// 1/gamma, with 0 where |gamma| < FLT_MIN (that column's xhat is unknown; see the note). A
// subnormal gamma would give an infinite reciprocal.
__device__ __forceinline__ float inv_gamma(float g) { return fabsf(g) < 1.17549435e-38f ? 0.0f : 1.0f / g; }

// One row as a thread holds it: packs q = p*L + t (< packs) of dy and y, and rstd.
template <class T, int P>
struct RowIn {
  Pack<T, kVec<T>> d[P], x[P];
  float rs;
};

template <class T, int P>
__device__ __forceinline__ void load_row(RowIn<T, P>& in, const T* __restrict__ dy, const T* __restrict__ y,
                                         const float* __restrict__ rstd, int64_t row, int h, int t, int L) {
  using V = Pack<T, kVec<T>>;
  const int packs = h / kVec<T>;
  const size_t base = static_cast<size_t>(row) * h;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * L + t;
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

// Shared memory of the group kernel, in floats: gamma | beta | 1/gamma [3H], then the row sums'
// slots (float2 [groups][2 parities][4 warps]); with S stages, each group's ring of S [dy row |
// y row] of T and S x L rstd slots. When reducing, the same memory then holds each group's column
// sums [groups][sums][H] (at least that much).
inline size_t group_smem_bytes(int h, int sums, int groups, int S, size_t elem, int L) {
  const size_t rows = 3 * static_cast<size_t>(h) * sizeof(float) + static_cast<size_t>(groups) * 2 * kMaxGroupWarps * 8 +
                      static_cast<size_t>(groups) * S * (2 * h * elem + static_cast<size_t>(L) * sizeof(float));
  return std::max(rows, static_cast<size_t>(groups) * sums * h * sizeof(float));
}

// Per row, with t = y - beta (so g xhat = dy t, and no division in the first pass):
//   mean(g) and mean(dy t); then dsum = rstd (dy gamma - mean(g) - t / gamma mean(dy t)).
// dgamma accumulates dy t per column and is divided by gamma once, at the end. `sums` is the
// partial row's count of column sums: 2 (dgamma, dbeta) or 3 (and dbias, from dbranch).
// HC: the width when known at compile time (0: h_arg), the row then exactly L = HC / (P W)
// threads of P packs each, so that the group's warps, the ring's offsets and every pack test fold
// into constants.
template <class T, class G, int P, int kThreads, int kMinBlocks, int S, int HC = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks) ln_backward_group(
    T* __restrict__ dsum, T* __restrict__ dbranch, float* __restrict__ partials, const T* __restrict__ dy,
    const T* __restrict__ y, const float* __restrict__ rstd, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h_arg, int L_arg, int sums, Drop drop) {
  constexpr int W = kVec<T>;
  static_assert(HC == 0 || (HC % (P * 32 * W) == 0 && HC / (P * W) <= kMaxGroupThreads));
  const int h = HC ? HC : h_arg;
  const int L = HC ? HC / (P * W) : L_arg;
  using V = Pack<T, W>;
  extern __shared__ float4 shared4[];
  float* shared = reinterpret_cast<float*>(shared4);
  float* s_gamma = shared;
  float* s_beta = s_gamma + h;
  float* s_inv = s_beta + h;
  float2* s_rows = reinterpret_cast<float2*>(s_inv + h);
  for (int c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = to_f32(gamma[c]);
    s_gamma[c] = g;
    s_beta[c] = to_f32(beta[c]);
    s_inv[c] = inv_gamma(g);
  }
  __syncthreads();
  const int groups = (HC ? kThreads : static_cast<int>(blockDim.x)) / L, group = threadIdx.x / L, t = threadIdx.x - group * L;
  const int lane = t & 31, warp = t >> 5, warps = L >> 5;
  const int packs = h / W;
  const bool bias_sums = sums == 3;
  const float inv_h = 1.0f / h;
  float dg[P][W], db[P][W], dz[P][W];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int j = 0; j < W; ++j) dg[p][j] = db[p][j] = dz[p][j] = 0.0f;

  const int64_t step = static_cast<int64_t>(gridDim.x) * groups;
  int64_t row = static_cast<int64_t>(blockIdx.x) * groups + group;
  int parity = 0;
  // S > 0: rows S - 1 ahead by cp.async into the group's ring of S stages [dy row | y row], and
  // each thread's rstd into its own slot; a thread reads back only what it copied. S == 0: the
  // next row in registers (`next`), loaded before the current row's arithmetic.
  T* rings = reinterpret_cast<T*>(s_rows + groups * 2 * kMaxGroupWarps);  // every group's, then the rstd slots
  T* ring = rings + static_cast<size_t>(group) * S * 2 * h;
  float* rs_ring = reinterpret_cast<float*>(rings + static_cast<size_t>(groups) * S * 2 * h) + group * S * L;
  auto issue = [&](int64_t r, int slot) {
    if (r < rows) {
      const size_t base = static_cast<size_t>(r) * h;
      T* sd = ring + static_cast<size_t>(slot) * 2 * h;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int q = p * L + t;
        if (q < packs) {
          cp_async16(smem_addr(sd + q * W), dy + base + q * W);
          cp_async16(smem_addr(sd + h + q * W), y + base + q * W);
        }
      }
      cp_async4(smem_addr(rs_ring + slot * L + t), rstd + r);
    }
    cp_async_commit();  // every thread commits every time (maybe empty): the wait counts stay uniform
  };
  int slot = 0;
  if constexpr (S > 0)
    for (int k = 0; k + 1 < S; ++k) issue(row + k * step, k);
  RowIn<T, P> cur;
  if (S == 0 && row < rows) load_row(cur, dy, y, rstd, row, h, t, L);
  // Every group of the block runs as many rows as its group 0 (the most), a group past the end
  // on a row of zeros (dy = 0 and rstd = 0: it adds nothing to the column sums and stores
  // nothing), so that all groups reach their barriers alike. (With one row fewer for some groups
  // compute-sanitizer's racecheck reported hazards between accesses a __syncthreads separates:
  // session26/call3-lnbwd, call4-lnbwd-mbcheck.)
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups;
  const int64_t iters = first < rows ? (rows - first + step - 1) / step : 0;
  for (int64_t it = 0; it < iters; ++it, row += step) {
    const bool valid = row < rows;
    RowIn<T, P> next;
    if constexpr (S > 0) {
      issue(row + (S - 1) * step, slot == 0 ? S - 1 : slot - 1);
      cp_async_wait<S - 1>();
      const T* sd = ring + static_cast<size_t>(slot) * 2 * h;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int q = p * L + t;
        if (q < packs) {
          cur.d[p] = *reinterpret_cast<const V*>(sd + q * W);
          cur.x[p] = *reinterpret_cast<const V*>(sd + h + q * W);
        }
      }
      cur.rs = rs_ring[slot * L + t];
      slot = slot + 1 == S ? 0 : slot + 1;
    } else if (row + step < rows) {
      load_row(next, dy, y, rstd, row + step, h, t, L);
    }
    if (!valid) cur = RowIn<T, P>{};
    const float rs = cur.rs;
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int q = p * L + t;
      if (q < packs) {
        float gv[W], bv[W];
        load_floats<W>(gv, s_gamma + q * W);
        load_floats<W>(bv, s_beta + q * W);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float dyv = to_f32(cur.d[p].v[j]);
          const float tv = to_f32(cur.x[p].v[j]) - bv[j];
          sg += dyv * gv[j];
          sgx += dyv * tv;
          dg[p][j] += dyv * tv;
          db[p][j] += dyv;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // the two warp sums interleaved
      sg += __shfl_xor_sync(0xffffffffu, sg, o);
      sgx += __shfl_xor_sync(0xffffffffu, sgx, o);
    }
    if (warps > 1) {  // the group's warps in warp order, the same sums in every thread
      float2* slot = s_rows + (group * 2 + parity) * kMaxGroupWarps;
      if (lane == 0) slot[warp] = make_float2(sg, sgx);
      named_barrier(1 + group, L);
      float2 s = slot[0];
      for (int w = 1; w < warps; ++w) {
        const float2 o = slot[w];
        s.x += o.x;
        s.y += o.y;
      }
      sg = s.x;
      sgx = s.y;
      parity ^= 1;
    }
    const float mg = sg * inv_h, mgx = sgx * inv_h;
    const size_t base = static_cast<size_t>(row) * h;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int q = p * L + t;
      if (q < packs) {
        V o, ob;
#pragma unroll
        for (int j0 = 0; j0 < W; j0 += 4) {  // four columns at a time: fewer live registers
          float f[4], gv[4], bv[4], iv[4];
          load_floats<4>(gv, s_gamma + q * W + j0);
          load_floats<4>(bv, s_beta + q * W + j0);
          load_floats<4>(iv, s_inv + q * W + j0);
          if (dbranch) drop.factors<4>(f, base + static_cast<size_t>(q) * W + j0);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int j = j0 + k;
            const float xhat = (to_f32(cur.x[p].v[j]) - bv[k]) * iv[k];
            const float d = rs * (to_f32(cur.d[p].v[j]) * gv[k] - mg - xhat * mgx);
            o.v[j] = from_f32<T>(d);
            if (dbranch) {
              ob.v[j] = from_f32<T>(d * f[k]);
              if (bias_sums) dz[p][j] += to_f32(ob.v[j]);
            }
          }
        }
        if (valid) {
          reinterpret_cast<V*>(dsum + base)[q] = o;
          if (dbranch) reinterpret_cast<V*>(dbranch + base)[q] = ob;
        }
      }
    }
    if constexpr (S == 0) cur = next;
  }
  if constexpr (S > 0) cp_async_wait_all();  // nothing in flight past the end (empty groups)
  if (!partials) return;  // uniform across the grid
  // dgamma = sum dy t / gamma: divide each column once.
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = p * L + t;
    if (q < packs) {
      float iv[W];
      load_floats<W>(iv, s_inv + q * W);
#pragma unroll
      for (int j = 0; j < W; ++j) dg[p][j] *= iv[j];
    }
  }
  // Each group's column sums into its own slice [group][sums][H] of the shared memory (the
  // staging above is done with: after a barrier every thread is past its rows and its reads of
  // 1/gamma), 16 bytes at a time (W is a multiple of 4); then each thread adds the groups of its
  // columns in group order and writes the block's partial row.
  __syncthreads();
  float4* slice = shared4 + static_cast<size_t>(group) * sums * (h / 4) + t * (W / 4);
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (p * L + t < packs)
#pragma unroll
      for (int j = 0; j < W; j += 4) {
        float4* c = slice + (p * L * W + j) / 4;  // column (p L + t) W + j
        c[0] = make_float4(dg[p][j], dg[p][j + 1], dg[p][j + 2], dg[p][j + 3]);
        c[h / 4] = make_float4(db[p][j], db[p][j + 1], db[p][j + 2], db[p][j + 3]);
        if (bias_sums) c[h / 2] = make_float4(dz[p][j], dz[p][j + 1], dz[p][j + 2], dz[p][j + 3]);
      }
  __syncthreads();
  float* out = partials + static_cast<size_t>(blockIdx.x) * sums * h;
  const int row_floats = sums * h;
  for (int c = threadIdx.x; c < row_floats; c += blockDim.x) {
    float a = shared[c];
    for (int gi = 1; gi < groups; ++gi) a += shared[static_cast<size_t>(gi) * row_floats + c];
    out[c] = a;
  }
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
// partial row: part[c] (dgamma), part[H + c] (dbeta) and, with sums = 3, part[2H + c] (dbias),
// which it alone zeroes, reads and writes, so no barrier is needed for them. (Zeroing [0, 2H) by
// thread index instead handed part[H + c] to another thread without a barrier: a race that
// compute-sanitizer's serialized schedule exposed as wrong dbeta.)
template <class T, class G>
__global__ void __launch_bounds__(kBlockThreads) ln_backward_block(
    T* __restrict__ dsum, T* __restrict__ dbranch, float* __restrict__ partials, const T* __restrict__ dy,
    const T* __restrict__ y, const float* __restrict__ rstd, const G* __restrict__ gamma,
    const G* __restrict__ beta, int64_t rows, int h, int sums, Drop drop) {
  __shared__ float red[32];
  float* part = partials ? partials + static_cast<size_t>(blockIdx.x) * sums * h : nullptr;
  if (part)
    for (int c = threadIdx.x; c < h; c += blockDim.x)
      for (int k = 0; k < sums; ++k) part[k * h + c] = 0.0f;
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
      if (dbranch) {
        const T b = from_f32<T>(d * drop.factor(base + c));
        dbranch[base + c] = b;
        if (sums == 3) part[2 * h + c] += to_f32(b);
      }
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
                        const Tensor& dbias, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                        const Tensor& gamma, const Tensor& beta, const DropoutSpec& d, const ReduceScratch& scratch,
                        cudaStream_t s) {
  const int h = static_cast<int>(dy.dim(-1));
  const int64_t rows = h ? static_cast<int64_t>(dy.numel()) / h : 0;
  if (rows == 0) return;
  const Drop drop = make_drop(d);
  const bool reduce = dgamma.defined() || dbeta.defined() || dbias.defined();
  const int sums = dbias.defined() ? 3 : 2;  // the partial row: dgamma | dbeta (| dbias)
  // Partial rows: as many blocks as keep the device busy, as the scratch allows.
  const int64_t cap = static_cast<int64_t>(scratch.floats) / (sums * static_cast<int64_t>(h));
  ANATOMY_CHECK(!reduce || cap >= 1, "internal error: layernorm_backward scratch of ", scratch.floats,
                " floats is below ", sums, "H = ", sums * h);
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
      float* partials = reduce ? scratch.data : nullptr;
      // The group path (Note [layernorm backward at bandwidth]) where 16-byte packs fit: L threads
      // a row, P packs each; else the block path, a block per row, at most 4 per SM when reducing.
      const int packs = packs_per_lane<T>(h, {dsp, dbp, dyp, yp, gp, btp}) ? h / kVec<T> : 0;
      const int L = std::min(kMaxGroupThreads, (packs + 31) / 32 * 32);
      const int P = packs ? (packs + L - 1) / L : 0;
      int64_t blocks = rows;
      if (P == 0) {
        if (reduce) blocks = std::min<int64_t>({blocks, 4 * static_cast<int64_t>(sm_count()), cap});
        ln_backward_block<T, G><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kBlockThreads, 0, s>>>(
            dsp, dbp, partials, dyp, yp, rstd.ptr<const float>(), gp, btp, rows, h, sums, drop);
      } else {
        auto launch = [&](auto kernel, int threads, int per_sm, int stages, int L) {
          const int groups = threads / L;
          blocks = std::min<int64_t>((rows + groups - 1) / groups, static_cast<int64_t>(per_sm) * sm_count());
          if (reduce) blocks = std::min(blocks, cap);
          const size_t smem = group_smem_bytes(h, reduce ? sums : 0, groups, stages, sizeof(T), L);
          if (smem > 48 * 1024)
            ANATOMY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(smem)));
          kernel<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), groups * L, smem, s>>>(
              dsp, dbp, partials, dyp, yp, rstd.ptr<const float>(), gp, btp, rows, h, L, sums, drop);
        };
        // Half types hold at most 128 packs a row at H <= 1024: P is 1; fp32 up to 2. BERT's
        // widths in half precision get the compile-time width; at 1024, two packs a thread
        // (Note [layernorm backward, two packs a thread]).
        auto launch_width = [&](auto hc) {
          launch(ln_backward_group<T, G, 1, 256, 2, kStages, decltype(hc)::value>, 256, 2, kStages, L);
        };
        constexpr bool half = sizeof(T) == 2;
        const bool one_pack = env_is("ANATOMY_LN_BWD", "one-pack");
        if (half && P == 1 && h == 1024 && !one_pack)
          launch(ln_backward_group<T, G, 2, 256, 2, kStagesTwoPacks, half ? 1024 : 0>, 256, 2, kStagesTwoPacks, 64);
        else if (half && P == 1 && h == 1024)
          launch_width(std::integral_constant<int, half ? 1024 : 0>{});
        else if (half && P == 1 && h == 768)
          launch_width(std::integral_constant<int, half ? 768 : 0>{});
        else if (P == 1)
          launch_width(std::integral_constant<int, 0>{});
        else if constexpr (sizeof(T) == 4)
          launch(ln_backward_group<T, G, 2, 512, 1, 0>, 512, 1, 0, L);
      }
      ANATOMY_CUDA_LAUNCH_CHECK();
      if (reduce) {
        const int groups_out = static_cast<int>(std::max<int64_t>(blocks, 1));
        const int64_t stride = sums * static_cast<int64_t>(h);
        auto out = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
        reduce_partials(out(dgamma), out(dbeta), out(dbias), partials, groups_out, h, stride, s);
      }
    });
  });
}

}  // namespace anatomy::cuda
