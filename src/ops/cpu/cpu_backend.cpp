// The CPU backend: fp32 activations and parameters, I32 ids/labels/masks. The contract
// (ops/contract.cpp) has checked devices, dtypes and shapes before any *_impl runs; each calls
// the float instantiation of ops/cpu/reference.h.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/backend.h"
#include "ops/cpu/convert.h"
#include "ops/cpu/reference.h"
#include "ops/optim_math.h"

namespace anatomy {

namespace {

float* f32(const Tensor& t) { return t.ptr<float>(); }
float* opt(const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; }
const int32_t* i32(const Tensor& t) { return t.defined() ? t.ptr<int32_t>() : nullptr; }

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
  bool computes_in(DType dt) const override { return dt == DType::F32; }

 protected:
  // ---- data movement -----------------------------------------------------------------
  void upload_impl(const Tensor& dst, const void* host) override { std::memcpy(dst.data, host, dst.bytes()); }
  void download_impl(void* host, const Tensor& src) override { std::memcpy(host, src.data, src.bytes()); }
  void copy_impl(const Tensor& dst, const Tensor& src) override { std::memmove(dst.data, src.data, src.bytes()); }
  void cast_impl(const Tensor& dst, const Tensor& src) override { cpu::cast(dst, src); }
  void fill_impl(const Tensor& dst, float value) override { cpu::fill(dst, value); }

  // ---- tensor contractions -----------------------------------------------------------
  void matmul_impl(const Tensor& c, const Tensor& a, Trans ta, const Tensor& b, Trans tb,
                   const MatmulArgs& args) override {
    const Mat mc = as_matrix(c), ma = as_matrix(a);
    const int64_t k = ta == Trans::N ? ma.cols : ma.rows;
    // fp8: the GEMM multiplies the operands' fp8 values (Note [fp8 training]); the bias gradient
    // still sums the unquantized dY, as the GPU's does.
    std::vector<float> qa, qb;
    const float *pa = f32(a), *pb = f32(b);
    if (args.fp8_a.defined()) {
      qa.resize(a.numel());
      qb.resize(b.numel());
      ref::fp8_quantize(qa.data(), pa, static_cast<int64_t>(a.numel()), f32(args.fp8_a.meta), args.fp8_a.format);
      ref::fp8_quantize(qb.data(), pb, static_cast<int64_t>(b.numel()), f32(args.fp8_b.meta), args.fp8_b.format);
      pa = qa.data();
      pb = qb.data();
    }
    if (args.epilogue == Epilogue::BiasGrad) {  // the GEMM, then bias_grad(bias, A) (Note [fused bias gradient])
      ref::matmul(f32(c), pa, ta, pb, tb, mc.rows, mc.cols, k, args.alpha, args.beta, Epilogue::None,
                  static_cast<const float*>(nullptr), static_cast<float*>(nullptr));
      float* db = f32(args.bias);
      if (args.beta == 0.0f) std::fill(db, db + args.bias.numel(), 0.0f);
      ref::bias_grad(db, f32(a), ma.rows, ma.cols);
      return;
    }
    const float* bias = args.epilogue != Epilogue::None ? f32(args.bias) : nullptr;
    float* gelu_in = args.epilogue == Epilogue::BiasGelu ? f32(args.gelu_in) : nullptr;
    ref::matmul(f32(c), pa, ta, pb, tb, mc.rows, mc.cols, k, args.alpha, args.beta, args.epilogue, bias, gelu_in);
  }
  void fp8_scale_update_impl(const Tensor& meta) override { ref::fp8_scale_update(f32(meta), meta.dim(0)); }
  void bias_grad_impl(const Tensor& db, const Tensor& dy) override {
    const Mat md = as_matrix(dy);
    ref::bias_grad(f32(db), f32(dy), md.rows, md.cols);
  }

