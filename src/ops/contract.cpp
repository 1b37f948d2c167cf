// The backend contract (Note [backend contract] in ops/backend.h): each op's entry point checks
// devices, dtypes and shapes here, once for every backend, then runs the backend's *_impl under
// the observer. A backend's capability enters through computes_in(): the CPU computes in F32
// only, CUDA in F32, BF16 and F16; the words of every error are the same on both.
//
// Note [op observer]: the profiler (telemetry/profiler.h) attaches itself as the backend's
// observer instead of wrapping it; each op reports its profile name, the backend's current
// phase and its declared cost (telemetry/op_cost.h). Without an observer an op costs one
// branch more than its implementation.
//
// Note [contract cost]: the contract runs on every call, ~200 a step for a small model whose
// step is ~1.6 ms of GPU work with the host's launches just keeping up, so a passing check
// builds nothing: messages are formatted only on failure (ANATOMY_CHECK's arguments, and
// Check::holds's lambdas), never str_cat'ed up front.
#include <cmath>
#include <type_traits>

#include "ops/backend.h"
#include "telemetry/op_cost.h"

namespace anatomy {

namespace {

constexpr DType F32 = DType::F32;
constexpr DType I32 = DType::I32;

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Rows x cols of a tensor seen as a matrix over its last dimension.
struct Mat {
  int64_t rows, cols;
};
Mat as_matrix(const Tensor& t) {
  const int64_t cols = t.shape.rank ? t.dim(-1) : 1;
  return {cols ? static_cast<int64_t>(t.numel()) / cols : 0, cols};
}

// A matmul's profile names by kind, plain and fp8 (literals: the observer keeps the pointer).
enum MatmulKind { kMatmul, kWeightGrad, kWgradBgrad, kBiasGradOnly, kMatmulBias, kMatmulBiasGelu, kMatmulKinds };
constexpr const char* kMatmulNames[2][kMatmulKinds] = {
    {"matmul", "matmul (weight grad)", "matmul (wgrad+bgrad)", "matmul+bias grad", "matmul+bias", "matmul+bias+gelu"},
    {"fp8 matmul", "fp8 matmul (weight grad)", "fp8 matmul (wgrad+bgrad)", "fp8 matmul+bias grad", "fp8 matmul+bias",
     "fp8 matmul+bias+gelu"}};

// The checks of one op call: `op` names it in every message.
class Check {
 public:
  Check(const Backend& be, const char* op) : m_be(be), m_op(op) {}

  void on_device(const Tensor& t, const char* what) const {
    ANATOMY_CHECK(t.defined(), m_op, ": ", what, " is undefined");
    ANATOMY_CHECK(t.device == m_be.device(), m_op, ": ", what, " is on ", device_name(t.device), "; the ",
                  device_name(m_be.device()), " backend needs ", device_name(m_be.device()), " tensors");
  }
  void dtype(const Tensor& t, DType dt, const char* what) const {
    on_device(t, what);
    ANATOMY_CHECK(t.dtype == dt, m_op, ": ", what, " is ", dtype_name(t.dtype), ", expected ", dtype_name(dt));
  }
  void sized(const Tensor& t, DType dt, size_t numel, const char* what) const {
    dtype(t, dt, what);
    ANATOMY_CHECK(t.numel() == numel, m_op, ": ", what, " ", t.shape.str(), " has ", t.numel(),
                  " elements, expected ", numel);
  }
  void optional(const Tensor& t, DType dt, size_t numel, const char* what) const {
    if (t.defined()) sized(t, dt, numel, what);
  }
  // An activation: a float dtype this backend computes in; returns it for the op's other tensors.
  DType compute(const Tensor& t, const char* what) const {
    on_device(t, what);
    ANATOMY_CHECK(is_float(t.dtype) && m_be.computes_in(t.dtype), m_op, ": ", what, " is ", dtype_name(t.dtype),
                  "; the ", device_name(m_be.device()), " backend computes in ", computes_list());
    return t.dtype;
  }
  // Any float dtype (casts and the optimizers' half copies convert on every backend).
  void floating(const Tensor& t, const char* what) const {
    on_device(t, what);
    ANATOMY_CHECK(is_float(t.dtype), m_op, ": ", what, " is ", dtype_name(t.dtype), "; expected F32, BF16 or F16");
  }
  // message: a string, or a callable that builds it only when the check fails (a contract runs on
  // every op call: Note [contract cost]).
  template <class M>
  void holds(bool ok, const M& message) const {
    if (ok) return;
    if constexpr (std::is_invocable_v<const M&>)
      fail(m_op, ": ", message());
    else
      fail(m_op, ": ", message);
  }
  void dropout(const DropoutSpec& d) const {
    ANATOMY_CHECK(d.p >= 0.0f && d.p < 1.0f, m_op, ": dropout probability ", d.p, " is not in [0, 1)");
  }
  const char* op() const { return m_op; }
  const Backend& backend() const { return m_be; }

 private:
  std::string computes_list() const {
    std::string s;
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      if (m_be.computes_in(dt)) s += (s.empty() ? "" : ", ") + std::string(dtype_name(dt));
    return s;
  }
  const Backend& m_be;
  const char* m_op;
};

// y and x of one float dtype and size; a second input b the same (when given).
void elementwise(const Check& c, const Tensor& y, const Tensor& x, const Tensor* b = nullptr) {
  const DType dt = c.compute(x, "input");
  c.sized(y, dt, x.numel(), "output");
  if (b) c.sized(*b, dt, x.numel(), "second input");
}

// qkv [B, T, 3H] with H divisible by heads; ctx [B, T, H]; lse F32 [B, heads, T]; mask I32 [B, T].
// Note [attention scope] in ops/op_args.h: a window and a query count, neither negative.
void attention_scope(const Check& c, AttentionScope scope) {
  c.holds(scope.window >= 0, [&] { return str_cat("window ", scope.window, " is negative"); });
  c.holds(scope.queries >= 0, [&] { return str_cat("queries ", scope.queries, " is negative"); });
}

DType attention(const Check& c, const Tensor& qkv, const Tensor& ctx, const Tensor& lse, const Tensor& mask,
                int heads, const DropoutSpec& d, AttentionScope scope) {
  const DType dt = c.compute(qkv, "qkv");
  c.holds(qkv.shape.rank == 3 && qkv.dim(2) % 3 == 0, [&] { return str_cat("qkv ", qkv.shape.str(), " is not [B, T, 3H]"); });
  const int64_t b = qkv.dim(0), t = qkv.dim(1), h = qkv.dim(2) / 3;
  c.holds(heads > 0 && h % heads == 0, [&] { return str_cat("hidden ", h, " is not divisible by heads ", heads); });
  c.sized(ctx, dt, static_cast<size_t>(b * t * h), "ctx");
  c.sized(lse, F32, static_cast<size_t>(b * heads * t), "lse");
  c.optional(mask, I32, static_cast<size_t>(b * t), "mask");
  c.dropout(d);
  attention_scope(c, scope);
  return dt;
}

// A normalization's gamma and beta [H]: both F32 (the master weights, Note [normalization
// parameters in fp32] in model/bert.cpp) or both of the compute dtype.
void normalization_parameters(const Check& c, const Tensor& gamma, const Tensor& beta, DType dt, size_t h) {
  const DType pt = gamma.defined() && gamma.dtype == F32 ? F32 : dt;
  c.sized(gamma, pt, h, "gamma");
  c.sized(beta, pt, h, "beta");
}

// ids I32 [B, T] (type_ids the same when given); tables [rows, H] of `table_dtype` with H the
// width of e; the sequence fits the position table.
void embedding(const Check& c, const Tensor& e, const Tensor& ids, const Tensor& type_ids,
               std::initializer_list<std::pair<const Tensor*, const char*>> tables, DType table_dtype,
               bool tables_required) {
  c.dtype(ids, I32, "ids");
  c.holds(ids.shape.rank == 2, [&] { return str_cat("ids ", ids.shape.str(), " is not [B, T]"); });
  c.optional(type_ids, I32, ids.numel(), "type_ids");
  const int64_t h = e.dim(-1);
  c.holds(e.numel() == ids.numel() * static_cast<size_t>(h),
          [&] { return str_cat("embeddings ", e.shape.str(), " do not match ids ", ids.shape.str()); });
  for (const auto& [t, what] : tables) {
    if (!tables_required && !t->defined()) continue;
    c.dtype(*t, table_dtype, what);
    c.holds(t->shape.rank == 2 && t->dim(1) == h,
            [&] { return str_cat("table ", what, " ", t->shape.str(), " does not have width ", h); });
  }
  const Tensor& pos = *tables.begin()[1].first;
  c.holds(!pos.defined() || ids.dim(1) <= pos.dim(0),
          [&] { return str_cat("sequence length ", ids.dim(1), " exceeds max_position_embeddings ", pos.dim(0)); });
}

// x [B, T, H] with t < T; out [B, H] of x's dtype.
void select(const Check& c, const Tensor& x, const Tensor& out, int64_t t) {
  const DType dt = c.compute(x, "x");
  c.holds(x.shape.rank == 3 && t >= 0 && t < x.dim(1),
          [&] { return str_cat("x ", x.shape.str(), " is not [B, T, H] with token ", t, " < T"); });
  c.sized(out, dt, static_cast<size_t>(x.dim(0) * x.dim(2)), "out");
}

// packed [N, C] and padded [R, C] of one dtype; idx I32 [N].
void row_copy(const Check& c, const Tensor& out, const Tensor& in, const Tensor& idx, bool gather) {
  c.on_device(out, "out");
  c.on_device(in, "in");
  const Mat p = as_matrix(gather ? out : in), q = as_matrix(gather ? in : out);
  c.holds(out.dtype == in.dtype && p.cols == q.cols, [&] { return str_cat("out ", dtype_name(out.dtype), out.shape.str(), " and in ",
                                                             dtype_name(in.dtype), in.shape.str(),
                                                             " differ in dtype or row width"); });
  c.sized(idx, I32, static_cast<size_t>(p.rows), "idx");
  c.holds(idx.shape.rank == 1, [&] { return str_cat("idx ", idx.shape.str(), " is not [N]"); });
}

// The optimizers' shared part: F32 params [n] and grads [n], the half copy, the norm.
size_t update(const Check& c, const Tensor& params, const Tensor& grads, const Tensor& half_copy,
              const GradTransform& g) {
  c.dtype(params, F32, "params");
  const size_t n = params.numel();
  c.sized(grads, F32, n, "grads");
  if (half_copy.defined()) {
    c.floating(half_copy, "half_copy");
    c.holds(half_copy.numel() == n,
            [&] { return str_cat("half_copy ", half_copy.shape.str(), " does not match params ", params.shape.str()); });
  }
  if (g.max_norm > 0) c.sized(g.norm_sq, F32, 1, "norm_sq (clipping is on)");
  if (g.skip_nonfinite) c.sized(g.norm_sq, F32, 1, "norm_sq (skip_nonfinite is on)");
  return n;
}

}  // namespace

// ---- data movement -------------------------------------------------------------------------------
void Backend::upload(const Tensor& dst, const void* host) {
  Check(*this, "upload").on_device(dst, "dst");
  observed("upload", [&] { return elementwise_cost(dst, 0, 0, 1, OpClass::Data); }, [&] { upload_impl(dst, host); });
}
int Backend::upload_async(const Tensor& dst, const void* host) {
  Check(*this, "upload_async").on_device(dst, "dst");
  int token = 0;
  observed("upload", [&] { return elementwise_cost(dst, 0, 0, 1, OpClass::Data); },
           [&] { token = upload_async_impl(dst, host); });
  return token;
}
int Backend::download_async(void* host, const Tensor& src) {
  Check(*this, "download_async").on_device(src, "src");
  int token = 0;
  observed("download", [&] { return elementwise_cost(src, 0, 1, 0, OpClass::Data); },
           [&] { token = download_async_impl(host, src); });
  return token;
}
void Backend::download(void* host, const Tensor& src) {
  Check(*this, "download").on_device(src, "src");
  observed("download", [&] { return elementwise_cost(src, 0, 1, 0, OpClass::Data); },
           [&] { download_impl(host, src); });
}
void Backend::copy(const Tensor& dst, const Tensor& src) {
  const Check c(*this, "copy");
  c.on_device(dst, "dst");
  c.on_device(src, "src");
  c.holds(dst.dtype == src.dtype && dst.numel() == src.numel(),
          [&] { return str_cat("dst ", dtype_name(dst.dtype), dst.shape.str(), " and src ", dtype_name(src.dtype), src.shape.str(),
                  " differ in dtype or size"); });
  observed("copy", [&] { return elementwise_cost(dst, 0, 1, 1); }, [&] { copy_impl(dst, src); });
}
void Backend::cast(const Tensor& dst, const Tensor& src) {
  const Check c(*this, "cast");
  c.floating(dst, "dst");
  c.floating(src, "src");
  c.holds(dst.numel() == src.numel(), [&] { return str_cat("dst ", dst.shape.str(), " and src ", src.shape.str(), " differ in size"); });
  observed("cast",
           [&] {
             return OpCost{static_cast<double>(dst.numel()), static_cast<double>(dst.bytes() + src.bytes()),
                           OpClass::Elementwise};
           },
           [&] { cast_impl(dst, src); });
}
void Backend::fill(const Tensor& dst, float value) {
  Check(*this, "fill").on_device(dst, "dst");
  observed("fill", [&] { return elementwise_cost(dst, 0, 0, 1); }, [&] { fill_impl(dst, value); });
}

// ---- tensor contractions -------------------------------------------------------------------------
void Backend::matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb, const MatmulArgs& args) {
  const Check k(*this, "matmul");
  const DType dt = k.compute(a, "A");
  k.dtype(b, dt, "B");
  k.on_device(c, "C");
  k.holds(c.dtype == dt || c.dtype == F32, [&] { return str_cat("C is ", dtype_name(c.dtype), "; expected ", dtype_name(dt), " or F32"); });
  const Mat mc = as_matrix(c), ma = as_matrix(a), mb = as_matrix(b);
  const int64_t m = mc.rows, n = mc.cols, kk = ta == Trans::N ? ma.cols : ma.rows;
  const bool ok = (ta == Trans::N ? ma.rows : ma.cols) == m && (tb == Trans::N ? mb.cols : mb.rows) == n &&
                  (tb == Trans::N ? mb.rows : mb.cols) == kk;
  k.holds(ok, [&] { return str_cat("shapes do not agree: C ", c.shape.str(), ", A ", a.shape.str(), ta == Trans::T ? "^T" : "",
                      ", B ", b.shape.str(), tb == Trans::T ? "^T" : ""); });
  const bool weight_grad = c.dtype == F32 && a.dtype != F32;
  MatmulKind kind = weight_grad ? kWeightGrad : kMatmul;
  if (args.epilogue == Epilogue::BiasGrad) {  // Note [fused bias gradient] in ops/op_args.h
    k.holds(ta == Trans::T, "the BiasGrad epilogue sums the columns of A, the weight gradient's dY: A must be "
                            "transposed (C = A^T B)");
    k.holds(args.alpha == 1.0f && (args.beta == 0.0f || args.beta == 1.0f),
            [&] { return str_cat("the BiasGrad epilogue needs alpha 1 and beta 0 or 1, not alpha ", args.alpha, " beta ", args.beta); });
    k.sized(args.bias, F32, static_cast<size_t>(m), "bias gradient");
    k.holds(args.bias.data != c.data, "the bias gradient and C are one buffer");
    kind = weight_grad ? kWgradBgrad : kBiasGradOnly;
  } else if (args.epilogue != Epilogue::None) {
    k.sized(args.bias, dt, static_cast<size_t>(n), "bias");
    kind = kMatmulBias;
  }
  if (args.epilogue == Epilogue::BiasGelu) {
    k.holds(c.dtype == dt, [&] { return str_cat("the BiasGelu epilogue writes C in the compute dtype, not ", dtype_name(c.dtype)); });
    k.sized(args.gelu_in, dt, c.numel(), "gelu_in");
    kind = kMatmulBiasGelu;
  }
  const bool fp8 = args.fp8_a.defined() || args.fp8_b.defined();
  if (fp8) {  // Note [fp8 training] in core/fp8.h
    k.holds(args.fp8_a.defined() && args.fp8_b.defined(), "fp8 needs the scaling rows of both A and B");
    k.holds(dt == DType::BF16 || dt == F32,
            [&] { return str_cat("fp8 operands are quantized from BF16 (or F32 on the CPU), not ", dtype_name(dt)); });
    k.holds(!(args.fp8_a.format == Fp8Format::E5M2 && args.fp8_b.format == Fp8Format::E5M2),
            "fp8 GEMMs take at most one E5M2 operand");
    k.sized(args.fp8_a.meta, F32, kFp8MetaWidth, "A's fp8 scaling row");
    k.sized(args.fp8_b.meta, F32, kFp8MetaWidth, "B's fp8 scaling row");
  }
  observed(kMatmulNames[fp8][kind], [&] { return matmul_cost(c, a, ta, b, args); },
           [&] { matmul_impl(c, a, ta, b, tb, args); });
}
void Backend::fp8_scale_update(const Tensor& meta) {
  const Check c(*this, "fp8_scale_update");
  c.dtype(meta, F32, "meta");
  c.holds(meta.shape.rank == 2 && meta.dim(1) == kFp8MetaWidth,
          [&] { return str_cat("meta ", meta.shape.str(), " is not [rows, ", kFp8MetaWidth, "]"); });
  observed("fp8_scale_update", [&] { return elementwise_cost(meta, 1, 1, 1, OpClass::Optimizer); },
           [&] { fp8_scale_update_impl(meta); });
}
void Backend::bias_grad(const Tensor& db, const Tensor& dy) {
  const Check c(*this, "bias_grad");
  c.compute(dy, "dy");
  c.sized(db, F32, static_cast<size_t>(as_matrix(dy).cols), "db");
  observed("bias_grad",
           [&] {
             return OpCost{static_cast<double>(dy.numel()), static_cast<double>(dy.bytes() + 2 * db.bytes()),
                           OpClass::Elementwise};
           },
           [&] { bias_grad_impl(db, dy); });
}

