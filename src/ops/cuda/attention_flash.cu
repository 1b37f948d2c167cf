// Fast attention for BF16/F16 with head_dim 32, 64 or 128 (FlashAttention-2 style; no T x T matrix
// in memory). Tensor cores through mma.sync.m16n8k16 (16-bit inputs, fp32 accumulators),
// operands fed from shared memory by ldmatrix, tiles streamed by cp.async with double
// buffering. The math is in attention_common.cuh.
//
// mma.m16n8k16 fragments (g = lane / 4, t = lane % 4), used throughout:
//   A (16x16, row-major):  a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..]   a2 = A[g][2t+8..]   a3 = A[g+8][2t+8..]
//   B (16x8, k x n):       b0 = B[2t..2t+1][g]    b1 = B[2t+8..][g]
//   C (16x8, fp32):        c0,c1 = C[g][2t..2t+1] c2,c3 = C[g+8][2t..2t+1]
// so the C fragments of two adjacent n-tiles, packed to 16 bits, are the A fragment of one
// 16-wide k-step: the probabilities go from the S = QK^T accumulators straight into P V.
// Tiles, swizzle and Note [paired rows]: attention_tiles.cuh.
#include <cmath>

#include "ops/cuda/attention_tiles.cuh"

namespace anatomy::cuda::attn {
namespace {

// ---- forward -----------------------------------------------------------------------------
// Grid (ceil(T / BR), heads, B); 4 warps; warp w owns query rows [w*16*MT, (w+1)*16*MT) of
// the CTA's BR = 64*MT rows (paired, Note [paired rows]), keeps its Q fragments in registers,
// and streams 64-key K/V tiles. Per tile, per row: S = Q K^T (log2 domain, with key bias), running max m and
// running sum l of exp2(S - m) (undropped), O = O * exp2(m_old - m_new) + (P Z') V with Z'
// the 0/1 keep mask; at the end O *= inv_keep / l and lse = (m + log2 l) * ln 2.
// Shared memory: Q [BR][D] | K [2][BC][D] | V [2][BC][D] | key bias [ceil(T/BC)*BC] f32 |
// with a window, the valid-key bits [ceil(T/BC)*BC/32] (Note [window tiles]).
template <bool BF16, int D, int MT>
struct FwdCfg {
  static constexpr int kWarps = 4, kThreads = 128, BR = 16 * MT * kWarps, BC = 64;
  static constexpr int kQBytes = BR * D * 2, kKVBytes = BC * D * 2;
  static constexpr int kBiasOffset = kQBytes + 4 * kKVBytes;
  __host__ __device__ static size_t bits_offset(int T) {
    return kBiasOffset + static_cast<size_t>((T + BC - 1) / BC) * BC * 4;
  }
  static size_t smem_bytes(int T, bool win) {
    return bits_offset(T) + (win ? static_cast<size_t>((T + BC - 1) / BC) * (BC / 8) : 0);
  }
};

template <bool BF16, int D, int MT, bool DROP, bool WIN>
__global__ void __launch_bounds__(128, (MT == 1 && D <= 64) ? 3 : 2) flash_fwd_kernel(Params p) {
  using C = FwdCfg<BF16, D, MT>;
  constexpr int BR = C::BR, BC = C::BC, NTH = C::kThreads;
  constexpr int KS = D / 16;   // k-steps of Q K^T
  constexpr int NS = BC / 8;   // n-tiles of S
  constexpr int NO = D / 8;    // n-tiles of O
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_s = smem_addr(smem);
  const uint32_t k_s = q_s + C::kQBytes;            // stage st at k_s + st * kKVBytes
  const uint32_t v_s = k_s + 2 * C::kKVBytes;
  float* kb = reinterpret_cast<float*>(smem + C::kBiasOffset);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR;
  const int T = p.T;
  // TK: the sequence's tokens, T when padded (Note [packed attention] in ops/cpu/attention.cpp).
  const SeqRows sq = seq_rows(p, b);
  const int TK = sq.len;
  if (forward_tile_absent<BR, NTH>(p, b, h, q0, TK)) return;
  const auto [qg, kg, vg, rs] = head_qkv(p, sq, h);
  const int nkv_all = (T + BC - 1) / BC;
  const int kend = valid_key_end<NTH>(p.mask, b, TK);
  const int jvalid = kend > 0 ? (kend + BC - 1) / BC : nkv_all;  // Note [masked key tiles]
  int jbeg = 0, jend = jvalid;

  load_tile<BR, D, NTH, true>(q_s, qg, rs, q0, TK);
  // Window (Note [window tiles]): the thread's rows (fragment rows g, g+8 of slice mt are
  // tokens 2g, 2g+1), whether each is uniform, whether the warp has one, the tiles to visit.
  [[maybe_unused]] const int w = p.window < T ? p.window : T;
  [[maybe_unused]] int qrow[MT][2];
  [[maybe_unused]] bool uni[MT][2];
  [[maybe_unused]] bool warp_uni = false;
  [[maybe_unused]] int wbeg = 0, wend = 0;  // the tiles this warp computes, within [jbeg, jend)
  if constexpr (WIN) {
    uint32_t* vbits = reinterpret_cast<uint32_t*>(smem + C::bits_offset(T));
    build_valid_bits<NTH>(vbits, p.mask, b, TK, nkv_all * BC);
    __syncthreads();
    bool mine = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        qrow[mt][hf] = q0 + warp * 16 * MT + mt * 16 + 2 * g + hf;
        uni[mt][hf] = window_uniform(vbits, qrow[mt][hf], TK, w);
        mine |= uni[mt][hf];
      }
    warp_uni = __any_sync(0xffffffffu, mine);
    if (__syncthreads_or(mine)) {
      jend = nkv_all;  // a uniform row sees every key
    } else {
      const int lo = q0 - w > 0 ? q0 - w : 0, hi = q0 + BR - 1 + w < T - 1 ? q0 + BR - 1 + w : T - 1;
      jbeg = lo / BC;
      jend = jend < hi / BC + 1 ? jend : hi / BC + 1;
    }
    wbeg = jbeg, wend = jend;
    if (!warp_uni) {
      const int wq0 = q0 + warp * 16 * MT, wq1 = wq0 + 16 * MT - 1;
      const int lo = wq0 - w > 0 ? wq0 - w : 0, hi = wq1 + w < T - 1 ? wq1 + w : T - 1;
      wbeg = lo / BC;
      wend = jvalid < hi / BC + 1 ? jvalid : hi / BC + 1;
    }
  }
  load_tile<BC, D, NTH>(k_s, kg, rs, jbeg * BC, TK);
  load_tile<BC, D, NTH>(v_s, vg, rs, jbeg * BC, TK);
  cp_async_commit();
  const bool any_valid = kend > 0;  // (valid_key_end is 0 when no key is valid)
  build_key_bias(kb, p.mask, b, TK, 0, nkv_all * BC, any_valid);
  const float scale_mul = any_valid ? p.scale * kLog2e : 0.0f;  // s2 = s * scale_mul + kb
  cp_async_wait_all();
  __syncthreads();

