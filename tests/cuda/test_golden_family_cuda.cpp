// The CUDA engine on the encoder variants' golden fixtures (tests/data/golden_family, written by
// tests/golden/make_golden_family.py): fp32 within 1e-4 of transformers, bf16 within 2e-2 on the
// logits and loss with cosine >= 0.999 on each gradient, 5 AdamW steps; and each variant's
// step on the batch's real tokens equal to its padded step.
#include <gtest/gtest.h>

#include <algorithm>

#include "../common/compare.h"
#include "../common/golden.h"
#include "../common/packed_step.h"

using namespace anatomy;
using anatomy::testing_compare::largest_magnitude;
using namespace anatomy::golden;

namespace {

std::string family_dir(const std::string& arch) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + arch;
}

void check_forward_backward(const std::string& arch, DType dt, double tol, double min_cos, double grad_rel) {
  const std::string d = family_dir(arch);
  Fixture f(d);
  auto be = make_cuda_backend(0);
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, dt, CheckpointPolicy::None, true});
  load_pretrained_weights(d, model);
  Batch batch(*be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  Measured m{arch + " " + std::string(dtype_name(dt))};
  m.logits = rel_err(logits.data(), ref_logits.data(), logits.size());
  EXPECT_LE(m.logits, tol);
  double loss = 0;
  for (float v : to_f32(*be, model.losses())) loss += v / static_cast<double>(f.B);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  m.loss = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(m.loss, tol);
  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    if (negligible(ref, total)) {
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), (grad_rel > 0 ? 1e-4 : 2e-2) * total) << p.name;
      continue;
    }
    if (grad_rel > 0) {
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), grad_rel) << p.name;
    }
    EXPECT_GE(m.gradient(p.name, cosine(grads.data() + p.offset, ref.data(), ref.size())), min_cos) << p.name;
  }
}

class GoldenFamilyCuda : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace

TEST_P(GoldenFamilyCuda, Fp32MatchesTransformers) { check_forward_backward(GetParam(), DType::F32, 1e-4, 0.99999, 1e-4); }

TEST_P(GoldenFamilyCuda, Bf16MatchesTransformers) { check_forward_backward(GetParam(), DType::BF16, 2e-2, 0.999, 0); }

TEST_P(GoldenFamilyCuda, FiveAdamWStepsTrack) {
  const std::string d = family_dir(GetParam());
  Fixture f(d);
  auto be = make_cuda_backend(0);
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  load_pretrained_weights(d, model);
  Batch batch(*be, f);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(*be, oo, model.layout());
  GradNorm norm(*be, model.layout().total());
  const std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  for (int s = 0; s < 5; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    double loss = 0;
    for (float v : to_f32(*be, model.losses())) loss += v / static_cast<double>(f.B);
    EXPECT_LE(std::abs(loss - ref[s]) / std::abs(ref[s]), 1e-4) << "step " << s;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
}

TEST_P(GoldenFamilyCuda, RealTokenStepEqualsThePaddedStep) {
  BertConfig cfg = BertConfig::from_json_file(family_dir(GetParam()) + "/config.json");
  const int64_t T = 9;
  HostBatch hb = testing_packed::batch_of({9, 5, 2}, T, 3);
  for (int32_t& id : hb.input_ids) id = static_cast<int32_t>(id % cfg.vocab_size);
  if (cfg.is_roberta()) std::fill(hb.token_type_ids.begin(), hb.token_type_ids.end(), 0);
  auto be = make_cuda_backend(0);
  const auto padded = testing_packed::step(*be, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  const auto packed = testing_packed::step(*be, cfg, hb, true, CheckpointPolicy::Selective, GradientPlacement::InActivations);
  ASSERT_GT(largest_magnitude(padded.grads), 1e-4);
  double worst = 0;
  for (size_t i = 0; i < padded.grads.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(packed.grads[i] - padded.grads[i])));
  EXPECT_LE(worst, 1e-4 * largest_magnitude(padded.grads));
  for (size_t i = 0; i < padded.losses.size(); ++i) EXPECT_NEAR(packed.losses[i], padded.losses[i], 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Arch, GoldenFamilyCuda, testing::Values("roberta", "xlm-roberta", "distilbert", "electra"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });
