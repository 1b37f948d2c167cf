// Every CudaBackend op against its CPU twin (make_cpu_backend, fp32) on fresh random inputs.
// GPU outputs are poisoned with NaN before each op (so an unwritten element fails), accumulated
// outputs start from random values on both sides (so "+=" is checked), and results are compared
// by ||out - ref|| / ||ref||: 1e-5 for fp32, 1e-3 with TF32, 1e-2 for BF16/F16 (whose inputs are
// rounded to the half type before they reach either backend). NaN never passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/backend.h"
#include "optim/grad_norm.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launchers.h"

namespace {

using namespace anatomy;

constexpr double kTolF32 = 1e-5, kTolTf32 = 1e-3, kTolHalf = 1e-2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

double tol_for(DType dt) { return dt == DType::F32 ? kTolF32 : kTolHalf; }

float round_to(float x, DType dt) {
  switch (dt) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    case DType::F16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

// A device tensor in the op's dtype and its host F32 twin holding the same (rounded) values.
struct Pair {
  Tensor g, c;
};

class Ctx {
 public:
  Ctx() : m_seed(std::random_device{}()), m_rng(m_seed) {
    gpu = make_cuda_backend(0);
    cpu = make_cpu_backend();
  }
  std::string trace() const { return "seed " + std::to_string(m_seed); }

  std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(m_rng.normal()) * scale;
    return v;
  }
  int64_t randint(int64_t lo, int64_t hi) { return m_rng.randint(lo, hi); }

  Tensor device(DType dt, Shape s, Category c = Category::Other) {
    m_buffers.emplace_back(gpu->allocator(), dt, s, c);
    return m_buffers.back().tensor();
  }
  Tensor host(DType dt, Shape s) {
    m_buffers.emplace_back(cpu->allocator(), dt, s, Category::Other);
    return m_buffers.back().tensor();
  }

  // Values rounded to dt, uploaded as dt to the GPU and as F32 to the CPU.
  Pair input(DType dt, Shape s, const std::vector<float>& values) {
    std::vector<float> r(values.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = round_to(values[i], dt);
    Pair p{device(dt, s), host(DType::F32, s)};
    put(p.g, r);
    std::memcpy(p.c.data, r.data(), r.size() * sizeof(float));
    return p;
  }
  Pair input(DType dt, Shape s, float scale = 1.0f) { return input(dt, s, randn(s.numel(), scale)); }
  // An output: NaN on both sides.
  Pair output(DType dt, Shape s) {
    return input(dt, s, std::vector<float>(s.numel(), kNaN));
  }
  Pair ints(Shape s, int64_t lo, int64_t hi) {
    std::vector<int32_t> v(s.numel());
    for (auto& x : v) x = static_cast<int32_t>(randint(lo, hi));
    Pair p{device(DType::I32, s), host(DType::I32, s)};
    gpu->upload(p.g, v.data());
    std::memcpy(p.c.data, v.data(), v.size() * sizeof(int32_t));
    return p;
  }

  // Host floats -> a device tensor of any float dtype.
  void put(const Tensor& t, const std::vector<float>& v) {
    ASSERT_EQ(v.size(), t.numel());
    if (t.dtype == DType::F32) {
      gpu->upload(t, v.data());
      return;
    }
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = t.dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    gpu->upload(t, h.data());
  }
  // A device tensor of any float dtype -> host floats.
  std::vector<float> get(const Tensor& t) {
    std::vector<float> v(t.numel());
    if (t.dtype == DType::F32) {
      gpu->download(v.data(), t);
      return v;
    }
    std::vector<uint16_t> h(t.numel());
    gpu->download(h.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.dtype == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
    return v;
  }
  static std::vector<float> host_values(const Tensor& t) {
    const float* p = t.ptr<const float>();
    return std::vector<float>(p, p + t.numel());
  }

  std::unique_ptr<Backend> gpu, cpu;

 private:
  uint32_t m_seed;
  Rng m_rng;
  std::vector<Buffer> m_buffers;
};

// ||got - ref|| / ||ref|| < tol, with no NaN on either side.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double num = 0, den = 0;
  size_t nan_got = 0, nan_ref = 0, first_nan = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) {
      ++nan_got;
      if (first_nan == got.size()) first_nan = i;
      continue;
    }
    if (std::isnan(ref[i])) {
      ++nan_ref;
      continue;
    }
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_EQ(nan_got, 0u) << what << ": " << nan_got << " NaN outputs (first at " << first_nan << ")";
  EXPECT_EQ(nan_ref, 0u) << what << ": the reference has NaN";
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_LT(rel, tol) << what << ": relative error " << rel;
}

void expect_close(Ctx& ctx, const Pair& p, double tol, const std::string& what) {
  expect_close(ctx.get(p.g), Ctx::host_values(p.c), tol, what);
}

const char* trans_name(Trans t) { return t == Trans::N ? "N" : "T"; }
const char* epi_name(Epilogue e) {
  return e == Epilogue::None       ? "none"
         : e == Epilogue::Bias     ? "bias"
         : e == Epilogue::BiasGelu ? "bias+gelu"
                                   : "bias grad";
}

// One matmul on both backends: C[M,N] (dtype c_dt) = alpha op(A) op(B) + beta C (+ epilogue).
void check_matmul(Ctx& ctx, DType dt, DType c_dt, int64_t m, int64_t n, int64_t k, Trans ta, Trans tb, Epilogue epi,
                  float alpha, float beta, double tol) {
  SCOPED_TRACE(std::string("matmul ") + std::string(dtype_name(dt)) + "->" + std::string(dtype_name(c_dt)) + " M=" +
               std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) + " " + trans_name(ta) +
               trans_name(tb) + " " + epi_name(epi) + " beta=" + std::to_string(beta));
  Pair a = ctx.input(dt, ta == Trans::N ? Shape{m, k} : Shape{k, m});
  Pair b = ctx.input(dt, tb == Trans::N ? Shape{k, n} : Shape{n, k});
  // beta != 0 reads C: random on both sides; beta == 0 must not read it: NaN on both sides.
  Pair c = beta != 0.0f ? ctx.input(c_dt, Shape{m, n}) : ctx.output(c_dt, Shape{m, n});
  MatmulArgs ga, ca;
  ga.alpha = ca.alpha = alpha;
  ga.beta = ca.beta = beta;
  ga.epilogue = ca.epilogue = epi;
  Pair bias, gelu_in;
  if (epi != Epilogue::None) {
    bias = ctx.input(dt, Shape{n});
    ga.bias = bias.g;
    ca.bias = bias.c;
  }
  if (epi == Epilogue::BiasGelu) {
    gelu_in = ctx.output(dt, Shape{m, n});
    ga.gelu_in = gelu_in.g;
    ca.gelu_in = gelu_in.c;
  }
  ctx.gpu->matmul(c.g, a.g, ta, b.g, tb, ga);
  ctx.cpu->matmul(c.c, a.c, ta, b.c, tb, ca);
  expect_close(ctx, c, tol, "C");
  if (epi == Epilogue::BiasGelu) expect_close(ctx, gelu_in, tol, "gelu_in");
}

