// Training on the GPU: the allocator's table equals the arithmetic and the dry-run plan, and
// fp16 loss scaling skips overflowing steps and backs off.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/bert.h"
#include "ops/backend.h"
#include "train/trainer.h"
#include "../common/dirs.h"

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
  o.output_dir = testing_dirs::fresh_dir(out);  // empty: a second run on one machine starts clean
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

// The steady steps' SM clock and power (Note [clock and power]): 2000 steps of bert-tiny take
// seconds, so the 0.1 s sampler sees the second half several times.
TEST(TrainCuda, TheSummaryReportsTheSteadyStepsClockAndPower) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainOptions o = tiny_gpu("cuda_clocks");
  o.precision = Precision::Bf16;
  o.num_samples = 3200;
  o.max_steps = 2000;
  TrainResult r = train(o);
  ASSERT_TRUE(r.gpu_clocks.has_value()) << "no NVML clock sample during the steady steps";
  EXPECT_GE(r.gpu_clocks->samples, 2);
  EXPECT_GT(r.gpu_clocks->sm_median_mhz, 100.0);
  EXPECT_LE(r.gpu_clocks->sm_median_mhz, r.gpu_clocks->sm_max_mhz);
  EXPECT_GT(r.gpu_clocks->power_median_w, 10.0);
  EXPECT_GT(r.gpu_clocks->power_limit_w, r.gpu_clocks->power_median_w * 0.5);
  nlohmann::json j;
  std::ifstream(std::filesystem::path(o.output_dir) / "train_results.json") >> j;
  EXPECT_DOUBLE_EQ(j.at("gpu_sm_clock_mhz_median").get<double>(), r.gpu_clocks->sm_median_mhz);
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

// Note [a step in flight] on the GPU, where it matters: the next step queued behind this one's
// figure downloads, on text data (packed rows: 6 uploads a micro-batch) with 12 micro-batches a
// step (more copies in flight than an upload ring's wrap would allow the step's own waits), bf16,
// evaluations and a checkpoint in between. Every logged loss and the evaluation match the run that
// reads each step first (up to the embedding gradient's atomic adds, which make two GPU runs differ
// in the last bits); a step reading another step's figures would be off by far more.
TEST(TrainCuda, TheNextStepLaunchedBeforeThisOneIsReadGivesTheSameLosses) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  const std::string src = env ? env : ANATOMY_SOURCE_DIR;
  auto run = [&](TrainOptions::RunAhead ahead, const std::string& out) {
    TrainOptions o = tiny_gpu(out);
    std::filesystem::remove_all(o.output_dir);
    o.train_file = src + "/tests/data/text/sentiment.jsonl";
    o.tokenizer = src + "/tests/data/tokenizer";
    o.validation_split = 0.2;
    o.dataset_cache_dir = o.output_dir + "_cache";
    o.seq_len = 64;
    o.per_device_train_batch_size = 1;
    o.gradient_accumulation_steps = 12;
    o.precision = Precision::Bf16;
    o.learning_rate = 1e-3f;
    o.max_steps = 9;
    o.logging_steps = 1;
    o.eval_strategy = Cadence::Steps;
    o.eval_steps = 4;
    o.checkpoint_strategy = Cadence::Steps;
    o.save_steps = 6;
    o.run_ahead = ahead;
    const TrainResult r = train(o);
    std::vector<double> losses;
    std::ifstream in(std::filesystem::path(o.output_dir) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    }
    return std::make_pair(r, losses);
  };
  const auto [off, off_losses] = run(TrainOptions::RunAhead::Off, "cuda_ahead_off");
  const auto [on, on_losses] = run(TrainOptions::RunAhead::Auto, "cuda_ahead_on");
  EXPECT_EQ(off.steps_launched_ahead, 0);
  EXPECT_EQ(on.steps_launched_ahead, 4);  // after steps 2, 3, 5 and 7 (not 1, 4: eval, 6: save, 8: eval, 9: last)
  ASSERT_EQ(on_losses.size(), 9u);
  ASSERT_EQ(off_losses.size(), on_losses.size());
  for (size_t i = 0; i < on_losses.size(); ++i)
    EXPECT_NEAR(on_losses[i], off_losses[i], 2e-3 * std::abs(off_losses[i])) << "step " << i + 1;
  ASSERT_GE(off.eval("loss"), 0.0);  // evaluated
  EXPECT_NEAR(on.eval("loss"), off.eval("loss"), 2e-3 * std::abs(off.eval("loss")));
  EXPECT_EQ(on.samples, off.samples);
}

// Note [gemm tuning]: after the first step the trainer times cuBLASLt's candidates for that step's
// products in the activation arena and writes the table. The run trains on: its losses stay
// those of the untuned run up to the summation order of another algorithm (bf16, a few steps).
TEST(TrainCuda, GemmTuningTimesTheFirstStepsProductsAndTrainsOnAlike) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto run = [](bool tune, const std::string& out) {
    TrainOptions o = tiny_gpu(out);
    o.precision = Precision::Bf16;
    o.max_steps = 6;
    o.learning_rate = 1e-3f;
    o.gemm_tuning = tune;
    return std::make_pair(train(o), o.output_dir);
  };
  const auto [plain, plain_dir] = run(false, "cuda_gemm_plain");
  const auto [tuned, tuned_dir] = run(true, "cuda_gemm_tuned");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(plain_dir) / "gemm_tuning.md"));
  std::ifstream in(std::filesystem::path(tuned_dir) / "gemm_tuning.md");
  std::string head, line;
  std::getline(in, head);
  int rows = 0;
  while (std::getline(in, line)) rows += line.size() > 2 && line.rfind("| ", 0) == 0 && std::isdigit(line[2]);
  EXPECT_NE(head.find("GEMM problem(s) timed"), std::string::npos) << head;
  // bert-tiny's layer: q|k|v, attention out, FFN in and out, forward and both gradients.
  EXPECT_GE(rows, 8) << head;
  EXPECT_EQ(std::stoi(head), rows) << head;
  EXPECT_TRUE(std::isfinite(tuned.last_loss));
  EXPECT_NEAR(tuned.last_loss, plain.last_loss, 0.02 * std::abs(plain.last_loss) + 1e-3);
}
