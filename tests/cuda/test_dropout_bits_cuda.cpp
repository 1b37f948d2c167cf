// The GPU dropout masks against the CPU twin's function, bit for bit (Note [dropout bits] and
// Note [attention dropout index] in core/rng.h). Inputs are chosen so that the outputs spell
// the mask out: a tolerance-based comparison of values would let a few wrong mask bits pass.
//   attention: q = k = 0 makes every probability 1/T; v_k = 2^(k / 64) e_(k % 64) makes
//     ctx[q][d] = sum_j keep(q, d + 64 j) 2^j / (T (1 - p)), an integer of at most 4 bits per
//     output for T <= 256; dO_q = 2^(q / 64) e_(q % 64) does the same for dV (the backward's
//     mask); for the flash kernels (both forward tilings), the reference kernels and F32.
//   dropout / LayerNorm: ones through the op; the zero pattern is the mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/backend.h"

namespace {

using namespace anatomy;

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : m_name(name) {
    const char* old = std::getenv(name);
    m_had = old != nullptr;
    if (m_had) m_old = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvGuard() {
    if (m_had) setenv(m_name.c_str(), m_old.c_str(), 1);
    else unsetenv(m_name.c_str());
  }

 private:
  std::string m_name, m_old;
  bool m_had = false;
};

struct Dev {
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  std::vector<Buffer> bufs;
  Dev() { bufs.reserve(64); }
  Tensor make(DType dt, Shape s, const std::vector<float>* values = nullptr) {
    bufs.emplace_back(gpu->allocator(), dt, s, Category::Other);
    const Tensor t = bufs.back().tensor();
    std::vector<float> v = values ? *values : std::vector<float>(t.numel(), NAN);
    upload(t, v);
    return t;
  }
  void upload(const Tensor& t, const std::vector<float>& v) {
    std::vector<uint8_t> raw(t.bytes());
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.dtype == DType::F32) std::memcpy(&raw[4 * i], &v[i], 4);
      else if (t.dtype == DType::I32) {
        const int32_t x = static_cast<int32_t>(v[i]);
        std::memcpy(&raw[4 * i], &x, 4);
      } else {
        const uint16_t h = t.dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(&raw[2 * i], &h, 2);
      }
    }
    gpu->upload(t, raw.data());
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<uint8_t> raw(t.bytes());
    gpu->download(raw.data(), t);
    std::vector<float> out(t.numel());
    for (size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == DType::F32) std::memcpy(&out[i], &raw[4 * i], 4);
      else {
        uint16_t h;
        std::memcpy(&h, &raw[2 * i], 2);
        out[i] = t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return out;
  }
};

// The spelled-out mask of attention (see the file comment): returns the number of wrong bits.
int64_t attention_mask_errors(DType dt, int B, int T, int heads, const DropoutSpec& d) {
  Dev dev;
  const int D = 64, H = heads * D;
  std::vector<float> qkv(static_cast<size_t>(B) * T * 3 * H, 0.0f), dctx(static_cast<size_t>(B) * T * H, 0.0f);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h) {
        qkv[(static_cast<size_t>(b) * T + t) * 3 * H + 2 * H + h * D + t % 64] = std::ldexp(1.0f, t / 64);
        dctx[(static_cast<size_t>(b) * T + t) * H + h * D + t % 64] = std::ldexp(1.0f, t / 64);
      }
  const std::vector<float> ones(static_cast<size_t>(B) * T, 1.0f);
  const Tensor tq = dev.make(dt, {B, T, 3 * H}, &qkv), tmask = dev.make(DType::I32, {B, T}, &ones);
  const Tensor tctx = dev.make(dt, {B, T, H}), tlse = dev.make(DType::F32, {B, heads, T});
  const Tensor tdctx = dev.make(dt, {B, T, H}, &dctx), tdqkv = dev.make(dt, {B, T, 3 * H});
  dev.gpu->attention_forward(tctx, tlse, tq, tmask, heads, d);
  dev.gpu->attention_backward(tdqkv, tdctx, tq, tctx, tlse, tmask, heads, d);
  const std::vector<float> ctx = dev.get(tctx), dqkv = dev.get(tdqkv);
  const double unit = 1.0 / (T * (1.0 - d.p));
  int64_t errors = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h) {
      const uint64_t bh = static_cast<uint64_t>(b) * heads + h;
      auto keep = [&](int q, int k) {
        return dropout_keep(d.seed, d.offset, attention_dropout_index(bh, q, k, T), d.p);
      };
      for (int r = 0; r < T; ++r)
        for (int c = 0; c < 64; ++c) {
          int fwd = 0, bwd = 0;  // expected codes: row r of ctx, key r of dV
          for (int j = 0; c + 64 * j < T; ++j) {
            fwd += keep(r, c + 64 * j) << j;
            bwd += keep(c + 64 * j, r) << j;
          }
          const double got_f = ctx[(static_cast<size_t>(b) * T + r) * H + h * D + c] / unit;
          const double got_b = dqkv[(static_cast<size_t>(b) * T + r) * 3 * H + 2 * H + h * D + c] / unit;
          errors += std::lround(got_f) != fwd || std::fabs(got_f - fwd) > 0.25;
          errors += std::lround(got_b) != bwd || std::fabs(got_b - bwd) > 0.25;
        }
    }
  return errors;
}

}  // namespace

