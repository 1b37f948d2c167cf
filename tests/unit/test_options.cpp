// The options table (src/cli): every flag in both spellings and both forms, values converted and
// range-checked in one place, Trainer arguments refused by name, a JSON file of arguments, and
// the defaults that train, eval and plan share. In-process: parse_args throws what the CLI prints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/dirs.h"
#include "cli/parse.h"
#include "data/csv.h"
#include "optim/optimizer.h"

using namespace anatomy;
using namespace anatomy::cli;

namespace {

std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// A value each option accepts: the low end of its range (or inside an open one), a choice, a size.
std::string sample(const OptionSpec& s) {
  switch (s.type) {
    case OptType::Bool:  // the default: some take only it (--pad-to-max-length false)
      return std::string(s.default_text) == "false" ? "false" : "true";
    case OptType::Int: return std::to_string(static_cast<long long>(s.lo_open ? s.lo + 1 : s.lo));
    case OptType::Float: return s.lo_open ? std::to_string((s.lo + s.hi) / 2) : std::to_string(s.lo);
    case OptType::Text: return std::string(s.name) == "text-column-delimiter" ? " " : "x";  // takes a space only
    case OptType::Choice: return s.choices.front().first;
    case OptType::Size: return "16GiB";
  }
  return "";
}

Command first_command(unsigned mask) {
  for (Command c : {kTrain, kEval, kPlan})
    if (mask & c) return c;
  return kTrain;
}

// The message of the UsageError that parsing `args` throws ("" when it parses).
std::string error_of(Command cmd, const std::vector<std::string>& args) {
  try {
    parse_args(cmd, args);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Options, EveryFlagInBothSpellingsAndBothForms) {
  for (const OptionSpec& s : options()) {
    const Command cmd = first_command(s.commands);
    std::vector<std::string> spellings = {s.name, underscored(s.name)};
    for (const char* a : s.aliases) spellings.insert(spellings.end(), {a, underscored(a)});
    for (const std::string& name : spellings)
      for (bool inline_form : {false, true}) {
        const std::vector<std::string> args =
            inline_form ? std::vector<std::string>{"--" + name + "=" + sample(s)} : std::vector<std::string>{"--" + name, sample(s)};
        SCOPED_TRACE(args[0]);
        RunArgs r;
        ASSERT_NO_THROW(r = parse_args(cmd, args));
        EXPECT_TRUE(r.was_given(s.name));
      }
  }
}

// run_glue.py's data flags: the value anatomy's behaviour matches is accepted, the other refused
// naming the flag.
TEST(Options, RunGlueDataFlagsAcceptWhatAnatomyDoes) {
  EXPECT_EQ(error_of(kTrain, {"--pad_to_max_length", "False", "--overwrite_cache", "--use_fast_tokenizer", "True",
                              "--shuffle_train_dataset"}),
            "");
  EXPECT_NE(error_of(kTrain, {"--pad_to_max_length"}).find("--pad-to-max-length true: not supported by anatomy"),
            std::string::npos);
  EXPECT_NE(error_of(kEval, {"--use_fast_tokenizer", "false"}).find("--use-fast-tokenizer false: not supported"),
            std::string::npos);
}

// Note [run_glue.py's text columns] applies only when no text column flag was given.
TEST(Options, TextColumnsGivenByAnyOfTheirFlags) {
  EXPECT_FALSE(parse_args(kTrain, {"--train_file", "x.csv"}).text_columns_given());
  EXPECT_TRUE(parse_args(kTrain, {"--text_column_name", "sentence"}).text_columns_given());
  EXPECT_TRUE(parse_args(kTrain, {"--text-column-names", "a,b"}).text_columns_given());
  EXPECT_TRUE(parse_args(kEval, {"--text-pair-column", "b"}).text_columns_given());
  EXPECT_TRUE(parse_args(kTrain, {"--text-column", "text"}).text_columns_given());  // even the default, when named
}

TEST(Options, TrainerSpellingsMeanWhatTheTrainerMeans) {
  RunArgs r = parse_args(kTrain, {"--per_device_train_batch_size", "3", "--num_train_epochs=0.5", "--warmup_ratio", "0.1",
                                  "--lr_scheduler_type", "constant_with_warmup", "--optim", "adamw_torch_fused",
                                  "--evaluation_strategy", "epoch", "--use_cpu", "--bf16", "false", "--gradient_checkpointing",
                                  "--seed", "7", "--overwrite_output_dir", "--skip_nonfinite_steps", "--report_to", "none"});
  EXPECT_EQ(r.train.per_device_train_batch_size, 3);
  EXPECT_EQ(r.train.train_epochs, 0.5);
  EXPECT_EQ(r.train.num_train_epochs, 1);
  EXPECT_FLOAT_EQ(r.train.warmup_ratio, 0.1);
  EXPECT_EQ(r.train.lr_scheduler_type, Schedule::Constant);
  EXPECT_EQ(r.optim, "adamw");
  EXPECT_EQ(r.train.eval_strategy, Cadence::Epoch);
  EXPECT_EQ(r.train.device, DeviceChoice::Cpu);
  EXPECT_EQ(r.bf16, 0);
  EXPECT_EQ(r.checkpointing, "layer");
  EXPECT_EQ(r.train.seed, 7u);
  EXPECT_TRUE(r.train.overwrite_output_dir);
  EXPECT_TRUE(r.train.skip_nonfinite_steps);
  EXPECT_EQ(r.report_to, "none");
  RunArgs quiet = parse_args(kTrain, {"--logging_strategy", "no", "--preset", "bert-tiny"});
  EXPECT_EQ(finish_train_args(quiet, kTrain, false).logging_steps, 0);
  // Fractional epochs: ceil(epochs x steps per epoch), as the Trainer rounds them.
  EXPECT_EQ(r.train.total_steps(10), 5);
  EXPECT_EQ(r.train.warmup(r.train.total_steps(10)), 1);  // ceil(0.1 x 5)
  RunArgs e = parse_args(kEval, {"--no-skip-padding", "--eval_file", "f.jsonl", "--batch-size", "5"});
  EXPECT_FALSE(e.skip_padding);
  EXPECT_EQ(e.train.validation_file, "f.jsonl");
  EXPECT_EQ(e.train.per_device_eval_batch_size, 5);
}

// Out of range, malformed or empty: one line naming the flag and what is allowed.
TEST(Options, RangeErrorsNameTheFlagAndTheRange) {
  struct Case {
    Command cmd;
    std::vector<std::string> args;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {kTrain, {"--adam-beta1", "1.5"}, "--adam-beta1 1.5 is out of range: allowed [0, 1)"},
      {kTrain, {"--adam-epsilon", "-1"}, "--adam-epsilon -1 is out of range: allowed [0, 1]"},
      {kTrain, {"--weight-decay", "-5"}, "--weight-decay -5 is out of range: allowed [0, 10]"},
      {kTrain, {"--sgd-momentum", "5"}, "--sgd-momentum 5 is out of range: allowed [0, 1)"},
      {kTrain, {"--threads", "-1"}, "--threads -1 is out of range: allowed [0, 4096]"},
      {kEval, {"--threads", "70000"}, "--threads 70000 is out of range: allowed [0, 4096]"},
      {kTrain, {"--nproc-per-node", "0"}, "--nproc-per-node 0 is out of range: allowed [1, 1024]"},
      {kPlan, {"--nproc_per_node=-4"}, "--nproc-per-node -4 is out of range: allowed [1, 1024]"},
      {kTrain, {"--per-device-train-batch-size", "-1"}, "allowed [1, 1048576] or auto"},
      {kTrain, {"--per-device-train-batch-size", "eight"}, "--per-device-train-batch-size: expected an integer"},
      {kTrain, {"--num-samples", "1e12"}, "--num-samples: expected an integer in [1, 100000000]"},
      {kTrain, {"--num-train-epochs", "0"}, "--num-train-epochs 0 is out of range: allowed (0, 1000000]"},
      {kTrain, {"--learning-rate", "nan"}, "--learning-rate: expected a number"},
      {kTrain, {"--warmup-ratio", "1.5"}, "--warmup-ratio 1.5 is out of range: allowed [0, 1]"},
      {kTrain, {"--validation-split", "1"}, "--validation-split 1 is out of range: allowed [0, 1)"},
      {kTrain, {"--output-dir", ""}, "--output-dir: must not be empty"},
      {kTrain, {"--bf16", "maybe"}, "--bf16: expected true or false"},
      {kTrain, {"--optim", "lion"}, "--optim lion: anatomy does not have this; expected one of adamw_torch"},
      {kTrain, {"--lr-scheduler-type", "cosine_with_min_lr"}, "--lr-scheduler-type cosine_with_min_lr: anatomy does not have this"},
      {kTrain, {"--report-to", "wandb"}, "--report-to wandb: anatomy does not have this; expected one of jsonl, none"},
      {kPlan, {"--gpu-memory", "16"}, "--gpu-memory 16: a size needs its unit, e.g. 16GiB, 80GB or 16000MiB"},
      {kPlan, {"--gpu-memory", "16XB"}, "--gpu-memory: unknown unit 'XB'"},
      {kTrain, {"--max-steps"}, "--max-steps needs a value"},
      {kTrain, {"stray"}, "unexpected argument 'stray'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args[0]);
    const std::string msg = error_of(c.cmd, c.args);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Options, MisspeltFlagsSuggestTheNearest) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--per_device_train_bach_size", "did you mean --per-device-train-batch-size?"},
      {"--learning-rat", "did you mean --learning-rate?"},
      {"--gradient-acumulation-steps", "did you mean --gradient-accumulation-steps?"},
      {"--ouput-dir", "did you mean --output-dir?"},
  };
  for (const auto& [arg, expect] : cases) {
    const std::string msg = error_of(kTrain, {arg, "1"});
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  }
  EXPECT_NE(error_of(kTrain, {"--zzzzqqqq", "1"}).find("unknown flag --zzzzqqqq"), std::string::npos);
}

// Every TrainingArguments field the table does not take is refused by name, never ignored.
TEST(Options, EveryOtherTrainingArgumentIsRefusedByName) {
  int refused = 0;
  for (const char* field : training_arguments_fields()) {
    std::string dashed = field;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    const bool taken = std::any_of(options().begin(), options().end(), [&](const OptionSpec& s) {
      return (s.commands & kTrain) &&
             (dashed == s.name || std::any_of(s.aliases.begin(), s.aliases.end(), [&](const char* a) { return dashed == a; }));
    });
    if (taken) continue;
    SCOPED_TRACE(field);
    const NeutralValue* any = neutral_value(field, "1");
    if (any != nullptr && std::string(any->value) == "*") {  // accepted whatever its value, and said
      const RunArgs r = parse_args(kTrain, {std::string("--") + field, "1"});
      ASSERT_EQ(r.notes.size(), 1u);
      EXPECT_NE(r.notes[0].find("--" + dashed + " 1: accepted, it changes nothing here"), std::string::npos) << r.notes[0];
      continue;
    }
    // A value that asks for something (a field whose default is true is neutral at 1).
    std::string probe = "1";
    for (const char* v : {"1", "0", "7"})
      if (neutral_value(field, v) == nullptr) {
        probe = v;
        break;
      }
    const std::string msg = error_of(kTrain, {std::string("--") + field, probe});
    EXPECT_NE(msg.find("--" + dashed + ": "), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("not supported by anatomy") != std::string::npos ||
                msg.find("a TrainingArguments field that anatomy does not do") != std::string::npos)
        << msg;
    ++refused;
  }
  EXPECT_GT(refused, 50);
  EXPECT_NE(error_of(kTrain, {"--push_to_hub"}).find("--push-to-hub: not supported by anatomy: anatomy does not upload"),
            std::string::npos);
  EXPECT_NE(error_of(kEval, {"--preset", "bert-tiny"}).find("not an option of `anatomy eval`"), std::string::npos);
}

// A refused Trainer argument given a value that asks for nothing anatomy does not do (the
// Trainer's default, passed explicitly) is accepted with a note; any other value is refused.
TEST(Options, NeutralTrainerValuesAreAcceptedAndSaid) {
  const RunArgs r = parse_args(kTrain, {"--push_to_hub", "False", "--torch_compile=false", "--label_smoothing_factor",
                                        "0.0", "--dataloader_num_workers", "4", "--local_rank", "-1",
                                        "--per_device_train_batch_size", "3"});
  EXPECT_EQ(r.train.per_device_train_batch_size, 3);  // the flags after them still parse
  ASSERT_EQ(r.notes.size(), 5u);
  EXPECT_EQ(r.notes[0], "--push-to-hub False: accepted, it changes nothing here: nothing is uploaded");
  EXPECT_NE(r.notes[3].find("--dataloader-num-workers 4: accepted"), std::string::npos) << r.notes[3];
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--push_to_hub"},
                                              std::vector<std::string>{"--push_to_hub", "yes"},
                                              std::vector<std::string>{"--label_smoothing_factor", "0.1"},
                                              std::vector<std::string>{"--torch_compile", "maybe"}})
    EXPECT_NE(error_of(kTrain, bad).find("not supported by anatomy"), std::string::npos) << bad[0];
  // The Trainer hides a non-finite logged loss by default; anatomy stops at one, and says so for
  // the default (every TrainingArguments dump carries it).
  EXPECT_EQ(parse_args(kTrain, {"--logging_nan_inf_filter", "false"}).notes.at(0),
            "--logging-nan-inf-filter false: accepted, it changes nothing here: losses are logged as they are");
  EXPECT_NE(parse_args(kTrain, {"--logging_nan_inf_filter", "true"}).notes.at(0).find("it stops the run"),
            std::string::npos);
  // From a JSON file of arguments as well.
  const std::string dir = testing_dirs::fresh_dir("options_neutral_json");
  std::ofstream(dir + "/args.json") << R"({"push_to_hub": false, "dataloader_pin_memory": true, "num_train_epochs": 2})";
  const RunArgs j = parse_args(kTrain, {dir + "/args.json"});
  EXPECT_EQ(j.notes.size(), 2u);
  EXPECT_EQ(j.train.num_train_epochs, 2);
}

