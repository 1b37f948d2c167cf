// ModernBERT through the one training loop (issue 15): `anatomy train` on the tiny ModernBERT of
// tests/data/golden_family/modernbert (transformers' weights and tensor names), its loss falling
// on the learnable task, evaluation, checkpoint and resume against the uninterrupted run, data
// parallelism (ranks in one process and real processes) against one process, the memory plan
// against the allocator, the golden AdamW steps through the trainer's own pieces, and the
// checkpointing policies and gradient placements against keeping everything in buffers of
// their own.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "../common/cli.h"
#include "../common/data_parallel.h"
#include "../common/golden_modernbert.h"
#include "../common/shared_gradients.h"
#include "dist/communicator.h"
#include "dist/zero.h"
#include "io/atomic_file.h"
#include "memory/planner.h"
#include "model/encoder.h"
#include "train/evaluate.h"
#include "train/setup.h"
#include "train/trainer.h"

using namespace anatomy;
using namespace anatomy::testing_dp;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kFixture = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/modernbert";

using testing_cli::loss_curve;

// The fixture's architecture with the vocabulary the learnable task needs and two labels, trained
// one step from its config alone and saved: a ModernBERT directory with config.json and
// model.safetensors, made once per test process (in directories named after the test: ctest
// runs this file's tests as concurrent processes).
const std::string& start_model() {
  static const std::string dir = [] {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string cfg_dir = testing_dirs::fresh_dir("mb_start_config_" + test);
    BertConfig c = BertConfig::from_json_file(kFixture + "/config.json");
    c.vocab_size = 2200;
    c.set_num_labels(2);
    write_file_atomic(cfg_dir + "/config.json", c.to_json().dump(2));
    TrainOptions o = options("cpu", cfg_dir, "mb_start_" + test, 1, 8, 0);
    o.max_steps = 1;
    train(o);
    return o.output_dir;
  }();
  return dir;
}

// The learnable task from start_model()'s weights (--model-name-or-path on a ModernBERT
// directory): `steps` steps of batch 8 at seq 32.
TrainOptions modern(const std::string& out, int world = 1, int64_t batch = 8, int64_t steps = 4) {
  TrainOptions o = options("cpu", start_model(), out, world, batch, 0);
  o.max_steps = steps;
  o.logging_steps = 1;
  o.threads = world;
  o.learning_rate = 1e-4f;
  return o;
}

std::set<std::string> tensor_names(const std::string& file) {
  std::set<std::string> s;
  const SafetensorsReader r = SafetensorsReader::open(file);
  for (const auto& t : r.tensors()) s.insert(t.name);
  return s;
}

}  // namespace

// Loss falls on the learnable task; the saved directory has exactly transformers' tensor names
// (those of the file it started from), reloads with nothing missing or unused, and evaluates.
TEST(ModernBertTrain, LossFallsAndTheSavedModelReloadsAndEvaluates) {
  TrainOptions o = modern("mb_learn", 1, 8, 120);
  o.num_samples = 320;
  o.learning_rate = 3e-3f;
  o.validation_split = 0.2;
  o.eval_strategy = Cadence::No;
  o.eval_at_end = true;
  const TrainResult r = train(o);
  const auto c = loss_curve(o.output_dir);
  ASSERT_EQ(c.size(), 120u);
  double head = 0, tail = 0;
  for (int64_t s = 1; s <= 5; ++s) head += c.at(s) / 5, tail += c.at(121 - s) / 5;
  EXPECT_LT(tail, 0.5 * head) << "first steps " << head << ", last steps " << tail;
  std::printf("[modernbert] loss %.3f over the first 5 steps, %.3f over the last 5; eval accuracy %.3f\n", head, tail, r.eval("accuracy"));
  EXPECT_GE(r.eval("accuracy"), 0.75);  // chance is 0.5; 256 training samples, so it also memorizes
  EXPECT_GT(r.eval_samples, 0);
  const MemoryPlan plan = plan_memory(plan_input(o, BertConfig::from_json_file(start_model() + "/config.json"), 8,
                                                Device::CPU, 1));
  for (Category k : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
    EXPECT_EQ(r.peak_bytes[k], plan.bytes[k]) << category_name(k);
  EXPECT_EQ(r.peak_bytes[Category::Other],
            plan.bytes[Category::Other] + evaluation_buffer_bytes(8, 32, true));  // evaluation's batch and packing

  const std::string saved = o.output_dir + "/model.safetensors";
  EXPECT_EQ(tensor_names(saved), tensor_names(kFixture + "/model.safetensors"));
  const BertConfig cfg = BertConfig::from_json_file(o.output_dir + "/config.json");
  ASSERT_TRUE(cfg.is_modernbert());
  EXPECT_EQ(cfg.architectures, std::vector<std::string>{"ModernBertForSequenceClassification"});
  auto be = make_cpu_backend(1);
  auto m = make_model(*be, cfg, ModelShape{2, 8, DType::F32, CheckpointPolicy::None, false});
  const LoadReport rep = load_pretrained_weights(o.output_dir, *m);
  EXPECT_TRUE(rep.newly_initialized.empty());
  EXPECT_TRUE(rep.unused.empty());
  EXPECT_GT(max_abs_diff(m->master_to_host(), saved_weights(start_model())), 1e-3);  // it trained
}

// A checkpoint at step 2 resumed to step 4 ends where the uninterrupted run ends, bit for bit.
TEST(ModernBertTrain, CheckpointAndResumeEqualTheUninterruptedRun) {
  TrainOptions ref = modern("mb_resume_ref");
  ref.checkpoint_strategy = Cadence::Steps;
  ref.save_steps = 2;
  const TrainResult a = train(ref);
  ASSERT_TRUE(fs::exists(fs::path(ref.output_dir) / "checkpoint-2" / "optimizer.safetensors"));
  TrainOptions again = modern("mb_resume_again");
  again.resume_from_checkpoint = (fs::path(ref.output_dir) / "checkpoint-2").string();
  const TrainResult b = train(again);
  EXPECT_EQ(b.start_step, 2);
  EXPECT_EQ(b.train_loss, a.train_loss);
  EXPECT_EQ(max_abs_diff(saved_weights(ref.output_dir), saved_weights(again.output_dir)), 0.0);
  const auto ca = loss_curve(ref.output_dir), cb = loss_curve(again.output_dir);
  for (int64_t s : {3, 4}) EXPECT_EQ(cb.at(s), ca.at(s)) << "step " << s;
}

// The trainer's allocation is its plan, category by category (F32), and BF16, FP16 and F32
// models (training with no, layer or selective checkpointing, the gradients in a buffer of
// their own or in the activations; inference) allocate their plan's weights, gradients and
// arenas, and count the bytes that the gradients share with the activations as the plan does
// (built on the CPU, which allocates and casts in half precision).
TEST(ModernBertTrain, PlannedEqualsAllocated) {
  TrainOptions o = modern("mb_plan", 1, 8, 2);
  const TrainResult r = train(o);
  const BertConfig cfg = BertConfig::from_json_file(start_model() + "/config.json");
  const MemoryPlan plan = plan_memory(plan_input(o, cfg, 8, Device::CPU, 1));
  for (int c = 0; c < kNumCategories; ++c)
    EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
  EXPECT_GT(plan.bytes[Category::Activations], 0);

  for (const char* name : {"modernbert", "modernbert-bias-mean", "modernbert-ner", "modernbert-mlm"})
    for (DType dt : {DType::BF16, DType::F16, DType::F32})
      for (int mode = 0; mode < 7; ++mode) {  // training (none, layer, selective; own, in-activations), inference
        const bool training = mode < 6;
        const BertConfig c = BertConfig::from_json_file(golden::modernbert_dir(name) + "/config.json");
        const CheckpointPolicy policy = mode % 3 == 1 ? CheckpointPolicy::Layer
                                        : mode % 3 == 2 ? CheckpointPolicy::Selective
                                                        : CheckpointPolicy::None;
        const GradientPlacement placement = mode >= 3 && training ? GradientPlacement::InActivations
                                                                  : GradientPlacement::Own;
        const ModelShape shape{6, 17, dt, policy, training, placement};
        const MemoryPlan p = plan_memory(PlanInput{c, shape, OptimizerKind::AdamW, Device::CPU});
        auto be = make_cpu_backend(1);
        const CategoryBytes before = be->allocator().stats().current();
        auto m = make_model(*be, c, shape);
        const CategoryBytes after = be->allocator().stats().current();
        const std::string what = str_cat(name, " ", dtype_name(dt), " mode ", mode);
        for (Category k : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
          EXPECT_EQ(after[k] - before[k], p.bytes[k]) << what << " " << category_name(k);
        EXPECT_EQ(after.shared - before.shared, p.bytes.shared) << what;
        EXPECT_EQ(m->gradients_in_activations(), p.bytes.shared > 0) << what;
        if (placement == GradientPlacement::InActivations) {
          EXPECT_GT(p.bytes.shared, 0) << what;
        }
      }
  // Training on real tokens (Note [modernbert packed tokens]): planned == allocated too.
  for (const char* name : {"modernbert-bias-mean", "modernbert-mlm"})
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective})
      for (GradientPlacement placement : {GradientPlacement::Own, GradientPlacement::InActivations}) {
        const BertConfig c = BertConfig::from_json_file(golden::modernbert_dir(name) + "/config.json");
        ModelShape shape{6, 17, DType::BF16, policy, true, placement};
        shape.packed_tokens = true;
        const MemoryPlan p = plan_memory(PlanInput{c, shape, OptimizerKind::AdamW, Device::CPU});
        auto be = make_cpu_backend(1);
        const CategoryBytes before = be->allocator().stats().current();
        auto m = make_model(*be, c, shape);
        const CategoryBytes after = be->allocator().stats().current();
        for (Category k : {Category::Weights, Category::Gradients, Category::Activations, Category::Temporary})
          EXPECT_EQ(after[k] - before[k], p.bytes[k]) << name << " packed " << category_name(k);
        EXPECT_EQ(after.shared - before.shared, p.bytes.shared) << name;
      }
}