  // Q fragments of this warp's rows (A operand: rows = queries, k = head dim).
  uint32_t qf[MT][KS][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      ldsm_x4(qf[mt][ks], q_s + swz<D>(warp * 16 * MT + mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));

  float o[MT][NO][4];
  float m[MT][2], l[MT][2];
  // Dropout: the thread's 2x2 block of n-tile n of KV tile j in row slice mt is the queries
  // q0 + warp*16*MT + mt*16 + 2g + {0, 1} x keys j*BC + n*8 + 2*t4 + {0, 1}, group
  // (bh*tp + q/2)*tp + k/2; zrow[mt] = rng_key + (its group at n = 0 of the current tile j) *
  // kGolden, advanced by (BC/2) * kGolden per tile.
  const uint64_t tp = (static_cast<uint64_t>(T) + 1) >> 1;
  uint64_t zrow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NO; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m[mt][hf] = -INFINITY;
      l[mt][hf] = 0.0f;
    }
    const uint64_t qpair = static_cast<uint64_t>((q0 + warp * 16 * MT + mt * 16) / 2 + g);
    zrow[mt] = p.rng_key + (((static_cast<uint64_t>(b) * p.heads + h) * tp + qpair) * tp + t4 +
                            static_cast<uint64_t>(jbeg) * (BC / 2)) * kGolden;
  }

  // ldmatrix lane roles: matrix index mi = lane / 8, row within matrix lane % 8.
  const int mi = lane >> 3, r8 = lane & 7;

