// The trainer end to end on the CPU: memory anatomy arithmetic, convergence, accumulation,
// checkpointing policies.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "../common/data_parallel.h"
#include "../common/dirs.h"
#include "../common/compare.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "core/rng.h"
#include "model/bert.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "memory/planner.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {

TrainOptions tiny(const std::string& out) {
  TrainOptions o;
  o.preset = "bert-tiny";
  o.device = DeviceChoice::Cpu;
  o.seq_len = 32;
  o.num_samples = 64;
  o.per_device_train_batch_size = 8;
  o.logging_steps = 0;
  o.output_dir = anatomy::testing_dirs::fresh_dir(out);
  o.save_model = false;
  o.disable_progress_bar = true;
  return o;
}

// tiny() from `model`'s config: `samples` in one epoch of micro-batches of `micro`, `accum` a step.
TrainOptions accumulating(const std::string& out, const std::string& model, int64_t samples, int64_t micro,
                          int64_t accum) {
  TrainOptions o = tiny(out);
  o.model_name_or_path = model;
  o.num_samples = samples;
  o.num_train_epochs = 1;
  o.per_device_train_batch_size = micro;
  o.gradient_accumulation_steps = accum;
  return o;
}

// tiny() on the learnable task: 1024 samples, batch 16, lr 1e-3.
TrainOptions learnable(const std::string& out, int64_t steps) {
  TrainOptions o = tiny(out);
  o.dataset = "learnable";
  o.num_samples = 1024;
  o.per_device_train_batch_size = 16;
  o.max_steps = steps;
  o.learning_rate = 1e-3f;
  return o;
}

}  // namespace

TEST(Train, MemoryAnatomyMatchesTheArithmetic) {
  // AdamW; plain SGD (torch.optim.SGD's default: no state); SGD with momentum (a buffer).
  for (auto [k, momentum] : {std::pair{OptimizerKind::AdamW, 0.0f}, std::pair{OptimizerKind::Sgd, 0.0f},
                             std::pair{OptimizerKind::Sgd, 0.9f}}) {
    SCOPED_TRACE(str_cat(optimizer_name(k), " momentum ", momentum));
    TrainOptions o = tiny("anatomy_mem");
    o.optim.kind = k;
    o.optim.momentum = momentum;
    o.max_steps = 1;
    TrainResult r = train(o);
    const int64_t n = r.num_parameters;
    BertConfig cfg = BertConfig::preset("bert-tiny");
    EXPECT_EQ(n, cfg.num_parameters());
    // No padding in the flat layout for this config: the table is exact bytes per parameter.
    EXPECT_EQ(r.peak_bytes[Category::Weights], 4 * n);
    EXPECT_EQ(r.peak_bytes[Category::Gradients], 4 * n);
    EXPECT_EQ(r.peak_bytes[Category::OptimizerState], k == OptimizerKind::AdamW ? 8 * n : momentum != 0 ? 4 * n : 0);
    ModelShape s{8, 32, DType::F32, CheckpointPolicy::None, true};
    ArenaBytes a = model_arena_bytes(cfg, s);
    EXPECT_EQ(r.peak_bytes[Category::Activations], static_cast<int64_t>(a.activations));
    EXPECT_EQ(r.peak_bytes[Category::Temporary], static_cast<int64_t>(a.temporary));
    // The planner predicted every category exactly, before the run.
    PlanInput in{cfg, s, k, Device::CPU};
    in.sgd_momentum = momentum != 0;
    MemoryPlan plan = plan_memory(in);
    for (int c = 0; c < kNumCategories; ++c)
      EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
  }
}

TEST(Planner, PlansEveryPresetPrecisionOptimizerAndPolicyConsistently) {
  for (const char* preset : {"bert-tiny", "bert-base", "bert-large"}) {
    BertConfig cfg = BertConfig::preset(preset);
    const int64_t n = cfg.num_parameters();
    for (DType dt : {DType::F32, DType::BF16})
      for (auto [k, momentum] : {std::pair{OptimizerKind::AdamW, false}, std::pair{OptimizerKind::Sgd, false},
                                 std::pair{OptimizerKind::Sgd, true}})
        for (CheckpointPolicy pol : {CheckpointPolicy::None, CheckpointPolicy::Layer, CheckpointPolicy::Selective}) {
          PlanInput in{cfg, {4, 512, dt, pol, true}, k, Device::CUDA};
          in.sgd_momentum = momentum;
          MemoryPlan p = plan_memory(in);
          EXPECT_EQ(p.num_parameters, n);
          // 16 bytes/param in fp32 AdamW training, 18 in mixed precision (the seed page's figures).
          const int64_t static_bytes = p.bytes[Category::Weights] + p.bytes[Category::Gradients] + p.bytes[Category::OptimizerState];
          const int64_t per_param = (dt == DType::F32 ? 8 : 10) + (k == OptimizerKind::AdamW ? 8 : momentum ? 4 : 0);
          EXPECT_EQ(static_bytes, per_param * n) << preset;
          EXPECT_GT(p.bytes[Category::Activations], 0);
        }
  }
}

TEST(Planner, SeedRunOnAV100AndTheLargestBatch) {
  BertConfig cfg = BertConfig::preset("bert-large");
  PlanInput in{cfg, {4, 512, DType::F32, CheckpointPolicy::None, true}, OptimizerKind::AdamW, Device::CUDA};
  const int64_t v100 = parse_bytes("16GB", "--gpu-memory");
  EXPECT_EQ(v100, 16000000000LL);
  // 16 bytes/param of bert-large is 5.4 GB before activations: batch 4 fits in 16 GB.
  EXPECT_LT(plan_memory(in).total(), v100);
  const int64_t best = largest_batch_that_fits(in, v100, 0);
  EXPECT_GE(best, 4);
  in.shape.max_batch = best;
  EXPECT_LE(plan_memory(in).total(), v100);
  in.shape.max_batch = best + 1;
  EXPECT_GT(plan_memory(in).total(), v100);
  EXPECT_THROW(parse_bytes("16 parsecs", "--gpu-memory"), Error);
}

TEST(Planner, LeversThatFitAreCheaperThanThePlan) {
  BertConfig cfg = BertConfig::preset("bert-large");
  PlanInput in{cfg, {64, 512, DType::BF16, CheckpointPolicy::None, true}, OptimizerKind::AdamW, Device::CUDA};
  const int64_t cap = parse_bytes("16GiB", "--gpu-memory");
  ASSERT_GT(plan_memory(in).total(), cap);
  auto levers = levers_that_fit(in, cap, 0, 1);
  ASSERT_FALSE(levers.empty());
  for (const auto& l : levers) EXPECT_LE(l.total, cap) << l.description;
  // Micro-batch x accumulation keeps the batch asked for: 15 is 5 x 3, 3 x 5 or 1 x 15, never 7 x 2.
  in.shape.max_batch = 15;
  PlanInput one = in;  // room for a micro-batch of one with its own gradient buffer, not for 15
  one.shape.max_batch = 1;
  one.shape.gradients = GradientPlacement::Own;
  const int64_t cap15 = plan_memory(one).total() + (int64_t{1} << 20);
  ASSERT_GT(plan_memory(in).total(), cap15);
  std::set<std::string> splits;
  for (const auto& l : levers_that_fit(in, cap15, 0, 1))
    if (l.description.rfind("--per-device-train-batch-size ", 0) == 0) {
      int64_t b = 0, a = 0;
      ASSERT_EQ(std::sscanf(l.description.c_str(), "--per-device-train-batch-size %ld --gradient-accumulation-steps %ld",
                            &b, &a),
                2)
          << l.description;
      EXPECT_EQ(b * a, 15) << l.description;
      splits.insert(l.description);
    }
  EXPECT_TRUE(splits.count("--per-device-train-batch-size 1 --gradient-accumulation-steps 15")) << splits.size();
}

TEST(Train, LossFallsOnTheLearnableTask) {
  TrainOptions o = learnable("anatomy_conv", 200);
  TrainResult r = train(o);
  EXPECT_GT(r.first_loss, 0.6);
  EXPECT_LT(r.last_loss, 0.2) << "first " << r.first_loss;
}

// --precision fp8 on the CPU is its twin arithmetic (Note [fp8 training]): the encoder's Linears
// multiply E4M3/E5M2-rounded operands in fp32. It learns the learnable task as fp32 does, its
// losses are not fp32's, and the scaling rows are its only extra memory (optimizer state).
TEST(Train, Fp8OnTheCpuIsTheTwinArithmetic) {
  TrainOptions o = learnable("anatomy_fp8_cpu", 120);
  const TrainResult f32 = train(o);
  o.output_dir = anatomy::testing_dirs::fresh_dir("anatomy_fp8_cpu_b");
  o.precision = Precision::Fp8;
  const TrainResult f8 = train(o);
  EXPECT_NE(f8.last_loss, f32.last_loss);
  EXPECT_LT(f8.last_loss, 0.3) << "first " << f8.first_loss;
  EXPECT_NEAR(f8.first_loss, f32.first_loss, 0.02 * f32.first_loss);
  EXPECT_EQ(f32.peak_bytes[Category::OptimizerState] + static_cast<int64_t>(2 * 4 * 3 * kFp8MetaWidth * 4),
            f8.peak_bytes[Category::OptimizerState]);  // bert-tiny: 2 layers x 4 Linears x 3 roles
  EXPECT_EQ(f32.peak_bytes[Category::Weights], f8.peak_bytes[Category::Weights]);
}

