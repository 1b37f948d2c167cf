// ModernBERT's golden checks on any backend (tests/data/golden_family/modernbert*, written by
// tests/golden/make_golden_modernbert.py): shared by the CPU test
// (tests/unit/test_golden_modernbert.cpp) and the GPU one (tests/cuda/test_golden_modernbert_cuda.cpp).
#pragma once
#include <gtest/gtest.h>

#include "golden.h"
#include "model/heads.h"
#include "model/modernbert.h"

namespace anatomy::golden {

inline std::string modernbert_dir(const std::string& name) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + name;
}

// The fixtures, shared by the CPU and GPU tests: sequence classification (no biases with cls
// pooling; every bias with mean pooling), token classification, masked LM, regression (num_labels
// 1) and multi-label (num_labels 4).
inline const std::vector<const char*>& modernbert_cases() {
  static const std::vector<const char*> cases{"modernbert",     "modernbert-bias-mean",  "modernbert-ner",
                                              "modernbert-mlm", "modernbert-regression", "modernbert-multilabel"};
  return cases;
}

inline double modernbert_mean_loss(Backend& be, const ModernBertForSequenceClassification& m, int64_t B) {
  double s = 0;
  for (float v : to_f32(be, m.losses())) s += v / static_cast<double>(B);
  return s;
}

// Logits, loss and every gradient of one step within `tol` (relative; a gradient that is zero in
// exact arithmetic in absolute terms against tol times the norm of all gradients), with the
// given gradient checkpointing and placement.
inline void check_modernbert_step(Backend& be, const std::string& name, double tol,
                                  CheckpointPolicy policy = CheckpointPolicy::None,
                                  GradientPlacement placement = GradientPlacement::Own) {
  const std::string d = modernbert_dir(name);
  Fixture f(d);
  ASSERT_TRUE(f.cfg.is_modernbert());
  ModernBertForSequenceClassification model(be, f.cfg, ModelShape{f.B, f.T, DType::F32, policy, true, placement});
  EXPECT_EQ(model.gradients_in_activations(), placement == GradientPlacement::InActivations);
  const std::vector<std::string> unused = load_modernbert_weights(d, model);
  EXPECT_TRUE(unused.empty()) << unused.front();
  Batch batch(be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));
  std::vector<float> logits = to_f32(be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), tol);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  EXPECT_LE(std::abs(modernbert_mean_loss(be, model, f.B) - ref_loss) / std::abs(ref_loss), tol);
  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    ASSERT_EQ(ref.size(), p.numel()) << p.name;
    if (negligible(ref, total))
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), tol * total) << p.name;
    else
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), tol) << p.name;
  }
}

// 5 AdamW steps with the fixture's recipe (lr 1e-3, decay 0.01 on matrices, clip 1.0): the loss
// before each and after the last, and every parameter at the end, within `tol`.
inline void check_modernbert_adamw(Backend& be, const std::string& name, double tol) {
  const std::string d = modernbert_dir(name);
  Fixture f(d);
  ModernBertForSequenceClassification model(be, f.cfg, f.B, f.T);
  load_modernbert_weights(d, model);
  Batch batch(be, f);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(be, oo, model.layout());
  GradNorm norm(be, model.layout().total());
  std::vector<float> ours;
  for (int s = 0; s <= 5; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));
    ours.push_back(static_cast<float>(modernbert_mean_loss(be, model, f.B)));
    if (s == 5) break;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ref.push_back(read_f32(f.ref, "adamw_final_loss")[0]);
  ASSERT_EQ(ref.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), tol) << "step " << i;
  const std::vector<float> params = model.master_to_host();
  for (const auto& p : model.layout().params()) {
    std::vector<float> want = read_f32(f.ref, "adamw_final." + p.name);
    EXPECT_LE(rel_err(params.data() + p.offset, want.data(), want.size()), tol) << p.name;
  }
}

inline std::string modernbert_test_name(const testing::TestParamInfo<const char*>& i) {
  std::string s = i.param;
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

}  // namespace anatomy::golden
