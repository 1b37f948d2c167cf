// CudaBackend: each *_impl runs after the contract (ops/contract.cpp) has checked devices, dtypes
// and shapes; it calls a launcher (ops/cuda/launchers.h) or cuBLASLt (ops/cuda/matmul.h) on the
// backend's stream.
#include "ops/cuda/cuda_backend.h"

#include "ops/cuda/check.h"
#include "ops/cuda/matmul.h"

#if __has_include("ops/cuda/attention.h")
#include "ops/cuda/attention.h"
#define ANATOMY_HAVE_CUDA_ATTENTION 1
#endif

namespace anatomy::cuda {

namespace {

// Rows x cols of a tensor seen as a matrix over its last dimension.
struct Mat {
  int64_t rows, cols;
};
Mat as_matrix(const Tensor& t) {
  const int64_t cols = t.shape.rank ? t.dim(-1) : 1;
  return {cols ? static_cast<int64_t>(t.numel()) / cols : 0, cols};
}

// The contract has checked norm_sq (F32 [1]) wherever clipping or skip_nonfinite reads it.
GradFactor grad_factor(const GradTransform& g) {
  GradFactor f;
  f.inv_loss_scale = g.inv_loss_scale;
  f.max_norm = g.max_norm;
  if (g.max_norm > 0 || g.skip_nonfinite) f.norm_sq = g.norm_sq.ptr<const float>();
  f.skip_nonfinite = g.skip_nonfinite;
  return f;
}

}  // namespace

void CudaBackend::bind_to_thread() { ANATOMY_CUDA_CHECK(cudaSetDevice(m_device)); }

CudaBackend::CudaBackend(int device_index) : m_device(device_index), m_alloc(device_index) {
  int count = 0;
  ANATOMY_CUDA_CHECK(cudaGetDeviceCount(&count));
  ANATOMY_CHECK(device_index >= 0 && device_index < count, "--device cuda:", device_index, ": this machine has ", count,
                " CUDA device(s)");
  ANATOMY_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp prop{};
  ANATOMY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  m_name = str_cat("cuda:", device_index, " (", prop.name, ", sm_", prop.major, prop.minor, ", ",
                   prop.totalGlobalMem >> 20, " MiB)");
  m_workspace = Buffer(m_alloc, DType::U8, Shape{static_cast<int64_t>(kWorkspaceBytes)}, Category::Workspace);
  m_reduce = Buffer(m_alloc, DType::F32, Shape{static_cast<int64_t>(kReduceScratchBytes / sizeof(float))},
                    Category::Temporary);
  m_matmul = std::make_unique<LtMatmul>(m_workspace.data(), kWorkspaceBytes);
  // Last: nothing after it can throw, so the destructor (which destroys it) always runs.
  ANATOMY_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
}

CudaBackend::~CudaBackend() {
  if (m_stream && m_capturing) {  // a capture abandoned by an exception
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(m_stream, &g);
    if (g) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  if (m_graph_exec) (void)cudaGraphExecDestroy(m_graph_exec);
  if (m_stream) {
    (void)cudaStreamSynchronize(m_stream);  // nothing may still use the buffers freed below
    (void)cudaStreamDestroy(m_stream);
  }
  for (cudaEvent_t e : m_events) (void)cudaEventDestroy(e);
  for (const auto& ring : m_copy_events)
    for (cudaEvent_t e : ring) (void)cudaEventDestroy(e);
}

int CudaBackend::timing_mark() {
  if (m_events_used == m_events.size()) {
    cudaEvent_t e;
    ANATOMY_CUDA_CHECK(cudaEventCreate(&e));
    m_events.push_back(e);
  }
  ANATOMY_CUDA_CHECK(cudaEventRecord(m_events[m_events_used], m_stream));
  return static_cast<int>(m_events_used++);
}

double CudaBackend::timing_elapsed_ms(int a, int b) {
  float ms = 0;
  ANATOMY_CUDA_CHECK(cudaEventElapsedTime(&ms, m_events[a], m_events[b]));
  return ms;
}

void CudaBackend::synchronize() {
  ANATOMY_CHECK(!m_capturing, "synchronize: not allowed while the backend records a graph (end_capture first)");
  ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
}

// Note [graph capture]
// begin_capture puts the backend's stream into capture mode (thread-local: a call from this
// thread that would break the recording, such as cudaMalloc or a synchronization, fails
// instead of silently running), end_capture turns the recording into an executable graph and
// replay launches it on the stream. What makes the ops of a training step recordable:
//   - every buffer is allocated up front (Note [allocation policy]); the one that grows on
//     first use, the attention scratch, refuses to grow while recording, so one eager step
//     must come first (the cuBLASLt plans are then cached too; their heuristic queries are
//     host-only anyway);
//   - cuBLASLt runs with the preallocated workspace, the F32 attention path's cuBLAS with
//     the same workspace;
//   - no op synchronizes or copies through pageable memory; upload, download and
//     synchronize refuse to run while recording.
// A replay repeats the recorded launches with their recorded arguments: the dropout offsets,
// the learning rate and the optimizer step count are those of the captured step.
bool CudaBackend::begin_capture() {
  ANATOMY_CHECK(!m_capturing, "begin_capture: the backend is already recording");
  ANATOMY_CUDA_CHECK(cudaStreamBeginCapture(m_stream, cudaStreamCaptureModeThreadLocal));
  m_capturing = true;
  return true;
}

void CudaBackend::end_capture() {
  ANATOMY_CHECK(m_capturing, "end_capture: begin_capture was not called");
  m_capturing = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(m_stream, &graph);
  if (e != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    fail("end_capture: the recording failed (", cudaGetErrorString(e),
         "): an op in it synchronized, allocated or copied through host memory");
  }
  size_t nodes = 0;
  cudaError_t ge = cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  if (ge == cudaSuccess) ge = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  ANATOMY_CUDA_CHECK(ge);
  if (m_graph_exec) ANATOMY_CUDA_CHECK(cudaGraphExecDestroy(m_graph_exec));
  m_graph_exec = exec;
  m_graph_nodes = nodes;
}

void CudaBackend::replay() {
  ANATOMY_CHECK(m_graph_exec != nullptr, "replay: nothing was recorded (begin_capture, ops, end_capture)");
  ANATOMY_CHECK(!m_capturing, "replay: not allowed while recording");
  ANATOMY_CUDA_CHECK(cudaGraphLaunch(m_graph_exec, m_stream));
}

std::string CudaBackend::tune_matmuls(void* scratch, size_t bytes) {
  ANATOMY_CHECK(!m_capturing, "tune_matmuls: not allowed while the backend records a graph");
  std::string report = m_matmul->tune(scratch, bytes, m_stream);
  ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
  return report;
}

void CudaBackend::set_allow_tf32(bool on) {
  m_matmul->set_allow_tf32(on);
  m_allow_tf32 = on;  // the F32 attention GEMMs follow the same switch
}

int64_t CudaBackend::matmul_fallback_calls() const { return m_matmul->fallback_calls(); }

ReduceScratch CudaBackend::reduce_scratch() const {
  return ReduceScratch{m_reduce.tensor().ptr<float>(), m_reduce.tensor().numel()};
}

// ---- data movement -------------------------------------------------------------------------------
// Synchronous with respect to the host, so the caller may free or reuse `host` on return (also
// when it is pinned, where cudaMemcpyAsync alone would return before the copy ran).
void CudaBackend::upload_impl(const Tensor& dst, const void* host) {
  ANATOMY_CHECK(!m_capturing, "upload: not allowed while the backend records a graph");
  if (dst.bytes() == 0) return;
  ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, m_stream));
  ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
}