// run_mlm.py's and run_ner.py's own arguments: --line_by_line is taken (Note [grouped texts]
// otherwise); those whose value changes nothing are noted; the others refused with the way.
TEST(Options, RunMlmAndRunNerArguments) {
  EXPECT_FALSE(parse_args(kTrain, {}).train.line_by_line);
  EXPECT_TRUE(parse_args(kTrain, {"--line_by_line"}).train.line_by_line);
  EXPECT_TRUE(parse_args(kEval, {"--line_by_line", "true"}).train.line_by_line);
  const RunArgs r = parse_args(kTrain, {"--preprocessing_num_workers", "4", "--label_all_tokens", "false",
                                        "--return_entity_level_metrics", "False"});
  ASSERT_EQ(r.notes.size(), 3u);
  EXPECT_NE(r.notes[0].find("--preprocessing-num-workers 4: accepted, it changes nothing here"), std::string::npos);
  EXPECT_NE(error_of(kTrain, {"--label_all_tokens", "true"}).find("each word's first sub-token carries its tag"),
            std::string::npos);
  // Note [run_mlm.py's validation head]: 5 for a masked LM without other validation, else 0;
  // refused off --task mlm and beside --validation-split, unused (said) beside --validation-file.
  const auto finished = [](const std::vector<std::string>& args) {
    RunArgs r = parse_args(kTrain, args);
    const TrainOptions o = finish_train_args(r, kTrain, false);
    return std::make_pair(o.validation_split_percentage, r.notes);
  };
  const auto finish_error = [](const std::vector<std::string>& args) -> std::string {
    try {
      RunArgs r = parse_args(kTrain, args);
      finish_train_args(r, kTrain, false);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(finished({"--task", "mlm"}).first, 5);
  EXPECT_EQ(finished({"--task", "mlm", "--validation_split_percentage", "10"}).first, 10);
  EXPECT_EQ(finished({"--task", "mlm", "--validation_split_percentage", "0"}).first, 0);
  EXPECT_EQ(finished({"--task", "mlm", "--validation-split", "0.1"}).first, 0);
  EXPECT_EQ(finished({}).first, 0);
  EXPECT_NE(finish_error({"--validation_split_percentage", "5"}).find("is run_mlm.py's: add --task mlm"),
            std::string::npos);
  EXPECT_NE(finish_error({"--task", "mlm", "--validation_split_percentage", "5", "--validation-split", "0.1"})
                .find("give one"), std::string::npos);
  EXPECT_NE(error_of(kTrain, {"--task", "mlm", "--validation_split_percentage", "100"}).find("[0, 99]"), std::string::npos);
  const auto with_file = finished({"--task", "mlm", "--validation_split_percentage", "5", "--validation-file", "v.txt"});
  EXPECT_EQ(with_file.first, 0);
  ASSERT_EQ(with_file.second.size(), 1u);
  EXPECT_NE(with_file.second[0].find("--validation-split-percentage is unused: --validation-file v.txt validates"),
            std::string::npos);
  // run_classification.py's: refused with the way (they were unknown flags), or noted.
  EXPECT_NE(error_of(kTrain, {"--remove_splits", "test"}).find("the splits are the files"), std::string::npos);
  EXPECT_NE(error_of(kTrain, {"--do_regression", "true"}).find("the problem type follows the labels"), std::string::npos);
  EXPECT_EQ(parse_args(kTrain, {"--metric_name", "accuracy"}).notes.size(), 1u);
}

TEST(Options, JsonFileOfArguments) {
  const std::string dir = testing_dirs::fresh_dir("options_json");
  const std::string file = dir + "/args.json";
  std::ofstream(file) << R"({"per_device_train_batch_size": 3, "bf16": false, "report_to": ["none"],
                           "num_train_epochs": 0.5, "evaluation_strategy": "steps", "output_dir": "out",
                           "text_column_names": "premise,hypothesis", "logging_dir": null})";
  RunArgs r = parse_args(kTrain, {file, "--per_device_train_batch_size", "5"});  // flags after the file override it
  EXPECT_EQ(r.train.per_device_train_batch_size, 5);
  EXPECT_EQ(r.bf16, 0);
  EXPECT_EQ(r.report_to, "none");
  RunArgs quiet = parse_args(kTrain, {"--logging_strategy", "no", "--preset", "bert-tiny"});
  EXPECT_EQ(finish_train_args(quiet, kTrain, false).logging_steps, 0);
  EXPECT_EQ(r.train.train_epochs, 0.5);
  EXPECT_EQ(r.train.eval_strategy, Cadence::Steps);
  EXPECT_EQ(r.train.output_dir, "out");
  EXPECT_EQ(joined_columns(r.train.text_column), (std::vector<std::string>{"premise", "hypothesis"}));  // one text
  EXPECT_EQ(r.train.text_pair_column, "");
  std::ofstream(file) << R"({"fsdp": "full_shard"})";
  EXPECT_NE(error_of(kTrain, {file}).find("--fsdp: not supported by anatomy"), std::string::npos);
  std::ofstream(file) << R"({"adam_beta1": 1.5})";
  EXPECT_NE(error_of(kTrain, {file}).find("--adam-beta1 1.5 is out of range"), std::string::npos);
  std::ofstream(file) << R"({"seed": )";
  EXPECT_NE(error_of(kTrain, {file}).find(file + ": not valid JSON"), std::string::npos);
}

