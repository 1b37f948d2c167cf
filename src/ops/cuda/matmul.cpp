#include "ops/cuda/matmul.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include "memory/allocator.h"
#include "ops/cuda/check.h"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: fail("matmul: dtype ", dtype_name(t), " is not supported (F32, BF16, F16)");
  }
}

// A Key's type code: a DType, or kFp8Type | format.
cudaDataType_t lt_code_type(uint8_t code, uint8_t fp8_flag) {
  if (code & fp8_flag)
    return static_cast<Fp8Format>(code & ~fp8_flag) == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
  return lt_type(static_cast<DType>(code));
}

// Largest power of two dividing the address, capped at 256 (cuBLASLt's default assumption).
uint16_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return 256;
  const uintptr_t low = u & (~u + 1);
  return static_cast<uint16_t>(low > 256 ? 256 : low);
}

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  ANATOMY_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  ANATOMY_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

cublasOperation_t op(uint8_t t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

size_t LtMatmul::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<int64_t>{}(k.m);
  auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(k.n));
  mix(static_cast<uint64_t>(k.k));
  mix(k.ta | k.tb << 1 | k.tf32 << 2 | k.epilogue << 3 | k.a_type << 8 | k.c_type << 16 |
      static_cast<uint64_t>(k.bias_type) << 24 | static_cast<uint64_t>(k.b_type) << 32);
  mix(k.align_a | k.align_b << 9 | static_cast<uint64_t>(k.align_c) << 18 | static_cast<uint64_t>(k.align_bias) << 27);
  return h;
}

LtMatmul::LtMatmul(void* workspace, size_t workspace_bytes)
    : m_workspace(workspace), m_workspace_bytes(workspace_bytes) {
  ANATOMY_CUDA_CHECK(cublasLtCreate(&m_handle));
}

LtMatmul::~LtMatmul() {
  for (auto& [key, p] : m_plans) {
    if (p.lt_a) cublasLtMatrixLayoutDestroy(p.lt_a);
    if (p.lt_b) cublasLtMatrixLayoutDestroy(p.lt_b);
    if (p.lt_c) cublasLtMatrixLayoutDestroy(p.lt_c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  if (m_handle) cublasLtDestroy(m_handle);
}

// Descriptors, layouts and the heuristic's first algorithm for one problem, built once.
// cuBLASLt's A is our B: its scale is B's.
void LtMatmul::set_scales(cublasLtMatmulDesc_t desc, const float* scale_a, const float* scale_b) {
  set_attr(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale_b);
  set_attr(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale_a);
}

LtMatmul::Plan& LtMatmul::plan_for(const Key& key, const void* bias, const float* scale_a, const float* scale_b) {
  auto it = m_plans.find(key);
  if (it != m_plans.end()) return it->second;
  Plan p;
  const auto c_type = static_cast<DType>(key.c_type);
  const bool fp8 = key.a_type & kFp8Type;
  const cublasComputeType_t compute =
      !fp8 && static_cast<DType>(key.a_type) == DType::F32 && key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  ANATOMY_CUDA_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  if (fp8) {  // the forward (E4M3 x E4M3) accumulates in the tensor cores' fast mode, gradients in F32
    const int8_t fast = key.a_type == key.b_type;
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast);
    set_scales(p.desc, scale_a, scale_b);  // before the heuristic, which may read them
  }
  // cuBLASLt's A is our B (op tb), its B is our A (op ta): C^T = op(B)^T op(A)^T.
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op(key.tb));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op(key.ta));
  // Our A is cuBLASLt's B: the weight gradient's bias gradient (the column sums of our A [K, M],
  // summed over the GEMM's K, one value per column of cuBLASLt's D = per row of our C) is BGRADB.
  const cublasLtEpilogue_t epi = key.epilogue == kLtBias       ? CUBLASLT_EPILOGUE_BIAS
                                 : key.epilogue == kLtBiasGrad ? CUBLASLT_EPILOGUE_BGRADB
                                                               : CUBLASLT_EPILOGUE_DEFAULT;
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (key.epilogue != kLtPlain) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
             static_cast<int32_t>(lt_type(static_cast<DType>(key.bias_type))));
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);  // the heuristic reads its alignment
  }
  const cudaDataType_t at = lt_code_type(key.a_type, kFp8Type), bt = lt_code_type(key.b_type, kFp8Type),
                       ct = lt_type(c_type);
  const uint64_t m = key.m, n = key.n, k = key.k;
  // Our B: [K,N] row-major (N) = col-major N x K, ld N; [N,K] row-major (T) = col-major K x N, ld K.
  if (key.tb)
    ANATOMY_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.lt_a, bt, k, n, static_cast<int64_t>(k)));
  else
    ANATOMY_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.lt_a, bt, n, k, static_cast<int64_t>(n)));
  // Our A: [M,K] row-major (N) = col-major K x M, ld K; [K,M] row-major (T) = col-major M x K, ld M.
  if (key.ta)
    ANATOMY_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.lt_b, at, m, k, static_cast<int64_t>(m)));
  else
    ANATOMY_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.lt_b, at, k, m, static_cast<int64_t>(k)));
  // C = D: [M,N] row-major = col-major N x M, ld N.
  ANATOMY_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p.lt_c, ct, n, m, static_cast<int64_t>(n)));

  cublasLtMatmulPreference_t pref = preference(key);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(m_handle, p.desc, p.lt_a, p.lt_b, p.lt_c, p.lt_c, pref, 1,
                                                           &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED (or no result) means this combination has no cuBLASLt kernel: fall back.
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) ANATOMY_CUDA_CHECK(st);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p.algo = result.algo;
    p.has_algo = true;
  }
  return m_plans.emplace(key, p).first->second;
}