TEST(DropoutBitsCuda, AttentionMaskMatchesTheCpuFunction) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const DropoutSpec d{0.3f, 1234, 5678};
  for (int T : {64, 200, 255, 33}) {
    for (const char* mt : {"wgmma", "mma", "mma64"}) {
      EnvGuard g("ANATOMY_ATTENTION_FWD", mt);
      SCOPED_TRACE("bf16 flash T " + std::to_string(T) + " fwd " + mt);
      EXPECT_EQ(attention_mask_errors(DType::BF16, 2, T, 2, d), 0);
    }
    {
      SCOPED_TRACE("f16 flash T " + std::to_string(T));
      EXPECT_EQ(attention_mask_errors(DType::F16, 1, T, 3, d), 0);
    }
    {
      EnvGuard g("ANATOMY_ATTENTION_BWD", "mma");
      SCOPED_TRACE("bf16 mma.sync backward T " + std::to_string(T));
      EXPECT_EQ(attention_mask_errors(DType::BF16, 2, T, 2, d), 0);
    }
    {
      SCOPED_TRACE("f32 cuBLAS path T " + std::to_string(T));
      EXPECT_EQ(attention_mask_errors(DType::F32, 2, T, 2, d), 0);
    }
    {
      EnvGuard g("ANATOMY_ATTENTION", "reference");
      SCOPED_TRACE("reference kernels T " + std::to_string(T));
      EXPECT_EQ(attention_mask_errors(DType::BF16, 1, T, 2, d), 0);
      EXPECT_EQ(attention_mask_errors(DType::F32, 1, T, 2, d), 0);
    }
  }
}

TEST(DropoutBitsCuda, DropoutOpMaskMatchesTheCpuFunction) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Dev dev;
  const DropoutSpec d{0.1f, 99, 3};
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1003}, int64_t{65536 + 5}})
      for (int64_t shift : {int64_t{0}, int64_t{1}}) {  // shift 1: an unaligned view, the scalar path
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n " + std::to_string(n) + " shift " + std::to_string(shift));
        const std::vector<float> ones(static_cast<size_t>(n + shift), 1.0f);
        const Tensor x = dev.make(dt, {n + shift}, &ones).slice(shift, n + shift);
        const Tensor y = dev.make(dt, {n + shift}).slice(shift, n + shift);
        dev.gpu->dropout_forward(y, x, d);
        const std::vector<float> got = dev.get(y);
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) wrong += (got[i] != 0.0f) != dropout_keep(d.seed, d.offset, i, d.p);
        EXPECT_EQ(wrong, 0);
      }
}

TEST(DropoutBitsCuda, LayerNormMaskMatchesTheCpuFunction) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Dev dev;
  Rng rng(5);
  const DropoutSpec d{0.1f, 7, 8};
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t h : {1024, 768, 100, 1030}) {  // warp path (packs), and the block path
      SCOPED_TRACE(std::string(dtype_name(dt)) + " H " + std::to_string(h));
      const int64_t rows = 37;
      std::vector<float> branch(static_cast<size_t>(rows * h)), gamma(h, 1.0f), beta(h, 0.0f), dy(branch.size());
      for (auto& x : branch) x = static_cast<float>(1.0 + rng.uniform());  // nonzero
      for (auto& x : dy) x = static_cast<float>(rng.normal());
      const Tensor tb = dev.make(dt, {rows, h}, &branch), tg = dev.make(dt, {h}, &gamma), tbe = dev.make(dt, {h}, &beta);
      const Tensor ty = dev.make(dt, {rows, h}), ts = dev.make(dt, {rows, h});
      const Tensor tm = dev.make(DType::F32, {rows}), tr = dev.make(DType::F32, {rows});
      dev.gpu->layernorm_forward(ty, ts, tm, tr, tb, Tensor(), tg, tbe, 1e-12f, d);
      const Tensor tdy = dev.make(dt, {rows, h}, &dy), tds = dev.make(dt, {rows, h}), tdb = dev.make(dt, {rows, h});
      dev.gpu->layernorm_backward(tds, tdb, Tensor(), Tensor(), tdy, ty, tr, tg, tbe, d);
      const std::vector<float> sum = dev.get(ts), ds = dev.get(tds), db = dev.get(tdb);
      int64_t wrong_f = 0, wrong_b = 0;
      for (size_t i = 0; i < sum.size(); ++i) {
        const bool keep = dropout_keep(d.seed, d.offset, i, d.p);
        wrong_f += (sum[i] != 0.0f) != keep;
        if (ds[i] != 0.0f) wrong_b += (db[i] != 0.0f) != keep;
      }
      EXPECT_EQ(wrong_f, 0) << "forward";
      EXPECT_EQ(wrong_b, 0) << "backward";
    }
}