constexpr Trans kTrans[] = {Trans::N, Trans::T};
constexpr Epilogue kEpilogues[] = {Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu};
constexpr DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

// ---- matmul ---------------------------------------------------------------------------------------

TEST(CudaOps, MatmulF32AllTransposesAndEpilogues) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (Trans ta : kTrans)
    for (Trans tb : kTrans)
      for (Epilogue e : kEpilogues) {
        check_matmul(ctx, DType::F32, DType::F32, 128, 192, 256, ta, tb, e, 1.0f, 0.0f, kTolF32);
        check_matmul(ctx, DType::F32, DType::F32, 37, 53, 29, ta, tb, e, 0.5f, 0.0f, kTolF32);  // odd: unaligned lds
        check_matmul(ctx, DType::F32, DType::F32, 64, 96, 80, ta, tb, e, 1.0f, 0.75f, kTolF32);
      }
}

TEST(CudaOps, MatmulTf32) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  ctx.gpu->set_allow_tf32(true);
  for (Trans ta : kTrans)
    for (Trans tb : kTrans)
      for (Epilogue e : kEpilogues) check_matmul(ctx, DType::F32, DType::F32, 256, 384, 512, ta, tb, e, 1.0f, 0.0f, kTolTf32);
  ctx.gpu->set_allow_tf32(false);  // back to full fp32: the plan cache keys on the mode
  check_matmul(ctx, DType::F32, DType::F32, 256, 384, 512, Trans::N, Trans::T, Epilogue::Bias, 1.0f, 0.0f, kTolF32);
}

TEST(CudaOps, MatmulHalfAllTransposesAndEpilogues) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : {DType::BF16, DType::F16})
    for (Trans ta : kTrans)
      for (Trans tb : kTrans)
        for (Epilogue e : kEpilogues) {
          check_matmul(ctx, dt, dt, 256, 384, 128, ta, tb, e, 1.0f, 0.0f, kTolHalf);
          check_matmul(ctx, dt, dt, 40, 24, 72, ta, tb, e, 1.0f, 0.0f, kTolHalf);
          check_matmul(ctx, dt, dt, 64, 32, 48, ta, tb, e, 0.5f, 1.0f, kTolHalf);
        }
  // The classifier: logits [B, 2] = pooled [B, H] W[2, H]^T + b, and its input gradient.
  check_matmul(ctx, DType::BF16, DType::BF16, 8, 2, 64, Trans::N, Trans::T, Epilogue::Bias, 1.0f, 0.0f, kTolHalf);
  check_matmul(ctx, DType::BF16, DType::BF16, 8, 64, 2, Trans::N, Trans::N, Epilogue::None, 1.0f, 0.0f, kTolHalf);
}

// Parameter gradients: F32 C += op(A) op(B) from half A, B (beta = 1), e.g. dW[out, in] += dY^T X.
TEST(CudaOps, MatmulHalfInputsAccumulateIntoF32) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : {DType::BF16, DType::F16})
    for (Trans ta : kTrans)
      for (Trans tb : kTrans) {
        // Identical rounded inputs and fp32 accumulation on both sides: far below kTolHalf.
        check_matmul(ctx, dt, DType::F32, 96, 160, 512, ta, tb, Epilogue::None, 1.0f, 1.0f, 1e-4);
        check_matmul(ctx, dt, DType::F32, 2, 64, 8, ta, tb, Epilogue::None, 1.0f, 1.0f, 1e-4);  // classifier dW
      }
}

TEST(CudaOps, MatmulCommonShapesUseCublasLt) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  // BERT-like projections (tokens x hidden) in bf16: cuBLASLt must have algorithms for these.
  check_matmul(ctx, DType::BF16, DType::BF16, 512, 768, 256, Trans::N, Trans::T, Epilogue::Bias, 1.0f, 0.0f, kTolHalf);
  check_matmul(ctx, DType::BF16, DType::BF16, 512, 1024, 256, Trans::N, Trans::T, Epilogue::BiasGelu, 1.0f, 0.0f,
               kTolHalf);
  check_matmul(ctx, DType::BF16, DType::BF16, 512, 256, 768, Trans::N, Trans::N, Epilogue::None, 1.0f, 0.0f, kTolHalf);
  check_matmul(ctx, DType::BF16, DType::F32, 768, 256, 512, Trans::T, Trans::N, Epilogue::None, 1.0f, 1.0f, 1e-4);
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->matmul_fallback_calls(), 0);
}

// Note [gemm tuning]: after the backend times other algorithms for the problems it has planned,
// those problems still compute what the CPU does (the same shapes, new inputs).
TEST(CudaOps, TunedMatmulsStillMatchTheCpu) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  auto all = [&] {
    check_matmul(ctx, DType::BF16, DType::BF16, 512, 768, 256, Trans::N, Trans::T, Epilogue::Bias, 1.0f, 0.0f, kTolHalf);
    check_matmul(ctx, DType::BF16, DType::BF16, 512, 1024, 256, Trans::N, Trans::T, Epilogue::BiasGelu, 1.0f, 0.0f,
                 kTolHalf);
    check_matmul(ctx, DType::BF16, DType::BF16, 512, 256, 768, Trans::N, Trans::N, Epilogue::None, 1.0f, 1.0f, kTolHalf);
    check_matmul(ctx, DType::BF16, DType::F32, 768, 256, 512, Trans::T, Trans::N, Epilogue::None, 1.0f, 1.0f, 1e-4);
    check_matmul(ctx, DType::F16, DType::F16, 256, 384, 128, Trans::N, Trans::T, Epilogue::None, 1.0f, 0.0f, kTolHalf);
  };
  all();
  Buffer scratch(ctx.gpu->allocator(), DType::U8, {int64_t{16} << 20}, Category::Other);
  const std::string report = ctx.gpu->tune_matmuls(scratch.data(), static_cast<size_t>(scratch.bytes()));
  EXPECT_GE(std::atoi(report.c_str()), 5) << report;  // "N GEMM problem(s) timed, ..."
  EXPECT_NE(report.find("| 512 x 256 x 768 | NN | BF16 -> BF16 |"), std::string::npos) << report;
  // A second call has nothing left to time; too little scratch times nothing either.
  EXPECT_EQ(std::atoi(ctx.gpu->tune_matmuls(scratch.data(), static_cast<size_t>(scratch.bytes())).c_str()), 0);
  all();
  Ctx small;
  check_matmul(small, DType::BF16, DType::BF16, 512, 768, 256, Trans::N, Trans::T, Epilogue::Bias, 1.0f, 0.0f, kTolHalf);
  EXPECT_EQ(std::atoi(small.gpu->tune_matmuls(scratch.data(), 4096).c_str()), 0);
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  EXPECT_EQ(be->matmul_fallback_calls(), 0);
}

