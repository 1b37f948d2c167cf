// The F32 attention path: cuBLAS strided-batched GEMMs over the heads of one sample, with the
// score matrix materialized in scratch, and two small row kernels around them.
//
// Layout (column-major views, as cuBLAS sees them; one sample b, heads batched with stride D):
//   Qc, Kc, Vc: D x T, ld 3H, at qkv + b*T*3H + {0, H, 2H} + h*D      (column t = token t)
//   dOc, Oc:    D x T, ld H,  at dctx/ctx + b*T*H + h*D
//   Sc:         T x T, ld T,  at S + h*T*T; Sc(k, q) = S[q][k], i.e. row-major [q][k]
// Forward:   Sc = scale * Kc^T Qc;  softmax rows (in place: Sc <- P * Z);  Oc = Vc Sc
// Backward:  Sc = scale * Kc^T Qc;  dPc = Vc^T dOc;  row kernel: Sc <- P * Z, dPc <- dS;
//            dVc = dOc Sc^T;  dQc = scale * Kc dPc;  dKc = scale * Qc dPc^T
// with P = exp(s - lse) (0 for masked keys, 1/T everywhere in a sample with no valid key),
// Z = keep / (1 - p), dS = P (Z dPd - Dsum), Dsum = dO . O (attention_common.cuh).
// Scratch per call: two [heads, T, T] F32 buffers after the Dsum part (ops/backend_memory.h).
#include <cublas_v2.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/check.h"

