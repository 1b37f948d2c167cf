// ModernBertForSequenceClassification against transformers on the same weights and batch
// (tests/data/golden_family/modernbert*, written by tests/golden/make_golden_modernbert.py):
// logits, loss, every gradient, 5 AdamW steps; the tensor names transformers wrote, saved back.
#include <gtest/gtest.h>

#include <set>

#include "../common/compare.h"
#include "../common/dirs.h"
#include "../common/golden_modernbert.h"

using namespace anatomy;
using namespace anatomy::golden;
using anatomy::testing_compare::same_values;

namespace {
class GoldenModernBert : public testing::TestWithParam<const char*> {};
}  // namespace

TEST_P(GoldenModernBert, ForwardLossAndEveryGradientMatchTransformers) {
  auto be = make_cpu_backend();
  check_modernbert_step(*be, GetParam(), 1e-4);
}

TEST_P(GoldenModernBert, SelectiveCheckpointingMatchesTransformers) {
  auto be = make_cpu_backend();
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::Selective);
}

TEST_P(GoldenModernBert, GradientsInActivationsMatchTransformers) {
  auto be = make_cpu_backend();
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::None, GradientPlacement::InActivations);
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::Selective, GradientPlacement::InActivations);
}

TEST_P(GoldenModernBert, FiveAdamWStepsTrackTransformers) {
  auto be = make_cpu_backend();
  check_modernbert_adamw(*be, GetParam(), 1e-4);
}

// Saved back: exactly the tensors transformers wrote (the generator checked that from_pretrained
// reads them with no missing or unexpected key), the same values, and a config that reads back equal.
TEST_P(GoldenModernBert, SavesTheTensorNamesTransformersLoads) {
  const std::string d = modernbert_dir(GetParam());
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

// --gradient-checkpointing layer and selective (Notes [layer recompute] and [modernbert selective
// recompute] in model/modernbert.cpp), and the gradients in freed activations (Note [modernbert
// gradients in freed activations]) with each, give the gradients and losses of the run that
// keeps everything in buffers of their own, bit for bit, with every head. In the activations
// the gradients are written afresh by each call: the second call on the same batch gives the
// first's (nothing accumulates, nothing of the previous step's is read as an activation).
TEST_P(GoldenModernBert, CheckpointingAndPlacementGiveTheSameGradients) {
  const std::string d = modernbert_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  std::vector<float> want_grads, want_losses;
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Layer, CheckpointPolicy::Selective})
    for (GradientPlacement placement : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      SCOPED_TRACE(std::string(checkpoint_policy_name(policy)) + " " + gradient_placement_name(placement));
      ModernBertForSequenceClassification model(*be, f.cfg, ModelShape{f.B, f.T, DType::F32, policy, true, placement});
      ASSERT_EQ(model.gradients_in_activations(), placement == GradientPlacement::InActivations);
      load_modernbert_weights(d, model);
      Batch batch(*be, f);
      for (int call = 0; call < 2; ++call) {
        if (!model.gradients_in_activations()) model.zero_grads();
        model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));
        const std::vector<float> grads = model.grads_to_host(), losses = to_f32(*be, model.losses());
        if (want_grads.empty()) want_grads = grads, want_losses = losses;
        EXPECT_TRUE(same_values<float>(want_grads, grads)) << "call " << call;
        EXPECT_TRUE(same_values<float>(want_losses, losses)) << "call " << call;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModernBert, testing::ValuesIn(modernbert_cases()),
                         modernbert_test_name);

// What the model allocates is what modernbert_bytes plans, category by category.
TEST(ModernBertMemory, PlannedEqualsAllocated) {
  for (const char* name : modernbert_cases()) {
    Fixture f(modernbert_dir(name));
    auto be = make_cpu_backend();
    const CategoryBytes before = be->allocator().stats().current();
    ModernBertForSequenceClassification model(*be, f.cfg, 5, 13);
    const CategoryBytes after = be->allocator().stats().current(), plan = modernbert_bytes(f.cfg, 5, 13);
    for (Category c : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
      EXPECT_EQ(after[c] - before[c], plan[c]) << name << " " << category_name(c);
    EXPECT_EQ(after.total() - before.total(), plan.total()) << name;
  }
}

TEST(ModernBertConfig, PresetHasTransformersParameterCount) {
  const BertConfig c = BertConfig::preset("modernbert-base");
  EXPECT_TRUE(c.is_modernbert());
  ASSERT_EQ(c.modern.global_layers.size(), 22u);
  EXPECT_TRUE(c.is_global_layer(0) && !c.is_global_layer(1) && !c.is_global_layer(2) && c.is_global_layer(3));
  // ModernBertForSequenceClassification(ModernBertConfig(num_labels=2)) in transformers 5.24.
  EXPECT_EQ(c.num_parameters(), 149606402);
  EXPECT_EQ(static_cast<int64_t>(ParamLayout::for_sequence_classification(c).num_parameters()), c.num_parameters());
}

// A ModernBertModel checkpoint (the encoder alone, saved without the task classes' "model."
// prefix, as transformers writes one) starts a classifier: every encoder tensor is read, only
// the head is new (it was refused: "none of its tensors is a ... parameter").
TEST(ModernBertCheckpoint, ABaseModelCheckpointStartsAClassifier) {
  const std::string d = modernbert_dir("modernbert"), out = testing_dirs::fresh_dir("modernbert_base_only");
  Fixture f(d);
  const SafetensorsReader full = SafetensorsReader::open(d + "/model.safetensors");
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : full.tensors()) {
    if (t.name.rfind("model.", 0) != 0) continue;
    values.push_back(read_f32(full, t.name));
    entries.push_back({t.name.substr(6), DType::F32, full.info(t.name).shape, nullptr});
  }
  ASSERT_FALSE(entries.empty());
  for (size_t i = 0; i < entries.size(); ++i) entries[i].data = values[i].data();
  write_safetensors(out + "/model.safetensors", entries);
  auto be = make_cpu_backend();
  ModernBertForSequenceClassification model(*be, f.cfg, ModelShape{f.B, f.T});
  const LoadReport rep = load_pretrained_weights(out, model);
  EXPECT_TRUE(rep.unused.empty()) << rep.unused.front();
  ASSERT_FALSE(rep.newly_initialized.empty());
  for (const std::string& n : rep.newly_initialized) EXPECT_NE(n.rfind("model.", 0), 0u) << n << " is the encoder's";
  const std::vector<float> host = model.master_to_host();
  const ParamInfo& p = model.layout().get("model.layers.0.attn.Wqkv.weight");
  EXPECT_TRUE(same_values<float>(std::vector<float>(host.begin() + static_cast<std::ptrdiff_t>(p.offset),
                                                    host.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel())),
                                 read_f32(full, "model.layers.0.attn.Wqkv.weight")));
}
