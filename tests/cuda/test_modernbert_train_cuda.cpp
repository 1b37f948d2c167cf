// ModernBERT in mixed precision on the CUDA engine, through the trainer's pieces (issue 15):
// transformers' fixtures in bf16 and fp16 (loss and logits within 2e-2, each gradient cosine >=
// 0.999, as BERT's bf16 golden test), 5 bf16 AdamW steps through DataParallelStep, and
// `anatomy train`'s allocation equal to its plan in bf16.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/data_parallel.h"
#include "../common/golden_modernbert.h"
#include "dist/communicator.h"
#include "dist/zero.h"
#include "io/atomic_file.h"
#include "memory/planner.h"
#include "model/encoder.h"
#include "train/trainer.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {

class ModernBertCuda : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

void check_half(const char* name, DType dt) {
  const std::string d = modernbert_dir(name);
  Fixture f(d);
  auto be = make_cuda_backend(0);
  auto model = make_model(*be, f.cfg, ModelShape{f.B, f.T, dt, CheckpointPolicy::None, true});
  load_pretrained_weights(d, *model);
  Batch batch(*be, f);
  model->zero_grads();
  model->forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
  const std::vector<float> logits = to_f32(*be, model->logits()), ref_logits = read_f32(f.ref, "logits");
  Measured m{std::string(name) + " " + std::string(dtype_name(dt))};
  m.logits = rel_err(logits.data(), ref_logits.data(), logits.size());
  EXPECT_LE(m.logits, 2e-2);
  double loss = 0;
  for (float v : to_f32(*be, model->losses())) loss += v / static_cast<double>(f.B);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  m.loss = std::abs(loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LE(m.loss, 2e-2);
  const std::vector<float> grads = model->grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model->layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  for (const auto& p : model->layout().params()) {
    const std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    if (negligible(ref, total))
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), 2e-2 * total) << p.name;
    else
      EXPECT_GE(m.gradient(p.name, cosine(grads.data() + p.offset, ref.data(), ref.size())), 0.999) << p.name;
  }
}

}  // namespace

TEST_P(ModernBertCuda, Bf16MatchesTransformers) { check_half(GetParam(), DType::BF16); }
TEST_P(ModernBertCuda, Fp16MatchesTransformers) { check_half(GetParam(), DType::F16); }

TEST_P(ModernBertCuda, Bf16FiveAdamWStepsTrack) {
  const std::string d = modernbert_dir(GetParam());
  Fixture f(d);
  auto be = make_cuda_backend(0);
  auto model = make_model(*be, f.cfg, ModelShape{f.B, f.T, DType::BF16, CheckpointPolicy::None, true});
  load_pretrained_weights(d, *model);
  Batch batch(*be, f);
  auto group = make_local_group(1);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  DataParallelStep dps(*be, *group[0], oo, model->layout(), 0);
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  for (int s = 0; s < 5; ++s) {
    model->zero_grads();
    model->forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    double loss = 0;
    for (float v : to_f32(*be, model->losses())) loss += v / static_cast<double>(f.B);
    EXPECT_LE(std::abs(loss - ref[static_cast<size_t>(s)]) / std::abs(ref[static_cast<size_t>(s)]), 2e-2) << "step " << s;
    dps.step(*model, 1e-3f, 1.0f);
    model->sync_compute_copy();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModernBertCuda, testing::ValuesIn(modernbert_cases()), modernbert_test_name);

// `anatomy train --precision bf16` on the GPU allocates what it planned, category by category.
TEST(ModernBertCudaTrain, Bf16PlannedEqualsAllocated) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string cfg_dir = testing_dirs::fresh_dir("mb_cuda_config");
  BertConfig c = BertConfig::from_json_file(modernbert_dir("modernbert-bias-mean") + "/config.json");
  c.vocab_size = 2200;  // the learnable task's ids
  c.set_num_labels(2);
  write_file_atomic(cfg_dir + "/config.json", c.to_json().dump(2));
  TrainOptions o = testing_dp::options("cuda", cfg_dir, "mb_cuda_plan", 1, 16, 0);
  o.precision = Precision::Bf16;
  const TrainResult r = train(o);
  const MemoryPlan plan = plan_memory(plan_input(o, c, 16, Device::CUDA, 1));
  for (int k = 0; k < kNumCategories; ++k)
    EXPECT_EQ(r.peak_bytes.v[k], plan.bytes.v[k]) << category_name(static_cast<Category>(k));
  EXPECT_TRUE(std::isfinite(r.last_loss));
}
