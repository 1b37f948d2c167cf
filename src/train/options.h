// Everything a training run is configured by; the command line fills it (tools/anatomy.cpp),
// with flag names taken from the Hugging Face Trainer's arguments where one exists.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "memory/planner.h"
#include "model/bert.h"
#include "optim/optimizer.h"

namespace anatomy {

enum class Precision : uint8_t { Fp32, Tf32, Bf16, Fp16, Fp8 };  // Fp8: Note [fp8 training] in core/fp8.h
Precision parse_precision(const std::string& s);  // throws naming --precision
const char* precision_name(Precision p);
// --fp8-format's name for the output gradients' format: "hybrid" (E5M2) or "e4m3".
const char* fp8_format_name(Fp8Format grads);
// The activations' dtype: bf16 for fp8 on the GPU; on the CPU (fp32 only) fp8 is its twin
// arithmetic, the Linears' operands quantized and multiplied in fp32 (Note [fp8 training]).
DType compute_dtype(Precision p, Device device);

// Run options the command line parses once into enums (cli/options_table.cpp); the library never
// compares their spellings.
enum class DeviceChoice : uint8_t { Auto, Cpu, Cuda };  // auto: the GPU when one is present
enum class Cadence : uint8_t { No, Steps, Epoch };      // when to evaluate or save a checkpoint
const char* cadence_name(Cadence c);                    // "no", "steps", "epoch"
inline bool wants_cuda(DeviceChoice d, bool gpu_present) {
  return d == DeviceChoice::Cuda || (d == DeviceChoice::Auto && gpu_present);
}

struct TrainOptions {
  // Model: a preset, or a Hugging Face directory (config.json, optionally model.safetensors).
  std::string preset = "bert-large";
  std::string model_name_or_path;
  std::string model_name;  // as the user named it (a Hub name), when model_name_or_path is where it resolved to
  int64_t num_labels = 2;
  bool num_labels_given = false;  // --num-labels given: the data's label count must agree with it
  // A head (or any tensor) of --model-name-or-path whose shape differs from the model's is newly
  // initialized instead of refused (Trainer's ignore_mismatched_sizes).
  bool ignore_mismatched_sizes = false;
  // Task: "text-classification" (the head follows the labels: model/heads.h) or "mlm" (Note
  // [masked LM head] in model/heads.h; the texts masked as data/masked_lm.h says).
  std::string task = "text-classification";
  double mlm_probability = 0.15;
  bool line_by_line = false;  // --task mlm: a sample per text; else Note [grouped texts] in data/masked_lm.h
  bool masked_lm() const { return task == "mlm"; }
  bool token_classification() const { return task == "token-classification"; }
  // Data: synthetic, or a labelled text file (--train-file) tokenized with the model's tokenizer.
  std::string dataset = "seed";  // seed | learnable (synthetic; ignored with train_file)
  int64_t num_samples = 512;
  int64_t seq_len = 512;         // text: the longest a sample may be (--max-seq-length)
  int prefetch = 2;
  std::string train_file, validation_file;
  double validation_split = 0;   // > 0: hold out this fraction of the training data
  // --task mlm: the first N% of the training file's rows validate (Note [run_mlm.py's validation
  // head] in train/task_data.cpp); the CLI sets run_mlm.py's 5 when no other validation is given.
  int validation_split_percentage = 0;
  std::string text_column = "text", text_pair_column, label_column = "label";
  // None of --text-column, --text-column-names, --text-pair-column given: a classification file
  // without text_column is read with run_glue.py's columns (Note [run_glue.py's text columns]).
  bool text_columns_given = false;
  bool label_column_given = false;  // else run_ner.py's tags column (Note [run_ner.py's columns])
  std::string tokenizer;         // a directory; default: model_name_or_path
  bool group_by_length = false;
  // With a text file: train on the batches' real tokens (Note [packed training] in model/bert.cpp).
  bool skip_padding = true;
  std::string dataset_cache_dir;  // where the token cache goes (default: beside the data file)
  // Loop.
  static constexpr int64_t kAutoBatch = -1;  // --per-device-train-batch-size auto
  int64_t per_device_train_batch_size = 4;
  int64_t gradient_accumulation_steps = 1;
  int64_t num_train_epochs = 1;
  double train_epochs = 0;  // fractional --num-train-epochs (> 0: overrides num_train_epochs)
  int64_t max_steps = -1;  // > 0 overrides epochs
  uint64_t seed = 42;
  // Optimizer and schedule (the Trainer's defaults).
  OptimizerOptions optim;
  float learning_rate = 5e-5f;
  Schedule lr_scheduler_type = Schedule::Linear;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0;  // of the total steps, when warmup_steps is 0 (the Trainer's rule)
  float max_grad_norm = 1.0f;
  // Precision, memory, device.
  Precision precision = Precision::Fp32;
  Fp8Format fp8_grads = Fp8Format::E5M2;  // --fp8-format: hybrid (E5M2 gradients) or e4m3
  CheckpointPolicy gradient_checkpointing = CheckpointPolicy::None;
  std::string gradient_placement = "auto";  // auto | own | in-activations (resolve_gradient_placement)
  DeviceChoice device = DeviceChoice::Auto;
  int nproc_per_node = 1;        // data-parallel ranks (the ranks of train/trainer.h)
  int ddp_bucket_cap_mb = 25;    // gradients reduced during backward in buckets of this size (0: each layer)
  int zero_stage = 1;            // with several ranks: 0 replicated, 1 sharded optimizer state, 2 and gradients
  bool gemm_tuning = false;      // --gemm-tuning measure: Note [gemm tuning] after the first step (the GPU)
  bool skip_nonfinite_steps = false;  // a step with a non-finite loss or gradient norm: skipped and counted, not fatal
  bool overwrite_output_dir = false;  // an output directory holding a run may be replaced (once the new run writes)
  int64_t fail_last_rank_at_step = -1;  // tests only (no flag): the last rank throws before this step's update
  int64_t sigterm_at_step = -1;  // tests only (no flag): the last rank has a SIGTERM pending from this step's launch on
  bool sigterm_at_end = false;   // tests only (no flag): rank 0 raises SIGTERM as the run's end (final save) begins
  double evaluation_pause_s = 0;  // tests only (no flag): each evaluation lasts at least this long (a slow validation set)
  // Tests only (no flag): whether the next step is launched before this one is read (Note [a step
  // in flight] in train/trainer.cpp). Auto: where the device runs asynchronously (the GPU; on the
  // CPU a launch is the whole step, and running ahead gains nothing); On: also on the CPU.
  enum class RunAhead { Auto, On, Off } run_ahead = RunAhead::Auto;
  int threads = 0;              // CPU threads (0: all)
  // Evaluation on the validation data: no, steps (every eval_steps) or epoch.
  Cadence eval_strategy = Cadence::No;
  int64_t eval_steps = 0;      // 0: logging_steps
  int64_t per_device_eval_batch_size = 8;
  bool eval_at_end = true;     // with validation data and eval_strategy no: evaluate once at the end (do_eval)
  bool eval_asked = false;     // --do-eval given: a run without validation data is refused, not left unevaluated
  std::string test_file;       // with do_predict: predictions for it in predict_results.txt
  // Output and checkpoints (checkpoint_strategy: no, steps (every save_steps) or epoch).
  std::string output_dir = "runs/train";
  int64_t logging_steps = 50;  // 0: only the summary
  // Below 1: logging_steps, eval_steps, save_steps as a ratio of the total steps (resolve_step_ratios).
  double logging_ratio = 0, eval_ratio = 0, save_ratio = 0;
  bool logging_first_step = false;
  bool report_jsonl = true;    // metrics.jsonl (--report-to jsonl)
  bool save_model = true;      // the model at the end (config.json, model.safetensors, tokenizer)
  Cadence checkpoint_strategy = Cadence::No;
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;  // keep the newest N checkpoints (0: all), and the best one
  // Note [best model]: with load_best_model_at_end, or a metric_for_best_model given (as the
  // Trainer tracks it whenever one is set), each checkpoint saved at an evaluation is compared by
  // metric_for_best_model (eval_ + one of its task's metrics, Note [task metrics]); the best is
  // named in trainer_state.json and kept whatever save_total_limit says; with
  // load_best_model_at_end its weights are the final model.
  bool load_best_model_at_end = false;
  bool track_best_model = false;
  std::string metric_for_best_model = "eval_loss";
  bool greater_is_better = false;
  std::string resume_from_checkpoint;  // a checkpoint directory or "latest"
  std::string command_line;      // how the run was started, for the resume hint
  bool disable_progress_bar = false;
  float fp16_initial_scale = 65536.0f;
  bool trace_memory_growth = false;  // GPU: which ops of the first step grew NVML's used memory
  int64_t profile_steps = 0;   // extra steps timed op by op after training (telemetry/profiler.h)

