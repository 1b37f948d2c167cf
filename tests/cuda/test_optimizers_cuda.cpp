// The 8-bit AdamW and Adafactor kernels against their CPU twins on fresh random inputs (params,
// gradients and optimizer state), several steps, with gradient clipping and a loss scale. The
// half copy and the Adafactor scratch start as NaN on the GPU, so an unwritten element fails.
// 8-bit AdamW: the kernel runs the CPU reference's exact float operations, so parameters and
// codes are expected to be bit-identical (and may never differ by more than one code step).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "model/params.h"
#include "ops/backend.h"
#include "optim/adafactor.h"
#include "optim/adamw8bit.h"

namespace {

using namespace anatomy;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class Env {
 public:
  Env() : seed(std::random_device{}()), rng(seed) {
    gpu = make_cuda_backend(0);
    cpu = make_cpu_backend();
  }
  uint64_t seed;
  Rng rng;
  std::unique_ptr<Backend> gpu, cpu;

  template <class T>
  Tensor dev(DType dt, const std::vector<T>& host) {
    bufs.emplace_back(gpu->allocator(), dt, Shape{static_cast<int64_t>(host.size() * sizeof(T) / dtype_size(dt))},
                      Category::Other);
    gpu->upload(bufs.back(), host.data());
    return bufs.back().tensor();
  }
  template <class T>
  std::vector<T> get(const Tensor& t) {
    std::vector<T> out(t.bytes() / sizeof(T));
    gpu->download(out.data(), t);
    gpu->synchronize();
    return out;
  }
  std::vector<float> randn(size_t n, double scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(rng.normal() * scale);
    return v;
  }

 private:
  std::vector<Buffer> bufs;
};

Tensor host(std::vector<float>& v) { return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, Device::CPU); }
Tensor host(std::vector<uint8_t>& v) { return Tensor(v.data(), DType::U8, {static_cast<int64_t>(v.size())}, Device::CPU); }

double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> bf16_values(const std::vector<uint16_t>& raw) {
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_f32(raw[i]);
  return out;
}
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

}  // namespace

TEST(CudaOptimizers, AdamW8bitMatchesTheCpuTwinBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Env e;
  SCOPED_TRACE("seed " + std::to_string(e.seed));
  const std::array<float, 512> qa = adamw8bit_qmap();
  std::vector<float> qmap(qa.begin(), qa.end());
  for (float max_norm : {1.0f, 0.0f})
    for (size_t n : {size_t{100003}, size_t{64}}) {
      SCOPED_TRACE("max_norm " + std::to_string(max_norm) + " n " + std::to_string(n));
      const size_t blocks = (n + kQuantBlock - 1) / kQuantBlock;
      const float loss_scale = 1024.0f;
      // Random state: any codes, positive scales spanning decades.
      std::vector<float> p = e.randn(n, 0.5), mabs(blocks), vabs(blocks);
      std::vector<uint8_t> mq(n), vq(n);
      for (auto& c : mq) c = static_cast<uint8_t>(e.rng.randint(0, 256));
      for (auto& c : vq) c = static_cast<uint8_t>(e.rng.randint(0, 256));
      for (size_t b = 0; b < blocks; ++b) {
        mabs[b] = static_cast<float>(std::pow(10.0, -3.0 * e.rng.uniform()) * 1e-2);
        vabs[b] = static_cast<float>(std::pow(10.0, -3.0 * e.rng.uniform()) * 1e-4);
      }
      const Tensor gp = e.dev(DType::F32, p), gmq = e.dev(DType::U8, mq), gvq = e.dev(DType::U8, vq),
                   gma = e.dev(DType::F32, mabs), gva = e.dev(DType::F32, vabs), gq = e.dev(DType::F32, qmap);
      const Tensor ghalf = e.dev(DType::BF16, std::vector<uint16_t>(n, f32_to_bf16(kNaN)));
      AdamWArgs a;
      a.lr = 1e-3f, a.weight_decay = 0.01f;
      for (int64_t step = 1; step <= 3; ++step) {
        a.step = step + 4;
        std::vector<float> g(n);
        for (size_t i = 0; i < n; ++i)
          g[i] = static_cast<float>(e.rng.normal() * loss_scale * std::pow(10.0, -2.0 * static_cast<double>(i % 5) / 5));
        double ss = 0;
        for (float x : g) ss += static_cast<double>(x) * x;
        std::vector<float> norm{static_cast<float>(ss)};
        const Tensor gg = e.dev(DType::F32, g), gn = e.dev(DType::F32, norm);
        e.gpu->adamw8bit_update(gp, gmq, gvq, gma, gva, ghalf, gg, gq, GradTransform{gn, 1.0f / loss_scale, max_norm}, a);
        e.cpu->adamw8bit_update(host(p), host(mq), host(vq), host(mabs), host(vabs), Tensor{}, host(g), host(qmap),
                                GradTransform{host(norm), 1.0f / loss_scale, max_norm}, a);
      }
      const std::vector<float> gp_out = e.get<float>(gp), gma_out = e.get<float>(gma), gva_out = e.get<float>(gva);
      const std::vector<uint8_t> gmq_out = e.get<uint8_t>(gmq), gvq_out = e.get<uint8_t>(gvq);
      EXPECT_LT(rel_diff(gp_out, p), 1e-6) << "params";
      EXPECT_LT(rel_diff(gma_out, mabs), 1e-6) << "m absmax";
      EXPECT_LT(rel_diff(gva_out, vabs), 1e-6) << "v absmax";
      size_t differ = 0, far = 0, pdiffer = 0;
      for (size_t i = 0; i < n; ++i) {
        for (auto [x, y] : {std::pair{gmq_out[i], mq[i]}, std::pair{gvq_out[i], vq[i]}}) {
          differ += x != y;
          far += std::abs(int(x) - int(y)) > 1;
        }
        pdiffer += gp_out[i] != p[i];
      }
      EXPECT_EQ(far, 0u) << "codes more than one step apart";
      EXPECT_EQ(differ, 0u) << "codes not bit-identical";
      EXPECT_EQ(pdiffer, 0u) << "params not bit-identical";
      const std::vector<float> half = bf16_values(e.get<uint16_t>(ghalf)), want_half = bf16_rounded(p);
      size_t hdiffer = 0;
      for (size_t i = 0; i < n; ++i) hdiffer += !(half[i] == want_half[i]);  // NaN counts as a difference
      EXPECT_EQ(hdiffer, 0u) << "half copy";
    }
}

TEST(CudaOptimizers, AdafactorMatchesTheCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Env e;
  SCOPED_TRACE("seed " + std::to_string(e.seed));
  // bert-tiny's layout: a 30522 x 128 embedding, 512 x 128 and 128 x 512 matrices, a 2 x 128
  // classifier and 1-D parameters from 2 to 512 values.
  const ParamLayout lay = ParamLayout::for_sequence_classification(BertConfig::preset("bert-tiny"));
  AdafactorPlan plan = adafactor_plan(lay);
  const size_t n = lay.total();
  for (float clip_threshold : {1.0f, 0.05f}) {
    SCOPED_TRACE("clip_threshold " + std::to_string(clip_threshold));
    const float loss_scale = 1024.0f, max_norm = 1.0f;
    std::vector<float> p = e.randn(n, 0.05), state(plan.state_floats);
    for (auto& x : state) x = static_cast<float>((0.5 + e.rng.uniform()) * 1e-6);  // positive running means
    const std::vector<float> p0 = p;
    const Tensor gp = e.dev(DType::F32, p), gs = e.dev(DType::F32, state),
                 gscr = e.dev(DType::F32, std::vector<float>(plan.scratch_floats, kNaN)),
                 gseg = e.dev(DType::I64, plan.segments);
    const Tensor ghalf = e.dev(DType::BF16, std::vector<uint16_t>(n, f32_to_bf16(kNaN)));
    std::vector<float> scratch(1);
    const int64_t count = static_cast<int64_t>(plan.segments.size());
    const AdafactorTable gt{gseg.view({count, kAdafactorSegmentFields}), count, plan.chunks, plan.strips};
    const AdafactorTable ct{Tensor(plan.segments.data(), DType::I64, {count, kAdafactorSegmentFields}, Device::CPU),
                            count, plan.chunks, plan.strips};
    AdafactorArgs a;
    // lr 1e-2: updates large enough that float rounding of the parameters stays far below the bound.
    a.lr = 1e-2f, a.weight_decay = 0.01f, a.clip_threshold = clip_threshold;
    for (int64_t step = 3; step <= 5; ++step) {
      a.step = step;
      std::vector<float> g = e.randn(n, loss_scale * 1e-3);
      double ss = 0;
      for (float x : g) ss += static_cast<double>(x) * x;
      std::vector<float> norm{static_cast<float>(ss)};
      const Tensor gg = e.dev(DType::F32, g), gn = e.dev(DType::F32, norm);
      e.gpu->adafactor_update(gp, gs, gscr, ghalf, gg, gt, GradTransform{gn, 1.0f / loss_scale, max_norm}, a);
      e.cpu->adafactor_update(host(p), host(state), host(scratch), Tensor{}, host(g), ct,
                              GradTransform{host(norm), 1.0f / loss_scale, max_norm}, a);
    }
    const std::vector<float> gp_out = e.get<float>(gp), gs_out = e.get<float>(gs);
    EXPECT_LT(rel_diff(gs_out, state), 1e-5) << "state";
    // Compare the updates, not just the parameters (which move little per step).
    std::vector<float> du_gpu(n), du_cpu(n);
    for (size_t i = 0; i < n; ++i) du_gpu[i] = gp_out[i] - p0[i], du_cpu[i] = p[i] - p0[i];
    EXPECT_LT(rel_diff(du_gpu, du_cpu), 1e-4) << "updates";
    const std::vector<float> half = bf16_values(e.get<uint16_t>(ghalf));
    EXPECT_LT(rel_diff(half, p), 1e-2) << "half copy";
  }
}
