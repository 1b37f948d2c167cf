// The CUDA engine on the per-token heads' golden fixtures (masked-LM and token classification;
// tests/data/golden_mlm, written by tests/golden/make_golden_mlm.py): fp32 within 1e-4 of transformers on the loss and every
// gradient, bf16 within 2e-2 on the loss with cosine >= 0.999 per gradient, and the step equal to
// its CPU twin (token_cross_entropy, the tied decoder's gradient after the embeddings').
#include <gtest/gtest.h>

#include "../common/golden.h"
#include "model/heads.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

std::string mlm_dir(const std::string& name) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_mlm/" + name;
}

struct StepResult {
  double loss = 0;
  std::vector<float> grads;
};

StepResult one_step(Backend& be, const Fixture& f, const std::string& d, DType dt, GradientPlacement place) {
  BertForSequenceClassification model(be, f.cfg, {f.B, f.T, dt, CheckpointPolicy::None, true, place});
  load_pretrained_weights(d, model);
  Batch batch(be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
  StepResult r;
  for (float v : to_f32(be, model.losses())) r.loss += v / static_cast<double>(f.B);
  r.grads = model.grads_to_host();
  return r;
}

class GoldenMlmCuda : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace

TEST_P(GoldenMlmCuda, MatchesTransformersAndTheCpuTwin) {
  const std::string d = mlm_dir(GetParam());
  Fixture f(d);
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  BertForSequenceClassification shape_only(*cpu, f.cfg, {1, 4, DType::F32, CheckpointPolicy::None, false});
  std::vector<std::string> names;
  for (const auto& p : shape_only.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  for (DType dt : {DType::F32, DType::BF16})
    for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      const StepResult g = one_step(*gpu, f, d, dt, place);
      const double tol = dt == DType::F32 ? 1e-4 : 2e-2;
      Measured m{std::string(GetParam()) + " " + std::string(dtype_name(dt)) + " " + gradient_placement_name(place)};
      m.loss = std::abs(g.loss - ref_loss) / std::abs(ref_loss);
      EXPECT_LE(m.loss, tol) << dtype_name(dt);
      for (const auto& p : shape_only.layout().params()) {
        const std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
        if (negligible(ref, total)) continue;
        if (dt == DType::F32) {
          EXPECT_LE(rel_err(g.grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name;
        }
        EXPECT_GE(m.gradient(p.name, cosine(g.grads.data() + p.offset, ref.data(), ref.size())), 0.999)
            << p.name << " " << dtype_name(dt);
      }
      if (dt == DType::F32) {
        const StepResult c = one_step(*cpu, f, d, DType::F32, place);
        EXPECT_NEAR(g.loss, c.loss, 1e-5 * std::abs(c.loss));
        EXPECT_LE(rel_err(g.grads.data(), c.grads.data(), c.grads.size()), 1e-4);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GoldenMlmCuda,
                         testing::Values("bert-mlm", "roberta-mlm", "xlm-roberta-mlm", "distilbert-mlm", "bert-ner", "roberta-ner",
                                         "xlm-roberta-ner", "distilbert-ner", "electra-ner"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });
