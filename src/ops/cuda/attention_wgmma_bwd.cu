// Attention backward for Hopper (sm_90a): attention_flash.cu's backward with its five products
// on wgmma. Head dims 32 and 64, no local window (that stays on the mma.sync kernel). The math is
// attention_common.cuh's; the tiles, their swizzle and the paired rows attention_tiles.cuh's; the
// wgmma instructions and descriptors wgmma.cuh's.
//
// Note [wgmma backward]
// A CTA of WG warpgroups owns 64 WG keys (K and V loaded with their rows paired, perm16), warpgroup
// w the 64 from k0 + 64 w, and streams 64-query tiles of Q, dO, lse and Dsum, as the mma.sync
// kernel does. Per query tile, in the transposed frame (rows = keys, columns = queries), each
// warpgroup:
//   S^T = K Q^T and dP^T = V dO^T     wgmma m64n64k16, A = K / V from registers (Note [scores
//                                     from registers]), B = Q / dO from shared memory, K-major;
// the element-wise step (P, dropout, dS) is the mma.sync kernel's, on accumulators of the same
// layout (a thread's four elements of an n-tile are one 2x2 dropout block); then
//   dV += (P Z')^T dO and dK += dS^T Q   A from registers, B = dO / Q read MN-major;
//   dQ = dS K                             A = dS^T of all the CTA's keys in shared memory read
//                                         MN-major (the transpose bit), B = K read MN-major,
//                                         warpgroup w the columns [w D / WG, (w + 1) D / WG);
//                                         added to the F32 accumulator.
// dK and dV stay in registers across the query tiles. Two warpgroups (the default) halve the dQ
// additions into global memory (each dQ element gets T / 128 of them, not T / 64) and the Q and
// dO tiles loaded per key; ANATOMY_ATTENTION_BWD=wgmma64 takes one (64 keys a CTA). The epilogue
// stages dK and dV through the K and V tiles after a barrier: every warp's last dQ product reads
// all of K.
//
// Note [scores from registers]
// Both operands from shared memory, an m64n64k16 product reads 4 KB there: 32 cycles at its 128
// bytes a cycle, as long as the tensor cores take for its 64 x 64 x 16 multiply-adds (2048 a cycle
// on an SM), and the scores are 8 of a warpgroup's 20 such products a tile. K and V do not change
// over the query tiles, so each warp loads its 16 rows of them once (ldmatrix, 16 + 16 registers
// at D 64; the default kernel's 241 registers become 254, no spills) and the scores read only Q
// and dO there: 2 KB a product. At B 32, T 512, p 0.1 (H200) the backward went from 0.398
// to 0.390 ms at D 64 and 0.311 to 0.303 at D 32 (bench/results/2026-11-29-h200/session31/
// call2-bwd-scores-from-registers/). ANATOMY_ATTENTION_BWD_SCORES=smem reads them from shared
// memory, for A/Bs. (The same for Q in the forward was no faster at p 0.1 and made ptxas reuse
// Q's registers inside the loop of its one-wait-a-product form:
// session31/call3-fwd-q-from-registers-not-kept/.)
//
// Note [wgmma backward pipeline]
// One wait for the tensor cores per query tile: after the barrier that publishes dS^T (and the
// next query tile, loaded one tile ahead), the warpgroup issues dQ of tile j and the scores of
// tile j + 1, waits for everything but the scores, and stages dQ for a TMA reduce (Note [tma dq
// reduce]; with ANATOMY_ATTENTION_BWD_DQ=atomics adds it into global memory 16 bytes a lane,
// red.v4) while the scores run. The load of tile j + 2 starts right after the barrier without
// dropout and after the staging with it: at B 32, T 512 (H200) the first took the backward from
// 0.331 to 0.318 ms at D 64, p 0 (0.255 to 0.244 at D 32), and at p 0.1 gained nothing (0.370 ->
// 0.372; D 32 0.294 -> 0.296: bench/results/2026-11-29-h200/session32/call3-early-load/). So the
// query tiles rotate through three stages (tile j + 2's stage was read by tile j - 1, whose
// products and element-wise step every thread finished before the barrier) and dS^T through two
// (its writer, tile j + 1, runs after a barrier that follows every thread's wait for dQ of tile
// j - 1).
// Splitting a tile's scores and its dV / dK products into two halves of 32 queries, so that one
// half's element-wise step runs under the other's products, was slower (0.397 -> 0.410 ms at
// D 64, p 0.1: session31/call1-bwd-parts-not-kept/): the m64n32 scores read more shared memory
// a product, and ptxas serializes every product unless the groups a wait_group leaves pending
// were issued in the same loop iteration (scores issued at the end of one and waited for in the
// next can only be waited for with wait_group 0).
#include <type_traits>

