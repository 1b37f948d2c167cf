// fp8 on the GPU (Note [fp8 training] in core/fp8.h): the quantizing kernel byte for byte
// against the host's rounding, the fp8 GEMM in each of the layer's three forms against the CPU
// twin (which multiplies the same fp8 values in F32), and `anatomy train --precision fp8`: it
// learns like bf16, its scales move, and the plan equals what was allocated.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "core/rng.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "ops/backend.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launchers.h"
#include "train/trainer.h"
#include "../common/dirs.h"

using namespace anatomy;

namespace {

std::vector<float> meta_row(float scale, Fp8Format f) {
  std::vector<float> m(kFp8MetaWidth);
  fp8_meta_init(m.data(), scale, f);
  return m;
}

// Values over many binades, ties and saturation included, rounded to bf16 (what the kernel reads).
std::vector<float> bf16_values(Rng& g, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const double mag = std::exp(4.0 * g.normal());
    v[i] = bf16_to_f32(f32_to_bf16(static_cast<float>(g.uniform() < 0.5 ? -mag : mag)));
  }
  v[0] = 0.0f;
  return v;
}

}  // namespace

TEST(Fp8Cuda, QuantizingMatchesTheHostRoundingByteForByte) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Rng g(3);
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(str_cat(f == Fp8Format::E4M3 ? "E4M3" : "E5M2", transposed ? " transposed" : ""));
      const int64_t rows = 45, k = 70, ld = 80;  // odd sizes: partial tiles, zero padding 70..79
      const std::vector<float> x = bf16_values(g, static_cast<size_t>(rows * k));
      std::vector<uint16_t> bits(x.size());
      // Stored [rows, k], or [k, rows] for the transposed read.
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c)
          bits[static_cast<size_t>(transposed ? c * rows + r : r * k + c)] = f32_to_bf16(x[static_cast<size_t>(r * k + c)]);
      const float scale = f == Fp8Format::E4M3 ? 8.0f : 0.5f;
      std::vector<float> meta = meta_row(scale, f);
      void *d_src = nullptr, *d_dst = nullptr, *d_meta = nullptr;
      ASSERT_EQ(cudaMalloc(&d_src, bits.size() * 2), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_dst, static_cast<size_t>(rows * ld)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_meta, meta.size() * 4), cudaSuccess);
      cudaMemcpy(d_src, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(d_meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice);
      cudaMemset(d_dst, 0xAB, static_cast<size_t>(rows * ld));
      const Tensor src(d_src, DType::BF16, transposed ? Shape{k, rows} : Shape{rows, k}, Device::CUDA);
      cuda::fp8_quantize(static_cast<uint8_t*>(d_dst), ld, src, rows, k, transposed, static_cast<float*>(d_meta), f,
                         nullptr);
      std::vector<uint8_t> got(static_cast<size_t>(rows * ld));
      ASSERT_EQ(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      cudaMemcpy(meta.data(), d_meta, meta.size() * 4, cudaMemcpyDeviceToHost);
      float amax = 0.0f;
      int wrong = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld; ++c) {
          const uint8_t want = c < k ? fp8_encode(x[static_cast<size_t>(r * k + c)] * scale, f) : 0;
          if (got[static_cast<size_t>(r * ld + c)] != want && ++wrong <= 5)
            ADD_FAILURE() << "row " << r << " col " << c << ": " << int(got[static_cast<size_t>(r * ld + c)]) << " != "
                          << int(want) << " for " << x[static_cast<size_t>(r * k + c)];
          if (c < k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * k + c)]));
        }
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(meta[Fp8Meta::kAmax], amax);
      cudaFree(d_src);
      cudaFree(d_dst);
      cudaFree(d_meta);
    }
}

