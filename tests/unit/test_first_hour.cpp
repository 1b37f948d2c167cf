// A Hugging Face Trainer user's first hour (issue 19): what a run says, what it refuses and what
// it leaves in the output directory. One row per behaviour: how its inputs are built, the
// command, the exit status, words the output must hold (and must not), and checks on the files
// once the run is over. Rows run `anatomy` on the CPU with bert-tiny through `timeout`.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../common/cli.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using anatomy::testing_cli::CmdResult;
using nlohmann::json;

namespace {

const std::string kTok = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer";
const std::string kText = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
const std::string kCpu = "train --device cpu --threads 2 --disable-tqdm --seq-len 32 ";
const std::string kTiny = kCpu + "--preset bert-tiny ";
const std::string kTextRun = kTiny + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --output-dir {dir}/out ";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }
json read_json(const std::string& path) { return json::parse(slurp(path)); }

// A shell command's exit status and output (stdout and stderr, neither a terminal).
CmdResult shell(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}
CmdResult run(const std::string& args) { return shell("timeout 300 " + std::string(ANATOMY_BINARY) + " " + args); }

std::string expand(std::string s, const std::string& dir) {
  for (size_t at; (at = s.find("{dir}")) != std::string::npos;) s.replace(at, 5, dir);
  return s;
}

// ---- builders ---------------------------------------------------------------------------------

void copy_text(const std::string& d) { fs::copy_file(kText, d + "/s.jsonl"); }

// The first `n` lines of the fixture with its labels rewritten by `relabel`.
void relabelled(const std::string& d, const std::string& name, size_t n, const std::function<json(const std::string&)>& relabel) {
  std::ifstream in(kText);
  std::string line, out;
  for (size_t i = 0; i < n && std::getline(in, line); ++i) {
    json j = json::parse(line);
    j["label"] = relabel(j["label"].get<std::string>());
    out += j.dump() + "\n";
  }
  spit(d + "/" + name, out);
}

// A small trained model with the fixture's three named classes, made once per test process (in
// a directory of its own: ctest runs the table's cases as concurrent processes).
const std::string& trained_model() {
  static const std::string dir = [] {
    // Named after the test that first needs it: one directory per process, reused by the next run.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string d = anatomy::testing_cli::fresh_dir("anatomy_first_hour_model_" + name);
    copy_text(d);
    const CmdResult r = run(expand(kTextRun + "--max-steps 1", d));
    EXPECT_EQ(r.status, 0) << r.output;
    return d + "/out";
  }();
  return dir;
}

// {dir}/m: the trained model; with `ids`, its config made to name no classes (LABEL_0..2).
std::function<void(const std::string&)> model_dir(bool ids) {
  return [ids](const std::string& d) {
    fs::copy(trained_model(), d + "/m", fs::copy_options::recursive);
    if (!ids) return;
    json c = read_json(d + "/m/config.json");
    c.erase("id2label");
    c.erase("label2id");
    c["num_labels"] = 3;
    spit(d + "/m/config.json", c.dump(2));
  };
}

// Both: a model and a data file.
std::function<void(const std::string&)> both(std::function<void(const std::string&)> a,
                                             std::function<void(const std::string&)> b) {
  return [a, b](const std::string& d) {
    a(d);
    b(d);
  };
}

const auto kTwoIds = [](const std::string& d) {
  relabelled(d, "ids.jsonl", 24, [](const std::string& l) { return json(l == "positive" ? 1 : 0); });
};
const auto kTwoNames = [](const std::string& d) {
  relabelled(d, "ab.jsonl", 24, [](const std::string& l) { return json(l == "positive" ? "good" : "bad"); });
};

// {dir}/s.csv: the fixture's first 24 lines as run_glue.py's CSV (sentence,label), quoted.
const auto kGlueCsv = [](const std::string& d) {
  std::ifstream in(kText);
  std::string line, out = "sentence,label\n";
  for (int i = 0; i < 24 && std::getline(in, line); ++i) {
    const json j = json::parse(line);
    std::string q = "\"";
    for (char c : j["text"].get<std::string>()) {
      if (c == '"') q += '"';  // a quote doubled inside a quoted field
      q += c;
    }
    out += q + "\"," + j["label"].get<std::string>() + "\n";
  }
  spit(d + "/s.csv", out);
};

// {dir}/w.jsonl: tagged words under other names than run_ner.py's "tokens" / "ner_tags", in this
// order: {"words": [...], "labels": [...]}.
const auto kNerOtherNames = [](const std::string& d) {
  std::string out;
  const char* names[] = {"Anna", "Bob", "Carl", "Dora"};
  for (int i = 0; i < 24; ++i)
    out += nlohmann::ordered_json{{"words", {names[i % 4], "lives", "in", "Paris"}}, {"labels", {"B-PER", "O", "O", "B-LOC"}}}
               .dump() +
           "\n";
  spit(d + "/w.jsonl", out);
};

// {dir}/m.csv: texts for masked-language modelling under run_mlm.py's first column, "sentence".
const auto kMlmCsv = [](const std::string& d) {
  std::string out = "sentence,source\n";
  for (int i = 0; i < 24; ++i) out += "the film was good and the plot was fine " + std::to_string(i) + ",web\n";
  spit(d + "/m.csv", out);
};

// {dir}/p.csv: run_glue.py's MRPC layout (idx,sentence1,sentence2,label), integer labels.
const auto kGluePairCsv = [](const std::string& d) {
  std::string out = "idx,sentence1,sentence2,label\n";
  const char* words[] = {"good", "bad", "great", "awful", "fine", "poor"};
  for (int i = 0; i < 24; ++i)
    out += std::to_string(i) + "," + words[i % 6] + " day," + words[(i * 5) % 6] + " night," + std::to_string(i % 2) + "\n";
  spit(d + "/p.csv", out);
};

// {dir}/r.csv: star ratings 1..5 as integer labels (review-rating data), three columns.
const auto kStarRatings = [](const std::string& d) {
  std::string out = "review,stars,source\n";
  const char* words[] = {"awful", "poor", "fine", "good", "great"};
  for (int i = 0; i < 25; ++i) out += std::string(words[i % 5]) + " food," + std::to_string(i % 5 + 1) + ",web\n";
  spit(d + "/r.csv", out);
};

// ---- checks on the output -----------------------------------------------------------------------

std::function<void(const std::string&)> files_exist(std::vector<std::string> names) {
  return [names](const std::string& d) {
    for (const std::string& n : names) EXPECT_TRUE(fs::exists(d + "/" + n)) << n;
  };
}
std::function<void(const std::string&)> files_present(std::vector<std::string> names) {
  return [names](const std::string& d) {
    for (const std::string& n : names) EXPECT_TRUE(fs::exists(d + "/" + n)) << n;
  };
}

std::function<void(const std::string&)> files_absent(std::vector<std::string> names) {
  return [names](const std::string& d) {
    for (const std::string& n : names) EXPECT_FALSE(fs::exists(d + "/" + n)) << n;
  };
}

// Every metrics.jsonl line of a training step carries Trainer's keys; the steps logged are `steps`.
std::function<void(const std::string&)> logged_steps(std::vector<int64_t> steps) {
  return [steps](const std::string& d) {
    std::ifstream in(d + "/out/metrics.jsonl");
    std::vector<int64_t> seen;
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (!j.contains("loss")) continue;
      for (const char* k : {"loss", "grad_norm", "learning_rate", "epoch", "step"}) EXPECT_TRUE(j.contains(k)) << k << " " << line;
      seen.push_back(j["step"].get<int64_t>());
    }
    EXPECT_EQ(seen, steps);
  };
}

