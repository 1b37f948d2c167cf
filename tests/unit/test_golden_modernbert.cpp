// ModernBertForSequenceClassification against transformers on the same weights and batch
// (tests/data/golden_family/modernbert*, written by tests/golden/make_golden_modernbert.py):
// logits, loss, every gradient, 5 AdamW steps; the tensor names transformers wrote, saved back.
#include <gtest/gtest.h>

#include <set>

#include "../common/compare.h"
#include "../common/dirs.h"
#include "../common/golden.h"
#include "model/modernbert.h"

using namespace anatomy;
using namespace anatomy::golden;
using anatomy::testing_compare::same_values;

namespace {

std::string fixture_dir(const std::string& name) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + name;
}

double mean_loss(Backend& be, const ModernBertForSequenceClassification& m, int64_t B) {
  double s = 0;
  for (float v : to_f32(be, m.losses())) s += v / static_cast<double>(B);
  return s;
}

class GoldenModernBert : public testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GoldenModernBert, ForwardLossAndEveryGradientMatchTransformers) {
  const std::string d = fixture_dir(GetParam());
  Fixture f(d);
  ASSERT_TRUE(f.cfg.is_modernbert());
  auto be = make_cpu_backend();
  ModernBertForSequenceClassification model(*be, f.cfg, f.B, f.T);
  const std::vector<std::string> unused = load_modernbert_weights(d, model);
  EXPECT_TRUE(unused.empty()) << unused.front();
  Batch batch(*be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));

  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-4);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  EXPECT_LE(std::abs(mean_loss(*be, model, f.B) - ref_loss) / std::abs(ref_loss), 1e-4);

  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    ASSERT_EQ(ref.size(), p.numel()) << p.name;
    if (negligible(ref, total))
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4 * total) << p.name;
    else
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name;
  }
}

TEST_P(GoldenModernBert, FiveAdamWStepsTrackTransformers) {
  const std::string d = fixture_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  ModernBertForSequenceClassification model(*be, f.cfg, f.B, f.T);
  load_modernbert_weights(d, model);
  Batch batch(*be, f);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(*be, oo, model.layout());
  GradNorm norm(*be, model.layout().total());
  std::vector<float> ours;
  for (int s = 0; s <= 5; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));
    ours.push_back(static_cast<float>(mean_loss(*be, model, f.B)));
    if (s == 5) break;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ref.push_back(read_f32(f.ref, "adamw_final_loss")[0]);
  ASSERT_EQ(ref.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "step " << i;
  const std::vector<float> params = model.master_to_host();
  for (const auto& p : model.layout().params()) {
    std::vector<float> want = read_f32(f.ref, "adamw_final." + p.name);
    EXPECT_LE(rel_err(params.data() + p.offset, want.data(), want.size()), 1e-4) << p.name;
  }
}

// Saved back: exactly the tensors transformers wrote (the generator checked that from_pretrained
// reads them with no missing or unexpected key), the same values, and a config that reads back equal.
TEST_P(GoldenModernBert, SavesTheTensorNamesTransformersLoads) {
  const std::string d = fixture_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  ModernBertForSequenceClassification model(*be, f.cfg, 1, 4);
  load_modernbert_weights(d, model);
  const std::string out = testing_dirs::fresh_dir(std::string("modernbert_save_") + GetParam());
  save_modernbert(out, model);
  std::set<std::string> ours, theirs;
  SafetensorsReader a = SafetensorsReader::open(out + "/model.safetensors"), b = SafetensorsReader::open(d + "/model.safetensors");
  for (const auto& t : a.tensors()) ours.insert(t.name);
  for (const auto& t : b.tensors()) theirs.insert(t.name);
  EXPECT_EQ(ours, theirs);
  for (const std::string& n : theirs) {
    if (ours.count(n)) {
      EXPECT_TRUE(same_values<float>(read_f32(a, n), read_f32(b, n))) << n;
    }
  }
  EXPECT_EQ(BertConfig::from_json_file(out + "/config.json"), f.cfg);
  EXPECT_EQ(static_cast<size_t>(f.cfg.num_parameters()), model.layout().num_parameters());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModernBert, testing::Values("modernbert", "modernbert-bias-mean"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(ModernBertConfig, PresetHasTransformersParameterCount) {
  const BertConfig c = BertConfig::preset("modernbert-base");
  EXPECT_TRUE(c.is_modernbert());
  ASSERT_EQ(c.modern.global_layers.size(), 22u);
  EXPECT_TRUE(c.is_global_layer(0) && !c.is_global_layer(1) && !c.is_global_layer(2) && c.is_global_layer(3));
  // ModernBertForSequenceClassification(ModernBertConfig(num_labels=2)) in transformers 5.24.
  EXPECT_EQ(c.num_parameters(), 149606402);
  EXPECT_EQ(static_cast<int64_t>(ParamLayout::for_sequence_classification(c).num_parameters()), c.num_parameters());
}