#include "ops/cuda/attention_tiles.cuh"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace anatomy::cuda::attn {
namespace {

// Shared memory (1024-byte aligned): K [BC][D] | V [BC][D] | Q [3][64][D] | dO [3][64][D] |
// dS^T [2][BC][64] | lse [3][64] | Dsum [3][64] f32 (Note [wgmma backward pipeline]) | with TMA, a
// barrier per query-tile stage | with the dQ reduce, each warpgroup's f32 dQ tile [64][D / WG].
//
// TMA (the default): thread 0 brings each query tile's Q and dO as two TMA copies onto its stage's
// barrier, where the threads wait; lse and Dsum (rows of T floats, not 16-byte aligned in general)
// stay cp.async. The stage a copy overwrites was released by the CTA barrier every tile already
// has (Note [wgmma backward pipeline]). Rows past the sequence arrive as they are (Note [tma key
// tiles]), so the last query tile gives its queries at or past TK probability 0.
// ANATOMY_ATTENTION_BWD_LOAD=cp.async: Q and dO by every thread too.
//
// Note [tma dq reduce] (the default): instead of every thread adding its dQ fragment into the
// f32 accumulator with vector atomics, each warpgroup stages its 64 x D/2 tile in shared memory
// (in the TMA's swizzle) and one thread adds it with one cp.reduce.async.bulk.tensor (atomic per
// element). Rows past the sequence add 0: their dS is 0, since the TMA query tiles give them
// probability 0, so this goes with TMA loads only. The reduce waits for the barrier the next
// tile has anyway: tile j stages into its warpgroup's staging tile j % 2 at its end; tile j + 1's
// fence (every thread's, for the async proxy) and CTA barrier publish it, and the issuing
// thread, which before that barrier has waited until tile j - 1's reduce read staging tile
// (j + 1) % 2, adds tile j's after it. The last tile's is added after the loop. At B 32, T 512,
// p 0.1 (H200) the backward went from 0.394 to 0.373 ms at D 64 and, against its atomics, from
// 0.305 to 0.296 at D 32 (bench/results/2026-11-29-h200/session32/call2-deferred-dq-reduce/); it
// had two warpgroup barriers and a fence of its own a tile, whose waits for the staging stores
// (shared memory busy with the scores' reads) held 11% of the kernel's warp samples
// (session22/call1/ncu_attn_bwd_sass.csv.xz).
template <int D, int WG>
struct WgBwdCfg {
  static constexpr int kThreads = 128 * WG, BC = 64 * WG, BR = 64, kStages = 3;
  static constexpr int kKBytes = BC * D * 2, kQBytes = BR * D * 2, kSBytes = BC * BR * 2;
  static constexpr int kK = 0, kV = kKBytes, kQ = 2 * kKBytes, kDO = kQ + kStages * kQBytes;
  static constexpr int kS = kDO + kStages * kQBytes;
  static constexpr int kLse = kS + 2 * kSBytes, kDsum = kLse + kStages * BR * 4;
  static constexpr int kBar = kDsum + kStages * BR * 4;
  static constexpr int kBytes = kBar + 8 * kStages;
  // DQT: each warpgroup's two f32 dQ tiles [BR][D / WG] (query tile j's in tile j % 2), staged
  // for the TMA reduce (1024-aligned).
  static constexpr int kDQ = (kBytes + 1023) / 1024 * 1024, kDQBytes = BR * (D / WG) * 4;
  static size_t smem_bytes(bool dqt) { return 1024 + (dqt ? kDQ + 2 * WG * kDQBytes : kBytes); }
};

// The backward's TMA maps: Q (qkv) and dO (dctx); DQT: the f32 dQ accumulator.
struct BwdMaps {
  CUtensorMap q, d_o, dq;
};

// Writes this thread's dQ fragment (rows 16 warp + g + 8 hf, columns 8n + 2 t4 + {0, 1} of the
// warpgroup's DQ) into the warpgroup's f32 tile [64][DQ] at `buf`, in the TMA's swizzle for rows of
// DQ * 4 bytes (64 or 128: chunk bits 4-5 or 4-6 of the offset XOR its bits from 7).
template <int DQ>
__device__ __forceinline__ void stage_dq(unsigned char* buf, const float (&dq)[DQ / 2], int warp, int g, int t4) {
  constexpr uint32_t kMask = DQ * 4 == 128 ? 7 : 3;
#pragma unroll
  for (int n = 0; n < DQ / 8; ++n)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t row = warp * 16 + g + 8 * hf, off = row * (DQ * 4) + (8 * n + 2 * t4) * 4;
      *reinterpret_cast<float2*>(buf + (off ^ (((off >> 7) & kMask) << 4))) =
          make_float2(dq[4 * n + 2 * hf], dq[4 * n + 2 * hf + 1]);
    }
}

// Adds this thread's dQ fragment (rows g, g + 8 of the warp's 16 from query q0, columns
// 8n + 2 t4 + {0, 1} of `row0`'s) into the F32 accumulator 16 bytes at a time: lanes t4 and t4 ^ 1
// swap halves, so the even lane adds row g's four columns from 8n + 2 t4 and the odd one row
// g + 8's from 8n + 2 (t4 - 1). Rows at or past TK are not added.
template <int N>
__device__ __forceinline__ void add_dq_rows(const float (&dq)[N], float* row0, size_t row_stride, int q0, int g,
                                            int t4, int TK) {
  const bool odd = t4 & 1;
  const int q = q0 + g + (odd ? 8 : 0);
  float* row = row0 + static_cast<size_t>(q) * row_stride + 2 * (t4 & ~1);
#pragma unroll
  for (int n = 0; n < N / 4; ++n) {
    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * n] : dq[4 * n + 2], 1);
    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * n + 1] : dq[4 * n + 3], 1);
    if (q < TK) {
      if (odd)
        red_add_f32x4(row + n * 8, r0, r1, dq[4 * n + 2], dq[4 * n + 3]);
      else
        red_add_f32x4(row + n * 8, dq[4 * n], dq[4 * n + 1], r0, r1);
    }
  }
}