void* CudaBackend::host_alloc(size_t bytes) {
  void* p = nullptr;
  ANATOMY_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

void CudaBackend::host_free(void* p) {
  if (p) (void)cudaFreeHost(p);
}

// The copies run in stream order; an event after each tells when its host block may be
// rewritten (upload) or read (download). Uploads and downloads each have a ring of 64 events,
// their tokens 0-63 and 64-127: a token must be waited for before its ring wraps (later waits
// for a later point). Uploads keep a micro-batch's 6 copies in flight, two staging blocks deep;
// downloads 2 per step, two steps deep, however many micro-batches a step has.
int CudaBackend::record_copy(bool download) {
  std::vector<cudaEvent_t>& ring = m_copy_events[download];
  if (ring.empty()) {
    ring.resize(kCopyRing);
    for (cudaEvent_t& e : ring) ANATOMY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  const int slot = static_cast<int>(m_copy_next[download]++ % kCopyRing);
  ANATOMY_CUDA_CHECK(cudaEventRecord(ring[slot], m_stream));
  return (download ? kCopyRing : 0) + slot;
}

int CudaBackend::upload_async_impl(const Tensor& dst, const void* host) {
  ANATOMY_CHECK(!m_capturing, "upload_async: not allowed while the backend records a graph");
  if (dst.bytes()) ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, m_stream));
  return record_copy(false);
}