// train, eval and plan share one set of defaults: Trainer's batches 8/8 and the examples'
// max_seq_length 128, capped by the model's position table.
TEST(Options, SharedDefaults) {
  for (Command cmd : {kTrain, kPlan}) {
    RunArgs r = parse_args(cmd, {"--preset", "bert-tiny", "--device", "cpu"});
    const TrainOptions o = finish_train_args(r, cmd, false);
    EXPECT_EQ(o.per_device_train_batch_size, 8);
    EXPECT_EQ(o.per_device_eval_batch_size, 8);
    EXPECT_EQ(o.seq_len, 128);
    EXPECT_EQ(o.optim.kind, OptimizerKind::AdamW);
    EXPECT_FLOAT_EQ(o.learning_rate, 5e-5f);
  }
  RunArgs e = parse_args(kEval, {});
  EXPECT_EQ(e.train.per_device_eval_batch_size, 8);
  // ZeRO-1 by default, but 0 for the optimizers whose state it cannot shard (a command that runs
  // on one rank runs on several); a stage given stays as given (and is refused at set-up).
  const auto zero = [](std::vector<std::string> args) {
    RunArgs r = parse_args(kTrain, args);
    return finish_train_args(r, kTrain, false).zero_stage;
  };
  EXPECT_EQ(zero({}), 1);
  EXPECT_EQ(zero({"--optim", "sgd"}), 1);
  EXPECT_EQ(zero({"--optim", "adafactor"}), 0);
  EXPECT_EQ(zero({"--optim", "adamw_8bit"}), 0);
  EXPECT_EQ(zero({"--optim", "adafactor", "--zero-stage", "1"}), 1);
  RunArgs seed = parse_args(kTrain, {"--seed-experiment", "--device", "cpu"});
  const TrainOptions s = finish_train_args(seed, kTrain, false);
  EXPECT_EQ(s.seq_len, 512);
  EXPECT_EQ(s.per_device_train_batch_size, 4);
}

// --warmup-steps takes Trainer 5's values: a whole number of steps, or below 1 the fraction of the
// total steps that --warmup-ratio gives (Trainer 5 has no warmup_ratio of its own).
TEST(Options, WarmupStepsBelowOneIsARatioAsInTrainer5) {
  RunArgs ratio = parse_args(kTrain, {"--warmup_steps", "0.1", "--preset", "bert-tiny"});
  const TrainOptions r = finish_train_args(ratio, kTrain, false);
  EXPECT_EQ(r.warmup_steps, 0);
  EXPECT_FLOAT_EQ(r.warmup_ratio, 0.1);
  EXPECT_EQ(r.warmup(50), 5);  // ceil(0.1 x 50)
  RunArgs steps = parse_args(kTrain, {"--warmup-steps", "12", "--preset", "bert-tiny"});
  const TrainOptions s = finish_train_args(steps, kTrain, false);
  EXPECT_EQ(s.warmup_steps, 12);
  EXPECT_EQ(s.warmup_ratio, 0.0);
  EXPECT_EQ(s.warmup(50), 12);
}

// do_train false is TrainingArguments' default (a dump carries it, with do_eval true when it
// evaluates): said, not refused. ddp_timeout is taken, as the collectives' timeout.
TEST(Options, DoTrainFalseIsSaidAndDdpTimeoutIsTaken) {
  RunArgs r = parse_args(kTrain, {"--do-train", "false", "--do-eval", "--validation-split", "0.1", "--num-samples", "8",
                                  "--ddp-timeout", "1800"});
  finish_train_args(r, kTrain, false);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("--do-train false: accepted as TrainingArguments' default"), std::string::npos);
  EXPECT_EQ(r.ddp_timeout, 1800);
  EXPECT_NE(error_of(kTrain, {"--ddp-timeout", "0"}).find("--ddp-timeout 0 is out of range"), std::string::npos);
}

