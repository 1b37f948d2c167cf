// Regression and multi-label sequence classification end to end through the CLI on the CPU
// (Note [problem types] in model/heads.h): the problem type inferred from the training file's
// labels, written into the saved config.json, evaluated with its own metrics, and `anatomy eval`
// predictions for it; plus the float-label reader and metrics on their own.
#include <gtest/gtest.h>

#include <charconv>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../common/cli.h"
#include "../common/dirs.h"
#include "core/error.h"
#include "data/float_labels.h"
#include "data/tokenizer.h"
#include "data/token_tags.h"
#include "io/read_file.h"
#include "io/safetensors.h"
#include "memory/planner.h"
#include "model/heads.h"
#include "train/trainer.h"
#include "train/evaluate.h"

using namespace anatomy;

namespace {

std::vector<nlohmann::json> sentiment_rows(size_t n) {
  std::ifstream in(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line) && rows.size() < n) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

int sentiment_id(const nlohmann::json& r) {
  const std::string l = r.at("label");
  return l == "negative" ? 0 : l == "neutral" ? 1 : 2;
}

// Each text with a score (regression: 0.x negative, 2.x neutral, 4.x positive) or a list of
// class ids (multi-label: its sentiment, and class 1 too when the text has more than 7 words).
std::string write_data(const std::string& dir, const std::string& name, bool lists, size_t n) {
  std::ofstream out(dir + "/" + name);
  size_t i = 0;
  for (const auto& r : sentiment_rows(n)) {
    nlohmann::json o = {{"text", r.at("text")}};
    const int id = sentiment_id(r);
    if (lists) {
      const std::string t = r.at("text");
      std::vector<int> ids{id};
      if (std::count(t.begin(), t.end(), ' ') >= 7 && id != 1) ids.push_back(1);
      o["label"] = ids;
    } else {
      o["label"] = 2.0 * id + 0.25 + 0.5 * static_cast<double>(i % 3) / 3.0;
    }
    ++i;
    out << o.dump() << "\n";
  }
  return dir + "/" + name;
}

std::string model_dir() { return std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/roberta"; }

// A tiny ModernBERT directory from a golden fixture's config (hidden 24, 3 heads, a local layer;
// "modernbert-ner" or "modernbert-mlm": the head it was written with) with the RoBERTa fixture's
// byte-level BPE and its 400 tokens: config.json and tokenizer.json only (weights from init).
std::string tiny_modernbert(const std::string& dir, const std::string& fixture) {
  BertConfig c = BertConfig::from_json_file(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/" + fixture +
                                            "/config.json");
  c.vocab_size = 400;
  c.pad_token_id = 1;
  c.initializer_range = 0.02;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << c.to_json().dump(2);
  std::filesystem::copy_file(model_dir() + "/tokenizer.json", dir + "/tokenizer.json");
  return dir;
}

std::set<std::string> tensor_names(const std::string& file) {
  std::set<std::string> out;
  const SafetensorsReader r = SafetensorsReader::open(file);
  for (const auto& t : r.tensors()) out.insert(t.name);
  return out;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(FloatLabels, SniffsTheLabelColumnAsRunClassificationDoes) {
  const std::string dir = testing_dirs::fresh_dir("float_labels_sniff");
  auto file = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir + "/" + name) << body;
    return dir + "/" + name;
  };
  EXPECT_EQ(sniff_label_column(file("a.jsonl", "{\"text\":\"x\",\"label\":1}\n{\"text\":\"y\",\"label\":\"b\"}\n"),
                               TextFormat::Auto, 0, "label"),
            LabelColumnKind::Classes);
  EXPECT_EQ(sniff_label_column(file("b.jsonl", "{\"text\":\"x\",\"label\":3}\n\n{\"text\":\"y\",\"label\":0.5}\n"),
                               TextFormat::Auto, 0, "label"),
            LabelColumnKind::Numbers);
  EXPECT_EQ(sniff_label_column(file("c.jsonl", "{\"text\":\"x\",\"label\":[0, 2]}\n{\"text\":\"y\",\"label\":[]}\n"),
                               TextFormat::Auto, 0, "label"),
            LabelColumnKind::Lists);
  EXPECT_EQ(sniff_label_column(file("d.csv", "text,label\nx,1.5\ny,2\n"), TextFormat::Auto, 0, "label"),
            LabelColumnKind::Numbers);
  EXPECT_THROW(sniff_label_column(file("e.jsonl", "{\"text\":\"x\",\"label\":[1]}\n{\"text\":\"y\",\"label\":2.5}\n"),
                                  TextFormat::Auto, 0, "label"),
               Error);

  // The scan's errors are the record reader's: one short line naming the file and line, without
  // nlohmann's echo of the input (a 1 MB unterminated string echoed 1 MB), raw bytes or a top-level array.
  auto error_of_sniff = [&](const std::string& name, const std::string& body) {
    try {
      sniff_label_column(file(name, body), TextFormat::Auto, 0, "label");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string huge = error_of_sniff("huge.jsonl", "{\"text\": \"" + std::string(1 << 20, 'x') + "\n");
  EXPECT_LT(huge.size(), 400u) << huge.substr(0, 400);
  EXPECT_NE(huge.find("huge.jsonl:1: not valid JSON: "), std::string::npos) << huge.substr(0, 400);
  EXPECT_NE(error_of_sniff("arr.json", "[{\"text\": \"a\", \"label\": 1}]\n").find("arr.json:1: a JSON array; expected JSON Lines"),
            std::string::npos);
  EXPECT_NE(error_of_sniff("null.jsonl", "{\"text\": \"a\", \"label\": null}\n").find("null.jsonl:1: label field 'label' is null"),
            std::string::npos);
  const std::string latin = error_of_sniff("latin.jsonl", "{\"text\": \"caf\xe9\", \"label\": 1\n");
  EXPECT_EQ(latin.find('\xe9'), std::string::npos) << "raw bytes echoed";
  // A well-formed line with a byte that is not UTF-8 is read, as the record reader reads it.
  EXPECT_EQ(sniff_label_column(file("latin_ok.jsonl", "{\"text\": \"caf\xe9\", \"label\": 2.5}\n"), TextFormat::Auto, 0,
                               "label"),
            LabelColumnKind::Numbers);

  FloatLabelOptions o;
  o.lists = true;
  const FloatLabels names = read_float_labels(
      file("f.jsonl", "{\"text\":\"x\",\"label\":[\"sport\",\"news\"]}\n{\"text\":\"y\",\"label\":[\"arts\"]}\n"),
      TextFormat::Auto, 0, "label", o);
  ASSERT_EQ(names.classes, (std::vector<std::string>{"arts", "news", "sport"}));  // sorted, as LabelSet names
  EXPECT_EQ(names.values, (std::vector<float>{0, 1, 1, 1, 0, 0}));
  o.classes = std::vector<std::string>{"arts", "news"};
  try {
    read_float_labels(dir + "/f.jsonl", TextFormat::Auto, 0, "label", o);
    ADD_FAILURE() << "an unknown class was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.jsonl:1: unknown class \"sport\""), std::string::npos) << e.what();
  }

  // Integer ids as single labels take them: 0..n-1 stay ids, other sets become the classes of
  // their sorted values, named by their text; a head named so maps the same ids again.
  FloatLabelOptions ids;
  ids.lists = true;
  const std::string g = file("g.jsonl", "{\"text\":\"x\",\"label\":[10, 2]}\n{\"text\":\"y\",\"label\":[1]}\n");
  const FloatLabels gapped = read_float_labels(g, TextFormat::Auto, 0, "label", ids);
  ASSERT_EQ(gapped.classes, (std::vector<std::string>{"1", "2", "10"}));
  EXPECT_EQ(gapped.values, (std::vector<float>{0, 1, 1, 1, 0, 0}));
  ids.classes = gapped.classes;
  EXPECT_EQ(read_float_labels(g, TextFormat::Auto, 0, "label", ids).values, gapped.values);
  ids.classes.reset();
  const FloatLabels dense = read_float_labels(
      file("h.jsonl", "{\"text\":\"x\",\"label\":[0, 2]}\n{\"text\":\"y\",\"label\":[1]}\n"), TextFormat::Auto, 0,
      "label", ids);
  EXPECT_TRUE(dense.classes.empty());
  EXPECT_EQ(dense.width, 3);
  EXPECT_EQ(dense.values, (std::vector<float>{1, 0, 1, 0, 1, 0}));
  ids.classes = std::vector<std::string>{"arts", "news", "sport"};  // a head named otherwise: ids are positions
  EXPECT_EQ(read_float_labels(dir + "/h.jsonl", TextFormat::Auto, 0, "label", ids).values, dense.values);
}

TEST(FloatLabelMetrics, MsePearsonAndMicroF1) {
  const std::vector<float> x{1, 2, 3, 4}, y{1, 2, 3, 5};
  EXPECT_NEAR(mean_squared_error(x, y), 0.25, 1e-12);
  EXPECT_NEAR(pearson(x, x), 1.0, 1e-12);
  EXPECT_NEAR(pearson(x, y), 0.9827076298239908, 1e-12);
  EXPECT_TRUE(std::isnan(pearson(x, std::vector<float>{2, 2, 2, 2})));
  // Logits > 0 predict a class: TP 2 (elements 0, 3), FP 1 (element 1), FN 1 (element 2).
  const std::vector<float> logits{2.0f, 0.5f, -1.0f, 3.0f, -0.1f}, hot{1, 0, 1, 1, 0};
  EXPECT_NEAR(micro_f1_at_half(logits, hot), 2.0 * 2 / (2 * 2 + 1 + 1), 1e-12);
}

// Numbers as labels: a regression head (num_labels 1, MSE) that learns, saved with
// problem_type "regression"; eval_mse equals the loss, and `anatomy eval` writes each value.
TEST(TasksCli, RegressionTrainsEvaluatesAndPredicts) {
  const std::string dir = testing_cli::fresh_dir("tasks_regression");
  const std::string train = write_data(dir, "train.jsonl", false, 96), out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --model-name-or-path " + model_dir() + " --ignore-mismatched-sizes --train-file " + train +
      " --validation-file " + train + " --eval-strategy epoch --max-seq-length 32"
      " --per-device-train-batch-size 8 --num-train-epochs 12 --learning-rate 5e-3 --logging-steps 12 --disable-tqdm"
      " --output-dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  EXPECT_EQ(cfg.at("problem_type"), "regression");
  EXPECT_EQ(cfg.at("id2label").size(), 1u);
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  ASSERT_TRUE(ev.contains("eval_mse")) << ev.dump();
  EXPECT_FALSE(ev.contains("eval_accuracy"));
  EXPECT_NEAR(ev.at("eval_mse").get<double>(), ev.at("eval_loss").get<double>(), 1e-6);
  // On its training texts (a tiny model learns them, not the task): below the targets' variance
  // about their mean, what a model that learned only the mean would score.
  double mean = 0, var = 0;
  const auto rows = read_lines(train);
  for (const auto& row : rows) mean += row.at("label").get<double>() / static_cast<double>(rows.size());
  for (const auto& row : rows) var += std::pow(row.at("label").get<double>() - mean, 2) / static_cast<double>(rows.size());
  EXPECT_LT(ev.at("eval_mse").get<double>(), 0.8 * var) << ev.dump() << " variance " << var;
  EXPECT_GT(ev.at("eval_pearson").get<double>(), 0.5) << ev.dump();

  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --eval-file " + train +
                                          " --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("eval_mse"), std::string::npos) << e.output;
  const auto preds = read_lines(dir + "/eval/predictions.jsonl");
  ASSERT_EQ(preds.size(), 96u);
  EXPECT_TRUE(preds[0].at("prediction").is_number_float()) << preds[0].dump();
  EXPECT_TRUE(preds[0].at("label").is_number()) << preds[0].dump();
  // Labels as the shortest decimals of their float32 values (2.4166667, not 2.4166667461395264).
  for (size_t i = 0; i < 3; ++i) {
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, static_cast<float>(rows[i].at("label").get<double>())).ptr;
    EXPECT_EQ(preds[i].at("label").dump(), std::string(buf, end)) << preds[i].dump();
  }
}

