// The CPU engine against Hugging Face transformers on the same weights and batch
// (tests/data/golden, written by tests/golden/make_golden.py).
#include <gtest/gtest.h>

#include "../common/golden.h"

using namespace anatomy;
using namespace anatomy::golden;

TEST(Golden, CpuForwardLossAndEveryGradientMatchTransformers) {
  Fixture f(dir());
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  LoadReport rep = load_pretrained_weights(dir(), model);
  EXPECT_TRUE(rep.newly_initialized.empty());
  Batch batch(*be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);

  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-4);
  std::vector<float> losses = to_f32(*be, model.losses());
  double loss = 0;
  for (float v : losses) loss += v / f.B;
  const float ref_loss = read_f32(f.ref, "loss")[0];
  EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-4);

  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  int checked = 0, zero = 0;
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    ASSERT_EQ(ref.size(), p.numel()) << p.name;
    if (negligible(ref, total)) {
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4 * total) << p.name;
      ++zero;
    } else {
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name;
    }
    ++checked;
  }
  EXPECT_LE(zero, 2);  // only the two key biases
  EXPECT_EQ(checked, static_cast<int>(model.layout().params().size()));
}

TEST(Golden, CpuFiveAdamWStepsTrackTransformers) {
  Fixture f(dir());
  auto be = make_cpu_backend();
  std::vector<float> ours = train_losses(*be, f, DType::F32, OptimizerKind::AdamW, 5);
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ASSERT_EQ(ref.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "step " << i;
}

TEST(Golden, CpuFiveSgdStepsTrackTorch) {
  Fixture f(dir());
  auto be = make_cpu_backend();
  std::vector<float> ours = train_losses(*be, f, DType::F32, OptimizerKind::Sgd, 5);
  std::vector<float> ref = read_f32(f.ref, "sgd_losses");
  for (int i = 0; i < 5; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "step " << i;
}