// The Trainer's get_scheduler builds "constant" without its warm-up whatever the warm-up flags
// say: said, and done alike (it was refused).
TEST(Options, ConstantScheduleIgnoresTheWarmUpAsTheTrainerDoes) {
  RunArgs r = parse_args(kTrain, {"--lr-scheduler-type", "constant", "--warmup-ratio", "0.1", "--num-samples", "8"});
  const TrainOptions o = finish_train_args(r, kTrain, false);
  EXPECT_EQ(o.warmup(100), 0);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("are ignored, as the Trainer ignores them"), std::string::npos) << r.notes.back();
}

// --logging-steps, --eval-steps, --save-steps below 1 are ratios of the total steps, rounded up
// once the total is known (Trainer.train's rule); a ratio that makes --load-best-model-at-end's
// saves miss the evaluations is refused then.
TEST(Options, StepFlagsBelowOneAreRatiosOfTheTotal) {
  RunArgs r = parse_args(kTrain, {"--logging-steps", "0.1", "--eval-steps", "0.25", "--save-steps", "0.5",
                                  "--num-samples", "8"});
  TrainOptions o = finish_train_args(r, kTrain, false);
  o.resolve_step_ratios(30);
  EXPECT_EQ(o.logging_steps, 3);
  EXPECT_EQ(o.eval_steps, 8);  // ceil(7.5)
  EXPECT_EQ(o.save_steps, 15);
  RunArgs w = parse_args(kTrain, {"--logging-steps", "7", "--num-samples", "8"});
  TrainOptions whole = finish_train_args(w, kTrain, false);
  whole.resolve_step_ratios(30);
  EXPECT_EQ(whole.logging_steps, 7);
  // --load-best-model-at-end: the ratios as given must be multiples (to 1e-6), as TrainingArguments
  // checks them; a ratio beside a step count is refused.
  auto best = [](const std::string& eval, const std::string& save) {
    RunArgs b = parse_args(kTrain, {"--eval-strategy", "steps", "--save-strategy", "steps", "--eval-steps", eval,
                                    "--save-steps", save, "--load-best-model-at-end", "--validation-split", "0.1",
                                    "--num-samples", "8"});
    return finish_train_args(b, kTrain, false);
  };
  EXPECT_NO_THROW(best("0.1", "0.2"));
  EXPECT_THROW(best("0.3", "0.5"), Error);
  EXPECT_THROW(best("0.1", "20"), Error);
}

