// Attention forward for Hopper (sm_90a): the tensor-core products through wgmma, one warpgroup
// (4 warps, 128 threads) per 64 query rows, operands read by the tensor cores straight from
// shared memory, key tiles brought by TMA (Note [tma key tiles]). Head dims 32 and 64, no
// local window (that stays on attention_flash.cu's mma.sync kernels). The math is
// attention_common.cuh's; the tiles, their swizzle and the paired rows of dropout are
// attention_tiles.cuh's; the wgmma instructions and descriptors wgmma.cuh's.
//
// Note [wgmma forward]
// Per warpgroup and key tile of BC keys: S = Q K^T is wgmma m64nBCk16 with both operands in
// shared memory (Q [64][D] and K [BC][D], each K-major: the head dim contiguous); the online
// softmax and the dropout run on S's accumulators, whose layout per warp is mma.sync's C layout
// (warp w of the group holds rows 16w..16w+15, a thread rows g, g+8 and columns 8n + 2t, +1), so
// the paired rows carry over: Q is loaded with its rows permuted (perm16) and a thread's four
// elements of an n-tile are one 2x2 dropout block, one hash. The probabilities, packed to 16 bits,
// are already the A fragments of O += P V (wgmma m64nDk16, A from registers, V [BC][D] read
// MN-major through the transpose bit). A product's registers are read, and its A registers
// rewritten, only after its wait (wgmma_wait, then a compiler fence on them); the softmax of one
// tile runs while the tensor cores do the previous tile's P V (see the kernel).
#include <cudaTypedefs.h>

#include <atomic>

#include "ops/cuda/attention_tiles.cuh"
#include "ops/cuda/tma.cuh"
#include "ops/cuda/wgmma.cuh"

namespace anatomy::cuda::attn {
namespace {

// ---- one key tile on S's accumulators ------------------------------------------------------
// The thread's element (n, e) of a 64 x BC tile is s[4n + e]: row g + 8 (e >> 1) of its warp's
// 16, column 8n + 2 t4 + (e & 1); a row's 4 threads are lanes 4g..4g+3.

// Note [lazy rescale] (FlashAttention-4's): a row's running max m moves only when a tile's max
// exceeds it by more than this (log2 domain, a factor 256), so after the first tiles O is rarely
// rescaled (32 multiplications a thread and tile at D 64, and the two exponentials of corr). The
// probabilities exp2(s - m) of a tile then reach 2^8 at most: fp32 sums, bf16 P V operands whose
// relative rounding is the same at any scale; lse = m + log2(l) whichever m was kept.
constexpr float kLazyRescale = 8.0f;

// Scale and key bias (log2 domain), the running max m and sum l (undropped) of rows g, g + 8;
// s becomes exp2(s - m), corr the factor for what was accumulated before (Note [lazy rescale]).
template <int NS>
__device__ __forceinline__ void online_softmax(float (&s)[4 * NS], const float* kb, float scale_mul, int t4,
                                               float (&m)[2], float (&l)[2], float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    const float2 bias = *reinterpret_cast<const float2*>(kb + n * 8 + 2 * t4);
    s[4 * n + 0] = fmaf(s[4 * n + 0], scale_mul, bias.x);
    s[4 * n + 1] = fmaf(s[4 * n + 1], scale_mul, bias.y);
    s[4 * n + 2] = fmaf(s[4 * n + 2], scale_mul, bias.x);
    s[4 * n + 3] = fmaf(s[4 * n + 3], scale_mul, bias.y);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = m[hf];
#pragma unroll
    for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * hf], s[4 * n + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // The max moves only past m + kLazyRescale (Note [lazy rescale]); else corr is 1 and O keeps
    // its scale. The row's four threads hold the same mx, so they decide alike; -inf - -inf is
    // NaN, so no move while no score is finite.
    const bool grow = mx - m[hf] > kLazyRescale;
    const float mnew = grow ? mx : m[hf];
    const float mu = mnew == -INFINITY ? 0.0f : mnew;  // no finite score yet: exp2(-inf - 0) = 0
    corr[hf] = grow ? fast_exp2(m[hf] - mu) : 1.0f;
    m[hf] = mnew;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      const float e0 = fast_exp2(s[4 * n + 2 * hf] - mu), e1 = fast_exp2(s[4 * n + 2 * hf + 1] - mu);
      s[4 * n + 2 * hf] = e0;
      s[4 * n + 2 * hf + 1] = e1;
      sum += e0 + e1;
    }
    l[hf] = l[hf] * corr[hf] + sum;  // thread-partial row sum; reduced at the end
  }
}