// ModernBERT's regression and multi-label heads through the whole run: evaluated during and
// after training, predicted, and evaluated again by `anatomy eval` to the same figures (its
// evaluation passed class ids to a head that takes floats, and every one of these failed).
TEST(TasksCli, ModernBertFloatLabelsEvaluateAndPredict) {
  for (const bool lists : {false, true}) {
    const std::string dir = testing_cli::fresh_dir(lists ? "tasks_modernbert_multilabel" : "tasks_modernbert_regression");
    tiny_modernbert(dir + "/start", lists ? "modernbert-multilabel" : "modernbert-regression");
    const std::string train = write_data(dir, "train.jsonl", lists, 48), out = dir + "/run";
    const auto r = testing_cli::run_anatomy(
        "train --device cpu --model-name-or-path " + dir + "/start --ignore-mismatched-sizes --train-file " + train +
        " --validation-file " + train + " --eval-strategy epoch --max-seq-length 32 --per-device-train-batch-size 8"
        " --num-train-epochs 2 --learning-rate 1e-3 --disable-tqdm --do-predict --test-file " + train + " --output-dir " + out);
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string metric = lists ? "eval_micro_f1" : "eval_mse";
    const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
    ASSERT_TRUE(ev.contains(metric)) << ev.dump();
    const std::string predicted = read_regular_file(out + "/predict_results.txt");
    EXPECT_EQ(std::count(predicted.begin(), predicted.end(), '\n'), 49) << predicted;  // the header, a line per sample
    const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --eval-file " + train +
                                            " --max-seq-length 32 --output-dir " + dir + "/eval");
    ASSERT_EQ(e.status, 0) << e.output;
    const nlohmann::json again = nlohmann::json::parse(read_regular_file(dir + "/eval/eval_results.json"));
    EXPECT_NEAR(again.at("eval_loss").get<double>(), ev.at("eval_loss").get<double>(), 1e-6);
    EXPECT_NEAR(again.at(metric).get<double>(), ev.at(metric).get<double>(), 1e-6);
  }
}

