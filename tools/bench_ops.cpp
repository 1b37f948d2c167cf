// anatomy_bench_ops: the memory-bound backward ops alone at bert-large shapes (B*T = 16384 rows,
// BF16 by default), through the Backend interface as the model calls them:
//   bias_grad           db F32 [N] += column sums of dy [16384, N], N = 1024, 3072, 4096
//                       (the four bias gradients of a layer: attention output and FFN output
//                       1024, QKV 3072, intermediate 4096);
//   layernorm_backward  H = 1024, with the branch dropout fused (dbranch written, as both
//                       LayerNorms of a layer run) and without it;
//   copy                a device-to-device copy of 256 MiB: the bandwidth ceiling to compare with.
//   + bias gradient     the LayerNorm backward (dropout fused) with dbias, the column sums of
//                       dbranch, and gelu_backward [16384, 4096] with and without dbias: the bias
//                       gradients in the passes that write dY, as the model calls them.
//   weight gradients    dW F32 [out, in] += dY^T X with db += the column sums of dY at the four
//                       Linear layers of a layer (Note [fused bias gradient] in ops/op_args.h):
//                       the GEMM alone, the GEMM then bias_grad (before the fusion; the backend
//                       with the epilogue switched off) and the fused BGRADB epilogue.
// Each call is timed with device events after a warm-up; the median of --reps calls is
// reported, rotating among three input sets (fresh random values, never zeros) so that no run
// reads its inputs from the 50 MB L2 the previous one left. GB/s counts the fewest bytes the op
// must move: each input read once and each output written once (the F32 [N] or [H] vectors
// and the partial rows are not counted).
//
//   anatomy_bench_ops [--rows 16384] [--dtype bf16] [--reps 50] [--warmup 10]
//
// --registry (built with the tests): every op of the per-op registry (tests/common/op_registry.h)
// at bert-base sizes instead, or only --op NAME; the flops and bytes are the op's declared cost
// (telemetry/op_cost.h) as the backend reports it to an observer, so TFLOP/s and GB/s are the
// profiler's. An entry whose call runs a forward first (attention_backward, layernorm_backward)
// times and counts both ops.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/backend.h"
#include "ops/cuda/cuda_backend.h"
#if defined(ANATOMY_BENCH_REGISTRY)
#include "../tests/common/op_registry.h"
#endif

using namespace anatomy;

namespace {

constexpr int kSets = 3;

struct Row {
  std::string op, shape;
  double bytes = 0, ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<uint8_t> random_values(size_t n, DType dt, Rng& rng, double amp, double offset = 0.0) {
  const size_t es = dtype_size(dt);
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(offset + (2.0 * rng.uniform() - 1.0) * amp);
    if (dt == DType::F32) {
      std::memcpy(&out[4 * i], &x, 4);
    } else {
      const uint16_t h = dt == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

// Median ms of reps calls of f(set, i) after warmup calls.
double time_op(Backend& be, int reps, int warmup, const std::function<void(int, int)>& f) {
  for (int i = 0; i < warmup; ++i) f(i % kSets, i);
  be.synchronize();
  be.timing_reset();
  std::vector<int> marks;
  for (int i = 0; i < reps; ++i) {
    marks.push_back(be.timing_mark());
    f(i % kSets, i);
    marks.push_back(be.timing_mark());
  }
  be.synchronize();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(be.timing_elapsed_ms(marks[2 * i], marks[2 * i + 1]));
  be.timing_reset();
  return median(t);
}

Row bench_bias_grad(Backend& be, DType dt, int64_t rows, int64_t n, int reps, int warmup, Rng& rng) {
  Allocator& al = be.allocator();
  std::vector<Buffer> dy;
  for (int s = 0; s < kSets; ++s) {
    dy.emplace_back(al, dt, Shape{rows, n}, Category::Other);
    be.upload(dy.back(), random_values(static_cast<size_t>(rows * n), dt, rng, 1.0).data());
  }
  Buffer db(al, DType::F32, Shape{n}, Category::Other);
  be.upload(db, random_values(static_cast<size_t>(n), DType::F32, rng, 1.0).data());
  const double ms = time_op(be, reps, warmup, [&](int s, int) { be.bias_grad(db, dy[s]); });
  return Row{"bias_grad", std::to_string(rows) + " x " + std::to_string(n),
             static_cast<double>(rows * n) * static_cast<double>(dtype_size(dt)), ms};
}

Row bench_layernorm_backward(Backend& be, DType dt, int64_t rows, int64_t h, float p, int reps, int warmup,
                             Rng& rng, bool bias = false) {
  Allocator& al = be.allocator();
  std::vector<Buffer> dy, sum, mean, rstd;
  for (int s = 0; s < kSets; ++s) {
    dy.emplace_back(al, dt, Shape{rows, h}, Category::Other);
    sum.emplace_back(al, dt, Shape{rows, h}, Category::Other);
    mean.emplace_back(al, DType::F32, Shape{rows}, Category::Other);
    rstd.emplace_back(al, DType::F32, Shape{rows}, Category::Other);
    be.upload(dy.back(), random_values(static_cast<size_t>(rows * h), dt, rng, 1.0).data());
    be.upload(sum.back(), random_values(static_cast<size_t>(rows * h), dt, rng, 2.0).data());
    be.upload(mean.back(), random_values(static_cast<size_t>(rows), DType::F32, rng, 0.1).data());
    be.upload(rstd.back(), random_values(static_cast<size_t>(rows), DType::F32, rng, 0.1, 0.85).data());
  }
  Buffer gamma(al, dt, Shape{h}, Category::Other), beta(al, dt, Shape{h}, Category::Other);
  Buffer dsum(al, dt, Shape{rows, h}, Category::Other);
  Buffer dbranch(al, dt, Shape{rows, h}, Category::Other);
  Buffer dgamma(al, DType::F32, Shape{h}, Category::Other), dbeta(al, DType::F32, Shape{h}, Category::Other);
  Buffer dbias(al, DType::F32, Shape{h}, Category::Other);
  be.upload(dbias, random_values(static_cast<size_t>(h), DType::F32, rng, 1.0).data());
  be.upload(gamma, random_values(static_cast<size_t>(h), dt, rng, 0.2, 1.0).data());
  be.upload(beta, random_values(static_cast<size_t>(h), dt, rng, 0.1).data());
  be.upload(dgamma, random_values(static_cast<size_t>(h), DType::F32, rng, 1.0).data());
  be.upload(dbeta, random_values(static_cast<size_t>(h), DType::F32, rng, 1.0).data());
  const bool fused = p > 0.0f;
  const double ms = time_op(be, reps, warmup, [&](int s, int i) {
    const DropoutSpec d{p, 42, static_cast<uint64_t>(i)};
    be.layernorm_backward(dsum, fused ? dbranch.tensor() : Tensor{}, dgamma, dbeta, dy[s], sum[s], rstd[s], gamma,
                          beta, d, fused && bias ? dbias.tensor() : Tensor{});
  });
  // dy, y in (`sum` holds the outputs here); dsum (and dbranch) out.
  const double bytes = static_cast<double>(rows * h) * static_cast<double>(dtype_size(dt)) * (fused ? 4 : 3);
  return Row{fused ? (bias ? "layernorm_backward + dropout + bias gradient" : "layernorm_backward + dropout")
                   : "layernorm_backward",
             std::to_string(rows) + " x " + std::to_string(h), bytes, ms};
}

// dx = gelu_backward(dy, x) in place over dy, as the model calls it, with or without the bias
// gradient (the column sums of dx) in the same pass.
Row bench_gelu_backward(Backend& be, DType dt, int64_t rows, int64_t n, bool bias, int reps, int warmup, Rng& rng) {
  Allocator& al = be.allocator();
  std::vector<Buffer> dy, x;
  for (int s = 0; s < kSets; ++s) {
    dy.emplace_back(al, dt, Shape{rows, n}, Category::Other);
    x.emplace_back(al, dt, Shape{rows, n}, Category::Other);
    be.upload(dy.back(), random_values(static_cast<size_t>(rows * n), dt, rng, 1.0).data());
    be.upload(x.back(), random_values(static_cast<size_t>(rows * n), dt, rng, 2.0).data());
  }
  Buffer db(al, DType::F32, Shape{n}, Category::Other);
  be.upload(db, random_values(static_cast<size_t>(n), DType::F32, rng, 1.0).data());
  const double ms = time_op(be, reps, warmup, [&](int s, int) {
    be.gelu_backward(dy[s], dy[s], x[s], bias ? db.tensor() : Tensor{});
  });
  return Row{bias ? "gelu_backward + bias gradient" : "gelu_backward",
             std::to_string(rows) + " x " + std::to_string(n),
             static_cast<double>(rows * n) * static_cast<double>(dtype_size(dt)) * 3, ms};
}

Row bench_copy(Backend& be, int reps, int warmup) {
  const int64_t n = int64_t{256} << 20;  // bytes
  Allocator& al = be.allocator();
  Rng rng(7);
  Buffer src(al, DType::U8, Shape{n}, Category::Other), dst(al, DType::U8, Shape{n}, Category::Other);
  std::vector<uint8_t> h(static_cast<size_t>(n));
  for (auto& b : h) b = static_cast<uint8_t>(rng.next());
  be.upload(src, h.data());
  const double ms = time_op(be, reps, warmup, [&](int, int) { be.copy(dst, src); });
  return Row{"copy (ceiling)", "256 MiB", 2.0 * static_cast<double>(n), ms};
}

// One Linear layer's weight gradient at rows tokens: ms of the GEMM alone, of the GEMM then
// bias_grad (two ops), and of the fused call.
struct WgradRow {
  int64_t out, in;
  const char* layer;
  double gemm = 0, separate = 0, fused = 0;
};

void bench_weight_grad(Backend& be, DType dt, int64_t rows, WgradRow& r, int reps, int warmup, Rng& rng) {
  auto* cuda_be = dynamic_cast<cuda::CudaBackend*>(&be);
  ANATOMY_CHECK(cuda_be, "weight gradients: not the CUDA backend");
  Allocator& al = be.allocator();
  std::vector<Buffer> dy, x;
  for (int s = 0; s < kSets; ++s) {
    dy.emplace_back(al, dt, Shape{rows, r.out}, Category::Other);
    x.emplace_back(al, dt, Shape{rows, r.in}, Category::Other);
    be.upload(dy.back(), random_values(static_cast<size_t>(rows * r.out), dt, rng, 1.0).data());
    be.upload(x.back(), random_values(static_cast<size_t>(rows * r.in), dt, rng, 1.0).data());
  }
  Buffer dw(al, DType::F32, Shape{r.out, r.in}, Category::Other), db(al, DType::F32, Shape{r.out}, Category::Other);
  be.fill(dw, 0.0f);
  be.fill(db, 0.0f);
  const MatmulArgs plain{1, 1, Epilogue::None, {}, {}}, fused{1, 1, Epilogue::BiasGrad, db.tensor(), {}};
  r.gemm = time_op(be, reps, warmup, [&](int s, int) { be.matmul(dw, dy[s], Trans::T, x[s], Trans::N, plain); });
  cuda_be->set_fused_bias_grad(false);
  r.separate = time_op(be, reps, warmup, [&](int s, int) { be.matmul(dw, dy[s], Trans::T, x[s], Trans::N, fused); });
  cuda_be->set_fused_bias_grad(true);
  const int64_t unfused = cuda_be->bias_grad_unfused_calls();
  r.fused = time_op(be, reps, warmup, [&](int s, int) { be.matmul(dw, dy[s], Trans::T, x[s], Trans::N, fused); });
  if (cuda_be->bias_grad_unfused_calls() != unfused)
    std::printf("weight gradient %s: cuBLASLt declined the BGRADB epilogue (the fused row ran unfused)\n", r.layer);
}

#if defined(ANATOMY_BENCH_REGISTRY)
// Sums the declared cost of every op one call of an entry issues.
struct CostSum final : OpObserver {
  double flops = 0, bytes = 0;
  void before(Backend&, const OpEvent&) override {}
  void after(Backend&, const OpEvent& e) override {
    flops += e.cost.flops;
    bytes += e.cost.bytes;
  }
};

void bench_registry(Backend& be, DType dt, const std::string& only, int reps, int warmup) {
  std::printf("\n%s, %s; median of %d calls; cost declared by telemetry/op_cost.h.\n\n", be.name().c_str(),
              std::string(dtype_name(dt)).c_str(), reps);
  std::printf("| op | ms | GFLOP | MB | TFLOP/s | GB/s |\n|---|---:|---:|---:|---:|---:|\n");
  const test::OpDims dims = test::bench_dims();
  bool found = false;
  for (const test::OpEntry& e : test::op_registry()) {
    if (!only.empty() && only != e.op) continue;
    found = true;
    if (be.device() == Device::CUDA && dt == DType::F32 && !e.f32_on_cuda) continue;  // no F32 kernel there
    Rng rng(99);
    const test::OpCase c = e.build(dims, rng);
    std::vector<std::vector<double>> values;
    for (const test::OpArg& a : c.args) values.push_back(test::arg_values(a, e.half ? dt : DType::F32));
    test::CaseTensors t = test::make_tensors(be, c, e.half ? dt : DType::F32, values);
    CostSum cost;
    be.set_observer(&cost);
    c.run(be, t.tensors);
    be.set_observer(nullptr);
    // Ops that update in place (optimizers, accumulating gradients) keep running on their own
    // output: the timing, not the values, is what is read here.
    const double ms = time_op(be, reps, warmup, [&](int, int) { c.run(be, t.tensors); });
    std::printf("| %s | %.4f | %.3f | %.1f | %.2f | %.0f |\n", e.op, ms, cost.flops / 1e9, cost.bytes / 1e6,
                cost.flops / (ms * 1e-3) / 1e12, cost.bytes / ms / 1e6);
  }
  ANATOMY_CHECK(found, "--op ", only, ": no such op in the registry");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anatomy_bench_ops: bias_grad and layernorm_backward at bert-large shapes"};
  int64_t rows = 16384;
  std::string dtype = "bf16";
  int reps = 50, warmup = 10;
  app.add_option("--rows", rows, "Rows (batch x sequence)")->capture_default_str();
  app.add_option("--dtype", dtype, "bf16, fp16 or fp32")->capture_default_str();
  app.add_option("--reps", reps, "Timed calls per op (median reported)")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed calls first")->capture_default_str();
  bool registry = false;
  std::string only;
  app.add_flag("--registry", registry, "Every op of the per-op registry at bert-base sizes");
  app.add_option("--op", only, "With --registry: only this op (a Backend method name)");
  std::string device = "cuda";
  app.add_option("--device", device, "With --registry: cuda, or cpu (F32)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    ANATOMY_CHECK(device == "cuda" || (registry && device == "cpu"), "--device ", device,
                  ": expected cuda (or cpu with --registry)");
    ANATOMY_CHECK(device == "cpu" || cuda_available(), "no CUDA device (or this build has no CUDA backend)");
    ANATOMY_CHECK(dtype == "bf16" || dtype == "fp16" || dtype == "fp32", "--dtype ", dtype,
                  ": expected bf16, fp16 or fp32");
    ANATOMY_CHECK(reps > 0 && warmup >= 0 && rows > 0, "--reps and --rows must be positive");
    const DType dt = dtype == "bf16" ? DType::BF16 : dtype == "fp16" ? DType::F16 : DType::F32;
    auto be = device == "cpu" ? make_cpu_backend() : make_cuda_backend(0);
    if (registry) {
#if defined(ANATOMY_BENCH_REGISTRY)
      bench_registry(*be, dt, only, reps, warmup);
      return 0;
#else
      fail("--registry: this build has no tests (ANATOMY_TESTS=OFF), so no op registry");
#endif
    }
    Rng rng(1234);
    std::vector<Row> out;
    out.push_back(bench_copy(*be, reps, warmup));
    for (int64_t n : {1024, 3072, 4096}) out.push_back(bench_bias_grad(*be, dt, rows, n, reps, warmup, rng));
    for (float p : {0.1f, 0.0f}) out.push_back(bench_layernorm_backward(*be, dt, rows, 1024, p, reps, warmup, rng));
    std::printf("\n%s, %s; median of %d calls; GB/s = fewest bytes (inputs read once, outputs written once) / time.\n\n",
                be->name().c_str(), dtype.c_str(), reps);
    std::printf("| op | shape | MB | ms | GB/s |\n|---|---|---:|---:|---:|\n");
    // The bias gradients in the passes that write dY (the model's calls since session 18).
    std::vector<Row> fused{bench_layernorm_backward(*be, dt, rows, 1024, 0.1f, reps, warmup, rng, true),
                           bench_gelu_backward(*be, dt, rows, 4096, false, reps, warmup, rng),
                           bench_gelu_backward(*be, dt, rows, 4096, true, reps, warmup, rng)};
    for (const auto* rows_of : {&out, &fused})
      for (const Row& r : *rows_of)
        std::printf("| %s | %s | %.1f | %.4f | %.0f |\n", r.op.c_str(), r.shape.c_str(), r.bytes / 1e6, r.ms,
                    r.bytes / r.ms / 1e6);
    // Per step of bert-large (24 layers): 4 bias_grad calls (1024, 1024, 3072, 4096) and 2
    // fused LayerNorm backwards per layer.
    if (out.size() == 6) {
      const double bias_ms = 24 * (2 * out[1].ms + out[2].ms + out[3].ms), ln_ms = 24 * 2 * out[4].ms;
      std::printf("\nPer bert-large step (24 layers): bias_grad %.2f ms, layernorm_backward (fused) %.2f ms.\n",
                  bias_ms, ln_ms);
    }
    // The weight gradients of one bert-large layer (hidden 1024, intermediate 4096), accumulated.
    std::vector<WgradRow> wg = {{1024, 1024, "attention output"}, {1024, 4096, "FFN out"},
                                {4096, 1024, "FFN in"}, {3072, 1024, "q|k|v"}};
    for (WgradRow& r : wg) bench_weight_grad(*be, dt, rows, r, reps, warmup, rng);
    std::printf("\nWeight gradients dW F32 [out, in] += dY^T X, %lld rows; ms per call (median).\n\n",
                static_cast<long long>(rows));
    std::printf("| layer | out x in | GEMM alone | GEMM + bias_grad | fused (BGRADB) | saved |\n"
                "|---|---|---:|---:|---:|---:|\n");
    double saved = 0;
    for (const WgradRow& r : wg) {
      std::printf("| %s | %lld x %lld | %.4f | %.4f | %.4f | %.4f |\n", r.layer, static_cast<long long>(r.out),
                  static_cast<long long>(r.in), r.gemm, r.separate, r.fused, r.separate - r.fused);
      saved += r.separate - r.fused;
    }
    std::printf("\nPer bert-large step (24 layers): the fused bias gradients save %.2f ms.\n", 24 * saved);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy_bench_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
