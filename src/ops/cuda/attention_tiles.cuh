// Tiles and PTX wrappers shared by the attention fast paths (attention_flash.cu: mma.sync;
// attention_wgmma.cu: Hopper wgmma).
//
// Shared-memory tiles are [rows][D] of 16-bit elements, D / 8 chunks of 16 bytes per row.
// With D >= 64 (8 or 16 chunks, a row covers all 8 bank groups), chunk c of row r is stored at
// chunk position c ^ (r & 7) (XOR swizzle); with D = 32 (4 chunks: rows 2i and 2i+1 share one
// 128-byte line, halves 0-3 and 4-7), at c ^ ((r >> 1) & 3). Either way the 8 rows an ldmatrix
// phase reads at one chunk, and the 8 rows a cp.async phase writes, hit 8 distinct bank groups.
// For D = 64 this is exactly the 128-byte swizzle of TMA and wgmma (address bits [4:6] ^= bits
// [7:9]) and for D = 32 the 64-byte one (bits [4:5] ^= [7:8]), so a tile whose base is 1024-byte
// aligned is also a wgmma operand in the canonical swizzled layout.
//
// Note [paired rows]
// Dropout decides a 2x2 block (queries {q, q+1} x keys {k, k+1}, q and k even) with one hash
// (Note [attention dropout index] in core/rng.h). The C fragment gives a thread two adjacent
// columns (2t, 2t+1) but rows g and g+8, eight apart. So the tile on the row side of the S
// product (Q in the forward, K and V in the backward) is loaded with its rows permuted within
// each 16-row slice: fragment row r holds token perm16(r), perm16(r) = 2r for r < 8 and
// 2(r-8)+1 above, and a thread's rows g, g+8 are the tokens 2g, 2g+1 of the slice. A thread
// then holds whole 2x2 blocks: one hash for its four elements of each n-tile, no exchange
// between lanes. Only the token of a fragment row changes (key bias, dropout counter, output
// row); every product pairs rows of the same permuted tile, so nothing else notices.
#pragma once
#include <cmath>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/attention_common.cuh"

namespace anatomy::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- PTX wrappers (cp.async copies, commit and wait: ops/cuda/async_copy.cuh) ---------------

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b (16x16 * 16x8, fp32 accumulate).
template <bool BF16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two 16-bit values (lo in the low half).
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// acc[e] += element e of eight 16-bit floats (bf16 or fp16) packed in q, as float.
template <bool BF16>
__device__ __forceinline__ void add_halves(float (&acc)[8], const uint4& q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (BF16) {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
    } else {
      acc[2 * i] += __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
      acc[2 * i + 1] += __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
    }
  }
}

__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
}
// Four floats at a 16-byte aligned address (sm_90).
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][D] 16-bit tile.
template <int D>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  static_assert(D == 32 || D == 64 || D == 128, "tiles are 4, 8 or 16 chunks wide");
  const int x = D == 32 ? (r >> 1) & 3 : r & 7;
  return static_cast<uint32_t>(r * (D * 2) + ((c ^ x) << 4));
}

// Fragment row r of a 16-row slice holds token perm16(r) of the slice (Note [paired rows]).
__device__ __forceinline__ int perm16(int r) { return (r & ~15) | ((r & 7) << 1) | ((r >> 3) & 1); }

// Async copy of rows [row0, row0 + R) of a strided [T][D] 16-bit matrix into a swizzled tile
// (PAIRED: tile row r holds token row0 + perm16(r)); rows at or past T are zero-filled.
template <int R, int D, int NTH, bool PAIRED = false>
__device__ __forceinline__ void load_tile(uint32_t tile, const uint16_t* base, size_t stride, int row0, int T) {
  constexpr int CPR = D / 8;  // chunks per row
#pragma unroll
  for (int i = threadIdx.x; i < R * CPR; i += NTH) {
    const int r = i / CPR, c = i % CPR, t = row0 + (PAIRED ? perm16(r) : r);
    const bool ok = t < T;
    const uint16_t* src = base + static_cast<size_t>(ok ? t : 0) * stride + c * 8;
    cp_async16(tile + swz<D>(r, c), src, ok);
  }
}

// One past the last valid key of batch b (T without a mask; 0 when no key is valid). Keys at or
// past it are masked: their probabilities are exactly 0, so tiles of them contribute nothing to
// O, dK, dV or dQ and are skipped (Note [masked key tiles]). Every thread of the CTA must call it.
template <int NTH>
__device__ int valid_key_end(const int32_t* mask, int b, int T) {
  if (mask == nullptr) return T;
  __shared__ int end;
  if (threadIdx.x == 0) end = 0;
  __syncthreads();
  int last = 0;
  for (int k = threadIdx.x; k < T; k += NTH)
    if (mask[static_cast<size_t>(b) * T + k] != 0) last = k + 1;
  if (last > 0) atomicMax(&end, last);
  __syncthreads();
  return end;
}

// Note [masked key tiles]
// A padded batch of real text is mostly padding keys. The forward's loop over key tiles stops
// at the tile holding the batch's last valid key, and a backward CTA whose keys all lie past
// it writes dK = dV = 0 (their exact value: P = 0 there) and leaves. The skipped terms are exact
// zeros (exp2(-inf) = 0 in the running sums; no dQ contribution), so results are bit for bit
// those of the full loops; attention costs B * T * (valid keys) rather than B * T^2. A batch
// with no valid key attends uniformly to all T keys and skips nothing. Query rows are never
// skipped: padding rows get their (unread) outputs as before.

// Note [window tiles]
// With a local window w (Note [local attention window], ops/cpu/attention.cpp), query q keeps
// key k only when |q - k| <= w and the mask keeps k, and a query whose window holds no valid
// key ("uniform row") scores 0 against every key below T, as a fully padded batch does. The
// kernels keep a bit per key (valid or not) in shared memory, find the uniform rows from it
// (O(w / 32) words per row), and then:
// - score tiles: an element outside its query's window gets -inf (a uniform row: 0 below T),
//   only on tiles that are not wholly inside every window of the warp's rows and columns;
// - forward: a CTA without uniform rows loads only the key tiles that meet the union of its
//   rows' windows (and lie before the last valid key); one with a uniform row, all. A warp
//   computes only the tiles that meet its own rows' windows (all, when it has a uniform row);
// - backward: a key CTA visits the query tiles whose windows meet its keys, plus every query
//   tile holding a uniform row (those see all keys); with all its keys masked, only the latter.
// Skipped tiles hold only -inf scores for the rows that see them, so, as in Note [masked key
// tiles], results are those of the full loops. Dropout groups are indexed by the tile, not by
// the visit, so the kept elements are the reference kernels'.

// bits[i] bit l: key 32i + l is valid (below T, kept by the mask or no mask), for keys [0, n),
// n a multiple of 32. Every thread of the CTA must call it; a barrier must follow.
template <int NTH>
__device__ void build_valid_bits(uint32_t* bits, const int32_t* mask, int b, int T, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int base = warp * 32; base < n; base += NTH) {
    const int k = base + lane;
    const bool v = k < T && (mask == nullptr || mask[static_cast<size_t>(b) * T + k] != 0);
    const uint32_t word = __ballot_sync(0xffffffffu, v);
    if (lane == 0) bits[base >> 5] = word;
  }
}

// Whether query q (< T) has no valid key in its window [q - w, q + w] (Note [window tiles]).
__device__ __forceinline__ bool window_uniform(const uint32_t* bits, int q, int T, int w) {
  if (q >= T) return false;
  const int lo = q - w > 0 ? q - w : 0, hi = q + w < T - 1 ? q + w : T - 1;
  for (int i = lo >> 5; i <= hi >> 5; ++i) {
    uint32_t x = bits[i];
    if (i == lo >> 5) x &= 0xffffffffu << (lo & 31);
    if (i == hi >> 5) x &= 0xffffffffu >> (31 - (hi & 31));
    if (x != 0) return false;
  }
  return true;
}

