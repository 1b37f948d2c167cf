// The CUDA engine against Hugging Face transformers (tests/data/golden): fp32 within 1e-4;
// bf16 within 2e-2 on the loss and cosine >= 0.999 on each gradient; 5-step losses track.
#include <gtest/gtest.h>

#include "../common/golden.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

void check_forward_backward(DType dt, double logit_tol, double loss_tol, double min_cos, double grad_rel) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Fixture f(dir());
  auto be = make_cuda_backend(0);
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, dt, CheckpointPolicy::None, true});
  load_pretrained_weights(dir(), model);
  Batch batch(*be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  Measured m{std::string("golden ") + std::string(dtype_name(dt))};
  m.logits = rel_err(logits.data(), ref_logits.data(), logits.size());
  EXPECT_LE(m.logits, logit_tol);
  std::vector<float> losses = to_f32(*be, model.losses());
  double loss = 0;
  for (float v : losses) loss += v / f.B;
  const float ref_loss = read_f32(f.ref, "loss")[0];
  m.loss = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(m.loss, loss_tol);
  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    if (negligible(ref, total)) {  // analytically zero (key biases): absolute comparison
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), (grad_rel > 0 ? 1e-4 : 2e-2) * total) << p.name;
      continue;
    }
    if (grad_rel > 0) {
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), grad_rel) << p.name;
    }
    EXPECT_GE(m.gradient(p.name, cosine(grads.data() + p.offset, ref.data(), ref.size())), min_cos) << p.name;
  }
}

}  // namespace

TEST(GoldenCuda, Fp32MatchesTransformers) { check_forward_backward(DType::F32, 1e-4, 1e-4, 0.99999, 1e-4); }

TEST(GoldenCuda, Bf16MatchesTransformers) { check_forward_backward(DType::BF16, 2e-2, 2e-2, 0.999, 0); }

TEST(GoldenCuda, FiveAdamWStepsTrack) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Fixture f(dir());
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  auto be = make_cuda_backend(0);
  std::vector<float> fp32 = train_losses(*be, f, DType::F32, OptimizerKind::AdamW, 5);
  std::vector<float> bf16 = train_losses(*be, f, DType::BF16, OptimizerKind::AdamW, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_LE(std::abs(fp32[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "fp32 step " << i;
    EXPECT_LE(std::abs(bf16[i] - ref[i]) / std::abs(ref[i]), 2e-2) << "bf16 step " << i;
  }
}
