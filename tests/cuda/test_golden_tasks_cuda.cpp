// The CUDA engine on the regression and multi-label golden fixtures (tests/data/golden_tasks,
// written by tests/golden/make_golden_tasks.py): fp32 within 1e-4 of transformers, bf16 within
// 2e-2 on the logits and loss with cosine >= 0.999 on each gradient, 5 AdamW steps; and the
// mse_loss / bce_with_logits head step against its CPU twin on the same weights.
#include <gtest/gtest.h>

#include "../common/golden_tasks.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

struct StepResult {
  std::vector<float> logits, losses, grads;
};

StepResult one_step(Backend& be, const TaskFixture& t, DType dt) {
  BertForSequenceClassification model(be, t.f.cfg, {t.f.B, t.f.T, dt, CheckpointPolicy::None, true});
  load_pretrained_weights(t.dir, model);
  FloatBatch batch(be, t);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(t.f.B), 0);
  return {to_f32(be, model.logits()), to_f32(be, model.losses()), model.grads_to_host()};
}

void check_against_transformers(const char* name, DType dt, double tol, double min_cos, double grad_rel) {
  TaskFixture t(name);
  auto be = make_cuda_backend(0);
  const StepResult r = one_step(*be, t, dt);
  const std::vector<float> ref_logits = read_f32(t.f.ref, "logits");
  Measured m{std::string(name) + " " + std::string(dtype_name(dt))};
  m.logits = rel_err(r.logits.data(), ref_logits.data(), r.logits.size());
  EXPECT_LE(m.logits, tol);
  double loss = 0;
  for (float v : r.losses) loss += v / static_cast<double>(t.f.B);
  const float ref_loss = read_f32(t.f.ref, "loss")[0];
  m.loss = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(m.loss, tol);
  BertForSequenceClassification shape_only(*be, t.f.cfg, {1, 4, DType::F32, CheckpointPolicy::None, false});
  std::vector<std::string> names;
  for (const auto& p : shape_only.layout().params()) names.push_back(p.name);
  const double total = grads_norm(t.f.ref, names);
  for (const auto& p : shape_only.layout().params()) {
    const std::vector<float> ref = read_f32(t.f.ref, "grad." + p.name);
    if (negligible(ref, total)) {
      EXPECT_LE(abs_err(r.grads.data() + p.offset, ref.data(), ref.size()), (grad_rel > 0 ? 1e-4 : 2e-2) * total) << p.name;
      continue;
    }
    if (grad_rel > 0) {
      EXPECT_LE(rel_err(r.grads.data() + p.offset, ref.data(), ref.size()), grad_rel) << p.name;
    }
    EXPECT_GE(m.gradient(p.name, cosine(r.grads.data() + p.offset, ref.data(), ref.size())), min_cos) << p.name;
  }
}

class GoldenTasksCuda : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace

TEST_P(GoldenTasksCuda, Fp32MatchesTransformers) { check_against_transformers(GetParam(), DType::F32, 1e-4, 0.99999, 1e-4); }

TEST_P(GoldenTasksCuda, Bf16MatchesTransformers) { check_against_transformers(GetParam(), DType::BF16, 2e-2, 0.999, 0); }

// The GPU step equals its CPU twin (fp32): losses, logits and every gradient.
TEST_P(GoldenTasksCuda, MatchesTheCpuTwin) {
  TaskFixture t(GetParam());
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  const StepResult g = one_step(*gpu, t, DType::F32), c = one_step(*cpu, t, DType::F32);
  EXPECT_LE(rel_err(g.logits.data(), c.logits.data(), c.logits.size()), 1e-5);
  EXPECT_LE(rel_err(g.losses.data(), c.losses.data(), c.losses.size()), 1e-5);
  EXPECT_LE(rel_err(g.grads.data(), c.grads.data(), c.grads.size()), 1e-4);
}

TEST_P(GoldenTasksCuda, FiveAdamWStepsTrack) {
  TaskFixture t(GetParam());
  auto be = make_cuda_backend(0);
  BertForSequenceClassification model(*be, t.f.cfg, {t.f.B, t.f.T, DType::F32, CheckpointPolicy::None, true});
  load_pretrained_weights(t.dir, model);
  FloatBatch batch(*be, t);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(*be, oo, model.layout());
  GradNorm norm(*be, model.layout().total());
  const std::vector<float> ref = read_f32(t.f.ref, "adamw_losses");
  for (int s = 0; s < 5; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(t.f.B), 0);
    double loss = 0;
    for (float v : to_f32(*be, model.losses())) loss += v / static_cast<double>(t.f.B);
    EXPECT_LE(std::abs(loss - ref[s]) / std::abs(ref[s]), 1e-4) << "step " << s;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenTasksCuda, testing::ValuesIn(task_cases()),
                         [](const testing::TestParamInfo<const char*>& i) { return case_test_name(i.param); });
