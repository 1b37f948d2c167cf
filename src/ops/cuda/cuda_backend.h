// The CUDA backend: cuBLASLt for the contractions, the kernels of ops/cuda/*.cu for the rest,
// all work in order on one non-default stream. Every device byte it owns goes through its
// CudaAllocator: the cuBLASLt workspace (Workspace), the reduction scratch and the attention
// scratch (Temporary).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "ops/backend.h"
#include "ops/backend_memory.h"
#include "ops/cuda/cuda_allocator.h"
#include "ops/cuda/launchers.h"

namespace anatomy::cuda {

class LtMatmul;
struct AttentionOptions;  // ops/cuda/attention.h

class CudaBackend final : public Backend {
 public:
  static constexpr size_t kWorkspaceBytes = kCudaLtWorkspaceBytes;  // ops/backend_memory.h (the planner reads it)
  static constexpr size_t kReduceScratchBytes = kCudaReduceScratchBytes;  // partial rows of column reductions

  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::CUDA; }
  Allocator& allocator() override { return m_alloc; }
  std::string name() const override { return m_name; }
  void synchronize() override;
  void* native_stream() override { return m_stream; }
  void bind_to_thread() override;
  void set_allow_tf32(bool on) override;
  std::string tune_matmuls(void* scratch, size_t bytes) override;
  bool computes_in(DType dt) const override {
    return dt == DType::F32 || dt == DType::BF16 || dt == DType::F16;
  }
  bool packed_attention_supported(DType dt, int64_t seq, int64_t head_dim) const override;

  cudaStream_t stream() const { return m_stream; }
  // Timing marks are CUDA events recorded on the stream; the pool grows while profiling and
  // is reused after timing_reset().
  int timing_mark() override;
  double timing_elapsed_ms(int a, int b) override;
  void timing_reset() override { m_events_used = 0; }

  // Stream capture into a CUDA graph (Note [graph capture] in cuda_backend.cpp).
  bool begin_capture() override;
  void end_capture() override;
  void replay() override;
  bool capturing() const { return m_capturing; }
  size_t captured_nodes() const { return m_graph_nodes; }  // nodes of the last recording
  int device_index() const { return m_device; }
  // Free and total bytes of the current device (cudaMemGetInfo).
  static DeviceMemory memory_info() { return device_memory(); }
  // Matmul calls cuBLASLt declined (run by the tiled fallback kernel instead).
  int64_t matmul_fallback_calls() const;
  // Epilogue::BiasGrad calls that ran as the GEMM then the bias_grad kernel (cuBLASLt had no
  // kernel with the BGRADB epilogue for the problem).
  int64_t bias_grad_unfused_calls() const { return m_bias_grad_unfused; }
  // On: BiasGrad calls use cuBLASLt's BGRADB epilogue where it has a kernel. Off (the default,
  // measured faster: Note [fused bias gradient] in ops/op_args.h): the GEMM then the bias_grad
  // kernel. anatomy_bench_ops times both in one build.
  void set_fused_bias_grad(bool on) { m_fused_bias_grad = on; }

  // fp8 matmul calls that ran in bf16 because cuBLASLt had no fp8 kernel for the problem
  // (Note [fp8 training] in core/fp8.h).
  int64_t fp8_fallback_calls() const { return m_fp8_fallback; }

  // Page-locked staging for upload_async (Note [asynchronous uploads] in ops/backend.h).
  void* host_alloc(size_t bytes) override;
  void host_free(void* p) override;
  void wait_copy(int token) override;

 protected:
  // The ops (Note [backend contract] in ops/backend.h): the contract has checked their arguments.
  // ---- data movement (upload/download return when the host buffer may be reused/read) ---------
  void upload_impl(const Tensor& dst, const void* host) override;
  int upload_async_impl(const Tensor& dst, const void* host) override;
  int download_async_impl(void* host, const Tensor& src) override;
  void download_impl(void* host, const Tensor& src) override;
  void copy_impl(const Tensor& dst, const Tensor& src) override;
  void cast_impl(const Tensor& dst, const Tensor& src) override;
  void fill_impl(const Tensor& dst, float value) override;

  // ---- tensor contractions ---------------------------------------------------------------------
  void matmul_impl(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const MatmulArgs& args) override;
  void bias_grad_impl(const Tensor& db, const Tensor& dy) override;
  void fp8_scale_update_impl(const Tensor& meta) override;

