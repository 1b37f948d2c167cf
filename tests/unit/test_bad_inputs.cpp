// The table of bad inputs (issue 13): every file, flag or value a user can get wrong, each one a
// row: how the input is built, the command, the exit status and the words the one-line error must
// hold, and which files must come out of the run byte for byte as they went in. A new case is one
// row in kCases (and, when no builder fits, one small builder above it).
//
// Rows run `anatomy` on the CPU with bert-tiny through `timeout`, so a case that would block (a
// FIFO read) fails the test instead of hanging it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/cli.h"
#include "io/safetensors.h"
#include "memory/planner.h"
#include "model/config.h"
#include "train/checkpoints.h"

namespace fs = std::filesystem;
using anatomy::testing_cli::CmdResult;

namespace {

const std::string kTok = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/tokenizer";
const std::string kText = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
// The common part of a small training run; rows append what they vary.
const std::string kCpu = "train --device cpu --threads 2 --disable-tqdm --seq-len 32 ";
const std::string kTrain = kCpu + "--preset bert-tiny ";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

CmdResult run(const std::string& args) {
  const std::string cmd = "timeout 120 " + std::string(ANATOMY_BINARY) + " " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// Every "{dir}" replaced by the row's directory.
std::string expand(std::string s, const std::string& dir) {
  for (size_t at; (at = s.find("{dir}")) != std::string::npos;) s.replace(at, 5, dir);
  return s;
}

void copy_text(const std::string& dir) { fs::copy_file(kText, dir + "/s.jsonl"); }

// ---- builders: shared inputs, made once per test process ------------------------------------

// A finished small run with checkpoints at steps 1 and 2 (--save-steps 1), its model beside them.
// Every test process (ctest runs each row in its own) shares one, made for this build of the
// binary: made aside and renamed into place, so a process never sees another's half-made run.
const std::string& trained_run() {
  static const std::string dir = [] {
    struct stat bin {};
    EXPECT_EQ(stat(ANATOMY_BINARY, &bin), 0);
    const std::string done = (fs::path(::testing::TempDir()) /
                              ("anatomy_bad_inputs_run-" + std::to_string(bin.st_mtime) + "-" + std::to_string(bin.st_size)))
                                 .string();
    if (fs::exists(done + "/run/train_results.json")) return done + "/run";
    const std::string d = anatomy::testing_cli::fresh_dir("anatomy_bad_inputs_run.tmp-" + std::to_string(getpid()));
    fs::copy_file(kText, d + "/s.jsonl");
    const CmdResult r = run(kTrain + "--train-file " + d + "/s.jsonl --tokenizer " + kTok +
                            " --max-steps 2 --save-strategy steps --save-steps 1 --output-dir " + d + "/run");
    EXPECT_EQ(r.status, 0) << r.output;
    if (std::rename(d.c_str(), done.c_str()) != 0) fs::remove_all(d);  // another process was first
    return done + "/run";
  }();
  return dir;
}

void copy_run(const std::string& dir) {
  copy_text(dir);
  fs::copy(trained_run(), dir + "/run", fs::copy_options::recursive);
}

// Edits checkpoint-2's anatomy_state.json with `f` (a checkpoint's own manifest covers the other
// files, not this one).
std::function<void(const std::string&)> edit_state(std::function<void(nlohmann::json&)> f) {
  return [f](const std::string& dir) {
    copy_run(dir);
    const std::string p = dir + "/run/checkpoint-2/anatomy_state.json";
    nlohmann::json st = nlohmann::json::parse(slurp(p));
    f(st);
    spit(p, st.dump(2));
  };
}

std::function<void(const std::string&)> write_state(const std::string& text) {
  return [text](const std::string& dir) {
    copy_run(dir);
    spit(dir + "/run/checkpoint-2/anatomy_state.json", text);
  };
}

// The run's model with one element of `tensor` (every element when `whole`) set to `value`
// (header and layout unchanged).
std::function<void(const std::string&)> poison_model(const std::string& tensor, float value, bool whole = false) {
  return [tensor, value, whole](const std::string& dir) {
    copy_run(dir);
    const std::string p = dir + "/run/model.safetensors";
    std::string bytes = slurp(p);
    uint64_t header = 0;  // safetensors: an 8-byte header length, the JSON header, then the data
    std::memcpy(&header, bytes.data(), 8);
    const auto& info = anatomy::SafetensorsReader::open(p).info(tensor);
    for (uint64_t at = info.begin; at < (whole ? info.end : info.begin + 4); at += 4)
      std::memcpy(bytes.data() + 8 + header + at, &value, 4);
    spit(p, bytes);
  };
}

// A model directory {dir}/m: the run's config.json with `field` set to `value`, and its weights.
std::function<void(const std::string&)> model_with(const std::string& field, int64_t value) {
  return [field, value](const std::string& dir) {
    copy_text(dir);
    fs::create_directory(dir + "/m");
    nlohmann::json c = nlohmann::json::parse(slurp(trained_run() + "/config.json"));
    c[field] = value;
    spit(dir + "/m/config.json", c.dump(2));
    fs::copy_file(trained_run() + "/model.safetensors", dir + "/m/model.safetensors");
  };
}

// {dir}/s.jsonl with the token cache the trained run made of the same text (the cache's name
// and key follow the text's bytes and options, not its directory), `damage` applied to it.
std::function<void(const std::string&)> damaged_cache(std::function<void(std::string&)> damage) {
  return [damage](const std::string& dir) {
    copy_text(dir);
    for (const auto& e : fs::directory_iterator(fs::path(trained_run()).parent_path()))
      if (e.path().extension() == ".anatomy-cache") {
        std::string bytes = slurp(e.path().string());
        damage(bytes);
        spit(dir + "/" + e.path().filename().string(), bytes);
        return;
      }
    FAIL() << "the trained run left no token cache beside its text";
  };
}

// A run on {dir}/s.jsonl takes its token cache as it is: no word about the cache.
void cache_is_sound(const std::string& dir) {
  const CmdResult r = run(kTrain + "--train-file " + dir + "/s.jsonl --tokenizer " + kTok + " --max-steps 1 --output-dir " +
                          dir + "/again");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("token cache"), std::string::npos) << r.output;
}

// ---- the table ----------------------------------------------------------------------------

struct Case {
  const char* name;
  std::function<void(const std::string& dir)> build;
  std::string args;                    // after the binary; {dir} is the row's directory
  int status;                          // expected exit status
  std::vector<std::string> says;       // substrings of the output
  std::vector<std::string> unchanged;  // files under {dir} the run must leave byte for byte
  std::function<void(const std::string& dir)> after = nullptr;  // checks once the run is over
};

const std::string kResume = kTrain + "--train-file {dir}/s.jsonl --tokenizer " + kTok +
                            " --max-steps 3 --save-strategy steps --save-steps 1 --output-dir {dir}/run "
                            "--resume-from-checkpoint {dir}/run/checkpoint-2";
const std::vector<std::string> kCheckpointFiles = {"run/checkpoint-2/anatomy_state.json",
                                                   "run/checkpoint-2/model.safetensors", "run/model.safetensors"};
const float kNaN = std::numeric_limits<float>::quiet_NaN();

const std::string kTrainText = kTrain + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out";
const std::string kTrainModel =
    kCpu + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --model-name-or-path {dir}/m --max-steps 1 --output-dir {dir}/out";
const std::string kEvalModel = "eval --device cpu --model-name-or-path {dir}/m --eval-file {dir}/s.jsonl --tokenizer " + kTok;

const std::vector<Case> kCases = {
    // A data file that is not a regular file is refused at once, not read (a FIFO would block).
    {"FifoTrainFile", [](const std::string& d) { ASSERT_EQ(mkfifo((d + "/t.jsonl").c_str(), 0600), 0); },
     kTrain + "--train-file {dir}/t.jsonl --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out", 2,
     {"--train-file {dir}/t.jsonl", "not a regular file"}, {}},
    {"DirectoryTrainFile", [](const std::string& d) { fs::create_directory(d + "/t.jsonl"); },
     kTrain + "--train-file {dir}/t.jsonl --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out", 2,
     {"--train-file {dir}/t.jsonl", "not a regular file"}, {}},
    // The output directory's metrics.jsonl cannot be written: said before the first step, not
    // ignored until the end's writes fail.
    {"MetricsFileUnwritable",
     [](const std::string& d) {
       copy_text(d);
       fs::create_directories(d + "/out/metrics.jsonl");
     },
     kTrain + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out", 2,
     {"{dir}/out/metrics.jsonl: cannot be written"}, {}},
    // One class (a small debug subset) made a head of one output, read as regression: it crashed.
    {"OneClassTrainFile", [](const std::string& d) { spit(d + "/one.csv", "text,label\nhello,pos\nworld,pos\n"); },
     kTrain + "--train-file {dir}/one.csv --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out", 2,
     {"--train-file {dir}/one.csv: every label is 'pos', one class; a classifier needs two or more"}, {}},
    {"OneTagTrainFile",
     [](const std::string& d) {
       spit(d + "/one.jsonl", "{\"tokens\": [\"a\", \"b\"], \"ner_tags\": [\"O\", \"O\"]}\n");
     },
     kTrain + "--task token-classification --train-file {dir}/one.jsonl --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     2, {"--train-file {dir}/one.jsonl: every tag is 'O', one class; token classification needs two or more"}, {}},
    {"FifoValidationFile",
     [](const std::string& d) {
       copy_text(d);
       ASSERT_EQ(mkfifo((d + "/v.jsonl").c_str(), 0600), 0);
     },
     kTrain + "--train-file {dir}/s.jsonl --validation-file {dir}/v.jsonl --tokenizer " + kTok +
         " --max-steps 1 --output-dir {dir}/out",
     2, {"--validation-file {dir}/v.jsonl", "not a regular file"}, {"s.jsonl"}},

    // anatomy_state.json, field by field; the checkpoint and the run's model stay as they were.
    {"StateGlobalStepHuge", edit_state([](nlohmann::json& s) { s["trainer"]["global_step"] = 1e15; }), kResume, 2,
     {"anatomy_state.json", "trainer.global_step must be a non-negative integer"}, kCheckpointFiles},
    {"StateGlobalStepHugeInteger",
     edit_state([](nlohmann::json& s) { s["trainer"]["global_step"] = int64_t{1000000000000000}; }), kResume, 2,
     {"anatomy_state.json", "global_step 1000000000000000 disagrees with step 2"}, kCheckpointFiles},
    {"StateGlobalStepNegative", edit_state([](nlohmann::json& s) { s["trainer"]["global_step"] = -100; }), kResume, 2,
     {"anatomy_state.json", "trainer.global_step must be a non-negative integer, got -100"}, kCheckpointFiles},
    {"StateStepNegative", edit_state([](nlohmann::json& s) { s["step"] = -100; }), kResume, 2,
     {"anatomy_state.json", "step must be a non-negative integer"}, kCheckpointFiles},
    {"StateStepOfAnotherCheckpoint",
     edit_state([](nlohmann::json& s) {
       s["step"] = 1;
       s["trainer"]["global_step"] = 1;
     }),
     kResume, 2, {"anatomy_state.json", "names step 1 but the directory is checkpoint-2"}, kCheckpointFiles},
    {"StateOptimizerStepsDisagree", edit_state([](nlohmann::json& s) { s["optimizer_steps"] = 7; }), kResume, 2,
     {"anatomy_state.json", "global_step 2 is not optimizer_steps 7 + skipped_steps 0"}, kCheckpointFiles},
    {"StateLossSumString", edit_state([](nlohmann::json& s) { s["trainer"]["loss_sum"] = "big"; }), kResume, 2,
     {"anatomy_state.json", "trainer.loss_sum must be a finite number"}, kCheckpointFiles},
    {"StateLossSumMissing", edit_state([](nlohmann::json& s) { s["trainer"].erase("loss_sum"); }), kResume, 2,
     {"anatomy_state.json", "trainer.loss_sum must be a finite number, got null"}, kCheckpointFiles},
    {"StateLossScaleNegative", edit_state([](nlohmann::json& s) { s["trainer"]["loss_scale"] = -1; }), kResume, 2,
     {"anatomy_state.json", "trainer.loss_scale must be positive"}, kCheckpointFiles},
    {"StateTrainerNotObject", edit_state([](nlohmann::json& s) { s["trainer"] = 3; }), kResume, 2,
     {"anatomy_state.json", "trainer must be an object"}, kCheckpointFiles},
    {"StateMicroBatchesDisagree", edit_state([](nlohmann::json& s) { s["trainer"]["micro_batches"] = 5; }), kResume, 2,
     {"anatomy_state.json", "micro_batches 5 is not global_step 2 steps of 1 to --gradient-accumulation-steps 1"}, kCheckpointFiles},
    {"StateMalformedJson", write_state("{\"format_version\": 1, \"step\": "), kResume, 2,
     {"anatomy_state.json", "not valid JSON"}, kCheckpointFiles},

    // Model directories: weights in a format anatomy cannot read, weights that are not finite.
    {"OnlyPytorchModelBin",
     [](const std::string& d) {
       copy_text(d);
       fs::create_directory(d + "/m");
       fs::copy_file(trained_run() + "/config.json", d + "/m/config.json");
       spit(d + "/m/pytorch_model.bin", "not really a pickle");
     },
     kCpu + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --model-name-or-path {dir}/m --max-steps 1 --output-dir {dir}/out",
     2, {"--model-name-or-path {dir}/m", "pytorch_model.bin", "no model.safetensors", ".from_pretrained(DIR).save_pretrained(DIR"},
     {"m/config.json", "m/pytorch_model.bin"}},
    {"ModelHoldsNaN", poison_model("bert.encoder.layer.1.output.dense.weight", kNaN),
     kCpu + "--train-file {dir}/s.jsonl --tokenizer " + kTok + " --model-name-or-path {dir}/run --max-steps 1 --output-dir {dir}/out",
     2, {"{dir}/run/model.safetensors", "tensor 'bert.encoder.layer.1.output.dense.weight' holds nan"},
     {"run/model.safetensors"}},
    {"EvalModelHoldsInf",
     poison_model("classifier.weight", std::numeric_limits<float>::infinity()),
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok, 2,
     {"{dir}/run/model.safetensors", "tensor 'classifier.weight' holds inf"}, {"run/model.safetensors"}},
    {"CheckpointHoldsNaN",
     [](const std::string& d) {
       poison_model("classifier.bias", kNaN)(d);  // the run's model, then the same into checkpoint-2
       const std::string ck = d + "/run/checkpoint-2/";
       fs::copy_file(d + "/run/model.safetensors", ck + "model.safetensors", fs::copy_options::overwrite_existing);
       nlohmann::json st = nlohmann::json::parse(slurp(ck + "anatomy_state.json"));  // reseal: only NaN is wrong
       st["files"]["model.safetensors"] = {{"bytes", fs::file_size(ck + "model.safetensors")},
                                           {"checksum", anatomy::checkpoint_file_checksum(ck + "model.safetensors")}};
       spit(ck + "anatomy_state.json", st.dump(2));
     },
     kResume, 2, {"checkpoint-2/model.safetensors", "tensor 'classifier.bias' holds nan"}, {}},
    // Files that are not regular files, wherever a model or checkpoint is read (a FIFO would block).
    {"FifoModelWeights",
     [](const std::string& d) {
       model_with("hidden_size", 128)(d);
       fs::remove(d + "/m/model.safetensors");
       ASSERT_EQ(mkfifo((d + "/m/model.safetensors").c_str(), 0600), 0);
     },
     kTrainModel, 2, {"{dir}/m/model.safetensors", "not a regular file"}, {"m/config.json"}},
    {"FifoConfigJson",
     [](const std::string& d) {
       model_with("hidden_size", 128)(d);
       fs::remove(d + "/m/config.json");
       ASSERT_EQ(mkfifo((d + "/m/config.json").c_str(), 0600), 0);
     },
     kTrainModel, 2, {"{dir}/m/config.json", "not a regular file"}, {"m/model.safetensors"}},
    {"FifoTrainerState",
     [](const std::string& d) {
       copy_run(d);
       fs::remove(d + "/run/checkpoint-2/anatomy_state.json");
       ASSERT_EQ(mkfifo((d + "/run/checkpoint-2/anatomy_state.json").c_str(), 0600), 0);
     },
     kResume, 2, {"checkpoint-2/anatomy_state.json", "not a regular file"}, {"run/checkpoint-2/model.safetensors"}},

    // Damaged model files (held before issue 13; kept here so they stay held).
    {"ModelWeightsTruncated",
     [](const std::string& d) {
       model_with("hidden_size", 128)(d);
       fs::resize_file(d + "/m/model.safetensors", 300000);
     },
     kTrainModel, 2, {"{dir}/m/model.safetensors", "file truncated?"}, {"m/config.json"}},
    {"ConfigNotJson",
     [](const std::string& d) {
       model_with("hidden_size", 128)(d);
       spit(d + "/m/config.json", "{\"hidden_size\": 128,");
     },
     kTrainModel, 2, {"{dir}/m/config.json: not valid JSON at byte"}, {"m/config.json"}},
    {"ConfigFieldZero", model_with("hidden_size", 0), kTrainModel, 2,
     {"{dir}/m/config.json: field 'hidden_size' must be a positive integer, got 0"}, {"m/config.json"}},

    // Token caches damaged after they were written: named, rebuilt from the text, sound after.
    {"TokenCacheBitFlip", damaged_cache([](std::string& b) { b[b.size() / 2] ^= 0x10; }), kTrainText, 0,
     {"token cache {dir}/s.jsonl.", "fails its checksum (damaged); rebuilt it from {dir}/s.jsonl"}, {"s.jsonl"},
     cache_is_sound},
    {"TokenCacheTruncated", damaged_cache([](std::string& b) { b.resize(40); }), kTrainText, 0,
     {"token cache {dir}/s.jsonl.", "is shorter than its header; rebuilt it from {dir}/s.jsonl"}, {"s.jsonl"},
     cache_is_sound},
    {"TokenCacheCutShort", damaged_cache([](std::string& b) { b.resize(b.size() - 100); }), kTrainText, 0,
     {"token cache {dir}/s.jsonl.", "; rebuilt it from {dir}/s.jsonl"}, {"s.jsonl"}, cache_is_sound},

    // Eval on a model whose finite weights still overflow the logits: no accuracy from them.
    {"EvalLogitsOverflow", poison_model("classifier.weight", 3e38f, /*whole=*/true),
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok, 2,
     {"non-finite logit", "refusing to report loss or accuracy"}, {"run/model.safetensors"}},

    // Eval results never replace the model's own or an earlier evaluation unasked.
    {"EvalOutputIsModelDir", copy_run,
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok +
         " --output-dir {dir}/run",
     2, {"--output-dir {dir}/run is the model's directory"}, {"run/model.safetensors", "run/train_results.json"}},
    {"EvalOutputHoldsAnEvaluation",
     [](const std::string& d) {
       copy_run(d);
       fs::create_directory(d + "/ev");
       spit(d + "/ev/eval_results.json", "{\"eval_accuracy\": 0.5}");
     },
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok +
         " --output-dir {dir}/ev",
     2, {"--output-dir {dir}/ev already holds an evaluation (eval_results.json)", "--overwrite-output-dir"},
     {"ev/eval_results.json"}},
    {"EvalOutputIsAnotherTrainingRun",  // said as what it is
     [](const std::string& d) {
       copy_run(d);
       fs::copy(d + "/run", d + "/run2", fs::copy_options::recursive);
       spit(d + "/run2/eval_results.json", "{\"eval_accuracy\": 0.5}");
     },
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok +
         " --output-dir {dir}/run2",
     2, {"--output-dir {dir}/run2 already holds a training run's evaluation (eval_results.json)"},
     {"run2/eval_results.json", "run2/train_results.json"}},
    {"EvalOverwriteOutputDir",
     [](const std::string& d) {
       copy_run(d);
       fs::create_directory(d + "/ev");
       spit(d + "/ev/eval_results.json", "{\"eval_accuracy\": 0.5}");
     },
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok +
         " --output-dir {dir}/ev --overwrite-output-dir",
     0, {"Results: {dir}/ev/eval_results.json"}, {"run/model.safetensors"},
     [](const std::string& d) { EXPECT_NE(slurp(d + "/ev/eval_results.json").find("eval_loss"), std::string::npos); }},
    // Into a training run's directory: its all_results.json takes the new eval_ keys (save_metrics
    // combined=True), its train_ keys stay.
    {"EvalOverwriteIntoARunUpdatesAllResults",
     [](const std::string& d) {
       copy_run(d);
       fs::create_directory(d + "/ev");
       spit(d + "/ev/eval_results.json", "{\"eval_accuracy\": 0.5}");
       spit(d + "/ev/all_results.json", "{\"eval_accuracy\": 0.5, \"eval_loss\": 9.0, \"train_loss\": 1.5}");
     },
     "eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " + kTok +
         " --output-dir {dir}/ev --overwrite-output-dir",
     0, {"Results: {dir}/ev/eval_results.json"}, {"run/model.safetensors"},
     [](const std::string& d) {
       const auto ev = nlohmann::json::parse(slurp(d + "/ev/eval_results.json"));
       const auto all = nlohmann::json::parse(slurp(d + "/ev/all_results.json"));
       EXPECT_EQ(all.at("eval_loss"), ev.at("eval_loss"));
       EXPECT_EQ(all.at("eval_accuracy"), ev.at("eval_accuracy"));
       EXPECT_EQ(all.at("train_loss"), 1.5);
     }},

    // Sizes: refused by the planner before anything is allocated, naming what to lower; never a
    // wrapped (negative or "fitting") figure, never bad_alloc.
    {"PlanBatchOverflows", [](const std::string&) {},
     "plan --preset bert-tiny --per-device-train-batch-size 1000000000000000 --seq-len 128", 2,
     {"--per-device-train-batch-size 1000000000000000 is out of range", "[1, 1048576]"}, {}},
    {"PlanBatchBeyondHostMemory", [](const std::string&) {},
     "plan --device cpu --preset bert-tiny --per-device-train-batch-size 1048576 --seq-len 128", 2,
     {"--per-device-train-batch-size 1048576 with --max-seq-length 128: the plan needs", "of memory; lower --per-device-train-batch-size"},
     {}},
    {"TrainBatchBeyondHostMemory", [](const std::string&) {},
     kTrain + "--num-samples 64 --per-device-train-batch-size 1048576 --max-steps 1 --output-dir {dir}/out", 2,
     {"--per-device-train-batch-size 1048576 with --max-seq-length 32: the plan needs", "of memory; lower --per-device-train-batch-size"},
     {}},
    {"TrainBatchOverflows", [](const std::string&) {},
     kTrain + "--num-samples 64 --per-device-train-batch-size 9223372036854775807 --max-steps 1 --output-dir {dir}/out", 2,
     {"--per-device-train-batch-size 9223372036854775807 is out of range", "[1, 1048576]"}, {}},
    {"NumSamplesBeyondHostMemory", [](const std::string&) {},
     kTrain + "--num-samples 1000000000000 --max-steps 1 --output-dir {dir}/out", 2,
     {"--num-samples 1000000000000 is out of range", "[1, 100000000]"}, {}},
    {"ConfigMaxPositionsOverflow", model_with("max_position_embeddings", 10000000000000), kTrainModel, 2,
     {"{dir}/m/config.json", "max_position_embeddings 10000000000000"}, {"m/config.json"}},
    {"ConfigVocabOverflow", model_with("vocab_size", 4000000000000000000), kTrainModel, 2,
     {"{dir}/m/config.json", "vocab_size 4000000000000000000"}, {"m/config.json"}},
    {"ConfigMaxPositionsBeyondHostMemory", model_with("max_position_embeddings", 1000000000), kTrainModel, 2,
     {"max_position_embeddings 1000000000 in config.json", "lower that field"}, {"m/config.json"}},
    {"EvalMaxPositionsBeyondHostMemory", model_with("max_position_embeddings", 1000000000), kEvalModel, 2,
     {"max_position_embeddings 1000000000 in config.json", "lower that field"}, {"m/config.json"}},
    // A .txt file (run_mlm.py's lines) for a classifier: said, with what a classifier reads.
    {"TxtTrainFileWithoutTaskMlm", [](const std::string& d) { spit(d + "/t.txt", "a line of text\nanother\n"); },
     kTrain + "--train-file {dir}/t.txt --tokenizer " + kTok + " --max-steps 1 --output-dir {dir}/out", 2,
     {"--train-file {dir}/t.txt: a .txt file is lines of text, read for --task mlm"}, {}},
    // An evaluation file without the label column: the two ways on are said.
    {"EvalFileWithoutLabels",
     [](const std::string& d) {
       model_with("max_position_embeddings", 512)(d);
       spit(d + "/s.jsonl", "{\"text\": \"a fine film\"}\n{\"text\": \"a dull one\"}\n");
     },
     kEvalModel, 2,
     {"{dir}/s.jsonl:1: no field 'label'", "--label-column-name names the labels' column, --label-column \"\" predicts"},
     {}},
    {"EvalBatchBeyondHostMemory", model_with("hidden_size", 128),
     kEvalModel + " --max-seq-length 32 --per-device-eval-batch-size 1048576", 2,
     {"--per-device-eval-batch-size 1048576 with --max-seq-length 32", "lower --per-device-eval-batch-size"}, {}},
};

std::string file_hash(const std::string& path) { return std::to_string(std::hash<std::string>{}(slurp(path))); }

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BadInputs : public ::testing::TestWithParam<Case> {};

// An output directory that cannot be made is refused before the evaluation runs, not after it.
TEST(BadInputsEval, OutputUnderAFileIsRefusedBeforeEvaluating) {
  const std::string dir = anatomy::testing_cli::fresh_dir("anatomy_bad_eval_output_file");
  copy_run(dir);
  spit(dir + "/afile", "x");
  const CmdResult r = run(expand("eval --device cpu --model-name-or-path {dir}/run --eval-file {dir}/s.jsonl --tokenizer " +
                                     kTok + " --output-dir {dir}/afile/sub",
                                 dir));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find(expand("anatomy: error: --output-dir {dir}/afile/sub: {dir}/afile is not a directory", dir)),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("eval_loss"), std::string::npos) << r.output;  // nothing was evaluated
}

// A run's best checkpoint is recorded as the path the run named its directory by; resumed from
// another working directory (or after a move), that path named nothing, rotation deleted the
// best checkpoint, and loading it at the end failed. It is one of --output-dir's own.
TEST(Resume, TheBestCheckpointIsTheOutputDirectorysOwn) {
  const std::string dir = anatomy::testing_cli::fresh_dir("anatomy_resume_best_moved");
  copy_text(dir);
  const std::string args = kTrain + "--train-file {dir}/s.jsonl --validation-file {dir}/s.jsonl --tokenizer " + kTok +
                           " --learning-rate 0 --eval-strategy steps --eval-steps 1 --save-strategy steps --save-steps 1"
                           " --save-total-limit 1 --load-best-model-at-end --output-dir {dir}/run";
  const CmdResult first = run(expand(args + " --max-steps 3", dir));
  ASSERT_EQ(first.status, 0) << first.output;
  // Without learning, every evaluation ties and the first stays the best.
  const std::string state = dir + "/run/checkpoint-3/anatomy_state.json";
  nlohmann::json st = nlohmann::json::parse(slurp(state));
  ASSERT_EQ(st["trainer"]["best_model_checkpoint"], dir + "/run/checkpoint-1");
  st["trainer"]["best_model_checkpoint"] = "elsewhere/checkpoint-1";
  spit(state, st.dump());
  // Passed over with a warning that says why: a newer checkpoint that is not complete.
  fs::create_directory(dir + "/run/checkpoint-9");
  const CmdResult resumed = run(expand(args + " --max-steps 5 --resume-from-checkpoint true", dir));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("anatomy: warning: passing over checkpoint-9 ("), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/run/checkpoint-3"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoint-1/model.safetensors"));
  const nlohmann::json res = nlohmann::json::parse(slurp(dir + "/run/train_results.json"));
  EXPECT_EQ(res["best_model_checkpoint"], dir + "/run/checkpoint-1");
  EXPECT_EQ(slurp(dir + "/run/checkpoint-1/model.safetensors"), slurp(dir + "/run/model.safetensors"));
  // Resumed into another directory: the best is the one beside the checkpoint resumed from.
  std::string other = args + " --max-steps 6 --resume-from-checkpoint {dir}/run/checkpoint-5";
  other.replace(other.find("--output-dir {dir}/run"), std::string("--output-dir {dir}/run").size(), "--output-dir {dir}/other");
  const CmdResult moved = run(expand(other, dir));
  ASSERT_EQ(moved.status, 0) << moved.output;
  EXPECT_EQ(nlohmann::json::parse(slurp(dir + "/other/train_results.json"))["best_model_checkpoint"],
            dir + "/run/checkpoint-1");
  // Its log goes on from the checkpoint's (trainer_state.json), though this directory had no
  // metrics.jsonl to read it from: steps 1..5's evaluations, then step 6's.
  int evals = 0;
  const nlohmann::json hf = nlohmann::json::parse(slurp(dir + "/other/trainer_state.json"));
  for (const auto& e : hf["log_history"]) evals += e.contains("eval_loss");
  EXPECT_GE(evals, 6);
}

// A checkpoint of an older version (no loss_steps: its losses were sums over samples) resumes,
// its sums made means of steps (Note [loss per step]), when its schedule is this version's.
TEST(Resume, ACheckpointOfTheVersionBeforeResumes) {
  const std::string dir = anatomy::testing_cli::fresh_dir("anatomy_resume_older_state");
  copy_text(dir);
  const std::string args = kTrain + "--train-file {dir}/s.jsonl --tokenizer " + kTok +
                           " --save-strategy steps --save-steps 1 --logging-steps 2 --output-dir {dir}/run";
  ASSERT_EQ(run(expand(args + " --max-steps 3", dir)).status, 0);
  const std::string state = dir + "/run/checkpoint-3/anatomy_state.json";
  nlohmann::json st = nlohmann::json::parse(slurp(state));
  st["trainer"].erase("loss_steps");
  st["trainer"].erase("last_step_loss");
  spit(state, st.dump());
  const CmdResult resumed = run(expand(args + " --max-steps 5 --resume-from-checkpoint latest", dir));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const double loss = nlohmann::json::parse(slurp(dir + "/run/train_results.json"))["train_loss"].get<double>();
  EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
}

TEST_P(BadInputs, RefusedCleanly) {
  const Case& c = GetParam();
  const std::string dir = anatomy::testing_cli::fresh_dir(std::string("anatomy_bad_") + c.name);
  c.build(dir);
  if (::testing::Test::HasFatalFailure()) return;
  std::map<std::string, std::string> before;
  for (const std::string& f : c.unchanged) {
    ASSERT_TRUE(fs::is_regular_file(dir + "/" + f)) << f;
    before[f] = file_hash(dir + "/" + f);
  }
  const CmdResult r = run(expand(c.args, dir));
  EXPECT_EQ(r.status, c.status) << r.output;
  for (const std::string& s : c.says) EXPECT_NE(r.output.find(expand(s, dir)), std::string::npos) << s << "\n" << r.output;
  if (c.status != 0) {
    EXPECT_NE(r.output.find("anatomy: error: "), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("json.exception"), std::string::npos) << r.output;
  }
  for (const std::string& f : c.unchanged) EXPECT_EQ(file_hash(dir + "/" + f), before[f]) << f << " changed";
  if (c.after) c.after(dir);
}

