// Data parallelism on the CPU (dist/): the in-process collectives, the shards, and training over
// ranks against training on one: the same updates, the ZeRO stages bit for bit alike, and the
// optimizer state split as planned.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../common/compare.h"
#include "../common/cli.h"
#include "../common/data_parallel.h"
#include "dist/communicator.h"
#include "train/trainer.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "core/rng.h"
#include "optim/grad_norm.h"
#include "ops/backend.h"

using namespace anatomy;
namespace fs = std::filesystem;

TEST(Shards, CoverTheBufferInAlignedNearEqualRanges) {
  const size_t a = kNormBlock;  // the default alignment: the gradient norm's block
  for (size_t total : {size_t{1}, a - 1, a, 3 * a + 1000, size_t{4386178}})
    for (int world : {1, 2, 3, 8}) {
      const auto s = shard_ranges(total, world);
      ASSERT_EQ(s.size(), static_cast<size_t>(world));
      EXPECT_EQ(s.front().begin, 0u);
      EXPECT_EQ(s.back().end, total);
      for (size_t r = 0; r + 1 < s.size(); ++r) {
        EXPECT_EQ(s[r].end, s[r + 1].begin);
        EXPECT_EQ(s[r].end % a == 0 || s[r].end == total, true) << total << " " << world;
        EXPECT_LE(s[r + 1].size(), s[r].size());  // the last shards are the short ones
      }
      if (total >= a * static_cast<size_t>(world)) {
        EXPECT_LE(s.front().size() - s.back().size(), a * world);
      }
    }
}

TEST(LocalGroup, CollectivesSumInRankOrderAndGatherShards) {
  const int world = 3;
  const size_t n = 200;
  auto comms = make_local_group(world);
  const auto shards = shard_ranges(n, world, 8);
  std::vector<std::vector<float>> all(world), red(world), gat(world);
  std::vector<std::vector<uint16_t>> half(world);
  std::vector<std::thread> pool;
  for (int r = 0; r < world; ++r)
    pool.emplace_back([&, r] {
      auto init = [&](float base) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(r) * 0.5f + static_cast<float>(i);
        return v;
      };
      all[r] = init(1.0f);
      comms[r]->all_reduce_sum(Tensor(all[r].data(), DType::F32, {static_cast<int64_t>(n)}, Device::CPU));
      red[r] = init(2.0f);
      comms[r]->reduce_scatter_sum(Tensor(red[r].data(), DType::F32, {static_cast<int64_t>(n)}, Device::CPU), shards);
      gat[r] = std::vector<float>(n, -1.0f);
      for (size_t i = shards[r].begin; i < shards[r].end; ++i) gat[r][i] = static_cast<float>(100 * r + i);
      comms[r]->all_gather(Tensor(gat[r].data(), DType::F32, {static_cast<int64_t>(n)}, Device::CPU), shards);
      half[r] = std::vector<uint16_t>(n, 0xffff);  // 16-bit elements are copied as bits
      for (size_t i = shards[r].begin; i < shards[r].end; ++i) half[r][i] = static_cast<uint16_t>(1000 * r + i);
      comms[r]->all_gather(Tensor(half[r].data(), DType::BF16, {static_cast<int64_t>(n)}, Device::CPU), shards);
    });
  for (auto& t : pool) t.join();
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      // sum over q of (1 + q/2 + i) = 3 + 1.5 + 3i
      EXPECT_FLOAT_EQ(all[r][i], 4.5f + 3.0f * static_cast<float>(i)) << r << " " << i;
      int owner = 0;
      while (i >= shards[owner].end) ++owner;
      EXPECT_EQ(gat[r][i], static_cast<float>(100 * owner + i));
      EXPECT_EQ(half[r][i], static_cast<uint16_t>(1000 * owner + i));
      if (owner == r) EXPECT_FLOAT_EQ(red[r][i], 7.5f + 3.0f * static_cast<float>(i));
      else EXPECT_FLOAT_EQ(red[r][i], 2.0f + static_cast<float>(r) * 0.5f + static_cast<float>(i));  // untouched
    }
  }
}