cublasLtMatmulPreference_t LtMatmul::preference(const Key& key) const {
  cublasLtMatmulPreference_t pref = nullptr;
  ANATOMY_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(m_workspace_bytes));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(key.align_b));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(key.align_a));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(key.align_c));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(key.align_c));
  return pref;
}

bool LtMatmul::try_run(const Tensor& c, const Tensor& d, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                       int64_t m, int64_t n, int64_t k, float alpha, float beta, uint8_t epilogue, const void* bias,
                       DType bias_type, cudaStream_t s) {
  Key key{m,
          n,
          k,
          static_cast<uint8_t>(ta == Trans::T),
          static_cast<uint8_t>(tb == Trans::T),
          static_cast<uint8_t>(a.dtype),
          static_cast<uint8_t>(d.dtype),
          static_cast<uint8_t>(epilogue != kLtPlain ? bias_type : DType::F32),
          epilogue,
          static_cast<uint8_t>(a.dtype == DType::F32 && m_tf32),
          static_cast<uint8_t>(a.dtype),
          alignment(a.data),
          alignment(b.data),
          std::min(alignment(c.data), alignment(d.data)),
          alignment(bias)};
  Plan& p = plan_for(key, bias);
  if (!p.has_algo) return false;
  p.reads_c = p.reads_c || beta != 0.0f;
  if (epilogue != kLtPlain) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  ANATOMY_CUDA_CHECK(launch(p, c, d, a.data, b.data, alpha, beta, s));
  return true;
}

cublasStatus_t LtMatmul::launch(const Plan& p, const Tensor& c, const Tensor& d, const void* a, const void* b,
                                float alpha, float beta, cudaStream_t s) {
  return cublasLtMatmul(m_handle, p.desc, &alpha, b, p.lt_a, a, p.lt_b, &beta, c.data, p.lt_c, d.data, p.lt_c, &p.algo,
                        m_workspace, m_workspace_bytes, s);
}

bool LtMatmul::run_fp8(const Tensor& c, const Tensor& d, const void* qa, Fp8Format fa, const void* qb, Fp8Format fb,
                       int64_t m, int64_t n, int64_t kp, float alpha, float beta, const Tensor& bias,
                       const float* scale_a, const float* scale_b, cudaStream_t s) {
  const uint8_t epilogue = bias.defined() ? kLtBias : kLtPlain;
  Key key{m,
          n,
          kp,
          0,  // qa [M, kp]: our A untransposed; qb [N, kp]: our B transposed (cuBLASLt's "TN")
          1,
          static_cast<uint8_t>(kFp8Type | static_cast<uint8_t>(fa)),
          static_cast<uint8_t>(d.dtype),
          static_cast<uint8_t>(bias.defined() ? bias.dtype : DType::F32),
          epilogue,
          0,
          static_cast<uint8_t>(kFp8Type | static_cast<uint8_t>(fb)),
          alignment(qa),
          alignment(qb),
          std::min(alignment(c.data), alignment(d.data)),
          alignment(bias.data)};
  Plan& p = plan_for(key, bias.data, scale_a, scale_b);
  if (!p.has_algo) return false;
  if (bias.defined()) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.data);
  set_scales(p.desc, scale_a, scale_b);
  // A launch the library refuses (a problem its heuristic accepted) disables the plan: the
  // caller's bf16 path runs, and counts it.
  const cublasStatus_t st = launch(p, c, d, qa, qb, alpha, beta, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    p.has_algo = false;
    return false;
  }
  ANATOMY_CUDA_CHECK(st);
  return true;
}

void LtMatmul::run(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                   int64_t k, const MatmulArgs& args, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  const bool gelu = args.epilogue == Epilogue::BiasGelu;
  // With BiasGelu the GEMM reads C (for beta) and writes the pre-activation D = gelu_in; the GELU
  // kernel then writes C. Otherwise D = C, in place. C and D share one layout and dtype.
  const Tensor& d = gelu ? args.gelu_in : c;
  const bool has_bias = args.epilogue == Epilogue::Bias || gelu;
  // cuBLASLt wants K >= 1; the tiled kernel handles the empty sum.
  if (k > 0 && try_run(c, d, a, ta, b, tb, m, n, k, args.alpha, args.beta, has_bias ? kLtBias : kLtPlain,
                       has_bias ? args.bias.data : nullptr, has_bias ? args.bias.dtype : DType::F32, s)) {
    if (gelu) gelu_forward(c, args.gelu_in, s);
    return;
  }
  matmul_fallback(c, a, ta, b, tb, m, n, k, args, s);
  ++m_fallback_calls;
}

bool LtMatmul::run_bias_grad(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m,
                             int64_t n, int64_t k, float alpha, float beta, float* bias_grad, cudaStream_t s) {
  if (m == 0 || n == 0 || k == 0) return false;
  return try_run(c, c, a, ta, b, tb, m, n, k, alpha, beta, kLtBiasGrad, bias_grad, DType::F32, s);
}

// Note [gemm tuning]
// cuBLASLt's heuristic orders its algorithms by a model of the GPU, not by measurement. On an
// H200 its first pick for bert-large's layer GEMMs was up to 1.2x slower than the fastest of its
// first 16 (each alone: 4.0% of a layer's twelve GEMMs, 1.5 ms of a step;
// bench/results/2026-11-28-h200/session25/call1-gemmalgos-seeds/gemm_algos.md). `tune` times
// the candidates of every problem planned so far on operands carved from memory that holds
// nothing at the time (the trainer passes the activation arena after the first step), beta 1
// where a call of the problem reads C and 0 otherwise, a bias or bias-gradient vector where the
// epilogue has one. The operands keep the bytes the memory holds: in the arena, the first step's
// activations and gradients. With constant operands (0x3c bytes) the first version's picks
// promised 1.2 ms a bert-large step and gained 0.2 (session25/call3-tuning): the data gradients
// gained, the forward's attention output and the weight gradients lost. A tensor core's power,
// and so the clock it is held to, depends on how many of the operands' bits toggle.
// Each candidate: two launches to warm up, then the median of five runs of three launches (CUDA
// events). A candidate replaces the first pick only when it is kTuneMargin faster, so that timing
// noise does not flip picks between equally fast kernels. Another algorithm sums in another
// order: a tuned run is not bitwise equal to an untuned one, nor, where the timings differ, to
// another tuned run. Measured on bert-large bf16 batch 32 (session25/call4-tuning-bench-mbtext):
// the profiled step 69.66 -> 67.94 ms, every class of product faster, but steady samples/s only
// +0.4% over 60 steps: the steady step runs at the board's power limit (README, "How far from
// 2x"). Timing each candidate held at that limit instead (100 ms of the first pick, then 10 ms to
// settle and 30 ms timed a candidate, two rounds) left the step where it was (anatomy_bench_step:
// 69.09 / 69.32 ms untuned, 69.63 / 69.22 held, 68.79 / 68.77 in bursts;
// bench/results/2026-11-29-h200/session34/call2-held-gemm-tuning-not-kept/). So it is opt-in.

// ms a launch of `algo` on the operands: two launches to warm up, then the median of five runs of
// three (CUDA events); < 0 when the library refuses it.
float LtMatmul::time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* c,
                          float beta, cudaStream_t s) {
  const float alpha = 1.0f;
  auto launch = [&] {
    return cublasLtMatmul(m_handle, p.desc, &alpha, b, p.lt_a, a, p.lt_b, &beta, c, p.lt_c, c, p.lt_c, &algo,
                          m_workspace, m_workspace_bytes, s);
  };
  for (int i = 0; i < 2; ++i)
    if (launch() != CUBLAS_STATUS_SUCCESS) return -1.0f;
  cudaEvent_t e0, e1;
  ANATOMY_CUDA_CHECK(cudaEventCreate(&e0));
  ANATOMY_CUDA_CHECK(cudaEventCreate(&e1));
  float runs[5];
  for (float& r : runs) {
    ANATOMY_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < 3; ++i) ANATOMY_CUDA_CHECK(launch());
    ANATOMY_CUDA_CHECK(cudaEventRecord(e1, s));
    ANATOMY_CUDA_CHECK(cudaEventSynchronize(e1));
    ANATOMY_CUDA_CHECK(cudaEventElapsedTime(&r, e0, e1));
    r /= 3;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(runs, runs + 5);
  return runs[2];
}

