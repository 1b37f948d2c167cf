// CudaBackend: each entry point checks devices, dtypes and shapes, then calls a launcher
// (ops/cuda/launchers.h) or cuBLASLt (ops/cuda/matmul.h) on the backend's stream.
#include "ops/cuda/cuda_backend.h"

#include "ops/cuda/check.h"
#include "ops/cuda/matmul.h"

#if __has_include("ops/cuda/attention.h")
#include "ops/cuda/attention.h"
#define ANATOMY_HAVE_CUDA_ATTENTION 1
#endif

namespace anatomy::cuda {

namespace {

constexpr DType F32 = DType::F32;
constexpr DType I32 = DType::I32;

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

void on_device(const Tensor& t, const char* op, const char* what) {
  ANATOMY_CHECK(t.defined(), op, ": ", what, " is undefined");
  ANATOMY_CHECK(t.device == Device::CUDA, op, ": ", what, " is on ", device_name(t.device),
                "; the CUDA backend needs device tensors");
}
void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  on_device(t, op, what);
  ANATOMY_CHECK(t.dtype == dt, op, ": ", what, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dt));
}
void expect(const Tensor& t, DType dt, size_t numel, const char* op, const char* what) {
  expect(t, dt, op, what);
  ANATOMY_CHECK(t.numel() == numel, op, ": ", what, " ", t.shape.str(), " has ", t.numel(), " elements, expected ",
                numel);
}
// A float tensor (F32, BF16, F16): returns its dtype, which the op's other activations must share.
DType compute_dtype(const Tensor& t, const char* op, const char* what) {
  on_device(t, op, what);
  ANATOMY_CHECK(is_float(t.dtype), op, ": ", what, " is ", dtype_name(t.dtype), "; expected F32, BF16 or F16");
  return t.dtype;
}
void expect_opt(const Tensor& t, DType dt, size_t numel, const char* op, const char* what) {
  if (t.defined()) expect(t, dt, numel, op, what);
}

// Rows x cols of a tensor seen as a matrix over its last dimension.
struct Mat {
  int64_t rows, cols;
};
Mat as_matrix(const Tensor& t) {
  const int64_t cols = t.shape.rank ? t.dim(-1) : 1;
  return {cols ? static_cast<int64_t>(t.numel()) / cols : 0, cols};
}

GradFactor grad_factor(const GradTransform& g, const char* op) {
  GradFactor f;
  f.inv_loss_scale = g.inv_loss_scale;
  f.max_norm = g.max_norm;
  if (g.max_norm > 0) {
    expect(g.norm_sq, F32, 1, op, "norm_sq (clipping is on)");
    f.norm_sq = g.norm_sq.ptr<const float>();
  }
  if (g.skip_nonfinite) {
    expect(g.norm_sq, F32, 1, op, "norm_sq (skip_nonfinite is on)");
    f.norm_sq = g.norm_sq.ptr<const float>();
    f.skip_nonfinite = true;
  }
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
  m_reduce = Buffer(m_alloc, F32, Shape{static_cast<int64_t>(kReduceScratchBytes / sizeof(float))},
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
  for (cudaEvent_t e : m_upload_events) (void)cudaEventDestroy(e);
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
void CudaBackend::upload(const Tensor& dst, const void* host) {
  on_device(dst, "upload", "dst");
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

// The copy runs in stream order; an event after it tells when `host` may be rewritten. Tokens
// index a ring of 64 events, more than the copies a caller keeps in flight (4 per micro-batch,
// two staging blocks).
int CudaBackend::upload_async(const Tensor& dst, const void* host) {
  on_device(dst, "upload_async", "dst");
  ANATOMY_CHECK(!m_capturing, "upload_async: not allowed while the backend records a graph");
  if (m_upload_events.empty()) {
    m_upload_events.resize(64);
    for (cudaEvent_t& e : m_upload_events) ANATOMY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (dst.bytes()) ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, m_stream));
  const int token = static_cast<int>(m_upload_next++ % m_upload_events.size());
  ANATOMY_CUDA_CHECK(cudaEventRecord(m_upload_events[token], m_stream));
  return token;
}

void CudaBackend::wait_upload(int token) {
  ANATOMY_CHECK(token >= 0 && static_cast<size_t>(token) < m_upload_events.size(), "wait_upload: unknown token ", token);
  ANATOMY_CUDA_CHECK(cudaEventSynchronize(m_upload_events[token]));
}

void CudaBackend::download(void* host, const Tensor& src) {
  on_device(src, "download", "src");
  ANATOMY_CHECK(!m_capturing, "download: not allowed while the backend records a graph");
  if (src.bytes() == 0) return;
  ANATOMY_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, m_stream));
  ANATOMY_CUDA_CHECK(cudaStreamSynchronize(m_stream));
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  on_device(dst, "copy", "dst");
  on_device(src, "copy", "src");
  ANATOMY_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: dst ", dtype_name(dst.dtype),
                dst.shape.str(), " and src ", dtype_name(src.dtype), src.shape.str(), " differ in dtype or size");
  if (dst.bytes() && dst.data != src.data)
    ANATOMY_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDeviceToDevice, m_stream));
}