namespace {

// One GEMM of a Linear layer's three (forward with its bias epilogue, data gradient, weight
// gradient with the bias gradient) on the GPU in bf16 + fp8, and on the CPU twin in F32 + fp8
// from the same bf16 values: C and the operands' amax must agree.
struct GemmCase {
  const char* name;
  int64_t m, n, k;
  Trans ta, tb;
  Epilogue epilogue;
  bool f32_out;  // the weight gradient: F32 C, accumulated (beta 1)
  Fp8Format fa, fb;
};

void check_gemm(const GemmCase& gc, Rng& g) {
  SCOPED_TRACE(gc.name);
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  const Shape sa = gc.ta == Trans::N ? Shape{gc.m, gc.k} : Shape{gc.k, gc.m};
  const Shape sb = gc.tb == Trans::N ? Shape{gc.k, gc.n} : Shape{gc.n, gc.k};
  auto rounded = [&](size_t n, double scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(static_cast<float>(g.normal() * scale)));
    return v;
  };
  const std::vector<float> a = rounded(sa.numel(), 1.0), b = rounded(sb.numel(), 0.05),
                           bias = rounded(static_cast<size_t>(gc.epilogue == Epilogue::BiasGrad ? gc.m : gc.n), 1.0),
                           c0 = rounded(static_cast<size_t>(gc.m * gc.n), 0.5);
  std::vector<float> meta = meta_row(4.0f, gc.fa), mb = meta_row(1024.0f, gc.fb);
  meta.insert(meta.end(), mb.begin(), mb.end());
  struct Side {
    std::vector<float> c, bias, meta;
  };
  auto run = [&](Backend& be, DType dt) {
    Allocator& al = be.allocator();
    auto make = [&](const std::vector<float>& v, Shape s, DType t) {
      Buffer buf(al, t, s, Category::Other);
      if (t == DType::BF16) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
        be.upload(buf.tensor(), h.data());
      } else {
        be.upload(buf.tensor(), v.data());
      }
      return buf;
    };
    const DType cdt = gc.f32_out ? DType::F32 : dt;
    const DType bdt = gc.epilogue == Epilogue::BiasGrad ? DType::F32 : dt;
    Buffer A = make(a, sa, dt), B = make(b, sb, dt), C = make(c0, {gc.m, gc.n}, cdt);
    Buffer bias_buf = make(bias, {static_cast<int64_t>(bias.size())}, bdt);
    Buffer pre = make(c0, {gc.m, gc.n}, dt);
    Buffer M = make(meta, {2, kFp8MetaWidth}, DType::F32);
    MatmulArgs args(1.0f, gc.f32_out ? 1.0f : 0.0f, gc.epilogue, gc.epilogue == Epilogue::None ? Tensor() : bias_buf.tensor(),
                    gc.epilogue == Epilogue::BiasGelu ? pre.tensor() : Tensor());
    args.fp8_a = {M.tensor().slice(0, 1).view({kFp8MetaWidth}), gc.fa};
    args.fp8_b = {M.tensor().slice(1, 2).view({kFp8MetaWidth}), gc.fb};
    be.matmul(C.tensor(), A.tensor(), gc.ta, B.tensor(), gc.tb, args);
    auto read = [&](const Buffer& buf) {
      std::vector<float> v(buf.tensor().numel());
      if (buf.tensor().dtype == DType::BF16) {
        std::vector<uint16_t> h(v.size());
        be.download(h.data(), buf.tensor());
        for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(h[i]);
      } else {
        be.download(v.data(), buf.tensor());
      }
      return v;
    };
    be.synchronize();
    return Side{read(C), read(bias_buf), read(M)};
  };
  const Side want = run(*cpu, DType::F32), got = run(*gpu, DType::BF16);
  auto err = [](const std::vector<float>& x, const std::vector<float>& y) {
    double e = 0, n = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      e += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      n += double(y[i]) * y[i];
    }
    return std::sqrt(e / std::max(n, 1e-30));
  };
  const int64_t fallbacks = static_cast<cuda::CudaBackend&>(*gpu).fp8_fallback_calls();
  // bf16 outputs carry their rounding (2^-9). F32 ones carry the fp8 tensor cores' own
  // accumulation, narrower than F32 between cuBLASLt's promotions (measured 2.5e-5 to 7.9e-5).
  EXPECT_LT(err(got.c, want.c), gc.f32_out ? 5e-4 : 1e-2);
  if (gc.epilogue == Epilogue::BiasGrad) {
    EXPECT_LT(err(got.bias, want.bias), 1e-5);
  }
  EXPECT_EQ(got.meta[Fp8Meta::kAmax], want.meta[Fp8Meta::kAmax]);
  EXPECT_EQ(got.meta[kFp8MetaWidth + Fp8Meta::kAmax], want.meta[kFp8MetaWidth + Fp8Meta::kAmax]);
  EXPECT_EQ(fallbacks, 0) << "cuBLASLt had no fp8 kernel";
}

}  // namespace

TEST(Fp8Cuda, TheLinearLayersGemmsAgreeWithTheCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Rng g(11);
  constexpr Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  // Any row count (packed real tokens): 208, 48 and 37 all run in fp8 (measured on the H200).
  for (int64_t rows : {208, 48, 37}) {
    check_gemm({"forward x W^T + b", rows, 96, 64, Trans::N, Trans::T, Epilogue::Bias, false, E4, E4}, g);
    check_gemm({"forward, bias + GELU", rows, 256, 64, Trans::N, Trans::T, Epilogue::BiasGelu, false, E4, E4}, g);
    check_gemm({"data gradient dY W", rows, 64, 256, Trans::N, Trans::N, Epilogue::None, false, E5, E4}, g);
    check_gemm({"data gradient dY W, --fp8-format e4m3", rows, 64, 256, Trans::N, Trans::N, Epilogue::None, false, E4, E4}, g);
    // Not used by the model (its weight gradients run in bf16), but the op takes it: the
    // transposing quantizer for both operands and an F32 C accumulated into.
    check_gemm({"weight gradient dY^T X + db", 96, 64, rows, Trans::T, Trans::N, Epilogue::BiasGrad, true, E5, E4}, g);
  }
}

TEST(Fp8Cuda, TrainingInFp8LearnsLikeBf16AndPlansItsMemory) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto options = [](Precision p, const char* dir, Fp8Format grads = Fp8Format::E5M2) {
    TrainOptions o;
    o.preset = "bert-tiny";
    o.device = DeviceChoice::Cuda;
    o.seq_len = 64;
    o.num_samples = 512;
    o.per_device_train_batch_size = 16;
    o.max_steps = 60;
    o.learning_rate = 1e-3f;
    o.logging_steps = 0;
    o.save_model = false;
    o.disable_progress_bar = true;
    o.precision = p;
    o.fp8_grads = grads;
    o.output_dir = testing_dirs::fresh_dir(dir);  // empty: a second run on one machine starts clean
    return o;
  };
  const TrainResult bf = train(options(Precision::Bf16, "fp8_bf16")), f8 = train(options(Precision::Fp8, "fp8_fp8")),
                    e4 = train(options(Precision::Fp8, "fp8_e4m3", Fp8Format::E4M3));
  std::printf("bert-tiny 60 steps: loss first/last bf16 %.4f/%.4f fp8 %.4f/%.4f fp8 e4m3 %.4f/%.4f\n", bf.first_loss,
              bf.last_loss, f8.first_loss, f8.last_loss, e4.first_loss, e4.last_loss);
  for (const TrainResult* r : {&f8, &e4}) {
    EXPECT_LT(r->last_loss, r->first_loss * 0.9);
    EXPECT_NEAR(r->last_loss, bf.last_loss, 0.1 * bf.first_loss);
  }
  EXPECT_NE(e4.last_loss, f8.last_loss);  // the gradients' format reached the GEMMs
  // The scaling rows are optimizer state; the operand scratch is temporary and planned.
  const int64_t meta = 2 * 4 * 3 * kFp8MetaWidth * 4;
  EXPECT_EQ(f8.peak_bytes[Category::OptimizerState] - bf.peak_bytes[Category::OptimizerState], meta);
  ASSERT_FALSE(f8.rank_planned_bytes.empty());
  EXPECT_EQ(f8.rank_peak_bytes[0], f8.rank_planned_bytes[0]);
}
