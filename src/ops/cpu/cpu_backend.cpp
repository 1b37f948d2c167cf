// The CPU backend: fp32 activations and parameters, I32 ids/labels/masks. Each entry point
// checks devices, dtypes and shapes, then calls the float instantiation of ops/cpu/reference.h.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "ops/backend.h"
#include "ops/cpu/convert.h"
#include "ops/cpu/reference.h"
#include "ops/optim_math.h"

namespace anatomy {

namespace {

// Every tensor an op touches must be a defined host tensor of the expected dtype.
void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  ANATOMY_CHECK(t.defined(), op, ": ", what, " is undefined");
  ANATOMY_CHECK(t.device == Device::CPU, op, ": ", what, " is on ", device_name(t.device),
                "; the CPU backend needs host tensors");
  ANATOMY_CHECK(t.dtype == dt, op, ": ", what, " is ", dtype_name(t.dtype),
                "; the CPU backend computes in ", dtype_name(dt), " (ids, labels, masks in I32)");
}
void expect(const Tensor& t, DType dt, size_t numel, const char* op, const char* what) {
  expect(t, dt, op, what);
  ANATOMY_CHECK(t.numel() == numel, op, ": ", what, " ", t.shape.str(), " has ", t.numel(),
                " elements, expected ", numel);
}
void expect_host(const Tensor& t, const char* op, const char* what) {
  ANATOMY_CHECK(t.defined() && t.device == Device::CPU, op, ": ", what,
                " must be a defined host tensor");
}
// Optional tensors: nullptr when undefined, else checked like expect().
float* opt(const Tensor& t, size_t numel, const char* op, const char* what) {
  if (!t.defined()) return nullptr;
  expect(t, DType::F32, numel, op, what);
  return t.ptr<float>();
}
float* f32(const Tensor& t) { return t.ptr<float>(); }
const int32_t* i32(const Tensor& t) { return t.ptr<int32_t>(); }

constexpr DType F32 = DType::F32;
constexpr DType I32 = DType::I32;

// Rows x cols of a tensor seen as a matrix over its last dimension.
struct Mat {
  int64_t rows, cols;
};
Mat as_matrix(const Tensor& t) {
  const int64_t cols = t.shape.rank ? t.dim(-1) : 1;
  return {cols ? static_cast<int64_t>(t.numel()) / cols : 0, cols};
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : m_threads(threads) {
    if (threads > 0) {
      omp_set_num_threads(threads);
      openblas_set_num_threads(threads);
    }
  }
  Device device() const override { return Device::CPU; }
  Allocator& allocator() override { return m_alloc; }
  std::string name() const override {
    return str_cat("cpu (", m_threads > 0 ? m_threads : omp_get_max_threads(), " threads)");
  }
  void synchronize() override {}

  // ---- data movement -----------------------------------------------------------------
  void upload(const Tensor& dst, const void* host) override {
    expect_host(dst, "upload", "dst");
    std::memcpy(dst.data, host, dst.bytes());
  }
  void download(void* host, const Tensor& src) override {
    expect_host(src, "download", "src");
    std::memcpy(host, src.data, src.bytes());
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    expect_host(dst, "copy", "dst");
    expect_host(src, "copy", "src");
    ANATOMY_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy: dst ",
                  dtype_name(dst.dtype), dst.shape.str(), " and src ", dtype_name(src.dtype),
                  src.shape.str(), " differ in dtype or size");
    std::memmove(dst.data, src.data, src.bytes());
  }
  void cast(const Tensor& dst, const Tensor& src) override {
    expect_host(dst, "cast", "dst");
    expect_host(src, "cast", "src");
    cpu::cast(dst, src);
  }
  void fill(const Tensor& dst, float value) override {
    expect_host(dst, "fill", "dst");
    cpu::fill(dst, value);
  }