void CudaBackend::cast(const Tensor& dst, const Tensor& src) {
  compute_dtype(dst, "cast", "dst");
  compute_dtype(src, "cast", "src");
  ANATOMY_CHECK(dst.numel() == src.numel(), "cast: dst ", dst.shape.str(), " and src ", src.shape.str(),
                " differ in size");
  cuda::cast(dst, src, m_stream);
}

void CudaBackend::fill(const Tensor& dst, float value) {
  on_device(dst, "fill", "dst");
  cuda::fill(dst, value, m_stream);
}

// ---- tensor contractions -------------------------------------------------------------------------
void CudaBackend::matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                         const MatmulArgs& args) {
  const DType dt = compute_dtype(a, "matmul", "A");
  expect(b, dt, "matmul", "B");
  on_device(c, "matmul", "C");
  ANATOMY_CHECK(c.dtype == dt || c.dtype == F32, "matmul: C is ", dtype_name(c.dtype), "; expected ",
                dtype_name(dt), " or F32");
  const Mat mc = as_matrix(c), ma = as_matrix(a), mb = as_matrix(b);
  const int64_t m = mc.rows, n = mc.cols;
  const int64_t k = ta == Trans::N ? ma.cols : ma.rows;
  const bool ok = (ta == Trans::N ? ma.rows : ma.cols) == m && (tb == Trans::N ? mb.cols : mb.rows) == n &&
                  (tb == Trans::N ? mb.rows : mb.cols) == k;
  ANATOMY_CHECK(ok, "matmul: shapes do not agree: C ", c.shape.str(), ", A ", a.shape.str(), ta == Trans::T ? "^T" : "",
                ", B ", b.shape.str(), tb == Trans::T ? "^T" : "");
  if (args.epilogue != Epilogue::None) expect(args.bias, dt, static_cast<size_t>(n), "matmul", "bias");
  if (args.epilogue == Epilogue::BiasGelu) {
    ANATOMY_CHECK(c.dtype == dt, "matmul: the BiasGelu epilogue writes C in the compute dtype, not ",
                  dtype_name(c.dtype));
    expect(args.gelu_in, dt, c.numel(), "matmul", "gelu_in");
  }
  m_matmul->run(c, a, ta, b, tb, m, n, k, args, m_stream);
}

void CudaBackend::bias_grad(const Tensor& db, const Tensor& dy) {
  compute_dtype(dy, "bias_grad", "dy");
  expect(db, F32, static_cast<size_t>(as_matrix(dy).cols), "bias_grad", "db");
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

// The scratch grows when the kernels ask for more than it has. Shapes are fixed for a run, so
// this happens on the first step only and the Temporary peak is reached there (Note [allocation
// policy] in memory/allocator.h).
void* CudaBackend::attention_scratch(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > m_attn_scratch.bytes()) {
    ANATOMY_CHECK(!m_capturing, "attention: the scratch must grow (", bytes,
                  " bytes), which a graph recording cannot do: run the step once before capturing it");
    synchronize();  // the old scratch may still be in use on the stream
    m_attn_scratch.reset();
    m_attn_scratch = Buffer(m_alloc, DType::U8, Shape{static_cast<int64_t>(bytes)}, Category::Temporary);
  }
  return m_attn_scratch.data();
}