  // ---- attention ---------------------------------------------------------------------
  void attention_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& mask, int heads,
                              const DropoutSpec& dropout, AttentionScope scope) override {
    ref::attention_forward(f32(ctx), f32(lse), f32(qkv), i32(mask), qkv.dim(0), qkv.dim(1), qkv.dim(2) / 3, heads,
                           dropout, scope.window, scope.queries);
  }
  void attention_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor& ctx,
                               const Tensor& lse, const Tensor& mask, int heads, const DropoutSpec& dropout,
                               AttentionScope scope, const Tensor& dbias) override {
    ref::attention_backward(f32(dqkv), f32(dctx), f32(qkv), f32(ctx), f32(lse), i32(mask), qkv.dim(0), qkv.dim(1),
                            qkv.dim(2) / 3, heads, dropout, scope.window, scope.queries);
    if (dbias.defined()) ref::bias_grad(f32(dbias), f32(dqkv), qkv.dim(0) * qkv.dim(1), qkv.dim(2));
  }
  void attention_packed_forward_impl(const Tensor& ctx, const Tensor& lse, const Tensor& qkv, const Tensor& offsets,
                                     int heads, const DropoutSpec& dropout, AttentionScope scope) override {
    ref::attention_packed_forward(f32(ctx), f32(lse), f32(qkv), i32(offsets), qkv.dim(0), lse.dim(0), lse.dim(2),
                                  qkv.dim(1) / 3, heads, dropout, scope.window, scope.queries);
  }
  void attention_packed_backward_impl(const Tensor& dqkv, const Tensor& dctx, const Tensor& qkv, const Tensor&,
                                      const Tensor& lse, const Tensor& offsets, int heads, const DropoutSpec& dropout,
                                      AttentionScope scope, const Tensor& dbias) override {
    ref::attention_packed_backward(f32(dqkv), f32(dctx), f32(qkv), f32(lse), i32(offsets), qkv.dim(0), lse.dim(0),
                                   lse.dim(2), qkv.dim(1) / 3, heads, dropout, scope.window, scope.queries);
    if (dbias.defined()) ref::bias_grad(f32(dbias), f32(dqkv), qkv.dim(0), qkv.dim(1));
  }
  void rotary_forward_impl(const Tensor& y, const Tensor& x, int heads, float theta, const Tensor& rows) override {
    ref::rotary(f32(y), f32(x), x.dim(0), x.dim(1), x.dim(2) / 3, heads, theta, false, i32(rows),
                rows.defined() ? rows.dim(0) : 0);
  }
  void rotary_backward_impl(const Tensor& dx, const Tensor& dy, int heads, float theta, const Tensor& rows) override {
    ref::rotary(f32(dx), f32(dy), dy.dim(0), dy.dim(1), dy.dim(2) / 3, heads, theta, true, i32(rows),
                rows.defined() ? rows.dim(0) : 0);
  }

  // ---- statistical normalizations ----------------------------------------------------
  void layernorm_forward_impl(const Tensor& y, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                              const Tensor& branch, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                              float eps, const DropoutSpec& branch_dropout) override {
    const Mat m = as_matrix(y);
    ref::layernorm_forward(f32(y), opt(sum), f32(mean), f32(rstd), f32(branch), opt(residual), f32(gamma), f32(beta),
                           m.rows, m.cols, eps, branch_dropout);
  }
  void layernorm_backward_impl(const Tensor& dsum, const Tensor& dbranch, const Tensor& dgamma, const Tensor& dbeta,
                               const Tensor& dy, const Tensor& y, const Tensor& rstd, const Tensor& gamma,
                               const Tensor& beta, const DropoutSpec& branch_dropout, const Tensor& dbias) override {
    const Mat m = as_matrix(dy);
    ref::layernorm_backward(f32(dsum), opt(dbranch), opt(dgamma), opt(dbeta), f32(dy), f32(y), f32(rstd), f32(gamma),
                            f32(beta), m.rows, m.cols, branch_dropout);
    if (dbias.defined()) ref::bias_grad(f32(dbias), f32(dbranch), m.rows, m.cols);
  }
  void cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                          float grad_scale) override {
    const Mat m = as_matrix(logits);
    ref::cross_entropy(f32(losses), opt(dlogits), f32(logits), i32(labels), m.rows, m.cols, grad_scale);
  }
  void token_cross_entropy_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& labels,
                                float loss_weight, float grad_scale) override {
    const Mat m = as_matrix(logits);
    ref::token_cross_entropy(f32(losses), opt(dlogits), f32(logits), i32(labels), static_cast<int64_t>(losses.numel()),
                             m.rows, m.cols, loss_weight, grad_scale);
  }
  void mse_loss_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                     float grad_scale) override {
    const Mat m = as_matrix(logits);
    ref::float_target_loss(f32(losses), opt(dlogits), f32(logits), f32(targets), m.rows, m.cols, grad_scale, false);
  }
  void bce_with_logits_impl(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                            float grad_scale) override {
    const Mat m = as_matrix(logits);
    ref::float_target_loss(f32(losses), opt(dlogits), f32(logits), f32(targets), m.rows, m.cols, grad_scale, true);
  }

  // ---- element-wise ------------------------------------------------------------------
  void gelu_forward_impl(const Tensor& y, const Tensor& x) override { ref::gelu_forward(f32(y), f32(x), x.numel()); }
  void gelu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& dbias) override {
    ref::gelu_backward(f32(dx), f32(dy), f32(x), x.numel());
    if (dbias.defined()) {
      const Mat m = as_matrix(dx);
      ref::bias_grad(f32(dbias), f32(dx), m.rows, m.cols);
    }
  }
  void geglu_forward_impl(const Tensor& y, const Tensor& x) override {
    const Mat m = as_matrix(y);
    ref::geglu_forward(f32(y), f32(x), m.rows, m.cols);
  }
  void geglu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& x) override {
    const Mat m = as_matrix(dy);
    ref::geglu_backward(f32(dx), f32(dy), f32(x), m.rows, m.cols);
  }
  void tanh_forward_impl(const Tensor& y, const Tensor& x) override { ref::tanh_forward(f32(y), f32(x), x.numel()); }
  void tanh_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    ref::tanh_backward(f32(dx), f32(dy), f32(y), y.numel());
  }
  void relu_forward_impl(const Tensor& y, const Tensor& x) override { ref::relu_forward(f32(y), f32(x), x.numel()); }
  void relu_backward_impl(const Tensor& dx, const Tensor& dy, const Tensor& y) override {
    ref::relu_backward(f32(dx), f32(dy), f32(y), y.numel());
  }
  void dropout_forward_impl(const Tensor& y, const Tensor& x, const DropoutSpec& d) override {
    ref::dropout_forward(f32(y), f32(x), x.numel(), d);
  }
  void dropout_backward_impl(const Tensor& dx, const Tensor& dy, const DropoutSpec& d) override {
    ref::dropout_backward(f32(dx), f32(dy), dy.numel(), d);
  }
  void add_impl(const Tensor& y, const Tensor& a, const Tensor& b) override {
    ref::add(f32(y), f32(a), f32(b), y.numel());
  }
  void embedding_forward_impl(const Tensor& e, const Tensor& ids, const Tensor& type_ids, const Tensor& word,
                              const Tensor& pos, const Tensor& type) override {
    ref::embedding_forward(f32(e), i32(ids), i32(type_ids), f32(word), f32(pos), f32(type), ids.dim(0), ids.dim(1),
                           word.dim(1), word.dim(0), pos.dim(0), type.dim(0));
  }
  // An undefined table gradient is skipped; its row count then bounds nothing.
  void embedding_backward_impl(const Tensor& dword, const Tensor& dpos, const Tensor& dtype, const Tensor& de,
                               const Tensor& ids, const Tensor& type_ids) override {
    auto rows = [](const Tensor& t) { return t.defined() ? t.dim(0) : std::numeric_limits<int32_t>::max(); };
    ref::embedding_backward(opt(dword), opt(dpos), opt(dtype), f32(de), i32(ids), i32(type_ids), ids.dim(0),
                            ids.dim(1), de.dim(-1), rows(dword), rows(dpos), rows(dtype));
  }
  void select_token_impl(const Tensor& out, const Tensor& x, int64_t t) override {
    ref::select_token(f32(out), f32(x), x.dim(0), x.dim(1), x.dim(2), t);
  }
  void select_token_backward_impl(const Tensor& dx, const Tensor& dout, int64_t t) override {
    ref::select_token_backward(f32(dx), f32(dout), dx.dim(0), dx.dim(1), dx.dim(2), t);
  }
  void masked_mean_forward_impl(const Tensor& out, const Tensor& x, const Tensor& mask) override {
    ref::masked_mean_forward(f32(out), f32(x), i32(mask), x.dim(0), x.dim(1), x.dim(2));
  }
  void masked_mean_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& mask) override {
    ref::masked_mean_backward(f32(dx), f32(dout), i32(mask), dx.dim(0), dx.dim(1), dx.dim(2));
  }
  void gather_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) override {
    const RowCopy r = row_copy("gather_rows", out, in, idx, true);
    ref::gather_rows(out.data, in.data, i32(idx), r.n, r.row_bytes);
  }
  void scatter_rows_impl(const Tensor& out, const Tensor& in, const Tensor& idx) override {
    const RowCopy r = row_copy("scatter_rows", out, in, idx, false);
    ref::scatter_rows(out.data, in.data, i32(idx), r.n, r.row_bytes);
  }

  // ---- optimizer ---------------------------------------------------------------------
  void block_sum_squares_impl(const Tensor& partials, const Tensor& x) override {
    ref::block_sum_squares(f32(partials), f32(x), x.numel(), kNormBlock);
  }
  void sum_blocks_impl(const Tensor& out, const Tensor& partials) override {
    ref::sum_blocks(f32(out), f32(partials), partials.numel());
  }
  void adamw_update_impl(const Tensor& params, const Tensor& m, const Tensor& v, const Tensor& half_copy,
                         const Tensor& grads, const GradTransform& g, const AdamWArgs& a) override {
    if (skip_step(g)) return;
    ref::adamw_update(f32(params), f32(m), f32(v), f32(grads), params.numel(), factor(g), a);
    write_half(half_copy, params);
  }
  void sgd_update_impl(const Tensor& params, const Tensor& momentum, const Tensor& half_copy, const Tensor& grads,
                       const GradTransform& g, const SgdArgs& a) override {
    if (skip_step(g)) return;
    ref::sgd_update(f32(params), a.momentum != 0.0f ? f32(momentum) : nullptr, f32(grads), params.numel(), factor(g),
                    a);
    write_half(half_copy, params);
  }
  void adamw8bit_update_impl(const Tensor& params, const Tensor& m_codes, const Tensor& v_codes,
                             const Tensor& m_absmax, const Tensor& v_absmax, const Tensor& half_copy,
                             const Tensor& grads, const Tensor& qmap, const GradTransform& g,
                             const AdamWArgs& a) override {
    if (skip_step(g)) return;
    // The factor in float, as the CUDA kernel computes it (ops/optim_math.h).
    const float norm_sq = g.max_norm > 0 ? f32(g.norm_sq)[0] : 0.0f;
    const float f = om::grad_factor(norm_sq, g.max_norm > 0, g.inv_loss_scale, g.max_norm);
    ref::adamw8bit_update<float>(f32(params), m_codes.ptr<uint8_t>(), v_codes.ptr<uint8_t>(), f32(m_absmax),
                                 f32(v_absmax), f32(grads), f32(qmap), params.numel(), f, a);
    write_half(half_copy, params);
  }
  // The segment table is on the host here, so its ranges are checked before it is used (the
  // CUDA backend's table stays on the device; its builder, optim/adafactor.h, keeps it in range).
  void adafactor_update_impl(const Tensor& params, const Tensor& state, const Tensor&, const Tensor& half_copy,
                             const Tensor& grads, const AdafactorTable& table, const GradTransform& g,
                             const AdafactorArgs& a) override {
    const size_t n = params.numel();
    const auto* segs = table.segments.ptr<const AdafactorSegment>();
    for (int64_t s = 0; s < table.count; ++s) {
      const AdafactorSegment& sg = segs[s];
      const int64_t numel = sg.rows * sg.cols;
      ANATOMY_CHECK(sg.rows > 0 && sg.cols > 0 && sg.offset >= 0 && static_cast<size_t>(sg.offset + numel) <= n &&
                        sg.row_state >= 0 &&
                        static_cast<size_t>(sg.row_state + (sg.factored ? sg.rows : numel)) <= state.numel() &&
                        (!sg.factored || (sg.col_state >= 0 && static_cast<size_t>(sg.col_state + sg.cols) <= state.numel())),
                    "adafactor_update: segment ", s, " is out of range of params ", params.shape.str(), " or state ",
                    state.shape.str());
    }
    if (skip_step(g)) return;
    ref::adafactor_update(f32(params), f32(state), f32(grads), segs, static_cast<size_t>(table.count), factor(g), a);
    write_half(half_copy, params);
  }

 private:
  struct RowCopy {
    int64_t n;
    size_t row_bytes;
  };
  // The index values are read on the host here: each must name a row of the padded side.
  static RowCopy row_copy(const char* op, const Tensor& out, const Tensor& in, const Tensor& idx, bool gather) {
    const Mat p = as_matrix(gather ? out : in), q = as_matrix(gather ? in : out);
    const int32_t* ix = i32(idx);
    for (int64_t i = 0; i < p.rows; ++i)
      ANATOMY_CHECK(ix[i] >= 0 && ix[i] < q.rows, op, ": idx[", i, "] = ", ix[i], " is outside the ", q.rows,
                    " rows of ", gather ? "in" : "out");
    return {p.rows, static_cast<size_t>(p.cols) * dtype_size(out.dtype)};
  }
  // GradTransform::skip_nonfinite: true when the update must leave everything untouched.
  static bool skip_step(const GradTransform& g) { return g.skip_nonfinite && !std::isfinite(f32(g.norm_sq)[0]); }
  static double factor(const GradTransform& g) {
    return ref::grad_factor(g.max_norm > 0 ? f32(g.norm_sq)[0] : 0.0, g.inv_loss_scale, g.max_norm);
  }
  static void write_half(const Tensor& half_copy, const Tensor& params) {
    if (half_copy.defined()) cpu::cast(half_copy, params);
  }

  CpuAllocator m_alloc;
  int m_threads;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace anatomy