// Score (log2 domain) of an element of a windowed tile: `x` as computed with the key bias,
// -inf outside the query's window, 0 (below T) in a uniform row.
__device__ __forceinline__ float window_score(float x, int q, int k, int T, int w, bool uniform) {
  if (uniform) return k < T ? 0.0f : -INFINITY;
  const int d = k - q;
  return (d > w || d < -w) ? -INFINITY : x;
}

// Per-key additive bias (log2 domain) for keys [0, nk): 0 for a valid key, -inf for a
// masked key or a key at or past T. When batch b has no valid key (any_valid: valid_key_end's
// result is positive), every key below T gets 0 and the caller multiplies the scores by 0
// (uniform row).
__device__ __forceinline__ void build_key_bias(float* kb, const int32_t* mask, int b, int T, int k_begin, int nk, bool any_valid) {
  for (int i = threadIdx.x; i < nk; i += blockDim.x) {
    const int k = k_begin + i;
    float v = -INFINITY;
    if (k < T) {
      const bool valid = mask == nullptr || mask[static_cast<size_t>(b) * T + k] != 0;
      v = (valid || !any_valid) ? 0.0f : -INFINITY;
    }
    kb[i] = v;
  }
}


// ---- the forward's query tile ---------------------------------------------------------------
// Head h's q, k and v columns of sequence sq (rows rs = 3H elements apart).
struct HeadQkv {
  const uint16_t *q, *k, *v;
  size_t rs;
};
__device__ __forceinline__ HeadQkv head_qkv(const Params& p, const SeqRows& sq, int h) {
  const size_t rs = 3 * static_cast<size_t>(p.H);
  const uint16_t* q = static_cast<const uint16_t*>(p.qkv) + sq.row0 * rs + static_cast<size_t>(h) * p.D;
  return {q, q + p.H, q + 2 * p.H, rs};
}

// Packed rows: a forward CTA whose queries [q0, q0 + BR) all lie past its sequence's TK tokens
// writes their lse entries (0) and has nothing else to do; returns whether that is the case.
template <int BR, int NTH>
__device__ __forceinline__ bool forward_tile_absent(const Params& p, int b, int h, int q0, int TK) {
  if (q0 < TK) return false;
  for (int i = threadIdx.x; i < BR && q0 + i < p.T; i += NTH) p.lse[(static_cast<size_t>(b) * p.heads + h) * p.T + q0 + i] = 0.0f;
  return true;
}

// Note [attention scope] (ops/op_args.h): a forward CTA whose queries [q0, q0 + BR) all lie past
// the first p.queries of its sequence writes their context rows as zeros and their lse as +inf
// (0 at or past TK, as forward_tile_absent does), and has nothing else to do; returns whether that
// is the case. Its key and value reads, scores and dropout are skipped.
template <int BR, int D, int NTH>
__device__ __forceinline__ bool forward_tile_out_of_scope(const Params& p, const SeqRows& sq, int b, int h, int q0,
                                                          int TK) {
  if (p.queries <= 0 || q0 < p.queries) return false;
  float* lse = p.lse + (static_cast<size_t>(b) * p.heads + h) * p.T;
  for (int i = threadIdx.x; i < BR && q0 + i < p.T; i += NTH) lse[q0 + i] = q0 + i < TK ? INFINITY : 0.0f;
  uint4* ctx = reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.ctx) + sq.row0 * p.H + static_cast<size_t>(h) * D);
  constexpr int CPR = D / 8;  // 16-byte chunks of a row
  const size_t row_chunks = static_cast<size_t>(p.H) / 8;
  for (int i = threadIdx.x; i < BR * CPR && q0 + i / CPR < TK; i += NTH)
    ctx[static_cast<size_t>(q0 + i / CPR) * row_chunks + i % CPR] = make_uint4(0, 0, 0, 0);
  return true;
}