namespace {
struct AttnDims {
  int64_t b, t, h;
};
AttnDims attention_dims(const Tensor& qkv, const Tensor& ctx, const Tensor& lse, const Tensor& mask, int heads,
                        const char* op) {
  const DType dt = compute_dtype(qkv, op, "qkv");
  ANATOMY_CHECK(qkv.shape.rank == 3 && qkv.dim(2) % 3 == 0, op, ": qkv ", qkv.shape.str(), " is not [B, T, 3H]");
  const AttnDims d{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3};
  ANATOMY_CHECK(heads > 0 && d.h % heads == 0, op, ": hidden ", d.h, " is not divisible by heads ", heads);
  expect(ctx, dt, static_cast<size_t>(d.b * d.t * d.h), op, "ctx");
  expect(lse, F32, static_cast<size_t>(d.b * heads * d.t), op, "lse");
  expect_opt(mask, I32, static_cast<size_t>(d.b * d.t), op, "mask");
  return d;
}
}  // namespace

void CudaBackend::attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask,
                                    int heads, const DropoutSpec& dropout) {
  const AttnDims d = attention_dims(qkv, ctx, lse, mask, heads, "attention_forward");
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  void* scratch = attention_scratch(cuda::attention_scratch_bytes(d.b, d.t, heads, static_cast<int>(d.h / heads), qkv.dtype));
  cuda::attention_forward(ctx, lse, qkv, mask, heads, dropout, scratch, m_stream, attention_options());
#else
  (void)d;
  fail("attention_forward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

void CudaBackend::attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                     const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout) {
  const AttnDims d = attention_dims(qkv, ctx, lse, mask, heads, "attention_backward");
  expect(dqkv, qkv.dtype, qkv.numel(), "attention_backward", "dqkv");
  expect(dctx, qkv.dtype, ctx.numel(), "attention_backward", "dctx");
#if defined(ANATOMY_HAVE_CUDA_ATTENTION)
  void* scratch = attention_scratch(cuda::attention_scratch_bytes(d.b, d.t, heads, static_cast<int>(d.h / heads), qkv.dtype));
  cuda::attention_backward(dqkv, dctx, qkv, ctx, lse, mask, heads, dropout, scratch, m_stream, attention_options());
#else
  (void)d;
  fail("attention_backward: this build has no CUDA attention kernels (ops/cuda/attention.h is missing)");
#endif
}

// ---- statistical normalizations -------------------------------------------------------------------
void CudaBackend::layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                                    const Tensor& beta, float eps, const DropoutSpec& branch_dropout) {
  const char* op = "layernorm_forward";
  const DType dt = compute_dtype(y, op, "y");
  const Mat m = as_matrix(y);
  const size_t n = y.numel(), rows = static_cast<size_t>(m.rows), h = static_cast<size_t>(m.cols);
  expect_opt(sum, dt, n, op, "sum");
  expect(branch, dt, n, op, "branch");
  expect_opt(residual, dt, n, op, "residual");
  expect(mean, F32, rows, op, "mean");
  expect(rstd, F32, rows, op, "rstd");
  expect(gamma, dt, h, op, "gamma");
  expect(beta, dt, h, op, "beta");
  cuda::layernorm_forward(y, sum, mean, rstd, branch, residual, gamma, beta, eps, branch_dropout, m_stream);
}