int CudaBackend::download_async_impl(void* host, const Tensor& src) {
  ANATOMY_CHECK(!m_capturing, "download_async: not allowed while the backend records a graph");
  if (src.bytes()) ANATOMY_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, m_stream));
  return record_copy(true);
}

void CudaBackend::wait_copy(int token) {
  const bool download = token >= kCopyRing;
  const std::vector<cudaEvent_t>& ring = m_copy_events[download];
  const int slot = token - (download ? kCopyRing : 0);
  ANATOMY_CHECK(token >= 0 && slot < static_cast<int>(ring.size()), "wait_copy: unknown token ", token);
  ANATOMY_CUDA_CHECK(cudaEventSynchronize(ring[slot]));
}

void CudaBackend::download_impl(void* host, const Tensor& src) {
  ANATOMY_CHECK(!m_capturing, "download: not allowed while the backend records a graph");
  if (src.bytes() == 0) return;
  ANATOMY_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, m_stream));
  ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
}

void CudaBackend::copy_impl(const Tensor& dst, const Tensor& src) {
  if (dst.bytes() && dst.data != src.data)
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, m_stream));
}

void CudaBackend::cast_impl(const Tensor& dst, const Tensor& src) { cuda::cast(dst, src, m_stream); }
void CudaBackend::fill_impl(const Tensor& dst, float value) { cuda::fill(dst, value, m_stream); }

// ---- tensor contractions -------------------------------------------------------------------------
void CudaBackend::matmul_impl(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                              const MatmulArgs& args) {
  const Mat mc = as_matrix(c), ma = as_matrix(a);
  const int64_t k = ta == Trans::N ? ma.cols : ma.rows;
  if (args.fp8_a.defined()) return matmul_fp8(c, a, ta, b, tb, mc.rows, mc.cols, k, args);
  if (args.epilogue == Epilogue::BiasGrad) return matmul_bias_grad(c, a, ta, b, tb, mc.rows, mc.cols, k, args);
  m_matmul->run(c, a, ta, b, tb, mc.rows, mc.cols, k, args, m_stream);
}