  // ---- tensor contractions -----------------------------------------------------------
  void matmul(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
              const MatmulArgs& args) override {
    expect(c, F32, "matmul", "C");
    expect(a, F32, "matmul", "A");
    expect(b, F32, "matmul", "B");
    const Mat mc = as_matrix(c), ma = as_matrix(a), mb = as_matrix(b);
    const int64_t m = mc.rows, n = mc.cols;
    const int64_t k = ta == Trans::N ? ma.cols : ma.rows;
    const bool ok = (ta == Trans::N ? ma.rows : ma.cols) == m &&
                    (tb == Trans::N ? mb.cols : mb.rows) == n &&
                    (tb == Trans::N ? mb.rows : mb.cols) == k;
    ANATOMY_CHECK(ok, "matmul: shapes do not agree: C ", c.shape.str(), ", A ", a.shape.str(),
                  ta == Trans::T ? "^T" : "", ", B ", b.shape.str(), tb == Trans::T ? "^T" : "");
    const float* bias = nullptr;
    float* gelu_in = nullptr;
    if (args.epilogue != Epilogue::None) {
      expect(args.bias, F32, static_cast<size_t>(n), "matmul", "bias");
      bias = f32(args.bias);
    }
    if (args.epilogue == Epilogue::BiasGelu) {
      expect(args.gelu_in, F32, c.numel(), "matmul", "gelu_in");
      gelu_in = f32(args.gelu_in);
    }
    ref::matmul(f32(c), f32(a), ta, f32(b), tb, m, n, k, args.alpha, args.beta, args.epilogue, bias,
                gelu_in);
  }
  void bias_grad(const Tensor& db, const Tensor& dy) override {
    expect(dy, F32, "bias_grad", "dy");
    const Mat md = as_matrix(dy);
    expect(db, F32, static_cast<size_t>(md.cols), "bias_grad", "db");
    ref::bias_grad(f32(db), f32(dy), md.rows, md.cols);
  }

  // ---- attention ---------------------------------------------------------------------
  struct AttnDims {
    int64_t b, t, h;
  };
  AttnDims attention_dims(const Tensor& qkv, const Tensor& ctx, const Tensor& lse,
                          const Tensor& mask, int heads, const char* op) {
    expect(qkv, F32, op, "qkv");
    ANATOMY_CHECK(qkv.shape.rank == 3 && qkv.dim(2) % 3 == 0, op, ": qkv ", qkv.shape.str(),
                  " is not [B, T, 3H]");
    const AttnDims d{qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3};
    ANATOMY_CHECK(heads > 0 && d.h % heads == 0, op, ": hidden ", d.h,
                  " is not divisible by heads ", heads);
    expect(ctx, F32, static_cast<size_t>(d.b * d.t * d.h), op, "ctx");
    expect(lse, F32, static_cast<size_t>(d.b * heads * d.t), op, "lse");
    if (mask.defined()) expect(mask, I32, static_cast<size_t>(d.b * d.t), op, "mask");
    return d;
  }
  void attention_forward(const Tensor& ctx, const Tensor& lse, const Tensor& qkv,
                         const Tensor& mask, int heads, const DropoutSpec& dropout) override {
    const AttnDims d = attention_dims(qkv, ctx, lse, mask, heads, "attention_forward");
    ref::attention_forward(f32(ctx), f32(lse), f32(qkv), mask.defined() ? i32(mask) : nullptr, d.b,
                           d.t, d.h, heads, dropout);
  }
  void attention_backward(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv,
                          const Tensor& ctx, const Tensor& lse, const Tensor& mask, int heads,
                          const DropoutSpec& dropout) override {
    const AttnDims d = attention_dims(qkv, ctx, lse, mask, heads, "attention_backward");
    expect(dqkv, F32, qkv.numel(), "attention_backward", "dqkv");
    expect(dctx, F32, ctx.numel(), "attention_backward", "dctx");
    ref::attention_backward(f32(dqkv), f32(dctx), f32(qkv), f32(ctx), f32(lse),
                            mask.defined() ? i32(mask) : nullptr, d.b, d.t, d.h, heads, dropout);
  }