// Lists of class ids as labels: a multi-label head (BCE with logits) on the model's three
// classes, saved with problem_type "multi_label_classification"; micro-F1 at threshold 0.5.
TEST(TasksCli, MultiLabelTrainsEvaluatesAndPredicts) {
  const std::string dir = testing_cli::fresh_dir("tasks_multilabel");
  const std::string train = write_data(dir, "train.jsonl", true, 96), out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --model-name-or-path " + model_dir() + " --train-file " + train +
      " --validation-file " + train + " --eval-strategy epoch --max-seq-length 32"
      " --per-device-train-batch-size 8 --num-train-epochs 12 --learning-rate 5e-3 --logging-steps 12 --disable-tqdm"
      " --output-dir " + out +
      " --do-predict --test-file " + train);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  EXPECT_EQ(cfg.at("problem_type"), "multi_label_classification");
  EXPECT_EQ(cfg.at("id2label").size(), 3u);
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  ASSERT_TRUE(ev.contains("eval_micro_f1")) << ev.dump();
  EXPECT_GT(ev.at("eval_micro_f1").get<double>(), 0.5) << ev.dump();
  EXPECT_EQ(ev.at("eval_f1"), ev.at("eval_micro_f1"));  // run_classification.py's name for it
  EXPECT_LT(ev.at("eval_loss").get<double>(), std::log(2.0)) << ev.dump();  // below a coin flip per class
  const std::string predicted = read_regular_file(out + "/predict_results.txt");
  EXPECT_EQ(predicted.rfind("index\tprediction\n", 0), 0u) << predicted.substr(0, 100);
  // Each line's classes as run_classification.py writes them, a Python list: 0\t['negative', 'neutral']
  const std::regex line(R"(\d+\t\[('\w+'(, '\w+')*)?\])");
  std::istringstream lines(predicted.substr(17));
  int with_classes = 0, n = 0;
  for (std::string l; std::getline(lines, l); ++n) {
    EXPECT_TRUE(std::regex_match(l, line)) << l;
    with_classes += l.find('\'') != std::string::npos;
  }
  EXPECT_EQ(n, 96);
  EXPECT_GT(with_classes, 48);

  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --eval-file " + train +
                                          " --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("eval_micro_f1"), std::string::npos) << e.output;
  const auto preds = read_lines(dir + "/eval/predictions.jsonl");
  ASSERT_EQ(preds.size(), 96u);
  EXPECT_TRUE(preds[0].at("prediction").is_array()) << preds[0].dump();
  EXPECT_EQ(preds[0].at("probabilities").size(), 3u);
  EXPECT_TRUE(preds[0].at("label").is_array());
}

// A label of the wrong kind for the model's problem_type is refused, naming the file.
TEST(TasksCli, LabelsThatContradictProblemTypeAreRefused) {
  const std::string dir = testing_cli::fresh_dir("tasks_refused");
  const std::string train = write_data(dir, "train.jsonl", false, 16), model = dir + "/model";
  std::filesystem::create_directories(model);
  for (const char* f : {"model.safetensors", "tokenizer.json"})
    std::filesystem::copy_file(model_dir() + "/" + f, model + "/" + f);
  nlohmann::json cfg = nlohmann::json::parse(read_regular_file(model_dir() + "/config.json"));
  cfg["problem_type"] = "multi_label_classification";
  std::ofstream(model + "/config.json") << cfg.dump(2);
  const auto r = testing_cli::run_anatomy("train --device cpu --model-name-or-path " + model + " --train-file " + train +
                                          " --max-steps 1 --output-dir " + dir + "/run");
  testing_cli::expect_clean_error(r, "train.jsonl: its labels are numbers but the model's config.json has problem_type "
                                     "multi_label_classification; --ignore-mismatched-sizes trains a new head");
  // ... and with the flag, the data decides, as run_classification.py sets problem_type from it.
  const auto again = testing_cli::run_anatomy("train --device cpu --model-name-or-path " + model + " --train-file " +
                                              train + " --max-steps 1 --ignore-mismatched-sizes --output-dir " + dir + "/run");
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(nlohmann::json::parse(read_regular_file(dir + "/run/config.json")).at("problem_type"), "regression");
}

// Two CPU steps of batch 8 x 24 from `data` into dir/run (nothing saved): the TasksPlan runs,
// whose peak memory is compared with plan_memory's categories.
static TrainOptions plan_run_options(const std::string& dir, const std::string& data, const char* placement) {
  TrainOptions o;
  o.model_name_or_path = model_dir();
  o.train_file = data;
  o.device = DeviceChoice::Cpu;
  o.seq_len = 24;
  o.per_device_train_batch_size = 8;
  o.max_steps = 2;
  o.logging_steps = 0;
  o.gradient_placement = placement;
  o.output_dir = dir + "/run";
  o.overwrite_output_dir = true;
  o.save_model = false;
  o.disable_progress_bar = true;
  return o;
}

// plan_memory's categories are what training allocates with the regression and multi-label
// heads (their F32 [B, num_labels] labels in Other), padded and on real tokens, for each
// gradient placement.
TEST(TasksPlan, PlanEqualsAllocated) {
  const std::string dir = testing_cli::fresh_dir("tasks_plan");
  for (bool lists : {false, true}) {
    const std::string data = write_data(dir, lists ? "multi.jsonl" : "reg.jsonl", lists, 40);
    for (bool skip_padding : {false, true})
      for (const char* place : {"own", "in-activations"}) {
        TrainOptions o = plan_run_options(dir, data, place);
        o.ignore_mismatched_sizes = !lists;
        o.skip_padding = skip_padding;
        TrainResult r = train(o);
        BertConfig cfg = BertConfig::from_json_file(model_dir() + "/config.json");
        if (!lists) cfg.set_num_labels(1);
        cfg.problem_type = lists ? "multi_label_classification" : "regression";
        ModelShape s{8, 24, DType::F32, CheckpointPolicy::None, true, resolve_gradient_placement(place, 1), skip_padding};
        MemoryPlan plan = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CPU});
        for (int c = 0; c < kNumCategories; ++c)
          EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c)) << " " << place
                                                        << " skip_padding " << skip_padding << " lists " << lists;
        EXPECT_TRUE(std::isfinite(r.last_loss));
      }
  }
}

namespace {

// The training loss of each logging line ({'loss': x, ...}) a run printed, in order.
std::vector<double> logged_losses(const std::string& output) {
  std::vector<double> out;
  for (size_t at = output.find("{'loss': "); at != std::string::npos; at = output.find("{'loss': ", at + 1))
    out.push_back(std::stod(output.substr(at + 9, 16)));
  return out;
}

// A --task mlm run (`r`, writing `out`): the logged loss falls below 0.8 of its start (masks are
// drawn afresh each epoch, so the model cannot learn the masked positions by heart: the loss
// levels off near 4.1, the tokens' own entropy in these small models' reach), the saved model is
// `arch`, and evaluation reports perplexity = exp(eval_loss), below the first logged loss.
void expect_masked_lm_run(const testing_cli::CmdResult& r, const std::string& out, const std::string& arch) {
  ASSERT_EQ(r.status, 0) << r.output;
  const std::vector<double> losses = logged_losses(r.output);
  ASSERT_GE(losses.size(), 4u) << r.output;
  EXPECT_LT(losses.back(), 0.8 * losses.front()) << r.output;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  EXPECT_EQ(cfg.at("architectures"), nlohmann::json::array({arch}));
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  ASSERT_TRUE(ev.contains("perplexity")) << ev.dump();
  EXPECT_NEAR(ev.at("perplexity").get<double>(), std::exp(ev.at("eval_loss").get<double>()), 1e-6);
  EXPECT_LT(ev.at("eval_loss").get<double>(), losses.front()) << ev.dump();
}

}  // namespace

// --task mlm on real text (the sentiment file's sentences, as JSON Lines and as a plain .txt
// file of lines): the masked-LM loss falls, the evaluation reports perplexity = exp(eval_loss),
// and the saved model is a RobertaForMaskedLM with the tensors transformers writes for one.
TEST(TasksCli, MaskedLmLossFallsOnRealText) {
  const std::string dir = testing_cli::fresh_dir("tasks_mlm");
  {
    std::ofstream lines(dir + "/text.txt");
    for (const auto& r : sentiment_rows(200)) lines << r.at("text").get<std::string>() << "\n\n";
  }
  for (const std::string& data : {std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl", dir + "/text.txt"}) {
    const std::string out = dir + (data.ends_with(".txt") ? "/run_txt" : "/run_jsonl");
    const auto r = testing_cli::run_anatomy(
        "train --device cpu --task mlm --model-name-or-path " + model_dir() + " --train-file " + data +
        " --validation-split 0.1 --max-seq-length 32 --per-device-train-batch-size 16 --num-train-epochs 8"
        " --learning-rate 3e-3 --logging-steps 11 --disable-tqdm --line-by-line --output-dir " + out);
    // From about log(400) = 6.0 (a random head over the 400 tokens) well down.
    expect_masked_lm_run(r, out, "RobertaForMaskedLM");
  }
  // `anatomy eval` of the saved model: perplexity on masked texts, a line per text.
  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + dir + "/run_jsonl --eval-file " +
                                          std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl" +
                                          " --max-seq-length 32 --line-by-line --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("perplexity: "), std::string::npos) << e.output;
  EXPECT_EQ(read_lines(dir + "/eval/predictions.jsonl").size(), 197u);
  // A .txt file is read by lines in evaluation as in training (not as a CSV with a header).
  const auto t = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + dir + "/run_txt --eval-file " + dir +
                                          "/text.txt --max-seq-length 32 --line-by-line --output-dir " + dir + "/eval_txt");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("perplexity: "), std::string::npos) << t.output;
  EXPECT_EQ(read_lines(dir + "/eval_txt/predictions.jsonl").size(), 197u);  // the same texts as the JSON Lines file's
  // Batches padded to their longest text, not to --max-seq-length, and skipping padding says so.
  const auto w = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + dir + "/run_jsonl --eval-file " +
                                          std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl" +
                                          " --max-seq-length 64 --line-by-line --output-dir " + dir + "/eval64");
  ASSERT_EQ(w.status, 0) << w.output;
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(dir + "/eval64/eval_results.json"));
  EXPECT_EQ(ev.at("eval_skip_padding"), true) << ev.dump();
  EXPECT_LT(ev.at("eval_padded_tokens").get<int64_t>(), 197 * 64 * 3 / 4) << ev.dump();  // the texts are mostly short
}

// Note [task metrics]: a masked LM reports run_mlm.py's accuracy (of the masked tokens) with its
// loss; --metric-for-best-model accuracy picks by it (every evaluation logged with its epoch) and a
// metric the task does not compute is refused before the first step (it picked the first
// checkpoint, comparing NaNs). `anatomy eval` with the run's --seed and --mlm-probability masks
// the file as the run masked its --validation-file: the same loss and accuracy.
TEST(TasksCli, MaskedLmReportsAccuracyAndEvalRepeatsTheRunsMasks) {
  const std::string dir = testing_cli::fresh_dir("tasks_mlm_accuracy");
  {
    std::ofstream train(dir + "/train.txt"), dev(dir + "/dev.txt");
    size_t i = 0;
    for (const auto& r : sentiment_rows(200)) (i++ % 5 == 0 ? dev : train) << r.at("text").get<std::string>() << "\n";
  }
  const std::string common = "train --device cpu --task mlm --model-name-or-path " + model_dir() + " --train-file " + dir +
                             "/train.txt --validation-file " + dir + "/dev.txt --max-seq-length 32 --seed 7"
                             " --mlm-probability 0.3 --per-device-train-batch-size 16 --learning-rate 3e-3 --disable-tqdm";
  const auto bad = testing_cli::run_anatomy(common + " --metric-for-best-model f1 --output-dir " + dir + "/bad");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--metric-for-best-model f1 is not computed for a masked-LM model; it computes loss, accuracy"),
            std::string::npos) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad/checkpoint-10"));

  const std::string out = dir + "/run";
  const auto r = testing_cli::run_anatomy(common + " --num-train-epochs 4 --eval-strategy epoch --save-strategy epoch"
                                          " --metric-for-best-model accuracy --load-best-model-at-end --output-dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  const nlohmann::json st = nlohmann::json::parse(read_regular_file(out + "/trainer_state.json"));
  const double accuracy = ev.at("eval_accuracy").get<double>();
  double scored = 0;  // of the end's evaluation, the last in the log
  for (const auto& e : st.at("log_history")) scored = e.value("eval_scored_tokens", scored);
  EXPECT_GT(accuracy, 0.0) << ev.dump();
  EXPECT_NEAR(accuracy * scored, std::round(accuracy * scored), 1e-6) << "a count of masked tokens predicted right";
  double best = -1;
  std::string best_step, last_epoch_step;
  int evaluations = 0;
  for (const auto& e : st.at("log_history")) {
    if (!e.contains("eval_accuracy")) continue;
    EXPECT_TRUE(e.contains("epoch")) << e.dump();
    if (++evaluations > 4) continue;
    last_epoch_step = std::to_string(e.at("step").get<int64_t>());
    if (e.at("eval_accuracy").get<double>() > best) {
      best = e.at("eval_accuracy").get<double>();
      best_step = last_epoch_step;
    }
  }
  // Each epoch's, then the best model's at the end when it is not the last epoch's.
  EXPECT_EQ(evaluations, 4 + (best_step != last_epoch_step));
  EXPECT_EQ(st.at("best_metric").get<double>(), best);
  EXPECT_EQ(st.at("best_model_checkpoint").get<std::string>(), out + "/checkpoint-" + best_step);
  EXPECT_EQ(ev.at("eval_accuracy").get<double>(), best);  // the end's evaluation is the best model's

  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --eval-file " + dir +
                                          "/dev.txt --max-seq-length 32 --seed 7 --mlm-probability 0.3 --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  const nlohmann::json again = nlohmann::json::parse(read_regular_file(dir + "/eval/eval_results.json"));
  EXPECT_NEAR(again.at("eval_loss").get<double>(), ev.at("eval_loss").get<double>(), 1e-6);
  EXPECT_EQ(again.at("eval_accuracy"), ev.at("eval_accuracy"));
  EXPECT_EQ(again.at("eval_scored_tokens").get<double>(), scored);
}

// The same for ModernBERT (ModernBertForMaskedLM: Note [modernbert token head] in
// model/modernbert.cpp): the loss falls, perplexity is reported, and the saved model has the
// tensors transformers wrote for that class (the decoder tied to tok_embeddings, its bias).
TEST(TasksCli, ModernBertMaskedLmLossFallsOnRealText) {
  const std::string dir = testing_cli::fresh_dir("tasks_mlm_modernbert");
  const std::string start = tiny_modernbert(dir + "/start", "modernbert-mlm"), out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --task mlm --model-name-or-path " + start + " --train-file " + std::string(ANATOMY_SOURCE_DIR) +
      "/tests/data/text/sentiment.jsonl --validation-split 0.1 --max-seq-length 32 --per-device-train-batch-size 16"
      " --num-train-epochs 8 --learning-rate 3e-3 --logging-steps 11 --disable-tqdm --output-dir " + out);
  expect_masked_lm_run(r, out, "ModernBertForMaskedLM");
  EXPECT_EQ(tensor_names(out + "/model.safetensors"),
            tensor_names(std::string(ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/modernbert-mlm/model.safetensors"));
  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + out + " --eval-file " +
                                          std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl" +
                                          " --max-seq-length 32 --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("perplexity: "), std::string::npos) << e.output;
}

// DistilBERT's masked LM (DistilBertForMaskedLM: vocab_transform, GELU, vocab_layer_norm, the
// vocab_projector tied to the word embeddings with its bias) from a sequence-classification
// checkpoint: the loss falls, perplexity is reported, and the saved head has transformers' names.
TEST(TasksCli, DistilBertMaskedLmLossFallsOnRealText) {
  const std::string dir = testing_cli::fresh_dir("tasks_mlm_distilbert"), out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --task mlm --model-name-or-path " + std::string(ANATOMY_SOURCE_DIR) +
      "/tests/fixtures/models/distilbert --train-file " + std::string(ANATOMY_SOURCE_DIR) +
      "/tests/data/text/sentiment.jsonl --validation-split 0.1 --max-seq-length 32 --per-device-train-batch-size 16"
      " --num-train-epochs 20 --learning-rate 3e-3 --logging-steps 11 --disable-tqdm --line-by-line --output-dir " + out);
  expect_masked_lm_run(r, out, "DistilBertForMaskedLM");  // dim 32, 2 layers: slower than RoBERTa's 8 epochs
  // The fixture's classifier tensors are named as unused by the class being built.
  EXPECT_NE(r.output.find("are not used by DistilBertForMaskedLM (e.g. classifier."), std::string::npos) << r.output;
  const std::set<std::string> names = tensor_names(out + "/model.safetensors");
  for (const char* n : {"vocab_transform.weight", "vocab_transform.bias", "vocab_layer_norm.weight",
                        "vocab_layer_norm.bias", "vocab_projector.bias"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("vocab_projector.weight"));  // tied: not written, as transformers writes it
}

// ELECTRA has no masked-LM head here (its masked LM is the generator, a model of its own):
// refused by name before anything runs.
TEST(TasksCli, MaskedLmRefusesOtherVariants) {
  const std::string dir = testing_cli::fresh_dir("tasks_mlm_refused");
  const auto r = testing_cli::run_anatomy("train --device cpu --task mlm --model-name-or-path " +
                                          std::string(ANATOMY_SOURCE_DIR) + "/tests/fixtures/models/electra" +
                                          " --train-file " + std::string(ANATOMY_SOURCE_DIR) +
                                          "/tests/data/text/sentiment.jsonl --max-steps 1 --output-dir " + dir + "/run");
  testing_cli::expect_clean_error(r, "electra");
}

// plan_memory's categories are what --task mlm allocates: the head's [B*T, vocab] logits and
// their gradient, h and its statistics, the token labels I32 [B, T] in Other; both placements.
TEST(TasksPlan, MaskedLmPlanEqualsAllocated) {
  const std::string dir = testing_cli::fresh_dir("tasks_plan_mlm");
  for (const char* policy : {"none", "selective", "layer"})
    for (const char* place : {"own", "in-activations"}) {
      const std::string text = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
      TrainOptions o = plan_run_options(dir, text, place);
      o.task = "mlm";
      o.dataset_cache_dir = dir;
      o.gradient_checkpointing = parse_checkpoint_policy(policy);
      TrainResult r = train(o);
      BertConfig cfg = BertConfig::from_json_file(model_dir() + "/config.json");
      cfg.architectures = {masked_lm_class(cfg)};
      // Training on real tokens (the default --skip-padding) with every policy but layer.
      const bool packed = o.gradient_checkpointing != CheckpointPolicy::Layer;
      ModelShape s{8, 24, DType::F32, o.gradient_checkpointing, true, resolve_gradient_placement(place, 1), packed};
      MemoryPlan plan = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CPU});
      for (int c = 0; c < kNumCategories; ++c)
        EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c)) << " " << policy << " "
                                                      << place;
      EXPECT_TRUE(std::isfinite(r.last_loss));
    }
}