// A directory that transformers loads as it is: config.json with the data's label names, the
// weights, and the input's tokenizer files, byte for byte.
void loadable(const std::string& dir) {
  SCOPED_TRACE(dir);
  const json c = read_json(dir + "/config.json");
  EXPECT_EQ(c["id2label"], (json{{"0", "negative"}, {"1", "neutral"}, {"2", "positive"}}));
  EXPECT_EQ(c["label2id"], (json{{"negative", 0}, {"neutral", 1}, {"positive", 2}}));
  EXPECT_EQ(c["architectures"], json::array({"BertForSequenceClassification"}));
  EXPECT_EQ(c["problem_type"], "single_label_classification");  // as transformers' forward records it
  const anatomy::SafetensorsReader r = anatomy::SafetensorsReader::open(dir + "/model.safetensors");
  EXPECT_EQ(r.info("classifier.weight").shape, (std::vector<int64_t>{3, 128}));
  for (const char* f : {"tokenizer.json", "vocab.txt"}) EXPECT_EQ(slurp(dir + "/" + f), slurp(kTok + "/" + f)) << f;
}

const std::function<void(const std::string&)> kOutputLoadable = [](const std::string& d) {
  loadable(d + "/out");
  loadable(d + "/out/checkpoint-1");
  loadable(d + "/out/checkpoint-2");
  const json train = read_json(d + "/out/train_results.json"), all = read_json(d + "/out/all_results.json");
  for (const char* k : {"epoch", "train_loss", "train_runtime", "train_samples", "train_samples_per_second",
                        "train_steps_per_second"}) {
    EXPECT_TRUE(train.contains(k)) << k;
    EXPECT_EQ(all[k], train[k]) << k;
  }
  EXPECT_EQ(train["train_samples"], 197);  // the training file's rows, as run_glue.py counts them (not 2 steps of 8)
  const json ev = read_json(d + "/out/eval_results.json");
  for (const char* k : {"epoch", "eval_loss", "eval_accuracy", "eval_runtime", "eval_samples", "eval_samples_per_second",
                        "eval_steps_per_second"}) {
    EXPECT_TRUE(ev.contains(k)) << k;
    EXPECT_EQ(all[k], ev[k]) << k;
  }
  EXPECT_EQ(ev["eval_samples"], 197);
  // The Trainer's speed_metrics rounding: runtimes to 4 decimals, rates to 3.
  const auto decimals = [](const json& v, int n) {
    const double scaled = v.get<double>() * std::pow(10.0, n);
    return std::abs(scaled - std::round(scaled)) < 1e-6 * std::max(1.0, std::abs(scaled));
  };
  for (const json* f : {&train, &ev})
    for (const auto& [k, v] : f->items()) {
      if (!k.starts_with("train_") && !k.starts_with("eval_")) continue;  // steady_samples_per_second: anatomy's own
      if (k.ends_with("_runtime")) EXPECT_TRUE(decimals(v, 4)) << k << " " << v;
      if (k.ends_with("_per_second")) EXPECT_TRUE(decimals(v, 3)) << k << " " << v;
    }
};

const std::function<void(const std::string&)> kPredictResults = [](const std::string& d) {
  std::ifstream in(d + "/out/predict_results.txt");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "index\tprediction");
  int64_t n = 0;
  const std::set<std::string> names = {"negative", "neutral", "positive"};
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    EXPECT_EQ(line.substr(0, tab), std::to_string(n)) << line;
    EXPECT_TRUE(names.count(line.substr(tab + 1))) << line;
    ++n;
  }
  EXPECT_EQ(n, 197);
};

// The best checkpoint by eval_loss is named and kept beyond --save-total-limit 1; `loaded`: the
// run ended with its weights (--load-best-model-at-end), else with the last step's.
void expect_best_checkpoint_kept(const std::string& d, bool loaded) {
  // The evaluations of steps 1..5 (with `loaded` the last line again: the best model's).
  std::ifstream in(d + "/out/metrics.jsonl");
  double best = 1e300;
  int64_t best_step = -1;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("eval_loss") && j["eval_loss"].get<double>() < best) {
      best = j["eval_loss"].get<double>();
      best_step = j["step"].get<int64_t>();
    }
  }
  ASSERT_GT(best_step, 0);
  const json res = read_json(d + "/out/train_results.json");
  EXPECT_EQ(res["best_model_checkpoint"], d + "/out/checkpoint-" + std::to_string(best_step));
  EXPECT_DOUBLE_EQ(res["best_metric"].get<double>(), best);
  const json st = read_json(d + "/out/trainer_state.json");
  EXPECT_EQ(st["best_global_step"], best_step);
  EXPECT_DOUBLE_EQ(st["best_metric"].get<double>(), best);
  const std::string ckpt = res["best_model_checkpoint"].get<std::string>();
  ASSERT_TRUE(fs::exists(ckpt + "/model.safetensors"));
  EXPECT_EQ(slurp(ckpt + "/model.safetensors") == slurp(d + "/out/model.safetensors"), loaded || best_step == 5);
  if (loaded) EXPECT_DOUBLE_EQ(read_json(d + "/out/eval_results.json")["eval_loss"].get<double>(), best);
  int checkpoints = 0;
  for (const auto& e : fs::directory_iterator(d + "/out")) checkpoints += e.path().filename().string().rfind("checkpoint-", 0) == 0;
  EXPECT_EQ(checkpoints, best_step == 5 ? 1 : 2);  // the best, and the newest to resume from
  EXPECT_TRUE(fs::exists(d + "/out/checkpoint-5"));
}
const std::function<void(const std::string&)> kBestModelKept = [](const std::string& d) { expect_best_checkpoint_kept(d, true); };
const std::function<void(const std::string&)> kBestModelTracked = [](const std::string& d) {
  expect_best_checkpoint_kept(d, false);
};

// Note [two state files]: trainer_state.json is the Trainer's TrainerState, field for field as
// transformers 5.24 declares it (TrainerState.load_from_json passes every key to it), in each
// checkpoint and beside the model; its log_history holds the logged lines and evaluations.
const std::function<void(const std::string&)> kTrainerStateAsTheTrainerWritesIt = [](const std::string& d) {
  const std::vector<std::string> fields = {
      "best_global_step", "best_metric", "best_model_checkpoint", "epoch", "eval_steps", "global_step",
      "is_hyper_param_search", "is_local_process_zero", "is_world_process_zero", "log_history", "logging_steps",
      "max_steps", "num_input_tokens_seen", "num_train_epochs", "save_steps", "stateful_callbacks", "total_flos",
      "train_batch_size", "trial_name", "trial_params"};
  auto keys = [](const json& j) {
    std::vector<std::string> k;
    for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
    return k;
  };
  const json top = read_json(d + "/out/trainer_state.json");
  EXPECT_EQ(keys(top), fields);
  EXPECT_EQ(top["global_step"], 4);
  EXPECT_EQ(top["max_steps"], 4);
  int losses = 0, evals = 0;
  for (const json& e : top["log_history"]) {
    losses += e.contains("loss");
    evals += e.contains("eval_loss");
  }
  EXPECT_EQ(losses, 4);
  EXPECT_EQ(evals, 2);
  EXPECT_TRUE(top["log_history"].back().contains("train_loss"));
  EXPECT_EQ(top["log_history"].back()["train_loss"], read_json(d + "/out/train_results.json")["train_loss"]);
  const json ck = read_json(d + "/out/checkpoint-2/trainer_state.json");
  EXPECT_EQ(keys(ck), fields);
  EXPECT_EQ(ck["global_step"], 2);
  EXPECT_EQ(ck["log_history"].size(), 3u);  // steps 1 and 2, the evaluation at 2
  EXPECT_TRUE(fs::exists(d + "/out/checkpoint-2/anatomy_state.json"));
};

// ---- the table ----------------------------------------------------------------------------------

