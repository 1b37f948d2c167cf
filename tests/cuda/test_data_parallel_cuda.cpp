// Data parallelism on CUDA devices through NCCL (dist/): one rank exercises the NCCL group, the
// stream hand-off and the ZeRO step on the GPU; two ranks (when two devices are present) train
// like one rank with the combined batch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/data_parallel.h"
#include "train/trainer.h"

using namespace anatomy;
namespace fs = std::filesystem;

using namespace anatomy::testing_dp;

TEST(DataParallelCuda, OneRankOverNcclStageOneEqualsStageZero) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const std::string model = dropout_free_model("dpc_model");
  const TrainResult z0 = train(options("cuda", model, "dpc_z0", 1, 16, 0));
  const TrainResult z1 = train(options("cuda", model, "dpc_z1", 1, 16, 1));
  EXPECT_NE(z0.first_loss, z0.last_loss);
  // One shard is the whole buffer: the same kernels on the same values, up to the GPU's
  // run-to-run order of atomic additions (word-embedding gradients, the gradient norm).
  EXPECT_NEAR(z0.last_loss, z1.last_loss, 1e-5);
  const auto w0 = saved_weights((fs::path(testing::TempDir()) / "dpc_z0").string());
  const auto w1 = saved_weights((fs::path(testing::TempDir()) / "dpc_z1").string());
  ASSERT_EQ(w0.size(), w1.size());
  EXPECT_LT(max_abs_diff(w0, w1), 1e-5);
}

TEST(DataParallelCuda, TwoRanksTrainLikeOneWithTheCombinedBatch) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (found " << cuda_device_count() << ")";
  const std::string model = dropout_free_model("dpc_model");
  const TrainResult one = train(options("cuda", model, "dpc_one", 1, 16, 0));
  const TrainResult two = train(options("cuda", model, "dpc_two", 2, 8, 1));
  EXPECT_NEAR(two.first_loss, one.first_loss, 1e-4);
  EXPECT_NEAR(two.last_loss, one.last_loss, 1e-3);
  ASSERT_EQ(two.rank_optimizer_state_bytes.size(), 2u);
  EXPECT_LT(two.rank_optimizer_state_bytes[0], one.rank_optimizer_state_bytes.empty() ? INT64_MAX : one.rank_optimizer_state_bytes[0]);
  EXPECT_LT(max_abs_diff(saved_weights((fs::path(testing::TempDir()) / "dpc_one").string()),
                         saved_weights((fs::path(testing::TempDir()) / "dpc_two").string())),
            1e-4);
}

// Note [ZeRO gathers half weights]: in bf16 stage 1 gathers the owner's half copy and only the
// fp32 masters forward reads; the layers' masters are made whole before each save. A checkpoint
// mid-run and the model at the end equal stage 0's (which updates everything on every rank) up to
// the GPU's order of atomic additions, far closer than a stale master would leave them: a rank
// saving its peer's layer masters unupdated since the last save would differ by the weights' whole
// movement between the two saves.
TEST(DataParallelCuda, TwoRanksInBf16SaveStageZerosWeightsWithHalfWeightsGathered) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (found " << cuda_device_count() << ")";
  const std::string model = dropout_free_model("dpc_model_bf16");
  TrainOptions a = options("cuda", model, "dpc_bf16_z0", 2, 8, 0), b = options("cuda", model, "dpc_bf16_z1", 2, 8, 1);
  for (TrainOptions* o : {&a, &b}) {
    o->precision = Precision::Bf16;
    o->checkpoint_strategy = Cadence::Steps;
    o->save_steps = 2;
  }
  const TrainResult r0 = train(a), r1 = train(b);
  EXPECT_NEAR(r1.last_loss, r0.last_loss, 1e-3);
  const double moved = max_abs_diff(saved_weights(a.output_dir + "/checkpoint-2"), saved_weights(a.output_dir));
  EXPECT_GT(moved, 1e-3) << "the weights' largest movement after step 2";
  for (const std::string sub : {"/checkpoint-2", ""}) {
    SCOPED_TRACE("saved in " + b.output_dir + sub);
    EXPECT_LT(max_abs_diff(saved_weights(a.output_dir + sub), saved_weights(b.output_dir + sub)), moved / 20);
  }
}
