// The options table through the `anatomy` binary: exit statuses (2 for any command line that
// cannot be read, 1 for a plan that does not fit), one-line errors, plan's units and first line,
// a JSON arguments file, and docs/trainer-arguments.md kept equal to `anatomy help --markdown`.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/cli.h"

namespace {

using anatomy::testing_cli::CmdResult;

CmdResult run(const std::string& args) { return anatomy::testing_cli::run_anatomy(args); }

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

// Each bad command line: exit 2, one line, the flag and what is allowed.
TEST(CliOptions, BadCommandLinesExitTwoWithOneLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --adam-beta1 1.5", "--adam-beta1 1.5 is out of range: allowed [0, 1)"},
      {"train --threads 70000", "--threads 70000 is out of range: allowed [0, 4096]"},
      {"train --nproc_per_node=-4", "--nproc-per-node -4 is out of range: allowed [1, 1024]"},
      {"train --per-device-train-batch-size -1", "or auto"},
      {"train --output-dir ''", "--output-dir: must not be empty"},
      {"train --per-device-train-bach-size 4", "did you mean --per-device-train-batch-size?"},
      {"eval --per_device_eval_bath_size 4", "did you mean --per-device-eval-batch-size?"},
      {"train --deepspeed ds.json", "--deepspeed: not supported by anatomy"},
      {"train --torch_empty_cache_steps 3", "--torch-empty-cache-steps: not supported by anatomy: a PyTorch setting"},
      {"plan --gpu-memory 16", "a size needs its unit"},
      {"frobnicate", "unknown command 'frobnicate'"},
  };
  for (const auto& [args, expect] : cases) {
    SCOPED_TRACE(args);
    const CmdResult r = run(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_EQ(lines(r.output), 1u) << r.output;
    EXPECT_NE(r.output.find("anatomy: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << r.output;
  }
}

TEST(CliOptions, HelpListsBothSpellingsAndRanges) {
  const CmdResult r = run("train --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--per-device-train-batch-size int or auto, --batch-size"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("underscores"), std::string::npos) << run("--help").output;
  EXPECT_NE(r.output.find("allowed: [0, 1)"), std::string::npos);
  const CmdResult plan = run("plan --help");
  EXPECT_NE(plan.output.find("--gpu-memory size"), std::string::npos) << plan.output;
}

// `plan`: the device on the first line; sizes with units; a plan that does not fit exits 1 and
// names the lever.
TEST(CliOptions, PlanUnitsFirstLineAndExitStatus) {
  const CmdResult fits = run("plan --preset bert-tiny --gpu-memory 80GB");
  EXPECT_EQ(fits.status, 0) << fits.output;
  EXPECT_EQ(first_line(fits.output).rfind("Planning for a GPU of 76293 MiB", 0), 0u) << fits.output;
  EXPECT_NE(fits.output.find("Fits on a GPU of 76293 MiB"), std::string::npos);
  EXPECT_NE(fits.output.find("batch 8 x seq 128"), std::string::npos) << fits.output;  // the shared defaults
  const CmdResult mib = run("plan --preset bert-tiny --gpu_memory=16000MiB");
  EXPECT_EQ(mib.status, 0) << mib.output;
  EXPECT_EQ(first_line(mib.output), "Planning for a GPU of 16000 MiB (--gpu-memory; reserving 1300 MB for the CUDA context)");
  const CmdResult tight = run("plan --preset bert-large --max-seq-length 512 --per-device-train-batch-size 64 --gpu-memory 16GiB");
  EXPECT_EQ(tight.status, 1) << tight.output;
  EXPECT_NE(tight.output.find("Fits on a GPU of 16384 MiB"), std::string::npos) << tight.output;
  EXPECT_NE(tight.output.find("anatomy: the plan does not fit"), std::string::npos) << tight.output;
  EXPECT_NE(tight.output.find(": change --"), std::string::npos) << tight.output;
  const CmdResult cpu = run("plan --preset bert-tiny --device cpu");
  EXPECT_EQ(cpu.status, 0) << cpu.output;
  EXPECT_EQ(first_line(cpu.output), "Planning for the CPU (--device cpu)");
}

TEST(CliOptions, JsonArgumentsFileInPlaceOfFlags) {
  const std::string dir = anatomy::testing_cli::fresh_dir("cli_options_json");
  std::ofstream(dir + "/args.json") << R"({"preset": "bert-tiny", "per_device_train_batch_size": 3,
                                           "max_seq_length": 64, "bf16": false, "gpu_memory": "80GB"})";
  const CmdResult r = run("plan " + dir + "/args.json");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("batch 3 x seq 64"), std::string::npos) << r.output;
  std::ofstream(dir + "/bad.json") << R"({"push_to_hub": true})";
  const CmdResult bad = run("train " + dir + "/bad.json");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--push-to-hub: not supported by anatomy"), std::string::npos) << bad.output;
}