// Zeroes the dropped elements: n-tile n is the 2x2 block of group bits dropout_mix(z + 4n kGolden)
// (Note [paired rows]).
template <int NS>
__device__ __forceinline__ void drop_tile(float (&s)[4 * NS], uint64_t z, uint32_t thr_m1) {
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    bool keep[4];
    keep4(keep, dropout_mix(z + static_cast<uint64_t>(n) * (4 * kGolden)), thr_m1);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!keep[e]) s[4 * n + e] = 0.0f;
  }
}

template <int NO>
__device__ __forceinline__ void rescale(float (&o)[4 * NO], const float (&corr)[2]) {
  if (corr[0] == 1.0f && corr[1] == 1.0f) return;  // Note [lazy rescale]
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    o[4 * n + 0] *= corr[0];
    o[4 * n + 1] *= corr[0];
    o[4 * n + 2] *= corr[1];
    o[4 * n + 3] *= corr[1];
  }
}

// P as the A fragments of O += P V: key step kk is n-tiles 2kk and 2kk + 1, packed to 16 bits.
template <bool BF16, int KK>
__device__ __forceinline__ void pack_p(uint32_t (&a)[KK][4], const float (&s)[8 * KK]) {
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    a[kk][0] = pack2<BF16>(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pack2<BF16>(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pack2<BF16>(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pack2<BF16>(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// ---- the kernel ----------------------------------------------------------------------------
// Grid (ceil(T / BR), heads, B); 2 warpgroups, each 64 query rows of the CTA's BR = 128; K/V
// tiles of BC = 64 keys streamed (by TMA, or cp.async), kAhead tiles ahead of the one computed
// (2 by default: launch_for), in STAGES buffers. Shared memory (1024-byte aligned): Q [BR][D] |
// K [STAGES][BC][D] | V [STAGES][BC][D] | key bias [ceil(T/BC)*BC] f32.
//
// OVL (the default): tile j's S = Q K_j^T is issued together with tile j-1's O += P V_{j-1},
// and tile j's softmax and dropout run while the tensor cores do that P V; O is rescaled once it
// lands (FlashAttention-3's overlap within a warpgroup). V_{j-1} is still read while tile j +
// kAhead loads, so one buffer more. Without OVL each product is waited for at once. In the
// binary, ptxas moves the wait for P V up to before the softmax's exponentials (a wait names no
// registers); forcing the written order (first tile peeled, a shared store ahead of the wait)
// changed the step by nothing measurable (bench/results/2026-11-28-h200/session23/call2): the
// two CTAs of two warpgroups on each SM hide it, and with dropout the schedulers are the limit.
//
// TMA (the default with OVL): thread 0 issues each K/V tile as two TMA copies (Note [tma key
// tiles]) and the warpgroups wait on the stage's barrier instead of a CTA-wide __syncthreads per
// tile, so the two warpgroups drift apart and one's softmax runs while the other's products do.
// Its barriers follow the key bias: full [STAGES] | empty [STAGES], 8 bytes each.
template <int D, bool OVL, int AHEAD>
struct WgFwdCfg {
  static constexpr int kThreads = 256, BR = 128, BC = 64, kAhead = AHEAD, STAGES = kAhead + (OVL ? 2 : 1);
  static constexpr int kQBytes = BR * D * 2, kKVBytes = BC * D * 2;
  static constexpr int kBiasOffset = kQBytes + 2 * STAGES * kKVBytes;
  __host__ __device__ static int bias_floats(int T) { return (T + BC - 1) / BC * BC; }
  static size_t smem_bytes(int T) { return 1024 + kBiasOffset + static_cast<size_t>(bias_floats(T)) * 4 + 16 * STAGES; }
};

template <bool BF16, int D, bool OVL, bool DROP, int AHEAD_, bool TMA>
__global__ void __launch_bounds__(256, 2) wgmma_fwd_kernel(Params p, const __grid_constant__ CUtensorMap kv_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgFwdCfg<D, OVL, AHEAD_>;
  static_assert(!TMA || OVL, "the TMA loads are written for the overlapped loop");
  constexpr int BR = C::BR, BC = C::BC, NTH = C::kThreads, ST = C::STAGES, AHEAD = C::kAhead;
  constexpr int KS = D / 16;  // k-steps of Q K^T
  constexpr int NS = BC / 8;  // n-tiles of S
  constexpr int KK = BC / 16;  // k-steps of P V
  constexpr uint32_t kRow = D * 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t q_s = smem_addr(smem);
  const uint32_t k_s = q_s + C::kQBytes;  // tile j at k_s + (j % ST) * kKVBytes
  const uint32_t v_s = k_s + ST * C::kKVBytes;
  float* kb = reinterpret_cast<float*>(smem + C::kBiasOffset);
  const uint32_t full_bar = smem_addr(smem) + C::kBiasOffset + C::bias_floats(p.T) * 4;  // stage s: + 8 s
  const uint32_t empty_bar = full_bar + 8 * ST;

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BR;
  const int T = p.T;
  const SeqRows sq = seq_rows(p, b);  // TK: the sequence's tokens, T when padded
  const int TK = sq.len;
  if (forward_tile_absent<BR, NTH>(p, b, h, q0, TK) || forward_tile_out_of_scope<BR, D, NTH>(p, sq, b, h, q0, TK))
    return;
  const auto [qg, kg, vg, rs] = head_qkv(p, sq, h);
  const int nkv_all = (T + BC - 1) / BC;
  load_tile<BR, D, NTH, true>(q_s, qg, rs, q0, TK);  // (its copies run during the mask's scan)
  const int kend = valid_key_end<NTH>(p.mask, b, TK);
  const int jend = kend > 0 ? (kend + BC - 1) / BC : nkv_all;  // Note [masked key tiles]
  // cp.async: one group per tile (empty past the last): tile j is in shared memory once at most
  // AHEAD - 1 younger groups are pending. TMA: thread 0 issues tile j once every consumer warp
  // has released the stage's previous tile (j - ST).
  auto load_kv = [&](int j) {
    if constexpr (TMA) {
      if (threadIdx.x != 0 || j >= jend) return;
      const int s = j % ST;
      if (j >= ST) mbar_wait(empty_bar + 8 * s, (j / ST - 1) & 1);
      mbar_arrive_expect_tx(full_bar + 8 * s, 2 * C::kKVBytes);
      const int row = static_cast<int>(sq.row0) + j * BC, col = h * D;
      tma_load_2d(k_s + s * C::kKVBytes, &kv_map, p.H + col, row, full_bar + 8 * s);
      tma_load_2d(v_s + s * C::kKVBytes, &kv_map, 2 * p.H + col, row, full_bar + 8 * s);
    } else {
      if (j < jend) {
        load_tile<BC, D, NTH>(k_s + (j % ST) * C::kKVBytes, kg, rs, j * BC, TK);
        load_tile<BC, D, NTH>(v_s + (j % ST) * C::kKVBytes, vg, rs, j * BC, TK);
      }
      cp_async_commit();
    }
  };
  auto next_tile_ready = [] {  // cp.async: for every thread and for the tensor cores' reads
    if constexpr (!TMA) {
      cp_async_wait<AHEAD - 1>();
      fence_proxy_async();
      __syncthreads();
    }
  };
  auto wait_tile = [&](int j) {
    if constexpr (TMA) mbar_wait(full_bar + 8 * (j % ST), (j / ST) & 1);
  };
  auto release_tile = [&](int j) {  // TMA: this warp's products on tile j have completed
    if constexpr (TMA) {
      if (lane == 0) mbar_arrive(empty_bar + 8 * (j % ST));
    }
  };

  if constexpr (TMA) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < ST; ++s) {
        mbar_init(full_bar + 8 * s, 1);
        mbar_init(empty_bar + 8 * s, NTH / 32);
      }
      mbar_init_fence();
    }
    __syncthreads();
  }
  if constexpr (TMA) cp_async_commit();  // the query tile alone (cp.async: with key tile 0)
#pragma unroll
  for (int j = 0; j < AHEAD; ++j) load_kv(j);
  const bool any_valid = kend > 0;  // (valid_key_end is 0 when no key is valid)
  build_key_bias(kb, p.mask, b, TK, 0, nkv_all * BC, any_valid);
  const float scale_mul = any_valid ? p.scale * kLog2e : 0.0f;  // s2 = s * scale_mul + kb
  // The query tile (cp.async: and key tile 0) and the key bias, for every thread and the tensor cores.
  cp_async_wait<TMA ? 0 : AHEAD - 1>();
  fence_proxy_async();
  __syncthreads();

  const int row0 = wg * 64 + warp * 16;  // the warp's 16 rows of the CTA's tile (paired)
  const uint64_t q_desc = tile_desc<D>(q_s + wg * 64 * kRow);
  float s[BC / 2], o[D / 2];
  uint32_t a[KK][4] = {};
  auto issue_s = [&](int j) {
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) wgmma_ss<BF16>(s, q_desc + 2 * ks, tile_desc<D>(k_s + (j % ST) * C::kKVBytes) + 2 * ks, ks);
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) wgmma_rs<BF16>(o, a[kk], tile_desc<D>(v_s + (j % ST) * C::kKVBytes + kk * 16 * kRow));
    wgmma_commit();
  };
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
  // Dropout counter of the thread's 2x2 block at n-tile 0 of key tile j (as attention_flash.cu's
  // forward): rows 2g, 2g+1 of the warp's slice, keys j*BC + 2*t4 + {0, 1}.
  const uint64_t tp = (static_cast<uint64_t>(T) + 1) >> 1;
  const uint64_t qpair = static_cast<uint64_t>((q0 + row0) / 2 + g);
  const uint64_t z0 = p.rng_key + (((static_cast<uint64_t>(b) * p.heads + h) * tp + qpair) * tp + t4) * kGolden;

  for (int j = 0; j < jend; ++j) {
    load_kv(j + AHEAD);
    if constexpr (TMA) __syncwarp();  // thread 0's loads done: warp 0 whole again for the wgmma
    wait_tile(j);
    issue_s(j);
    if (OVL && j > 0) {
      issue_pv(j - 1);
      wgmma_wait<1>();  // S_j landed; P_{j-1} V_{j-1} may still run
    } else {
      wgmma_wait<0>();
    }
    fence_regs(s);
    online_softmax<NS>(s, kb + j * BC, scale_mul, t4, m, l, corr);
    if constexpr (DROP) drop_tile<NS>(s, z0 + static_cast<uint64_t>(j) * (BC / 2) * kGolden, p.thr_m1);
    if constexpr (OVL) {
      wgmma_wait<0>();
      if (j > 0) release_tile(j - 1);
    }
    fence_regs(o);
    fence_regs(a);
    rescale<D / 8>(o, corr);
    pack_p<BF16>(a, s);
    if constexpr (!OVL) {
      issue_pv(j);
      wgmma_wait<0>();
      fence_regs(o);
    }
    next_tile_ready();
  }
  if constexpr (OVL) {
    issue_pv(jend - 1);
    wgmma_wait<0>();
    fence_regs(o);
  }

  // Epilogue: normalize, write lse, stage O through the warp's own rows of the Q tile (whose last
  // reader, this warpgroup's final S, has completed), then 16-byte coalesced stores.
  const float out_mul = DROP ? p.inv_keep : 1.0f;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float mu = m[hf] == -INFINITY ? 0.0f : m[hf];
    const int row = row0 + g + 8 * hf, q = q0 + perm16(row);
    if (t4 == 0 && q < T)
      p.lse[(static_cast<size_t>(b) * p.heads + h) * T + q] = q < TK ? (mu + __log2f(sum)) * kLn2 : 0.0f;
    const float inv = out_mul / sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(smem + swz<D>(row, n) + 4 * t4) = pack2<BF16>(o[4 * n + 2 * hf] * inv, o[4 * n + 2 * hf + 1] * inv);
  }
  __syncwarp();
  store_o_rows<D>(smem, row0, 16, q0, TK, p, sq, h, lane);
#endif
}

std::atomic<int64_t> g_tma_fallbacks{0};

template <bool BF16, int D, bool OVL, int AHEAD, bool TMA = false>
bool launch(const Params& p, int smem_limit, cudaStream_t s) {
  using C = WgFwdCfg<D, OVL, AHEAD>;
  CUtensorMap map{};
  if constexpr (TMA) {
    if (!make_tile_map(&map, p.qkv, total_rows(p), 3 * static_cast<uint64_t>(p.H), C::BC, D)) {
      count_tma_fallback();
      return launch<BF16, D, OVL, AHEAD>(p, smem_limit, s);
    }
  }
  auto kernel = p.drop ? wgmma_fwd_kernel<BF16, D, OVL, true, AHEAD, TMA> : wgmma_fwd_kernel<BF16, D, OVL, false, AHEAD, TMA>;
  return launch_tiles(kernel, p, C::BR, C::kThreads, C::smem_bytes(p.T), smem_limit, s, map);
}

// ANATOMY_ATTENTION_WGMMA=sync: each product waited for at once (no overlap); for measuring.
// Key tiles load two tiles ahead: at B 32, T 512, D 64 (H200) the forward runs 184.5-186 TFLOP/s
// with dropout 0.1 and 244 without, against 181 and 238 one tile ahead, and three ahead gains
// nothing more (bench/results/2026-11-27-h200/session16/aheadab.md, measured as
// scripts/device.sh attentionab does with the settings below). For measuring: ANATOMY_ATTENTION_FWD_AHEAD=1 loads one tile ahead
// by cp.async, ANATOMY_ATTENTION_FWD_LOAD=cp.async two ahead by cp.async (with a CTA barrier
// per tile), instead of TMA (the default; "tma" names it).
template <bool BF16, int D>
bool launch_for(const Params& p, int smem_limit, cudaStream_t s) {
  if (env_is("ANATOMY_ATTENTION_WGMMA", "sync")) return launch<BF16, D, false, 1>(p, smem_limit, s);
  if (env_is("ANATOMY_ATTENTION_FWD_AHEAD", "1")) return launch<BF16, D, true, 1>(p, smem_limit, s);
  if (env_is("ANATOMY_ATTENTION_FWD_LOAD", "cp.async")) return launch<BF16, D, true, 2>(p, smem_limit, s);
  return launch<BF16, D, true, 2, true>(p, smem_limit, s);
}

bool device_is_sm90() {
  static const bool yes = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
  }();
  return yes;
}

}  // namespace

bool make_tile_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                   uint32_t box_cols, bool f32) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const uint32_t elem_bytes = f32 ? 4 : 2, width = box_cols * elem_bytes;
  if (encode == nullptr || (width != 64 && width != 128)) return false;
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * elem_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows}, elem[2] = {1, 1};
  const CUtensorMapSwizzle swizzle = width == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const CUtensorMapDataType type = f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int64_t tma_fallbacks() { return g_tma_fallbacks.load(std::memory_order_relaxed); }
void count_tma_fallback() { g_tma_fallbacks.fetch_add(1, std::memory_order_relaxed); }

bool wgmma_forward_supported(const Params& p) {
#if defined(ANATOMY_WITH_SM90A)
  return (p.D == 32 || p.D == 64) && p.window == 0 && device_is_sm90();
#else
  return false;
#endif
}

bool wgmma_forward(const Params& p, bool is_bf16, int smem_limit, cudaStream_t s) {
  if (!wgmma_forward_supported(p)) return false;
  if (p.D == 32) return is_bf16 ? launch_for<true, 32>(p, smem_limit, s) : launch_for<false, 32>(p, smem_limit, s);
  return is_bf16 ? launch_for<true, 64>(p, smem_limit, s) : launch_for<false, 64>(p, smem_limit, s);
}

}  // namespace anatomy::cuda::attn