namespace {

// A small tagged corpus (BIO tags, strings): people, places and organizations in a few sentence
// shapes, some names of two words (B-PER I-PER). `offset` varies the combinations.
// `anatomy eval` of a trained token-classification model on `dev` (30 tagged sentences): it
// reports eval_f1 and writes one prediction per sentence with a tag per word; returns them.
std::vector<nlohmann::json> expect_tagging_eval(const std::string& model, const std::string& dev, const std::string& out) {
  const auto e = testing_cli::run_anatomy("eval --device cpu --model-name-or-path " + model + " --eval-file " + dev +
                                          " --max-seq-length 32 --output-dir " + out);
  EXPECT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("eval_f1: "), std::string::npos) << e.output;
  const auto preds = read_lines(out + "/predictions.jsonl");
  const auto dev_rows = read_lines(dev);
  EXPECT_EQ(preds.size(), 30u);
  for (size_t i = 0; i < preds.size() && i < dev_rows.size(); ++i)
    EXPECT_EQ(preds[i].at("prediction").size(), dev_rows[i].at("tokens").size()) << i;
  return preds;
}

std::string write_tagged(const std::string& path, int n, int offset) {
  const std::vector<std::vector<std::string>> people{{"John"}, {"Mary", "Smith"}, {"Alice"}, {"Bob"}, {"Paul", "Jones"}, {"Anna"}};
  const std::vector<std::string> places{"Paris", "London", "Berlin", "Rome", "Madrid", "Oslo", "Vienna"};
  const std::vector<std::string> orgs{"Google", "Siemens", "Nokia"};
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const int k = i + offset;
    const auto& who = people[static_cast<size_t>(k) % people.size()];
    const std::string& where = places[static_cast<size_t>(k * 3 + 1) % places.size()];
    const std::string& org = orgs[static_cast<size_t>(k / 2) % orgs.size()];
    std::vector<std::string> words, tags;
    auto person = [&] {
      for (size_t w = 0; w < who.size(); ++w) {
        words.push_back(who[w]);
        tags.push_back(w ? "I-PER" : "B-PER");
      }
    };
    auto plain = [&](std::initializer_list<const char*> ws) {
      for (const char* w : ws) {
        words.push_back(w);
        tags.push_back("O");
      }
    };
    switch (k % 3) {
      case 0: person(); plain({"lives", "in"}); words.push_back(where); tags.push_back("B-LOC"); break;
      case 1: plain({"Yesterday"}); person(); plain({"visited"}); words.push_back(where); tags.push_back("B-LOC"); plain({"again"}); break;
      default: person(); plain({"works", "at"}); words.push_back(org); tags.push_back("B-ORG"); plain({"in"});
               words.push_back(where); tags.push_back("B-LOC"); break;
    }
    out << nlohmann::json{{"tokens", words}, {"ner_tags", tags}}.dump() << "\n";
  }
  return path;
}

}  // namespace

TEST(EntityScores, ConllChunking) {
  using V = std::vector<std::vector<std::string>>;
  // Gold: PER [0,1], LOC [3]; predicted: PER [0,1] (right), LOC [3] as ORG (wrong), and an I-LOC
  // after O that opens an entity of its own (wrong).
  const V gold{{"B-PER", "I-PER", "O", "B-LOC", "O"}};
  const V pred{{"B-PER", "I-PER", "O", "B-ORG", "I-LOC"}};
  const EntityScores s = entity_scores(pred, gold);
  EXPECT_EQ(s.gold, 2);
  EXPECT_EQ(s.predicted, 3);
  EXPECT_EQ(s.correct, 1);
  EXPECT_NEAR(s.precision, 1.0 / 3, 1e-12);
  EXPECT_NEAR(s.recall, 0.5, 1e-12);
  EXPECT_NEAR(s.f1, 2 * (1.0 / 3) * 0.5 / (1.0 / 3 + 0.5), 1e-12);
  // A span cut short is wrong; an entity that runs to the end counts.
  EXPECT_EQ(entity_scores(V{{"B-PER", "O", "B-LOC"}}, V{{"B-PER", "I-PER", "B-LOC"}}).correct, 1);
}

// Token classification end to end: a small tagged file trains, the validation reports entity
// precision/recall/F1, --do-predict writes each test sentence's tags (predictions.txt) and, the
// test file being tagged, the predict_ metrics as run_ner.py does, and `anatomy eval` writes each
// sentence's word tags.
// Integer tags as run_ner.py numbers them: ids 0..n-1 stay ids; any other set becomes the classes
// of its sorted values, named by their text; a trained head's ids bound the tags a file may use.
TEST(TokenTags, IntegerTagsAreNumberedAsRunNerNumbersThem) {
  const std::string dir = testing_dirs::fresh_dir("token_tags_integers");
  const auto tok = Tokenizer::from_directory(model_dir());
  std::ofstream(dir + "/gap.jsonl") << R"({"tokens": ["Anna", "lives"], "ner_tags": [7, 3]})" << "\n"
                                    << R"({"tokens": ["Bob"], "ner_tags": [3]})" << "\n";
  std::ofstream(dir + "/dense.jsonl") << R"({"tokens": ["Anna", "lives"], "ner_tags": [1, 0]})" << "\n";
  TokenTagOptions o;
  const TokenTagDataset gap(dir + "/gap.jsonl", tok, o);
  EXPECT_EQ(gap.tag_names(), (std::vector<std::string>{"3", "7"}));
  EXPECT_FALSE(gap.tags_are_ids());
  const TokenTagDataset dense(dir + "/dense.jsonl", tok, o);
  EXPECT_EQ(dense.tag_names(), (std::vector<std::string>{"0", "1"}));
  EXPECT_TRUE(dense.tags_are_ids());
  o.tags = gap.tag_names();  // a validation file through the training tags
  HostBatch b;
  b.resize(1, 8);
  TokenTagDataset(dir + "/gap.jsonl", tok, o).get(1, b, 0);
  EXPECT_EQ(b.token_labels[1], 0) << "Bob's tag 3 is class 0";
  o.tags.reset();
  o.num_ids = 1;  // a head of one default-named class: tag 1 is unknown
  try {
    TokenTagDataset(dir + "/dense.jsonl", tok, o);
    ADD_FAILURE() << "a tag beyond the head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dense.jsonl:1: unknown tag 1"), std::string::npos) << e.what();
  }
}

