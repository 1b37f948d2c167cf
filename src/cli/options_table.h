// The one table of command-line options: name, aliases, type, range, default and help of every
// flag of `train`, `eval` and `plan`. The parser (cli/parse.h), `--help`, the range checks and
// docs/trainer-arguments.md (`anatomy help --markdown`) all read it; nothing else spells a flag.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/options.h"

namespace anatomy::cli {

// Which commands an option belongs to (a bit mask).
enum Command : unsigned { kTrain = 1, kEval = 2, kPlan = 4, kTrainPlan = kTrain | kPlan, kAll = kTrain | kEval | kPlan };

enum class OptType : uint8_t {
  Bool,    // a bare flag, or --flag true/false (also --no-flag)
  Int,     // an integer within [lo, hi]
  Float,   // a finite number within [lo, hi] (lo_open/hi_open: the end excluded)
  Text,    // any string (nonempty: "" refused)
  Choice,  // one of `choices` (the accepted spellings and what each means to anatomy)
  Size,    // a memory size with its unit: 16GiB, 80GB, 16000MiB
};

// A value read off the command line or a JSON file, converted to the option's type.
struct Value {
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;  // Text; Choice: the meaning (second of the pair)
};

// Everything `train`, `eval` and `plan` are configured by: the trainer's options plus what only
// the command line knows (how flags combine, what was given at all).
struct RunArgs {
  TrainOptions train;
  std::string precision = "fp32";        // --precision, or from --bf16/--fp16/--tf32
  int bf16 = -1, fp16 = -1, tf32 = -1;   // -1: not given
  std::string optim = "adamw", checkpointing = "none", save_strategy = "final";
  bool seed_experiment = false;
  bool do_train = true, do_eval = true, do_predict = false;
  int greater_is_better = -1;  // -1: not given (from the metric: false for a loss)
  bool schedule_without_warmup = false;
  double warmup_steps = 0;               // --warmup-steps as given: steps, or below 1 a ratio (Trainer 5)
  // --logging-steps, --eval-steps, --save-steps as given: steps, or below 1 a ratio of the total
  double logging_steps = 50, eval_steps = 0, save_steps = 500;
  int64_t data_seed = -1;                // -1: not given  // Trainer's "constant": no warm-up at all
  std::string report_to = "jsonl", logging_strategy = "steps";
  bool skip_padding = true, sort_by_length = true;  // eval; skip_padding also train
  std::string revision;                             // with a Hub name (io/hub.h); empty: main
  int64_t gpu_memory = -1;                          // plan: bytes (-1: the GPU present)
  int64_t ddp_timeout = 0;                          // --ddp-timeout seconds (0: not given)
  std::vector<std::string> given;                   // canonical names set by the user
  std::vector<std::string> notes;                   // neutral Trainer arguments accepted, one line each
  bool was_given(const std::string& name) const;
  // Any of --text-column, --text-column-names, --text-pair-column (else Note [run_glue.py's text
  // columns] in data/csv.h).
  bool text_columns_given() const {
    return was_given("text-column") || was_given("text-column-names") || was_given("text-pair-column");
  }
};

struct OptionSpec {
  const char* name;                  // canonical, with dashes: "per-device-train-batch-size"
  std::vector<const char*> aliases;  // other names (dashes); each also accepted with underscores
  OptType type;
  unsigned commands;
  const char* default_text;          // as printed in --help and the docs
  const char* help;
  double lo = 0, hi = 0;             // Int/Float range
  bool lo_open = false, hi_open = false;
  bool auto_ok = false;              // Int: also the word "auto" (stored as -1)
  bool nonempty = false;             // Text: "" refused
  std::vector<std::pair<const char*, const char*>> choices = {};  // spelling -> meaning
  void (*apply)(RunArgs&, const Value&) = nullptr;
  const char* trainer = "";          // how it relates to TrainingArguments ("" anatomy's own)
};

const std::vector<OptionSpec>& options();
// The allowed range of an Int/Float option as its errors and help print it ("[1, 4096]").
std::string range_text(const OptionSpec& s);
// "--flag" for a canonical name.
std::string flag(const OptionSpec& s);

// Arguments of the Hugging Face Trainer and its examples that anatomy refuses: the name (with
// underscores, as TrainingArguments spells it) and why, in one phrase.
struct Refusal {
  const char* name;
  const char* why;
};
const std::vector<Refusal>& refused_arguments();
// Values of refused Trainer arguments that ask for nothing anatomy does not already do (mostly the
// Trainer's own defaults, which scripts often pass explicitly): accepted, and the run says so.
// value "*": any value (a PyTorch data-loader knob that changes neither the batches nor their order).
struct NeutralValue {
  const char* name;
  const char* value;
  const char* why;
};
const std::vector<NeutralValue>& neutral_values();
// The entry for `field` (underscores) that `raw` matches (booleans in any case, numbers by
// value), or null.
const NeutralValue* neutral_value(const std::string& field, const std::string& raw);
// Why anatomy refuses a Trainer argument (underscores): its own reason or its family's ("" none).
std::string refusal_reason(const std::string& field);
// Every field of TrainingArguments (transformers 4.57 and 5.x), for the docs and for refusing
// any that the table does not take.
const std::vector<const char*>& training_arguments_fields();

}  // namespace anatomy::cli