// Two and three ranks (in one process; ZeRO 0, 1 and 2 with a bucket per layer) train like one
// process with the combined batch.
TEST(ModernBertTrain, RanksTrainLikeOneProcess) {
  TrainOptions one = modern("mb_ranks_1", 1, 6);
  train(one);
  const auto ref = loss_curve(one.output_dir);
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_NE(ref.at(1), ref.at(4));
  for (int world : {2, 3})
    for (int zero : {0, 1, 2}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, ZeRO " + std::to_string(zero));
      TrainOptions o = modern("mb_ranks_" + std::to_string(world) + "_" + std::to_string(zero), world, 6 / world);
      o.zero_stage = zero;
      o.ddp_bucket_cap_mb = 0;
      train(o);
      const auto got = loss_curve(o.output_dir);
      ASSERT_EQ(got.size(), ref.size());
      for (const auto& [step, loss] : ref) EXPECT_NEAR(got.at(step), loss, 1e-5) << "step " << step;
      EXPECT_LT(max_abs_diff(saved_weights(one.output_dir), saved_weights(o.output_dir)), 1e-5);
    }
  // ZeRO-2 with accumulation: each micro-batch reduced to its shard and summed there.
  TrainOptions acc = modern("mb_ranks_acc", 3, 1);
  acc.zero_stage = 2;
  acc.gradient_accumulation_steps = 2;
  train(acc);
  const auto got = loss_curve(acc.output_dir);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) EXPECT_NEAR(got.at(step), loss, 1e-5) << "step " << step;
  EXPECT_LT(max_abs_diff(saved_weights(one.output_dir), saved_weights(acc.output_dir)), 1e-5);
}