// ---- attention -----------------------------------------------------------------------------------
void Backend::attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                                const DropoutSpec& dropout, AttentionScope scope) {
  const Check c(*this, "attention_forward");
  attention(c, qkv, ctx, lse, mask, heads, dropout, scope);
  observed("attention", [&] { return attention_cost(qkv, ctx, heads, scope.queries, false); },
           [&] { attention_forward_impl(ctx, lse, qkv, mask, heads, dropout, scope); });
}
void Backend::attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                 const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout,
                                 AttentionScope scope, const Tensor& dbias) {
  const Check c(*this, "attention_backward");
  const DType dt = attention(c, qkv, ctx, lse, mask, heads, dropout, scope);
  c.sized(dqkv, dt, qkv.numel(), "dqkv");
  c.sized(dctx, dt, ctx.numel(), "dctx");
  c.optional(dbias, F32, static_cast<size_t>(as_matrix(dqkv).cols), "dbias");
  observed("attention", [&] { return attention_cost(qkv, ctx, heads, scope.queries, true); },
           [&] { attention_backward_impl(dqkv, dctx, qkv, ctx, lse, mask, heads, dropout, scope, dbias); });
}

// Packed: qkv [N, 3H] with H divisible by heads; ctx [N, H]; lse F32 [B, heads, T]; offsets I32 [B + 1].
DType packed_attention(const Check& c, const Tensor& qkv, const Tensor& ctx, const Tensor& lse,
                       const Tensor& offsets, int heads, const DropoutSpec& d, AttentionScope scope) {
  const DType dt = c.compute(qkv, "qkv");
  c.holds(qkv.shape.rank == 2 && qkv.dim(1) % 3 == 0, [&] { return str_cat("qkv ", qkv.shape.str(), " is not [N, 3H]"); });
  const int64_t n = qkv.dim(0), h = qkv.dim(1) / 3;
  c.holds(heads > 0 && h % heads == 0, [&] { return str_cat("hidden ", h, " is not divisible by heads ", heads); });
  c.sized(ctx, dt, static_cast<size_t>(n * h), "ctx");
  c.dtype(lse, F32, "lse");
  c.holds(lse.shape.rank == 3 && lse.dim(1) == heads, [&] { return str_cat("lse ", lse.shape.str(), " is not [B, heads, T]"); });
  c.sized(offsets, I32, static_cast<size_t>(lse.dim(0) + 1), "offsets");
  c.dropout(d);
  attention_scope(c, scope);
  c.holds(c.backend().packed_attention_supported(dt, lse.dim(2), h / heads),
          [&] { return str_cat("the ", c.backend().name(), " backend has no packed attention for ", dtype_name(dt), ", T ",
                  lse.dim(2), ", head dim ", h / heads); });
  return dt;
}
void Backend::attention_packed_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets,
                                       int heads, const DropoutSpec& dropout, int64_t pairs, AttentionScope scope) {
  const Check c(*this, "attention_packed_forward");
  packed_attention(c, qkv, ctx, lse, offsets, heads, dropout, scope);
  observed("attention", [&] { return packed_attention_cost(qkv, ctx, lse, heads, pairs, false); },
           [&] { attention_packed_forward_impl(ctx, lse, qkv, offsets, heads, dropout, scope); });
}
void Backend::attention_packed_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                                        const Tensor& lse, const Tensor& offsets, int heads,
                                        const DropoutSpec& dropout, int64_t pairs, AttentionScope scope,
                                        const Tensor& dbias) {
  const Check c(*this, "attention_packed_backward");
  const DType dt = packed_attention(c, qkv, ctx, lse, offsets, heads, dropout, scope);
  c.sized(dqkv, dt, qkv.numel(), "dqkv");
  c.sized(dctx, dt, ctx.numel(), "dctx");
  c.optional(dbias, F32, static_cast<size_t>(as_matrix(dqkv).cols), "dbias");
  observed("attention", [&] { return packed_attention_cost(qkv, ctx, lse, heads, pairs, true); },
           [&] { attention_packed_backward_impl(dqkv, dctx, qkv, ctx, lse, offsets, heads, dropout, scope, dbias); });
}