// Note [fp8 training] in core/fp8.h: op(A) and op(B)^T quantized K-major into the scratch, one
// cuBLASLt fp8 GEMM with the operands' scale_inv, the epilogue as in bf16 (BiasGelu: the bias
// epilogue into the pre-activation, then the exact GELU; BiasGrad: the bias gradient from the
// unquantized dY, as the CPU twin's). Without an fp8 kernel for the problem: the bf16 GEMM.
void CudaBackend::matmul_fp8(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m,
                             int64_t n, int64_t k, const MatmulArgs& args) {
  if (m == 0 || n == 0) return;
  const int64_t kp = (k + 15) / 16 * 16;
  auto* qa = static_cast<uint8_t*>(scratch(m_fp8_scratch, fp8_scratch_bytes(m, n, k), "fp8 matmul"));
  uint8_t* qb = qa + fp8_scratch_bytes(m, 0, k);
  float* meta_a = args.fp8_a.meta.ptr<float>();
  float* meta_b = args.fp8_b.meta.ptr<float>();
  cuda::fp8_quantize(qa, kp, a, m, k, ta == Trans::T, meta_a, args.fp8_a.format, m_stream);
  cuda::fp8_quantize(qb, kp, b, n, k, tb == Trans::N, meta_b, args.fp8_b.format, m_stream);
  const bool gelu = args.epilogue == Epilogue::BiasGelu, grad = args.epilogue == Epilogue::BiasGrad;
  const Tensor& d = gelu ? args.gelu_in : c;
  const Tensor bias = args.epilogue == Epilogue::Bias || gelu ? args.bias : Tensor();
  if (k == 0 || !m_matmul->run_fp8(c, d, qa, args.fp8_a.format, qb, args.fp8_b.format, m, n, kp, args.alpha,
                                   args.beta, bias, meta_a + Fp8Meta::kScaleInv, meta_b + Fp8Meta::kScaleInv,
                                   m_stream)) {
    ++m_fp8_fallback;
    MatmulArgs plain = args;
    plain.fp8_a = plain.fp8_b = {};
    return matmul_impl(c, a, ta, b, tb, plain);
  }
  if (gelu) cuda::gelu_forward(c, args.gelu_in, m_stream);
  if (grad) bias_grad_after_gemm(args, a);
}

// BiasGrad's vector from A [K, M] on its own, after the GEMM: zeroed first when the call
// overwrites (beta 0), then the bias_grad kernel.
void CudaBackend::bias_grad_after_gemm(const MatmulArgs& args, const Tensor& a) {
  if (args.beta == 0.0f) ANATOMY_CUDA_CHECK(cudaMemsetAsync(args.bias.data, 0, args.bias.bytes(), m_stream));
  cuda::bias_grad(args.bias, a, reduce_scratch(), m_stream);
}

void CudaBackend::fp8_scale_update_impl(const Tensor& meta) {
  cuda::fp8_scale_update(meta.ptr<float>(), meta.dim(0), m_stream);
}

// Note [fused bias gradient] in ops/op_args.h. cuBLASLt writes the column sums of A: straight
// into the gradient when the call overwrites it (beta 0), else into the reduction scratch, then
// added (reduce_partials over one group: [M] floats read and written, no second pass over A).
// When cuBLASLt has no kernel with the epilogue for this problem: the plain GEMM, then the
// bias_grad kernel over A [K, M] (after zeroing the gradient when the call overwrites).
void CudaBackend::matmul_bias_grad(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, int64_t m,
                                   int64_t n, int64_t k, const MatmulArgs& args) {
  const Tensor& db = args.bias;
  const ReduceScratch scratch = reduce_scratch();
  const bool overwrite = args.beta == 0.0f;
  float* dst = !m_fused_bias_grad                       ? nullptr
               : overwrite                               ? db.ptr<float>()
               : static_cast<size_t>(m) <= scratch.floats ? scratch.data
                                                         : nullptr;
  if (dst && m_matmul->run_bias_grad(c, a, ta, b, tb, m, n, k, args.alpha, args.beta, dst, m_stream)) {
    if (!overwrite) cuda::reduce_partials(db.ptr<float>(), nullptr, nullptr, scratch.data, 1, m, m, m_stream);
    return;
  }
  ++m_bias_grad_unfused;
  m_matmul->run(c, a, ta, b, tb, m, n, k, MatmulArgs{args.alpha, args.beta, Epilogue::None, {}, {}}, m_stream);
  bias_grad_after_gemm(args, a);
}

