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