// qkv [B, T, 3H] with an even head dim; y the same; rows (optional) I32 [N], N <= B*T. The
// cost counts the rows rotated: all of them, or the N packed ones.
Tensor rotary(const Check& c, const Tensor& y, const Tensor& x, int heads, const Tensor& rows) {
  const DType dt = c.compute(x, "qkv");
  c.holds(x.shape.rank == 3 && x.dim(2) % 3 == 0, [&] { return str_cat("qkv ", x.shape.str(), " is not [B, T, 3H]"); });
  const int64_t h = x.dim(2) / 3;
  c.holds(heads > 0 && h % heads == 0 && (h / heads) % 2 == 0,
          [&] { return str_cat("hidden ", h, " over ", heads, " heads does not give an even head dim"); });
  c.sized(y, dt, x.numel(), "output");
  if (!rows.defined()) return y;
  c.dtype(rows, I32, "rows");
  c.holds(rows.shape.rank == 1 && rows.dim(0) <= x.dim(0) * x.dim(1),
          [&] { return str_cat("rows ", rows.shape.str(), " is not [N] with N <= B*T = ", x.dim(0) * x.dim(1)); });
  return y.view({x.dim(0) * x.dim(1), 3 * h}).slice(0, rows.dim(0));
}
void Backend::rotary_forward(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows) {
  const Tensor done = rotary(Check(*this, "rotary_forward"), y, x, heads, rows);
  observed("rotary", [&] { return elementwise_cost(done, 6, 1, 1); },
           [&] { rotary_forward_impl(y, x, heads, theta, rows); });
}
void Backend::rotary_backward(const Tensor& dx, const Tensor& dy, int heads, float theta, const Tensor& rows) {
  const Tensor done = rotary(Check(*this, "rotary_backward"), dx, dy, heads, rows);
  observed("rotary", [&] { return elementwise_cost(done, 6, 1, 1); },
           [&] { rotary_backward_impl(dx, dy, heads, theta, rows); });
}

