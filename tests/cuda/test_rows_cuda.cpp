// The padding-skipping inference path on the GPU (Note [packed inference] in model/bert.cpp):
// gather_rows / scatter_rows against their CPU twin for every dtype and row width (each of the
// kernel's access widths), then the packed forward against the padded one, and evaluate() and
// the inference memory plan in bf16 (6 bytes per parameter of weights).
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "model/bert.h"
#include "ops/backend.h"
#include "train/evaluate.h"

using namespace anatomy;

namespace {

// Random bytes as rows (any dtype moves bit for bit; NaN patterns included).
std::vector<uint8_t> random_bytes(size_t n, std::mt19937& g) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(g());
  return v;
}

// A random subset of [0, R) in random order, without repeats.
std::vector<int32_t> random_rows(int64_t R, int64_t N, std::mt19937& g) {
  std::vector<int32_t> all(R);
  for (int64_t i = 0; i < R; ++i) all[i] = static_cast<int32_t>(i);
  std::shuffle(all.begin(), all.end(), g);
  return std::vector<int32_t>(all.begin(), all.begin() + N);
}

HostBatch random_batch(const std::vector<int64_t>& lengths, int64_t T, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  HostBatch hb;
  hb.resize(static_cast<int64_t>(lengths.size()), T);
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) {
      hb.input_ids[b * T + t] = t == 0 ? 101 : t == lengths[b] - 1 ? 102 : static_cast<int32_t>(rng.randint(1000, vocab));
      hb.attention_mask[b * T + t] = 1;
    }
    hb.labels[b] = static_cast<int32_t>(b % 2);
  }
  return hb;
}

// forward_eval on a host batch; logits as floats.
std::vector<float> logits_of(BertForSequenceClassification& m, const HostBatch& hb, bool packed) {
  Backend& be = m.backend();
  Allocator& al = be.allocator();
  const int64_t B = hb.batch, T = hb.seq;
  Buffer ids(al, DType::I32, {B, T}, Category::Other), types(al, DType::I32, {B, T}, Category::Other),
      mask(al, DType::I32, {B, T}, Category::Other), labels(al, DType::I32, {B}, Category::Other), rows, first;
  be.upload(ids, hb.input_ids.data());
  be.upload(types, hb.token_type_ids.data());
  be.upload(mask, hb.attention_mask.data());
  be.upload(labels, hb.labels.data());
  DeviceBatch db{ids.tensor(), types.tensor(), mask.tensor(), labels.tensor()};
  if (packed) {
    const PackedRows pr = pack_token_rows(hb.attention_mask.data(), B, T);
    rows = Buffer(al, DType::I32, {static_cast<int64_t>(pr.token_rows.size())}, Category::Other);
    first = Buffer(al, DType::I32, {B}, Category::Other);
    be.upload(rows, pr.token_rows.data());
    be.upload(first, pr.first_rows.data());
    db.token_rows = rows.tensor();
    db.first_rows = first.tensor();
  }
  m.forward_eval(db);
  const Tensor& z = m.logits();
  std::vector<float> out(z.numel());
  if (z.dtype == DType::F32) {
    be.download(out.data(), z);
  } else {
    std::vector<uint16_t> h(z.numel());
    be.download(h.data(), z);
    for (size_t i = 0; i < h.size(); ++i) out[i] = z.dtype == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return std::isnan(d) ? INFINITY : d;
}

}  // namespace