// Stores the warp's `rows` rows from `row0` of an O tile staged in shared memory (swizzled [rows][D],
// fragment row r holding query q0 + perm16(r)) to ctx, 16 bytes a lane; queries at or past TK
// are not stored.
template <int D>
__device__ __forceinline__ void store_o_rows(const unsigned char* tile, int row0, int rows, int q0, int TK,
                                             const Params& p, const SeqRows& sq, int h, int lane) {
  uint16_t* ctx = static_cast<uint16_t*>(p.ctx) + sq.row0 * p.H + static_cast<size_t>(h) * D;
  constexpr int CPR = D / 8;
  for (int i = lane; i < rows * CPR; i += 32) {
    const int row = row0 + i / CPR, c = i % CPR, q = q0 + perm16(row);
    if (q < TK)
      *reinterpret_cast<uint4*>(ctx + static_cast<size_t>(q) * p.H + c * 8) = *reinterpret_cast<const uint4*>(tile + swz<D>(row, c));
  }
}

// ---- the backward's key tile ----------------------------------------------------------------
// The backward kernels (attention_flash.cu, attention_wgmma_bwd.cu): a CTA owns BC keys from k0
// (64, or 128 for two warpgroups), a warp 16 of them, a thread the fragment rows g, g + 8 = keys
// 2g, 2g + 1 of its warp's 16.

// Note [masked key tiles]: keys that are all masked have dK = dV = 0 (stored here, below TK).
template <int D, int BC, int NTH>
__device__ void zero_key_grads(const Params& p, const SeqRows& sq, int h, int k0, int TK) {
  uint16_t* dqkv = static_cast<uint16_t*>(p.dqkv);
  const size_t rs = 3 * static_cast<size_t>(p.H);
  constexpr int CPR = D / 8;
  for (int i = threadIdx.x; i < BC * CPR; i += NTH) {
    const int k = k0 + i / CPR, c = i % CPR;
    if (k >= TK) continue;
    uint16_t* dst = dqkv + (sq.row0 + k) * rs + h * D + c * 8;
    *reinterpret_cast<uint4*>(dst + p.H) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + 2 * p.H) = make_uint4(0, 0, 0, 0);
  }
}

// The key bias (0 or -inf, as build_key_bias) of keys k and k + 1 into kbias; any_valid: batch b
// has a valid key (valid_key_end's result is positive).
__device__ __forceinline__ void key_pair_bias(float (&kbias)[2], const Params& p, int b, int k, int TK, bool any_valid) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float v = -INFINITY;
    if (k + hf < TK) {
      const bool valid = p.mask == nullptr || p.mask[static_cast<size_t>(b) * p.T + k + hf] != 0;
      v = (valid || !any_valid) ? 0.0f : -INFINITY;
    }
    kbias[hf] = v;
  }
}

// Async copies of query tile jt's lse and Dsum (BR each, by the first BR threads and the next BR)
// into f32 arrays; rows at or past TK zero.
template <int BR>
__device__ __forceinline__ void load_query_stats(uint32_t lse_dst, uint32_t dsum_dst, const float* lse_g,
                                                 const float* dsum_g, int jt, int TK) {
  const int i = threadIdx.x & (BR - 1), q = jt * BR + i;
  const bool ok = q < TK;
  if (threadIdx.x < BR)
    cp_async4(lse_dst + i * 4, lse_g + (ok ? q : 0), ok);
  else if (threadIdx.x < 2 * BR)
    cp_async4(dsum_dst + i * 4, dsum_g + (ok ? q : 0), ok);
}