INSTANTIATE_TEST_SUITE_P(Table, BadInputs, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace

// ---- the planner's arithmetic, below the command line ------------------------------------------

namespace anatomy {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(PlannerSizes, RefusedBeforeTheyWrapAndTheSearchesNeverThrow) {
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  PlanInput in{cfg, {int64_t{1} << 50, 128, DType::F32, CheckpointPolicy::None, true}, OptimizerKind::AdamW, Device::CUDA};
  const std::string e = error_of([&] { plan_memory(in); });
  EXPECT_NE(e.find("--per-device-train-batch-size 1125899906842624 with --max-seq-length 128"), std::string::npos) << e;
  EXPECT_NE(e.find("more than any machine holds; lower --per-device-train-batch-size (or --max-seq-length)"), std::string::npos) << e;
  in.shape.training = false;  // an inference plan names `anatomy eval`'s flags
  const std::string ev = error_of([&] { plan_memory(in); });
  EXPECT_NE(ev.find("lower --per-device-eval-batch-size (or --max-seq-length)"), std::string::npos) << ev;
  in.shape.training = true;
  // The searches treat such sizes as "does not fit", on either device, and list only what fits.
  const int64_t gib = int64_t{1} << 30;
  for (Device d : {Device::CUDA, Device::CPU}) {
    in.device = d;
    int64_t best = 0;
    EXPECT_NO_THROW(best = largest_batch_that_fits(in, gib, 0, int64_t{1} << 40));
    EXPECT_GT(best, 0);
    in.shape.max_batch = best;
    EXPECT_LE(plan_memory(in).total(), gib);
    in.shape.max_batch = int64_t{1} << 50;
    std::vector<Lever> levers;
    EXPECT_NO_THROW(levers = levers_that_fit(in, gib, 0, int64_t{1} << 40));
    for (const Lever& l : levers) EXPECT_LE(l.total, gib) << l.description;
  }
}

TEST(PlannerSizes, PlansBeyondACapacityNameWhatToLower) {
  PlanInput in{BertConfig::preset("bert-tiny"), {1024, 128, DType::F32, CheckpointPolicy::None, true}, OptimizerKind::AdamW,
               Device::CUDA};
  const MemoryPlan p = plan_memory(in);
  const int64_t model = p.bytes[Category::Weights] + p.bytes[Category::Gradients] + p.bytes[Category::OptimizerState];
  ASSERT_LT(model, p.total());
  // Room for the model but not the batch: the batch flags; not even for the model: its field.
  const std::string batch = error_of([&] { refuse_plan_beyond(in, p, model, "the test has less"); });
  EXPECT_NE(batch.find("--per-device-train-batch-size 1024 with --max-seq-length 128: the plan needs"), std::string::npos) << batch;
  EXPECT_NE(batch.find("but the test has less; lower --per-device-train-batch-size (or --max-seq-length)"), std::string::npos) << batch;
  const std::string whole = error_of([&] { refuse_plan_beyond(in, p, model - 1, "the test has less"); });
  EXPECT_NE(whole.find("the model alone (4386178 parameters, most of them from vocab_size 30522 in config.json)"),
            std::string::npos) << whole;
  EXPECT_NE(whole.find("; lower that field or use a smaller model"), std::string::npos) << whole;
  EXPECT_EQ(error_of([&] { refuse_plan_beyond(in, p, p.total(), "enough"); }), "(no error)");
  // A preset has no config.json to lower a field in; CPU ranks share the machine's memory.
  PlanInput preset = in;
  preset.config_source = "--preset bert-tiny";
  preset.device = Device::CPU;
  preset.world_size = 4;
  const std::string named = error_of([&] { refuse_plan_beyond(preset, p, model - 1, "the test has less"); });
  EXPECT_NE(named.find("vocab_size 30522 in --preset bert-tiny) needs"), std::string::npos) << named;
  EXPECT_NE(named.find("; use a smaller model or fewer ranks"), std::string::npos) << named;
  // On the CPU the capacity is the machine's memory.
  in.device = Device::CPU;
  in.shape.max_batch = int64_t{1} << 30;
  ASSERT_GT(static_cast<double>(in.shape.max_batch) * 128 * 128 * 4, static_cast<double>(host_memory_bytes()));
  const std::string host = error_of([&] { plan_memory(in); });
  EXPECT_NE(host.find("of memory; lower --per-device-train-batch-size (or --max-seq-length)"), std::string::npos) << host;
}

TEST(ConfigSizes, ParameterCountBoundedNamingTheField) {
  BertConfig c = BertConfig::preset("bert-tiny");
  EXPECT_EQ(c.largest_field(), "vocab_size 30522");
  c.max_position_embeddings = 10'000'000'000'000;
  const std::string e = error_of([&] { c.validate("m/config.json"); });
  EXPECT_NE(e.find("m/config.json: the model would have about"), std::string::npos) << e;
  EXPECT_NE(e.find("(most of them from max_position_embeddings 10000000000000)"), std::string::npos) << e;
  c = BertConfig::preset("bert-large");
  EXPECT_EQ(c.largest_field(), "num_hidden_layers 24 x (hidden_size 1024, intermediate_size 4096)");
  EXPECT_NEAR(static_cast<double>(c.approximate_parameters()), static_cast<double>(c.num_parameters()),
              1e-3 * static_cast<double>(c.num_parameters()));
}

}  // namespace
}  // namespace anatomy