void CudaBackend::bias_grad_impl(const Tensor& db, const Tensor& dy) {
  cuda::bias_grad(db, dy, reduce_scratch(), m_stream);
}

// ---- attention -----------------------------------------------------------------------------------
#ifdef ANATOMY_HAVE_CUDA_ATTENTION
// The F32 attention GEMMs borrow the cuBLASLt workspace: both run in order on m_stream.
AttentionOptions CudaBackend::attention_options() const {
  AttentionOptions o;
  o.cublas_workspace = m_workspace.data();
  o.cublas_workspace_bytes = kWorkspaceBytes;
  o.allow_tf32 = m_allow_tf32;
  return o;
}
#endif

// The scratch grows when the kernels ask for more than it has. The attention's follows the
// padded batch shape, fixed for a run, so it grows on the first step only and the Temporary peak
// is reached there (Note [allocation policy] in memory/allocator.h). The fp8 operands' follows
// the rows of the call: on real tokens (packed batches) a batch longer than every one before it
// grows it again, with a synchronize, up to the planned size (the padded batch's rows).
void* CudaBackend::scratch(Buffer& buf, size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  if (bytes > buf.bytes()) {
    ANATOMY_CHECK(!m_capturing, what, ": the scratch must grow (", bytes,
                  " bytes), which a graph recording cannot do: run the step once before capturing it");
    synchronize();  // the old scratch may still be in use on the stream
    buf.reset();
    buf = Buffer(m_alloc, DType::U8, Shape{static_cast<int64_t>(bytes)}, Category::Temporary);
  }
  return buf.data();
}
void* CudaBackend::attention_scratch(size_t bytes) { return scratch(m_attn_scratch, bytes, "attention"); }