template <bool BF16, int D, int WG, bool DROP, bool TMA, bool DQT, bool RK>
__global__ void __launch_bounds__(128 * WG, 2 / WG) wgmma_bwd_kernel(Params p, const __grid_constant__ BwdMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgBwdCfg<D, WG>;
  constexpr int BR = C::BR, BC = C::BC, NTH = C::kThreads;
  constexpr int KS = D / 16;  // k-steps over the head dim
  constexpr int NS = BR / 8;  // n-tiles of S^T (queries)
  constexpr int DQ = D / WG;  // dQ columns of a warpgroup
  constexpr uint32_t kRow = D * 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t base = smem_addr(smem);
  const uint32_t k_s = base + C::kK, v_s = base + C::kV, q_s = base + C::kQ, do_s = base + C::kDO;
  const uint32_t ds_s = base + C::kS;
  const float* lse_s = reinterpret_cast<const float*>(smem + C::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + C::kDsum);

  // gw: the warp's 16 keys of the CTA's BC; warp: its 16 rows of the warpgroup's products.
  const int gw = threadIdx.x / 32, wg = gw / 4, warp = gw % 4, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * BC;
  const int T = p.T;
  const SeqRows sq = seq_rows(p, b);  // TK: the sequence's tokens, T when padded
  const int TK = sq.len;
  const HeadQkv qkv = head_qkv(p, sq, h);
  const auto [qg, kg, vg, rs] = qkv;
  const size_t bh = static_cast<size_t>(b) * p.heads + h;
  const uint16_t* dog = static_cast<const uint16_t*>(p.dctx) + sq.row0 * p.H + h * D;
  const float* lse_g = p.lse + bh * T;
  const float* dsum_g = p.dsum + bh * T;
  // Note [attention scope]: the query tiles that hold the first p.queries; later ones have a zero
  // dO and add nothing.
  const int nq = ((p.queries > 0 ? min(TK, p.queries) : TK) + BR - 1) / BR;

  // Note [masked key tiles]: BC masked keys have dK = dV = 0 and no share in dQ.
  const int kend = valid_key_end<NTH>(p.mask, b, TK);
  if (kend > 0 && k0 >= kend) {
    zero_key_grads<D, BC, NTH>(p, sq, h, k0, TK);
    return;
  }

  const uint32_t bar = base + C::kBar;  // stage st's at bar + 8 st
  auto load_q_tile = [&](int jt, int st) {
    if constexpr (TMA) {
      load_query_stats<BR>(base + C::kLse + st * BR * 4, base + C::kDsum + st * BR * 4, lse_g, dsum_g, jt, TK);
      if (threadIdx.x != 0) return;
      const uint32_t full = bar + 8 * st;
      const int row = static_cast<int>(sq.row0) + jt * BR;
      mbar_arrive_expect_tx(full, 2 * C::kQBytes);
      tma_load_2d(q_s + st * C::kQBytes, &maps.q, h * D, row, full);
      tma_load_2d(do_s + st * C::kQBytes, &maps.d_o, h * D, row, full);
    } else {
      load_query_tile<BR, D, NTH>(q_s + st * C::kQBytes, do_s + st * C::kQBytes, base + C::kLse + st * BR * 4,
                                  base + C::kDsum + st * BR * 4, qkv, dog, p, lse_g, dsum_g, jt, TK);
    }
  };
  auto wait_q_tile = [&](int jt) {
    if constexpr (TMA) mbar_wait(bar + 8 * (jt % C::kStages), (jt / C::kStages) & 1);
  };
  // S^T = K Q^T, dP^T = V dO^T of the query tile in stage st. Element (n, e): s[4n + e], key row
  // g + 8 (e >> 1) of the warp's 16, query 8n + 2 t4 + (e & 1).
  const uint64_t k_desc = tile_desc<D>(k_s + wg * 64 * kRow), v_desc = tile_desc<D>(v_s + wg * 64 * kRow);
  float s[BR / 2], dp[BR / 2];
  uint32_t kf[KS][4], vf[KS][4];  // RK: A = K / V from registers (Note [scores from registers])
  auto issue_scores = [&](int st) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      if constexpr (RK) {
        wgmma_rs<BF16, true>(s, kf[ks], tile_desc<D>(q_s + st * C::kQBytes) + 2 * ks, ks);
        wgmma_rs<BF16, true>(dp, vf[ks], tile_desc<D>(do_s + st * C::kQBytes) + 2 * ks, ks);
      } else {
        wgmma_ss<BF16>(s, k_desc + 2 * ks, tile_desc<D>(q_s + st * C::kQBytes) + 2 * ks, ks);
        wgmma_ss<BF16>(dp, v_desc + 2 * ks, tile_desc<D>(do_s + st * C::kQBytes) + 2 * ks, ks);
      }
    }
    wgmma_commit();
  };

  if constexpr (TMA) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < C::kStages; ++st) mbar_init(bar + 8 * st, 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  load_tile<BC, D, NTH, true>(k_s, kg, rs, k0, TK);
  load_tile<BC, D, NTH, true>(v_s, vg, rs, k0, TK);
  if (nq > 0) load_q_tile(0, 0);
  cp_async_commit();
  if (nq > 1) load_q_tile(1, 1);
  cp_async_commit();
  if constexpr (TMA) __syncwarp();

  // Key bias of this thread's two key rows (fragment rows g, g+8 = keys 2g, 2g+1 of the warp's 16).
  float kbias[2];
  const bool any_valid = kend > 0;  // (valid_key_end is 0 when no key is valid)
  key_pair_bias(kbias, p, b, k0 + gw * 16 + 2 * g, TK, any_valid);
  const float scale_mul = any_valid ? p.scale * kLog2e : 0.0f;
  const auto [zk, zstep] = key_row_dropout(p, bh, k0, gw, g, t4);

  cp_async_wait<1>();  // K, V and query tile 0 (TMA: its lse and Dsum)
  if (nq > 0) wait_q_tile(0);
  fence_proxy_async();
  __syncthreads();

  if constexpr (RK) {
    // The warp's 16 rows of the warpgroup's K and V, k-step by k-step: ldmatrix x4 of rows r,
    // r + 8 (lanes 0-15) and chunks 2 ks, 2 ks + 1 (lanes 16-31) gives the A fragment (a[0] row
    // g, a[1] row g + 8, a[2], a[3] the next 8 columns).
    const int row = wg * 64 + warp * 16 + (lane & 15);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      ldsm_x4(kf[ks], k_s + swz<D>(row, 2 * ks + (lane >> 4)));
      ldsm_x4(vf[ks], v_s + swz<D>(row, 2 * ks + (lane >> 4)));
    }
  }
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;
  if (nq > 0) issue_scores(0);
  // DQT: query tile jq's staging tile of this warpgroup, and its reduce (one thread).
  auto dq_tile = [&](int jq) { return smem + C::kDQ + (2 * wg + (jq & 1)) * C::kDQBytes; };
  auto reduce_dq = [&](int jq) {
    tma_reduce_add_2d(smem_addr(dq_tile(jq)), &maps.dq, h * D + wg * DQ, static_cast<int>(sq.row0) + jq * BR);
  };
  auto load_next = [&](int j) {  // (in tile j) the load of tile j + 2
    if (j + 2 < nq) load_q_tile(j + 2, (j + 2) % C::kStages);
    cp_async_commit();
  };

  // Query tile j; LAST: no next tile's scores to issue behind dQ. (Two bodies, so that every
  // wait retires the same groups on every path: a conditional issue made ptxas serialize the
  // products.)
  auto tile = [&](int j, auto last) {
    constexpr bool LAST = decltype(last)::value;
    const int st = j % C::kStages;
    const uint32_t qt = q_s + st * C::kQBytes, dot = do_s + st * C::kQBytes, dst = ds_s + (j & 1) * C::kSBytes;
    wgmma_wait<0>();  // this tile's scores
    fence_regs(s);
    fence_regs(dp);

    // Element-wise: s <- P Z' (for dV), dp <- dS (backward_elements), n-tile by n-tile.
    const uint64_t zj = zk + static_cast<uint64_t>(j) * (BR / 2) * zstep;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const int c = n * 8 + 2 * t4;
      const uint64_t bits = DROP ? dropout_mix(zj + static_cast<uint64_t>(n) * 4 * zstep) : 0;
      // TMA: the last tile's queries past the sequence are another's rows; probability 0.
      const int q_end = TMA && LAST ? TK - j * BR - c : BR;
      backward_elements<DROP>(&s[4 * n], &dp[4 * n], bits, lse_s + st * BR + c, dsum_s + st * BR + c, scale_mul, kbias,
                              p, [q_end](float x, int e) { return (e & 1) < q_end ? x : -INFINITY; });
    }

    // A fragments (rows = keys, k = queries) of P Z' and dS; dS^T also to shared memory for dQ.
    uint32_t ap[BR / 16][4], as[BR / 16][4];
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        ap[kk][r] = pack2<BF16>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
        as[kk][r] = pack2<BF16>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
      }
      const int kr = gw * 16 + g;  // a[0]: row g, queries 16kk + 2t4; a[1] row g + 8; a[2], a[3] +8 queries
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + swz<BR>(kr, 2 * kk) + 4 * t4), "r"(as[kk][0]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + swz<BR>(kr + 8, 2 * kk) + 4 * t4), "r"(as[kk][1]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + swz<BR>(kr, 2 * kk + 1) + 4 * t4), "r"(as[kk][2]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst + swz<BR>(kr + 8, 2 * kk + 1) + 4 * t4), "r"(as[kk][3]));
    }
    // dV += (P Z')^T dO, dK += dS^T Q: B = dO / Q [query][d], 16 queries a k-step.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      wgmma_rs<BF16>(dv, ap[kk], tile_desc<D>(dot + kk * 16 * kRow));
      wgmma_rs<BF16>(dk, as[kk], tile_desc<D>(qt + kk * 16 * kRow));
    }
    wgmma_commit();
    if constexpr (!LAST) wait_q_tile(j + 1);
    cp_async_wait_all();  // the next query tile (TMA: its lse and Dsum)
    fence_proxy_async();  // dS^T, the dQ tile before and the next tile: this thread's stores, before the barrier
    if constexpr (DQT) {
      // Note [tma dq reduce]: the reduce of tile j - 2 (issued at tile j - 1) has read staging
      // tile j % 2, which this tile's dQ will overwrite.
      if (threadIdx.x % 128 == 0) bulk_wait<0, true>();
    }
    __syncthreads();
    // Past the barrier every thread is done with tile j - 1: its products and element-wise step
    // read stage (j + 2) % 3, where tile j + 2's load goes (here without dropout, at the end of
    // the tile with: Note [wgmma backward pipeline]); (DQT) its dQ, staged at its end and fenced,
    // is added.
    if constexpr (!DROP) load_next(j);
    if constexpr (DQT) {
      if (j > 0 && threadIdx.x % 128 == 0) reduce_dq(j - 1);
    }
    if constexpr ((TMA && !DROP) || DQT) __syncwarp();  // after a thread's copies or reduce: the warp whole again

    // dQ (64 queries x DQ columns from wg DQ) = dS K: A = dS^T [key][query] read MN-major, B = K
    // [key][d] MN-major from column wg DQ (the start moves wg DQ * 2 bytes along the swizzled row),
    // 16 keys a k-step. Row (query) 16 warp + g + 8 hf, columns wg DQ + 8n + 2 t4 + {0, 1}. The
    // next tile's scores go to the tensor cores behind it.
    float dq[DQ / 2];  // written by the first k-step (no accumulate)
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BC / 16; ++ks)
      wgmma_ss<BF16, true>(dq, tile_desc<BR>(dst + ks * 16 * BR * 2), tile_desc<D>(k_s + ks * 16 * kRow + wg * DQ * 2),
                           ks);
    wgmma_commit();
    if constexpr (!LAST) issue_scores((j + 1) % C::kStages);
    wgmma_wait<LAST ? 0 : 1>();  // this tile's dV, dK and dQ products
    fence_regs(dq);
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(ap);
    fence_regs(as);
    if constexpr (DQT) {
      stage_dq<DQ>(dq_tile(j), dq, warp, g, t4);  // added by the next tile (or after the loop)
    } else {
      add_dq_rows(dq, p.dq_acc + sq.row0 * p.H + h * D + wg * DQ, p.H, j * BR + warp * 16, g, t4, TK);
    }
    if constexpr (DROP) {
      load_next(j);
      if constexpr (TMA) __syncwarp();  // thread 0's copies issued: warp 0 whole again
    }
  };
  for (int j = 0; j + 1 < nq; ++j) tile(j, std::false_type{});
  if (nq > 0) tile(nq - 1, std::true_type{});
  wgmma_wait<0>();  // (nothing pending; tells ptxas that dK and dV are final on every path)
  fence_regs(dk);
  fence_regs(dv);
  if constexpr (DQT) fence_proxy_async();  // the last tile's dQ, staged
  __syncthreads();  // every warp's last dQ product, which reads all of K, is done
  if constexpr (DQT) {
    // The last tile's reduce; the reduces have read their tiles before the CTA's shared memory
    // goes; their additions complete with the grid (waiting for them here would also invalidate
    // the L1 cache).
    if (threadIdx.x % 128 == 0) {
      if (nq > 0) reduce_dq(nq - 1);
      bulk_wait<0, true>();
    }
  }

  // Epilogue: dK * scale and dV * inv_keep, staged through this warp's own rows of the K and
  // V tiles (all their readers have completed), then 16-byte stores.
  store_key_grads<BF16, D, NTH>([&](int n, int e) { return dk[4 * n + e]; }, [&](int n, int e) { return dv[4 * n + e]; },
                                p.scale, DROP ? p.inv_keep : 1.0f, smem + C::kK, smem + C::kV, p, sq, h, k0, TK);
