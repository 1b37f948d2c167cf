// From what the command line said to the options a run uses: flags that combine (precision,
// save strategy, do_eval), Trainer meanings that need more than one field, and the defaults
// that depend on the model.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/parse.h"
#include "data/csv.h"
#include "model/bert.h"
#include "train/trainer.h"

namespace anatomy::cli {

namespace {

template <class... A>
[[noreturn]] void usage(const A&... parts) {
  throw UsageError(str_cat(parts...));
}

// --precision, or one of Trainer's booleans --bf16/--fp16/--tf32 (which may not disagree).
std::string precision_of(const RunArgs& a) {
  std::vector<std::string> on;
  if (a.bf16 == 1) on.push_back("bf16");
  if (a.fp16 == 1) on.push_back("fp16");
  if (a.tf32 == 1) on.push_back("tf32");
  if (on.size() > 1) usage("--", on[0], " and --", on[1], " exclude each other (one precision per run)");
  if (on.empty()) return a.precision;
  if (a.was_given("precision") && a.precision != on[0])
    usage("--precision ", a.precision, " and --", on[0], " contradict each other");
  return on[0];
}

// Note [seed experiment]: the page's run, fixed; flags that would change it are refused.
void apply_seed_experiment(const RunArgs& a, TrainOptions& o, bool gpu, Command cmd) {
  for (const char* f : {"preset", "model-name-or-path", "num-samples", "max-seq-length", "per-device-train-batch-size",
                        "precision", "bf16", "fp16", "tf32", "num-train-epochs", "max-steps"})
    if (a.was_given(f)) usage("--seed-experiment fixes the model, data and batch; drop --", f);
  o.preset = gpu ? "bert-large" : "bert-tiny";
  o.seq_len = 512;
  o.num_samples = 512;
  o.per_device_train_batch_size = 4;
  o.num_train_epochs = 1;
  o.train_epochs = 1;
  o.precision = Precision::Fp32;
  o.dataset = "seed";
  if (!gpu && cmd == kTrain)
    std::fprintf(stderr,
                 "anatomy: no GPU present: running the seed experiment on the CPU with the small bert-tiny preset "
                 "(the page uses bert-large on a V100)\n");
}

}  // namespace

std::string finish_eval_precision(RunArgs& a) { return a.precision = precision_of(a); }

TrainOptions finish_train_args(RunArgs& a, Command cmd, bool has_gpu) {
  TrainOptions o = a.train;
  if (a.was_given("preset") && a.was_given("model-name-or-path"))
    usage("--preset and --model-name-or-path exclude each other (a built-in model or a directory)");
  // do_train is read by scripts (run_glue.py), not by the Trainer, and false is TrainingArguments'
  // default (an arguments file dumped from it carries it, with do_eval true when it evaluates):
  // said, not refused.
  if (!a.do_train)
    a.notes.push_back("--do-train false: accepted as TrainingArguments' default; `anatomy train` trains (run_glue.py "
                      "reads do_train, the Trainer does not; `anatomy eval` evaluates a saved model without training)");
  o.skip_padding = a.skip_padding;
  o.num_labels_given = a.was_given("num-labels");
  o.text_columns_given = a.text_columns_given();
  o.label_column_given = a.was_given("label-column");
  a.precision = precision_of(a);
  o.precision = parse_precision(a.precision);
  if (a.was_given("fp8-format") && o.precision != Precision::Fp8)
    usage("--fp8-format applies to --precision fp8 only (this run: ", a.precision, ")");
  if (o.gemm_tuning && o.device == DeviceChoice::Cpu)
    usage("--gemm-tuning measure times cuBLASLt's algorithms: it needs the GPU, not --device cpu");
  o.gradient_checkpointing = parse_checkpoint_policy(a.checkpointing);
  o.optim.kind = parse_optimizer(a.optim);
  // ZeRO shards element-wise optimizer state (AdamW, SGD); Adafactor's factored and 8-bit AdamW's
  // block-quantized state are replicated, as PyTorch's DDP replicates them: the default stage is
  // then 0, so a command that runs on one rank runs on several (a --zero-stage given stays refused).
  if (!a.was_given("zero-stage") && o.optim.kind != OptimizerKind::AdamW && o.optim.kind != OptimizerKind::Sgd)
    o.zero_stage = 0;
  if (a.was_given("sgd-momentum") && o.optim.kind != OptimizerKind::Sgd)
    usage("--sgd-momentum applies to --optim sgd only (this run: --optim ", a.optim, ")");
  resolve_gradient_placement(o.gradient_placement, o.gradient_accumulation_steps,
                             o.zero_stage == 2);  // a bad combination fails here (the world size: at set-up)
  o.save_model = a.save_strategy != "no";
  o.checkpoint_strategy = a.save_strategy == "steps"   ? Cadence::Steps
                          : a.save_strategy == "epoch" ? Cadence::Epoch
                                                       : Cadence::No;
  // --warmup-steps: Trainer 5's rule, a value below 1 is the ratio that --warmup-ratio gives.
  if (a.was_given("warmup-steps") && a.was_given("warmup-ratio") && a.warmup_steps > 0 && o.warmup_ratio > 0)
    usage("--warmup-steps and --warmup-ratio exclude each other");
  if (a.warmup_steps >= 1 && a.warmup_steps != std::floor(a.warmup_steps))
    usage("--warmup-steps ", a.warmup_steps, ": a whole number of steps, or a fraction of them below 1");
  if (a.warmup_steps > 0 && a.warmup_steps < 1)
    o.warmup_ratio = a.warmup_steps;
  else
    o.warmup_steps = static_cast<int64_t>(a.warmup_steps);
  // --logging-steps, --eval-steps, --save-steps: the same rule, resolved once the total is known.
  auto steps_or_ratio = [&](const char* flag, double given, int64_t& steps, double& ratio) {
    if (given >= 1 && given != std::floor(given))
      usage("--", flag, " ", given, ": a whole number of steps, or a fraction of the total steps below 1");
    ratio = given > 0 && given < 1 ? given : 0;
    steps = ratio > 0 ? 1 : static_cast<int64_t>(given);  // 1 until resolve_step_ratios
  };
  steps_or_ratio("logging-steps", a.logging_steps, o.logging_steps, o.logging_ratio);
  steps_or_ratio("eval-steps", a.eval_steps, o.eval_steps, o.eval_ratio);
  steps_or_ratio("save-steps", a.save_steps, o.save_steps, o.save_ratio);
  if (a.schedule_without_warmup && (o.warmup_steps > 0 || o.warmup_ratio > 0)) {  // as the Trainer's get_scheduler
    a.notes.push_back("--lr-scheduler-type constant has no warm-up: --warmup-steps / --warmup-ratio are ignored, as "
                      "the Trainer ignores them (constant_with_warmup warms up)");
    o.warmup_steps = 0;
    o.warmup_ratio = 0;
  }
  // Note [joined text columns]: a sequence classifier's (run_classification.py's), one text.
  if (joined_columns(o.text_column).size() > 1) {
    if (o.masked_lm() || o.token_classification())
      usage("--text-column-names ", column_label(o.text_column), ": several columns joined are run_classification.py's; "
            "--task ", o.task, " reads one");
    if (!o.text_pair_column.empty())
      usage("--text-column-names ", column_label(o.text_column), " joins its columns into one text; with "
            "--text-pair-column name the pair's first text with --text-column");
  }
  // run_mlm.py's flags on a run that is not masked-LM would be dropped without a word.
  for (const char* f : {"line-by-line", "mlm-probability"})
    if (a.was_given(f) && !o.masked_lm())
      usage("--", f, " is run_mlm.py's: add --task mlm to train a masked LM (this run trains --task ", o.task, ")");
  // run_mlm.py holds out the first validation_split_percentage (5) % of the rows when it has no
  // validation file (Note [run_mlm.py's validation head] in train/task_data.cpp).
  const bool percentage_given = a.was_given("validation-split-percentage");
  if (percentage_given && !o.masked_lm())
    usage("--validation-split-percentage is run_mlm.py's: add --task mlm, or hold out a seeded fraction with "
          "--validation-split");
  if (percentage_given && o.validation_split > 0)
    usage("--validation-split-percentage and --validation-split each hold out part of --train-file: give one");
  if (!o.masked_lm() || !o.validation_file.empty() || o.validation_split > 0) {
    if (percentage_given && !o.validation_file.empty())
      a.notes.push_back("--validation-split-percentage is unused: --validation-file " + o.validation_file +
                        " validates, as in run_mlm.py");
    o.validation_split_percentage = 0;
  } else if (!percentage_given) {
    o.validation_split_percentage = 5;
  }
  if (a.was_given("do-eval") && a.do_eval && o.validation_file.empty() && o.validation_split == 0 &&
      o.validation_split_percentage == 0)
    usage("--do-eval needs validation data: --validation-file or --validation-split",
          o.masked_lm() ? " (or --validation-split-percentage above 0)" : "");
  o.eval_at_end = a.do_eval;
  o.eval_asked = a.was_given("do-eval") && a.do_eval;
  o.track_best_model = o.load_best_model_at_end || a.was_given("metric-for-best-model");
  o.greater_is_better = a.greater_is_better >= 0 ? a.greater_is_better == 1 : o.metric_for_best_model != "eval_loss" && o.metric_for_best_model != "eval_mse";
  if (o.load_best_model_at_end) {
    if (o.eval_strategy == Cadence::No || o.eval_strategy != o.checkpoint_strategy)
      usage("--load-best-model-at-end needs --eval-strategy and --save-strategy alike, steps or epoch (they are ",
            cadence_name(o.eval_strategy), " and ", a.save_strategy, "): a checkpoint is best by the evaluation of its step");
    // As TrainingArguments checks it: steps with steps, or ratios with ratios (to 1e-6).
    const double every = a.eval_steps > 0 ? a.eval_steps : std::max(1.0, a.logging_steps);
    const bool ratio_every = every < 1, ratio_save = a.save_steps < 1;
    if (o.eval_strategy == Cadence::Steps && ratio_every != ratio_save)
      usage("--load-best-model-at-end: --save-steps ", a.save_steps, " and the evaluation interval ", every,
            " (--eval-steps) must both be steps or both fractions of the total");
    const auto scaled = [](double v) { return static_cast<int64_t>(std::llround(v * 1e6)); };
    if (o.eval_strategy == Cadence::Steps && scaled(a.save_steps) % std::max<int64_t>(1, scaled(every)) != 0)
      usage("--load-best-model-at-end: --save-steps ", a.save_steps, " must be a multiple of the evaluation interval ",
            every, " (--eval-steps)");
  }
  if (a.do_predict && o.test_file.empty()) usage("--do-predict needs --test-file (the text to predict)");
  if (!a.do_predict && !o.test_file.empty()) usage("--test-file ", o.test_file, " is predicted only with --do-predict");
  if (a.logging_strategy == "no") {
    o.logging_steps = 0;
    o.logging_ratio = 0;
  }
  if (a.data_seed >= 0) {  // one seed orders the data and initializes the model
    if (a.was_given("seed") && static_cast<uint64_t>(a.data_seed) != o.seed)
      usage("--data-seed ", a.data_seed, ": anatomy orders the data with --seed (", o.seed,
            "); a separate data seed is not supported");
    o.seed = static_cast<uint64_t>(a.data_seed);
  }
  const bool gpu = wants_cuda(o.device, has_gpu) || (cmd == kPlan && a.gpu_memory >= 0);
  // Note [CPU default model]: bert-large, the default for a GPU, would take hours a step on a CPU
  // and write a 1.3 GB model; without a GPU and without a named model, the small preset trains.
  if (!gpu && !a.seed_experiment && !a.was_given("preset") && !a.was_given("model-name-or-path")) {
    o.preset = "bert-tiny";
    if (cmd == kTrain)
      std::fprintf(stderr, "anatomy: no GPU and no model named: training the CPU-sized preset bert-tiny, randomly "
                   "initialized (--model-name-or-path NAME for a pretrained model, --preset for another size)\n");
  }
  if (a.seed_experiment) {
    apply_seed_experiment(a, o, gpu, cmd);
  } else if (!a.was_given("max-seq-length")) {
    TrainOptions probe = o;
    probe.seq_len = 2;
    o.seq_len = default_max_seq_length(model_config(probe));
  }
  if (cmd == kTrain && !gpu && o.precision != Precision::Fp32 && o.precision != Precision::Fp8)
    usage("--precision ", a.precision, " needs a GPU (--device cuda); the CPU backend computes in fp32 (fp8: its twin)");
  return o;
}

}  // namespace anatomy::cli
