// Fused attention (ops/cuda/attention.h) against a host double-precision reference.
// Fresh random inputs per case, outputs poisoned with NaN before each run, padding masks
// with padded and interior-masked keys, a batch whose keys are all masked, with and without
// dropout, F32 (cuBLAS path, plain and TF32) / BF16 / F16 (flash path), and the reference kernels;
// local windows (Note [local attention window], ops/cpu/attention.cpp) on the flash path with
// masks that leave some queries' windows all padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/backend_memory.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/attention.h"

namespace {

using anatomy::DropoutSpec;
using anatomy::DType;
using anatomy::Shape;
using anatomy::Tensor;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const void* h) { cuda_ok(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice), "upload"); }
  void download(void* h) const { cuda_ok(cudaMemcpy(h, p, n, cudaMemcpyDeviceToHost), "download"); }
  void poison() { cuda_ok(cudaMemset(p, 0xff, n), "poison"); }  // NaN in F32, BF16 and F16
};

// Host encode/decode of the compute dtypes.
std::vector<uint8_t> encode(const std::vector<float>& x, DType dt) {
  std::vector<uint8_t> out(x.size() * anatomy::dtype_size(dt));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else {
      uint16_t h = dt == DType::BF16 ? anatomy::f32_to_bf16(x[i]) : anatomy::f32_to_f16(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType dt) {
  const size_t es = anatomy::dtype_size(dt);
  std::vector<float> out(b.size() / es);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = dt == DType::BF16 ? anatomy::bf16_to_f32(h) : anatomy::f16_to_f32(h);
    }
  }
  return out;
}
// Values exactly representable in dt (so the reference sees what the device sees).
std::vector<float> random_values(size_t n, float amp, DType dt, anatomy::Rng& rng) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * amp);
  return decode(encode(v, dt), dt);
}

// Gaps (for windows): per batch in turn, a masked run of 2*window + 4 keys from T/4 (keys on
// both sides stay valid), right padding to a random length in [1, T/2], random holes, and
// (batch 3) every key masked. Queries in the middle of the run, and those past the padding
// by more than the window, see no valid key.
enum class MaskKind { None, Padded, AllMaskedBatch, Gaps };

struct Case {
  int B, T, heads, D;
  DType dt;
  float p;
  MaskKind mask = MaskKind::Padded;
  bool tf32 = false;  // F32 cuBLAS path with TF32 allowed
  int window = 0;     // > 0: local attention window
};

std::string describe(const Case& c) {
  char buf[176];
  std::snprintf(buf, sizeof buf, "B=%d T=%d heads=%d D=%d %s%s p=%.2f mask=%d window=%d", c.B, c.T, c.heads, c.D,
                std::string(anatomy::dtype_name(c.dt)).c_str(), c.tf32 ? "(tf32)" : "", c.p, static_cast<int>(c.mask),
                c.window);
  return buf;
}

std::vector<int32_t> make_mask(const Case& c, anatomy::Rng& rng) {
  std::vector<int32_t> m(static_cast<size_t>(c.B) * c.T, 1);
  if (c.mask == MaskKind::None) return m;
  if (c.mask == MaskKind::Gaps) {
    for (int b = 0; b < c.B; ++b) {
      int32_t* row = &m[static_cast<size_t>(b) * c.T];
      if (b % 4 == 0) {
        const int start = c.T / 4, end = std::min(start + 2 * c.window + 4, c.T - 1);
        for (int k = start; k < end; ++k) row[k] = 0;
      } else if (b % 4 == 1) {
        const int len = 1 + static_cast<int>(rng.randint(0, c.T / 2));
        for (int k = len; k < c.T; ++k) row[k] = 0;
      } else if (b % 4 == 2) {
        for (int k = 0; k < c.T; ++k)
          if (rng.uniform() < 0.25) row[k] = 0;
      } else {
        for (int k = 0; k < c.T; ++k) row[k] = 0;
      }
    }
    return m;
  }
  for (int b = 0; b < c.B; ++b) {
    int32_t* row = &m[static_cast<size_t>(b) * c.T];
    if (b % 2 == 1) {  // right padding of a random length (at least one valid key)
      int len = 1 + static_cast<int>(rng.randint(0, c.T));
      for (int k = len; k < c.T; ++k) row[k] = 0;
    }
    if (b % 3 == 2)  // interior holes
      for (int k = 0; k < c.T; ++k)
        if (rng.uniform() < 0.25) row[k] = 0;
    if (c.mask == MaskKind::AllMaskedBatch && b == 0)
      for (int k = 0; k < c.T; ++k) row[k] = 0;
  }
  return m;
}

// Host reference for the (b, h) pairs in `sel`; entries of other pairs are left NaN.
struct Reference {
  std::vector<double> ctx, lse, dqkv;
};