// ---- statistical normalizations -------------------------------------------------------------------
void Backend::layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                                const Tensor& branch, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                                float eps, const DropoutSpec& branch_dropout) {
  const Check c(*this, "layernorm_forward");
  const DType dt = c.compute(y, "y");
  const Mat m = as_matrix(y);
  const size_t n = y.numel(), rows = static_cast<size_t>(m.rows), h = static_cast<size_t>(m.cols);
  c.optional(sum, dt, n, "sum");
  c.sized(branch, dt, n, "branch");
  c.optional(residual, dt, n, "residual");
  c.sized(mean, F32, rows, "mean");
  c.sized(rstd, F32, rows, "rstd");
  normalization_parameters(c, gamma, beta, dt, h);
  c.dropout(branch_dropout);
  observed("layernorm", [&] { return layernorm_cost(y, residual.defined(), false, sum.defined()); },
           [&] { layernorm_forward_impl(y, sum, mean, rstd, branch, residual, gamma, beta, eps, branch_dropout); });
}
void Backend::layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                                 const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma,
                                 const Tensor& beta, const DropoutSpec& branch_dropout, const Tensor& dbias) {
  const Check c(*this, "layernorm_backward");
  const DType dt = c.compute(dy, "dy");
  const Mat m = as_matrix(dy);
  const size_t n = dy.numel(), rows = static_cast<size_t>(m.rows), h = static_cast<size_t>(m.cols);
  c.sized(dsum, dt, n, "dsum");
  c.optional(dbranch, dt, n, "dbranch");
  c.optional(dgamma, F32, h, "dgamma");
  c.optional(dbeta, F32, h, "dbeta");
  c.optional(dbias, F32, h, "dbias");
  c.holds(!dbias.defined() || dbranch.defined(), [] { return std::string("dbias needs dbranch (its column sums)"); });
  c.sized(y, dt, n, "y");
  c.sized(rstd, F32, rows, "rstd");
  normalization_parameters(c, gamma, beta, dt, h);
  c.dropout(branch_dropout);
  observed("layernorm", [&] { return layernorm_cost(dy, dbranch.defined(), true); },
           [&] { layernorm_backward_impl(dsum, dbranch, dgamma, dbeta, dy, y, rstd, gamma, beta, branch_dropout, dbias); });
}
void Backend::cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                            float grad_scale) {
  const Check c(*this, "cross_entropy");
  const DType dt = c.compute(logits, "logits");
  const Mat m = as_matrix(logits);
  c.sized(losses, F32, static_cast<size_t>(m.rows), "losses");
  c.sized(labels, I32, static_cast<size_t>(m.rows), "labels");
  c.optional(dlogits, dt, logits.numel(), "dlogits");
  observed("cross_entropy", [&] { return cross_entropy_cost(logits); },
           [&] { cross_entropy_impl(losses, dlogits, logits, labels, grad_scale); });
}
void Backend::token_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                  const Tensor& labels, float loss_weight, float grad_scale) {
  const Check c(*this, "token_cross_entropy");
  const DType dt = c.compute(logits, "logits");
  const Mat m = as_matrix(logits);
  c.dtype(losses, F32, "losses");
  c.holds(losses.numel() > 0 && m.rows % static_cast<int64_t>(losses.numel()) == 0,
          [&] { return str_cat("logits' ", m.rows, " rows are not a whole number of rows per sequence for ", losses.numel(),
                  " losses"); });
  c.sized(labels, I32, static_cast<size_t>(m.rows), "labels");
  c.optional(dlogits, dt, logits.numel(), "dlogits");
  observed("token_cross_entropy", [&] { return cross_entropy_cost(logits); },
           [&] { token_cross_entropy_impl(losses, dlogits, logits, labels, loss_weight, grad_scale); });
}

