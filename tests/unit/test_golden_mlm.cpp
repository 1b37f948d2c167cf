// The per-token heads, masked-LM (Note [masked LM head] in model/heads.h) and token
// classification (Note [token classification head]), against transformers' {Bert,Roberta,
// XLMRoberta}ForMaskedLM and {Bert,Roberta,XLMRoberta,DistilBert,Electra}ForTokenClassification on the same weights and
// batch (tests/data/golden_mlm, written by tests/golden/make_golden_mlm.py): logits, the loss over the masked tokens, every
// gradient (the tied decoder's inside the word embeddings'), 5 AdamW steps; saved with exactly
// the tensors transformers wrote; the memory plan equal to what the model allocates.
#include <gtest/gtest.h>

#include <set>

#include "../common/dirs.h"
#include "../common/golden.h"
#include "memory/planner.h"
#include "model/heads.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

std::string mlm_dir(const std::string& name) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_mlm/" + name;
}

double mean_loss(Backend& be, const BertForSequenceClassification& m, int64_t B) {
  double s = 0;
  for (float v : to_f32(be, m.losses())) s += v / static_cast<double>(B);
  return s;
}

std::set<std::string> tensor_names(const std::string& file) {
  std::set<std::string> out;
  const SafetensorsReader r = SafetensorsReader::open(file);
  for (const auto& t : r.tensors()) out.insert(t.name);
  return out;
}

class GoldenMlm : public testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GoldenMlm, ForwardLossAndEveryGradientMatchTransformers) {
  const std::string d = mlm_dir(GetParam());
  Fixture f(d);
  ASSERT_TRUE(has_token_labels(f.cfg));
  auto be = make_cpu_backend();
  for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
    BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true, place});
    LoadReport rep = load_pretrained_weights(d, model);
    EXPECT_TRUE(rep.newly_initialized.empty());
    EXPECT_TRUE(rep.unused.empty());
    Batch batch(*be, f);
    ASSERT_GT(batch.db.masked_tokens, 0);
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    if (place == GradientPlacement::InActivations) {
      EXPECT_TRUE(model.gradients_in_activations());
    }

    // The logits of the tokens (RoBERTa's padding rows read other position rows than
    // transformers': Note [roberta positions] in model/bert.cpp; nothing reads them).
    std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
    ASSERT_EQ(logits.size(), ref_logits.size());
    const size_t V = logits.size() / f.mask.size();  // vocab_size, or num_labels
    std::vector<float> ours, theirs;
    for (size_t r = 0; r < f.mask.size(); ++r)
      if (f.mask[r]) {
        ours.insert(ours.end(), logits.begin() + r * V, logits.begin() + (r + 1) * V);
        theirs.insert(theirs.end(), ref_logits.begin() + r * V, ref_logits.begin() + (r + 1) * V);
      }
    EXPECT_LE(rel_err(ours.data(), theirs.data(), ours.size()), 1e-4);
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
        EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name << " " << gradient_placement_name(place);
      }
    }
    EXPECT_LE(zero, 2);  // the two key biases
  }
}

TEST_P(GoldenMlm, FiveAdamWStepsTrackTransformers) {
  const std::string d = mlm_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  load_pretrained_weights(d, model);
  Batch batch(*be, f);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(*be, oo, model.layout());
  GradNorm norm(*be, model.layout().total());
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ref.push_back(read_f32(f.ref, "adamw_final_loss")[0]);
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
}

TEST_P(GoldenMlm, SavesTheTensorNamesTransformersLoads) {
  const std::string d = mlm_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {1, 4, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(d, model);
  const std::string out = testing_dirs::fresh_dir(std::string("mlm_save_") + GetParam());
  save_pretrained(out, model);
  EXPECT_EQ(tensor_names(out + "/model.safetensors"), tensor_names(d + "/model.safetensors"));
  EXPECT_EQ(BertConfig::from_json_file(out + "/config.json").architectures, f.cfg.architectures);
}

// The head's tensors are in the plan: the model's arenas are what model_arena_bytes says.
TEST_P(GoldenMlm, PlanEqualsAllocated) {
  const std::string d = mlm_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations})
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
      const ModelShape shape{f.B, f.T, DType::F32, policy, true, place};
      const MemoryPlan plan = plan_memory({f.cfg, shape, OptimizerKind::AdamW, Device::CPU});
      const CategoryBytes before = be->allocator().stats().current();
      {
        BertForSequenceClassification model(*be, f.cfg, shape);
        load_pretrained_weights(d, model);
        Batch batch(*be, f);
        model.zero_grads();
        model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
        const CategoryBytes now = be->allocator().stats().current();
        for (Category c : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
          EXPECT_EQ(now.v[static_cast<int>(c)] - before.v[static_cast<int>(c)], plan.bytes[c])
              << category_name(c) << " " << checkpoint_policy_name(policy) << " " << gradient_placement_name(place);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenMlm,
                         testing::Values("bert-mlm", "roberta-mlm", "xlm-roberta-mlm", "distilbert-mlm", "bert-ner", "roberta-ner",
                                         "xlm-roberta-ner", "distilbert-ner", "electra-ner"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });
