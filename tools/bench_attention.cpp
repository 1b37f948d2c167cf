// anatomy_bench_attention: the attention ops alone (bert-large shapes by default: T = 512, 16
// heads, head_dim 64, BF16), through the Backend interface as the model calls them: a key
// padding mask of all ones, dropout 0.1 and 0. Each call is timed with CUDA events after a
// warm-up; the median of --reps calls is reported, alternating between two input sets (fresh
// random values, never zeros). FLOPs: forward 4*B*heads*T^2*D (the two products S = QK^T and
// O = PV), backward 2.5x that (five products, as FlashAttention counts them). The backward
// includes its small pre- and post-passes (Dsum = rowsum(dO*O), the dQ conversion).
// bench/attention_sdpa.py prints the same table for PyTorch's scaled_dot_product_attention.
// --window w (ModernBERT's local layers: w = 64) limits each query to the keys within w of it
// (rows named "anatomy <forward>/<backward kernel>, window w"); their TFLOP/s still count the full T^2 products, so
// compare times, not TFLOP/s, across windows. --queries q (Note [attention scope] in
// ops/op_args.h; 1: the last layer under a first-token head) computes each sequence's first q
// queries alone (rows "..., first q queries"; TFLOP/s as above).
//
//   anatomy_bench_attention [--batch 32 --batch 4] [--seq 512 --seq 128] [--head-dim 64 --head-dim 32]
//                           [--heads 16] [--dtype bf16] [--window 0 --window 64] [--queries 0 --queries 1]
//                           [--reps 50] [--warmup 10]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/backend.h"
#include "ops/cuda/attention.h"

using namespace anatomy;

namespace {

struct Shape4 {
  int64_t B = 0, T = 0, heads = 0, D = 0;
};

struct Row {
  Shape4 sh;
  AttentionScope scope;
  float p = 0;
  double fwd_ms = 0, bwd_ms = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<uint8_t> random_half(size_t n, DType dt, Rng& rng, double amp) {
  std::vector<uint8_t> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const float x = static_cast<float>((2.0 * rng.uniform() - 1.0) * amp);
    const uint16_t h = dt == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
    std::memcpy(&out[2 * i], &h, 2);
  }
  return out;
}

Row run(Backend& be, DType dt, const Shape4& sh, AttentionScope scope, float p, int reps, int warmup) {
  const int64_t B = sh.B, T = sh.T, heads = sh.heads, H = heads * sh.D;
  constexpr int kSets = 2;
  Allocator& al = be.allocator();
  Rng rng(1234 + static_cast<uint64_t>(B));
  std::vector<Buffer> qkv, ctx, lse, dctx;
  for (int s = 0; s < kSets; ++s) {
    qkv.emplace_back(al, dt, Shape{B, T, 3 * H}, Category::Other);
    ctx.emplace_back(al, dt, Shape{B, T, H}, Category::Other);
    lse.emplace_back(al, DType::F32, Shape{B, heads, T}, Category::Other);
    dctx.emplace_back(al, dt, Shape{B, T, H}, Category::Other);
    be.upload(qkv.back(), random_half(static_cast<size_t>(B * T * 3 * H), dt, rng, 2.5).data());
    be.upload(dctx.back(), random_half(static_cast<size_t>(B * T * H), dt, rng, 1.0).data());
  }
  Buffer mask(al, DType::I32, Shape{B, T}, Category::Other), dqkv(al, dt, Shape{B, T, 3 * H}, Category::Other);
  const std::vector<int32_t> ones(static_cast<size_t>(B * T), 1);
  be.upload(mask, ones.data());
  DropoutSpec d;
  d.p = p;
  d.seed = 42;

  auto fwd = [&](int s, int i) {
    d.offset = static_cast<uint64_t>(i);
    be.attention_forward(ctx[s], lse[s], qkv[s], mask, static_cast<int>(heads), d, scope);
  };
  auto bwd = [&](int s, int i) {
    d.offset = static_cast<uint64_t>(i);
    be.attention_backward(dqkv, dctx[s], qkv[s], ctx[s], lse[s], mask, static_cast<int>(heads), d, scope);
  };
  for (int i = 0; i < warmup; ++i) {
    fwd(i % kSets, i);
    bwd(i % kSets, i);
  }
  for (int s = 0; s < kSets; ++s) fwd(s, s);  // ctx and lse of each set for the backward
  be.synchronize();
  be.timing_reset();
  std::vector<int> marks;
  for (int i = 0; i < reps; ++i) {
    marks.push_back(be.timing_mark());
    fwd(i % kSets, i);
    marks.push_back(be.timing_mark());
  }
  for (int s = 0; s < kSets; ++s) fwd(s, s);
  for (int i = 0; i < reps; ++i) {
    marks.push_back(be.timing_mark());
    bwd(i % kSets, i % kSets);
    marks.push_back(be.timing_mark());
  }
  be.synchronize();
  std::vector<double> tf, tb;
  for (int i = 0; i < reps; ++i) tf.push_back(be.timing_elapsed_ms(marks[2 * i], marks[2 * i + 1]));
  for (int i = 0; i < reps; ++i) tb.push_back(be.timing_elapsed_ms(marks[2 * (reps + i)], marks[2 * (reps + i) + 1]));
  be.timing_reset();
  return Row{sh, scope, p, median(tf), median(tb)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anatomy_bench_attention: attention forward/backward (default: bert-large shapes, T 512, 16 heads, D 64)"};
  std::vector<int64_t> batches, seqs, head_dims;
  std::vector<int> windows, queries;
  int64_t heads = 16;
  std::string dtype = "bf16";
  int reps = 50, warmup = 10;
  app.add_option("--batch", batches, "Batch sizes (repeatable); default 32 and 4");
  app.add_option("--seq", seqs, "Sequence lengths (repeatable); default 512");
  app.add_option("--head-dim", head_dims, "Head dims (repeatable); default 64");
  app.add_option("--window", windows, "Local attention windows (repeatable; 0: none); default 0");
  app.add_option("--queries", queries, "Each sequence's first queries alone (repeatable; 0: every query); default 0");
  app.add_option("--heads", heads, "Attention heads")->capture_default_str();
  app.add_option("--dtype", dtype, "bf16 or fp16")->capture_default_str();
  app.add_option("--reps", reps, "Timed calls per op (median reported)")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed forward+backward calls first")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    ANATOMY_CHECK(cuda_available(), "no CUDA device (or this build has no CUDA backend)");
    ANATOMY_CHECK(dtype == "bf16" || dtype == "fp16", "--dtype ", dtype, ": expected bf16 or fp16");
    ANATOMY_CHECK(reps > 0 && warmup >= 0, "--reps must be positive");
    ANATOMY_CHECK(heads > 0, "--heads must be positive");
    for (int w : windows) ANATOMY_CHECK(w >= 0, "--window ", w, ": expected 0 (none) or a positive width");
    for (int q : queries) ANATOMY_CHECK(q >= 0, "--queries ", q, ": expected 0 (every query) or a positive count");
    const DType dt = dtype == "bf16" ? DType::BF16 : DType::F16;
    if (batches.empty()) batches = {32, 4};
    if (seqs.empty()) seqs = {512};
    if (head_dims.empty()) head_dims = {64};
    if (windows.empty()) windows = {0};
    if (queries.empty()) queries = {0};
    auto be = make_cuda_backend(0);
    std::vector<Row> rows;
    for (int64_t D : head_dims)
      for (int64_t T : seqs)
        for (int64_t B : batches)
          for (int w : windows)
            for (int q : queries)
              for (float p : {0.1f, 0.0f})
                rows.push_back(run(*be, dt, Shape4{B, T, heads, D}, AttentionScope{w, q}, p, reps, warmup));
    std::printf("\n%s, %s, key padding mask of all ones; median of %d calls. "
                "FLOPs: forward 4*B*h*T^2*D, backward 2.5x forward.\n\n",
                be->name().c_str(), dtype.c_str(), reps);
    std::printf("| impl | B | T | heads | D | dropout | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd+bwd ms | "
                "fwd+bwd TFLOP/s |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Row& r : rows) {
      const Shape4& q = r.sh;
      const double fl = 4.0 * static_cast<double>(q.B) * q.heads * static_cast<double>(q.T) * q.T * q.D;
      // The kernel families, forward/backward.
      const int w = r.scope.window, nq = r.scope.queries;
      const std::string impl = std::string("anatomy ") + cuda::attention_forward_kernel(dt, q.D, w) + "/" +
                               cuda::attention_backward_kernel(dt, q.D, w) +
                               (w > 0 ? ", window " + std::to_string(w) : "") +
                               (nq > 0 ? ", first " + std::to_string(nq) + " queries" : "");
      std::printf("| %s | %lld | %lld | %lld | %lld | %.1f | %.3f | %.1f | %.3f | %.1f | %.3f | %.1f |\n", impl.c_str(),
                  static_cast<long long>(q.B), static_cast<long long>(q.T), static_cast<long long>(q.heads),
                  static_cast<long long>(q.D), r.p, r.fwd_ms, fl / r.fwd_ms / 1e9, r.bwd_ms, 2.5 * fl / r.bwd_ms / 1e9,
                  r.fwd_ms + r.bwd_ms, 3.5 * fl / (r.fwd_ms + r.bwd_ms) / 1e9);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy_bench_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