struct Case {
  const char* name;
  std::function<void(const std::string& dir)> build;
  std::string args;                   // after the binary; {dir} is the row's directory
  int status;
  std::vector<std::string> says;      // substrings of the output
  std::vector<std::string> never = {};  // substrings the output must not hold
  std::function<void(const std::string& dir)> after = nullptr;
};

const std::vector<Case> kCases = {
    // Point 3: say what is happening.
    {"PresetAnnouncesRandomWeights", [](const std::string&) {}, kTiny + "--max-steps 1 --output-dir {dir}/out", 0,
     {"--preset bert-tiny is randomly initialized", "pass --model-name-or-path google/bert_uncased_L-2_H-128_A-2"}},
    {"ConfigOnlyDirectoryAnnounced",
     [](const std::string& d) {
       copy_text(d);
       fs::create_directory(d + "/m");
       fs::copy_file(trained_model() + "/config.json", d + "/m/config.json");
     },
     kCpu + "--model-name-or-path {dir}/m --tokenizer " + kTok + " --train-file {dir}/s.jsonl --max-steps 1 --output-dir {dir}/out",
     0, {"{dir}/m has a config.json but no model.safetensors: the model is randomly initialized"}},
    {"PretrainedWeightsNotAnnouncedAsRandom", both(model_dir(false), copy_text),
     kCpu + "--model-name-or-path {dir}/m --train-file {dir}/s.jsonl --max-steps 1 --output-dir {dir}/out", 0,
     {"pretrained weights from {dir}/m"}, {"randomly initialized"}},
    {"BareTrainOnCpuTrainsASmallModel", [](const std::string&) {},
     "train --device cpu --threads 2 --disable-tqdm --max-steps 1 --num-samples 16 --output-dir {dir}/out", 0,
     {"no GPU and no model named: training the CPU-sized preset bert-tiny", "--model-name-or-path NAME"}, {},
     [](const std::string& d) { EXPECT_EQ(read_json(d + "/out/config.json")["hidden_size"], 128); }},
    {"HeadOfOtherSizeRefusedNamingTheWayOn", both(model_dir(true), kTwoIds),
     kCpu + "--model-name-or-path {dir}/m --train-file {dir}/ids.jsonl --max-steps 1 --output-dir {dir}/out", 2,
     {"tensor 'classifier.weight' has shape [3, 128]", "[2, 128]", "--ignore-mismatched-sizes"}, {},
     files_absent({"out"})},
    {"IgnoreMismatchedSizesReplacesTheHead", both(model_dir(true), kTwoIds),
     kCpu + "--model-name-or-path {dir}/m --train-file {dir}/ids.jsonl --max-steps 1 --output-dir {dir}/out "
            "--ignore_mismatched_sizes",
     0,
     {"Some weights of BertForSequenceClassification were not initialized from the model checkpoint at {dir}/m",
      "newly initialized because the shapes did not match",
      "- classifier.weight: found shape [3, 128] in the checkpoint and [2, 128] in the model instantiated"},
     {},
     [](const std::string& d) {
       const anatomy::SafetensorsReader r = anatomy::SafetensorsReader::open(d + "/out/model.safetensors");
       EXPECT_EQ(r.info("classifier.weight").shape, (std::vector<int64_t>{2, 128}));
     }},
    {"NamedHeadAndOtherLabelsRefused", both(model_dir(false), kTwoNames),
     kCpu + "--model-name-or-path {dir}/m --train-file {dir}/ab.jsonl --max-steps 1 --output-dir {dir}/out", 2,
     {"ab.jsonl:1: unknown label 'bad'", "--ignore-mismatched-sizes trains a new head"}},
    {"NamedHeadReplacedForTheDataLabels", both(model_dir(false), kTwoNames),
     kCpu + "--model-name-or-path {dir}/m --train-file {dir}/ab.jsonl --max-steps 1 --output-dir {dir}/out "
            "--ignore-mismatched-sizes",
     0, {"classifier.weight: found shape [3, 128] in the checkpoint and [2, 128]"}, {},
     [](const std::string& d) {
       EXPECT_EQ(read_json(d + "/out/config.json")["id2label"], (json{{"0", "bad"}, {"1", "good"}}));
     }},
    // run_glue.py's --train_file columns (Note [run_glue.py's text columns] in data/csv.h).
    {"RunGlueCsvWithoutATextColumn", kGlueCsv,
     kTiny + "--train_file {dir}/s.csv --validation_file {dir}/s.csv --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     0,
     {"--train-file {dir}/s.csv has no 'text' column: reading 'sentence' as the text, as run_glue.py would"},
     {"--validation-file {dir}/s.csv has no"},  // the training file's columns serve every file, said once
     files_exist({"out/model.safetensors"})},
    {"RunGluePairCsvPredictsIntegerLabels", kGluePairCsv,
     kTiny + "--train_file {dir}/p.csv --validation_file {dir}/p.csv --test_file {dir}/p.csv --do_predict --tokenizer " +
         kTok + " --max-steps 1 --output-dir {dir}/out",
     0, {"--train-file {dir}/p.csv has no 'text' column: reading 'sentence1' and 'sentence2' as a text pair"}, {},
     [](const std::string& d) {  // run_glue.py writes integer labels as the integers
       std::ifstream in(d + "/out/predict_results.txt");
       std::string line;
       ASSERT_TRUE(std::getline(in, line));
       EXPECT_EQ(line, "index\tprediction");
       int n = 0;
       for (; std::getline(in, line); ++n) {
         const std::string pred = line.substr(line.find('\t') + 1);
         EXPECT_TRUE(pred == "0" || pred == "1") << line;
       }
       EXPECT_EQ(n, 24);
     }},
    // Nothing saved but the predictions: the directory is made for them (it was not, and the run
    // ended in an error after training).
    {"PredictWithoutSavingMakesTheOutputDirectory", kGluePairCsv,
     kTiny + "--train_file {dir}/p.csv --test_file {dir}/p.csv --do_predict --save_strategy no --report_to none "
             "--tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/new/out",
     0, {}, {"cannot create"},
     [](const std::string& d) {
       EXPECT_TRUE(fs::exists(d + "/new/out/predict_results.txt"));
       EXPECT_FALSE(fs::exists(d + "/new/out/model.safetensors"));
     }},
    // A killed run's atomic-write temporaries (model.safetensors.tmp-XXXXXX) go with the next run.
    {"LeftoversOfAKilledSaveAreRemoved",
     [](const std::string& d) {
       kGluePairCsv(d);
       fs::create_directories(d + "/out");
       spit(d + "/out/model.safetensors.tmp-Ab12Cd", "half");
       spit(d + "/out/notes.tmp-keep.txt", "mine");
       spit(d + "/out/notes.tmp-backup", "mine too");  // a temporary's length, but not a name anatomy writes
     },
     kTiny + "--train_file {dir}/p.csv --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out",
     0, {}, {},
     [](const std::string& d) {
       EXPECT_FALSE(fs::exists(d + "/out/model.safetensors.tmp-Ab12Cd"));
       EXPECT_TRUE(fs::exists(d + "/out/notes.tmp-keep.txt"));  // not an atomic write's name
       EXPECT_TRUE(fs::exists(d + "/out/notes.tmp-backup"));
       EXPECT_TRUE(fs::exists(d + "/out/model.safetensors"));
     }},
    // Every TrainingArguments field at its default (to_json_string() of transformers 5.24): what
    // asks for nothing anatomy lacks is accepted with a note, so the dump runs as it is.
    {"ATrainingArgumentsDumpRunsAsItIs", [](const std::string&) {},
     "train " + std::string(ANATOMY_SOURCE_DIR) + "/tests/data/trainer_args/training_arguments_defaults.json "
     "--device cpu --preset bert-tiny --num-samples 16 --max-seq-length 16 --max-steps 1 --output-dir {dir}/out",
     0,
     {"--accelerator-config {", "--dataloader-drop-last false: accepted, it changes nothing here",
      "--do-train false: accepted as TrainingArguments' default"},
     {"error"}, files_exist({"out/train_results.json"})},
    // Ratings 1..5: run_glue.py maps the sorted distinct labels to 0..4, a head of five classes
    // named by the ratings, and predicts the ratings.
    {"StarRatingsMakeFiveClassesAsRunGlueMapsThem", kStarRatings,
     kTiny + "--train_file {dir}/r.csv --validation_file {dir}/r.csv --test_file {dir}/r.csv --do_predict "
             "--text_column_names review --label_column_name stars --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out",
     0, {"5 classes"}, {},
     [](const std::string& d) {
       const json cfg = read_json(d + "/out/config.json");
       EXPECT_EQ(cfg["id2label"], (json{{"0", "1"}, {"1", "2"}, {"2", "3"}, {"3", "4"}, {"4", "5"}}));
       EXPECT_EQ(cfg["label2id"]["5"], 4);
       std::ifstream in(d + "/out/predict_results.txt");
       std::string line;
       ASSERT_TRUE(std::getline(in, line));
       int n = 0;
       for (; std::getline(in, line); ++n) {
         const std::string pred = line.substr(line.find('\t') + 1);
         EXPECT_TRUE(pred.size() == 1 && pred[0] >= '1' && pred[0] <= '5') << line;
       }
       EXPECT_EQ(n, 25);
       const json ev = read_json(d + "/out/eval_results.json");
       EXPECT_EQ(ev["eval_samples"], 25) << ev.dump();
     }},
    // run_ner.py's and run_mlm.py's columns (Note [run_ner.py's columns] in data/token_tags.h,
    // use_run_mlm_column in data/text_dataset.h).
    {"RunNerJsonWithOtherColumnNames", kNerOtherNames,
     kTiny + "--task token-classification --train_file {dir}/w.jsonl --validation_file {dir}/w.jsonl --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     0,
     {"--train-file {dir}/w.jsonl has no 'tokens': reading 'words' as the words, as run_ner.py would",
      "--train-file {dir}/w.jsonl has no 'ner_tags': reading 'labels' as the tags, as run_ner.py would"},
     {"--validation-file {dir}/w.jsonl has no"},
     [](const std::string& d) {
       EXPECT_EQ(read_json(d + "/out/config.json")["id2label"], (json{{"0", "B-LOC"}, {"1", "B-PER"}, {"2", "O"}}));
     }},
    {"NamedNerColumnIsNotReplaced", kNerOtherNames,
     kTiny + "--task token-classification --train_file {dir}/w.jsonl --text_column_name tokens --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     2, {"{dir}/w.jsonl:1: no list of words 'tokens'"}, {"as the words"}, files_absent({"out"})},
    {"RunMlmCsvWithoutATextColumn", kMlmCsv,
     kTiny + "--task mlm --train_file {dir}/m.csv --validation_file {dir}/m.csv --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     0, {"--train-file {dir}/m.csv has no 'text' column: reading 'sentence' as the text, as run_mlm.py would"},
     {"--validation-file {dir}/m.csv has no"}, files_exist({"out/model.safetensors"})},
    // Note [run_mlm.py's validation head]: without --validation_file the first 5% of the rows
    // (1 of 24) validate and the rest train, as run_mlm.py splits them; a head too small for a
    // block under --do_eval is refused (run_mlm.py: "corresponds to no data").
    {"RunMlmWithoutAValidationFileHoldsOutTheFirstRows", kMlmCsv,
     kTiny + "--task mlm --train_file {dir}/m.csv --line_by_line --max_seq_length 32 --do_eval --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     0, {"23 texts for masked-language modelling", ", 1 for validation (the first 5% of its rows, as run_mlm.py holds "
         "out validation_split_percentage"},
     {}, [](const std::string& d) {
       const json all = read_json(d + "/out/all_results.json");
       EXPECT_EQ(all["train_samples"], 23) << all;
       EXPECT_EQ(all["eval_samples"], 1) << all;
     }},
    {"RunMlmHeadTooSmallForDoEval", kMlmCsv,
     kTiny + "--task mlm --train_file {dir}/m.csv --max_seq_length 32 --do_eval --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     2, {"--do-eval needs validation data: {dir}/m.csv:", "no validation (the first 5% of its rows"}, {},
     files_absent({"out"})},
    {"RunMlmValidationSplitPercentageZeroTrainsOnAll", kMlmCsv,
     kTiny + "--task mlm --train_file {dir}/m.csv --line_by_line --validation_split_percentage 0 --max_seq_length 32 "
         "--tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out",
     0, {"24 texts for masked-language modelling"}, {"for validation"},
     [](const std::string& d) { EXPECT_EQ(read_json(d + "/out/all_results.json")["train_samples"], 24); }},
    {"NamedTextColumnIsNotReplaced", kGlueCsv,
     kTiny + "--train_file {dir}/s.csv --text_column_name text --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out",
     2, {"{dir}/s.csv:1: no column 'text' in the header (columns: 'sentence', 'label')"}, {"run_glue.py would"}},
    {"NumLabelsDisagreesWithData", copy_text, kTextRun + "--max-steps 1 --num-labels 5", 2,
     {"--num-labels 5 disagrees with --train-file {dir}/s.jsonl", "make 3 classes"}},
    {"NumLabelsAgreeing", copy_text, kTextRun + "--max-steps 1 --num_labels 3", 0, {}},
    {"LabelColumnMixingIdsAndNames",
     [](const std::string& d) {
       copy_text(d);
       std::string t = slurp(d + "/s.jsonl");
       const size_t third = t.find('\n', t.find('\n', t.find('\n') + 1) + 1);  // after line 3
       t.insert(third + 1, "{\"text\": \"An odd line.\", \"label\": 2}\n");
       spit(d + "/s.jsonl", t);
     },
     kTextRun + "--max-steps 1", 2,
     {"{dir}/s.jsonl:4: label '2' is an integer but line 1's label 'negative' is a name"}},
    {"ValidationFileEvaluatedAtTheEnd", copy_text, kTextRun + "--max-steps 1 --validation-file {dir}/s.jsonl", 0,
     {"validation data evaluated at the end, as --do-eval does", "'eval_accuracy'"}, {},
     files_exist({"out/eval_results.json", "out/all_results.json"})},
    {"DoEvalFalseSkipsTheEnd", copy_text, kTextRun + "--max-steps 1 --validation-file {dir}/s.jsonl --do_eval false", 0,
     {"validation data not evaluated"}, {"'eval_accuracy'"}, files_absent({"out/eval_results.json"})},
    {"EvalBatchAboveMicroBatchListed", copy_text,
     kTextRun + "--max-steps 1 --validation-file {dir}/s.jsonl --per-device-eval-batch-size 32", 0,
     {"batch 8 (--per-device-eval-batch-size 32 capped at the training micro-batch"}},
    {"EvalBatchHonoured", copy_text,
     kTextRun + "--max-steps 1 --validation-file {dir}/s.jsonl --per-device-eval-batch-size 4", 0,
     {"evaluated at the end, as --do-eval does (no --eval-strategy; --do-eval false turns it off), batch 4\n"}},

    // Point 4: logs a person and a program can read.
    // As the Trainer's DefaultFlowCallback: the first step, then every second; the last partial
    // window (step 5) is not logged.
    {"LoggingFirstStepAndTrainerKeys", copy_text, kTextRun + "--max-steps 5 --logging-steps 2 --logging_first_step", 0,
     {"{'loss': ", "'grad_norm': ", "'learning_rate': ", "'epoch': "}, {}, logged_steps({1, 2, 4})},
    {"SameKeysOnTwoRanks", copy_text, kTextRun + "--max-steps 2 --logging-steps 1 --nproc-per-node 2", 0,
     {"{'loss': ", "'grad_norm': ", "'epoch': "}, {}, logged_steps({1, 2})},
    {"ReportToNoneWritesNoMetrics", copy_text, kTextRun + "--max-steps 1 --report_to none", 0, {}, {},
     files_absent({"out/metrics.jsonl"})},

    // Point 5: an output directory that transformers loads as it is.
    {"OutputAndCheckpointsLoadable", copy_text,
     kTextRun + "--max-steps 2 --save-strategy steps --save-steps 1 --validation-file {dir}/s.jsonl", 0, {}, {},
     kOutputLoadable},
    {"DoPredictWritesPredictResults", copy_text,
     kTextRun + "--max-steps 1 --do_predict --test_file {dir}/s.jsonl", 0, {"predicted 197 samples"}, {}, kPredictResults},
    // A checkpoint past this run's last step: nothing trained, the end evaluated and written as the Trainer does.
    {"ResumePastTheEndTrainsNothingAndEvaluates",
     [](const std::string& d) {
       copy_text(d);
       const CmdResult r = run(expand(kTextRun + "--max-steps 4 --save-strategy steps --save-steps 2", d));
       ASSERT_EQ(r.status, 0) << r.output;
     },
     kTextRun + "--max-steps 2 --validation-file {dir}/s.jsonl --resume-from-checkpoint latest", 0,
     {"the checkpoint is at step 4, past this run's 2 steps: nothing to train"}, {},
     [](const std::string& d) {
       const json train = read_json(d + "/out/train_results.json"), all = read_json(d + "/out/all_results.json");
       EXPECT_EQ(train["steps"], 4);
       EXPECT_EQ(train["train_steps_per_second"], 0.0);
       EXPECT_EQ(train["train_samples_per_second"], 0.0);
       EXPECT_GT(train["last_step_loss"].get<double>(), 0.0);  // the checkpoint's last step, not 0
       EXPECT_TRUE(all.contains("eval_loss")) << all.dump();
       EXPECT_EQ(read_json(d + "/out/eval_results.json")["eval_samples"], 197);
     }},
    {"SeqLongerThanThePositionsNamesTheFlagTyped", copy_text,
     "train --device cpu --disable-tqdm --preset bert-tiny --train-file {dir}/s.jsonl --tokenizer " + kTok +
         " --max_seq_length 600 --max-steps 1 --output-dir {dir}/out",
     2,
     {"--max-seq-length 600 is longer than the model's position table"}, {"--seq-len"}},
    {"DoPredictNeedsTestFile", copy_text, kTextRun + "--max-steps 1 --do-predict", 2, {"--do-predict needs --test-file"}},
    {"TestFileNeedsDoPredict", copy_text, kTextRun + "--max-steps 1 --test-file {dir}/s.jsonl", 2,
     {"is predicted only with --do-predict"}},

    {"TrainerStateAsTheTrainerWritesIt", copy_text,
     kTextRun + "--max-steps 4 --validation-file {dir}/s.jsonl --eval-strategy steps --eval-steps 2 --logging-steps 1 "
                "--save-strategy steps --save-steps 2",
     0, {}, {}, kTrainerStateAsTheTrainerWritesIt},
    // Note [best model]: the best checkpoint by eval_loss is kept beyond --save-total-limit and ends the run.
    {"LoadBestModelAtEnd", copy_text,
     kTextRun + "--max-steps 5 --learning-rate 0.005 --validation-file {dir}/s.jsonl --eval-strategy steps --eval-steps 1 "
                "--save-strategy steps --save-steps 1 --save-total-limit 1 --load_best_model_at_end",
     0, {}, {}, kBestModelKept},
    // Note [the last step ends an epoch]: the last step is saved under --save-strategy steps (5 is
    // no multiple of 2) and evaluated and saved under the epoch strategies when the run ends mid-epoch.
    {"TheLastStepIsSaved", copy_text, kTextRun + "--max-steps 5 --save-strategy steps --save-steps 2", 0, {}, {},
     files_present({"out/checkpoint-2", "out/checkpoint-4", "out/checkpoint-5"})},
    {"AnEpochEndingMidwayIsEvaluatedAndSaved", copy_text,
     kTextRun + "--max-steps 5 --validation-file {dir}/s.jsonl --eval-strategy epoch --save-strategy epoch", 0,
     {"'step': 5}"}, {}, files_present({"out/checkpoint-5"})},
    // ... and, as the Trainer, a --metric-for-best-model alone tracks it (named, kept), the run
    // ending with the last step's weights.
    {"MetricForBestModelAloneTracksTheBest", copy_text,
     kTextRun + "--max-steps 5 --learning-rate 0.005 --validation-file {dir}/s.jsonl --eval-strategy steps --eval-steps 1 "
                "--save-strategy steps --save-steps 1 --save-total-limit 1 --metric-for-best-model loss",
     0, {}, {}, kBestModelTracked},
    {"LoadBestModelNeedsMatchingStrategies", copy_text,
     kTextRun + "--max-steps 2 --validation-file {dir}/s.jsonl --eval-strategy steps --load-best-model-at-end", 2,
     {"--load-best-model-at-end needs --eval-strategy and --save-strategy alike"}},

    // Point 6: plan and defaults.
    {"PlanSizeNeedsUnit", [](const std::string&) {}, "plan --gpu-memory 16", 2, {"a size needs its unit", "16GiB"}},
    {"PlanNotFittingExitsOneNamingTheLever", [](const std::string&) {},
     "plan --preset bert-base --per-device-train-batch-size 64 --gpu-memory 4GiB", 1,
     {"Planning for a GPU of 4096 MiB", "the plan does not fit", "change "}},
    {"PlanTakesTheRevisionTrainingWillUse", [](const std::string&) {},
     "plan --device cpu --model-name-or-path " + std::string(ANATOMY_SOURCE_DIR) +
         "/tests/fixtures/models/distilbert --model_revision main",
     0, {"Memory plan: ", "total"}, {"not an option of `anatomy plan`"}},
    // --optim sgd is torch.optim.SGD as the Trainer builds it: no momentum, so no state.
    {"PlainSgdKeepsNoOptimizerState", [](const std::string&) {}, "plan --device cpu --optim sgd", 0,
     {"optimizer_state           0.0 MiB"}},
    {"SgdWithMomentumKeepsItsBuffer", [](const std::string&) {}, "plan --device cpu --optim sgd --sgd-momentum 0.9", 0,
     {"optimizer_state          16.7 MiB     4.00 bytes/param"}},
    {"PlanOnCpuNamesTheDevice", [](const std::string&) {}, "plan --device cpu", 0,
     {"Planning for the CPU (--device cpu)", "bert-tiny, batch 8 x seq 128"}},
    {"PlanRefusesACpuWithAGpuSize", [](const std::string&) {}, "plan --device cpu --gpu-memory 80GB", 2,
     {"--gpu-memory plans for a GPU of that size; --device cpu plans for the CPU"}},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class FirstHour : public ::testing::TestWithParam<Case> {};

TEST_P(FirstHour, SaysAndLeavesWhatATrainerUserExpects) {
  const Case& c = GetParam();
  const std::string dir = anatomy::testing_cli::fresh_dir(std::string("anatomy_first_hour_") + c.name);
  c.build(dir);
  if (::testing::Test::HasFatalFailure()) return;
  const CmdResult r = run(expand(c.args, dir));
  EXPECT_EQ(r.status, c.status) << r.output;
  for (const std::string& s : c.says) EXPECT_NE(r.output.find(expand(s, dir)), std::string::npos) << s << "\n" << r.output;
  for (const std::string& s : c.never) EXPECT_EQ(r.output.find(expand(s, dir)), std::string::npos) << s << "\n" << r.output;
  if (c.status == 2) {
    EXPECT_NE(r.output.find("anatomy: error: "), std::string::npos) << r.output;
  }
  if (c.after) c.after(dir);
}

INSTANTIATE_TEST_SUITE_P(Table, FirstHour, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// With stdout and stderr not a terminal, the start-up block comes before the first step's line.
TEST(FirstHourLog, StartupBlockBeforeTheFirstStep) {
  const std::string dir = anatomy::testing_cli::fresh_dir("anatomy_first_hour_startup");
  copy_text(dir);
  const CmdResult r = run(expand(kTextRun + "--max-steps 2 --logging-steps 1", dir));
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t first_step = r.output.find("{'loss'");
  ASSERT_NE(first_step, std::string::npos) << r.output;
  for (const char* s : {"anatomy: training bert-tiny", "anatomy: device: cpu", "fp32", "197 training samples", "2 steps",
                        "planned memory per device"}) {
    const size_t at = r.output.find(s);
    EXPECT_LT(at, first_step) << s << "\n" << r.output;
  }
}

// The output directory through the libraries transformers loads it with (tokenizers and
// safetensors, from scripts/setup.sh's .venv); skipped where they are not installed.
TEST(FirstHourLoad, OutputLoadsWithTokenizersAndSafetensors) {
  const std::string venv = std::string(ANATOMY_SOURCE_DIR) + "/.venv/bin/python";
  const std::string py = fs::exists(venv) ? venv : "python3";
  if (std::system((py + " -c 'import tokenizers, safetensors, numpy' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << "tokenizers, safetensors or numpy not importable by " << py << " (scripts/setup.sh installs them)";
  const std::string out = trained_model();
  const std::string script = anatomy::testing_cli::fresh_dir("anatomy_first_hour_py") + "/load.py";
  spit(script, R"(import json, sys
from tokenizers import Tokenizer
from safetensors.numpy import load_file
d = sys.argv[1]
tok = Tokenizer.from_file(d + "/tokenizer.json")
ids = tok.encode("The bakery remembered my order.").ids
cfg = json.load(open(d + "/config.json"))
w = load_file(d + "/model.safetensors")
print(len(ids), w["classifier.weight"].shape, cfg["id2label"]["2"])
)");
  const CmdResult r = shell(py + " " + script + " " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(3, 128) positive"), std::string::npos) << r.output;
}

}  // namespace
