// The sequence-classification problem types on float labels (Note [problem types] in
// model/heads.h) against transformers on the same weights and batch (tests/data/golden_tasks/CASE,
// written by tests/golden/make_golden_tasks.py; the cases in task_cases()): regression with one,
// two and three outputs and multi-label on BERT, RoBERTa, XLM-R, DistilBERT and ELECTRA (ModernBERT's
// are in test_golden_modernbert.cpp). Logits, loss, every gradient, 5 AdamW steps.
#include <gtest/gtest.h>

#include "../common/golden_tasks.h"
#include "model/heads.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

double mean_loss(Backend& be, const BertForSequenceClassification& m, int64_t B) {
  double s = 0;
  for (float v : to_f32(be, m.losses())) s += v / static_cast<double>(B);
  return s;
}

class GoldenTasks : public testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GoldenTasks, ProblemTypeIsTransformers) {
  TaskFixture t(GetParam());
  const std::string name = GetParam();
  const ProblemType want = name.find("multilabel") != std::string::npos ? ProblemType::MultiLabel : ProblemType::Regression;
  EXPECT_EQ(problem_type_of(t.f.cfg), want) << name;
  EXPECT_EQ(t.labels.size(), static_cast<size_t>(t.f.B * t.f.cfg.num_labels));
}

TEST_P(GoldenTasks, ForwardLossAndEveryGradientMatchTransformers) {
  TaskFixture t(GetParam());
  const Fixture& f = t.f;
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  LoadReport rep = load_pretrained_weights(t.dir, model);
  EXPECT_TRUE(rep.newly_initialized.empty());
  EXPECT_TRUE(rep.unused.empty());
  FloatBatch batch(*be, t);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);

  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  ASSERT_EQ(logits.size(), ref_logits.size());
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-4);
  const double loss = mean_loss(*be, model, f.B);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-4) << loss << " vs " << ref_loss;

  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  int zero = 0;
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    ASSERT_EQ(ref.size(), p.numel()) << p.name;
    if (negligible(ref, total)) {
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4 * total) << p.name;
      ++zero;
    } else {
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name;
    }
  }
  EXPECT_LE(zero, 2);  // the two key biases
}

TEST_P(GoldenTasks, FiveAdamWStepsTrackTransformers) {
  TaskFixture t(GetParam());
  const Fixture& f = t.f;
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  load_pretrained_weights(t.dir, model);
  FloatBatch batch(*be, t);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(*be, oo, model.layout());
  GradNorm norm(*be, model.layout().total());
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ref.push_back(read_f32(f.ref, "adamw_final_loss")[0]);
  ASSERT_EQ(ref.size(), 6u);
  for (int s = 0; s <= 5; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    const double loss = mean_loss(*be, model, f.B);
    EXPECT_LE(std::abs(loss - ref[s]) / std::abs(ref[s]), 1e-4) << "step " << s;
    if (s == 5) break;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
  // The final weights, not only the losses; but for the key biases, whose gradient is rounding
  // noise (golden.h) that Adam's normalization turns into steps of either sign.
  std::vector<float> w = model.master_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model.layout().params()) {
    if (negligible(read_f32(f.ref, "grad." + p.name), total)) continue;
    std::vector<float> r = read_f32(f.ref, "adamw_final." + p.name);
    EXPECT_LE(rel_err(w.data() + p.offset, r.data(), r.size()), 1e-4) << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTasks,
                         testing::ValuesIn(task_cases()),
                         [](const testing::TestParamInfo<const char*>& i) { return case_test_name(i.param); });