// `anatomy plan --preset modernbert-base`: transformers' parameter count and a plan per category.
TEST(ModernBertTrain, PlanOfThePreset) {
  const testing_cli::CmdResult r = testing_cli::run_anatomy(
      "plan --preset modernbert-base --seq-len 512 --per-device-train-batch-size 32 --precision bf16 --gpu-memory 80GiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(149606402 parameters)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("activations"), std::string::npos) << r.output;
}

// `anatomy train --nproc-per-node 2`: two real processes over Gloo, like one with the combined batch.
TEST(ModernBertTrain, TwoProcessesTrainLikeOne) {
  const std::string dir = testing_cli::fresh_dir("mb_processes");
  auto args = [&](const std::string& out, int procs, int per_device) {
    return "train --device cpu --threads 1 --model-name-or-path " + start_model() +
           " --dataset learnable --num-samples 64 --max-seq-length 32 --learning-rate 1e-4 --max-steps 3"
           " --logging-steps 1 --disable-tqdm --nproc-per-node " + std::to_string(procs) +
           " --per-device-train-batch-size " + std::to_string(per_device) + " --output-dir " + dir + "/" + out;
  };
  const testing_cli::CmdResult a = testing_cli::run_anatomy(args("one", 1, 8));
  ASSERT_EQ(a.status, 0) << a.output;
  const testing_cli::CmdResult b = testing_cli::run_anatomy(args("two", 2, 4));
  ASSERT_EQ(b.status, 0) << b.output;
  const auto la = loss_curve(dir + "/one"), lb = loss_curve(dir + "/two");
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (const auto& [step, loss] : la) EXPECT_NEAR(lb.at(step), loss, 1e-5) << "step " << step;
  EXPECT_LT(max_abs_diff(saved_weights(dir + "/one"), saved_weights(dir + "/two")), 1e-5);
}

// The golden 5 AdamW steps through what the trainer uses: make_model, load_starting_weights and
// the data-parallel step of a world of one (clipping at 1).
TEST(ModernBertTrain, GoldenAdamWStepsThroughTheTrainersPath) {
  for (const char* name : {"modernbert", "modernbert-bias-mean"}) {
    SCOPED_TRACE(name);
    const std::string d = golden::modernbert_dir(name);
    golden::Fixture f(d);
    auto be = make_cpu_backend(1);
    auto model = make_model(*be, f.cfg, ModelShape{f.B, f.T});
    TrainOptions start;
    start.model_name_or_path = d;
    load_starting_weights(start, *model, false);
    golden::Batch batch(*be, f);
    auto group = make_local_group(1);
    OptimizerOptions oo;
    oo.kind = OptimizerKind::AdamW;
    oo.weight_decay = 0.01f;
    DataParallelStep dps(*be, *group[0], oo, model->layout(), 0);
    std::vector<double> ours;
    for (int s = 0; s <= 5; ++s) {
      model->zero_grads();
      dps.before_backward(*model, 0, true);
      model->forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
      dps.after_backward(*model, 0, true);
      double loss = 0;
      for (float v : golden::to_f32(*be, model->losses())) loss += v / static_cast<double>(f.B);
      ours.push_back(loss);
      if (s == 5) break;
      dps.step(*model, 1e-3f, 1.0f);
      model->sync_compute_copy();
    }
    std::vector<float> ref = golden::read_f32(f.ref, "adamw_losses");
    ref.push_back(golden::read_f32(f.ref, "adamw_final_loss")[0]);
    ASSERT_EQ(ref.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "step " << i;
    const std::vector<float> params = model->master_to_host();
    for (const auto& p : model->layout().params()) {
      const std::vector<float> want = golden::read_f32(f.ref, "adamw_final." + p.name);
      EXPECT_LE(golden::rel_err(params.data() + p.offset, want.data(), want.size()), 1e-4) << p.name;
    }
  }
}

// Text through the CLI: a ModernBERT directory with a byte-level BPE tokenizer.json (the
// RoBERTa fixture's, as ModernBERT's own kind) trains on labelled JSONL, saves, and `anatomy
// eval` evaluates the saved directory with its memory planned before loading.
TEST(ModernBertTrain, TextTrainingThenAnatomyEval) {
  const std::string dir = testing_cli::fresh_dir("mb_text");
  BertConfig c = BertConfig::from_json_file(kFixture + "/config.json");
  c.vocab_size = 400;
  c.pad_token_id = 1;
  c.id2label = {{0, "negative"}, {1, "neutral"}, {2, "positive"}};
  c.label2id = {{"negative", 0}, {"neutral", 1}, {"positive", 2}};
  write_file_atomic(dir + "/config.json", c.to_json().dump(2));
  fs::copy_file(std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta/tokenizer.json", dir + "/tokenizer.json");
  fs::copy_file(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl", dir + "/data.jsonl");
  const testing_cli::CmdResult t = testing_cli::run_anatomy(
      "train --device cpu --threads 1 --model-name-or-path " + dir + " --train-file " + dir +
      "/data.jsonl --max-seq-length 32 --max-steps 3 --save-strategy final --disable-tqdm --output-dir " + dir + "/out");
  ASSERT_EQ(t.status, 0) << t.output;
  // In file order (no length sorting) most batches hold enough padding to run on their real
  // tokens (Note [modernbert packed tokens]); the loss is the padded evaluation's.
  const std::string eval = "eval --device cpu --threads 1 --no-sort-by-length --model-name-or-path " + dir +
                           "/out --validation-file " + dir + "/data.jsonl";
  const testing_cli::CmdResult e = testing_cli::run_anatomy(eval);
  const testing_cli::CmdResult padded = testing_cli::run_anatomy(eval + " --no-skip-padding");
  ASSERT_EQ(e.status, 0) << e.output;
  ASSERT_EQ(padded.status, 0) << padded.output;
  auto loss_line = [](const std::string& out) {
    std::smatch r;
    return std::regex_search(out, r, std::regex("eval_loss: [0-9.]+")) ? r[0].str() : std::string();
  };
  ASSERT_FALSE(loss_line(e.output).empty()) << e.output;
  EXPECT_EQ(loss_line(e.output), loss_line(padded.output));
  EXPECT_NE(e.output.find("eval_accuracy:"), std::string::npos) << e.output;
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(e.output, r, std::regex(" ([0-9]+) of 25 batches packed"));
    return r;
  }();
  ASSERT_FALSE(m.empty()) << e.output;
  EXPECT_GT(std::stoi(m[1].str()), 12) << e.output;
}

// Regression (MSE) and multi-label (BCE with logits) through ModernBERT's head, the losses
// model/heads.h gives BERT: the gradient of the mean loss agrees with central differences of
// the loss, at the largest-gradient element of tensors across the model.
TEST(ModernBertTrain, RegressionAndMultiLabelGradientsMatchFiniteDifferences) {
  for (const char* problem : {"regression", "multi_label_classification"}) {
    SCOPED_TRACE(problem);
    golden::Fixture f(golden::modernbert_dir("modernbert-bias-mean"));
    BertConfig cfg = f.cfg;
    const bool regression = std::string(problem) == "regression";
    cfg.set_num_labels(regression ? 1 : 3);
    cfg.problem_type = problem;
    auto be = make_cpu_backend(1);
    auto model = make_model(*be, cfg, ModelShape{f.B, f.T});
    model->init_weights(11);
    golden::Batch batch(*be, f);
    const int64_t C = cfg.num_labels;
    std::vector<float> targets(static_cast<size_t>(f.B * C));
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = regression ? 0.5f * static_cast<float>(i % 5) - 1.0f : float(i % 2);
    Buffer labels(be->allocator(), DType::F32, {f.B, C}, Category::Other);
    be->upload(labels, targets.data());
    DeviceBatch db = batch.db;
    db.labels = labels;
    auto mean_loss = [&] {
      model->forward_eval(db);
      double s = 0;
      for (float v : golden::to_f32(*be, model->losses())) s += v / static_cast<double>(f.B);
      return s;
    };
    model->zero_grads();
    model->forward_backward(db, 1.0f / static_cast<float>(f.B), 0);
    const std::vector<float> grads = model->grads_to_host();
    std::vector<float> w = model->master_to_host();
    for (const char* name : {"classifier.bias", "classifier.weight", "head.dense.weight", "model.final_norm.weight",
                             "model.layers.1.attn.Wqkv.weight", "model.layers.0.mlp.Wi.weight",
                             "model.embeddings.tok_embeddings.weight"}) {
      const ParamInfo& p = model->layout().get(name);
      size_t at = p.offset;
      for (size_t i = p.offset; i < p.offset + p.numel(); ++i)
        if (std::fabs(grads[i]) > std::fabs(grads[at])) at = i;
      const float eps = 1e-2f, keep = w[at];
      w[at] = keep + eps;
      model->set_master_from_host(w);
      const double up = mean_loss();
      w[at] = keep - eps;
      model->set_master_from_host(w);
      const double down = mean_loss();
      w[at] = keep;
      model->set_master_from_host(w);
      const double numeric = (up - down) / (2 * eps);
      EXPECT_GT(std::fabs(grads[at]), 1e-4) << name;
      EXPECT_NEAR(grads[at], numeric, 2e-3 + 3e-2 * std::fabs(numeric)) << name;
    }
  }
}

// --gradient-checkpointing layer: the same losses and weights as keeping every activation, bit
// for bit, with fewer activation bytes, and the allocation equal to its plan.
TEST(ModernBertTrain, LayerCheckpointingEqualsNoneWithLessMemory) {
  TrainOptions none = modern("mb_ckpt_none");
  const TrainResult a = train(none);
  TrainOptions layer = modern("mb_ckpt_layer");
  layer.gradient_checkpointing = CheckpointPolicy::Layer;
  const TrainResult b = train(layer);
  EXPECT_EQ(b.train_loss, a.train_loss);
  EXPECT_EQ(max_abs_diff(saved_weights(none.output_dir), saved_weights(layer.output_dir)), 0.0);
  EXPECT_LT(b.peak_bytes[Category::Activations], a.peak_bytes[Category::Activations] / 2);
  const BertConfig cfg = BertConfig::from_json_file(start_model() + "/config.json");
  const MemoryPlan plan = plan_memory(plan_input(layer, cfg, 8, Device::CPU, 1));
  for (int c = 0; c < kNumCategories; ++c)
    EXPECT_EQ(b.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
}

// --gradient-checkpointing selective (Note [modernbert selective recompute] in
// model/modernbert.cpp): the same losses and weights as keeping every activation, bit for bit;
// the activations smaller by exactly every layer's gated-GELU output, the scratch no larger (g
// shares wi's gradient), the allocation equal to its plan, and the liveness profile smaller by
// one g per layer written so far.
TEST(ModernBertTrain, SelectiveCheckpointingEqualsNoneWithLessMemory) {
  TrainOptions none = modern("mb_sel_none");
  const TrainResult a = train(none);
  TrainOptions sel = modern("mb_sel_selective");
  sel.gradient_checkpointing = CheckpointPolicy::Selective;
  const TrainResult b = train(sel);
  EXPECT_EQ(b.train_loss, a.train_loss);
  EXPECT_EQ(max_abs_diff(saved_weights(none.output_dir), saved_weights(sel.output_dir)), 0.0);
  const BertConfig cfg = BertConfig::from_json_file(start_model() + "/config.json");
  const int64_t g = 8 * 32 * cfg.intermediate_size * 4;  // [B*T, intermediate] in F32
  EXPECT_EQ(a.peak_bytes[Category::Activations] - b.peak_bytes[Category::Activations], cfg.num_hidden_layers * g);
  EXPECT_EQ(b.peak_bytes[Category::Temporary], a.peak_bytes[Category::Temporary]);
  const MemoryPlan plan = plan_memory(plan_input(sel, cfg, 8, Device::CPU, 1));
  for (int c = 0; c < kNumCategories; ++c)
    EXPECT_EQ(b.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
  const std::vector<LivenessPoint> ln = activation_liveness(cfg, plan_input(none, cfg, 8, Device::CPU, 1).shape);
  const std::vector<LivenessPoint> ls = activation_liveness(cfg, plan_input(sel, cfg, 8, Device::CPU, 1).shape);
  ASSERT_EQ(ls.size(), ln.size());
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string label = str_cat("layer ", l, " forward");
    const auto at = [&](const std::vector<LivenessPoint>& v) {
      for (const LivenessPoint& p : v)
        if (p.label == label) return p.activation_bytes;
      ADD_FAILURE() << "no liveness point " << label;
      return int64_t{0};
    };
    EXPECT_EQ(at(ln) - at(ls), (l + 1) * g) << label;
  }
  // The out-of-memory advice offers it for ModernBERT too, at the planned total.
  PlanInput in = plan_input(none, cfg, 8, Device::CPU, 1);
  bool offered = false;
  for (const Lever& l : levers_that_fit(in, plan_memory(in).total() * 2, 0, 1))
    if (l.description == "--gradient-checkpointing selective") {
      offered = true;
      EXPECT_EQ(l.total, plan.total());
    }
  EXPECT_TRUE(offered);
}

// `anatomy train --gradient-checkpointing selective` on a tiny ModernBERT runs, with the losses
// of --gradient-checkpointing none.
TEST(ModernBertTrain, CliSelectiveCheckpointingTrainsLikeNone) {
  const std::string dir = testing_cli::fresh_dir("mb_cli_selective");
  auto run = [&](const std::string& policy) {
    const testing_cli::CmdResult r = testing_cli::run_anatomy(
        "train --device cpu --threads 1 --model-name-or-path " + start_model() +
        " --dataset learnable --num-samples 32 --max-seq-length 32 --per-device-train-batch-size 8 --max-steps 3"
        " --logging-steps 1 --disable-tqdm --gradient-checkpointing " + policy + " --output-dir " + dir + "/" + policy);
    EXPECT_EQ(r.status, 0) << r.output;
    return loss_curve(dir + "/" + policy);
  };
  const auto none = run("none"), selective = run("selective");
  ASSERT_EQ(none.size(), 3u);
  EXPECT_EQ(selective, none);
}

// --gradient-placement in-activations (Note [modernbert gradients in freed activations] in
// model/modernbert.cpp) through the trainer, with each checkpointing policy: the losses and
// weights of the gradients in a buffer of their own, bit for bit; the allocation equal to its
// plan with the shared bytes, the same activations and gradients, and a smaller total.
TEST(ModernBertTrain, GradientsInActivationsTrainLikeTheirOwnBuffer) {
  const BertConfig cfg = BertConfig::from_json_file(start_model() + "/config.json");
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    const std::string p = checkpoint_policy_name(policy);
    SCOPED_TRACE(p);
    TrainOptions own = modern("mb_place_own_" + p);
    own.gradient_checkpointing = policy;
    own.gradient_placement = "own";
    const TrainResult a = train(own);
    TrainOptions in = modern("mb_place_in_" + p);
    in.gradient_checkpointing = policy;
    in.gradient_placement = "in-activations";
    const TrainResult b = train(in);
    EXPECT_EQ(b.train_loss, a.train_loss);
    EXPECT_EQ(loss_curve(in.output_dir), loss_curve(own.output_dir));
    EXPECT_EQ(max_abs_diff(saved_weights(own.output_dir), saved_weights(in.output_dir)), 0.0);
    const MemoryPlan plan = plan_memory(plan_input(in, cfg, 8, Device::CPU, 1));
    EXPECT_GT(plan.bytes.shared, 0);
    EXPECT_EQ(b.peak_bytes.shared, plan.bytes.shared);
    for (int c = 0; c < kNumCategories; ++c)
      EXPECT_EQ(b.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c));
    for (Category c : {Category::Gradients, Category::Activations})
      EXPECT_EQ(b.peak_bytes[c], a.peak_bytes[c]) << category_name(c);
    EXPECT_EQ(b.peak_bytes.total(), a.peak_bytes.total() - plan.bytes.shared);
  }
  // auto places them in the activations with one micro-batch per step, not with accumulation.
  TrainOptions o = modern("mb_place_auto");
  EXPECT_EQ(plan_input(o, cfg, 8, Device::CPU, 1).shape.gradients, GradientPlacement::InActivations);
  o.gradient_accumulation_steps = 2;
  EXPECT_EQ(plan_input(o, cfg, 8, Device::CPU, 1).shape.gradients, GradientPlacement::Own);
}

// The memory over a step (memory_timeline.json): the saved activations grow through forward
// and shrink through backward; with the gradients in the activations, the ranges written so far
// grow to all of them, and at every point they fit beside the live activations in the block.
TEST(ModernBertTrain, LivenessFitsLiveActivationsAndWrittenGradientsInTheBlock) {
  for (const char* name : {"modernbert", "modernbert-bias-mean", "modernbert-ner", "modernbert-mlm"})
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
      SCOPED_TRACE(std::string(name) + " " + checkpoint_policy_name(policy));
      const BertConfig cfg = BertConfig::from_json_file(golden::modernbert_dir(name) + "/config.json");
      ModelShape s{6, 17, DType::BF16, policy, true, GradientPlacement::InActivations};
      const ArenaBytes a = model_arena_bytes(cfg, s);
      ASSERT_GT(a.block, 0u);
      const std::vector<LivenessPoint> t = activation_liveness(cfg, s);
      ASSERT_EQ(t.size(), 2 * static_cast<size_t>(cfg.num_hidden_layers) + 5);
      const int64_t all = 4 * static_cast<int64_t>(ParamLayout::for_modernbert(cfg).total());
      int64_t prev_acts = 0, prev_grads = 0;
      for (size_t i = 0; i < t.size(); ++i) {
        const LivenessPoint& p = t[i];
        const bool forward = i <= static_cast<size_t>(cfg.num_hidden_layers) + 1;  // through "head forward"
        if (forward) {
          EXPECT_GT(p.activation_bytes, prev_acts) << p.label;
        } else {
          EXPECT_LE(p.activation_bytes, prev_acts) << p.label;
        }
        EXPECT_GE(p.gradient_bytes, prev_grads) << p.label;  // written once, kept to the end
        EXPECT_LE(p.activation_bytes + p.gradient_bytes, static_cast<int64_t>(a.block)) << p.label;
        prev_acts = p.activation_bytes, prev_grads = p.gradient_bytes;
      }
      EXPECT_EQ(t[static_cast<size_t>(cfg.num_hidden_layers) + 1].label, "head forward");
      EXPECT_EQ(t[static_cast<size_t>(cfg.num_hidden_layers) + 1].activation_bytes,
                static_cast<int64_t>(a.activations));  // the whole arena is live at the end of forward
      EXPECT_EQ(t.front().gradient_bytes, 0);
      EXPECT_EQ(t.back().gradient_bytes, all);
      EXPECT_GT(t.back().activation_bytes, 0);  // the logits and losses outlive backward
      s.gradients = GradientPlacement::Own;
      for (const LivenessPoint& p : activation_liveness(cfg, s)) EXPECT_EQ(p.gradient_bytes, -1) << p.label;
    }
}

// modernbert-base at batch 32 x seq 512 in bf16: nearly all of its 571 MiB of fp32 gradients fits
// into activation memory that backward frees (549 MiB without checkpointing or with selective,
// 528 with layer checkpointing), and the total falls by exactly that.
TEST(ModernBertTrain, PresetSharesNearlyAllGradientMemory) {
  const BertConfig cfg = BertConfig::preset("modernbert-base");
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    testing_plan::expect_gradients_shared(cfg, ModelShape{32, 512, DType::BF16, policy, true}, 0.9);
  }
}