void CudaBackend::attention_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask,
                                         int heads, const DropoutSpec& dropout, AttentionScope scope) {
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  const int64_t b = qkv.dim(0), t = qkv.dim(1), d = qkv.dim(2) / 3 / heads;
  void* scratch = attention_scratch(cuda::attention_scratch_bytes(b, t, heads, static_cast<int>(d), qkv.dtype));
  cuda::attention_forward(ctx, lse, qkv, mask, heads, dropout, scratch, m_stream, attention_options(), scope);
#else
  (void)ctx, (void)lse, (void)qkv, (void)mask, (void)heads, (void)dropout, (void)scope;
  fail("attention_forward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

bool CudaBackend::packed_attention_supported(DType dt, int64_t seq, int64_t head_dim) const {
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  return cuda::packed_attention_supported(dt, seq, head_dim);
#else
  (void)dt, (void)seq, (void)head_dim;
  return false;
#endif
}

void CudaBackend::attention_packed_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv,
                                                const Tensor& offsets, int heads, const DropoutSpec& dropout,
                                                AttentionScope scope) {
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  cuda::attention_packed_forward(ctx, lse, qkv, offsets, heads, dropout, m_stream, scope);
#else
  (void)ctx, (void)lse, (void)qkv, (void)offsets, (void)heads, (void)dropout, (void)scope;
  fail("attention_packed_forward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

void CudaBackend::attention_packed_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                                                 const Tensor& ctx, const Tensor& lse, const Tensor& offsets, int heads,
                                                 const DropoutSpec& dropout, AttentionScope scope, const Tensor& dbias) {
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  const int64_t d = qkv.dim(1) / 3 / heads;  // the scratch of the padded batch [B, T] (N <= B T rows)
  void* scratch =
      attention_scratch(cuda::attention_scratch_bytes(lse.dim(0), lse.dim(2), heads, static_cast<int>(d), qkv.dtype));
  cuda::attention_packed_backward(dqkv, dctx, qkv, ctx, lse, offsets, heads, dropout, scratch, m_stream, scope,
                                  dbias);
#else
  (void)dqkv, (void)dctx, (void)qkv, (void)ctx, (void)lse, (void)offsets, (void)heads, (void)dropout, (void)scope,
      (void)dbias;
  fail("attention_packed_backward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

void CudaBackend::attention_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                          const Tensor& lse, const Tensor& mask, int heads,
                                          const DropoutSpec& dropout, AttentionScope scope, const Tensor& dbias) {
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  const int64_t b = qkv.dim(0), t = qkv.dim(1), d = qkv.dim(2) / 3 / heads;
  void* scratch = attention_scratch(cuda::attention_scratch_bytes(b, t, heads, static_cast<int>(d), qkv.dtype));
  cuda::attention_backward(dqkv, dctx, qkv, ctx, lse, mask, heads, dropout, scratch, m_stream, attention_options(),
                           scope, dbias, reduce_scratch());
#else
  (void)dqkv, (void)dctx, (void)qkv, (void)ctx, (void)lse, (void)mask, (void)heads, (void)dropout, (void)scope,
      (void)dbias;
  fail("attention_backward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

// ---- statistical normalizations -------------------------------------------------------------------
void CudaBackend::layernorm_forward_impl(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                         const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                                         const Tensor& beta, float eps, const DropoutSpec& branch_dropout) {
  cuda::layernorm_forward(y, sum, mean, rstd, branch, residual, gamma, beta, eps, branch_dropout, m_stream);
}

void CudaBackend::layernorm_backward_impl(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                                          const Tensor& dbeta, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                                          const Tensor& gamma, const Tensor& beta, const DropoutSpec& branch_dropout,
                                          const Tensor& dbias) {
  cuda::layernorm_backward(dsum, dbranch, dgamma, dbeta, dbias, dy, y, rstd, gamma, beta, branch_dropout,
                           reduce_scratch(), m_stream);
}

void CudaBackend::cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                     const Tensor& labels, float grad_scale) {
  cuda::cross_entropy(losses, dlogits, logits, labels, grad_scale, m_stream);
}
void CudaBackend::token_cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                           const Tensor& labels, float loss_weight, float grad_scale) {
  cuda::token_cross_entropy(losses, dlogits, logits, labels, loss_weight, grad_scale, m_stream);
}
void CudaBackend::mse_loss_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& targets, float grad_scale) {
  cuda::float_target_loss(losses, dlogits, logits, targets, grad_scale, false, m_stream);
}
void CudaBackend::bce_with_logits_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& targets, float grad_scale) {
  cuda::float_target_loss(losses, dlogits, logits, targets, grad_scale, true, m_stream);
}

// ---- element-wise --------------------------------------------------------------------------------
void CudaBackend::rotary_forward_impl(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows) {
  cuda::rotary(y, x, heads, theta, false, rows, m_stream);
}
void CudaBackend::rotary_backward_impl(const Tensor& dx, const Tensor& dy, int heads, float theta, const Tensor& rows) {
  cuda::rotary(dx, dy, heads, theta, true, rows, m_stream);
}
void CudaBackend::geglu_forward_impl(const Tensor& y, const Tensor& x) { cuda::geglu_forward(y, x, m_stream); }
void CudaBackend::geglu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  cuda::geglu_backward(dx, dy, x, m_stream);
}
void CudaBackend::gelu_forward_impl(const Tensor& y, const Tensor& x) { cuda::gelu_forward(y, x, m_stream); }
void CudaBackend::gelu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias) {
  if (dbias.defined())
    cuda::gelu_backward_bias(dx, dy, x, dbias, reduce_scratch(), m_stream);
  else
    cuda::gelu_backward(dx, dy, x, m_stream);
}
void CudaBackend::tanh_forward_impl(const Tensor& y, const Tensor& x) { cuda::tanh_forward(y, x, m_stream); }
void CudaBackend::tanh_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  cuda::tanh_backward(dx, dy, y, m_stream);
}
void CudaBackend::relu_forward_impl(const Tensor& y, const Tensor& x) { cuda::relu_forward(y, x, m_stream); }
void CudaBackend::relu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  cuda::relu_backward(dx, dy, y, m_stream);
}
void CudaBackend::dropout_forward_impl(const Tensor& y, const Tensor& x, const DropoutSpec& d) {
  cuda::dropout_forward(y, x, d, m_stream);
}
void CudaBackend::dropout_backward_impl(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) {
  cuda::dropout_forward(dx, dy, d, m_stream);  // the same mask and scale: dx = dy * factor
}
void CudaBackend::add_impl(const Tensor& y, const Tensor& a, const Tensor& b) { cuda::add(y, a, b, m_stream); }

