// Reading `train`, `eval` and `plan` command lines against the options table: both spellings of
// every flag (--per-device-train-batch-size, --per_device_train_batch_size), --flag=value and
// --flag value, booleans bare or with true/false, and a JSON file of arguments in place of flags
// (HfArgumentParser's `script.py args.json`). Each value is converted and range-checked here,
// once; errors are one line naming the flag (the CLI exits 2).
#pragma once
#include <string>
#include <vector>

#include "cli/options_table.h"
#include "core/error.h"

namespace anatomy::cli {

// A command line that cannot be read: exit status 2, as argparse and getopt use.
class UsageError : public Error {
 public:
  using Error::Error;
};

const char* command_name(Command c);

// `args` are the words after the command's name.
RunArgs parse_args(Command cmd, const std::vector<std::string>& args);

// The flag of `cmd` nearest to a misspelt name ("" when none is close).
std::string nearest_flag(Command cmd, const std::string& name);

// The options of one run, flags combined and defaults resolved (sequence length from the
// model, precision from --bf16/--fp16/--tf32): what train and plan run with. `has_gpu` decides
// --device auto. Throws UsageError naming the flags that contradict each other.
TrainOptions finish_train_args(RunArgs& a, Command cmd, bool has_gpu);
// eval's precision: --precision or one of --bf16/--fp16/--tf32.
std::string finish_eval_precision(RunArgs& a);

}  // namespace anatomy::cli
