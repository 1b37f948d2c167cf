// Training on the GPU: the allocator's table equals the arithmetic and the dry-run plan, and
// fp16 loss scaling skips overflowing steps and backs off.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/bert.h"
#include "ops/backend.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {
TrainOptions tiny_gpu(const std::string& out) {
  TrainOptions o;
  o.preset = "bert-tiny";
  o.device = DeviceChoice::Cuda;
  o.seq_len = 128;
  o.num_samples = 64;
  o.per_device_train_batch_size = 8;
  o.logging_steps = 0;
  o.save_model = false;
  o.disable_progress_bar = true;
  o.output_dir = (std::filesystem::path(testing::TempDir()) / out).string();
  return o;
}
}  // namespace

TEST(TrainCuda, MixedPrecisionAnatomyIs18BytesPerParameterPlusActivations) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainOptions o = tiny_gpu("cuda_mem");
  o.precision = Precision::Bf16;
  o.max_steps = 2;
  TrainResult r = train(o);
  const int64_t n = r.num_parameters;
  EXPECT_EQ(r.peak_bytes[Category::Weights], 6 * n);  // fp32 master + bf16 copy
  EXPECT_EQ(r.peak_bytes[Category::Gradients], 4 * n);
  EXPECT_EQ(r.peak_bytes[Category::OptimizerState], 8 * n);
  ArenaBytes a = model_arena_bytes(BertConfig::preset("bert-tiny"), {8, 128, DType::BF16, CheckpointPolicy::None, true});
  EXPECT_EQ(r.peak_bytes[Category::Activations], static_cast<int64_t>(a.activations));
  EXPECT_GT(r.gpu_memory_occupied_mb, 0);
}

TEST(TrainCuda, Fp16OverflowSkipsTheStepAndBacksOff) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainOptions o = tiny_gpu("cuda_fp16");
  o.precision = Precision::Fp16;
  o.fp16_initial_scale = 1099511627776.0f;  // 2^40: the scaled gradients overflow fp16
  o.max_steps = 4;
  TrainResult r = train(o);
  EXPECT_GE(r.skipped_steps, 1);
  EXPECT_LT(r.final_loss_scale, o.fp16_initial_scale);
  EXPECT_TRUE(std::isfinite(r.last_loss));
}

TEST(TrainCuda, LearnsTheLearnableTaskInBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainOptions o = tiny_gpu("cuda_learn");
  o.precision = Precision::Bf16;
  o.dataset = "learnable";
  o.num_samples = 2048;
  o.per_device_train_batch_size = 32;
  o.max_steps = 150;
  o.learning_rate = 1e-3f;
  TrainResult r = train(o);
  EXPECT_LT(r.last_loss, 0.2) << "first " << r.first_loss;
}
