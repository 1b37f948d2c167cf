// The encoder variants (RoBERTa, XLM-R, DistilBERT, ELECTRA; Note [encoder variants] in
// model/bert.cpp) against Hugging Face transformers on the same weights and batch
// (tests/data/golden_family/ARCH, written by tests/golden/make_golden_family.py): logits, loss,
// every gradient, 5 AdamW steps; the tensor names transformers wrote; the memory plan; and the
// equalities the training paths owe each other (packed = padded, checkpointing, placement).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../common/cli.h"
#include "../common/compare.h"
#include "../common/dirs.h"
#include "../common/golden.h"
#include "../common/packed_step.h"
#include "io/read_file.h"
#include "memory/planner.h"
#include "train/trainer.h"

using namespace anatomy;
using anatomy::testing_compare::largest_magnitude;
using namespace anatomy::golden;
using anatomy::testing_compare::same_values;

namespace {

std::string family_dir(const std::string& arch) {
  const char* env = std::getenv("ANATOMY_SOURCE_DIR");
  return std::string(env ? env : ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + arch;
}

std::set<std::string> tensor_names(const std::string& file) {
  std::set<std::string> out;
  const SafetensorsReader r = SafetensorsReader::open(file);
  for (const auto& t : r.tensors()) out.insert(t.name);
  return out;
}

// Loss before each AdamW step with the fixture's recipe (constant lr 1e-3, clip 1.0), then after the last.
std::vector<float> adamw_losses(Backend& be, const Fixture& f, const std::string& d, int steps) {
  BertForSequenceClassification model(be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  load_pretrained_weights(d, model);
  Batch batch(be, f);
  OptimizerOptions oo;
  oo.kind = OptimizerKind::AdamW;
  oo.weight_decay = 0.01f;
  auto opt = Optimizer::create(be, oo, model.layout());
  GradNorm norm(be, model.layout().total());
  std::vector<float> losses;
  for (int s = 0; s <= steps; ++s) {
    model.zero_grads();
    model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);
    double mean = 0;
    for (float v : to_f32(be, model.losses())) mean += v / static_cast<double>(f.B);
    losses.push_back(static_cast<float>(mean));
    if (s == steps) break;
    norm.compute(model.grads());
    opt->step(ParamGroups{model.master(), Tensor(), model.grads(), model.layout().decay_end()},
              GradTransform{norm.norm_sq(), 1.0f, 1.0f}, 1e-3f);
  }
  return losses;
}

class GoldenFamily : public testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(GoldenFamily, ForwardLossAndEveryGradientMatchTransformers) {
  const std::string d = family_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {f.B, f.T, DType::F32, CheckpointPolicy::None, true});
  LoadReport rep = load_pretrained_weights(d, model);
  EXPECT_TRUE(rep.newly_initialized.empty()) << rep.newly_initialized.front();
  EXPECT_TRUE(rep.unused.empty()) << rep.unused.front();
  Batch batch(*be, f);
  model.zero_grads();
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B), 0);

  std::vector<float> logits = to_f32(*be, model.logits()), ref_logits = read_f32(f.ref, "logits");
  EXPECT_LE(rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-4);
  double loss = 0;
  for (float v : to_f32(*be, model.losses())) loss += v / static_cast<double>(f.B);
  const float ref_loss = read_f32(f.ref, "loss")[0];
  EXPECT_LE(std::abs(loss - ref_loss) / std::abs(ref_loss), 1e-4);

  std::vector<float> grads = model.grads_to_host();
  std::vector<std::string> names;
  for (const auto& p : model.layout().params()) names.push_back(p.name);
  const double total = grads_norm(f.ref, names);
  int zero = 0;
  for (const auto& p : model.layout().params()) {
    std::vector<float> ref = read_f32(f.ref, "grad." + p.name);
    ASSERT_EQ(ref.size(), p.numel()) << p.name;
    if (negligible(ref, total)) {
      EXPECT_LE(abs_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4 * total) << p.name;
      ++zero;
    } else {
      EXPECT_LE(rel_err(grads.data() + p.offset, ref.data(), ref.size()), 1e-4) << p.name;
    }
  }
  EXPECT_LE(zero, 2);  // the two key biases
}

TEST_P(GoldenFamily, FiveAdamWStepsTrackTransformers) {
  const std::string d = family_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  std::vector<float> ours = adamw_losses(*be, f, d, 5);
  std::vector<float> ref = read_f32(f.ref, "adamw_losses");
  ref.push_back(read_f32(f.ref, "adamw_final_loss")[0]);
  ASSERT_EQ(ref.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_LE(std::abs(ours[i] - ref[i]) / std::abs(ref[i]), 1e-4) << "step " << i;
}

// Saved back, the model has exactly the tensors transformers wrote (the generator checked that
// from_pretrained reads those with no missing or unexpected key), with their shapes, and a
// config.json of the same model_type and class that reads back equal.
TEST_P(GoldenFamily, SavesTheTensorNamesTransformersLoads) {
  const std::string d = family_dir(GetParam());
  Fixture f(d);
  auto be = make_cpu_backend();
  BertForSequenceClassification model(*be, f.cfg, {1, 4, DType::F32, CheckpointPolicy::None, false});
  load_pretrained_weights(d, model);
  const std::string out = testing_dirs::fresh_dir(std::string("family_save_") + GetParam());
  save_pretrained(out, model);
  const std::set<std::string> ours = tensor_names(out + "/model.safetensors"), theirs = tensor_names(d + "/model.safetensors");
  EXPECT_EQ(ours, theirs);
  SafetensorsReader a = SafetensorsReader::open(out + "/model.safetensors"), b = SafetensorsReader::open(d + "/model.safetensors");
  for (const std::string& n : theirs)
    if (ours.count(n)) {
      EXPECT_EQ(a.info(n).shape, b.info(n).shape) << n;
      EXPECT_TRUE(same_values<float>(read_f32(a, n), read_f32(b, n))) << n;
    }
  const nlohmann::json saved = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  const nlohmann::json given = nlohmann::json::parse(read_regular_file(d + "/config.json"));
  EXPECT_EQ(saved.at("model_type"), given.at("model_type"));
  EXPECT_EQ(saved.at("architectures"), given.at("architectures"));
  EXPECT_EQ(BertConfig::from_json_file(out + "/config.json"), f.cfg);
}

std::string fixture_model(const std::string& arch) {
  return std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/" + arch;
}

// tests/data/text/sentiment.jsonl with each text paired with the next one's (a "hypothesis"
// column), copied where the token cache may go.
std::string pair_data(const std::string& dir) {
  std::ifstream in(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line) && rows.size() < 48) rows.push_back(nlohmann::json::parse(line));
  std::ofstream out(dir + "/pairs.jsonl");
  for (size_t i = 0; i < rows.size(); ++i) {
    nlohmann::json r = rows[i];
    r["hypothesis"] = rows[(i + 1) % rows.size()]["text"];
    out << r.dump() << "\n";
  }
  return dir + "/pairs.jsonl";
}

// plan_memory's categories are what training allocates, for each gradient checkpointing policy
// and gradient placement, padded and on the batches' real tokens, on the committed model
// directory and its tokenizer.
TEST_P(GoldenFamily, PlanEqualsAllocated) {
  const std::string model = fixture_model(GetParam());
  const std::string dir = testing_dirs::fresh_dir(std::string("family_plan_") + GetParam());
  const std::string data = pair_data(dir);
  for (bool skip_padding : {false, true})
    for (const char* policy : {"none", "selective", "layer"})
      for (const char* place : {"own", "in-activations"}) {
        if (skip_padding && std::string(policy) == "layer") continue;  // refused (Note [packed training])
        TrainOptions o;
        o.model_name_or_path = model;
        o.train_file = data;
        o.text_pair_column = "hypothesis";
        o.device = DeviceChoice::Cpu;
        o.seq_len = 24;
        o.per_device_train_batch_size = 8;
        o.max_steps = 2;
        o.logging_steps = 0;
        o.skip_padding = skip_padding;
        o.gradient_checkpointing = parse_checkpoint_policy(policy);
        o.gradient_placement = place;
        o.output_dir = dir + "/run";
        o.overwrite_output_dir = true;
        o.save_model = false;
        o.disable_progress_bar = true;
        TrainResult r = train(o);
        BertConfig cfg = BertConfig::from_json_file(model + "/config.json");
        ModelShape s{8, 24, DType::F32, o.gradient_checkpointing, true, resolve_gradient_placement(place, 1), skip_padding};
        MemoryPlan plan = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CPU});
        for (int c = 0; c < kNumCategories; ++c)
          EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c)) << " " << policy
                                                        << " " << place << " skip_padding " << skip_padding;
        EXPECT_TRUE(std::isfinite(r.last_loss));
      }
}

// With dropout on: packed training equals the padded step; gradients written into freed
// activations equal their own buffer's; selective checkpointing equals none.
TEST_P(GoldenFamily, TrainingPathsAgree) {
  BertConfig cfg = BertConfig::from_json_file(family_dir(GetParam()) + "/config.json");
  cfg.hidden_dropout_prob = 0.1;
  cfg.attention_probs_dropout_prob = 0.1;
  cfg.classifier_dropout = 0.1;
  const int64_t T = 9;
  HostBatch hb = testing_packed::batch_of({9, 5, 2}, T, 3);
  for (int32_t& id : hb.input_ids) id = static_cast<int32_t>(id % cfg.vocab_size);
  for (int64_t i = 0; i < 3 * T; ++i)
    if (!hb.attention_mask[i]) hb.input_ids[i] = static_cast<int32_t>(cfg.pad_token_id);
  if (cfg.is_roberta()) std::fill(hb.token_type_ids.begin(), hb.token_type_ids.end(), 0);
  auto be = make_cpu_backend();
  using testing_packed::step;
  const auto base = step(*be, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  ASSERT_GT(largest_magnitude(base.grads), 1e-4);
  const auto in_acts = step(*be, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::InActivations);
  EXPECT_TRUE(same_values<float>(in_acts.grads, base.grads));
  const auto selective = step(*be, cfg, hb, false, CheckpointPolicy::Selective, GradientPlacement::InActivations);
  EXPECT_TRUE(same_values<float>(selective.grads, base.grads));
  const auto layer = step(*be, cfg, hb, false, CheckpointPolicy::Layer, GradientPlacement::Own);
  EXPECT_TRUE(same_values<float>(layer.grads, base.grads));
  // Inference on the token rows equals the padded forward (Note [packed inference]).
  {
    BertForSequenceClassification m(*be, cfg, {3, T, DType::F32, CheckpointPolicy::None, false});
    m.init_weights(7);
    testing_packed::Uploaded padded_batch(*be, hb, false), packed_batch(*be, hb, true);
    m.forward_eval(padded_batch.db);
    const std::vector<float> a = to_f32(*be, m.logits());
    m.forward_eval(packed_batch.db);
    const std::vector<float> b = to_f32(*be, m.logits());
    EXPECT_TRUE(same_values<float>(b, a, 1e-5 * largest_magnitude(a)));
  }
  // Packed: the same arithmetic on the token rows, dropout masks drawn by packed row: compare
  // without dropout.
  cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.0;
  cfg.classifier_dropout = 0.0;
  const auto padded = step(*be, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  const auto packed = step(*be, cfg, hb, true, CheckpointPolicy::Selective, GradientPlacement::InActivations);
  EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
  EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest_magnitude(padded.grads)));
}

INSTANTIATE_TEST_SUITE_P(Arch, GoldenFamily, testing::Values("roberta", "xlm-roberta", "distilbert", "electra"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                           return n;
                         });

// `anatomy train --model-name-or-path DIR` end to end on the CPU for each variant with its own
// tokenizer.json (byte-level BPE, Unigram, WordPiece) on sentence pairs: the run saves a model
// directory that transformers loads as the same class (the tensor names it wrote, the
// model_type and class in config.json) with the tokenizer beside it, and the loss is finite.
TEST_P(GoldenFamily, AnatomyTrainRunsEndToEnd) {
  const std::string arch = GetParam();
  const std::string dir = testing_dirs::fresh_dir("family_cli_" + arch);
  const std::string data = pair_data(dir), out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --model-name-or-path " + fixture_model(arch) + " --train-file " + data +
      " --text-pair-column hypothesis --max-seq-length 32 --per-device-train-batch-size 8 --max-steps 4"
      " --learning-rate 1e-3 --logging-steps 2 --disable-tqdm --output-dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tensor_names(out + "/model.safetensors"), tensor_names(fixture_model(arch) + "/model.safetensors"));
  const nlohmann::json saved = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  const nlohmann::json given = nlohmann::json::parse(read_regular_file(fixture_model(arch) + "/config.json"));
  EXPECT_EQ(saved.at("model_type"), given.at("model_type"));
  EXPECT_EQ(saved.at("architectures"), given.at("architectures"));
  EXPECT_EQ(saved.at("id2label").size(), 3u);  // negative, neutral, positive from the data
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
  const nlohmann::json res = nlohmann::json::parse(read_regular_file(out + "/train_results.json"));
  EXPECT_EQ(res.at("steps"), 4);
  EXPECT_TRUE(std::isfinite(res.at("train_loss").get<double>())) << res.dump();
  // `anatomy eval` reads the saved directory with its tokenizer: a prediction per pair.
  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --validation-file " + data +
                                          " --text-pair-column hypothesis --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  std::ifstream preds(dir + "/eval/predictions.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(preds, line)) n += !line.empty();
  EXPECT_EQ(n, 48);
}

// The variant presets have the parameter counts transformers gives their
// *ForSequenceClassification (2 labels), in the config's arithmetic and in the flat layout.
TEST(FamilyPresets, ParameterCountsAreTransformers) {
  const std::pair<const char*, int64_t> expected[] = {{"roberta-base", 124647170},   {"xlm-roberta-base", 278045186},
                                                      {"distilbert-base", 66955010}, {"electra-small", 13549314},
                                                      {"electra-base", 109483778}};
  for (const auto& [name, n] : expected) {
    const BertConfig c = BertConfig::preset(name);
    EXPECT_EQ(c.num_parameters(), n) << name;
    EXPECT_EQ(static_cast<int64_t>(ParamLayout::for_sequence_classification(c).num_parameters()), n) << name;
    EXPECT_EQ(BertConfig::from_json(c.to_json(), name), c) << name;  // config.json round trip
  }
}