namespace anatomy::cuda::attn {
namespace {

// Row kernels: one warp per row (query) of one head, 8 rows per block; lanes stride the keys
// (coalesced 128-byte accesses), unrolled so that several loads are in flight per warp.
constexpr int kRowThreads = 256;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowsPerBlock = kRowWarps;

// Forward row kernel for sample b: rows r = h*T + q of S [heads*T, T] (scaled scores).
// Pass 1: max and sum over the valid keys (online, per lane, then across the warp). A row
// with no valid key is the uniform row (lse = log T). Pass 2: S <- P * Z and lse.
__global__ void __launch_bounds__(kRowThreads) softmax_forward_kernel(Params p, int b, float* S) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = p.T;
  const int rows = p.heads * T;
  const int32_t* mask = p.mask ? p.mask + static_cast<size_t>(b) * T : nullptr;
  for (int r = blockIdx.x * kRowsPerBlock + warp; r < min(rows, (blockIdx.x + 1) * kRowsPerBlock); r += kRowWarps) {
    float* row = S + static_cast<size_t>(r) * T;
    float m = -INFINITY, l = 0.0f;
#pragma unroll 4
    for (int k = lane; k < T; k += 32) {
      if (mask != nullptr && mask[k] == 0) continue;
      const float s = row[k];
      if (s > m) {
        l = l * expf(m - s) + 1.0f;
        m = s;
      } else {
        l += expf(s - m);
      }
    }
    float mx = m;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const bool any = mx != -INFINITY;  // the sample has a valid key (the mask row is the same for all rows)
    float sum = m == -INFINITY ? 0.0f : l * expf(m - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float lse = any ? mx + logf(sum) : logf(static_cast<float>(T));
    const size_t lse_idx = static_cast<size_t>(b) * rows + r;  // ((b*heads + h)*T + q)
    if (lane == 0) p.lse[lse_idx] = lse;
    const float uniform_p = expf(-lse);
    const uint64_t bh = static_cast<uint64_t>(b) * p.heads + r / T;
    const int q = r % T;
#pragma unroll 4
    for (int k = lane; k < T; k += 32) {
      float pr;
      if (!any) pr = uniform_p;
      else if (mask != nullptr && mask[k] == 0) pr = 0.0f;
      else pr = expf(row[k] - lse);
      if (p.drop) pr = attn_keep(p, bh, q, k) ? pr * p.inv_keep : 0.0f;
      row[k] = pr;
    }
  }
}

// Backward row kernel for sample b: S holds the recomputed scaled scores, dP = dO V^T (dropped
// side). Writes S <- P * Z (for dV) and dP <- dS = P (Z dPd - Dsum) (for dQ, dK).
__global__ void __launch_bounds__(kRowThreads) softmax_backward_kernel(Params p, int b, float* S, float* dP) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = p.T;
  const int rows = p.heads * T;
  const int32_t* mask = p.mask ? p.mask + static_cast<size_t>(b) * T : nullptr;
  int any_local = mask == nullptr ? 1 : 0;
  if (mask != nullptr)
    for (int k = threadIdx.x; k < T; k += blockDim.x) any_local |= mask[k] != 0;
  const bool any = __syncthreads_or(any_local) != 0;
  for (int r = blockIdx.x * kRowsPerBlock + warp; r < min(rows, (blockIdx.x + 1) * kRowsPerBlock); r += kRowWarps) {
    float* srow = S + static_cast<size_t>(r) * T;
    float* drow = dP + static_cast<size_t>(r) * T;
    const size_t idx = static_cast<size_t>(b) * rows + r;
    const float lse = p.lse[idx], dsum = p.dsum[idx];
    const uint64_t bh = static_cast<uint64_t>(b) * p.heads + r / T;
    const int q = r % T;
#pragma unroll 4
    for (int k = lane; k < T; k += 32) {
      float pr;
      if (!any) pr = expf(-lse);
      else if (mask != nullptr && mask[k] == 0) pr = 0.0f;
      else pr = expf(srow[k] - lse);
      float dp = drow[k], pz = pr;
      if (p.drop) {
        const bool keep = attn_keep(p, bh, q, k);
        pz = keep ? pr * p.inv_keep : 0.0f;
        dp = keep ? dp * p.inv_keep : 0.0f;
      }
      srow[k] = pz;
      drow[k] = pr * (dp - dsum);
    }
  }
}

// ---- row kernels with dropout, rows in pairs -----------------------------------------------------
// With dropout and an even T the row kernels take the rows two at a time: warp w owns rows
// q, q+1 (q even) of one head and lane l the key pairs kp = l, l + 32, ... (float2 accesses), so
// each lane holds whole 2x2 blocks of the dropout stream: one hash per four probabilities
// (Note [attention dropout index] in core/rng.h) instead of one per probability. Same math as
// the kernels above.
__device__ __forceinline__ void online_add(float& m, float& l, float s) {
  if (s > m) {
    l = l * expf(m - s) + 1.0f;
    m = s;
  } else {
    l += expf(s - m);
  }
}

// Forward: rows h*T + q, h*T + q + 1 of S (sample b) <- P * Z; lse of both.
__global__ void __launch_bounds__(kRowThreads) softmax_forward_pairs_kernel(Params p, int b, float* S) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = p.T, half = T / 2;
  const int rows = p.heads * T, pairs = rows / 2;
  const int32_t* mask = p.mask ? p.mask + static_cast<size_t>(b) * T : nullptr;
  const int rp = blockIdx.x * kRowWarps + warp;
  if (rp >= pairs) return;
  const int r0 = 2 * rp, h = r0 / T, q = r0 % T;
  float2* row[2] = {reinterpret_cast<float2*>(S + static_cast<size_t>(r0) * T),
                    reinterpret_cast<float2*>(S + static_cast<size_t>(r0 + 1) * T)};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int kp = lane; kp < half; kp += 32) {
    const bool v0 = mask == nullptr || mask[2 * kp] != 0, v1 = mask == nullptr || mask[2 * kp + 1] != 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 x = row[i][kp];
      if (v0) online_add(m[i], l[i], x.x);
      if (v1) online_add(m[i], l[i], x.y);
    }
  }
  float lse[2];
  bool any = true;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = m[i];
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    any = mx != -INFINITY;  // the same for both rows (one mask row per sample)
    float sum = m[i] == -INFINITY ? 0.0f : l[i] * expf(m[i] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    lse[i] = any ? mx + logf(sum) : logf(static_cast<float>(T));
    if (lane == 0) p.lse[static_cast<size_t>(b) * rows + r0 + i] = lse[i];
  }
  const uint64_t tp = static_cast<uint64_t>(half);
  const uint64_t bh = static_cast<uint64_t>(b) * p.heads + h;
  uint64_t z = p.rng_key + ((bh * tp + static_cast<uint64_t>(q / 2)) * tp + lane) * kGolden;
  for (int kp = lane; kp < half; kp += 32, z += 32 * kGolden) {
    bool keep[4];
    keep4(keep, dropout_mix(z), p.thr_m1);  // field (q % 2) * 2 + (k % 2)
    const bool v0 = mask == nullptr || mask[2 * kp] != 0, v1 = mask == nullptr || mask[2 * kp + 1] != 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 x = row[i][kp];
      float2 y;
      y.x = !any ? expf(-lse[i]) : v0 ? expf(x.x - lse[i]) : 0.0f;
      y.y = !any ? expf(-lse[i]) : v1 ? expf(x.y - lse[i]) : 0.0f;
      y.x = keep[2 * i] ? y.x * p.inv_keep : 0.0f;
      y.y = keep[2 * i + 1] ? y.y * p.inv_keep : 0.0f;
      row[i][kp] = y;
    }
  }
}

// Backward: S <- P * Z, dP <- dS = P (Z dPd - Dsum) on rows h*T + q, h*T + q + 1.
__global__ void __launch_bounds__(kRowThreads) softmax_backward_pairs_kernel(Params p, int b, float* S, float* dP) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = p.T, half = T / 2;
  const int rows = p.heads * T, pairs = rows / 2;
  const int32_t* mask = p.mask ? p.mask + static_cast<size_t>(b) * T : nullptr;
  int any_local = mask == nullptr ? 1 : 0;
  if (mask != nullptr)
    for (int k = threadIdx.x; k < T; k += blockDim.x) any_local |= mask[k] != 0;
  const bool any = __syncthreads_or(any_local) != 0;
  const int rp = blockIdx.x * kRowWarps + warp;
  if (rp >= pairs) return;
  const int r0 = 2 * rp, h = r0 / T, q = r0 % T;
  const size_t idx = static_cast<size_t>(b) * rows + r0;
  const float lse[2] = {p.lse[idx], p.lse[idx + 1]}, dsum[2] = {p.dsum[idx], p.dsum[idx + 1]};
  float2* srow[2] = {reinterpret_cast<float2*>(S + static_cast<size_t>(r0) * T),
                     reinterpret_cast<float2*>(S + static_cast<size_t>(r0 + 1) * T)};
  float2* drow[2] = {reinterpret_cast<float2*>(dP + static_cast<size_t>(r0) * T),
                     reinterpret_cast<float2*>(dP + static_cast<size_t>(r0 + 1) * T)};
  const uint64_t tp = static_cast<uint64_t>(half);
  const uint64_t bh = static_cast<uint64_t>(b) * p.heads + h;
  uint64_t z = p.rng_key + ((bh * tp + static_cast<uint64_t>(q / 2)) * tp + lane) * kGolden;
  for (int kp = lane; kp < half; kp += 32, z += 32 * kGolden) {
    bool keep[4];
    keep4(keep, dropout_mix(z), p.thr_m1);
    const bool v[2] = {mask == nullptr || mask[2 * kp] != 0, mask == nullptr || mask[2 * kp + 1] != 0};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 x = srow[i][kp], d = drow[i][kp];
      const float xs[2] = {x.x, x.y}, ds[2] = {d.x, d.y};
      float pz[2], dsv[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float pr = !any ? expf(-lse[i]) : v[c] ? expf(xs[c] - lse[i]) : 0.0f;
        const bool kept = keep[2 * i + c];
        pz[c] = kept ? pr * p.inv_keep : 0.0f;
        dsv[c] = pr * ((kept ? ds[c] * p.inv_keep : 0.0f) - dsum[i]);
      }
      srow[i][kp] = make_float2(pz[0], pz[1]);
      drow[i][kp] = make_float2(dsv[0], dsv[1]);
    }
  }
}

// One cuBLAS handle per device, created on first use and never destroyed (destroying it at
// exit can race the CUDA runtime's own teardown). Its stream and workspace are set per call,
// under the device's lock, which is held while the call enqueues its GEMMs: backends of one
// device on several host threads take turns.
struct DeviceHandle {
  std::mutex mu;
  cublasHandle_t h = nullptr;
};

DeviceHandle& handle_for_current_device() {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceHandle>> handles;
  int dev = 0;
  ANATOMY_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(dev) >= handles.size()) handles.resize(static_cast<size_t>(dev) + 1);
  auto& slot = handles[static_cast<size_t>(dev)];
  if (!slot) {
    auto d = std::make_unique<DeviceHandle>();
    ANATOMY_CUDA_CHECK(cublasCreate(&d->h));
    ANATOMY_CUDA_CHECK(cublasSetPointerMode(d->h, CUBLAS_POINTER_MODE_HOST));
    // Plain fp32 unless a call asks for CUBLAS_COMPUTE_32F_FAST_TF32 explicitly.
    ANATOMY_CUDA_CHECK(cublasSetMathMode(d->h, CUBLAS_DEFAULT_MATH));
    slot = std::move(d);
  }
  return *slot;
}

// Strided-batched F32 GEMMs over the heads of one sample, on the caller's stream.
class Gemm {
 public:
  Gemm(const Params& p, const AttentionOptions& o, cudaStream_t s)
      : m_dev(handle_for_current_device()),
        m_lock(m_dev.mu),
        m_compute(o.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F),
        m_batch(p.heads) {
    ANATOMY_CUDA_CHECK(cublasSetStream(m_dev.h, s));
    // Set on every call: the handle is shared, and an earlier caller's workspace may be gone.
    ANATOMY_CUDA_CHECK(cublasSetWorkspace(m_dev.h, o.cublas_workspace_bytes ? o.cublas_workspace : nullptr,
                                          o.cublas_workspace_bytes));
  }
  // Column-major C[m, n] = alpha * op(A) op(B), batched with the given strides (C is not read).
  void operator()(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const float* A,
                  int lda, long long sa, const float* B, int ldb, long long sb, float* C, int ldc,
                  long long sc) const {
    const float beta = 0.0f;
    ANATOMY_CUDA_CHECK(cublasGemmStridedBatchedEx(m_dev.h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, sa, B,
                                                  CUDA_R_32F, ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, m_batch,
                                                  m_compute, CUBLAS_GEMM_DEFAULT));
  }

 private:
  DeviceHandle& m_dev;
  std::lock_guard<std::mutex> m_lock;
  cublasComputeType_t m_compute;
  int m_batch;
};

void check_row_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  ANATOMY_CHECK(e == cudaSuccess, "attention: launching ", what, " failed: ", cudaGetErrorString(e));
}

unsigned row_blocks(const Params& p) {
  return static_cast<unsigned>((static_cast<int64_t>(p.heads) * p.T + kRowsPerBlock - 1) / kRowsPerBlock);
}

// The paired row kernels: dropout on, T even (rows of 8-byte aligned float2, no pair straddles heads).
bool use_pairs(const Params& p) { return p.drop && p.T % 2 == 0; }
unsigned pair_blocks(const Params& p) {
  return static_cast<unsigned>((static_cast<int64_t>(p.heads) * p.T / 2 + kRowWarps - 1) / kRowWarps);
}

}  // namespace

size_t gemm_score_bytes(int64_t T, int heads) { return static_cast<size_t>(heads) * T * T * sizeof(float); }

void gemm_forward(const Params& p, float* S, const AttentionOptions& o, cudaStream_t s) {
  const Gemm g(p, o, s);
  const int T = p.T, D = p.D, H = p.H, H3 = 3 * H;
  const long long tt = static_cast<long long>(T) * T;
  const float* qkv = static_cast<const float*>(p.qkv);
  float* ctx = static_cast<float*>(p.ctx);
  for (int b = 0; b < p.B; ++b) {
    const float* q = qkv + static_cast<size_t>(b) * T * H3;
    const float* k = q + H;
    const float* v = q + 2 * H;
    // Sc [T_k, T_q] = scale * Kc^T Qc
    g(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, p.scale, k, H3, D, q, H3, D, S, T, tt);
    if (use_pairs(p))
      softmax_forward_pairs_kernel<<<pair_blocks(p), kRowThreads, 0, s>>>(p, b, S);
    else
      softmax_forward_kernel<<<row_blocks(p), kRowThreads, 0, s>>>(p, b, S);
    check_row_launch("attention softmax forward");
    // Oc [D, T_q] = Vc [D, T_k] * Sc [T_k, T_q]
    g(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, 1.0f, v, H3, D, S, T, tt, ctx + static_cast<size_t>(b) * T * H, H, D);
  }
}

void gemm_backward(const Params& p, float* S, float* dP, const AttentionOptions& o, cudaStream_t s) {
  const Gemm g(p, o, s);
  const int T = p.T, D = p.D, H = p.H, H3 = 3 * H;
  const long long tt = static_cast<long long>(T) * T;
  const float* qkv = static_cast<const float*>(p.qkv);
  const float* dctx = static_cast<const float*>(p.dctx);
  float* dqkv = static_cast<float*>(p.dqkv);
  for (int b = 0; b < p.B; ++b) {
    const float* q = qkv + static_cast<size_t>(b) * T * H3;
    const float* k = q + H;
    const float* v = q + 2 * H;
    const float* dout = dctx + static_cast<size_t>(b) * T * H;
    float* dq = dqkv + static_cast<size_t>(b) * T * H3;
    float* dk = dq + H;
    float* dv = dq + 2 * H;
    // Sc = scale * Kc^T Qc (as in the forward); dPc [T_k, T_q] = Vc^T dOc
    g(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, p.scale, k, H3, D, q, H3, D, S, T, tt);
    g(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, 1.0f, v, H3, D, dout, H, D, dP, T, tt);
    if (use_pairs(p))
      softmax_backward_pairs_kernel<<<pair_blocks(p), kRowThreads, 0, s>>>(p, b, S, dP);
    else
      softmax_backward_kernel<<<row_blocks(p), kRowThreads, 0, s>>>(p, b, S, dP);
    check_row_launch("attention softmax backward");
    // dVc [D, T_k] = dOc [D, T_q] * (P Z)c^T [T_q, T_k]
    g(CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, 1.0f, dout, H, D, S, T, tt, dv, H3, D);
    // dQc [D, T_q] = scale * Kc [D, T_k] * dSc [T_k, T_q]
    g(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, p.scale, k, H3, D, dP, T, tt, dq, H3, D);
    // dKc [D, T_k] = scale * Qc [D, T_q] * dSc^T [T_q, T_k]
    g(CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, p.scale, q, H3, D, dP, T, tt, dk, H3, D);
  }
}

}  // namespace anatomy::cuda::attn