TEST(Train, ResultsFileWrittenOnlyAtTheEnd) {
  TrainOptions o = tiny("anatomy_results");
  o.max_steps = 2;
  o.save_model = true;
  train(o);
  std::ifstream in(std::filesystem::path(o.output_dir) / "train_results.json");
  ASSERT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_GT(j["train_samples_per_second"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(o.output_dir) / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(o.output_dir) / "config.json"));
}

namespace {

// Gradients of one optimizer step's worth of data, as a host vector.
std::vector<float> grads_for(CheckpointPolicy policy, int64_t micro, int64_t accum, float dropout) {
  auto be = make_cpu_backend();
  BertConfig cfg = BertConfig::preset("bert-tiny");
  cfg.hidden_dropout_prob = dropout;
  cfg.attention_probs_dropout_prob = dropout;
  const int64_t T = 16;
  BertForSequenceClassification m(*be, cfg, {micro, T, DType::F32, policy, true});
  m.set_dropout_seed(7);
  m.init_weights(3);
  m.zero_grads();
  Rng rng(11);
  const int64_t total = micro * accum;
  std::vector<int32_t> ids(total * T), types(total * T, 0), mask(total * T, 1), labels(total);
  for (auto& v : ids) v = static_cast<int32_t>(rng.randint(100, 1000));
  for (int64_t b = 0; b < total; ++b) {
    labels[b] = static_cast<int32_t>(b % 2);
    for (int64_t t = T - b % 5; t < T; ++t) mask[b * T + t] = 0;
  }
  Buffer d_ids(be->allocator(), DType::I32, {micro, T}, Category::Other), d_types(be->allocator(), DType::I32, {micro, T}, Category::Other),
      d_mask(be->allocator(), DType::I32, {micro, T}, Category::Other), d_labels(be->allocator(), DType::I32, {micro}, Category::Other);
  for (int64_t a = 0; a < accum; ++a) {
    be->upload(d_ids, ids.data() + a * micro * T);
    be->upload(d_types, types.data() + a * micro * T);
    be->upload(d_mask, mask.data() + a * micro * T);
    be->upload(d_labels, labels.data() + a * micro);
    // Dropout masks are indexed per micro-batch, so only compare accumulation without dropout.
    m.forward_backward({d_ids, d_types, d_mask, d_labels}, 1.0f / static_cast<float>(total), static_cast<uint64_t>(a) << 12);
  }
  return m.grads_to_host();
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(Train, GradientAccumulationEqualsTheLargerBatch) {
  std::vector<float> big = grads_for(CheckpointPolicy::None, 8, 1, 0.0f);
  std::vector<float> acc = grads_for(CheckpointPolicy::None, 2, 4, 0.0f);
  EXPECT_LT(max_rel(acc, big), 1e-5);
}

// Note [accumulation within an epoch]: 20 samples in micro-batches of 4 with accumulation 2 make
// three steps an epoch (8, 8 and the 4 left), each epoch a fresh accumulation, as the Trainer
// takes them: the same steps as batches of 8 without accumulation (8, 8, 4), to fp32 rounding.
// (Accumulation carried across epochs took 2 steps an epoch and 1.6 epochs for 2.)
TEST(Train, AccumulationStartsAfreshEachEpoch) {
  // Without dropout: its masks are indexed by micro-batch, and the two runs number theirs apart.
  const std::string model = anatomy::testing_dp::dropout_free_model("anatomy_accum_epochs_model");
  auto run = [&](const std::string& name, int64_t micro, int64_t accum) {
    TrainOptions o = accumulating(name, model, 20, micro, accum);
    o.num_train_epochs = 2;
    o.learning_rate = 1e-3f;
    o.save_model = true;
    TrainResult r = train(o);
    return std::make_pair(r, o.output_dir);
  };
  const auto [acc, acc_dir] = run("anatomy_accum_epochs", 4, 2);
  const auto [big, big_dir] = run("anatomy_accum_epochs_big", 8, 1);
  EXPECT_EQ(acc.steps, 6);
  EXPECT_EQ(big.steps, 6);
  EXPECT_EQ(acc.samples, 40);
  EXPECT_DOUBLE_EQ(acc.epoch, 2.0);
  EXPECT_NEAR(acc.last_loss, big.last_loss, 1e-5 * std::abs(big.last_loss));
  EXPECT_NEAR(acc.train_loss, big.train_loss, 1e-5 * std::abs(big.train_loss));
  auto be = make_cpu_backend();
  const BertConfig cfg = BertConfig::from_json_file(acc_dir + "/config.json");
  BertForSequenceClassification a(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  BertForSequenceClassification b(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(acc_dir, a);
  load_pretrained_weights(big_dir, b);
  EXPECT_LT(max_rel(a.master_to_host(), b.master_to_host()), 1e-5);
}

// Note [loss per step]: the logged loss and train_loss are means of the steps' losses, as the
// Trainer logs them: 20 samples in batches of 8 make steps of 8, 8 and 4, each weighing as one.
TEST(Train, LoggedLossesAreMeansOfStepLosses) {
  auto run = [](const std::string& name, int64_t logging_steps) {
    TrainOptions o = tiny(name);
    o.num_samples = 20;
    o.num_train_epochs = 1;
    o.logging_steps = logging_steps;
    const TrainResult r = train(o);
    std::vector<double> losses;
    std::ifstream in(o.output_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    }
    return std::make_pair(r, losses);
  };
  const auto [each, per_step] = run("anatomy_loss_per_step", 1);
  const auto [window, logged] = run("anatomy_loss_window", 3);
  ASSERT_EQ(per_step.size(), 3u);
  ASSERT_EQ(logged.size(), 1u);
  const double mean = (per_step[0] + per_step[1] + per_step[2]) / 3;
  EXPECT_NEAR(logged[0], mean, 1e-12);
  EXPECT_NEAR(each.train_loss, mean, 1e-12);
  EXPECT_NEAR(window.train_loss, mean, 1e-12);
  EXPECT_DOUBLE_EQ(each.last_loss, per_step[2]);
}

// A step that ends an epoch with a short micro-batch logs the mean of its micro-batches' means, as
// its gradient weighs them: 22 samples in micro-batches of 4, two a step, end with a step of 4 + 2
// samples. Without learning (lr 0) and dropout, each micro-batch's mean is a run's step loss in
// micro-batches of 2: steps 9, 10 (the 4) and 11 (the 2).
TEST(Train, AShortStepLogsTheMeanOfItsMicroBatchMeans) {
  const std::string model = anatomy::testing_dp::dropout_free_model("anatomy_short_step_model");
  auto losses = [&](const std::string& name, int64_t micro, int64_t accum) {
    TrainOptions o = accumulating(name, model, 22, micro, accum);
    o.learning_rate = 0.0f;
    o.logging_steps = 1;
    train(o);
    std::vector<double> out;
    std::ifstream in(o.output_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    return out;
  };
  const std::vector<double> accum = losses("anatomy_short_step_accum", 4, 2), pairs = losses("anatomy_short_step_pairs", 2, 1);
  ASSERT_EQ(accum.size(), 3u);
  ASSERT_EQ(pairs.size(), 11u);
  EXPECT_NEAR(accum[2], ((pairs[8] + pairs[9]) / 2 + pairs[10]) / 2, 1e-6);
  EXPECT_NEAR(accum[0], (pairs[0] + pairs[1] + pairs[2] + pairs[3]) / 4, 1e-6);
}

TEST(Train, CheckpointingGivesIdenticalGradients) {
  std::vector<float> none = grads_for(CheckpointPolicy::None, 4, 1, 0.1f);
  std::vector<float> layer = grads_for(CheckpointPolicy::Layer, 4, 1, 0.1f);
  std::vector<float> sel = grads_for(CheckpointPolicy::Selective, 4, 1, 0.1f);
  EXPECT_EQ(none, layer);  // same kernels on the same inputs: bitwise equal
  EXPECT_EQ(none, sel);
}

TEST(Train, CheckpointingShrinksActivations) {
  BertConfig cfg = BertConfig::preset("bert-base");
  auto bytes = [&](CheckpointPolicy p) { return model_arena_bytes(cfg, {8, 512, DType::BF16, p, true}).activations; };
  EXPECT_LT(bytes(CheckpointPolicy::Selective), bytes(CheckpointPolicy::None));
  EXPECT_LT(bytes(CheckpointPolicy::Layer), bytes(CheckpointPolicy::Selective) / 4);
}

TEST(Train, SavedModelLoadsBackIdentically) {
  TrainOptions o = tiny("anatomy_roundtrip");
  o.max_steps = 1;
  o.save_model = true;
  train(o);
  auto be = make_cpu_backend();
  BertConfig cfg = BertConfig::from_json_file(o.output_dir + "/config.json");
  EXPECT_EQ(cfg, [] {
    BertConfig c = BertConfig::preset("bert-tiny");
    return c;
  }());
  BertForSequenceClassification a(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  LoadReport rep = load_pretrained_weights(o.output_dir, a);
  EXPECT_TRUE(rep.newly_initialized.empty());
  EXPECT_TRUE(rep.unused.empty());
  // Save again and load into a second model: every tensor is bitwise identical.
  const std::string again = o.output_dir + "/again";
  save_pretrained(again, a);
  BertForSequenceClassification b(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(again, b);
  EXPECT_TRUE(testing_compare::same_values(a.master_to_host(), b.master_to_host()));
}

TEST(Train, LoadsBertModelNamesLegacyLayerNormNamesAndReportsTheHead) {
  // A checkpoint as a pretraining run saves it: BertModel names without "bert.", old
  // LayerNorm.gamma/beta spellings, a cls.* head, and no classifier.
  auto be = make_cpu_backend();
  BertConfig cfg = BertConfig::preset("bert-tiny");
  BertForSequenceClassification src(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  src.init_weights(5);
  std::vector<float> host = src.master_to_host();
  std::vector<std::string> names;
  std::vector<SafetensorsEntry> entries;
  for (const auto& p : src.layout().params()) {
    if (p.name.rfind("classifier.", 0) == 0) continue;
    std::string n = p.name.substr(5);  // drop "bert."
    if (n.size() > 16 && n.compare(n.size() - 16, 16, "LayerNorm.weight") == 0) n.replace(n.size() - 6, 6, "gamma");
    if (n.size() > 14 && n.compare(n.size() - 14, 14, "LayerNorm.bias") == 0) n.replace(n.size() - 4, 4, "beta");
    names.push_back(n);
    entries.push_back({names.back(), DType::F32, std::vector<int64_t>(p.shape.d.begin(), p.shape.d.begin() + p.shape.rank),
                       host.data() + p.offset});
  }
  std::vector<float> extra(cfg.vocab_size, 0.5f);
  entries.push_back({"cls.predictions.bias", DType::F32, {cfg.vocab_size}, extra.data()});
  const std::string dir = (std::filesystem::path(testing::TempDir()) / "anatomy_bertmodel").string();
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/model.safetensors", entries);

  BertForSequenceClassification dst(*be, cfg, {1, 8, DType::F32, CheckpointPolicy::None, false});
  dst.init_weights(9);
  LoadReport rep = load_pretrained_weights(dir, dst);
  EXPECT_EQ(rep.newly_initialized, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_EQ(rep.unused, (std::vector<std::string>{"cls.predictions.bias"}));
  std::vector<float> got = dst.master_to_host();
  for (const auto& p : dst.layout().params()) {
    if (p.name.rfind("classifier.", 0) == 0) continue;
    EXPECT_TRUE(std::equal(got.begin() + p.offset, got.begin() + p.offset + p.numel(), host.begin() + p.offset)) << p.name;
  }
}

// LayerNorm backward divides by the LayerNorm weights (Note [layernorm backward from its output]):
// the trainer names loaded weights that come near zero.
TEST(Train, NamesLayerNormWeightsNearZero) {
  auto be = make_cpu_backend(1);
  BertForSequenceClassification m(*be, BertConfig::preset("bert-tiny"), {1, 8, DType::F32, CheckpointPolicy::None, false});
  m.init_weights(3);
  EXPECT_TRUE(m.layernorm_weights_below(1e-3f).empty());  // initialized to 1
  std::vector<float> w = m.master_to_host();
  const ParamInfo& p = m.layout().get("bert.encoder.layer.1.output.LayerNorm.weight");
  w[p.offset + 5] = 2e-4f;
  m.set_master_from_host(w);
  EXPECT_EQ(m.layernorm_weights_below(1e-3f), std::vector<std::string>{"bert.encoder.layer.1.output.LayerNorm.weight"});
}