// The tiled kernel used where cuBLASLt declines, called directly.
TEST(CudaOps, MatmulFallbackKernel) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  const int64_t m = 33, n = 47, k = 70;
  for (DType dt : {DType::F32, DType::BF16})
    for (Trans ta : kTrans)
      for (Trans tb : kTrans)
        for (Epilogue e : kEpilogues) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + trans_name(ta) + trans_name(tb) + epi_name(e));
          Pair a = ctx.input(dt, ta == Trans::N ? Shape{m, k} : Shape{k, m});
          Pair b = ctx.input(dt, tb == Trans::N ? Shape{k, n} : Shape{n, k});
          const float beta = 0.5f;
          Pair c = ctx.input(dt, Shape{m, n});
          Pair bias = ctx.input(dt, Shape{n}), gin = ctx.output(dt, Shape{m, n});
          MatmulArgs ga, ca;
          ga.beta = ca.beta = beta;
          ga.epilogue = ca.epilogue = e;
          ga.bias = bias.g, ca.bias = bias.c;
          ga.gelu_in = gin.g, ca.gelu_in = gin.c;
          cuda::matmul_fallback(c.g, a.g, ta, b.g, tb, m, n, k, ga, be->stream());
          ctx.cpu->matmul(c.c, a.c, ta, b.c, tb, ca);
          expect_close(ctx, c, tol_for(dt), "C");
          if (e == Epilogue::BiasGelu) expect_close(ctx, gin, tol_for(dt), "gelu_in");
        }
}

// Note [fused bias gradient]: dW F32 [out, in] = dY^T X (+ beta dW) with db F32 [out] = the column
// sums of dY (+ beta db), against the CPU running the GEMM then bias_grad. beta 0: both outputs
// start as NaN, so each must be written; beta 1: from random values, so each must be added to.
void check_bias_grad_matmul(Ctx& ctx, DType dt, int64_t rows, int64_t out, int64_t in, float beta, double tol) {
  SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " out " + std::to_string(out) + " in " +
               std::to_string(in) + " beta " + std::to_string(beta));
  Pair dy = ctx.input(dt, Shape{rows, out}), x = ctx.input(dt, Shape{rows, in});
  Pair dw = beta != 0.0f ? ctx.input(DType::F32, Shape{out, in}) : ctx.output(DType::F32, Shape{out, in});
  Pair db = beta != 0.0f ? ctx.input(DType::F32, Shape{out}) : ctx.output(DType::F32, Shape{out});
  ctx.gpu->matmul(dw.g, dy.g, Trans::T, x.g, Trans::N, MatmulArgs{1.0f, beta, Epilogue::BiasGrad, db.g, {}});
  ctx.cpu->matmul(dw.c, dy.c, Trans::T, x.c, Trans::N, MatmulArgs{1.0f, beta, Epilogue::BiasGrad, db.c, {}});
  expect_close(ctx, dw, tol, "dW");
  expect_close(ctx, db, tol, "db");
}

// The weight gradients of bert-like Linear layers (rows = tokens) in every dtype, overwriting and
// accumulating: cuBLASLt's BGRADB epilogue must be taken for the half dtypes at these shapes.
TEST(CudaOps, MatmulFusedBiasGrad) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  be->set_fused_bias_grad(true);  // off by default (Note [fused bias gradient])
  for (DType dt : {DType::BF16, DType::F16})
    for (float beta : {0.0f, 1.0f}) {
      check_bias_grad_matmul(ctx, dt, 512, 768, 256, beta, 1e-4);    // attention output / FFN out
      check_bias_grad_matmul(ctx, dt, 512, 3 * 256, 256, beta, 1e-4);  // q|k|v
      check_bias_grad_matmul(ctx, dt, 384, 1024, 256, beta, 1e-4);   // FFN in
      check_bias_grad_matmul(ctx, dt, 64, 2, 256, beta, 1e-4);       // the classifier head: out 2
    }
  EXPECT_EQ(be->bias_grad_unfused_calls(), 0) << "cuBLASLt declined the BGRADB epilogue";
  for (float beta : {0.0f, 1.0f}) check_bias_grad_matmul(ctx, DType::F32, 256, 384, 128, beta, kTolF32);
  std::printf("[ epilogue ] unfused BiasGrad calls after the F32 cases: %lld\n",
              static_cast<long long>(be->bias_grad_unfused_calls()));
}

// Shapes cuBLASLt may decline (odd widths, unaligned rows) and empty ones: whichever path runs,
// the same results; and the unfused path itself (the epilogue switched off).
TEST(CudaOps, MatmulBiasGradOddShapesAndUnfused) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    be->set_fused_bias_grad(fused);
    for (DType dt : kFloatTypes)
      for (float beta : {0.0f, 1.0f}) {
        check_bias_grad_matmul(ctx, dt, 37, 53, 29, beta, dt == DType::F32 ? kTolF32 : 1e-4);
        check_bias_grad_matmul(ctx, dt, 3, 5, 7, beta, dt == DType::F32 ? kTolF32 : 1e-4);
        check_bias_grad_matmul(ctx, dt, 256, 64, 96, beta, dt == DType::F32 ? kTolF32 : 1e-4);
      }
  }
}

// The fused weight and bias gradients at bert-large widths are bit-identical run to run, as the
// bias_grad kernel is (CudaOps.BiasGradDeterministic): cuBLASLt's split-K reductions and the
// BGRADB epilogue must not depend on timing.
TEST(CudaOps, MatmulFusedBiasGradDeterministic) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  auto* be = dynamic_cast<cuda::CudaBackend*>(ctx.gpu.get());
  ASSERT_NE(be, nullptr);
  be->set_fused_bias_grad(true);  // the epilogue's own reproducibility (off by default)
  for (auto [rows, out, in] : {std::tuple<int64_t, int64_t, int64_t>{16384, 1024, 1024}, {4099, 4096, 256}})
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " out " + std::to_string(out) + " beta " + std::to_string(beta));
      Pair dy = ctx.input(DType::BF16, Shape{rows, out}), x = ctx.input(DType::BF16, Shape{rows, in});
      const std::vector<float> w0 = ctx.randn(static_cast<size_t>(out * in)), b0 = ctx.randn(static_cast<size_t>(out));
      Tensor dw = ctx.device(DType::F32, Shape{out, in}), db = ctx.device(DType::F32, Shape{out});
      std::vector<float> first_w, first_b;
      for (int run = 0; run < 2; ++run) {
        ctx.put(dw, w0);
        ctx.put(db, b0);
        ctx.gpu->matmul(dw, dy.g, Trans::T, x.g, Trans::N, MatmulArgs{1.0f, beta, Epilogue::BiasGrad, db, {}});
        std::vector<float> got_w = ctx.get(dw), got_b = ctx.get(db);
        if (run == 0) {
          first_w = std::move(got_w);
          first_b = std::move(got_b);
          continue;
        }
        EXPECT_EQ(std::memcmp(first_w.data(), got_w.data(), got_w.size() * sizeof(float)), 0) << "dW differs";
        EXPECT_EQ(std::memcmp(first_b.data(), got_b.data(), got_b.size() * sizeof(float)), 0) << "db differs";
      }
    }
}

TEST(CudaOps, BiasGrad) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{4096, 768}, {37, 3}, {1000, 300}, {5, 3072}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " n " + std::to_string(n));
      Pair dy = ctx.input(dt, Shape{rows, n});
      Pair db = ctx.input(DType::F32, Shape{n});  // accumulated into
      ctx.gpu->bias_grad(db.g, dy.g);
      ctx.cpu->bias_grad(db.c, dy.c);
      expect_close(ctx, db, kTolF32 * 10, "db");  // fp32 sums of identical inputs, different order
    }
}

// The bert-large widths (1024, 3072, 4096) through the vector kernel, with row counts that are
// not multiples of the block's rows or of the chunk, one of the full 16384 rows, a width that
// ends in a partial column tile (1032) and a few rows (one chunk: no partials).
TEST(CudaOps, BiasGradBertWidths) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : {DType::BF16, DType::F32})
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{16384, 1024}, {2051, 4096}, {1999, 3072}, {640, 1032},
                           {3, 1024}, {77, 4096}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " n " + std::to_string(n));
      Pair dy = ctx.input(dt, Shape{rows, n});
      Pair db = ctx.input(DType::F32, Shape{n});  // accumulated into
      ctx.gpu->bias_grad(db.g, dy.g);
      ctx.cpu->bias_grad(db.c, dy.c);
      expect_close(ctx, db, kTolF32 * 10, "db");
    }
}

// The same inputs and starting db give bitwise the same db (no atomics; a fixed summation order).
TEST(CudaOps, BiasGradDeterministic) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : {DType::BF16, DType::F32})
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{16384, 1024}, {4099, 4096}, {1000, 300}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " n " + std::to_string(n));
      Pair dy = ctx.input(dt, Shape{rows, n});
      const std::vector<float> start = ctx.randn(static_cast<size_t>(n));
      Tensor db = ctx.device(DType::F32, Shape{n});
      std::vector<float> first;
      for (int run = 0; run < 2; ++run) {
        ctx.put(db, start);
        ctx.gpu->bias_grad(db, dy.g);
        std::vector<float> got = ctx.get(db);
        if (run == 0) {
          first = std::move(got);
        } else {
          EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0) << "db differs between runs";
        }
      }
    }
}

// ---- layernorm ------------------------------------------------------------------------------------

// dt, and F32 when dt is a half type: the dtypes of parameters read beside dt activations.
std::vector<DType> with_f32(DType dt) {
  if (dt == DType::F32) return {dt};
  return {dt, DType::F32};
}

TEST(CudaOps, LayerNormForward) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  // 1024, 768, 64: the warp path; 100, 1030: the block path.
  for (DType dt : kFloatTypes)
    for (DType pt : with_f32(dt))  // gamma, beta: the compute dtype or F32 (the master weights)
      for (int64_t h : {1024, 768, 64, 100, 1030})
        for (bool residual : {true, false})
          for (float p : {0.0f, 0.1f}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " params " + std::string(dtype_name(pt)) + " H " + std::to_string(h) +
                         (residual ? " residual" : "") + " p " + std::to_string(p));
            const int64_t rows = 67;
            const DropoutSpec d{p, 1234u + static_cast<uint64_t>(h), 77};
            Pair branch = ctx.input(dt, Shape{rows, h});
            Pair res = residual ? ctx.input(dt, Shape{rows, h}) : Pair{};
            std::vector<float> gv = ctx.randn(h, 0.2f);  // gamma near 1
            for (auto& x : gv) x += 1.0f;
            Pair gamma = ctx.input(pt, Shape{h}, gv), beta = ctx.input(pt, Shape{h});
            Pair y = ctx.output(dt, Shape{rows, h}), sum = ctx.output(dt, Shape{rows, h});
            Pair mean = ctx.output(DType::F32, Shape{rows}), rstd = ctx.output(DType::F32, Shape{rows});
            ctx.gpu->layernorm_forward(y.g, sum.g, mean.g, rstd.g, branch.g, res.g, gamma.g, beta.g, 1e-12f, d);
            ctx.cpu->layernorm_forward(y.c, sum.c, mean.c, rstd.c, branch.c, res.c, gamma.c, beta.c, 1e-12f, d);
            const double tol = tol_for(dt);
            expect_close(ctx, sum, tol, "sum");
            expect_close(ctx, y, tol, "y");
            expect_close(ctx, mean, tol, "mean");
            expect_close(ctx, rstd, tol, "rstd");
            // Without the stored sum (training: backward reads y) the statistics are those of the
            // fp32 sum: in fp32 the same y bit for bit; in the half types within their tolerance
            // of the CPU twin (which never rounds the sum).
            Pair y2 = ctx.output(dt, Shape{rows, h});
            ctx.gpu->layernorm_forward(y2.g, Tensor{}, mean.g, rstd.g, branch.g, res.g, gamma.g, beta.g, 1e-12f, d);
            ctx.cpu->layernorm_forward(y2.c, Tensor{}, mean.c, rstd.c, branch.c, res.c, gamma.c, beta.c, 1e-12f, d);
            expect_close(ctx, y2, tol, "y without sum");
            if (dt == DType::F32) {
              const std::vector<float> ya = ctx.get(y.g), yb = ctx.get(y2.g);
              EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0) << "y without sum differs";
            }
            if (p > 0) {  // element i dropped iff dropout_keep(seed, offset, i, p) says so: sum == residual
              const std::vector<float> gs = ctx.get(sum.g);
              const std::vector<float> rv = residual ? ctx.get(res.g) : std::vector<float>(gs.size(), 0.0f);
              size_t wrong = 0, dropped = 0;
              for (size_t i = 0; i < gs.size(); ++i)
                if (!dropout_keep(d.seed, d.offset, i, d.p)) {
                  ++dropped;
                  wrong += gs[i] != rv[i];
                }
              EXPECT_EQ(wrong, 0u) << "of " << dropped << " dropped elements";
            }
          }
}

// Inputs of a LayerNorm backward (Note [layernorm backward from its output]): the forward's
// output y (scale 2), rstd > 0, dy, gamma near 1 (backward divides by it), beta.
struct LnBackwardInputs {
  Pair y, rstd, dy, gamma, beta;
};
LnBackwardInputs ln_backward_inputs(Ctx& ctx, DType dt, int64_t rows, int64_t h, DType params = DType::F32) {
  LnBackwardInputs in;
  in.y = ctx.input(dt, Shape{rows, h}, 2.0f);
  std::vector<float> rv = ctx.randn(static_cast<size_t>(rows), 0.1f);
  for (auto& x : rv) x = 0.85f + std::fabs(x);
  in.rstd = ctx.input(DType::F32, Shape{rows}, rv);
  in.dy = ctx.input(dt, Shape{rows, h});
  std::vector<float> gv = ctx.randn(static_cast<size_t>(h), 0.2f);
  for (auto& x : gv) x += 1.0f;
  in.gamma = ctx.input(params, Shape{h}, gv);
  in.beta = ctx.input(params, Shape{h});
  return in;
}