// Async copies of query tile jt (BR queries): Q and dO into swizzled tiles, lse and Dsum
// (load_query_stats); rows at or past TK zero.
template <int BR, int D, int NTH>
__device__ __forceinline__ void load_query_tile(uint32_t q_dst, uint32_t do_dst, uint32_t lse_dst, uint32_t dsum_dst,
                                                const HeadQkv& x, const uint16_t* dog, const Params& p,
                                                const float* lse_g, const float* dsum_g, int jt, int TK) {
  static_assert(NTH >= 2 * BR, "lse by the first BR threads, Dsum by the next BR");
  load_tile<BR, D, NTH>(q_dst, x.q, x.rs, jt * BR, TK);
  load_tile<BR, D, NTH>(do_dst, dog, p.H, jt * BR, TK);
  load_query_stats<BR>(lse_dst, dsum_dst, lse_g, dsum_g, jt, TK);
}

// Dropout counters of a backward thread (Note [paired rows]): its 2x2 block of n-tile n of query
// tile j (keys k0 + 16 warp + 2g + {0, 1} x queries j*BR + 8n + 2 t4 + {0, 1}) is the group
// (bh*tp + q/2)*tp + k/2; zk + j (BR/2) zstep is rng_key + (that group at n = 0) * kGolden, and
// one query pair further is zstep.
struct KeyRowDropout {
  uint64_t zk, zstep;
};
__device__ __forceinline__ KeyRowDropout key_row_dropout(const Params& p, size_t bh, int k0, int warp, int g, int t4) {
  const uint64_t tp = (static_cast<uint64_t>(p.T) + 1) >> 1;
  return {p.rng_key + ((bh * tp + t4) * tp + static_cast<uint64_t>(k0 / 2 + warp * 8 + g)) * kGolden, tp * kGolden};
}

// The backward's element-wise step on one n-tile of the transposed frame (the thread's key rows
// 2g, 2g + 1 x query columns c, c + 1; element e is key 2g + (e >> 1), query c + (e & 1)): the
// scores s (K Q^T) become P Z' (for dV), dp (V dO^T) becomes dS = P (Z dP / (1 - p) - Dsum).
// bits: the block's dropout bits, element e field 2 (e & 1) + (e >> 1); lse, dsum: the query
// tile's rows from column c; window(x, e): element e's log2 score x after a local window.
template <bool DROP, class Window>
__device__ __forceinline__ void backward_elements(float* s, float* dp, uint64_t bits, const float* lse,
                                                  const float* dsum, float scale_mul, const float (&kbias)[2],
                                                  const Params& p, Window window) {
  [[maybe_unused]] bool keep[4] = {true, true, true, true};
  if constexpr (DROP) keep4(keep, bits, p.thr_m1);
  const float2 L = *reinterpret_cast<const float2*>(lse);
  const float2 Dv = *reinterpret_cast<const float2*>(dsum);
  const float lse2[2] = {L.x * kLog2e, L.y * kLog2e};
  const float dsv[2] = {Dv.x, Dv.y};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float pr = fast_exp2(window(fmaf(s[e], scale_mul, kbias[e >> 1]), e) - lse2[e & 1]);
    float dpv = dp[e], pz = pr;
    if constexpr (DROP) {
      const bool kp = keep[2 * (e & 1) + (e >> 1)];
      pz = kp ? pr : 0.0f;
      dpv = kp ? dpv * p.inv_keep : 0.0f;
    }
    s[e] = pz;
    dp[e] = pr * (dpv - dsv[e & 1]);
  }
}