// Note [canonical gradient norm]: every shard layout (block-aligned, as ZeRO cuts them) and every
// thread count gives the squared norm of one rank bit for bit. Values over many magnitudes make
// the order matter: summing each shard and then the shards' sums (what stage 1 did before)
// gives another last bit for some layout, so this test fails if the order ever depends on them.
TEST(GradientNorm, IsBitForBitTheSameForEveryShardLayoutAndThreadCount) {
  const size_t n = 37 * static_cast<size_t>(kNormBlock) + 1234;
  std::vector<float> g(n);
  Rng rng(2026);
  for (float& v : g) v = static_cast<float>(rng.normal() * std::pow(10.0, 6 * rng.uniform() - 3));
  const Tensor grads(g.data(), DType::F32, {static_cast<int64_t>(n)}, Device::CPU);
  auto one = make_cpu_backend(1);
  GradNorm whole(*one, n);
  whole.compute(grads);
  const float ref = whole.norm_sq().ptr<float>()[0];
  auto two = make_cpu_backend(2);
  GradNorm threads(*two, n);
  threads.compute(grads);
  EXPECT_EQ(threads.norm_sq().ptr<float>()[0], ref) << "2 threads vs 1";
  bool naive_differs = false;
  for (int world : {2, 3, 5, 8}) {
    SCOPED_TRACE(std::to_string(world) + " shards");
    const auto shards = shard_ranges(n, world);
    auto comms = make_local_group(world);
    std::vector<std::unique_ptr<Backend>> bes;
    std::vector<std::unique_ptr<GradNorm>> norms;
    for (int r = 0; r < world; ++r) {
      bes.push_back(make_cpu_backend(1));
      norms.push_back(std::make_unique<GradNorm>(*bes.back(), n));
    }
    std::vector<std::thread> pool;
    for (int r = 0; r < world; ++r)
      pool.emplace_back([&, r] {
        norms[r]->compute_range(grads, shards[r].begin, shards[r].end);
        comms[r]->all_reduce_sum(norms[r]->partials());
        norms[r]->finish();
      });
    for (auto& t : pool) t.join();
    float naive = 0;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(norms[r]->norm_sq().ptr<float>()[0], ref) << "rank " << r;
      double s = 0;
      for (size_t i = shards[r].begin; i < shards[r].end; ++i) s += static_cast<double>(g[i]) * g[i];
      naive += static_cast<float>(s);
    }
    naive_differs |= naive != ref;
  }
  EXPECT_TRUE(naive_differs) << "the data does not exercise the summation order";
}

namespace {

using namespace testing_dp;

TrainOptions dp_options(const std::string& model, const std::string& out, int world, int64_t batch, int zero) {
  return options("cpu", model, out, world, batch, zero);
}

}  // namespace

TEST(DataParallel, TwoRanksOfFourTrainLikeOneRankOfEight) {
  const std::string model = dropout_free_model("dp_model");
  const TrainResult one = train(dp_options(model, "dp_one", 1, 8, 0));
  const TrainResult two = train(dp_options(model, "dp_two", 2, 4, 1));
  EXPECT_EQ(two.samples, one.samples);
  EXPECT_NEAR(two.first_loss, one.first_loss, 1e-5);
  EXPECT_NEAR(two.last_loss, one.last_loss, 1e-4);
  EXPECT_NE(one.first_loss, one.last_loss);  // the weights moved
  EXPECT_LT(max_abs_diff(saved_weights((fs::path(testing::TempDir()) / "dp_one").string()),
                         saved_weights((fs::path(testing::TempDir()) / "dp_two").string())),
            1e-5)
      << "largest weight difference after 4 steps";
}