std::optional<LtMatmul::TuneRow> LtMatmul::tune_plan(const Key& key, Plan& p, char* scratch, size_t bytes,
                                                     cudaStream_t s) {
  if (!p.has_algo || p.tuned || (key.a_type & kFp8Type)) return std::nullopt;
  p.tuned = true;
  auto size_of = [](uint8_t code) { return dtype_size(static_cast<DType>(code)); };
  const size_t a_bytes = Arena::round_up(static_cast<size_t>(key.m * key.k) * size_of(key.a_type));
  const size_t b_bytes = Arena::round_up(static_cast<size_t>(key.n * key.k) * size_of(key.b_type));
  const size_t c_bytes = Arena::round_up(static_cast<size_t>(key.m * key.n) * size_of(key.c_type));
  const size_t v_bytes = Arena::round_up(static_cast<size_t>(std::max(key.m, key.n)) * 4);
  if (a_bytes + b_bytes + c_bytes + v_bytes > bytes) return std::nullopt;
  char* a = scratch;
  char* b = a + a_bytes;
  char* c = b + b_bytes;
  char* v = c + c_bytes;
  if (key.epilogue != kLtPlain) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(v));
  cublasLtMatmulPreference_t pref = preference(key);
  std::vector<cublasLtMatmulHeuristicResult_t> found(kTuneCandidates);
  int n = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(m_handle, p.desc, p.lt_a, p.lt_b, p.lt_c, p.lt_c, pref,
                                                           kTuneCandidates, found.data(), &n);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || n == 0) return std::nullopt;
  const float beta = p.reads_c ? 1.0f : 0.0f;
  auto time = [&](const cublasLtMatmulAlgo_t& algo) { return time_algo(p, algo, a, b, c, beta, s); };
  const float first = time(p.algo);
  if (first <= 0) return std::nullopt;  // the pick itself refused here: nothing to compare with
  float best = first;
  int best_i = -1;
  for (int i = 0; i < n; ++i) {
    if (found[static_cast<size_t>(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    const float t = time(found[static_cast<size_t>(i)].algo);
    if (t > 0 && t < best) {
      best = t;
      best_i = i;
    }
  }
  const bool change = best_i >= 0 && best < first * (1.0 - kTuneMargin);
  if (change) p.algo = found[static_cast<size_t>(best_i)].algo;
  const std::string types = str_cat(dtype_name(static_cast<DType>(key.a_type)), " -> ",
                                    dtype_name(static_cast<DType>(key.c_type)));
  char line[256];
  std::snprintf(line, sizeof line, "| %lld x %lld x %lld | %c%c | %s | %d | %.4f | %.4f | %s |\n",
                static_cast<long long>(key.m), static_cast<long long>(key.n), static_cast<long long>(key.k),
                key.ta ? 'T' : 'N', key.tb ? 'T' : 'N', types.c_str(), n, first, best, change ? "candidate" : "first pick");
  return TuneRow{line, first, change ? best : first, change};
}

std::string LtMatmul::tune(void* scratch, size_t bytes, cudaStream_t s) {
  std::vector<std::pair<Key, Plan*>> plans;
  for (auto& [key, p] : m_plans) plans.emplace_back(key, &p);
  std::sort(plans.begin(), plans.end(), [](const auto& x, const auto& y) {  // a stable report
    return std::tie(x.first.m, x.first.n, x.first.k, x.first.ta, x.first.tb, x.first.c_type) <
           std::tie(y.first.m, y.first.n, y.first.k, y.first.ta, y.first.tb, y.first.c_type);
  });
  std::string rows;
  int timed = 0, changed = 0;
  double first_ms = 0, kept_ms = 0;
  for (auto& [key, p] : plans) {
    const std::optional<TuneRow> row = tune_plan(key, *p, static_cast<char*>(scratch), bytes, s);
    if (!row) continue;
    ++timed;
    changed += row->changed;
    first_ms += row->first_ms;
    kept_ms += row->kept_ms;
    rows += row->line;
  }
  char head[256];
  std::snprintf(head, sizeof head,
                "%d GEMM problem(s) timed, %d now run another algorithm: one launch of each %.3f -> %.3f ms (%.1f%% less)\n",
                timed, changed, first_ms, kept_ms, first_ms > 0 ? 100.0 * (1.0 - kept_ms / first_ms) : 0.0);
  return std::string(head) + "\n| M x N x K | ops (A, B) | types | candidates | first pick ms | fastest ms | runs |\n" +
         "|---|---|---|---:|---:|---:|---|\n" + rows;
}

}  // namespace anatomy::cuda