void CudaBackend::layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                                     const Tensor& dbeta, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                                     const Tensor& gamma, const Tensor& beta, const DropoutSpec& branch_dropout) {
  const char* op = "layernorm_backward";
  const DType dt = compute_dtype(dy, op, "dy");
  const Mat m = as_matrix(dy);
  const size_t n = dy.numel(), rows = static_cast<size_t>(m.rows), h = static_cast<size_t>(m.cols);
  expect(dsum, dt, n, op, "dsum");
  expect_opt(dbranch, dt, n, op, "dbranch");
  expect_opt(dgamma, F32, h, op, "dgamma");
  expect_opt(dbeta, F32, h, op, "dbeta");
  expect(y, dt, n, op, "y");
  expect(rstd, F32, rows, op, "rstd");
  expect(gamma, dt, h, op, "gamma");
  expect(beta, dt, h, op, "beta");
  cuda::layernorm_backward(dsum, dbranch, dgamma, dbeta, dy, y, rstd, gamma, beta, branch_dropout, reduce_scratch(),
                           m_stream);
}

void CudaBackend::cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                const Tensor& labels, float grad_scale) {
  const char* op = "cross_entropy";
  const DType dt = compute_dtype(logits, op, "logits");
  const Mat m = as_matrix(logits);
  expect(losses, F32, static_cast<size_t>(m.rows), op, "losses");
  expect(labels, I32, static_cast<size_t>(m.rows), op, "labels");
  expect_opt(dlogits, dt, logits.numel(), op, "dlogits");
  cuda::cross_entropy(losses, dlogits, logits, labels, grad_scale, m_stream);
}

// ---- element-wise --------------------------------------------------------------------------------
namespace {
void unary(const char* op, const Tensor& y, const Tensor& x) {
  const DType dt = compute_dtype(x, op, "input");
  expect(y, dt, x.numel(), op, "output");
}
void binary(const char* op, const Tensor& y, const Tensor& a, const Tensor& b) {
  unary(op, y, a);
  expect(b, a.dtype, a.numel(), op, "second input");
}
}  // namespace

void CudaBackend::gelu_forward(const Tensor& y, const Tensor& x) {
  unary("gelu_forward", y, x);
  cuda::gelu_forward(y, x, m_stream);
}
void CudaBackend::gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  binary("gelu_backward", dx, dy, x);
  cuda::gelu_backward(dx, dy, x, m_stream);
}
void CudaBackend::tanh_forward(const Tensor& y, const Tensor& x) {
  unary("tanh_forward", y, x);
  cuda::tanh_forward(y, x, m_stream);
}
void CudaBackend::tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  binary("tanh_backward", dx, dy, y);
  cuda::tanh_backward(dx, dy, y, m_stream);
}
void CudaBackend::relu_forward(const Tensor& y, const Tensor& x) {
  unary("relu_forward", y, x);
  cuda::relu_forward(y, x, m_stream);
}
void CudaBackend::relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  binary("relu_backward", dx, dy, y);
  cuda::relu_backward(dx, dy, y, m_stream);
}
void CudaBackend::dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) {
  unary("dropout_forward", y, x);
  cuda::dropout_forward(y, x, d, m_stream);
}
void CudaBackend::dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) {
  unary("dropout_backward", dx, dy);
  cuda::dropout_forward(dx, dy, d, m_stream);  // the same mask and scale: dx = dy * factor
}
void CudaBackend::add(const Tensor& y, const Tensor& a, const Tensor& b) {
  binary("add", y, a, b);
  cuda::add(y, a, b, m_stream);
}

namespace {
// ids [B, T]; tables [rows, H] in the compute dtype (forward) or F32 (backward gradients).
void check_embedding(const char* op, const Tensor& e, const Tensor& ids, const Tensor& type_ids,
                     std::initializer_list<std::pair<const Tensor*, const char*>> tables, DType table_dtype) {
  expect(ids, I32, op, "ids");
  ANATOMY_CHECK(ids.shape.rank == 2, op, ": ids ", ids.shape.str(), " is not [B, T]");
  expect_opt(type_ids, I32, ids.numel(), op, "type_ids");
  const int64_t h = e.dim(-1);
  ANATOMY_CHECK(e.numel() == ids.numel() * static_cast<size_t>(h), op, ": embeddings ", e.shape.str(),
                " do not match ids ", ids.shape.str());
  for (const auto& [t, what] : tables) {
    if (!t->defined()) continue;
    expect(*t, table_dtype, op, what);
    ANATOMY_CHECK(t->shape.rank == 2 && t->dim(1) == h, op, ": table ", what, " ", t->shape.str(),
                  " does not have width ", h);
  }
}
}  // namespace

void CudaBackend::embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                                    const Tensor& pos, const Tensor& type) {
  const char* op = "embedding_forward";
  const DType dt = compute_dtype(e, op, "e");
  on_device(word, op, "word");
  on_device(pos, op, "pos");
  on_device(type, op, "type");
  check_embedding(op, e, ids, type_ids, {{&word, "word"}, {&pos, "pos"}, {&type, "type"}}, dt);
  ANATOMY_CHECK(ids.dim(1) <= pos.dim(0), op, ": sequence length ", ids.dim(1), " exceeds max_position_embeddings ",
                pos.dim(0));
  cuda::embedding_forward(e, ids, type_ids, word, pos, type, m_stream);
}

void CudaBackend::embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                                     const Tensor& ids, const Tensor& type_ids) {
  const char* op = "embedding_backward";
  compute_dtype(de, op, "de");
  check_embedding(op, de, ids, type_ids, {{&dword, "dword"}, {&dpos, "dpos"}, {&dtype, "dtype"}}, F32);
  ANATOMY_CHECK(!dpos.defined() || ids.dim(1) <= dpos.dim(0), op, ": sequence length ", ids.dim(1),
                " exceeds max_position_embeddings ", dpos.dim(0));
  cuda::embedding_backward(dword, dpos, dtype, de, ids, type_ids, reduce_scratch(), m_stream);
}

namespace {
void check_select(const char* op, const Tensor& x, const Tensor& out, int64_t t) {
  const DType dt = compute_dtype(x, op, "x");
  ANATOMY_CHECK(x.shape.rank == 3 && t >= 0 && t < x.dim(1), op, ": x ", x.shape.str(), " is not [B, T, H] with token ",
                t, " < T");
  expect(out, dt, static_cast<size_t>(x.dim(0) * x.dim(2)), op, "out");
}
}  // namespace

void CudaBackend::select_token(const Tensor& out, const Tensor& x, int64_t t) {
  check_select("select_token", x, out, t);
  cuda::select_token(out, x, t, m_stream);
}
void CudaBackend::select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) {
  check_select("select_token_backward", dx, dout, t);
  cuda::select_token_backward(dx, dout, t, m_stream);
}

namespace {
// packed [N, C] and padded [R, C] of one dtype; idx I32 [N] (its values are not read on the host).
void check_row_copy(const char* op, const Tensor& out, const Tensor& in, const Tensor& idx, bool gather) {
  on_device(out, op, "out");
  on_device(in, op, "in");
  const Mat p = as_matrix(gather ? out : in), q = as_matrix(gather ? in : out);
  ANATOMY_CHECK(out.dtype == in.dtype && p.cols == q.cols, op, ": out ", dtype_name(out.dtype), out.shape.str(),
                " and in ", dtype_name(in.dtype), in.shape.str(), " differ in dtype or row width");
  expect(idx, I32, static_cast<size_t>(p.rows), op, "idx");
  ANATOMY_CHECK(idx.shape.rank == 1, op, ": idx ", idx.shape.str(), " is not [N]");
}
}  // namespace

void CudaBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  check_row_copy("gather_rows", out, in, idx, true);
  cuda::gather_rows(out, in, idx, m_stream);
}
void CudaBackend::scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  check_row_copy("scatter_rows", out, in, idx, false);
  cuda::scatter_rows(out, in, idx, m_stream);
}

// ---- optimizer -----------------------------------------------------------------------------------
void CudaBackend::block_sum_squares(const Tensor& partials, const Tensor& x) {
  expect(x, F32, "block_sum_squares", "x");
  expect(partials, F32, (x.numel() + kNormBlock - 1) / kNormBlock, "block_sum_squares", "partials");
  cuda::block_sum_squares(partials, x, m_stream);
}