TEST(Options, FlagsThatContradictEachOther) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--bf16", "--fp16"}, "--bf16 and --fp16 exclude each other"},
      {{"--precision", "fp32", "--bf16"}, "--precision fp32 and --bf16 contradict each other"},
      {{"--logging-steps", "2.5"}, "--logging-steps 2.5: a whole number of steps, or a fraction of the total steps below 1"},
      {{"--save-steps", "0"}, "--save-steps 0 is out of range"},
      {{"--line_by_line"}, "--line-by-line is run_mlm.py's: add --task mlm"},
      {{"--text-column-names", "a,b", "--text-pair-column", "c"}, "--text-column-names a,b joins its columns into one text"},
      {{"--text-column-names", "a,b", "--task", "ner"}, "--task token-classification reads one"},
      {{"--mlm_probability", "0.2"}, "--mlm-probability is run_mlm.py's: add --task mlm"},
      {{"--warmup-steps", "0.1", "--warmup-ratio", "0.2"}, "--warmup-steps and --warmup-ratio exclude each other"},
      {{"--warmup-ratio", "0.2", "--warmup-steps", "0.1"}, "--warmup-steps and --warmup-ratio exclude each other"},
      {{"--warmup-steps", "2.5"}, "--warmup-steps 2.5: a whole number of steps, or a fraction of them below 1"},
      {{"--sgd-momentum", "0.9"}, "--sgd-momentum applies to --optim sgd only (this run: --optim adamw"},
      {{"--do-eval"}, "--do-eval needs validation data"},
      {{"--preset", "bert-tiny", "--model-name-or-path", "/tmp"}, "exclude each other"},
      {{"--device", "cpu", "--fp16"}, "--precision fp16 needs a GPU"},
      {{"--data_seed", "3", "--seed", "4"}, "--data-seed 3: anatomy orders the data with --seed (4)"},
  };
  for (const auto& [args, expect] : cases) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--num-samples", "8"});
    SCOPED_TRACE(args[0]);
    std::string msg;
    try {
      RunArgs r = parse_args(kTrain, a);
      finish_train_args(r, kTrain, false);
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  }
}

// The schedules the table offers, against transformers' formulas (lr 1, 10 steps, 2 of warm-up).
TEST(Options, SchedulesAsTransformersDefinesThem) {
  struct Case {
    const char* flag_value;
    int64_t step;
    double expect;
  };
  const std::vector<Case> cases = {
      {"linear", 1, 0.5},      {"linear", 6, 0.5},       {"cosine", 2, 1.0},
      {"cosine", 6, 0.5},      {"cosine", 4, 0.5 * (1 + std::cos(M_PI * 0.25))},
      {"cosine", 10, 0.0},     {"cosine_with_restarts", 6, 0.5},
      {"polynomial", 6, (1 - 1e-7) * 0.5 + 1e-7},        {"polynomial", 11, 1e-7},
      {"constant_with_warmup", 1, 0.5},                  {"constant_with_warmup", 9, 1.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.flag_value) + " step " + std::to_string(c.step));
    RunArgs r = parse_args(kTrain, {"--lr-scheduler-type", c.flag_value});
    EXPECT_NEAR(scheduled_lr(r.train.lr_scheduler_type, 1.0f, c.step, 10, 2), c.expect, 1e-6);
  }
}
