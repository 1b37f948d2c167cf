// Row-major matmul through cuBLASLt with plans cached per problem.
//
// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's "A" is
// our B and its "B" is our A, with the transposes passed through unchanged, and a row-major
// [r, c] matrix is read as a column-major (rows c, cols r, ld c) one.
//
// Epilogues: Bias uses CUBLASLT_EPILOGUE_BIAS. BiasGelu does NOT use CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
// cuBLASLt's GELU is the tanh approximation (the library documents only "GELU"; PyTorch fuses it
// only for approximate="tanh"), while BERT's activation is the exact erf GELU. So BiasGelu runs
// the BIAS epilogue reading C (beta) and writing the pre-activation D = args.gelu_in, then the
// exact-erf GELU kernel writes C: one extra read of gelu_in and write of C, in exchange for
// matching Hugging Face.
//
// BiasGrad (Note [fused bias gradient] in ops/op_args.h) uses CUBLASLT_EPILOGUE_BGRADB: in the
// weight gradient C = A^T B our A (dY) is cuBLASLt's B, transposed, and the bias gradient is its
// sum over the GEMM's K, F32 like C. run_bias_grad only tries it; the backend owns the fallback
// and the accumulation (cuBLASLt writes the vector, never adds to it).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "ops/op_args.h"

namespace anatomy::cuda {

class LtMatmul {
 public:
  // workspace: device memory of workspace_bytes (owned by the caller, Category::Workspace).
  LtMatmul(void* workspace, size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  void set_allow_tf32(bool on) { m_tf32 = on; }
  // Backend::matmul's contract, m, n, k already checked against the shapes.
  void run(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n, int64_t k,
           const MatmulArgs& args, cudaStream_t s);
  // C = alpha A^T op(B) + beta C (ta = T) with bias_grad F32 [M] = the column sums of A [K, M]
  // written (not added), in one cuBLASLt call; false (nothing ran) when cuBLASLt has no kernel
  // with the BGRADB epilogue for this problem, or M, N or K is 0.
  bool run_bias_grad(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                     int64_t k, float alpha, float beta, float* bias_grad, cudaStream_t s);
  // The fp8 GEMM (Note [fp8 training] in core/fp8.h): C [M, N] = alpha * scale_a * scale_b *
  // qa [M, kp] qb [N, kp]^T + beta C (+ bias [N] into D with `bias`), qa and qb fp8 bytes of the
  // formats fa, fb; scale_a, scale_b device F32 (the operands' scale_inv). D = C, or the BiasGelu
  // pre-activation. Fast (fp8) accumulation when both are E4M3 (the forward), F32 otherwise.
  // false: cuBLASLt has no kernel for it (nothing ran).
  bool run_fp8(const Tensor& c, const Tensor& d, const void* qa, Fp8Format fa, const void* qb, Fp8Format fb, int64_t m,
               int64_t n, int64_t kp, float alpha, float beta, const Tensor& bias, const float* scale_a,
               const float* scale_b, cudaStream_t s);
  // Note [gemm tuning]: times up to kTuneCandidates of cuBLASLt's algorithms for every problem
  // planned so far and not yet tuned (fp8 ones excepted), on operands laid out in `scratch`
  // (device memory of `bytes` that holds nothing now; a problem whose operands do not fit keeps
  // its pick), and keeps the fastest where it beats the heuristic's first pick by kTuneMargin.
  // Returns a markdown report: a summary line, then a table of the problems.
  std::string tune(void* scratch, size_t bytes, cudaStream_t s);
  // How many calls went to the tiled fallback kernel because cuBLASLt had no algorithm.
  int64_t fallback_calls() const { return m_fallback_calls; }
  size_t cached_plans() const { return m_plans.size(); }

 private:
  struct Key {
    int64_t m, n, k;
    uint8_t ta, tb, a_type, c_type, bias_type, epilogue, tf32;
    uint8_t b_type;  // a_type but for fp8 (an E4M3 x E5M2 product); fp8 types are kFp8Type | format
    uint16_t align_a, align_b, align_c, align_bias;  // bytes, power of two <= 256
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;  // cuBLASLt's A (our B), B (our A), C=D
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;  // false: cuBLASLt declined; use the fallback kernel
    bool tuned = false;     // Note [gemm tuning] has timed its candidates
    bool reads_c = false;   // some call ran with beta != 0
  };
  static constexpr int kTuneCandidates = 16;
  static constexpr double kTuneMargin = 0.03;
  // The heuristic's preference for a problem: the workspace and the operands' alignments.
  cublasLtMatmulPreference_t preference(const Key& key) const;
  float time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, void* c, float beta,
                  cudaStream_t s);
  // A problem's row of the report, and the ms of one launch under the first pick and the kept one.
  struct TuneRow {
    std::string line;
    float first_ms, kept_ms;
    bool changed;
  };
  // Times one plan's candidates (nullopt: nothing was timed).
  std::optional<TuneRow> tune_plan(const Key& key, Plan& p, char* scratch, size_t bytes, cudaStream_t s);
  Plan& plan_for(const Key& key, const void* bias, const float* scale_a = nullptr, const float* scale_b = nullptr);
  static void set_scales(cublasLtMatmulDesc_t desc, const float* scale_a, const float* scale_b);
  // One cublasLtMatmul of a plan: D = alpha op(A) op(B) + beta C (our A and B), its status.
  cublasStatus_t launch(const Plan& p, const Tensor& c, const Tensor& d, const void* a, const void* b, float alpha,
                        float beta, cudaStream_t s);
  // Key::epilogue: no epilogue, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BGRADB.
  static constexpr uint8_t kLtPlain = 0, kLtBias = 1, kLtBiasGrad = 2;
  static constexpr uint8_t kFp8Type = 0x80;
  // One cuBLASLt call D = alpha op(A) op(B) + beta C with the epilogue; false when the heuristic
  // found no algorithm (nothing ran).
  bool try_run(const Tensor& c, const Tensor& d, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m,
               int64_t n, int64_t k, float alpha, float beta, uint8_t epilogue, const void* bias, DType bias_type,
               cudaStream_t s);

  cublasLtHandle_t m_handle = nullptr;
  void* m_workspace;
  size_t m_workspace_bytes;
  bool m_tf32 = false;
  int64_t m_fallback_calls = 0;
  std::unordered_map<Key, Plan, KeyHash> m_plans;
};

}  // namespace anatomy::cuda