  // ---- statistical normalizations ----------------------------------------------------
  void layernorm_forward(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                         const Tensor& branch, const Tensor& residual, const Tensor& gamma,
                         const Tensor& beta, float eps,
                         const DropoutSpec& branch_dropout) override {
    const char* op = "layernorm_forward";
    expect(y, F32, op, "y");
    const Mat m = as_matrix(y);
    const size_t n = y.numel(), rows = static_cast<size_t>(m.rows), h = static_cast<size_t>(m.cols);
    expect(branch, F32, n, op, "branch");
    expect(mean, F32, rows, op, "mean");
    expect(rstd, F32, rows, op, "rstd");
    expect(gamma, F32, h, op, "gamma");
    expect(beta, F32, h, op, "beta");
    ref::layernorm_forward(f32(y), opt(sum, n, op, "sum"), f32(mean), f32(rstd), f32(branch),
                           opt(residual, n, op, "residual"), f32(gamma), f32(beta), m.rows, m.cols,
                           eps, branch_dropout);
  }
  void layernorm_backward(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma,
                          const Tensor& dbeta, const Tensor& dy, const Tensor& y, const Tensor& rstd,
                          const Tensor& gamma, const Tensor& beta,
                          const DropoutSpec& branch_dropout) override {
    const char* op = "layernorm_backward";
    expect(dy, F32, op, "dy");
    const Mat m = as_matrix(dy);
    const size_t n = dy.numel(), rows = static_cast<size_t>(m.rows),
                 h = static_cast<size_t>(m.cols);
    expect(dsum, F32, n, op, "dsum");
    expect(y, F32, n, op, "y");
    expect(rstd, F32, rows, op, "rstd");
    expect(gamma, F32, h, op, "gamma");
    expect(beta, F32, h, op, "beta");
    ref::layernorm_backward(f32(dsum), opt(dbranch, n, op, "dbranch"), opt(dgamma, h, op, "dgamma"),
                            opt(dbeta, h, op, "dbeta"), f32(dy), f32(y), f32(rstd), f32(gamma),
                            f32(beta), m.rows, m.cols, branch_dropout);
  }
  void cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                     const Tensor& labels, float grad_scale) override {
    const char* op = "cross_entropy";
    expect(logits, F32, op, "logits");
    const Mat m = as_matrix(logits);
    expect(losses, F32, static_cast<size_t>(m.rows), op, "losses");
    expect(labels, I32, static_cast<size_t>(m.rows), op, "labels");
    ref::cross_entropy(f32(losses), opt(dlogits, logits.numel(), op, "dlogits"), f32(logits),
                       i32(labels), m.rows, m.cols, grad_scale);
  }

  // ---- element-wise ------------------------------------------------------------------
  void gelu_forward(const Tensor& y, const Tensor& x) override {
    unary("gelu_forward", y, x);
    ref::gelu_forward(f32(y), f32(x), x.numel());
  }
  void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) override {
    binary("gelu_backward", dx, dy, x);
    ref::gelu_backward(f32(dx), f32(dy), f32(x), x.numel());
  }
  void tanh_forward(const Tensor& y, const Tensor& x) override {
    unary("tanh_forward", y, x);
    ref::tanh_forward(f32(y), f32(x), x.numel());
  }
  void tanh_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    binary("tanh_backward", dx, dy, y);
    ref::tanh_backward(f32(dx), f32(dy), f32(y), y.numel());
  }
  void relu_forward(const Tensor& y, const Tensor& x) override {
    unary("relu_forward", y, x);
    ref::relu_forward(f32(y), f32(x), x.numel());
  }
  void relu_backward(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    binary("relu_backward", dx, dy, y);
    ref::relu_backward(f32(dx), f32(dy), f32(y), y.numel());
  }
  void dropout_forward(const Tensor& y, const Tensor& x, const DropoutSpec& d) override {
    unary("dropout_forward", y, x);
    ref::dropout_forward(f32(y), f32(x), x.numel(), d);
  }
  void dropout_backward(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) override {
    unary("dropout_backward", dx, dy);
    ref::dropout_backward(f32(dx), f32(dy), dy.numel(), d);
  }
  void add(const Tensor& y, const Tensor& a, const Tensor& b) override {
    binary("add", y, a, b);
    ref::add(f32(y), f32(a), f32(b), y.numel());
  }
  void embedding_forward(const Tensor& e, const Tensor& ids, const Tensor& type_ids,
                         const Tensor& word, const Tensor& pos, const Tensor& type) override {
    const char* op = "embedding_forward";
    const EmbDims d = embedding_dims(op, ids, type_ids, word, pos, type);
    expect(e, F32, static_cast<size_t>(d.b * d.t * d.h), op, "e");
    ref::embedding_forward(f32(e), i32(ids), type_ids.defined() ? i32(type_ids) : nullptr,
                           f32(word), f32(pos), f32(type), d.b, d.t, d.h, d.vocab, d.max_pos,
                           d.type_vocab);
  }
  void embedding_backward(const Tensor& dword, const Tensor& dpos, const Tensor& dtype,
                          const Tensor& de, const Tensor& ids, const Tensor& type_ids) override {
    const char* op = "embedding_backward";
    const EmbDims d = embedding_dims(op, ids, type_ids, dword, dpos, dtype);
    expect(de, F32, static_cast<size_t>(d.b * d.t * d.h), op, "de");
    ref::embedding_backward(f32(dword), f32(dpos), f32(dtype), f32(de), i32(ids),
                            type_ids.defined() ? i32(type_ids) : nullptr, d.b, d.t, d.h, d.vocab,
                            d.max_pos, d.type_vocab);
  }
  void select_token(const Tensor& out, const Tensor& x, int64_t t) override {
    const Sel s = select_dims("select_token", x, out, t);
    ref::select_token(f32(out), f32(x), s.b, s.t, s.h, t);
  }
  void select_token_backward(const Tensor& dx, const Tensor& dout, int64_t t) override {
    const Sel s = select_dims("select_token_backward", dx, dout, t);
    ref::select_token_backward(f32(dx), f32(dout), s.b, s.t, s.h, t);
  }

  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& idx) override {
    const RowCopy r = row_copy_dims("gather_rows", out, in, idx, true);
    ref::gather_rows(out.data, in.data, i32(idx), r.n, r.row_bytes);
  }
  void scatter_rows(const Tensor& out, const Tensor& in, const Tensor& idx) override {
    const RowCopy r = row_copy_dims("scatter_rows", out, in, idx, false);
    ref::scatter_rows(out.data, in.data, i32(idx), r.n, r.row_bytes);
  }

  // ---- optimizer ---------------------------------------------------------------------
  void block_sum_squares(const Tensor& partials, const Tensor& x) override {
    expect(x, F32, "block_sum_squares", "x");
    expect(partials, F32, (x.numel() + kNormBlock - 1) / kNormBlock, "block_sum_squares", "partials");
    ref::block_sum_squares(f32(partials), f32(x), x.numel(), kNormBlock);
  }
  void sum_blocks(const Tensor& out, const Tensor& partials) override {
    expect(out, F32, 1, "sum_blocks", "out");
    expect(partials, F32, "sum_blocks", "partials");
    ref::sum_blocks(f32(out), f32(partials), partials.numel());
  }
  void adamw_update(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                    const Tensor& grads, const GradTransform& g, const AdamWArgs& a) override {
    const char* op = "adamw_update";
    expect(params, F32, op, "params");
    const size_t n = params.numel();
    expect(m, F32, n, op, "m");
    expect(v, F32, n, op, "v");
    expect(grads, F32, n, op, "grads");
    if (skip_step(g, op)) return;
    ref::adamw_update(f32(params), f32(m), f32(v), f32(grads), n, factor(g, op), a);
    write_half(half_copy, params, op);
  }
  void sgd_update(const Tensor& params, const Tensor& momentum, const Tensor& half_copy,
                  const Tensor& grads, const GradTransform& g, const SgdArgs& a) override {
    const char* op = "sgd_update";
    expect(params, F32, op, "params");
    const size_t n = params.numel();
    expect(grads, F32, n, op, "grads");
    float* buf =
        a.momentum != 0.0f ? (expect(momentum, F32, n, op, "momentum"), f32(momentum)) : nullptr;
    if (skip_step(g, op)) return;
    ref::sgd_update(f32(params), buf, f32(grads), n, factor(g, op), a);
    write_half(half_copy, params, op);
  }
  void adamw8bit_update(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes, const Tensor& m_absmax,
                        const Tensor& v_absmax, const Tensor& half_copy, const Tensor& grads, const Tensor& qmap,
                        const GradTransform& g, const AdamWArgs& a) override {
    const char* op = "adamw8bit_update";
    expect(params, F32, op, "params");
    const size_t n = params.numel(), blocks = (n + kQuantBlock - 1) / kQuantBlock;
    expect(m_codes, DType::U8, n, op, "m_codes");
    expect(v_codes, DType::U8, n, op, "v_codes");
    expect(m_absmax, F32, blocks, op, "m_absmax");
    expect(v_absmax, F32, blocks, op, "v_absmax");
    expect(qmap, F32, 512, op, "qmap");
    expect(grads, F32, n, op, "grads");
    if (skip_step(g, op)) return;
    // The factor in float, as the CUDA kernel computes it (ops/optim_math.h).
    float norm_sq = 0.0f;
    if (g.max_norm > 0) {
      expect(g.norm_sq, F32, 1, op, "norm_sq (clipping is on)");
      norm_sq = f32(g.norm_sq)[0];
    }
    const float f = om::grad_factor(norm_sq, g.max_norm > 0, g.inv_loss_scale, g.max_norm);
    ref::adamw8bit_update<float>(f32(params), m_codes.ptr<uint8_t>(), v_codes.ptr<uint8_t>(), f32(m_absmax),
                                 f32(v_absmax), f32(grads), f32(qmap), n, f, a);
    write_half(half_copy, params, op);
  }
  void adafactor_update(const Tensor& params, const Tensor& state, const Tensor& scratch, const Tensor& half_copy,
                        const Tensor& grads, const AdafactorTable& table, const GradTransform& g,
                        const AdafactorArgs& a) override {
    const char* op = "adafactor_update";
    expect(params, F32, op, "params");
    const size_t n = params.numel();
    expect(grads, F32, n, op, "grads");
    expect(state, F32, op, "state");
    expect(scratch, F32, op, "scratch");
    expect(table.segments, DType::I64, static_cast<size_t>(table.count * kAdafactorSegmentFields), op, "segments");
    const auto* segs = table.segments.ptr<const AdafactorSegment>();
    for (int64_t s = 0; s < table.count; ++s) {
      const AdafactorSegment& sg = segs[s];
      const int64_t numel = sg.rows * sg.cols;
      ANATOMY_CHECK(sg.rows > 0 && sg.cols > 0 && sg.offset >= 0 && static_cast<size_t>(sg.offset + numel) <= n &&
                        sg.row_state >= 0 &&
                        static_cast<size_t>(sg.row_state + (sg.factored ? sg.rows : numel)) <= state.numel() &&
                        (!sg.factored || (sg.col_state >= 0 && static_cast<size_t>(sg.col_state + sg.cols) <= state.numel())),
                    op, ": segment ", s, " is out of range of params ", params.shape.str(), " or state ", state.shape.str());
    }
    if (skip_step(g, op)) return;
    ref::adafactor_update(f32(params), f32(state), f32(grads), segs, static_cast<size_t>(table.count), factor(g, op), a);
    write_half(half_copy, params, op);
  }

 private:
  static void unary(const char* op, const Tensor& y, const Tensor& x) {
    expect(x, F32, op, "input");
    expect(y, F32, x.numel(), op, "output");
  }
  static void binary(const char* op, const Tensor& y, const Tensor& a, const Tensor& b) {
    unary(op, y, a);
    expect(b, F32, a.numel(), op, "second input");
  }
  struct EmbDims {
    int64_t b, t, h, vocab, max_pos, type_vocab;
  };
  static EmbDims embedding_dims(const char* op, const Tensor& ids, const Tensor& type_ids,
                                const Tensor& word, const Tensor& pos, const Tensor& type) {
    expect(ids, I32, op, "ids");
    ANATOMY_CHECK(ids.shape.rank == 2, op, ": ids ", ids.shape.str(), " is not [B, T]");
    if (type_ids.defined()) expect(type_ids, I32, ids.numel(), op, "type_ids");
    for (const Tensor* t : {&word, &pos, &type}) {
      expect(*t, F32, op, "embedding table");
      ANATOMY_CHECK(t->shape.rank == 2 && t->dim(1) == word.dim(-1), op, ": table ", t->shape.str(),
                    " does not match word ", word.shape.str());
    }
    return {ids.dim(0), ids.dim(1), word.dim(1), word.dim(0), pos.dim(0), type.dim(0)};
  }
  struct Sel {
    int64_t b, t, h;
  };
  static Sel select_dims(const char* op, const Tensor& x, const Tensor& out, int64_t t) {
    expect(x, F32, op, "x");
    ANATOMY_CHECK(x.shape.rank == 3 && t >= 0 && t < x.dim(1), op, ": x ", x.shape.str(),
                  " is not [B, T, H] with token ", t, " < T");
    const Sel s{x.dim(0), x.dim(1), x.dim(2)};
    expect(out, F32, static_cast<size_t>(s.b * s.h), op, "out");
    return s;
  }
  struct RowCopy {
    int64_t n;
    size_t row_bytes;
  };
  // packed [N, C] and padded [R, C] of one dtype, idx I32 [N] with every value in [0, R).
  static RowCopy row_copy_dims(const char* op, const Tensor& out, const Tensor& in, const Tensor& idx, bool gather) {
    expect_host(out, op, "out");
    expect_host(in, op, "in");
    const Tensor& packed = gather ? out : in;
    const Tensor& padded = gather ? in : out;
    const Mat p = as_matrix(packed), q = as_matrix(padded);
    ANATOMY_CHECK(out.dtype == in.dtype && p.cols == q.cols, op, ": out ", dtype_name(out.dtype), out.shape.str(),
                  " and in ", dtype_name(in.dtype), in.shape.str(), " differ in dtype or row width");
    expect(idx, I32, static_cast<size_t>(p.rows), op, "idx");
    const int32_t* ix = i32(idx);
    for (int64_t i = 0; i < p.rows; ++i)
      ANATOMY_CHECK(ix[i] >= 0 && ix[i] < q.rows, op, ": idx[", i, "] = ", ix[i], " is outside the ", q.rows,
                    " rows of ", gather ? "in" : "out");
    return {p.rows, static_cast<size_t>(p.cols) * dtype_size(out.dtype)};
  }
  // GradTransform::skip_nonfinite: true when the update must leave everything untouched.
  static bool skip_step(const GradTransform& g, const char* op) {
    if (!g.skip_nonfinite) return false;
    expect(g.norm_sq, F32, 1, op, "norm_sq (skip_nonfinite is on)");
    return !std::isfinite(f32(g.norm_sq)[0]);
  }
  static double factor(const GradTransform& g, const char* op) {
    double norm_sq = 0;
    if (g.max_norm > 0) {
      expect(g.norm_sq, F32, 1, op, "norm_sq (clipping is on)");
      norm_sq = f32(g.norm_sq)[0];
    }
    return ref::grad_factor(norm_sq, g.inv_loss_scale, g.max_norm);
  }
  static void write_half(const Tensor& half_copy, const Tensor& params, const char* op) {
    if (!half_copy.defined()) return;
    expect_host(half_copy, op, "half_copy");
    ANATOMY_CHECK(half_copy.numel() == params.numel(), op, ": half_copy ", half_copy.shape.str(),
                  " does not match params ", params.shape.str());
    cpu::cast(half_copy, params);
  }

  CpuAllocator m_alloc;
  int m_threads;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace anatomy