  // One CTA barrier a tile, at the top, which every warp reaches by the same instruction (a
  // warp that skips a tile of the window's union goes straight to the next tile's): tile j's
  // copies have landed for every thread, and every warp is done with tile j - 1's stage, which
  // tile j + 1's copies then overwrite. (A barrier per path, reached by different warps in the same
  // tile, is undefined for bar.sync, which requires one instruction CTA-wide; compute-sanitizer's
  // synccheck reported it.) Tile jbeg was waited for above.
  for (int j = jbeg; j < jend; ++j) {
    if (j > jbeg) {
      cp_async_wait_all();
      __syncthreads();
    }
    const int st = (j - jbeg) & 1;
    if (j + 1 < jend) {
      load_tile<BC, D, NTH>(k_s + (st ^ 1) * C::kKVBytes, kg, rs, (j + 1) * BC, TK);
      load_tile<BC, D, NTH>(v_s + (st ^ 1) * C::kKVBytes, vg, rs, (j + 1) * BC, TK);
    }
    cp_async_commit();
    const uint32_t kt = k_s + st * C::kKVBytes, vt = v_s + st * C::kKVBytes;
    if constexpr (WIN) {
      // A tile outside this warp's own range (the CTA loads the union of its warps' ranges):
      // only the common steps and the dropout counter.
      if (j < wbeg || j >= wend) {
        if constexpr (DROP) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) zrow[mt] += (BC / 2) * kGolden;
        }
        continue;
      }
    }

    // S = Q K^T: B operand from K [key][d] (= k x n column-major): plain ldmatrix; one x4
    // gives the two k-halves of two adjacent 8-key n-tiles.
    float s[MT][NS][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NS; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        uint32_t bf[4];
        ldsm_x4(bf, kt + swz<D>(np * 16 + (mi >> 1) * 8 + r8, 2 * ks + (mi & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<BF16>(s[mt][2 * np], qf[mt][ks], bf[0], bf[1]);
          mma<BF16>(s[mt][2 * np + 1], qf[mt][ks], bf[2], bf[3]);
        }
      }

    // Scale, bias, online softmax. Thread holds columns n*8 + 2t + {0,1} of rows g, g+8.
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float2 bias = *reinterpret_cast<const float2*>(kb + j * BC + n * 8 + 2 * t4);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        s[mt][n][0] = fmaf(s[mt][n][0], scale_mul, bias.x);
        s[mt][n][1] = fmaf(s[mt][n][1], scale_mul, bias.y);
        s[mt][n][2] = fmaf(s[mt][n][2], scale_mul, bias.x);
        s[mt][n][3] = fmaf(s[mt][n][3], scale_mul, bias.y);
      }
    }
    if constexpr (WIN) {
      // The warp's rows [wq0, wq0 + 16*MT) all see this tile's keys whole unless it reaches
      // past a window edge.
      const int wq0 = q0 + warp * 16 * MT, kt0 = j * BC;
      const bool inside = kt0 >= wq0 + 16 * MT - 1 - w && kt0 + BC - 1 <= wq0 + w;
      if (warp_uni || !inside) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][n][e] = window_score(s[mt][n][e], qrow[mt][e >> 1], kt0 + n * 8 + 2 * t4 + (e & 1), T, w,
                                         uni[mt][e >> 1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m[mt][hf];
#pragma unroll
        for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * hf], s[mt][n][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with no finite score yet keeps m = -inf; subtract 0 then (exp2(-inf) = 0).
        const float mu = mx == -INFINITY ? 0.0f : mx;
        const float corr = fast_exp2(m[mt][hf] - mu);
        m[mt][hf] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          const float e0 = fast_exp2(s[mt][n][2 * hf] - mu), e1 = fast_exp2(s[mt][n][2 * hf + 1] - mu);
          s[mt][n][2 * hf] = e0;
          s[mt][n][2 * hf + 1] = e1;
          sum += e0 + e1;
        }
        l[mt][hf] = l[mt][hf] * corr + sum;  // thread-partial row sum; reduced at the end
#pragma unroll
        for (int n = 0; n < NO; ++n) {
          o[mt][n][2 * hf] *= corr;
          o[mt][n][2 * hf + 1] *= corr;
        }
      }

    if constexpr (DROP) {
      // Element (n, e) is query 2g + (e >> 1), key n*8 + 2t + (e & 1) of the block: field e
      // of the block's bits. One hash per n-tile (Note [paired rows]).
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < NS; ++n) {
          bool keep[4];
          keep4(keep, dropout_mix(zrow[mt] + static_cast<uint64_t>(n) * (4 * kGolden)), p.thr_m1);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!keep[e]) s[mt][n][e] = 0.0f;
        }
        zrow[mt] += (BC / 2) * kGolden;
      }
    }

    // O += P V: A = P from the S accumulators; B from V [key][d] (= k x n row-major):
    // transposing ldmatrix, one x4 = both k-halves of two adjacent 8-column n-tiles.
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < NO / 2; ++np) {
        uint32_t bf[4];
        ldsm_x4_t(bf, vt + swz<D>(kk * 16 + (mi & 1) * 8 + r8, 2 * np + (mi >> 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma<BF16>(o[mt][2 * np], a[mt], bf[0], bf[1]);
          mma<BF16>(o[mt][2 * np + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait_all();
  __syncthreads();

  // Epilogue: normalize, write lse, stage O through this warp's own rows of the Q tile, then
  // 16-byte coalesced stores.
  const float out_mul = DROP ? p.inv_keep : 1.0f;
  unsigned char* q_tile = smem;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float mu = m[mt][hf] == -INFINITY ? 0.0f : m[mt][hf];
      const int row = warp * 16 * MT + mt * 16 + g + 8 * hf, q = q0 + perm16(row);
      if (t4 == 0 && q < T)
        p.lse[(static_cast<size_t>(b) * p.heads + h) * T + q] = q < TK ? (mu + __log2f(sum)) * kLn2 : 0.0f;
      const float inv = out_mul / sum;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *reinterpret_cast<uint32_t*>(q_tile + swz<D>(row, n) + 4 * t4) =
            pack2<BF16>(o[mt][n][2 * hf] * inv, o[mt][n][2 * hf + 1] * inv);
    }
  __syncwarp();
  store_o_rows<D>(q_tile, warp * 16 * MT, 16 * MT, q0, TK, p, sq, h, lane);
}

// ---- backward ----------------------------------------------------------------------------
// Grid (ceil(T / BC), heads, B); 4 warps; the CTA owns BC = 64 keys, warp w keys
// [w*16, w*16+16) (paired, Note [paired rows]) with their K and V fragments in registers and
// dK, dV accumulators; it
// streams 64-query tiles of Q, dO, lse, Dsum. Per query tile, in the transposed frame
// (rows = keys, columns = queries):
//   S^T = K Q^T,  P^T = exp2(S^T * scale*log2e + kb - lse*log2e),  dP^T = Z (V dO^T),
//   dS^T = P^T (dP^T - Dsum),   dV += (P Z')^T dO,   dK += dS^T Q,
// then dS^T goes to shared memory and warp w computes rows [w*16, w*16+16) of the tile's
// dQ = dS K, added into the F32 accumulator with vector reductions.
// Shared memory: K [BC][D] | V [BC][D] | Q [2][BR][D] | dO [2][BR][D] | dS^T [BC][BR] |
//                lse [2][BR] | Dsum [2][BR] f32 | with a window, valid-key bits and uniform-query
//                bits, [ceil(T/BR)*BR/32] each (Note [window tiles]).
template <bool BF16, int D>
struct BwdCfg {
  static constexpr int kThreads = 128, BC = 64, BR = 64;
  static constexpr int kKBytes = BC * D * 2, kQBytes = BR * D * 2, kSBytes = BC * BR * 2;
  static constexpr int kK = 0, kV = kKBytes, kQ = 2 * kKBytes, kDO = kQ + 2 * kQBytes, kS = kDO + 2 * kQBytes;
  static constexpr int kLse = kS + kSBytes, kDsum = kLse + 2 * BR * 4;
  static constexpr int kBytes = kDsum + 2 * BR * 4;
  static size_t smem_bytes(int T, bool win) {
    return kBytes + (win ? 2 * static_cast<size_t>((T + BR - 1) / BR) * (BR / 8) : 0);
  }
};

template <bool BF16, int D, bool DROP, bool WIN>
__global__ void __launch_bounds__(128, 2) flash_bwd_kernel(Params p) {
  using C = BwdCfg<BF16, D>;
  constexpr int BR = C::BR, BC = C::BC, NTH = C::kThreads;
  static_assert(BR == 64 && BC == 64, "dS^T tile uses the D = 64 swizzle");
  constexpr int KS = D / 16;   // k-steps over the head dim
  constexpr int NS = BR / 8;   // n-tiles of S^T (queries)
  constexpr int NO = D / 8;    // n-tiles of dK, dV, dQ
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = smem_addr(smem);
  const uint32_t k_s = base + C::kK, v_s = base + C::kV, q_s = base + C::kQ, do_s = base + C::kDO;
  const uint32_t ds_s = base + C::kS;
  const float* lse_s = reinterpret_cast<const float*>(smem + C::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + C::kDsum);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
  const int mi = lane >> 3, r8 = lane & 7;
  const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * BC;
  const int T = p.T;
  // TK: the sequence's tokens, T when padded (Note [packed attention] in ops/cpu/attention.cpp).
  const SeqRows sq = seq_rows(p, b);
  const int TK = sq.len;
  const HeadQkv qkv = head_qkv(p, sq, h);
  const auto [qg, kg, vg, rs] = qkv;
  const size_t bh = static_cast<size_t>(b) * p.heads + h;
  const uint16_t* dog = static_cast<const uint16_t*>(p.dctx) + sq.row0 * p.H + h * D;
  const float* lse_g = p.lse + bh * T;
  const float* dsum_g = p.dsum + bh * T;
  const int nq = (TK + BR - 1) / BR;

  // Window (Note [window tiles]): ubits bit q = query q is uniform; any_uni: some query is.
  const int kend = valid_key_end<NTH>(p.mask, b, TK);
  const bool keys_dead = kend > 0 && k0 >= kend;
  [[maybe_unused]] const int w = p.window < T ? p.window : T;
  [[maybe_unused]] const uint32_t* ubits = reinterpret_cast<const uint32_t*>(smem + C::kBytes) + nq * (BR / 32);
  bool any_uni = false;
  if constexpr (WIN) {
    uint32_t* vbits = reinterpret_cast<uint32_t*>(smem + C::kBytes);
    build_valid_bits<NTH>(vbits, p.mask, b, TK, nq * BR);
    __syncthreads();
    int mine = 0;
    for (int qw = warp * 32; qw < nq * BR; qw += NTH) {  // 32 queries a warp at a time
      const bool u = window_uniform(vbits, qw + lane, TK, w);
      const uint32_t word = __ballot_sync(0xffffffffu, u);
      if (lane == 0) vbits[nq * (BR / 32) + (qw >> 5)] = word;
      mine |= u;
    }
    any_uni = __syncthreads_or(mine) != 0;
  }
  // A query tile is visited when it may hold a nonzero P against this CTA's keys.
  auto visit = [&](int jt) {
    if constexpr (!WIN) return true;
    if ((ubits[2 * jt] | ubits[2 * jt + 1]) != 0) return true;  // BR = 64: two words a tile
    return !keys_dead && jt * BR + BR - 1 >= k0 - w && jt * BR <= k0 + BC - 1 + w;
  };
  auto next_tile = [&](int jt) {
    for (++jt; jt < nq && !visit(jt);) ++jt;
    return jt;
  };

  // Note [masked key tiles]: 64 masked keys have dK = dV = 0 and no share in dQ (unless a
  // uniform row sees them).
  if (keys_dead && !any_uni) {
    zero_key_grads<D, BC, NTH>(p, sq, h, k0, TK);
    return;
  }

  auto load_q_tile = [&](int jt, int st) {
    load_query_tile<BR, D, NTH>(q_s + st * C::kQBytes, do_s + st * C::kQBytes, base + C::kLse + st * BR * 4,
                                base + C::kDsum + st * BR * 4, qkv, dog, p, lse_g, dsum_g, jt, TK);
  };

  int j = next_tile(-1);
  load_tile<BC, D, NTH, true>(k_s, kg, rs, k0, TK);
  load_tile<BC, D, NTH, true>(v_s, vg, rs, k0, TK);
  if (j < nq) load_q_tile(j, 0);
  cp_async_commit();

  // Key bias of this thread's two key rows (fragment rows g, g+8 = keys 2g, 2g+1 of the warp's 16).
  float kbias[2];
  const bool any_valid = kend > 0;  // (valid_key_end is 0 when no key is valid)
  key_pair_bias(kbias, p, b, k0 + warp * 16 + 2 * g, TK, any_valid);
  const float scale_mul = any_valid ? p.scale * kLog2e : 0.0f;
  const auto [zk, zstep] = key_row_dropout(p, bh, k0, warp, g, t4);

  cp_async_wait_all();
  __syncthreads();

  // K and V fragments of this warp's 16 keys (A operand: rows = keys, k = head dim).
  uint32_t kf[KS][4], vf[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    ldsm_x4(kf[ks], k_s + swz<D>(warp * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    ldsm_x4(vf[ks], v_s + swz<D>(warp * 16 + (lane & 15), 2 * ks + (lane >> 4)));
  }
  float dk[NO][4], dv[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;

  for (int st = 0; j < nq; st ^= 1) {
    const int jn = next_tile(j);
    if (jn < nq) load_q_tile(jn, st ^ 1);
    cp_async_commit();
    const uint32_t qt = q_s + st * C::kQBytes, dot = do_s + st * C::kQBytes;

    // S^T = K Q^T and dPd^T = V dO^T; B operands from Q / dO [query][d]: plain ldmatrix.
    float s[NS][4], dp[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        uint32_t bq[4], bo[4];
        const uint32_t off = swz<D>(np * 16 + (mi >> 1) * 8 + r8, 2 * ks + (mi & 1));
        ldsm_x4(bq, qt + off);
        ldsm_x4(bo, dot + off);
        mma<BF16>(s[2 * np], kf[ks], bq[0], bq[1]);
        mma<BF16>(s[2 * np + 1], kf[ks], bq[2], bq[3]);
        mma<BF16>(dp[2 * np], vf[ks], bo[0], bo[1]);
        mma<BF16>(dp[2 * np + 1], vf[ks], bo[2], bo[3]);
      }

    // Element-wise: s <- P Z' (for dV), dp <- dS (backward_elements), n-tile by n-tile.
    [[maybe_unused]] const uint64_t zj = zk + static_cast<uint64_t>(j) * (BR / 2) * zstep;
    // Window: this warp's keys [k0 + warp*16, +16) against the tile's queries.
    [[maybe_unused]] bool win_tile = false;
    if constexpr (WIN) {
      const int ka = k0 + warp * 16, qa = j * BR;
      win_tile = (ubits[2 * j] | ubits[2 * j + 1]) != 0 || qa + BR - 1 - ka > w || ka + 15 - qa > w;
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const int c = n * 8 + 2 * t4;
      auto window = [&](float x, int e) {
        if constexpr (WIN) {
          if (win_tile) {
            const int q = j * BR + c + (e & 1);
            x = window_score(x, q, k0 + warp * 16 + 2 * g + (e >> 1), T, w, (ubits[q >> 5] >> (q & 31)) & 1u);
          }
        }
        return x;
      };
      const uint64_t bits = DROP ? dropout_mix(zj + static_cast<uint64_t>(n) * 4 * zstep) : 0;
      backward_elements<DROP>(s[n], dp[n], bits, lse_s + st * BR + c, dsum_s + st * BR + c, scale_mul, kbias, p, window);
    }

    // dV += (P Z')^T dO and dK += dS^T Q: A from the registers above (rows = keys,
    // k = queries); B from dO / Q [query][d] (k x n row-major): transposing ldmatrix.
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t ap[4], as[4];
      ap[0] = pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
      ap[1] = pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
      ap[2] = pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      ap[3] = pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      as[0] = pack2<BF16>(dp[2 * kk][0], dp[2 * kk][1]);
      as[1] = pack2<BF16>(dp[2 * kk][2], dp[2 * kk][3]);
      as[2] = pack2<BF16>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      as[3] = pack2<BF16>(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      // dS^T to shared memory for dQ (rows = keys, 16-byte chunk = 8 queries).
      const int kr = warp * 16 + g;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr, 2 * kk) + 4 * t4), "r"(as[0]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr + 8, 2 * kk) + 4 * t4), "r"(as[1]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr, 2 * kk + 1) + 4 * t4), "r"(as[2]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr + 8, 2 * kk + 1) + 4 * t4), "r"(as[3]));
#pragma unroll
      for (int np = 0; np < NO / 2; ++np) {
        uint32_t bo[4], bq[4];
        const uint32_t off = swz<D>(kk * 16 + (mi & 1) * 8 + r8, 2 * np + (mi >> 1));
        ldsm_x4_t(bo, dot + off);
        ldsm_x4_t(bq, qt + off);
        mma<BF16>(dv[2 * np], ap, bo[0], bo[1]);
        mma<BF16>(dv[2 * np + 1], ap, bo[2], bo[3]);
        mma<BF16>(dk[2 * np], as, bq[0], bq[1]);
        mma<BF16>(dk[2 * np + 1], as, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ rows [w*16, w*16+16) of this tile = dS (16 x BC) K (BC x D). A = dS from dS^T
    // [key][query] (transposing ldmatrix); B = K [key][d] (transposing ldmatrix).
    {
      float dq[NO][4];
#pragma unroll
      for (int n = 0; n < NO; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < BC / 16; ++ks) {
        uint32_t a[4];
        ldsm_x4_t(a, ds_s + swz<BR>(ks * 16 + (mi >> 1) * 8 + r8, 2 * warp + (mi & 1)));
#pragma unroll
        for (int np = 0; np < NO / 2; ++np) {
          uint32_t bk[4];
          ldsm_x4_t(bk, k_s + swz<D>(ks * 16 + (mi & 1) * 8 + r8, 2 * np + (mi >> 1)));
          mma<BF16>(dq[2 * np], a, bk[0], bk[1]);
          mma<BF16>(dq[2 * np + 1], a, bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int q = j * BR + warp * 16 + g + 8 * hf;
        if (q < TK) {
          float* row = p.dq_acc + (sq.row0 + q) * p.H + h * D + 2 * t4;
#pragma unroll
          for (int n = 0; n < NO; ++n) red_add_f32x2(row + n * 8, dq[n][2 * hf], dq[n][2 * hf + 1]);
        }
      }
    }
    cp_async_wait_all();
    __syncthreads();  // next stage landed; everyone is done with this stage and dS^T
    j = jn;
  }

  // Epilogue: dK * scale and dV * inv_keep, staged through this warp's own rows of the K and
  // V tiles (no other warp reads them after the last barrier), then 16-byte stores.
  store_key_grads<BF16, D, NTH>([&](int n, int e) { return dk[n][e]; }, [&](int n, int e) { return dv[n][e]; },
                                p.scale, DROP ? p.inv_keep : 1.0f, smem + C::kK, smem + C::kV, p, sq, h, k0, TK);
}

// ---- launchers ---------------------------------------------------------------------------
// The forward kernel: ANATOMY_ATTENTION_FWD=mma64 selects 64-query mma.sync tiles (16 rows per
// warp), "mma" 128 (32 rows per warp, their default), "wgmma" the wgmma kernel wherever it
// applies, which is also the default (head dims 32 and 64 without a window on Hopper: with its key
// tiles by TMA it beats mma.sync at 32 as well, 129 against 111 TFLOP/s at B 32, T 512, p 0.1;
// bench/results/2026-11-27-h200/session16/fwd32ab.md).
enum class FwdKernel { Auto, Wgmma, Mma, Mma64 };
FwdKernel fwd_kernel() {
  const char* v = "ANATOMY_ATTENTION_FWD";
  return env_is(v, "mma64") ? FwdKernel::Mma64 : env_is(v, "mma") ? FwdKernel::Mma
                                                  : env_is(v, "wgmma") ? FwdKernel::Wgmma : FwdKernel::Auto;
}
bool takes_wgmma(const Params& p) {
  const FwdKernel k = fwd_kernel();
  return (k == FwdKernel::Wgmma || k == FwdKernel::Auto) && wgmma_forward_supported(p);
}
int fwd_mt() { return fwd_kernel() == FwdKernel::Mma64 ? 1 : 2; }
// The backward: attention_wgmma_bwd.cu's kernel where it applies (head dims 32 and 64, no window,
// Hopper), unless ANATOMY_ATTENTION_BWD=mma (=wgmma64: its one-warpgroup CTAs); the mma.sync
// kernel everywhere else.
bool bwd_takes_wgmma(const Params& p) {
  return !env_is("ANATOMY_ATTENTION_BWD", "mma") && wgmma_forward_supported(p);
}

template <bool BF16, int D, int MT>
bool launch_fwd(const Params& p, int smem_limit, cudaStream_t s) {
  using C = FwdCfg<BF16, D, MT>;
  const bool win = p.window > 0;
  auto kernel = p.drop ? (win ? flash_fwd_kernel<BF16, D, MT, true, true> : flash_fwd_kernel<BF16, D, MT, true, false>)
                       : (win ? flash_fwd_kernel<BF16, D, MT, false, true> : flash_fwd_kernel<BF16, D, MT, false, false>);
  return launch_tiles(kernel, p, C::BR, C::kThreads, C::smem_bytes(p.T, win), smem_limit, s);
}

template <bool BF16, int D>
bool launch_bwd(const Params& p, int smem_limit, cudaStream_t s) {
  using C = BwdCfg<BF16, D>;
  const bool win = p.window > 0;
  auto kernel = p.drop ? (win ? flash_bwd_kernel<BF16, D, true, true> : flash_bwd_kernel<BF16, D, true, false>)
                       : (win ? flash_bwd_kernel<BF16, D, false, true> : flash_bwd_kernel<BF16, D, false, false>);
  return launch_tiles(kernel, p, C::BC, C::kThreads, C::smem_bytes(p.T, win), smem_limit, s);
}

}  // namespace

bool flash_supports(const Params& p) {
  // 16-byte cp.async / vector stores need 16-byte aligned rows and head slices.
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  return (p.D == 32 || p.D == 64 || p.D == 128) && p.H % 8 == 0 && aligned(p.qkv) && aligned(p.ctx) &&
         (p.dctx == nullptr || aligned(p.dctx)) && (p.dqkv == nullptr || aligned(p.dqkv));
}

// Head dim 128 keeps 64-query forward tiles: 32 rows per warp would not fit its Q fragments
// and O accumulators in registers.
template <bool BF16>
bool forward_for(const Params& p, int smem_limit, cudaStream_t s) {
  const bool mt1 = fwd_mt() == 1;
  switch (p.D) {
    case 32: return mt1 ? launch_fwd<BF16, 32, 1>(p, smem_limit, s) : launch_fwd<BF16, 32, 2>(p, smem_limit, s);
    case 64: return mt1 ? launch_fwd<BF16, 64, 1>(p, smem_limit, s) : launch_fwd<BF16, 64, 2>(p, smem_limit, s);
    case 128: return launch_fwd<BF16, 128, 1>(p, smem_limit, s);
    default: return false;
  }
}

template <bool BF16>
bool backward_for(const Params& p, int smem_limit, cudaStream_t s) {
  switch (p.D) {
    case 32: return launch_bwd<BF16, 32>(p, smem_limit, s);
    case 64: return launch_bwd<BF16, 64>(p, smem_limit, s);
    case 128: return launch_bwd<BF16, 128>(p, smem_limit, s);
    default: return false;
  }
}

bool flash_fits(int T, int D, int smem_limit) {
  auto fits = [&](size_t fwd, size_t bwd) { return fwd <= static_cast<size_t>(smem_limit) && bwd <= static_cast<size_t>(smem_limit); };
  const bool mt1 = fwd_mt() == 1;
  switch (D) {  // the element type does not change the sizes; with a window (the larger)
    case 32: return fits(mt1 ? FwdCfg<true, 32, 1>::smem_bytes(T, true) : FwdCfg<true, 32, 2>::smem_bytes(T, true),
                         BwdCfg<true, 32>::smem_bytes(T, true));
    case 64: return fits(mt1 ? FwdCfg<true, 64, 1>::smem_bytes(T, true) : FwdCfg<true, 64, 2>::smem_bytes(T, true),
                         BwdCfg<true, 64>::smem_bytes(T, true));
    case 128: return fits(FwdCfg<true, 128, 1>::smem_bytes(T, true), BwdCfg<true, 128>::smem_bytes(T, true));
    default: return false;
  }
}

const char* flash_forward_kernel(const Params& p) { return takes_wgmma(p) ? "wgmma" : "mma"; }
const char* flash_backward_kernel(const Params& p) { return bwd_takes_wgmma(p) ? "wgmma" : "mma"; }

bool flash_forward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s) {
  if (!flash_supports(p)) return false;
  if (takes_wgmma(p) && wgmma_forward(p, is_bf16, smem_limit, s)) return true;
  return is_bf16 ? forward_for<true>(p, smem_limit, s) : forward_for<false>(p, smem_limit, s);
}

bool flash_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s) {
  if (!flash_supports(p)) return false;
  if (bwd_takes_wgmma(p) && wgmma_backward(p, is_bf16, smem_limit, s)) return true;
  return is_bf16 ? backward_for<true>(p, smem_limit, s) : backward_for<false>(p, smem_limit, s);
}

}  // namespace anatomy::cuda::attn