// The backward's Dsum = rowsum(dO o O) takes O as the op receives it (`ctx_in`, rounded to the
// kernel's dtype), as the kernels do: with one key a query, dS = P (dP - Dsum) is that rounding alone.
Reference reference(const Case& c, const std::vector<float>& qkv, const std::vector<int32_t>& mask,
                    const std::vector<float>& dctx, const DropoutSpec& d, const std::vector<std::pair<int, int>>& sel,
                    const std::vector<float>& ctx_in) {
  const int T = c.T, D = c.D, H = c.heads * c.D;
  const size_t rs = 3 * static_cast<size_t>(H);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const double nan = std::nan("");
  Reference r;
  r.ctx.assign(static_cast<size_t>(c.B) * T * H, nan);
  r.lse.assign(static_cast<size_t>(c.B) * c.heads * T, nan);
  r.dqkv.assign(static_cast<size_t>(c.B) * T * rs, nan);
  std::vector<double> P(static_cast<size_t>(T) * T), Z(static_cast<size_t>(T) * T), dS(static_cast<size_t>(T) * T);
  for (auto [b, h] : sel) {
    auto q = [&](int t, int i) { return static_cast<double>(qkv[(static_cast<size_t>(b) * T + t) * rs + h * D + i]); };
    auto k = [&](int t, int i) { return static_cast<double>(qkv[(static_cast<size_t>(b) * T + t) * rs + H + h * D + i]); };
    auto v = [&](int t, int i) { return static_cast<double>(qkv[(static_cast<size_t>(b) * T + t) * rs + 2 * H + h * D + i]); };
    auto dout = [&](int t, int i) { return static_cast<double>(dctx[(static_cast<size_t>(b) * T + t) * H + h * D + i]); };
    // Query qi keeps key kk when the mask does and, with a window, |qi - kk| <= window; a
    // query that keeps no key scores 0 against all T keys (uniform).
    auto keeps = [&](int qi, int kk) {
      if (c.window > 0 && std::abs(qi - kk) > c.window) return false;
      return mask[static_cast<size_t>(b) * T + kk] != 0;
    };
    for (int qi = 0; qi < T; ++qi) {
      bool any = false;
      for (int kk = 0; kk < T; ++kk) any |= keeps(qi, kk);
      std::vector<double> s(T);
      double mx = -INFINITY;
      for (int kk = 0; kk < T; ++kk) {
        if (keeps(qi, kk)) {
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += q(qi, i) * k(kk, i);
          s[kk] = dot * scale;
        } else {
          s[kk] = any ? -INFINITY : 0.0;
        }
        mx = std::max(mx, s[kk]);
      }
      double l = 0;
      for (int kk = 0; kk < T; ++kk) l += std::exp(s[kk] - mx);
      const double lse = mx + std::log(l);
      r.lse[(static_cast<size_t>(b) * c.heads + h) * T + qi] = lse;
      for (int kk = 0; kk < T; ++kk) {
        const size_t e = static_cast<size_t>(qi) * T + kk;
        P[e] = std::exp(s[kk] - lse);
        Z[e] = 1.0;
        if (d.p > 0) {
          const uint64_t idx = anatomy::attention_dropout_index(static_cast<uint64_t>(b) * c.heads + h, qi, kk, T);
          Z[e] = anatomy::dropout_keep(d.seed, d.offset, idx, d.p) ? 1.0 / (1.0 - d.p) : 0.0;
        }
      }
      for (int i = 0; i < D; ++i) {
        double o = 0;
        for (int kk = 0; kk < T; ++kk) o += P[static_cast<size_t>(qi) * T + kk] * Z[static_cast<size_t>(qi) * T + kk] * v(kk, i);
        r.ctx[(static_cast<size_t>(b) * T + qi) * H + h * D + i] = o;
      }
    }
    // Backward.
    for (int qi = 0; qi < T; ++qi) {
      std::vector<double> dp(T);
      double dsum = 0;
      for (int kk = 0; kk < T; ++kk) {
        double dot = 0;
        for (int i = 0; i < D; ++i) dot += dout(qi, i) * v(kk, i);
        const size_t e = static_cast<size_t>(qi) * T + kk;
        dp[kk] = Z[e] * dot;
      }
      for (int i = 0; i < D; ++i) dsum += dout(qi, i) * ctx_in[(static_cast<size_t>(b) * T + qi) * H + h * D + i];
      for (int kk = 0; kk < T; ++kk) {
        const size_t e = static_cast<size_t>(qi) * T + kk;
        dS[e] = P[e] * (dp[kk] - dsum);
      }
    }
    for (int t = 0; t < T; ++t) {
      double* row = &r.dqkv[(static_cast<size_t>(b) * T + t) * rs + h * D];
      for (int i = 0; i < D; ++i) {
        double dq = 0, dk = 0, dv = 0;
        for (int u = 0; u < T; ++u) {
          dq += dS[static_cast<size_t>(t) * T + u] * k(u, i);
          dk += dS[static_cast<size_t>(u) * T + t] * q(u, i);
          dv += P[static_cast<size_t>(u) * T + t] * Z[static_cast<size_t>(u) * T + t] * dout(u, i);
        }
        row[i] = dq * scale;
        row[H + i] = dk * scale;
        row[2 * H + i] = dv;
      }
    }
  }
  return r;
}

// ||out - ref|| / ||ref|| over the entries where ref is defined (not NaN) and, if given,
// only those in the column range [c0, c1) of rows of width `width`. Non-finite out -> inf.
double rel_err(const std::vector<float>& out, const std::vector<double>& ref, size_t width = 0, size_t c0 = 0,
               size_t c1 = 0) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i])) continue;
    if (width) {
      size_t c = i % width;
      if (c < c0 || c >= c1) continue;
    }
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct EnvGuard {
  std::string name;
  EnvGuard(const char* n, const char* v) : name(n) {
    if (v) setenv(n, v, 1);
    else unsetenv(n);
  }
  ~EnvGuard() { unsetenv(name.c_str()); }
};

