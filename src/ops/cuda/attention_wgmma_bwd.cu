// Attention backward for Hopper (sm_90a): attention_flash.cu's backward with its five products
// on wgmma. Head dims 32 and 64, no local window (that stays on the mma.sync kernel). The math is
// attention_common.cuh's; the tiles, their swizzle and the paired rows attention_tiles.cuh's; the
// wgmma instructions and descriptors wgmma.cuh's.
//
// Note [wgmma backward]
// One warpgroup a CTA owns 64 keys (K and V loaded with their rows paired, perm16) and streams
// 64-query tiles of Q, dO, lse and Dsum, as the mma.sync kernel does. Per query tile, in the
// transposed frame (rows = keys, columns = queries), each from shared memory:
//   S^T = K Q^T and dP^T = V dO^T     wgmma m64n64k16, A = K / V, B = Q / dO, all K-major;
// the element-wise step (P, dropout, dS) is the mma.sync kernel's, on accumulators of the same
// layout (a thread's four elements of an n-tile are one 2x2 dropout block); then
//   dV += (P Z')^T dO and dK += dS^T Q   A from registers, B = dO / Q read MN-major;
//   dQ = dS K                             A = dS^T in shared memory read MN-major (the transpose
//                                         bit), B = K read MN-major; added to the F32 accumulator.
// dK and dV stay in registers across the query tiles.
#include "ops/cuda/attention_tiles.cuh"
#include "ops/cuda/wgmma.cuh"