  // Optimizer steps of the run: max_steps when > 0, else ceil(epochs x steps per epoch) as the
  // Trainer rounds a fractional num_train_epochs; and the warm-up steps (warmup_ratio of them).
  int64_t total_steps(int64_t steps_per_epoch) const {
    if (max_steps > 0) return max_steps;
    if (train_epochs > 0) return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(train_epochs * steps_per_epoch)));
    return steps_per_epoch * num_train_epochs;
  }
  int64_t warmup(int64_t total) const {
    return warmup_steps > 0 ? warmup_steps : static_cast<int64_t>(std::ceil(warmup_ratio * total));
  }
  // The step flags given as a ratio of the total steps (below 1, Trainer's rule) made steps:
  // ceil(ratio x total), as Trainer.train does once it knows the total (--load-best-model-at-end's
  // multiple is checked on the ratios as given, as TrainingArguments checks it).
  void resolve_step_ratios(int64_t total);
  // Steps between evaluations under --eval-strategy steps: eval_steps, else logging_steps (the
  // Trainer's rule), at least 1.
  int64_t eval_interval() const { return eval_steps > 0 ? eval_steps : std::max<int64_t>(1, logging_steps); }

  void validate() const;  // one-line errors naming the flag
};

// The model's shape and the memory planner's input of a run of `o` with micro-batch `batch` on
// `device` over `world` ranks: the one derivation the trainer, the automatic batch size and
// `anatomy plan` share. Text data trains on its real tokens (packed_tokens; Note [packed
// training] in model/bert.cpp) except under layer checkpointing. Throws naming
// --gradient-placement for a placement the accumulation cannot use.
PlanInput plan_input(const TrainOptions& o, const BertConfig& cfg, int64_t batch, Device device, int world, int rank = 0);

}  // namespace anatomy