// Note [untyped tags]: integer tags without names (LABEL_0 ...) train, with a warning that the
// entity scores mean nothing and how to name them.
TEST(TasksCli, IntegerTagsWithoutNamesAreWarnedAbout) {
  const std::string dir = testing_cli::fresh_dir("tasks_ner_ids");
  {
    std::ofstream out(dir + "/ids.jsonl");
    for (int i = 0; i < 16; ++i) out << R"({"tokens": ["Anna", "lives", "in", "Oslo"], "ner_tags": [1, 0, 0, 2]})" << "\n";
  }
  const auto r = testing_cli::run_anatomy("train --device cpu --task token-classification --model-name-or-path " +
                                          model_dir() + " --train-file " + dir + "/ids.jsonl --max-seq-length 16 "
                                          "--max-steps 1 --disable-tqdm --output-dir " + dir + "/run");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("anatomy: warning: --train-file " + dir + "/ids.jsonl: its 3 tags (LABEL_0, ...) are not IOB "
                          "tags"), std::string::npos) << r.output;
  // Named tags of another scheme (parts of speech) are the user's own: no warning.
  {
    std::ofstream out(dir + "/pos.jsonl");
    for (int i = 0; i < 16; ++i) out << R"({"tokens": ["Anna", "lives", "here"], "ner_tags": ["NNP", "VBZ", "RB"]})" << "\n";
  }
  const auto pos = testing_cli::run_anatomy("train --device cpu --task token-classification --model-name-or-path " +
                                            model_dir() + " --train-file " + dir + "/pos.jsonl --max-seq-length 16 "
                                            "--max-steps 1 --disable-tqdm --output-dir " + dir + "/pos");
  ASSERT_EQ(pos.status, 0) << pos.output;
  EXPECT_EQ(pos.output.find("are not IOB tags"), std::string::npos) << pos.output;
}

TEST(TasksCli, TokenClassificationTrainsEvaluatesAndPredicts) {
  const std::string dir = testing_cli::fresh_dir("tasks_ner");
  const std::string train = write_tagged(dir + "/train.jsonl", 150, 0), dev = write_tagged(dir + "/dev.jsonl", 30, 7);
  const std::string test = write_tagged(dir + "/test.jsonl", 20, 40);
  const std::string out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --task token-classification --model-name-or-path " + model_dir() + " --train-file " + train +
      " --validation-file " + dev + " --max-seq-length 32 --per-device-train-batch-size 16 --num-train-epochs 10"
      " --learning-rate 3e-3 --logging-steps 20 --disable-tqdm --do-predict --test-file " + test + " --output-dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("are not IOB tags"), std::string::npos) << r.output;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  EXPECT_EQ(cfg.at("architectures"), nlohmann::json::array({"RobertaForTokenClassification"}));
  EXPECT_EQ(cfg.at("id2label").size(), 5u);  // B-LOC B-ORG B-PER I-PER O
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  ASSERT_TRUE(ev.contains("eval_f1")) << ev.dump();
  EXPECT_GT(ev.at("eval_f1").get<double>(), 0.8) << ev.dump();
  EXPECT_GT(ev.at("eval_accuracy").get<double>(), 0.9) << ev.dump();
  // --do-predict: a line of tags per test sentence, a tag per word; scored against the file's tags.
  const std::string lines = read_regular_file(out + "/predictions.txt");
  const auto test_rows = read_lines(test);
  std::vector<std::vector<std::string>> predicted, gold;
  for (size_t pos = 0; pos < lines.size();) {
    const size_t end = lines.find('\n', pos);
    ASSERT_NE(end, std::string::npos);
    std::vector<std::string> tags;
    for (size_t b = pos; b < end;) {
      const size_t e = std::min(lines.find(' ', b), end);
      tags.push_back(lines.substr(b, e - b));
      b = e + 1;
    }
    predicted.push_back(tags);
    pos = end + 1;
  }
  ASSERT_EQ(predicted.size(), test_rows.size());
  for (const auto& row : test_rows) gold.push_back(row.at("ner_tags").get<std::vector<std::string>>());
  for (size_t i = 0; i < gold.size(); ++i) EXPECT_EQ(predicted[i].size(), gold[i].size()) << i;
  const nlohmann::json pr = nlohmann::json::parse(read_regular_file(out + "/predict_results.json"));
  EXPECT_NEAR(pr.at("predict_f1").get<double>(), entity_scores(predicted, gold).f1, 1e-12) << pr.dump();
  EXPECT_GT(pr.at("predict_f1").get<double>(), 0.8) << pr.dump();
  for (const char* k : {"predict_loss", "predict_precision", "predict_recall", "predict_accuracy"})
    EXPECT_TRUE(pr.contains(k)) << k;

  const auto preds = expect_tagging_eval(out, dev, dir + "/eval");
  const auto dev_rows = read_lines(dev);
  for (size_t i = 0; i < preds.size() && i < dev_rows.size(); ++i)
    EXPECT_EQ(preds[i].at("label"), dev_rows[i].at("ner_tags")) << i;
  EXPECT_EQ(nlohmann::json::parse(read_regular_file(dir + "/eval/eval_results.json")).at("eval_skip_padding"), true);

  // A tag the trained head does not have: the error says where the tags come from and the way on.
  {
    std::ofstream(dir + "/new_tag.jsonl") << R"({"tokens": ["Paris"], "ner_tags": ["B-MISC"]})" << "\n";
  }
  const auto again = testing_cli::run_anatomy("train --device cpu --task token-classification --model-name-or-path " + out +
                                              " --train-file " + dir + "/new_tag.jsonl --max-steps 1 --max-seq-length 32 "
                                              "--disable-tqdm --output-dir " + dir + "/again");
  EXPECT_EQ(again.status, 2) << again.output;
  EXPECT_NE(again.output.find("unknown tag \"B-MISC\""), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("(--ignore-mismatched-sizes trains a new head for the file's tags)"), std::string::npos)
      << again.output;
}

// The same for ModernBERT (Note [modernbert token head] in model/modernbert.cpp): a tiny
// ModernBertForTokenClassification (the golden fixture's sizes: hidden 24, 3 heads, a local
// layer) with the RoBERTa fixture's byte-level BPE, from its config alone; saved with the tensor
// names transformers wrote for that class, and `anatomy eval` tags the words.
TEST(TasksCli, ModernBertTokenClassificationTrainsEvaluatesAndPredicts) {
  const std::string dir = testing_cli::fresh_dir("tasks_ner_modernbert");
  const std::string golden = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/golden_family/modernbert-ner";
  tiny_modernbert(dir + "/start", "modernbert-ner");
  const std::string train = write_tagged(dir + "/train.jsonl", 150, 0), dev = write_tagged(dir + "/dev.jsonl", 30, 7);
  const std::string test = write_tagged(dir + "/test.jsonl", 20, 40);
  const std::string out = dir + "/run";
  const auto r = testing_cli::run_anatomy(
      "train --device cpu --task token-classification --model-name-or-path " + dir + "/start --train-file " + train +
      " --validation-file " + dev + " --max-seq-length 32 --per-device-train-batch-size 16 --num-train-epochs 10"
      " --learning-rate 3e-3 --logging-steps 20 --disable-tqdm --do-predict --test-file " + test + " --output-dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json cfg = nlohmann::json::parse(read_regular_file(out + "/config.json"));
  EXPECT_EQ(cfg.at("architectures"), nlohmann::json::array({"ModernBertForTokenClassification"}));
  EXPECT_EQ(cfg.at("id2label").size(), 5u);
  EXPECT_EQ(tensor_names(out + "/model.safetensors"), tensor_names(golden + "/model.safetensors"));
  const nlohmann::json ev = nlohmann::json::parse(read_regular_file(out + "/eval_results.json"));
  ASSERT_TRUE(ev.contains("eval_f1")) << ev.dump();
  EXPECT_GT(ev.at("eval_f1").get<double>(), 0.8) << ev.dump();
  const nlohmann::json pr = nlohmann::json::parse(read_regular_file(out + "/predict_results.json"));
  EXPECT_GT(pr.at("predict_f1").get<double>(), 0.8) << pr.dump();
  const auto test_rows = read_lines(test);
  std::ifstream lines(out + "/predictions.txt");
  size_t n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    ASSERT_LT(n, test_rows.size());
    EXPECT_EQ(static_cast<size_t>(std::count(line.begin(), line.end(), ' ')) + 1,
              test_rows[n].at("ner_tags").size()) << n;
  }
  EXPECT_EQ(n, test_rows.size());

  expect_tagging_eval(out, dev, dir + "/eval");
}

// --do-predict on a test file without tags: predictions.txt, and no predict metrics; a file that
// tags some lines only is refused naming the line.
TEST(TasksCli, TokenClassificationPredictsAnUntaggedTestFile) {
  const std::string dir = testing_cli::fresh_dir("tasks_ner_untagged");
  const std::string train = write_tagged(dir + "/train.jsonl", 24, 0);
  {
    std::ofstream t(dir + "/test.jsonl");
    t << R"({"tokens": ["Anna", "lives", "in", "Oslo"]})" << "\n" << R"({"tokens": ["Bob", "works"]})" << "\n";
    std::ofstream m(dir + "/mixed.jsonl");
    m << R"({"tokens": ["Anna"], "ner_tags": ["B-PER"]})" << "\n" << R"({"tokens": ["Bob"]})" << "\n";
  }
  const std::string args = "train --device cpu --task token-classification --model-name-or-path " + model_dir() +
                           " --train-file " + train + " --max-seq-length 32 --max-steps 1 --disable-tqdm --do-predict";
  const auto r = testing_cli::run_anatomy(args + " --test-file " + dir + "/test.jsonl --output-dir " + dir + "/run");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/predict_results.json"));
  const std::string lines = read_regular_file(dir + "/run/predictions.txt");
  ASSERT_EQ(std::count(lines.begin(), lines.end(), '\n'), 2) << lines;
  const std::string first = lines.substr(0, lines.find('\n'));
  EXPECT_EQ(std::count(first.begin(), first.end(), ' '), 3) << lines;  // four words, four tags
  const auto m = testing_cli::run_anatomy(args + " --test-file " + dir + "/mixed.jsonl --output-dir " + dir + "/run2");
  testing_cli::expect_clean_error(m, "mixed.jsonl:2");
  // `anatomy eval` of the untagged file: refused naming the two ways on, then predicted with
  // --label-column "" (a line of tags per sentence).
  const std::string eval = "eval --device cpu --model-name-or-path " + dir + "/run --eval-file " + dir + "/test.jsonl";
  testing_cli::expect_clean_error(testing_cli::run_anatomy(eval), "--label-column \"\" predicts without labels");
  const auto e = testing_cli::run_anatomy(eval + " --label-column '' --output-dir " + dir + "/eval");
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("predictions only"), std::string::npos) << e.output;
  EXPECT_EQ(read_lines(dir + "/eval/predictions.jsonl").size(), 2u);
}

// plan_memory's categories are what --task token-classification allocates (logits [B*T, tags],
// the token labels I32 [B, T] in Other), for each gradient placement, on real tokens or padded.
TEST(TasksPlan, TokenClassificationPlanEqualsAllocated) {
  const std::string dir = testing_cli::fresh_dir("tasks_plan_ner");
  const std::string data = write_tagged(dir + "/train.jsonl", 40, 0);
  for (bool skip_padding : {true, false})
    for (const char* place : {"own", "in-activations"}) {
      TrainOptions o = plan_run_options(dir, data, place);
      o.skip_padding = skip_padding;
      o.task = "token-classification";
      TrainResult r = train(o);
      BertConfig cfg = BertConfig::from_json_file(model_dir() + "/config.json");
      cfg.architectures = {token_classification_class(cfg)};
      cfg.set_num_labels(5);
      ModelShape s{8, 24, DType::F32, CheckpointPolicy::None, true, resolve_gradient_placement(place, 1), skip_padding};
      MemoryPlan plan = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CPU});
      for (int c = 0; c < kNumCategories; ++c)
        EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c])
            << category_name(static_cast<Category>(c)) << " " << place << (skip_padding ? " real tokens" : " padded");
      EXPECT_TRUE(std::isfinite(r.last_loss));
    }
}

// The trainer's allocation is plan_memory's, category by category, for ModernBERT's per-token
// heads (the head's [B*T, H] tensors, [B*T, labels or vocab] logits and their gradient, the
// token labels), with no, layer and selective checkpointing.
TEST(TasksPlan, ModernBertPerTokenPlanEqualsAllocated) {
  const std::string dir = testing_cli::fresh_dir("tasks_plan_modernbert");
  const std::string tagged = write_tagged(dir + "/tagged.jsonl", 24, 0);
  for (const char* task : {"mlm", "token-classification"})
    for (const char* policy : {"none", "layer", "selective"}) {
      const bool mlm = std::string(task) == "mlm";
      TrainOptions o =
          plan_run_options(dir, mlm ? std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl" : tagged, "auto");
      o.task = task;
      o.model_name_or_path = tiny_modernbert(dir + "/start_" + task + policy, mlm ? "modernbert-mlm" : "modernbert-ner");
      o.dataset_cache_dir = dir;
      o.gradient_checkpointing = parse_checkpoint_policy(policy);
      const TrainResult r = train(o);
      const MemoryPlan plan = plan_memory(plan_input(o, model_config(o), 8, Device::CPU, 1));
      for (int c = 0; c < kNumCategories; ++c)
        EXPECT_EQ(r.peak_bytes.v[c], plan.bytes.v[c]) << category_name(static_cast<Category>(c)) << " " << task << " "
                                                      << policy;
      EXPECT_TRUE(std::isfinite(r.last_loss));
    }
}