namespace anatomy::cuda::attn {
namespace {

// Shared memory (1024-byte aligned): K [64][D] | V [64][D] | Q [2][64][D] | dO [2][64][D] |
// dS^T [64][64] | lse [2][64] | Dsum [2][64] f32.
template <int D>
struct WgBwdCfg {
  static constexpr int kThreads = 128, BC = 64, BR = 64;
  static constexpr int kKBytes = BC * D * 2, kQBytes = BR * D * 2, kSBytes = BC * BR * 2;
  static constexpr int kK = 0, kV = kKBytes, kQ = 2 * kKBytes, kDO = kQ + 2 * kQBytes, kS = kDO + 2 * kQBytes;
  static constexpr int kLse = kS + kSBytes, kDsum = kLse + 2 * BR * 4;
  static constexpr int kBytes = kDsum + 2 * BR * 4;
  static size_t smem_bytes() { return 1024 + kBytes; }
};

template <bool BF16, int D, bool DROP>
__global__ void __launch_bounds__(128, 2) wgmma_bwd_kernel(Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgBwdCfg<D>;
  constexpr int BR = C::BR, BC = C::BC, NTH = C::kThreads;
  constexpr int KS = D / 16;  // k-steps over the head dim
  constexpr int NS = BR / 8;  // n-tiles of S^T (queries)
  constexpr uint32_t kRow = D * 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t base = smem_addr(smem);
  const uint32_t k_s = base + C::kK, v_s = base + C::kV, q_s = base + C::kQ, do_s = base + C::kDO;
  const uint32_t ds_s = base + C::kS;
  const float* lse_s = reinterpret_cast<const float*>(smem + C::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + C::kDsum);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
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
  const int nq = (TK + BR - 1) / BR;

  // Note [masked key tiles]: 64 masked keys have dK = dV = 0 and no share in dQ.
  const int kend = valid_key_end<NTH>(p.mask, b, TK);
  if (kend > 0 && k0 >= kend) {
    zero_key_grads<D, BC, NTH>(p, sq, h, k0, TK);
    return;
  }

  auto load_q_tile = [&](int jt, int st) {
    load_query_tile<BR, D, NTH>(q_s + st * C::kQBytes, do_s + st * C::kQBytes, base + C::kLse + st * BR * 4,
                                base + C::kDsum + st * BR * 4, qkv, dog, p, lse_g, dsum_g, jt, TK);
  };

  load_tile<BC, D, NTH, true>(k_s, kg, rs, k0, TK);
  load_tile<BC, D, NTH, true>(v_s, vg, rs, k0, TK);
  if (nq > 0) load_q_tile(0, 0);
  cp_async_commit();

  // Key bias of this thread's two key rows (fragment rows g, g+8 = keys 2g, 2g+1 of the warp's 16).
  float kbias[2];
  const bool any_valid = key_pair_bias<NTH>(kbias, p, b, k0 + warp * 16 + 2 * g, TK);
  const float scale_mul = any_valid ? p.scale * kLog2e : 0.0f;
  const auto [zk, zstep] = key_row_dropout(p, bh, k0, warp, g, t4);

  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();

  const uint64_t k_desc = tile_desc<D>(k_s), v_desc = tile_desc<D>(v_s);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.0f;

  for (int j = 0, st = 0; j < nq; ++j, st ^= 1) {
    if (j + 1 < nq) load_q_tile(j + 1, st ^ 1);
    cp_async_commit();
    const uint32_t qt = q_s + st * C::kQBytes, dot = do_s + st * C::kQBytes;

    // S^T = K Q^T, dP^T = V dO^T. Element (n, e): s[4n + e], key row g + 8 (e >> 1) of the
    // warp's 16, query 8n + 2 t4 + (e & 1).
    float s[BR / 2], dp[BR / 2];
#pragma unroll
    for (int i = 0; i < BR / 2; ++i) s[i] = dp[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      wgmma_ss<BF16>(s, k_desc + 2 * ks, tile_desc<D>(qt) + 2 * ks, ks);
      wgmma_ss<BF16>(dp, v_desc + 2 * ks, tile_desc<D>(dot) + 2 * ks, ks);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);

    // Element-wise: s <- P Z' (for dV), dp <- dS (backward_elements), n-tile by n-tile.
    const uint64_t zj = zk + static_cast<uint64_t>(j) * (BR / 2) * zstep;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const int c = n * 8 + 2 * t4;
      const uint64_t bits = DROP ? mix64(zj + static_cast<uint64_t>(n) * 4 * zstep) : 0;
      backward_elements<DROP>(&s[4 * n], &dp[4 * n], bits, lse_s + st * BR + c, dsum_s + st * BR + c, scale_mul, kbias,
                              p, [](float x, int) { return x; });
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
      const int kr = warp * 16 + g;  // a[0]: row g, queries 16kk + 2t4; a[1] row g + 8; a[2], a[3] +8 queries
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr, 2 * kk) + 4 * t4), "r"(as[kk][0]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr + 8, 2 * kk) + 4 * t4), "r"(as[kk][1]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr, 2 * kk + 1) + 4 * t4), "r"(as[kk][2]));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_s + swz<BR>(kr + 8, 2 * kk + 1) + 4 * t4), "r"(as[kk][3]));
    }
    // dV += (P Z')^T dO, dK += dS^T Q: B = dO / Q [query][d], 16 queries a k-step.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      wgmma_rs<BF16>(dv, ap[kk], tile_desc<D>(dot + kk * 16 * kRow));
      wgmma_rs<BF16>(dk, as[kk], tile_desc<D>(qt + kk * 16 * kRow));
    }
    wgmma_commit();
    fence_proxy_async();  // dS^T: this thread's stores, before the barrier and the dQ product
    __syncthreads();

    // dQ (64 queries x D) = dS K: A = dS^T [key][query] read MN-major, B = K [key][d] MN-major,
    // 16 keys a k-step. Row (query) 16 warp + g + 8 hf, columns 8n + 2 t4 + {0, 1}.
    float dq[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BC / 16; ++ks)
      wgmma_ss<BF16, true>(dq, tile_desc<BR>(ds_s + ks * 16 * BR * 2), tile_desc<D>(k_s + ks * 16 * kRow), ks);
    wgmma_commit();
    wgmma_wait<0>();  // this tile's dV, dK and dQ products
    fence_regs(dq);
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(ap);
    fence_regs(as);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int q = j * BR + warp * 16 + g + 8 * hf;
      if (q < TK) {
        float* row = p.dq_acc + (sq.row0 + q) * p.H + h * D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) red_add_f32x2(row + n * 8, dq[4 * n + 2 * hf], dq[4 * n + 2 * hf + 1]);
      }
    }
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // next stage landed; every read of this stage and of dS^T is done
  }

  // Epilogue: dK * scale and dV * inv_keep, staged through this warp's own rows of the K and
  // V tiles (all their readers have completed), then 16-byte stores.
  store_key_grads<BF16, D, NTH>([&](int n, int e) { return dk[4 * n + e]; }, [&](int n, int e) { return dv[4 * n + e]; },
                                p.scale, DROP ? p.inv_keep : 1.0f, smem + C::kK, smem + C::kV, p, sq, h, k0, TK);
#endif
}

template <bool BF16, int D>
bool launch(const Params& p, int smem_limit, cudaStream_t s) {
  using C = WgBwdCfg<D>;
  auto kernel = p.drop ? wgmma_bwd_kernel<BF16, D, true> : wgmma_bwd_kernel<BF16, D, false>;
  return launch_tiles(kernel, p, C::BC, C::kThreads, C::smem_bytes(), smem_limit, s);
}

}  // namespace

bool wgmma_backward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s) {
  if (!wgmma_forward_supported(p)) return false;  // the same shapes and devices
  if (p.D == 32) return is_bf16 ? launch<true, 32>(p, smem_limit, s) : launch<false, 32>(p, smem_limit, s);
  return is_bf16 ? launch<true, 64>(p, smem_limit, s) : launch<false, 64>(p, smem_limit, s);
}

}  // namespace anatomy::cuda::attn