#endif
}

template <bool BF16, int D, int WG, bool TMA, bool DQT = false, bool RK = true>
bool launch(const Params& p, int smem_limit, cudaStream_t s) {
  static_assert(TMA || !DQT, "the dQ reduce relies on the TMA loads' zero rows past the sequence");
  using C = WgBwdCfg<D, WG>;
  BwdMaps maps{};
  if constexpr (TMA) {
    const uint64_t rows = total_rows(p);
    const uint64_t H = static_cast<uint64_t>(p.H);
    if (!make_tile_map(&maps.q, p.qkv, rows, 3 * H, C::BR, D) || !make_tile_map(&maps.d_o, p.dctx, rows, H, C::BR, D) ||
        (DQT && !make_tile_map(&maps.dq, p.dq_acc, rows, H, C::BR, D / WG, true))) {
      count_tma_fallback();
      return launch<BF16, D, WG, false, false, RK>(p, smem_limit, s);
    }
  }
  auto kernel = p.drop ? wgmma_bwd_kernel<BF16, D, WG, true, TMA, DQT, RK>
                        : wgmma_bwd_kernel<BF16, D, WG, false, TMA, DQT, RK>;
  return launch_tiles(kernel, p, C::BC, C::kThreads, C::smem_bytes(DQT), smem_limit, s, maps);
}

