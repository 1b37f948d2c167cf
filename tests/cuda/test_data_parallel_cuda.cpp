// Data parallelism on CUDA devices through NCCL (dist/): one rank exercises the NCCL group, the
// stream hand-off and the ZeRO step on the GPU; two ranks (when two devices are present) train
// like one rank with the combined batch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist/data_parallel.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "model/bert.h"
#include "ops/backend.h"

using namespace anatomy;
namespace fs = std::filesystem;

namespace {

std::string fresh(const std::string& name) {
  const fs::path p = fs::path(testing::TempDir()) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// bert-tiny without dropout: a batch split over ranks computes the same gradient as one batch.
std::string dropout_free_model() {
  const std::string dir = fresh("dpc_model");
  BertConfig c = BertConfig::preset("bert-tiny");
  c.hidden_dropout_prob = 0.0;
  c.attention_probs_dropout_prob = 0.0;
  write_file_atomic(dir + "/config.json", c.to_json().dump(2));
  return dir;
}

TrainOptions options(const std::string& model, const std::string& out, int world, int64_t batch, int zero) {
  TrainOptions o;
  o.model_name_or_path = model;
  o.device = "cuda";
  o.dataset = "learnable";
  o.seq_len = 64;
  o.num_samples = 256;
  o.per_device_train_batch_size = batch;
  o.nproc_per_node = world;
  o.zero_stage = zero;
  o.max_steps = 6;
  o.logging_steps = 0;
  o.learning_rate = 1e-3f;
  o.disable_progress_bar = true;
  o.output_dir = fresh(out);
  return o;
}

std::vector<float> weights(const std::string& dir) {
  auto be = make_cpu_backend(1);
  const BertConfig cfg = BertConfig::from_json_file(dir + "/config.json");
  BertForSequenceClassification m(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(dir, m);
  return m.master_to_host();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

}  // namespace

TEST(DataParallelCuda, OneRankOverNcclStageOneEqualsStageZero) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const std::string model = dropout_free_model();
  const TrainResult z0 = train_data_parallel(options(model, "dpc_z0", 1, 16, 0));
  const TrainResult z1 = train_data_parallel(options(model, "dpc_z1", 1, 16, 1));
  EXPECT_NE(z0.first_loss, z0.last_loss);
  // One shard is the whole buffer: the same kernels on the same values, up to the GPU's
  // run-to-run order of atomic additions (word-embedding gradients, the gradient norm).
  EXPECT_NEAR(z0.last_loss, z1.last_loss, 1e-5);
  const auto w0 = weights((fs::path(testing::TempDir()) / "dpc_z0").string());
  const auto w1 = weights((fs::path(testing::TempDir()) / "dpc_z1").string());
  ASSERT_EQ(w0.size(), w1.size());
  EXPECT_LT(max_abs_diff(w0, w1), 1e-5);
}

TEST(DataParallelCuda, TwoRanksTrainLikeOneWithTheCombinedBatch) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (found " << cuda_device_count() << ")";
  const std::string model = dropout_free_model();
  const TrainResult one = train_data_parallel(options(model, "dpc_one", 1, 16, 0));
  const TrainResult two = train_data_parallel(options(model, "dpc_two", 2, 8, 1));
  EXPECT_NEAR(two.first_loss, one.first_loss, 1e-4);
  EXPECT_NEAR(two.last_loss, one.last_loss, 1e-3);
  ASSERT_EQ(two.rank_optimizer_state_bytes.size(), 2u);
  EXPECT_LT(two.rank_optimizer_state_bytes[0], one.rank_optimizer_state_bytes.empty() ? INT64_MAX : one.rank_optimizer_state_bytes[0]);
  EXPECT_LT(max_abs_diff(weights((fs::path(testing::TempDir()) / "dpc_one").string()),
                         weights((fs::path(testing::TempDir()) / "dpc_two").string())),
            1e-4);
}