// The contract of the two float-target losses: logits [B, C] in the compute dtype, targets F32
// of the same element count, losses F32 [B].
static void float_target_contract(const Check& c, const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                                  const Tensor& targets) {
  const DType dt = c.compute(logits, "logits");
  const Mat m = as_matrix(logits);
  c.sized(losses, F32, static_cast<size_t>(m.rows), "losses");
  c.sized(targets, F32, logits.numel(), "targets");
  c.optional(dlogits, dt, logits.numel(), "dlogits");
}
void Backend::mse_loss(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                       float grad_scale) {
  float_target_contract(Check(*this, "mse_loss"), losses, dlogits, logits, targets);
  observed("mse_loss", [&] { return float_target_loss_cost(logits); },
           [&] { mse_loss_impl(losses, dlogits, logits, targets, grad_scale); });
}
void Backend::bce_with_logits(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& targets, float grad_scale) {
  float_target_contract(Check(*this, "bce_with_logits"), losses, dlogits, logits, targets);
  observed("bce_with_logits", [&] { return float_target_loss_cost(logits); },
           [&] { bce_with_logits_impl(losses, dlogits, logits, targets, grad_scale); });
}

// ---- element-wise --------------------------------------------------------------------------------
void Backend::gelu_forward(const Tensor& y, const Tensor& x) {
  elementwise(Check(*this, "gelu_forward"), y, x);
  observed("gelu", [&] { return elementwise_cost(y, 8, 1, 1); }, [&] { gelu_forward_impl(y, x); });
}
void Backend::gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias) {
  const Check c(*this, "gelu_backward");
  elementwise(c, dx, dy, &x);
  if (dbias.defined()) c.sized(dbias, F32, static_cast<size_t>(as_matrix(dx).cols), "dbias");
  observed("gelu", [&] { return elementwise_cost(dx, 12, 2, 1); }, [&] { gelu_backward_impl(dx, dy, x, dbias); });
}
// x [R, 2I]; y [R, I] of x's dtype.
void geglu(const Check& c, const Tensor& y, const Tensor& x) {
  const DType dt = c.compute(x, "x");
  const Mat mx = as_matrix(x), my = as_matrix(y);
  c.holds(mx.cols % 2 == 0 && my.rows == mx.rows && my.cols * 2 == mx.cols,
          [&] { return str_cat("x ", x.shape.str(), " is not [R, 2I] for y ", y.shape.str()); });
  c.sized(y, dt, y.numel(), "y");
}
void Backend::geglu_forward(const Tensor& y, const Tensor& x) {
  geglu(Check(*this, "geglu_forward"), y, x);
  observed("geglu", [&] { return elementwise_cost(y, 10, 2, 1); }, [&] { geglu_forward_impl(y, x); });
}
void Backend::geglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const Check c(*this, "geglu_backward");
  geglu(c, dy, x);
  c.sized(dx, x.dtype, x.numel(), "dx");
  observed("geglu", [&] { return elementwise_cost(dy, 16, 3, 2); }, [&] { geglu_backward_impl(dx, dy, x); });
}
void Backend::tanh_forward(const Tensor& y, const Tensor& x) {
  elementwise(Check(*this, "tanh_forward"), y, x);
  observed("tanh", [&] { return elementwise_cost(y, 4, 1, 1); }, [&] { tanh_forward_impl(y, x); });
}
void Backend::tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  elementwise(Check(*this, "tanh_backward"), dx, dy, &y);
  observed("tanh", [&] { return elementwise_cost(dx, 3, 2, 1); }, [&] { tanh_backward_impl(dx, dy, y); });
}
void Backend::relu_forward(const Tensor& y, const Tensor& x) {
  elementwise(Check(*this, "relu_forward"), y, x);
  observed("relu", [&] { return elementwise_cost(y, 1, 1, 1); }, [&] { relu_forward_impl(y, x); });
}
void Backend::relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) {
  elementwise(Check(*this, "relu_backward"), dx, dy, &y);
  observed("relu", [&] { return elementwise_cost(dx, 1, 2, 1); }, [&] { relu_backward_impl(dx, dy, y); });
}
void Backend::dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) {
  const Check c(*this, "dropout_forward");
  elementwise(c, y, x);
  c.dropout(d);
  observed("dropout", [&] { return elementwise_cost(y, 2, 1, 1); }, [&] { dropout_forward_impl(y, x, d); });
}
void Backend::dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) {
  const Check c(*this, "dropout_backward");
  elementwise(c, dx, dy);
  c.dropout(d);
  observed("dropout", [&] { return elementwise_cost(dx, 2, 1, 1); }, [&] { dropout_backward_impl(dx, dy, d); });
}
void Backend::add(const Tensor& y, const Tensor& a, const Tensor& b) {
  elementwise(Check(*this, "add"), y, a, &b);
  observed("add", [&] { return elementwise_cost(y, 1, 2, 1); }, [&] { add_impl(y, a, b); });
}
void Backend::embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                                const Tensor& pos, const Tensor& type) {
  const Check c(*this, "embedding_forward");
  const DType dt = c.compute(e, "e");
  // The tables are F32 (the master weights: one rounding, of the sum) or of e's dtype.
  const DType tables = word.defined() && word.dtype == F32 ? F32 : dt;
  embedding(c, e, ids, type_ids, {{&word, "word"}, {&pos, "pos"}, {&type, "type"}}, tables, true);
  observed("embedding", [&] { return elementwise_cost(e, 2, 3, 1); },
           [&] { embedding_forward_impl(e, ids, type_ids, word, pos, type); });
}
void Backend::embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                                 const Tensor& ids, const Tensor& type_ids) {
  const Check c(*this, "embedding_backward");
  c.compute(de, "de");
  embedding(c, de, ids, type_ids, {{&dword, "dword"}, {&dpos, "dpos"}, {&dtype, "dtype"}}, F32, false);
  observed("embedding", [&] { return elementwise_cost(de, 3, 4, 3); },
           [&] { embedding_backward_impl(dword, dpos, dtype, de, ids, type_ids); });
}
void Backend::select_token(const Tensor& out, const Tensor& x, int64_t t) {
  select(Check(*this, "select_token"), x, out, t);
  observed("select_token", [&] { return elementwise_cost(out, 0, 1, 1); }, [&] { select_token_impl(out, x, t); });
}
void Backend::select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) {
  select(Check(*this, "select_token_backward"), dx, dout, t);
  observed("select_token", [&] { return elementwise_cost(dx, 0, 0, 1); },
           [&] { select_token_backward_impl(dx, dout, t); });
}
// x [B, T, H]; out [B, H] of x's dtype; mask I32 [B, T] when given. Backward names them dx, dout.
static void masked_mean(const Check& c, const Tensor& x, const Tensor& out, const Tensor& mask, bool backward) {
  const char* xn = backward ? "dx" : "x";
  const DType dt = c.compute(x, xn);
  c.holds(x.shape.rank == 3, [&] { return str_cat(xn, " ", x.shape.str(), " is not [B, T, H]"); });
  c.sized(out, dt, static_cast<size_t>(x.dim(0) * x.dim(2)), backward ? "dout" : "out");
  c.optional(mask, I32, static_cast<size_t>(x.dim(0) * x.dim(1)), "mask");
}
// Read x (or write dx) once, the mask once, write out (or read dout) once; one add or divide
// per element of x.
static OpCost masked_mean_cost(const Tensor& x, const Tensor& out, const Tensor& mask) {
  const size_t bytes = x.bytes() + out.bytes() + (mask.defined() ? mask.bytes() : 0);
  return OpCost{static_cast<double>(x.numel()), static_cast<double>(bytes), OpClass::Elementwise};
}
void Backend::masked_mean_forward(const Tensor& out, const Tensor& x, const Tensor& mask) {
  masked_mean(Check(*this, "masked_mean_forward"), x, out, mask, false);
  observed("masked_mean", [&] { return masked_mean_cost(x, out, mask); },
           [&] { masked_mean_forward_impl(out, x, mask); });
}
void Backend::masked_mean_backward(const Tensor& dx, const Tensor& dout, const Tensor& mask) {
  masked_mean(Check(*this, "masked_mean_backward"), dx, dout, mask, true);
  observed("masked_mean", [&] { return masked_mean_cost(dx, dout, mask); },
           [&] { masked_mean_backward_impl(dx, dout, mask); });
}
void Backend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  row_copy(Check(*this, "gather_rows"), out, in, idx, true);
  observed("gather_rows", [&] { return elementwise_cost(out, 0, 1, 1); }, [&] { gather_rows_impl(out, in, idx); });
}
void Backend::scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) {
  row_copy(Check(*this, "scatter_rows"), out, in, idx, false);
  observed("scatter_rows", [&] { return elementwise_cost(in, 0, 1, 1); }, [&] { scatter_rows_impl(out, in, idx); });
}