// docs/trainer-arguments.md is `anatomy help --markdown` as committed: compared line by line
// so a stale document names its first stale line.
TEST(CliOptions, TrainerArgumentsDocIsTheTable) {
  const CmdResult r = run("help --markdown");
  ASSERT_EQ(r.status, 0);
  std::ifstream in(std::string(ANATOMY_SOURCE_DIR) + "/docs/trainer-arguments.md");
  ASSERT_TRUE(in.good()) << "docs/trainer-arguments.md is missing: build/anatomy help --markdown > docs/trainer-arguments.md";
  std::stringstream doc;
  doc << in.rdbuf();
  std::istringstream want(r.output), have(doc.str());
  std::string w, h;
  for (int line = 1;; ++line) {
    const bool more_w = static_cast<bool>(std::getline(want, w)), more_h = static_cast<bool>(std::getline(have, h));
    if (!more_w && !more_h) break;
    ASSERT_EQ(more_w, more_h) << "docs/trainer-arguments.md differs in length at line " << line
                              << "; regenerate it: build/anatomy help --markdown > docs/trainer-arguments.md";
    ASSERT_EQ(w, h) << "docs/trainer-arguments.md line " << line
                    << " is stale; regenerate it: build/anatomy help --markdown > docs/trainer-arguments.md";
  }
  // Every option of the table and every TrainingArguments field is in it.
  for (const char* needle : {"`--per-device-train-batch-size`", "`--gpu-memory`", "`deepspeed`", "`evaluation_strategy`",
                             "`warmup_ratio`", "`overwrite_output_dir`", "`local_rank`"})
    EXPECT_NE(doc.str().find(needle), std::string::npos) << needle;
}

// A run_glue.py-style command line, in the Trainer's spelling, runs as written: fractional
// epochs, warm-up ratio, cosine schedule, do_eval with a validation file and no eval strategy.
TEST(CliOptions, RunGlueCommandLineRunsAsWritten) {
  namespace fs = std::filesystem;
  const std::string dir = anatomy::testing_cli::fresh_dir("cli_options_run_glue");
  const std::string src = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/text/sentiment.jsonl";
  fs::copy_file(src, dir + "/train.jsonl");  // token caches go beside the files, not into the source tree
  fs::copy_file(src, dir + "/dev.jsonl");
  const std::string out = dir + "/out";
  const CmdResult r = run("train --preset bert-tiny --tokenizer_name " + std::string(ANATOMY_SOURCE_DIR) +
                          "/tests/data/tokenizer --train_file " + dir + "/train.jsonl --validation_file " + dir +
                          "/dev.jsonl --text_column_names text --label_column_name label --do_train --do_eval"
                          " --max_seq_length 32 --per_device_train_batch_size 16 --per_device_eval_batch_size 16"
                          " --num_train_epochs 0.5 --learning_rate 2e-5 --warmup_ratio 0.1 --lr_scheduler_type cosine"
                          " --optim adamw_torch --logging_steps 2 --seed 42 --use_cpu --report_to none"
                          " --disable_tqdm true --overwrite_output_dir --output_dir " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(out + "/train_results.json");
  std::stringstream s;
  s << in.rdbuf();
  const std::string res = s.str();
  // 197 samples in batches of 16: 12 or 13 steps an epoch, half of it rounded up.
  EXPECT_TRUE(res.find("\"steps\": 6") != std::string::npos || res.find("\"steps\": 7") != std::string::npos) << res;
  EXPECT_NE(res.find("\"eval_accuracy\""), std::string::npos) << res;  // --do_eval evaluated at the end
}