TEST(CudaOps, LayerNormBackward) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (DType pt : with_f32(dt))  // gamma, beta: the compute dtype or F32
      for (int64_t h : {1024, 768, 64, 100, 1030})
        for (float p : {0.0f, 0.1f})
          for (int64_t rows : {int64_t{3}, int64_t{517}}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " params " + std::string(dtype_name(pt)) + " H " + std::to_string(h) +
                         " rows " + std::to_string(rows) + " p " + std::to_string(p));
            const DropoutSpec d{p, 99, 5};
            LnBackwardInputs in = ln_backward_inputs(ctx, dt, rows, h, pt);
            Pair dsum = ctx.output(dt, Shape{rows, h}), dbranch = ctx.output(dt, Shape{rows, h});
            Pair dgamma = ctx.input(DType::F32, Shape{h}), dbeta = ctx.input(DType::F32, Shape{h});  // +=
            ctx.gpu->layernorm_backward(dsum.g, dbranch.g, dgamma.g, dbeta.g, in.dy.g, in.y.g, in.rstd.g, in.gamma.g,
                                        in.beta.g, d);
            ctx.cpu->layernorm_backward(dsum.c, dbranch.c, dgamma.c, dbeta.c, in.dy.c, in.y.c, in.rstd.c, in.gamma.c,
                                        in.beta.c, d);
            const double tol = tol_for(dt);
            expect_close(ctx, dsum, tol, "dsum");
            expect_close(ctx, dbranch, tol, "dbranch");
            expect_close(ctx, dgamma, tol, "dgamma");
            expect_close(ctx, dbeta, tol, "dbeta");
          }
}

TEST(CudaOps, LayerNormBackwardWithoutOptionalOutputs) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  const int64_t rows = 40, h = 256;
  LnBackwardInputs in = ln_backward_inputs(ctx, DType::F32, rows, h);
  Pair dsum = ctx.output(DType::F32, Shape{rows, h});
  ctx.gpu->layernorm_backward(dsum.g, Tensor{}, Tensor{}, Tensor{}, in.dy.g, in.y.g, in.rstd.g, in.gamma.g, in.beta.g, {});
  ctx.cpu->layernorm_backward(dsum.c, Tensor{}, Tensor{}, Tensor{}, in.dy.c, in.y.c, in.rstd.c, in.gamma.c, in.beta.c, {});
  expect_close(ctx, dsum, kTolF32, "dsum");
}

static void layernorm_backward_bert_shapes();

// bert-large's LayerNorm backward (H = 1024, 16384 rows, the branch dropout fused or not) on the
// persistent group path, two packs a thread and (ANATOMY_LN_BWD=one-pack) one (Note [layernorm
// backward, two packs a thread]), a row count that leaves the last grid step partial, and H = 4096
// on the block path; also dgamma or dbeta alone.
TEST(CudaOps, LayerNormBackwardBertShapes) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* variant : {"", "one-pack"}) {
    SCOPED_TRACE(std::string("ANATOMY_LN_BWD=") + variant);
    setenv("ANATOMY_LN_BWD", variant, 1);
    layernorm_backward_bert_shapes();
  }
  unsetenv("ANATOMY_LN_BWD");
}

static void layernorm_backward_bert_shapes() {
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  struct Case {
    DType dt;
    int64_t rows, h;
    float p;
  };
  for (const Case& k : {Case{DType::BF16, 16384, 1024, 0.1f}, Case{DType::BF16, 16384, 1024, 0.0f},
                        Case{DType::BF16, 2053, 1024, 0.1f}, Case{DType::F16, 1061, 1024, 0.1f},
                        Case{DType::F32, 2053, 1024, 0.1f}, Case{DType::BF16, 1031, 4096, 0.1f},
                        Case{DType::F32, 517, 4096, 0.0f}, Case{DType::BF16, 9, 1024, 0.1f}}) {
    SCOPED_TRACE(std::string(dtype_name(k.dt)) + " rows " + std::to_string(k.rows) + " H " + std::to_string(k.h) +
                 " p " + std::to_string(k.p));
    const DropoutSpec d{k.p, 4321, 11};
    LnBackwardInputs in = ln_backward_inputs(ctx, k.dt, k.rows, k.h);
    Pair dsum = ctx.output(k.dt, Shape{k.rows, k.h}), dbranch = ctx.output(k.dt, Shape{k.rows, k.h});
    Pair dgamma = ctx.input(DType::F32, Shape{k.h}), dbeta = ctx.input(DType::F32, Shape{k.h});  // +=
    ctx.gpu->layernorm_backward(dsum.g, dbranch.g, dgamma.g, dbeta.g, in.dy.g, in.y.g, in.rstd.g, in.gamma.g,
                                in.beta.g, d);
    ctx.cpu->layernorm_backward(dsum.c, dbranch.c, dgamma.c, dbeta.c, in.dy.c, in.y.c, in.rstd.c, in.gamma.c,
                                in.beta.c, d);
    const double tol = tol_for(k.dt);
    expect_close(ctx, dsum, tol, "dsum");
    expect_close(ctx, dbranch, tol, "dbranch");
    // fp32 sums over the rows of identical inputs: far tighter than the half outputs.
    expect_close(ctx, dgamma, k.dt == DType::F32 ? 1e-4 : tol, "dgamma");
    expect_close(ctx, dbeta, k.dt == DType::F32 ? 1e-4 : tol, "dbeta");
  }
  for (bool gamma_only : {true, false}) {  // one of the two reductions: the other output stays undefined
    SCOPED_TRACE(gamma_only ? "dgamma only" : "dbeta only");
    const int64_t rows = 1500, h = 1024;
    LnBackwardInputs in = ln_backward_inputs(ctx, DType::BF16, rows, h);
    Pair dsum = ctx.output(DType::BF16, Shape{rows, h});
    Pair dx = ctx.input(DType::F32, Shape{h});
    const Tensor dg_g = gamma_only ? dx.g : Tensor{}, db_g = gamma_only ? Tensor{} : dx.g;
    const Tensor dg_c = gamma_only ? dx.c : Tensor{}, db_c = gamma_only ? Tensor{} : dx.c;
    ctx.gpu->layernorm_backward(dsum.g, Tensor{}, dg_g, db_g, in.dy.g, in.y.g, in.rstd.g, in.gamma.g, in.beta.g, {});
    ctx.cpu->layernorm_backward(dsum.c, Tensor{}, dg_c, db_c, in.dy.c, in.y.c, in.rstd.c, in.gamma.c, in.beta.c, {});
    expect_close(ctx, dsum, kTolHalf, "dsum");
    expect_close(ctx, dx, kTolHalf, gamma_only ? "dgamma" : "dbeta");
  }
}

// Two runs on the same inputs (and the same starting dgamma/dbeta) agree bit for bit: the
// partial rows are disjoint per block and summed in a fixed order.
TEST(CudaOps, LayerNormBackwardDeterministic) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (auto [dt, rows, h] : {std::tuple<DType, int64_t, int64_t>{DType::BF16, 16384, 1024}, {DType::F32, 2053, 1024},
                             {DType::BF16, 1031, 4096}}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(rows) + " H " + std::to_string(h));
    const DropoutSpec d{0.1f, 777, 3};
    LnBackwardInputs in = ln_backward_inputs(ctx, dt, rows, h);
    const std::vector<float> g0 = ctx.randn(static_cast<size_t>(h)), b0 = ctx.randn(static_cast<size_t>(h));
    Tensor dsum = ctx.device(dt, Shape{rows, h}), dbranch = ctx.device(dt, Shape{rows, h});
    Tensor dgamma = ctx.device(DType::F32, Shape{h}), dbeta = ctx.device(DType::F32, Shape{h});
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; ++run) {
      ctx.put(dgamma, g0);
      ctx.put(dbeta, b0);
      ctx.gpu->layernorm_backward(dsum, dbranch, dgamma, dbeta, in.dy.g, in.y.g, in.rstd.g, in.gamma.g, in.beta.g, d);
      std::vector<std::vector<float>> got{ctx.get(dsum), ctx.get(dbranch), ctx.get(dgamma), ctx.get(dbeta)};
      if (run == 0) {
        first = std::move(got);
        continue;
      }
      const char* names[] = {"dsum", "dbranch", "dgamma", "dbeta"};
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(std::memcmp(first[i].data(), got[i].data(), got[i].size() * sizeof(float)), 0)
            << names[i] << " differs between runs";
    }
  }
}

// ---- cross-entropy --------------------------------------------------------------------------------

TEST(CudaOps, CrossEntropy) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (int64_t classes : {2, 5, 100}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " classes " + std::to_string(classes));
      const int64_t batch = 37;
      Pair logits = ctx.input(dt, Shape{batch, classes}, 3.0f);
      Pair labels = ctx.ints(Shape{batch}, 0, classes);
      Pair losses = ctx.output(DType::F32, Shape{batch}), dlogits = ctx.output(dt, Shape{batch, classes});
      ctx.gpu->cross_entropy(losses.g, dlogits.g, logits.g, labels.g, 0.25f);
      ctx.cpu->cross_entropy(losses.c, dlogits.c, logits.c, labels.c, 0.25f);
      expect_close(ctx, losses, kTolF32 * 10, "losses");  // fp32 output from identical inputs
      expect_close(ctx, dlogits, tol_for(dt), "dlogits");
    }
}

// ---- embedding ------------------------------------------------------------------------------------

TEST(CudaOps, EmbeddingForwardAndBackward) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (DType tt : with_f32(dt))  // tables of the compute dtype, or F32 (the master weights)
      for (int64_t h : {64, 30})           // 16-byte packs; scalar path
        for (int64_t type_vocab : {2, 6})  // one pass of token types; two
          for (bool with_types : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " tables " + std::string(dtype_name(tt)) + " H " +
                         std::to_string(h) + " types " + std::to_string(type_vocab) +
                         (with_types ? "" : " (no type_ids)"));
            const int64_t batch = 3, seq = 17, vocab = 20, max_pos = 32;  // ids repeat: atomics collide
            Pair ids = ctx.ints(Shape{batch, seq}, 0, vocab);
            Pair tids = with_types ? ctx.ints(Shape{batch, seq}, 0, type_vocab) : Pair{};
            Pair word = ctx.input(tt, Shape{vocab, h}), pos = ctx.input(tt, Shape{max_pos, h});
            Pair type = ctx.input(tt, Shape{type_vocab, h});
            Pair e = ctx.output(dt, Shape{batch * seq, h});
            ctx.gpu->embedding_forward(e.g, ids.g, tids.g, word.g, pos.g, type.g);
            ctx.cpu->embedding_forward(e.c, ids.c, tids.c, word.c, pos.c, type.c);
            expect_close(ctx, e, tol_for(dt), "e");

            Pair de = ctx.input(dt, Shape{batch * seq, h});
            Pair dword = ctx.input(DType::F32, Shape{vocab, h}), dpos = ctx.input(DType::F32, Shape{max_pos, h});
            Pair dtype = ctx.input(DType::F32, Shape{type_vocab, h});  // all accumulated into
            ctx.gpu->embedding_backward(dword.g, dpos.g, dtype.g, de.g, ids.g, tids.g);
            ctx.cpu->embedding_backward(dword.c, dpos.c, dtype.c, de.c, ids.c, tids.c);
            expect_close(ctx, dword, kTolF32, "dword");
            expect_close(ctx, dpos, kTolF32, "dpos");
            expect_close(ctx, dtype, kTolF32, "dtype");
          }
}

// ---- element-wise ---------------------------------------------------------------------------------

// An n-element slice starting `offset` elements into a larger buffer: offset 1 defeats the
// 16-byte packs, n odd exercises the tail.
Pair slice(const Pair& whole, int64_t offset, int64_t n) {
  return Pair{whole.g.view(Shape{static_cast<int64_t>(whole.g.numel())}).slice(offset, offset + n),
              whole.c.view(Shape{static_cast<int64_t>(whole.c.numel())}).slice(offset, offset + n)};
}

TEST(CudaOps, ElementwiseOps) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  const int64_t n = 100003;
  for (DType dt : kFloatTypes)
    for (int64_t off : {0, 1}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " offset " + std::to_string(off));
      const double tol = tol_for(dt);
      auto in = [&](float scale = 2.0f) { return slice(ctx.input(dt, Shape{n + 1}, scale), off, n); };
      auto out = [&] { return slice(ctx.output(dt, Shape{n + 1}), off, n); };
      {
        Pair x = in(), y = out();
        ctx.gpu->gelu_forward(y.g, x.g);
        ctx.cpu->gelu_forward(y.c, x.c);
        expect_close(ctx, y, tol, "gelu");
        Pair dy = in(), dx = out();
        ctx.gpu->gelu_backward(dx.g, dy.g, x.g);
        ctx.cpu->gelu_backward(dx.c, dy.c, x.c);
        expect_close(ctx, dx, tol, "gelu_backward");
      }
      {
        Pair x = in(), y = out();
        ctx.gpu->tanh_forward(y.g, x.g);
        ctx.cpu->tanh_forward(y.c, x.c);
        expect_close(ctx, y, tol, "tanh");
        Pair yy = in(0.5f), dy = in(), dx = out();
        ctx.gpu->tanh_backward(dx.g, dy.g, yy.g);
        ctx.cpu->tanh_backward(dx.c, dy.c, yy.c);
        expect_close(ctx, dx, tol, "tanh_backward");
      }
      {
        Pair x = in(), y = out();
        ctx.gpu->relu_forward(y.g, x.g);
        ctx.cpu->relu_forward(y.c, x.c);
        expect_close(ctx, y, tol, "relu");
        Pair dy = in(), dx = out();
        ctx.gpu->relu_backward(dx.g, dy.g, x.g);  // x as the output: its negatives are relu's zeros
        ctx.cpu->relu_backward(dx.c, dy.c, x.c);
        expect_close(ctx, dx, tol, "relu_backward");
      }
      for (float p : {0.0f, 0.1f, 0.5f}) {
        SCOPED_TRACE("dropout p " + std::to_string(p));
        const DropoutSpec d{p, 0x1234abcdULL, 42};
        Pair x = in(), y = out();
        ctx.gpu->dropout_forward(y.g, x.g, d);
        ctx.cpu->dropout_forward(y.c, x.c, d);
        expect_close(ctx, y, tol, "dropout");
        const std::vector<float> gy = ctx.get(y.g), cy = Ctx::host_values(y.c);
        size_t mismatched = 0, dropped = 0;
        for (size_t i = 0; i < gy.size(); ++i) {
          mismatched += (gy[i] == 0.0f) != (cy[i] == 0.0f);
          dropped += cy[i] == 0.0f;
        }
        EXPECT_EQ(mismatched, 0u) << "the GPU mask differs from the CPU's";
        if (p > 0) {
          EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.01);
        }
        Pair dy = in(), dx = out();
        ctx.gpu->dropout_backward(dx.g, dy.g, d);
        ctx.cpu->dropout_backward(dx.c, dy.c, d);
        expect_close(ctx, dx, tol, "dropout_backward");
      }
      {
        Pair a = in(), b = in(), y = out();
        ctx.gpu->add(y.g, a.g, b.g);
        ctx.cpu->add(y.c, a.c, b.c);
        expect_close(ctx, y, tol, "add");
      }
    }
}

// The model runs these in place: tanh(pooled) into pooled, dI = gelu'(pre) * dI, hd1 through
// dropout and tanh backward.
TEST(CudaOps, ElementwiseInPlace) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  const int64_t n = 40001;
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = tol_for(dt);
    const DropoutSpec d{0.1f, 7, 3};
    Pair x = ctx.input(dt, Shape{n}), y = ctx.input(dt, Shape{n}, 0.5f), g = ctx.input(dt, Shape{n});
    ctx.gpu->tanh_forward(x.g, x.g);
    ctx.cpu->tanh_forward(x.c, x.c);
    expect_close(ctx, x, tol, "tanh in place");
    ctx.gpu->gelu_backward(g.g, g.g, y.g);
    ctx.cpu->gelu_backward(g.c, g.c, y.c);
    expect_close(ctx, g, tol, "gelu_backward in place");
    ctx.gpu->dropout_backward(g.g, g.g, d);
    ctx.cpu->dropout_backward(g.c, g.c, d);
    expect_close(ctx, g, tol, "dropout_backward in place");
    ctx.gpu->tanh_backward(g.g, g.g, y.g);
    ctx.cpu->tanh_backward(g.c, g.c, y.c);
    expect_close(ctx, g, tol, "tanh_backward in place");
  }
}

// The embeddings' LayerNorm: branch and sum are one tensor, no residual, no dropout.
TEST(CudaOps, LayerNormForwardInPlaceSum) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (int64_t h : {1024, 100}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " H " + std::to_string(h));
      const int64_t rows = 33;
      Pair e = ctx.input(dt, Shape{rows, h}), gamma = ctx.input(dt, Shape{h}), beta = ctx.input(dt, Shape{h});
      Pair y = ctx.output(dt, Shape{rows, h});
      Pair mean = ctx.output(DType::F32, Shape{rows}), rstd = ctx.output(DType::F32, Shape{rows});
      ctx.gpu->layernorm_forward(y.g, e.g, mean.g, rstd.g, e.g, Tensor{}, gamma.g, beta.g, 1e-12f, {});
      ctx.cpu->layernorm_forward(y.c, e.c, mean.c, rstd.c, e.c, Tensor{}, gamma.c, beta.c, 1e-12f, {});
      expect_close(ctx, e, tol_for(dt), "sum");
      expect_close(ctx, y, tol_for(dt), "y");
    }
}

TEST(CudaOps, CastIsRoundToNearestEvenLikeTheHost) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  const int64_t n = 4099;
  std::vector<float> v = ctx.randn(n, 100.0f);
  v[0] = 0.0f, v[1] = -0.0f, v[2] = 1e-30f, v[3] = 70000.0f, v[4] = -1e-6f;  // zeros, subnormal/overflow in f16
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      Tensor src = ctx.device(from, Shape{n}), dst = ctx.device(to, Shape{n});
      std::vector<float> src_values(n);
      for (int64_t i = 0; i < n; ++i) src_values[i] = round_to(v[i], from);
      ctx.put(src, src_values);
      ctx.put(dst, std::vector<float>(n, kNaN));
      ctx.gpu->cast(dst, src);
      const std::vector<float> got = ctx.get(dst);
      size_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = round_to(src_values[i], to);
        wrong += std::memcmp(&got[i], &want, 4) != 0;
      }
      EXPECT_EQ(wrong, 0u);
    }
}

TEST(CudaOps, FillAndCopy) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes) {
    Tensor t = ctx.device(dt, Shape{1001});
    ctx.put(t, std::vector<float>(1001, kNaN));
    ctx.gpu->fill(t, 0.3f);
    for (float x : ctx.get(t)) ASSERT_EQ(x, round_to(0.3f, dt));
    Tensor u = ctx.device(dt, Shape{1001});
    ctx.gpu->copy(u, t);
    for (float x : ctx.get(u)) ASSERT_EQ(x, round_to(0.3f, dt));
    // Zero (a memset) and negative zero (the kernel) write every element with its sign.
    for (float z : {0.0f, -0.0f}) {
      ctx.put(t, std::vector<float>(1001, kNaN));
      ctx.gpu->fill(t, z);
      for (float x : ctx.get(t)) ASSERT_TRUE(x == 0.0f && std::signbit(x) == std::signbit(z)) << x;
    }
  }
  Tensor ti = ctx.device(DType::I32, Shape{77});
  ctx.gpu->fill(ti, 7.0f);
  std::vector<int32_t> hi(77);
  ctx.gpu->download(hi.data(), ti);
  for (int32_t x : hi) ASSERT_EQ(x, 7);
  ctx.gpu->fill(ti, 0.0f);
  ctx.gpu->download(hi.data(), ti);
  for (int32_t x : hi) ASSERT_EQ(x, 0);
}

TEST(CudaOps, SelectToken) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (DType dt : kFloatTypes)
    for (int64_t t : {0, 5}) {
      const int64_t b = 3, seq = 7, h = 24;
      Pair x = ctx.input(dt, Shape{b, seq, h}), out = ctx.output(dt, Shape{b, h});
      ctx.gpu->select_token(out.g, x.g, t);
      ctx.cpu->select_token(out.c, x.c, t);
      expect_close(ctx, out, 1e-12, "select_token");  // a copy: exact
      Pair dout = ctx.input(dt, Shape{b, h}), dx = ctx.output(dt, Shape{b, seq, h});
      ctx.gpu->select_token_backward(dx.g, dout.g, t);
      ctx.cpu->select_token_backward(dx.c, dout.c, t);
      expect_close(ctx, dx, 1e-12, "select_token_backward");
    }
}

// ---- optimizer ------------------------------------------------------------------------------------

// Both backends through GradNorm: partials within F32 tolerance of the CPU's double sums, the
// GPU deterministic (the same bits twice) and independent of how the buffer is split into
// block-aligned ranges (Note [canonical gradient norm]).
TEST(CudaOps, GradientNormBlocks) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (int64_t n : {int64_t{1}, int64_t{kNormBlock}, int64_t{1000003}}) {
    Pair x = ctx.input(DType::F32, Shape{n});
    GradNorm gpu(*ctx.gpu, static_cast<size_t>(n)), cpu(*ctx.cpu, static_cast<size_t>(n));
    gpu.compute(x.g);
    cpu.compute(x.c);
    const std::string what = "gradient norm n " + std::to_string(n);
    expect_close(ctx.get(gpu.partials()), Ctx::host_values(cpu.partials()), kTolF32, what + " partials");
    const float first = ctx.get(gpu.norm_sq())[0];
    EXPECT_NEAR(first, Ctx::host_values(cpu.norm_sq())[0], kTolF32 * first) << what;
    gpu.compute(x.g);
    EXPECT_EQ(ctx.get(gpu.norm_sq())[0], first) << what << ": run to run";
    if (n > kNormBlock) {  // two ranges, partials added as an all-reduce would
      const size_t cut = static_cast<size_t>(kNormBlock);
      GradNorm lo(*ctx.gpu, static_cast<size_t>(n));
      lo.compute_range(x.g, 0, cut);
      gpu.compute_range(x.g, cut, static_cast<size_t>(n));
      ctx.gpu->add(gpu.partials(), gpu.partials(), lo.partials());
      gpu.finish();
      EXPECT_EQ(ctx.get(gpu.norm_sq())[0], first) << what << ": split at one block";
    }
  }
}