  // ---- attention -------------------------------------------------------------------------------
  void attention_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                              const DropoutSpec& dropout, AttentionScope scope) override;
  void attention_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout,
                               AttentionScope scope, const Tensor& dbias) override;
  void attention_packed_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets,
                                     int heads, const DropoutSpec& dropout, AttentionScope scope) override;
  void attention_packed_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                      const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& dropout,
                                      AttentionScope scope, const Tensor& dbias) override;
  void rotary_forward_impl(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows) override;
  void rotary_backward_impl(const Tensor& dx, const Tensor& dy, int heads, float theta, const Tensor& rows) override;

  // ---- statistical normalizations --------------------------------------------------------------
  void layernorm_forward_impl(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                              const Tensor& branch, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                              float eps, const DropoutSpec& branch_dropout) override;
  void layernorm_backward_impl(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma,
                               const Tensor& beta, const DropoutSpec& branch_dropout, const Tensor& dbias) override;
  void cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                          float grad_scale) override;
  void token_cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                                float loss_weight, float grad_scale) override;
  void mse_loss_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                     float grad_scale) override;
  void bce_with_logits_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            float grad_scale) override;

  // ---- element-wise ----------------------------------------------------------------------------
  void geglu_forward_impl(const Tensor& y, const Tensor& x) override;
  void geglu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x) override;
  void gelu_forward_impl(const Tensor& y, const Tensor& x) override;
  void gelu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias) override;
  void tanh_forward_impl(const Tensor& y, const Tensor& x) override;
  void tanh_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) override;
  void relu_forward_impl(const Tensor& y, const Tensor& x) override;
  void relu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) override;
  void dropout_forward_impl(const Tensor& y, const Tensor& x, const DropoutSpec& d) override;
  void dropout_backward_impl(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) override;
  void add_impl(const Tensor& y, const Tensor& a, const Tensor& b) override;
  void embedding_forward_impl(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                              const Tensor& pos, const Tensor& type) override;
  void embedding_backward_impl(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                               const Tensor& ids, const Tensor& type_ids) override;
  void select_token_impl(const Tensor& out, const Tensor& x, int64_t t) override;
  void select_token_backward_impl(const Tensor& dx, const Tensor& dout, int64_t t) override;
  void masked_mean_forward_impl(const Tensor& out, const Tensor& x, const Tensor& mask) override;
  void masked_mean_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& mask) override;
  void gather_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) override;
  void scatter_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) override;

  // ---- optimizer -------------------------------------------------------------------------------
  void block_sum_squares_impl(const Tensor& partials, const Tensor& x) override;
  void sum_blocks_impl(const Tensor& out, const Tensor& partials) override;
  void adamw_update_impl(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                         const Tensor& grads, const GradTransform& g, const AdamWArgs& a) override;
  void sgd_update_impl(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                       const GradTransform& g, const SgdArgs& a) override;
  void adamw8bit_update_impl(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                             const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                             const GradTransform& g, const AdamWArgs& a) override;
  void adafactor_update_impl(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                             const Tensor& grads, const AdafactorTable& table, const GradTransform& g,
                             const AdafactorArgs& a) override;

 private:
  ReduceScratch reduce_scratch() const;
  void matmul_bias_grad(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                        int64_t k, const MatmulArgs& args);
  void bias_grad_after_gemm(const MatmulArgs& args, const Tensor& a);
  void matmul_fp8(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m, int64_t n,
                  int64_t k, const MatmulArgs& args);
  // A scratch buffer at least `bytes` long (grown, never shrunk; `what` names it in errors).
  void* scratch(Buffer& buf, size_t bytes, const char* what);
  void* attention_scratch(size_t bytes);
  AttentionOptions attention_options() const;  // cuBLAS workspace and TF32 switch for the F32 path
  int record_copy(bool download);  // an event of that ring after the copy just enqueued: its token

  int m_device;
  std::string m_name;
  CudaAllocator m_alloc;  // declared before the buffers: it must outlive them
  cudaStream_t m_stream = nullptr;
  std::vector<cudaEvent_t> m_events;
  size_t m_events_used = 0;
  Buffer m_workspace;      // [kWorkspaceBytes] U8, Category::Workspace
  Buffer m_reduce;         // [kReduceScratchBytes / 4] F32, Category::Temporary
  Buffer m_attn_scratch;   // U8, Category::Temporary, sized by attention_scratch_bytes
  Buffer m_fp8_scratch;    // U8, Category::Temporary, sized by fp8_scratch_bytes
  std::unique_ptr<LtMatmul> m_matmul;
  bool m_capturing = false;
  static constexpr int kCopyRing = 64;
  std::vector<cudaEvent_t> m_copy_events[2];  // rings of events: [0] upload_async's, [1] download_async's
  size_t m_copy_next[2] = {0, 0};
  cudaGraphExec_t m_graph_exec = nullptr;
  size_t m_graph_nodes = 0;
  int64_t m_bias_grad_unfused = 0;
  int64_t m_fp8_fallback = 0;
  bool m_fused_bias_grad = false;
  bool m_allow_tf32 = false;  // set_allow_tf32 (also read by the F32 attention path)
};

}  // namespace anatomy::cuda