// ---- optimizer -----------------------------------------------------------------------------------
void Backend::block_sum_squares(const Tensor& partials, const Tensor& x) {
  const Check c(*this, "block_sum_squares");
  c.dtype(x, F32, "x");
  c.sized(partials, F32, (x.numel() + kNormBlock - 1) / kNormBlock, "partials");
  observed("grad_norm", [&] { return elementwise_cost(x, 2, 1, 0, OpClass::Optimizer); },
           [&] { block_sum_squares_impl(partials, x); });
}
void Backend::sum_blocks(const Tensor& out, const Tensor& partials) {
  const Check c(*this, "sum_blocks");
  c.sized(out, F32, 1, "out");
  c.dtype(partials, F32, "partials");
  observed("grad_norm", [&] { return elementwise_cost(partials, 1, 1, 0, OpClass::Optimizer); },
           [&] { sum_blocks_impl(out, partials); });
}
void Backend::adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                           const Tensor& grads, const GradTransform& g, const AdamWArgs& a) {
  const Check c(*this, "adamw_update");
  const size_t n = update(c, params, grads, half_copy, g);
  c.sized(m, F32, n, "m");
  c.sized(v, F32, n, "v");
  observed("adamw_update",
           [&] {
             OpCost k = elementwise_cost(params, 14, 4, 3, OpClass::Optimizer);
             k.bytes += static_cast<double>(half_copy.bytes());
             return k;
           },
           [&] { adamw_update_impl(params, m, v, half_copy, grads, g, a); });
}
void Backend::sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                         const GradTransform& g, const SgdArgs& a) {
  const Check c(*this, "sgd_update");
  const size_t n = update(c, params, grads, half_copy, g);
  if (a.momentum != 0.0f) c.sized(momentum, F32, n, "momentum");
  observed("sgd_update",
           [&] {
             OpCost k = elementwise_cost(params, 6, 3, 2, OpClass::Optimizer);
             k.bytes += static_cast<double>(half_copy.bytes());
             return k;
           },
           [&] { sgd_update_impl(params, momentum, half_copy, grads, g, a); });
}
void Backend::adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                               const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                               const Tensor& grads, const Tensor& qmap, const GradTransform& g, const AdamWArgs& a) {
  const Check c(*this, "adamw8bit_update");
  const size_t n = update(c, params, grads, half_copy, g), blocks = (n + kQuantBlock - 1) / kQuantBlock;
  c.sized(m_codes, DType::U8, n, "m_codes");
  c.sized(v_codes, DType::U8, n, "v_codes");
  c.sized(m_absmax, F32, blocks, "m_absmax");
  c.sized(v_absmax, F32, blocks, "v_absmax");
  c.sized(qmap, F32, 512, "qmap");
  observed("adamw8bit_update", [&] { return adamw8bit_cost(params, half_copy); },
           [&] { adamw8bit_update_impl(params, m_codes, v_codes, m_absmax, v_absmax, half_copy, grads, qmap, g, a); });
}
void Backend::adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch,
                               const Tensor& half_copy, const Tensor& grads, const AdafactorTable& table,
                               const GradTransform& g, const AdafactorArgs& a) {
  const Check c(*this, "adafactor_update");
  update(c, params, grads, half_copy, g);
  c.dtype(state, F32, "state");
  c.dtype(scratch, F32, "scratch");
  c.sized(table.segments, DType::I64, static_cast<size_t>(table.count * kAdafactorSegmentFields), "segments");
  observed("adafactor_update", [&] { return adafactor_cost(params, state, half_copy); },
           [&] { adafactor_update_impl(params, state, scratch, half_copy, grads, table, g, a); });
}

}  // namespace anatomy