// The fp16 overflow check relies on inf/NaN gradients reaching the norm unfiltered.
TEST(CudaOps, GradientNormPropagatesInfAndNaN) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  const int64_t n = 50001;
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), kNaN}) {
    std::vector<float> v = ctx.randn(n);
    v[static_cast<size_t>(ctx.randint(0, n))] = bad;
    Tensor x = ctx.device(DType::F32, Shape{n});
    ctx.put(x, v);
    GradNorm norm(*ctx.gpu, static_cast<size_t>(n));
    norm.compute(x);
    const float s = ctx.get(norm.norm_sq())[0];
    if (std::isnan(bad))
      EXPECT_TRUE(std::isnan(s)) << s;
    else
      EXPECT_TRUE(std::isinf(s) && s > 0) << s;
  }
}

struct OptimState {
  Pair params, grads, m, v, half;
  std::unique_ptr<GradNorm> norm_gpu, norm_cpu;
};

OptimState make_optim_state(Ctx& ctx, int64_t n, float grad_scale) {
  OptimState s;
  s.params = ctx.input(DType::F32, Shape{n}, 0.05f);
  s.grads = ctx.input(DType::F32, Shape{n}, grad_scale);
  s.m = ctx.input(DType::F32, Shape{n}, 0.0f);
  s.v = ctx.input(DType::F32, Shape{n}, 0.0f);
  s.half = ctx.output(DType::BF16, Shape{n});
  return s;
}

// norm_sq computed by each backend from its own grads, as the trainer does.
GradTransform grad_transform(Ctx& ctx, OptimState& s, bool gpu, float inv_loss_scale, float max_norm) {
  Backend& be = gpu ? *ctx.gpu : *ctx.cpu;
  const Tensor& grads = gpu ? s.grads.g : s.grads.c;
  auto& norm = gpu ? s.norm_gpu : s.norm_cpu;
  norm = std::make_unique<GradNorm>(be, grads.numel());
  norm->compute(grads);
  GradTransform g;
  g.norm_sq = norm->norm_sq();
  g.inv_loss_scale = inv_loss_scale;
  g.max_norm = max_norm;
  return g;
}

TEST(CudaOps, AdamWWithClippingAndLossScale) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (float max_norm : {1.0f, 0.0f, 1e6f})  // clipping active; off; on but inactive
    for (int64_t n : {int64_t{100003}, int64_t{64}}) {
      SCOPED_TRACE("max_norm " + std::to_string(max_norm) + " n " + std::to_string(n));
      const float loss_scale = 1024.0f;
      OptimState s = make_optim_state(ctx, n, loss_scale);
      AdamWArgs a;
      a.lr = 1e-3f, a.weight_decay = 0.01f;
      for (int64_t step = 1; step <= 3; ++step) {  // moments evolve over steps
        a.step = step;
        const GradTransform gg = grad_transform(ctx, s, true, 1.0f / loss_scale, max_norm);
        const GradTransform gc = grad_transform(ctx, s, false, 1.0f / loss_scale, max_norm);
        ctx.gpu->adamw_update(s.params.g, s.m.g, s.v.g, s.half.g, s.grads.g, gg, a);
        ctx.cpu->adamw_update(s.params.c, s.m.c, s.v.c, Tensor{}, s.grads.c, gc, a);
      }
      expect_close(ctx, s.params, kTolF32, "params");
      expect_close(ctx, s.m, kTolF32, "m");
      expect_close(ctx, s.v, kTolF32, "v");
      std::vector<float> half_ref = Ctx::host_values(s.params.c);
      for (auto& x : half_ref) x = round_to(x, DType::BF16);
      expect_close(ctx.get(s.half.g), half_ref, kTolHalf, "half_copy");
    }
}

TEST(CudaOps, SgdWithClipping) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  SCOPED_TRACE(ctx.trace());
  for (float momentum : {0.9f, 0.0f})
    for (bool nesterov : {false, true})
      for (float max_norm : {1.0f, 0.0f}) {
        SCOPED_TRACE("momentum " + std::to_string(momentum) + (nesterov ? " nesterov" : "") + " max_norm " +
                     std::to_string(max_norm));
        const int64_t n = 100003;
        OptimState s = make_optim_state(ctx, n, 1.0f);
        SgdArgs a;
        a.lr = 1e-2f, a.momentum = momentum, a.weight_decay = 0.01f, a.nesterov = nesterov && momentum != 0;
        for (int step = 0; step < 3; ++step) {
          const GradTransform gg = grad_transform(ctx, s, true, 0.5f, max_norm);
          const GradTransform gc = grad_transform(ctx, s, false, 0.5f, max_norm);
          ctx.gpu->sgd_update(s.params.g, s.m.g, s.half.g, s.grads.g, gg, a);
          ctx.cpu->sgd_update(s.params.c, s.m.c, Tensor{}, s.grads.c, gc, a);
        }
        expect_close(ctx, s.params, kTolF32, "params");
        if (momentum != 0) expect_close(ctx, s.m, kTolF32, "momentum");
        std::vector<float> half_ref = Ctx::host_values(s.params.c);
        for (auto& x : half_ref) x = round_to(x, DType::BF16);
        expect_close(ctx.get(s.half.g), half_ref, kTolHalf, "half_copy");
      }
}

// ---- memory ---------------------------------------------------------------------------------------

TEST(CudaOps, OutOfMemoryIsAnErrorNamingCategories) {
  if (!anatomy::cuda_available()) GTEST_SKIP() << "no CUDA device";
  Ctx ctx;
  const cuda::DeviceMemory mem = cuda::CudaBackend::memory_info();
  ASSERT_GT(mem.total, 0u);
  ASSERT_LE(mem.free, mem.total);
  try {
    Buffer huge(ctx.gpu->allocator(), DType::U8, Shape{static_cast<int64_t>(mem.total) * 2}, Category::Activations);
    FAIL() << "allocating twice the device's memory succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("workspace"), std::string::npos) << msg;  // the table of what is allocated
    EXPECT_NE(msg.find("MiB free"), std::string::npos) << msg;
  }
  // The failed cudaMalloc left no sticky error: the backend still works.
  Pair x = ctx.input(DType::F32, Shape{1000}), y = ctx.output(DType::F32, Shape{1000});
  ctx.gpu->gelu_forward(y.g, x.g);
  ctx.cpu->gelu_forward(y.c, x.c);
  ctx.gpu->synchronize();
  expect_close(ctx, y, kTolF32, "gelu after OOM");
}

}  // namespace