// Two warpgroups a CTA with TMA query tiles: at B 32, T 512, p 0.1 (H200) 186.9 TFLOP/s at D 64
// and 134.2 at D 32, against 178.7 and 125.3 with the tiles by cp.async, 158.1 and 115.0 with one
// warpgroup (bench/results/2026-11-27-h200/session17/call1/bwdab.md, scripts/device.sh attentionab).
// dQ by TMA reduces (Note [tma dq reduce]) is the default (with barriers of its own it was at D 64
// only: session17/call9/dqab.md). ANATOMY_ATTENTION_BWD_DQ=atomics takes the vector atomics;
// ANATOMY_ATTENTION_BWD_SCORES=smem: K and V from shared memory (Note [scores from registers]).
template <bool BF16, int D>
bool launch(const Params& p, int smem_limit, cudaStream_t s) {
  if (env_is("ANATOMY_ATTENTION_BWD", "wgmma64")) return launch<BF16, D, 1, false>(p, smem_limit, s);
  if (env_is("ANATOMY_ATTENTION_BWD_LOAD", "cp.async")) return launch<BF16, D, 2, false>(p, smem_limit, s);
  const bool dq_tma = !env_is("ANATOMY_ATTENTION_BWD_DQ", "atomics");
  if (env_is("ANATOMY_ATTENTION_BWD_SCORES", "smem"))
    return dq_tma ? launch<BF16, D, 2, true, true, false>(p, smem_limit, s)
                  : launch<BF16, D, 2, true, false, false>(p, smem_limit, s);
  if (dq_tma) return launch<BF16, D, 2, true, true>(p, smem_limit, s);
  return launch<BF16, D, 2, true>(p, smem_limit, s);
}

}  // namespace

bool wgmma_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s) {
  if (!wgmma_forward_supported(p)) return false;  // the same shapes and devices
  if (p.D == 32) return is_bf16 ? launch<true, 32>(p, smem_limit, s) : launch<false, 32>(p, smem_limit, s);
  return is_bf16 ? launch<true, 64>(p, smem_limit, s) : launch<false, 64>(p, smem_limit, s);
}

}  // namespace anatomy::cuda::attn