// Stores dK * dk_mul and dV * dv_mul of the warp's 16 keys (dk(n, e), dv(n, e): element e of
// n-tile n of the accumulators, rows g, g + 8, columns 8n + 2 t4 + {0, 1}), staged through the
// warp's own rows of the K and V tiles (whose readers must be done), 16 bytes a lane. Warp w of
// the CTA's NTH / 32 stores keys [16 w, 16 w + 16).
template <bool BF16, int D, int NTH, class AccK, class AccV>
__device__ __forceinline__ void store_key_grads(AccK dk, AccV dv, float dk_mul, float dv_mul, unsigned char* k_tile,
                                                unsigned char* v_tile, const Params& p, const SeqRows& sq, int h,
                                                int k0, int TK) {
  static_assert(NTH % 128 == 0, "whole warpgroups");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = warp * 16 + g + 8 * hf;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(k_tile + swz<D>(row, n) + 4 * t4) =
          pack2<BF16>(dk(n, 2 * hf) * dk_mul, dk(n, 2 * hf + 1) * dk_mul);
      *reinterpret_cast<uint32_t*>(v_tile + swz<D>(row, n) + 4 * t4) =
          pack2<BF16>(dv(n, 2 * hf) * dv_mul, dv(n, 2 * hf + 1) * dv_mul);
    }
  }
  __syncwarp();
  uint16_t* dqkv = static_cast<uint16_t*>(p.dqkv);
  const size_t rs = 3 * static_cast<size_t>(p.H);
  constexpr int CPR = D / 8;  // 16-byte chunks a row; it divides 32, so a lane keeps its chunk column
  static_assert(32 % CPR == 0, "a lane's chunk column is fixed");
  float ksum[8] = {}, vsum[8] = {};  // the lane's column sums (Note [attention bias gradient])
#pragma unroll
  for (int i = lane; i < 16 * CPR; i += 32) {
    const int row = warp * 16 + i / CPR, c = i % CPR, k = k0 + perm16(row);
    if (k < TK) {
      uint16_t* dst = dqkv + (sq.row0 + k) * rs + h * D + c * 8;
      const uint4 kq = *reinterpret_cast<const uint4*>(k_tile + swz<D>(row, c));
      const uint4 vq = *reinterpret_cast<const uint4*>(v_tile + swz<D>(row, c));
      *reinterpret_cast<uint4*>(dst + p.H) = kq;
      *reinterpret_cast<uint4*>(dst + 2 * p.H) = vq;
      if (p.dbias) {
        add_halves<BF16>(ksum, kq);
        add_halves<BF16>(vsum, vq);
      }
    }
  }
  if (p.dbias == nullptr) return;  // uniform: every thread of the CTA leaves here or none
#pragma unroll
  for (int e = 0; e < 8; ++e)
#pragma unroll
    for (int off = CPR; off < 32; off <<= 1) {
      ksum[e] += __shfl_xor_sync(0xffffffffu, ksum[e], off);
      vsum[e] += __shfl_xor_sync(0xffffffffu, vsum[e], off);
    }
  // The warps' partials meet in shared memory, each in its own staged rows (read above; 16 rows
  // of 2D bytes hold its 2D floats), and one F32 atomic a column leaves the CTA: fewer additions
  // into the same addresses, which is what the atomics cost (Note [attention bias gradient]).
  __syncwarp();
  float* part = reinterpret_cast<float*>(k_tile + warp * 16 * (D * 2));
  if (lane < CPR) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      part[lane * 8 + e] = ksum[e];
      part[D + lane * 8 + e] = vsum[e];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * D; c += NTH) {
    float s = 0.0f;
    for (int w = 0; w < NTH / 32; ++w) s += reinterpret_cast<const float*>(k_tile + w * 16 * (D * 2))[c];
    atomicAdd(p.dbias + (c < D ? p.H : 2 * p.H) + h * D + c % D, s);
  }
}

// Launches kernel(p, extra...) on a grid of (ceil(T / rows_per_cta), heads, B) CTAs with `bytes`
// of dynamic shared memory; false (nothing launched) when that is more than the device allows.
template <class Kernel, class... Extra>
bool launch_tiles(Kernel kernel, const Params& p, int rows_per_cta, int threads, size_t bytes, int smem_limit,
                  cudaStream_t s, const Extra&... extra) {
  if (bytes > static_cast<size_t>(smem_limit)) return false;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
    return false;
  const dim3 grid(static_cast<unsigned>((p.T + rows_per_cta - 1) / rows_per_cta), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.B));
  kernel<<<grid, threads, bytes, s>>>(p, extra...);
  return true;
}

}  // namespace anatomy::cuda::attn