TEST(DataParallel, ZeroStageOneUpdatesBitForBitLikeStageZeroWithHalfTheState) {
  const std::string model = dropout_free_model("dp_model_z");
  const TrainResult z0 = train(dp_options(model, "dp_z0", 2, 4, 0));
  const TrainResult z1 = train(dp_options(model, "dp_z1", 2, 4, 1));
  // The local group sums in rank order whichever collective runs, AdamW is element-wise, and the
  // gradient norm is summed in one order for both stages (Note [canonical gradient norm]).
  EXPECT_TRUE(testing_compare::same_file_bytes(fs::path(testing::TempDir()) / "dp_z0" / "model.safetensors",
                                              fs::path(testing::TempDir()) / "dp_z1" / "model.safetensors"));
  ASSERT_EQ(z1.rank_optimizer_state_bytes.size(), 2u);
  const int64_t n = static_cast<int64_t>(ParamLayout::for_sequence_classification(BertConfig::preset("bert-tiny")).total());
  EXPECT_EQ(z0.rank_optimizer_state_bytes[0], 8 * n);
  EXPECT_EQ(z1.rank_optimizer_state_bytes[0] + z1.rank_optimizer_state_bytes[1], 8 * n);
  EXPECT_LE(z1.rank_optimizer_state_bytes[0] - z1.rank_optimizer_state_bytes[1], 8 * kNormBlock * 2);
  // The plan of rank 0 is what its allocator held.
  BertConfig cfg = BertConfig::from_json_file(model + "/config.json");
  const ModelShape shape{4, 32, DType::F32, CheckpointPolicy::None, true, GradientPlacement::InActivations};
  const MemoryPlan plan = plan_memory({cfg, shape, OptimizerKind::AdamW, Device::CPU, 2, 1});
  for (int c = 0; c < kNumCategories; ++c)
    EXPECT_EQ(z1.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
  EXPECT_EQ(z1.peak_bytes.shared, plan.bytes.shared);
}

// ZeRO-2 (Note [ZeRO over the flat buffers]): with one micro-batch per step it is stage 1, bit
// for bit stage 0; with accumulation each rank keeps only its shard of the summed gradients
// (the full ones live in activation memory), which sums in another order, so it agrees with
// stage 0 to rounding. Every rank's allocator holds exactly its plan, the last rank's shard
// being the smaller.
TEST(DataParallel, ZeroStageTwoShardsTheGradientsAndEachRankHoldsItsPlan) {
  const std::string model = dropout_free_model("dp_model_z2");
  const TrainResult z0 = train(dp_options(model, "dp2_z0", 3, 4, 0));
  const TrainResult z2 = train(dp_options(model, "dp2_z2", 3, 4, 2));
  EXPECT_TRUE(testing_compare::same_file_bytes(fs::path(testing::TempDir()) / "dp2_z0" / "model.safetensors",
                                              fs::path(testing::TempDir()) / "dp2_z2" / "model.safetensors"));
  TrainOptions a0 = dp_options(model, "dp2_z0_accum", 3, 2, 0), a2 = dp_options(model, "dp2_z2_accum", 3, 2, 2);
  a0.gradient_accumulation_steps = a2.gradient_accumulation_steps = 3;
  const TrainResult r0 = train(a0), r2 = train(a2);
  EXPECT_NEAR(r2.last_loss, r0.last_loss, 1e-5);
  EXPECT_LT(max_abs_diff(saved_weights(a0.output_dir), saved_weights(a2.output_dir)), 1e-5);
  EXPECT_NE(r0.first_loss, r0.last_loss);  // the weights moved

  const BertConfig cfg = BertConfig::from_json_file(model + "/config.json");
  const int64_t n = static_cast<int64_t>(ParamLayout::for_sequence_classification(cfg).total());
  const auto shards = shard_ranges(static_cast<size_t>(n), 3);
  ASSERT_EQ(r2.rank_gradient_bytes.size(), 3u);
  ASSERT_EQ(r0.rank_gradient_bytes.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(r0.rank_gradient_bytes[r], 4 * n);  // a full buffer of its own
    // The full gradients (in activation memory, counted there too) and the rank's shard sum.
    EXPECT_EQ(r2.rank_gradient_bytes[r], 4 * n + 4 * static_cast<int64_t>(shards[r].size()));
    EXPECT_EQ(r2.rank_peak_bytes[r], r2.rank_planned_bytes[r]);
    EXPECT_EQ(r0.rank_peak_bytes[r], r0.rank_planned_bytes[r]);
    const ModelShape shape{2, 32, DType::F32, CheckpointPolicy::None, true, GradientPlacement::InActivations};
    PlanInput in{cfg, shape, OptimizerKind::AdamW, Device::CPU, 3, 2, r, 3};
    EXPECT_EQ(plan_memory(in).bytes[Category::Gradients], r2.rank_gradient_bytes[r]);
  }
  EXPECT_LT(r2.rank_peak_bytes[2], r2.rank_peak_bytes[0]);  // the last shard is the smaller
  EXPECT_LT(r2.rank_peak_bytes[0], r0.rank_peak_bytes[0]);  // and stage 2 holds less than stage 0
}

// Note [bucketed reduction]: reducing layer by layer while backward runs changes no bit against
// one reduction after it, for every stage (each element is summed over the ranks in one order).
TEST(DataParallel, BucketsDuringBackwardChangeNoBit) {
  const std::string model = dropout_free_model("dp_model_buckets");
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(zero));
    TrainOptions each = dp_options(model, "dp_bk_each", 3, 2, zero), once = dp_options(model, "dp_bk_once", 3, 2, zero);
    each.gradient_accumulation_steps = once.gradient_accumulation_steps = 2;
    each.ddp_bucket_cap_mb = 0;      // a bucket per layer
    once.ddp_bucket_cap_mb = 65536;  // one, when backward ends
    const TrainResult a = train(each), b = train(once);
    const int64_t layers = BertConfig::from_json_file(model + "/config.json").num_hidden_layers;
    EXPECT_EQ(a.reduction_buckets, layers + 2);  // each layer as it ends, then the embeddings, then the tail
    EXPECT_EQ(b.reduction_buckets, 2);
    EXPECT_TRUE(testing_compare::same_file_bytes(fs::path(each.output_dir) / "model.safetensors",
                                                fs::path(once.output_dir) / "model.safetensors"));
  }
}