void CudaBackend::embedding_forward_impl(const Tensor& e, const Tensor& ids, const Tensor& type_ids,
                                         const Tensor& word, const Tensor& pos, const Tensor& type) {
  cuda::embedding_forward(e, ids, type_ids, word, pos, type, m_stream);
}

void CudaBackend::embedding_backward_impl(const Tensor& dword, const Tensor& dpos, const Tensor& dtype,
                                          const Tensor& de, const Tensor& ids, const Tensor& type_ids) {
  cuda::embedding_backward(dword, dpos, dtype, de, ids, type_ids, reduce_scratch(), m_stream);
}

void CudaBackend::select_token_impl(const Tensor& out, const Tensor& x, int64_t t) {
  cuda::select_token(out, x, t, m_stream);
}
void CudaBackend::select_token_backward_impl(const Tensor& dx, const Tensor& dout, int64_t t) {
  cuda::select_token_backward(dx, dout, t, m_stream);
}

void CudaBackend::masked_mean_forward_impl(const Tensor& out, const Tensor& x, const Tensor& mask) {
  cuda::masked_mean_forward(out, x, mask, m_stream);
}
void CudaBackend::masked_mean_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& mask) {
  cuda::masked_mean_backward(dx, dout, mask, m_stream);
}

// The index values are not read on the host: a kernel skips a row out of range.
void CudaBackend::gather_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) {
  cuda::gather_rows(out, in, idx, m_stream);
}
void CudaBackend::scatter_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) {
  cuda::scatter_rows(out, in, idx, m_stream);
}

// ---- optimizer -----------------------------------------------------------------------------------
void CudaBackend::block_sum_squares_impl(const Tensor& partials, const Tensor& x) {
  cuda::block_sum_squares(partials, x, m_stream);
}

void CudaBackend::sum_blocks_impl(const Tensor& out, const Tensor& partials) {
  cuda::sum_blocks(out, partials, m_stream);
}

void CudaBackend::adamw_update_impl(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                                    const Tensor& grads, const GradTransform& g, const AdamWArgs& a) {
  cuda::adamw_update(params, m, v, half_copy, grads, grad_factor(g), a, m_stream);
}

void CudaBackend::sgd_update_impl(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                                  const Tensor& grads, const GradTransform& g, const SgdArgs& a) {
  cuda::sgd_update(params, momentum, half_copy, grads, grad_factor(g), a, m_stream);
}

void CudaBackend::adamw8bit_update_impl(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                                        const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                                        const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                                        const AdamWArgs& a) {
  cuda::adamw8bit_update(params, m_codes, v_codes, m_absmax, v_absmax, half_copy, grads, qmap, grad_factor(g), a,
                         m_stream);
}

// The segment table lives on the device; its builder (optim/adafactor.h) keeps it in range. The
// totals size the launches here only (the CPU reference ignores the work decomposition).
void CudaBackend::adafactor_update_impl(const Tensor& params, const Tensor& state, const Tensor& scratch,
                                        const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                                        const GradTransform& g, const AdafactorArgs& a) {
  ANATOMY_CHECK(table.count >= 0 && table.chunks >= table.count && table.strips >= 0,
                "adafactor_update: inconsistent table totals");
  cuda::adafactor_update(params, state, scratch, half_copy, grads, table, grad_factor(g), a, m_stream);
}

}  // namespace anatomy::cuda