// Device buffers and tensors of one problem.
struct Problem {
  Case c;
  size_t H, n_qkv, n_ctx, n_lse;
  DevBuf qkv, ctx, lse, mask, dctx, dqkv, scratch, workspace;
  Problem(const Case& cs)
      : c(cs),
        H(static_cast<size_t>(cs.heads) * cs.D),
        n_qkv(static_cast<size_t>(cs.B) * cs.T * 3 * H),
        n_ctx(static_cast<size_t>(cs.B) * cs.T * H),
        n_lse(static_cast<size_t>(cs.B) * cs.heads * cs.T),
        qkv(n_qkv * anatomy::dtype_size(cs.dt)),
        ctx(n_ctx * anatomy::dtype_size(cs.dt)),
        lse(n_lse * 4),
        mask(static_cast<size_t>(cs.B) * cs.T * 4),
        dctx(n_ctx * anatomy::dtype_size(cs.dt)),
        dqkv(n_qkv * anatomy::dtype_size(cs.dt)),
        scratch(anatomy::cuda::attention_scratch_bytes(cs.B, cs.T, cs.heads, cs.D, cs.dt)),
        workspace(anatomy::kCudaLtWorkspaceBytes) {}  // what the backend lends the F32 path
  Tensor t_qkv() const { return Tensor(qkv.p, c.dt, Shape{c.B, c.T, static_cast<int64_t>(3 * H)}, anatomy::Device::CUDA); }
  Tensor t_ctx() const { return Tensor(ctx.p, c.dt, Shape{c.B, c.T, static_cast<int64_t>(H)}, anatomy::Device::CUDA); }
  Tensor t_dctx() const { return Tensor(dctx.p, c.dt, Shape{c.B, c.T, static_cast<int64_t>(H)}, anatomy::Device::CUDA); }
  Tensor t_dqkv() const { return Tensor(dqkv.p, c.dt, Shape{c.B, c.T, static_cast<int64_t>(3 * H)}, anatomy::Device::CUDA); }
  Tensor t_lse() const { return Tensor(lse.p, DType::F32, Shape{c.B, c.heads, c.T}, anatomy::Device::CUDA); }
  Tensor t_mask() const {
    if (c.mask == MaskKind::None) return Tensor();
    return Tensor(mask.p, DType::I32, Shape{c.B, c.T}, anatomy::Device::CUDA);
  }
  anatomy::cuda::AttentionOptions options() const {
    anatomy::cuda::AttentionOptions o;
    o.cublas_workspace = workspace.p;
    o.cublas_workspace_bytes = workspace.n;
    o.allow_tf32 = c.tf32;
    return o;
  }
  void forward(const DropoutSpec& d, int queries = 0) {
    anatomy::cuda::attention_forward(t_ctx(), t_lse(), t_qkv(), t_mask(), c.heads, d, scratch.p, nullptr, options(),
                                     {c.window, queries});
  }
  void backward(const DropoutSpec& d, int queries = 0) {
    anatomy::cuda::attention_backward(t_dqkv(), t_dctx(), t_qkv(), t_ctx(), t_lse(), t_mask(), c.heads, d,
                                      scratch.p, nullptr, options(), {c.window, queries});
  }
  struct Outputs {
    std::vector<float> ctx, lse, dqkv;
  };
  // Uploads the inputs, poisons the outputs and the scratch, runs forward and backward (on each
  // sequence's first `queries` queries: Note [attention scope]) and returns the outputs.
  Outputs run(const std::vector<float>& q, const std::vector<float>& dout, const std::vector<int32_t>& m,
              const DropoutSpec& d, int queries = 0) {
    qkv.upload(encode(q, c.dt).data());
    dctx.upload(encode(dout, c.dt).data());
    mask.upload(m.data());
    ctx.poison();
    lse.poison();
    dqkv.poison();
    scratch.poison();
    forward(d, queries);
    backward(d, queries);
    cuda_ok(cudaDeviceSynchronize(), "attention kernels");
    std::vector<uint8_t> ctx_b(ctx.n), dqkv_b(dqkv.n);
    Outputs o{{}, std::vector<float>(n_lse), {}};
    ctx.download(ctx_b.data());
    dqkv.download(dqkv_b.data());
    lse.download(o.lse.data());
    o.ctx = decode(ctx_b, c.dt);
    o.dqkv = decode(dqkv_b, c.dt);
    return o;
  }
};

// Runs forward + backward on fresh inputs and compares with the reference on `sel` (all
// (b, h) pairs when empty).
void check_case(const Case& c, uint64_t seed, std::vector<std::pair<int, int>> sel = {}) {
  SCOPED_TRACE(describe(c));
  anatomy::Rng rng(seed);
  Problem pr(c);
  const float amp = 2.5f;
  std::vector<float> qkv = random_values(pr.n_qkv, amp, c.dt, rng);
  std::vector<float> dctx = random_values(pr.n_ctx, 1.0f, c.dt, rng);
  std::vector<int32_t> mask = make_mask(c, rng);
  DropoutSpec d;
  d.p = c.p;
  d.seed = rng.next();
  d.offset = rng.next() % 100000;
  const auto [ctx, lse, dqkv] = pr.run(qkv, dctx, mask, d);

  // Every element written, not just the checked ones.
  for (float x : ctx) ASSERT_TRUE(std::isfinite(x)) << "ctx has a non-finite element";
  for (float x : lse) ASSERT_TRUE(std::isfinite(x)) << "lse has a non-finite element";
  for (float x : dqkv) ASSERT_TRUE(std::isfinite(x)) << "dqkv has a non-finite element";

  if (sel.empty())
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.heads; ++h) sel.emplace_back(b, h);
  Reference ref = reference(c, qkv, mask, dctx, d, sel, ctx);
  const bool exact_f32 = c.dt == DType::F32 && !c.tf32;
  const double tol = exact_f32 ? 1e-5 : 1e-2;
  const size_t H = pr.H, W = 3 * H;
  const double e_ctx = rel_err(ctx, ref.ctx), e_lse = rel_err(lse, ref.lse);
  const double e_dq = rel_err(dqkv, ref.dqkv, W, 0, H), e_dk = rel_err(dqkv, ref.dqkv, W, H, 2 * H),
               e_dv = rel_err(dqkv, ref.dqkv, W, 2 * H, 3 * H);
  std::printf("  %-56s ctx %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", describe(c).c_str(), e_ctx, e_lse, e_dq, e_dk,
              e_dv);
  EXPECT_LT(e_ctx, tol);
  EXPECT_LT(e_lse, exact_f32 ? 1e-5 : 1e-3);
  EXPECT_LT(e_dq, tol);
  EXPECT_LT(e_dk, tol);
  EXPECT_LT(e_dv, tol);

  // A window up to T = 128: ctx, lse and dV against the CPU twin as well (ops/cpu/attention.cpp,
  // in double). Its dQ and dK take no share from uniform rows (their scores are constants there),
  // where the reference kernels, the fast path and the reference above pass dS through as
  // autograd does through Hugging Face's added mask; so those two are checked above only.
  if (c.window > 0 && c.T <= 128) {
    std::vector<double> q64(qkv.begin(), qkv.end()), d64(dctx.begin(), dctx.end());
    std::vector<double> t_ctx(pr.n_ctx), t_lse(pr.n_lse), t_dqkv(pr.n_qkv);
    anatomy::ref::attention_forward<double>(t_ctx.data(), t_lse.data(), q64.data(), mask.data(), c.B, c.T,
                                            static_cast<int64_t>(H), c.heads, d, c.window);
    anatomy::ref::attention_backward<double>(t_dqkv.data(), d64.data(), q64.data(), t_ctx.data(), t_lse.data(),
                                             mask.data(), c.B, c.T, static_cast<int64_t>(H), c.heads, d, c.window);
    const double t_e_ctx = rel_err(ctx, t_ctx), t_e_lse = rel_err(lse, t_lse),
                 t_e_dv = rel_err(dqkv, t_dqkv, W, 2 * H, 3 * H);
    std::printf("  %-56s vs the CPU twin: ctx %.2e lse %.2e dv %.2e\n", "", t_e_ctx, t_e_lse, t_e_dv);
    EXPECT_LT(t_e_ctx, tol);
    EXPECT_LT(t_e_lse, 1e-3);
    EXPECT_LT(t_e_dv, tol);
  }
}

uint64_t test_seed() {
  static uint64_t s = 0x5eed0000;
  return ++s;
}

// The default F32 path (cuBLAS GEMMs + row kernels): several T (odd, tile-sized, bert-sized),
// head dims 64 / 32 / odd, padding masks and a batch with every key masked, dropout 0 and 0.1.
TEST(Attention, Fp32CublasPath) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f}) {
    for (MaskKind mk : {MaskKind::Padded, MaskKind::AllMaskedBatch}) {
      check_case({3, 33, 2, 64, DType::F32, p, mk}, test_seed());
      check_case({3, 128, 3, 32, DType::F32, p, mk}, test_seed());
      check_case({3, 512, 2, 64, DType::F32, p, mk}, test_seed(), {{0, 0}, {1, 1}, {2, 0}});
    }
    check_case({2, 77, 2, 128, DType::F32, p}, test_seed());
    check_case({2, 45, 2, 40, DType::F32, p}, test_seed());
    check_case({2, 50, 3, 33, DType::F32, p}, test_seed());  // odd head dim: unaligned operands
    check_case({2, 96, 2, 64, DType::F32, p, MaskKind::None}, test_seed());
  }
}

// TF32 allowed (--precision tf32): the same path with CUBLAS_COMPUTE_32F_FAST_TF32, checked at
// the half-precision tolerance.
TEST(Attention, Fp32CublasPathTf32) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f}) {
    check_case({3, 128, 2, 64, DType::F32, p, MaskKind::AllMaskedBatch, true}, test_seed());
    check_case({2, 512, 2, 64, DType::F32, p, MaskKind::Padded, true}, test_seed());
  }
}

TEST(Attention, Fp32ReferenceKernels) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  EnvGuard g("ANATOMY_ATTENTION", "reference");
  check_case({3, 70, 2, 64, DType::F32, 0.1f, MaskKind::AllMaskedBatch}, test_seed());
  for (float p : {0.0f, 0.1f}) {
    check_case({2, 77, 2, 64, DType::F32, p}, test_seed());
    check_case({3, 128, 3, 32, DType::F32, p}, test_seed());
    check_case({1, 200, 2, 128, DType::F32, p}, test_seed());
    check_case({2, 45, 2, 40, DType::F32, p}, test_seed());
  }
}

TEST(Attention, Bf16FastPath) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* mt : {"wgmma", "mma", "mma64"}) {
    EnvGuard g("ANATOMY_ATTENTION_FWD", mt);
    for (float p : {0.0f, 0.1f}) {
      check_case({2, 100, 2, 64, DType::BF16, p}, test_seed());
      check_case({3, 256, 2, 64, DType::BF16, p}, test_seed());
      check_case({1, 512, 2, 64, DType::BF16, p}, test_seed());
      check_case({2, 33, 3, 64, DType::BF16, p}, test_seed());
      // Head dims 32 (MiniLM) and 128: their own swizzle (D = 32) and tiles (D = 128).
      check_case({2, 100, 4, 32, DType::BF16, p}, test_seed());
      check_case({2, 257, 2, 32, DType::BF16, p, MaskKind::AllMaskedBatch}, test_seed());
      check_case({2, 130, 2, 128, DType::BF16, p}, test_seed());
    }
  }
}

TEST(Attention, Fp16FastPath) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* fwd : {"wgmma", "mma"}) {
    EnvGuard g("ANATOMY_ATTENTION_FWD", fwd);
    for (float p : {0.0f, 0.1f}) {
      check_case({2, 100, 2, 64, DType::F16, p}, test_seed());
      check_case({2, 384, 2, 64, DType::F16, p}, test_seed());
      check_case({2, 200, 3, 32, DType::F16, p}, test_seed());
      check_case({1, 130, 2, 128, DType::F16, p}, test_seed());
    }
  }
}

// The kernel family of the wgmma paths on this device: "wgmma" on Hopper with an sm_90a build,
// else "mma".
static std::string hopper_family() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
#if defined(ANATOMY_WITH_SM90A)
  return major == 9 && minor == 0 ? "wgmma" : "mma";
#else
  return "mma";
#endif
}

// The wgmma kernels' cases: one key tile and many, T odd, key padding, gaps in the mask, a fully
// masked batch, no mask; bf16 and fp16, head dims 32 and 64, dropout 0 and 0.1.
static void check_wgmma_cases() {
  for (float p : {0.0f, 0.1f}) {
    check_case({2, 100, 2, 64, DType::BF16, p}, test_seed());
    check_case({1, 512, 3, 64, DType::BF16, p}, test_seed());
    check_case({3, 77, 2, 64, DType::F16, p, MaskKind::Gaps}, test_seed());
    check_case({2, 257, 2, 32, DType::BF16, p, MaskKind::AllMaskedBatch}, test_seed());
    check_case({2, 130, 4, 32, DType::F16, p, MaskKind::None}, test_seed());
    check_case({2, 200, 2, 64, DType::BF16, p, MaskKind::Padded}, test_seed());
    check_case({3, 33, 2, 64, DType::BF16, p}, test_seed());  // odd T: tiles start at any row
    // 16 key tiles: every stage's barriers go through more than two phases (4 stages).
    check_case({1, 1000, 2, 64, DType::BF16, p}, test_seed());
  }
}

// check_wgmma_cases under each (variable, value) in turn; no call may fall back from TMA tiles.
static void check_wgmma_variants(std::initializer_list<std::pair<const char*, const char*>> variants) {
  const int64_t fallbacks = anatomy::cuda::attention_tma_fallbacks();
  for (const auto& [var, value] : variants) {
    EnvGuard g(var, value);
    SCOPED_TRACE(std::string(var) + "=" + value);
    check_wgmma_cases();
  }
  EXPECT_EQ(anatomy::cuda::attention_tma_fallbacks(), fallbacks) << "TMA tiles fell back to cp.async";
}

// The wgmma forward (Note [wgmma forward]) is what Hopper runs for head dims 32 and 64 without a
// window, with and without its overlap of softmax and P V, its key tiles by TMA or cp.async.
TEST(Attention, HopperTakesTheWgmmaForward) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string hopper = hopper_family();
  using anatomy::cuda::attention_forward_kernel;
  EXPECT_EQ(attention_forward_kernel(DType::BF16, 64, 0), hopper);
  EXPECT_EQ(attention_forward_kernel(DType::F16, 64, 0), hopper);
  EXPECT_EQ(attention_forward_kernel(DType::BF16, 32, 0), hopper);
  EXPECT_EQ(attention_forward_kernel(DType::BF16, 128, 0), std::string("mma"));
  EXPECT_EQ(attention_forward_kernel(DType::BF16, 64, 64), std::string("mma"));
  EXPECT_EQ(attention_forward_kernel(DType::F32, 64, 0), std::string("gemm"));
  EXPECT_EQ(attention_forward_kernel(DType::BF16, 40, 0), std::string("reference"));
  {
    EnvGuard g("ANATOMY_ATTENTION_FWD", "mma");
    EXPECT_EQ(attention_forward_kernel(DType::BF16, 64, 0), std::string("mma"));
  }
  EnvGuard all("ANATOMY_ATTENTION_FWD", "wgmma");  // the default, named
  EXPECT_EQ(attention_forward_kernel(DType::F16, 32, 0), hopper);
  // The default (overlap, TMA key tiles two ahead), then each of its alternatives.
  check_wgmma_variants({{"ANATOMY_ATTENTION_WGMMA", "overlap"},
                        {"ANATOMY_ATTENTION_WGMMA", "sync"},
                        {"ANATOMY_ATTENTION_FWD_LOAD", "cp.async"},
                        {"ANATOMY_ATTENTION_FWD_AHEAD", "1"}});
}

// The wgmma backward (Note [wgmma backward]), Hopper's default at head dims 32 and 64 without a
// window, with two warpgroups a CTA (query tiles by TMA or cp.async; dQ by TMA reduces or by
// atomics; K and V from registers or shared memory) and one (wgmma64), and the mma.sync backward
// it replaces.
TEST(Attention, HopperWgmmaBackward) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string hopper = hopper_family();
  using anatomy::cuda::attention_backward_kernel;
  EXPECT_EQ(attention_backward_kernel(DType::BF16, 64, 0), hopper);
  EXPECT_EQ(attention_backward_kernel(DType::F16, 32, 0), hopper);
  EXPECT_EQ(attention_backward_kernel(DType::BF16, 128, 0), std::string("mma"));
  EXPECT_EQ(attention_backward_kernel(DType::BF16, 64, 64), std::string("mma"));
  {
    EnvGuard g("ANATOMY_ATTENTION_BWD", "mma");
    EXPECT_EQ(attention_backward_kernel(DType::BF16, 64, 0), std::string("mma"));
  }
  // Batch 0 fully masked, batch 1 one key long (this seed): dQ = dK = 0 up to rounding.
  check_case({2, 257, 2, 32, DType::BF16, 0.1f, MaskKind::AllMaskedBatch}, 0x5eed002c);
  // The default (two warpgroups, query tiles by TMA), then each of its alternatives.
  check_wgmma_variants({{"ANATOMY_ATTENTION_BWD", "wgmma"},
                        {"ANATOMY_ATTENTION_BWD_LOAD", "cp.async"},
                        {"ANATOMY_ATTENTION_BWD_DQ", "atomics"},
                        {"ANATOMY_ATTENTION_BWD_SCORES", "smem"},
                        {"ANATOMY_ATTENTION_BWD", "wgmma64"},
                        {"ANATOMY_ATTENTION_BWD", "mma"}});
}

// The default wgmma kernels (TMA tiles; the forward's warpgroups drift apart) again and again on
// fresh inputs: a race would show as a rare wrong tile, which one run may miss.
TEST(Attention, WgmmaRepeatsAgree) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  if (anatomy::cuda::attention_backward_kernel(DType::BF16, 64, 0) == std::string("mma")) GTEST_SKIP() << "no wgmma";
  for (int rep = 0; rep < 8; ++rep) {
    SCOPED_TRACE("repeat " + std::to_string(rep));
    check_case({2, 257, 2, 32, DType::BF16, 0.1f, MaskKind::AllMaskedBatch}, test_seed());
    check_case({2, 200, 2, 64, DType::BF16, 0.1f, MaskKind::Padded}, test_seed());
  }
}

// Note [attention scope] (ops/op_args.h): a scope of each sequence's first query. That query
// matches the CPU twin's full attention; every later one is either computed (the twin's value) or
// skipped (a zero context and an lse of +inf), and the wgmma forward skips the CTAs past the first
// 128 queries; with dctx zero past the first query the backward equals the twin's full backward.
// Head dims 64 (wgmma both ways), 32 (mma.sync forward, wgmma backward) and 128 (mma.sync both),
// and the wgmma forward before the mma.sync backward.
void check_first_query_scope(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  anatomy::Rng rng(seed);
  Problem pr(c);
  const size_t H = pr.H, W = 3 * H;
  const std::vector<float> qkv = random_values(pr.n_qkv, 2.5f, c.dt, rng);
  std::vector<float> dctx = random_values(pr.n_ctx, 1.0f, c.dt, rng);
  for (size_t r = 0; r < static_cast<size_t>(c.B) * c.T; ++r)
    if (r % c.T != 0) std::fill(dctx.begin() + r * H, dctx.begin() + (r + 1) * H, 0.0f);
  const std::vector<int32_t> mask = make_mask(c, rng);
  DropoutSpec d;
  d.p = c.p;
  d.seed = rng.next();
  const auto [ctx, lse, dqkv] = pr.run(qkv, dctx, mask, d, 1);

  // The CPU twin in double, every query (its backward then equals the scope's: dctx is zero past it).
  std::vector<double> q64(qkv.begin(), qkv.end()), d64(dctx.begin(), dctx.end());
  std::vector<double> t_ctx(pr.n_ctx), t_lse(pr.n_lse), t_dqkv(pr.n_qkv);
  anatomy::ref::attention_forward<double>(t_ctx.data(), t_lse.data(), q64.data(), mask.data(), c.B, c.T,
                                          static_cast<int64_t>(H), c.heads, d);
  anatomy::ref::attention_backward<double>(t_dqkv.data(), d64.data(), q64.data(), t_ctx.data(), t_lse.data(),
                                           mask.data(), c.B, c.T, static_cast<int64_t>(H), c.heads, d);
  // Per query row: the first ones and the computed later ones against the twin; count the skipped.
  const double nan = std::nan("");
  std::vector<double> first_ctx(pr.n_ctx, nan), later_ctx(pr.n_ctx, nan), first_lse(pr.n_lse, nan);
  int64_t skipped = 0, skipped_past_tile = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int q = 0; q < c.T; ++q) {
        const size_t li = (static_cast<size_t>(b) * c.heads + h) * c.T + q;
        const size_t c0 = (static_cast<size_t>(b) * c.T + q) * H + static_cast<size_t>(h) * c.D;
        const bool zero = std::all_of(ctx.begin() + c0, ctx.begin() + c0 + c.D, [](float x) { return x == 0.0f; });
        if (q > 0 && zero && lse[li] == INFINITY) {
          ++skipped;
          skipped_past_tile += q >= 128;
          continue;
        }
        ASSERT_TRUE(std::isfinite(lse[li])) << "query " << q << " neither computed nor skipped";
        std::copy(t_ctx.begin() + c0, t_ctx.begin() + c0 + c.D, (q == 0 ? first_ctx : later_ctx).begin() + c0);
        if (q == 0) first_lse[li] = t_lse[li];
      }
  for (float x : dqkv) ASSERT_TRUE(std::isfinite(x)) << "dqkv has a non-finite element";
  const double e_first = rel_err(ctx, first_ctx), e_lse = rel_err(lse, first_lse), e_later = rel_err(ctx, later_ctx);
  const double e_dq = rel_err(dqkv, t_dqkv, W, 0, H), e_dkv = rel_err(dqkv, t_dqkv, W, H, 3 * H);
  std::printf("  %-56s first ctx %.2e lse %.2e, later ctx %.2e, dq %.2e dk|dv %.2e, %lld skipped\n",
              describe(c).c_str(), e_first, e_lse, e_later, e_dq, e_dkv, static_cast<long long>(skipped));
  EXPECT_LT(e_first, 1e-2);
  EXPECT_LT(e_lse, 1e-3);
  EXPECT_LT(e_later, 1e-2);
  EXPECT_LT(e_dq, 1e-2);
  EXPECT_LT(e_dkv, 1e-2);
  // The wgmma forward skips every query past its first CTA's 128, and computes that CTA's.
  if (std::string(anatomy::cuda::attention_forward_kernel(c.dt, c.D, 0)) == "wgmma") {
    EXPECT_EQ(skipped_past_tile, static_cast<int64_t>(c.B) * c.heads * std::max(0, c.T - 128));
    EXPECT_EQ(skipped, skipped_past_tile);
  }
}

TEST(Attention, ScopeOfTheFirstQuery) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f})
    for (int D : {64, 32, 128}) {
      check_first_query_scope({3, 300, 2, D, DType::BF16, p}, test_seed());
      check_first_query_scope({2, 100, 2, D, DType::F16, p}, test_seed());
    }
  EnvGuard mma("ANATOMY_ATTENTION_BWD", "mma");
  check_first_query_scope({3, 300, 2, 64, DType::BF16, 0.1f}, test_seed());
}

TEST(Attention, HalfReferenceKernels) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  {
    EnvGuard g("ANATOMY_ATTENTION", "reference");
    for (float p : {0.0f, 0.1f}) {
      check_case({2, 100, 2, 64, DType::BF16, p}, test_seed());
      check_case({2, 100, 2, 64, DType::F16, p}, test_seed());
    }
  }
  // Head dims the fast path does not take (not 32, 64 or 128) fall back to the reference kernels.
  check_case({2, 90, 4, 40, DType::BF16, 0.1f}, test_seed());
  check_case({1, 130, 2, 96, DType::F16, 0.0f}, test_seed());
}

// Local windows on the flash path (ModernBERT's local layers): T odd / one tile / many tiles,
// windows narrower than a tile and as wide as one, head dims 32 and 64, Gaps masks (queries
// whose window is all padding, a fully masked batch), dropout 0 and 0.1; both forward tile
// heights for BF16.
void check_window_cases(DType dt, const std::vector<int>& seqs) {
  for (int T : seqs)
    for (int w : {2, 64})
      for (int D : {32, 64})
        for (float p : {0.0f, 0.1f}) {
          Case c{4, T, 2, D, dt, p, MaskKind::Gaps};
          c.window = w;
          std::vector<std::pair<int, int>> sel;
          if (T > 256) sel = {{0, 0}, {1, 1}, {2, 0}, {3, 1}};
          check_case(c, test_seed(), sel);
        }
}

TEST(Attention, Bf16WindowFastPath) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  check_window_cases(DType::BF16, {11, 128, 512});
  EnvGuard g("ANATOMY_ATTENTION_FWD", "mma64");
  check_window_cases(DType::BF16, {128, 512});
}

TEST(Attention, Fp16WindowFastPath) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  check_window_cases(DType::F16, {11, 128, 512});
}

// No mask (no uniform rows), head dim 128, a window past T (every key in every window), and the
// same windowed problems on the reference kernels and on F32 (reference kernels too).
TEST(Attention, WindowOtherShapesAndPaths) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (float p : {0.0f, 0.1f}) {
    Case c{2, 300, 2, 64, DType::BF16, p, MaskKind::None};
    c.window = 64;
    check_case(c, test_seed());
    Case d{2, 200, 2, 128, DType::F16, p, MaskKind::Gaps};
    d.window = 40;
    check_case(d, test_seed());
    Case e{4, 90, 2, 64, DType::BF16, p, MaskKind::Gaps};
    e.window = 1000;
    check_case(e, test_seed());
    Case f{4, 130, 2, 64, DType::F32, p, MaskKind::Gaps};
    f.window = 5;
    check_case(f, test_seed());
    EnvGuard g("ANATOMY_ATTENTION", "reference");
    Case r{4, 130, 2, 64, DType::BF16, p, MaskKind::Gaps};
    r.window = 5;
    check_case(r, test_seed());
  }
}

TEST(Attention, NoMask) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  Case c{2, 96, 2, 64, DType::F32, 0.0f, MaskKind::None};
  check_case(c, test_seed());
  c.dt = DType::BF16;
  check_case(c, test_seed());
}

TEST(Attention, AllMaskedBatchIsUniformNotNaN) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (float p : {0.0f, 0.1f}) check_case({3, 70, 2, 64, dt, p, MaskKind::AllMaskedBatch}, test_seed());
  EnvGuard g("ANATOMY_ATTENTION", "reference");
  check_case({3, 70, 2, 64, DType::BF16, 0.1f, MaskKind::AllMaskedBatch}, test_seed());
}

TEST(Attention, RejectsHeadDimsBeyondTheKernels) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  // The kernels' own limit; shapes, dtypes and the dropout probability are the contract's
  // (tests/common/contract_misuses.h, the same words on every backend).
  Case c{1, 16, 2, 256, DType::F32, 0.0f};  // head_dim 256 is not supported
  Problem pr(c);
  EXPECT_THROW(pr.forward(DropoutSpec{}), anatomy::Error);
}