TEST(DataParallel, RefusesWhatCannotBeShardedNamingTheFlag) {
  using namespace testing_cli;
  const std::string base = "train --preset bert-tiny --device cpu --seq-len 16 --per-device-train-batch-size 2 "
                           "--nproc-per-node 2 --num-samples 16 --output-dir ";
  std::string out = fresh_dir("dp_refuse1");
  // Adafactor's state is not element-wise: its default stage is 0 (it runs), a stage 1 given is refused.
  expect_clean_error(run_anatomy(base + out + " --optim adafactor --zero-stage 1"), "--optim");
  out = fresh_dir("dp_refuse3");
  expect_clean_error(run_anatomy(base + out + " --zero-stage 3"), "--zero-stage");
  EXPECT_FALSE(fs::exists(fs::path(out) / "train_results.json"));
}

// A rank that fails must not leave the others waiting in a collective: the run ends with the
// failed rank's error, whichever stage and rank count.
TEST(DataParallel, AFailingRankEndsTheRunWithItsError) {
  const std::string model = testing_dp::dropout_free_model("dp_model_fail");
  for (int world : {2, 3})
    for (int zero : {0, 1, 2}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, stage " + std::to_string(zero));
      TrainOptions o = dp_options(model, "dp_fail", world, 2, zero);
      o.fail_last_rank_at_step = 2;
      try {
        train(o);
        ADD_FAILURE() << "the run did not fail";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(world - 1) + " failed at step 2"), std::string::npos)
            << e.what();
      }
      EXPECT_FALSE(fs::exists(fs::path(o.output_dir) / "train_results.json"));
    }
}
