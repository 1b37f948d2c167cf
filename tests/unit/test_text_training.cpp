// End to end through the command line: a JSONL file of real sentences -> train bert-tiny on the
// CPU with evaluation and checkpoints -> `anatomy eval` on the saved model -> predictions file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>
#include "../common/cli.h"
#include "../common/compare.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using anatomy::testing_cli::CmdResult;

CmdResult run(const std::string& args) { return anatomy::testing_cli::run_anatomy(args); }
std::string tmp(const std::string& name) { return anatomy::testing_cli::fresh_dir(name); }

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

const std::string kData = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
const std::string kTokenizer = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer";

}  // namespace

TEST(TextTraining, JsonlToTrainedModelToEvalPredictions) {
  const std::string dir = tmp("text_e2e");
  fs::copy_file(kData, dir + "/data.jsonl");  // the token cache goes beside it, not into the source tree
  const std::string out = dir + "/run";
  CmdResult t = run("train --device cpu --preset bert-tiny --train-file " + dir + "/data.jsonl --tokenizer " + kTokenizer +
                    " --validation-split 0.2 --max-seq-length 64 --per-device-train-batch-size 16 --num-train-epochs 3"
                    " --learning-rate 5e-4 --eval-strategy epoch --save-strategy steps --save-steps 10"
                    " --save-total-limit 2 --logging-steps 5 --group-by-length --disable-tqdm --output-dir " + out);
  ASSERT_EQ(t.status, 0) << t.output;

  // The classes came from the file's string labels, sorted, into the saved config.
  const json cfg = read_json(fs::path(out) / "config.json");
  EXPECT_EQ(cfg["id2label"].size(), 3u) << cfg.dump();
  EXPECT_EQ(cfg["id2label"]["0"], "negative");
  EXPECT_EQ(cfg["id2label"]["1"], "neutral");
  EXPECT_EQ(cfg["id2label"]["2"], "positive");
  EXPECT_TRUE(fs::exists(fs::path(out) / "vocab.txt"));  // the tokenizer travels with the model

  // 197 - round(0.2 * 197) = 158 training samples / 16 = 10 batches an epoch, 3 epochs: 30 steps;
  // an evaluation per epoch.
  const json res = read_json(fs::path(out) / "train_results.json");
  EXPECT_EQ(res["steps"], 30);
  EXPECT_EQ(res["samples"], 3 * 158);
  EXPECT_TRUE(res.contains("eval_accuracy"));
  EXPECT_GE(res["data_wait_s"].get<double>(), 0.0);
  int evals = 0, logs = 0;
  for (const json& j : read_jsonl(fs::path(out) / "metrics.jsonl")) {
    evals += j.contains("eval_loss");
    logs += j.contains("loss");
  }
  EXPECT_EQ(evals, 3);
  EXPECT_EQ(logs, 6);
  EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-20" / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint-30" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(out) / "checkpoint-10"));  // --save-total-limit 2

  // `anatomy eval` on the saved model over the whole file.
  const std::string ev = dir + "/eval";
  CmdResult e = run("eval --device cpu --model-name-or-path " + out + " --eval-file " + dir +
                    "/data.jsonl --max-seq-length 64 --output-dir " + ev);
  ASSERT_EQ(e.status, 0) << e.output;
  const std::vector<json> preds = read_jsonl(fs::path(ev) / "predictions.jsonl");
  ASSERT_EQ(preds.size(), 197u);
  const std::set<std::string> names{"negative", "neutral", "positive"};
  int correct = 0;
  for (const json& p : preds) {
    EXPECT_TRUE(names.count(p["prediction"].get<std::string>())) << p.dump();
    correct += p["prediction"] == p["label"];
  }
  const json er = read_json(fs::path(ev) / "eval_results.json");
  EXPECT_NEAR(er["eval_accuracy"].get<double>(), correct / 197.0, 1e-12);
}