// Median forward and backward times (ms) over `iters` runs after 3 warm-up runs, with events.
std::pair<double, double> time_fwd_bwd(Problem& pr, const DropoutSpec& d, int iters) {
  cudaEvent_t e0, e1, e2;
  cuda_ok(cudaEventCreate(&e0), "event");
  cuda_ok(cudaEventCreate(&e1), "event");
  cuda_ok(cudaEventCreate(&e2), "event");
  for (int i = 0; i < 3; ++i) {
    pr.forward(d);
    pr.backward(d);
  }
  std::vector<float> tf, tb;
  for (int i = 0; i < iters; ++i) {
    cuda_ok(cudaEventRecord(e0), "record");
    pr.forward(d);
    cuda_ok(cudaEventRecord(e1), "record");
    pr.backward(d);
    cuda_ok(cudaEventRecord(e2), "record");
    cuda_ok(cudaEventSynchronize(e2), "sync");
    float a, b;
    cuda_ok(cudaEventElapsedTime(&a, e0, e1), "elapsed");
    cuda_ok(cudaEventElapsedTime(&b, e1, e2), "elapsed");
    tf.push_back(a);
    tb.push_back(b);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaEventDestroy(e2);
  std::sort(tf.begin(), tf.end());
  std::sort(tb.begin(), tb.end());
  return {tf[tf.size() / 2], tb[tb.size() / 2]};
}

// Fresh random qkv / dctx and an all-ones mask for timing.
void fill_for_bench(Problem& pr, uint64_t seed) {
  anatomy::Rng rng(seed);
  pr.qkv.upload(encode(random_values(pr.n_qkv, 2.5f, pr.c.dt, rng), pr.c.dt).data());
  pr.dctx.upload(encode(random_values(pr.n_ctx, 1.0f, pr.c.dt, rng), pr.c.dt).data());
  std::vector<int32_t> mask(static_cast<size_t>(pr.c.B) * pr.c.T, 1);
  pr.mask.upload(mask.data());
}

// Times bert-large-shaped attention (B=32, T=512, heads=16, D=64) and prints TFLOP/s
// (forward 4*B*heads*T^2*D, backward 2.5x that). Asserts correctness on a few heads only.
TEST(AttentionBench, BertLarge) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const int B = 32, T = 512, heads = 16, D = 64;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (float p : {0.0f, 0.1f}) {
      for (const char* mt : {"wgmma", "mma", "mma64"}) {
        if (dt == DType::F16 && std::string(mt) == "mma64") continue;
        EnvGuard g("ANATOMY_ATTENTION_FWD", mt);
        Case c{B, T, heads, D, dt, p, MaskKind::Padded};
        check_case(c, test_seed(), {{0, 0}, {1, 7}, {B - 1, heads - 1}});
        Problem pr(c);
        fill_for_bench(pr, 7);
        DropoutSpec d;
        d.p = p;
        d.seed = 1234;
        const auto [mf, mb] = time_fwd_bwd(pr, d, 20);
        const double fl = 4.0 * B * heads * static_cast<double>(T) * T * D;
        std::printf("BENCH %s p=%.1f fwd=%s: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms %.1f TFLOP/s | fwd+bwd %.1f TFLOP/s\n",
                    std::string(anatomy::dtype_name(dt)).c_str(), p, mt, mf, fl / mf / 1e9, mb, 2.5 * fl / mb / 1e9,
                    3.5 * fl / (mf + mb) / 1e9);
      }
    }
  }
  // The F32 cuBLAS path (plain fp32, and with TF32 allowed), B = 4 (bert-large fp32 training)
  // and B = 32; correctness on a few heads first.
  for (int B2 : {4, 32}) {
    for (bool tf32 : {false, true}) {
      for (float p : {0.0f, 0.1f}) {
        Case c{B2, T, heads, D, DType::F32, p, MaskKind::Padded, tf32};
        check_case(c, test_seed(), {{0, 0}, {1, 7}, {B2 - 1, heads - 1}});
        Problem pr(c);
        fill_for_bench(pr, 9);
        DropoutSpec d;
        d.p = p;
        d.seed = 1234;
        const auto [mf, mb] = time_fwd_bwd(pr, d, 20);
        const double fl = 4.0 * B2 * heads * static_cast<double>(T) * T * D;
        std::printf("BENCH F32%s cublas B=%d p=%.1f: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms %.1f TFLOP/s | fwd+bwd %.1f TFLOP/s\n",
                    tf32 ? " (tf32)" : "", B2, p, mf, fl / mf / 1e9, mb, 2.5 * fl / mb / 1e9, 3.5 * fl / (mf + mb) / 1e9);
      }
    }
  }
  // The F32 reference kernels, for comparison.
  {
    EnvGuard g("ANATOMY_ATTENTION", "reference");
    Case c{4, T, heads, D, DType::F32, 0.1f, MaskKind::Padded};
    Problem pr(c);
    fill_for_bench(pr, 9);
    DropoutSpec d;
    d.p = c.p;
    const auto [mf, mb] = time_fwd_bwd(pr, d, 3);
    const double fl = 4.0 * c.B * heads * static_cast<double>(T) * T * D;
    std::printf("BENCH F32 reference B=%d p=0.1: fwd %.3f ms %.2f TFLOP/s | bwd %.3f ms %.2f TFLOP/s\n", c.B, mf,
                fl / mf / 1e9, mb, 2.5 * fl / mb / 1e9);
  }
}

}  // namespace