// A run stopped after its step-2 checkpoint and resumed from it ends with the weights of the
// uninterrupted run, bit for bit, and two data-parallel ranks train each variant too.
TEST_P(GoldenFamily, ResumesBitForBitAndTrainsOnTwoRanks) {
  const std::string arch = GetParam();
  const std::string dir = testing_dirs::fresh_dir("family_resume_" + arch);
  const std::string data = pair_data(dir);
  const std::string common = "train --device cpu --model-name-or-path " + fixture_model(arch) + " --train-file " + data +
                             " --text-pair-column hypothesis --max-seq-length 32 --per-device-train-batch-size 8"
                             " --max-steps 4 --learning-rate 1e-3 --logging-steps 1 --disable-tqdm --seed 3";
  auto r = testing_cli::run_anatomy(common + " --output-dir " + dir + "/whole");
  ASSERT_EQ(r.status, 0) << r.output;
  r = testing_cli::run_anatomy(common + " --save-strategy steps --save-steps 2 --output-dir " + dir + "/cut");
  ASSERT_EQ(r.status, 0) << r.output;
  std::filesystem::remove(dir + "/cut/model.safetensors");
  r = testing_cli::run_anatomy(common + " --save-strategy steps --save-steps 2 --overwrite-output-dir --output-dir " + dir +
                               "/cut --resume-from-checkpoint " + dir + "/cut/checkpoint-2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(testing_compare::same_safetensors(dir + "/whole/model.safetensors", dir + "/cut/model.safetensors"));
  const auto resumed = nlohmann::json::parse(read_regular_file(dir + "/cut/train_results.json"));
  EXPECT_EQ(resumed.at("resumed_from_step"), 2);  // not a fresh run that would end the same
  r = testing_cli::run_anatomy(common + " --nproc-per-node 2 --per-device-train-batch-size 4 --output-dir " + dir + "/ranks");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(tensor_names(dir + "/ranks/model.safetensors"), tensor_names(fixture_model(arch) + "/model.safetensors"));
}

// config.json files as the Hub serves them for the checkpoints the presets copy: each reads as
// its variant with the preset's sizes (fields anatomy does not use, such as ELECTRA's summary_*,
// are ignored as transformers' classifiers ignore them).
TEST(FamilyPresets, HubConfigsReadAsTheirPresets) {
  const std::pair<const char*, const char*> hub[] = {
      {"roberta-base", R"({"architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
        "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
        "model_type": "roberta", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "type_vocab_size": 1, "vocab_size": 50265})"},
      {"xlm-roberta-base", R"({"architectures": ["XLMRobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
        "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 514,
        "model_type": "xlm-roberta", "num_attention_heads": 12, "num_hidden_layers": 12, "output_past": true,
        "pad_token_id": 1, "position_embedding_type": "absolute", "type_vocab_size": 1, "use_cache": true,
        "vocab_size": 250002})"},
      {"distilbert-base", R"({"activation": "gelu", "architectures": ["DistilBertForMaskedLM"], "attention_dropout": 0.1,
        "dim": 768, "dropout": 0.1, "hidden_dim": 3072, "initializer_range": 0.02, "max_position_embeddings": 512,
        "model_type": "distilbert", "n_heads": 12, "n_layers": 6, "pad_token_id": 0, "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": false, "tie_weights_": true, "vocab_size": 30522})"},
      {"electra-base", R"({"architectures": ["ElectraForPreTraining"], "attention_probs_dropout_prob": 0.1,
        "embedding_size": 768, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
        "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
        "model_type": "electra", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
        "position_embedding_type": "absolute", "summary_activation": "gelu", "summary_last_dropout": 0.1,
        "summary_type": "first", "summary_use_proj": true, "type_vocab_size": 2, "vocab_size": 30522})"},
      {"electra-small", R"({"architectures": ["ElectraForPreTraining"], "attention_probs_dropout_prob": 0.1,
        "embedding_size": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 256,
        "initializer_range": 0.02, "intermediate_size": 1024, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
        "model_type": "electra", "num_attention_heads": 4, "num_hidden_layers": 12, "pad_token_id": 0,
        "type_vocab_size": 2, "vocab_size": 30522})"},
  };
  for (const auto& [preset, text] : hub) {
    BertConfig c = BertConfig::from_json(nlohmann::json::parse(text), preset);
    BertConfig p = BertConfig::preset(preset);
    EXPECT_EQ(c.num_parameters(), p.num_parameters()) << preset;
    EXPECT_EQ(c.architecture, p.architecture) << preset;
    EXPECT_EQ(c.max_sequence_length(), 512) << preset;
    c.architectures = p.architectures;  // the Hub's pretraining class; training saves the classifier's
    EXPECT_EQ(c, p) << preset;
  }
}