TEST(RowsCuda, GatherAndScatterMatchTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 g(seed);
  // Widths in bytes that take the 16-, 8-, 4-, 2- and 1-byte paths; F32 hidden sizes of BERT too.
  struct Case {
    DType dt;
    int64_t cols;
  };
  for (const Case c : {Case{DType::F32, 768}, Case{DType::BF16, 1024}, Case{DType::F16, 36}, Case{DType::F32, 3},
                       Case{DType::BF16, 3}, Case{DType::U8, 5}, Case{DType::I32, 1}, Case{DType::BF16, 2304}})
    for (int64_t offset : {0, 1}) {  // a misaligned base pointer takes a narrower path
      const int64_t R = 37, N = 23;
      const size_t row = static_cast<size_t>(c.cols) * dtype_size(c.dt);
      const std::vector<uint8_t> padded = random_bytes(R * row, g), packed = random_bytes(N * row, g);
      const std::vector<int32_t> idx = random_rows(R, N, g);
      auto make = [&](Backend& be, int64_t rows, std::vector<Buffer>& keep) {
        keep.emplace_back(be.allocator(), c.dt, Shape{rows + offset, c.cols}, Category::Other);
        return keep.back().tensor().slice(offset, rows + offset);
      };
      std::vector<Buffer> keep;
      Tensor g_in = make(*gpu, R, keep), g_out = make(*gpu, N, keep), c_in = make(*cpu, R, keep), c_out = make(*cpu, N, keep);
      keep.emplace_back(gpu->allocator(), DType::I32, Shape{N}, Category::Other);
      const Tensor g_idx = keep.back().tensor();
      keep.emplace_back(cpu->allocator(), DType::I32, Shape{N}, Category::Other);
      const Tensor c_idx = keep.back().tensor();
      gpu->upload(g_idx, idx.data());
      cpu->upload(c_idx, idx.data());
      // Gather into poisoned outputs: every byte must be written, and equal.
      gpu->upload(g_in, padded.data());
      cpu->upload(c_in, padded.data());
      const std::vector<uint8_t> poison(N * row, 0xff);
      gpu->upload(g_out, poison.data());
      gpu->gather_rows(g_out, g_in, g_idx);
      cpu->gather_rows(c_out, c_in, c_idx);
      std::vector<uint8_t> got(N * row), want(N * row);
      gpu->download(got.data(), g_out);
      cpu->download(want.data(), c_out);
      EXPECT_EQ(got, want) << "gather " << dtype_name(c.dt) << " x " << c.cols << " offset " << offset;
      // Scatter over old contents: the rows named change, the others stay.
      gpu->upload(g_out, packed.data());
      cpu->upload(c_out, packed.data());
      gpu->scatter_rows(g_in, g_out, g_idx);
      cpu->scatter_rows(c_in, c_out, c_idx);
      std::vector<uint8_t> got2(R * row), want2(R * row);
      gpu->download(got2.data(), g_in);
      cpu->download(want2.data(), c_in);
      EXPECT_EQ(got2, want2) << "scatter " << dtype_name(c.dt) << " x " << c.cols << " offset " << offset;
    }
}

TEST(RowsCuda, PackedForwardEqualsThePaddedOne) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  auto cpu = make_cpu_backend();
  BertForSequenceClassification ref(*cpu, cfg, {4, 64, DType::F32, CheckpointPolicy::None, false});
  ref.init_weights(3);
  const std::vector<float> weights = ref.master_to_host();
  const HostBatch hb = random_batch({64, 9, 33, 2}, 64, cfg.vocab_size, 4);
  const std::vector<float> want = logits_of(ref, hb, false);
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    auto gpu = make_cuda_backend(0);
    BertForSequenceClassification m(*gpu, cfg, {4, 64, dt, CheckpointPolicy::None, false});
    m.set_master_from_host(weights);
    const std::vector<float> padded = logits_of(m, hb, false), packed = logits_of(m, hb, true);
    const double tol = dt == DType::F32 ? 1e-4 : 5e-2;
    EXPECT_LT(max_abs_diff(packed, padded), tol) << dtype_name(dt);
    EXPECT_LT(max_abs_diff(packed, want), tol) << dtype_name(dt);
  }
}

// evaluate() on the GPU in bf16 from an inference-only model: the weights are the seed page's
// 6 bytes per parameter, nothing else static, and the plan holds.
TEST(RowsCuda, Bf16EvaluationAndItsPlan) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  SyntheticDataset ds(SyntheticKind::Learnable, 50, 64, cfg.vocab_size, 2);
  const ModelShape shape{16, 64, DType::BF16, CheckpointPolicy::None, false};
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  EvalResult fp32;
  {
    BertForSequenceClassification ref(*cpu, cfg, {16, 64, DType::F32, CheckpointPolicy::None, false});
    ref.init_weights(6);
    fp32 = evaluate(ref, ds);
  }
  BertForSequenceClassification m(*gpu, cfg, shape);
  m.init_weights(6);
  for (bool skip : {true, false}) {
    EvalOptions o;
    o.skip_padding = skip;
    o.skip_padding_min_fraction = 0;
    o.batch_size = 16;
    const EvalResult r = evaluate(m, ds, o);
    EXPECT_NEAR(r.loss, fp32.loss, 2e-2) << skip;
    int same = 0;
    for (size_t i = 0; i < ds.size(); ++i) same += r.predictions[i] == fp32.predictions[i];
    EXPECT_GE(same, 45) << skip;  // near-ties may flip in bf16
    EXPECT_EQ(r.computed_tokens < r.padded_tokens, skip);
  }
  const CategoryBytes peak = gpu->allocator().stats().peak();
  const int64_t n = cfg.num_parameters();
  EXPECT_EQ(peak[Category::Weights], 6 * n);
  EXPECT_EQ(peak[Category::Gradients], 0);
  EXPECT_EQ(peak[Category::OptimizerState], 0);
  const MemoryPlan plan = plan_evaluation(cfg, shape, Device::CUDA, true);
  for (Category c : {Category::Weights, Category::Activations, Category::Workspace, Category::Other})
    EXPECT_EQ(peak[c], plan.bytes[c]) << category_name(c);
  EXPECT_LE(peak[Category::Temporary], plan.bytes[Category::Temporary]);
}