TEST(TextTraining, TextFlagsGiveOneLineErrors) {
  const std::string dir = tmp("text_errors");
  fs::copy_file(kData, dir + "/data.jsonl");
  const std::string base = "train --device cpu --preset bert-tiny --max-steps 1 --disable-tqdm --output-dir " + dir + "/run ";
  CmdResult no_tok = run(base + "--train-file " + dir + "/data.jsonl");
  EXPECT_EQ(no_tok.status, 2) << no_tok.output;
  EXPECT_NE(no_tok.output.find("--tokenizer"), std::string::npos) << no_tok.output;
  CmdResult no_val = run(base + "--train-file " + dir + "/data.jsonl --tokenizer " + kTokenizer + " --eval-strategy steps");
  EXPECT_EQ(no_val.status, 2) << no_val.output;
  EXPECT_NE(no_val.output.find("--validation-file"), std::string::npos) << no_val.output;
  CmdResult bad_col = run(base + "--train-file " + dir + "/data.jsonl --tokenizer " + kTokenizer + " --text-column body");
  EXPECT_EQ(bad_col.status, 2) << bad_col.output;
  EXPECT_NE(bad_col.output.find("data.jsonl"), std::string::npos) << bad_col.output;
  CmdResult missing = run(base + "--train-file " + dir + "/nope.jsonl --tokenizer " + kTokenizer);
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_NE(missing.output.find("nope.jsonl"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(dir + "/run/train_results.json"));
}

// Training on real tokens (Note [packed training] in model/bert.cpp) against padded batches,
// through the command line: from the same weights with dropout off (its masks are drawn per
// row, so they differ between the layouts), four fp32 steps in random order give the same
// losses and the same model within rounding.
TEST(TextTraining, RealTokensTrainLikePaddedBatches) {
  const std::string dir = tmp("text_packed");
  fs::copy_file(kData, dir + "/data.jsonl");
  const std::string common = "train --device cpu --threads 1 --train-file " + dir + "/data.jsonl --max-seq-length 64"
                             " --per-device-train-batch-size 16 --learning-rate 5e-4 --disable-tqdm --logging-steps 1"
                             " --save-strategy final";
  CmdResult s = run(common + " --preset bert-tiny --tokenizer " + kTokenizer + " --max-steps 1 --output-dir " + dir + "/start");
  ASSERT_EQ(s.status, 0) << s.output;
  json cfg = read_json(fs::path(dir) / "start" / "config.json");
  cfg["hidden_dropout_prob"] = 0.0;
  cfg["attention_probs_dropout_prob"] = 0.0;
  std::ofstream(fs::path(dir) / "start" / "config.json") << cfg.dump(2);

  auto train = [&](const std::string& name, const std::string& flag) {
    CmdResult r = run(common + " --model-name-or-path " + dir + "/start --max-steps 4 --output-dir " + dir + "/" + name +
                      " " + flag);
    EXPECT_EQ(r.status, 0) << r.output;
    std::vector<double> losses;
    for (const json& j : read_jsonl(fs::path(dir) / name / "metrics.jsonl"))
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    return losses;
  };
  const std::vector<double> packed = train("packed", ""), padded = train("padded", "--no-skip-padding");
  ASSERT_EQ(packed.size(), 4u);
  ASSERT_EQ(padded.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(packed[i], padded[i], 1e-5 * std::max(1.0, std::fabs(padded[i]))) << i;
  EXPECT_TRUE(anatomy::testing_compare::same_safetensors(fs::path(dir) / "packed" / "model.safetensors",
                                                         fs::path(dir) / "padded" / "model.safetensors", 1e-5));
}

// Note [unknown-token share]: a tokenizer that maps the text to [UNK] (here a vocab.txt of the
// five special tokens, all that transformers 5's BertTokenizerFast(vocab_file=...) keeps) is named in a
// warning with the share it measured; the full vocabulary on the same text gives none. Masked-LM
// data (another loader) and `anatomy eval`'s file are checked the same way.
TEST(TextTraining, ATokenizerThatMapsTheTextToUnknownIsWarnedAbout) {
  const std::string dir = tmp("text_unknown");
  fs::copy_file(kData, dir + "/data.jsonl");
  fs::create_directories(dir + "/five");
  std::ofstream(dir + "/five/vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  const std::string base = "train --device cpu --preset bert-tiny --max-steps 1 --max-seq-length 32 --disable-tqdm "
                           "--train-file " + dir + "/data.jsonl ";
  CmdResult five = run(base + "--save-strategy no --tokenizer " + dir + "/five --output-dir " + dir + "/a");
  ASSERT_EQ(five.status, 0) << five.output;
  const size_t at = five.output.find("warning: ");
  ASSERT_NE(at, std::string::npos) << five.output;
  const std::string line = five.output.substr(at, five.output.find('\n', at) - at);
  // Every word is [UNK]: the real tokens are [CLS] w1 .. wn [SEP], so the share is (n) / (n + 2),
  // about 80% for these sentences of 6-9 words.
  const double share = std::stod(line.substr(std::strlen("warning: ")));
  EXPECT_GT(share, 70.0) << line;
  EXPECT_LT(share, 90.0) << line;
  EXPECT_NE(line.find("[UNK]"), std::string::npos) << line;
  EXPECT_NE(line.find(dir + "/five (5 tokens"), std::string::npos) << line;
  CmdResult mlm = run(base + "--save-strategy no --task mlm --tokenizer " + dir + "/five --output-dir " + dir + "/b");
  ASSERT_EQ(mlm.status, 0) << mlm.output;
  EXPECT_NE(mlm.output.find("warning: "), std::string::npos) << mlm.output;
  CmdResult full = run(base + "--tokenizer " + kTokenizer + " --save-strategy final --output-dir " + dir + "/c");
  ASSERT_EQ(full.status, 0) << full.output;
  EXPECT_EQ(full.output.find("warning: "), std::string::npos) << full.output;
  // `anatomy eval` of the saved model: its own tokenizer, then the five-token one.
  const std::string eval = "eval --device cpu --model-name-or-path " + dir + "/c --eval-file " + dir + "/data.jsonl ";
  CmdResult own = run(eval + "--output-dir " + dir + "/e1");
  ASSERT_EQ(own.status, 0) << own.output;
  EXPECT_EQ(own.output.find("warning: "), std::string::npos) << own.output;
  CmdResult bad = run(eval + "--tokenizer " + dir + "/five --output-dir " + dir + "/e2");
  ASSERT_EQ(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("of the evaluation tokens are the unknown token [UNK]"), std::string::npos) << bad.output;
}