void CudaBackend::sum_blocks(const Tensor& out, const Tensor& partials) {
  expect(out, F32, 1, "sum_blocks", "out");
  expect(partials, F32, "sum_blocks", "partials");
  cuda::sum_blocks(out, partials, m_stream);
}

void CudaBackend::adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                               const Tensor& grads, const GradTransform& g, const AdamWArgs& a) {
  const char* op = "adamw_update";
  expect(params, F32, op, "params");
  const size_t n = params.numel();
  expect(m, F32, n, op, "m");
  expect(v, F32, n, op, "v");
  expect(grads, F32, n, op, "grads");
  if (half_copy.defined()) {
    compute_dtype(half_copy, op, "half_copy");
    ANATOMY_CHECK(half_copy.numel() == n, op, ": half_copy ", half_copy.shape.str(), " does not match params ",
                  params.shape.str());
  }
  cuda::adamw_update(params, m, v, half_copy, grads, grad_factor(g, op), a, m_stream);
}

void CudaBackend::sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                             const Tensor& grads, const GradTransform& g, const SgdArgs& a) {
  const char* op = "sgd_update";
  expect(params, F32, op, "params");
  const size_t n = params.numel();
  expect(grads, F32, n, op, "grads");
  if (a.momentum != 0.0f) expect(momentum, F32, n, op, "momentum");
  if (half_copy.defined()) {
    compute_dtype(half_copy, op, "half_copy");
    ANATOMY_CHECK(half_copy.numel() == n, op, ": half_copy ", half_copy.shape.str(), " does not match params ",
                  params.shape.str());
  }
  cuda::sgd_update(params, momentum, half_copy, grads, grad_factor(g, op), a, m_stream);
}

void CudaBackend::adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                                   const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                                   const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                                   const AdamWArgs& a) {
  const char* op = "adamw8bit_update";
  expect(params, F32, op, "params");
  const size_t n = params.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  expect(m_codes, DType::U8, n, op, "m_codes");
  expect(v_codes, DType::U8, n, op, "v_codes");
  expect(m_absmax, F32, blocks, op, "m_absmax");
  expect(v_absmax, F32, blocks, op, "v_absmax");
  expect(qmap, F32, 512, op, "qmap");
  expect(grads, F32, n, op, "grads");
  if (half_copy.defined()) {
    compute_dtype(half_copy, op, "half_copy");
    ANATOMY_CHECK(half_copy.numel() == n, op, ": half_copy ", half_copy.shape.str(), " does not match params ",
                  params.shape.str());
  }
  cuda::adamw8bit_update(params, m_codes, v_codes, m_absmax, v_absmax, half_copy, grads, qmap, grad_factor(g, op), a,
                         m_stream);
}

void CudaBackend::adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch,
                                   const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                                   const GradTransform& g, const AdafactorArgs& a) {
  const char* op = "adafactor_update";
  expect(params, F32, op, "params");
  const size_t n = params.numel();
  expect(grads, F32, n, op, "grads");
  expect(state, F32, op, "state");
  expect(scratch, F32, op, "scratch");
  // The table itself lives on the device; its builder (optim/adafactor.h) keeps it in range.
  expect(table.segments, DType::I64, static_cast<size_t>(table.count * kAdafactorSegmentFields), op, "segments");
  ANATOMY_CHECK(table.count >= 0 && table.chunks >= table.count && table.strips >= 0, op, ": inconsistent table totals");
  if (half_copy.defined()) {
    compute_dtype(half_copy, op, "half_copy");
    ANATOMY_CHECK(half_copy.numel() == n, op, ": half_copy ", half_copy.shape.str(), " does not match params ",
                  params.shape.str());
  }
  cuda::adafactor_update(params, state, scratch, half_copy, grads, table, grad_factor(g, op), a, m_stream);
}

}  // namespace anatomy::cuda
