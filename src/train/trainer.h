// Training: one loop for every world size (Note [one loop] in train/trainer.cpp), in parts with
// one job each: setup.h (device, output directory, plan, starting weights), step.h (micro-batches,
// reduction and update through dist/zero.h, fp16 loss scaling), logging.h, eval_ranks.h,
// checkpoints.h, signals.h, summary.h; local_ranks.cpp runs the ranks of one process.
//
// Entry points for a launcher that starts one process per rank (kept stable):
//   TrainDevice dev = make_train_device(opt, local_rank, local_world);   // train/setup.h
//   std::unique_ptr<Communicator> comm = ...;   // this rank's member of the group (dist/)
//   TrainResult r = train(opt, *comm, dev);     // every rank, the same opt
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "memory/category.h"
#include "telemetry/clocks.h"
#include "train/options.h"

namespace anatomy {

struct TrainResult {
  double train_runtime = 0;              // seconds, the whole loop
  double train_samples_per_second = 0;   // samples / train_runtime
  double train_steps_per_second = 0;
  // The second half of the steps (warm-up excluded), over their training time: evaluations and
  // checkpoints between them are not counted (train_samples_per_second counts everything).
  double steady_samples_per_second = 0;
  double train_loss = 0;                 // mean over all samples seen
  double first_loss = 0, last_loss = 0;  // mean of the first and last optimizer step
  int64_t train_dataset_samples = 0;    // rows of the training data (run_glue.py's train_samples)
  int64_t steps = 0, samples = 0, skipped_steps = 0;  // skipped: fp16 overflows, and non-finite steps with skip_nonfinite_steps
  int64_t nonfinite_steps = 0;           // of the skipped, those with a non-finite loss or norm
  int64_t steps_launched_ahead = 0;      // launched before the step before them was read (Note [a step in flight])
  float final_loss_scale = 1.0f;         // fp16 dynamic loss scale at the end
  std::string device;
  int64_t num_parameters = 0;
  CategoryBytes peak_bytes;              // tagged allocator, per category
  int64_t gpu_memory_occupied_mb = -1;   // NVML used at the end (-1 without a GPU)
  int64_t cuda_context_mb = -1;          // NVML used by the context before any model memory
  int64_t weights_mb = -1;               // the weights category of the tagged allocator
  int64_t model_nvml_mb = -1;            // NVML growth from allocating the model (weights, grads, arenas)
  int64_t process_peak_rss_mb = 0;
  double data_wait_s = 0;                // time the loop waited for the loader
  int64_t start_step = 0;                // > 0 when resumed from a checkpoint
  bool interrupted = false;              // SIGINT/SIGTERM: checkpoint saved, loop left early
  std::string last_checkpoint;           // the newest checkpoint this run wrote
  int64_t nvml_after_setup_mb = -1;      // NVML used with model, optimizer and buffers allocated
  int64_t nvml_after_first_step_mb = -1;  // ... and after the first step (kernels loaded)
  std::vector<std::pair<std::string, int64_t>> memory_growth;  // --trace-memory-growth: op -> bytes
  // The last evaluation's metrics (Note [task metrics] in train/evaluate.h), "loss" first, as
  // named there; empty: none. eval("accuracy") reads one (-1: not computed).
  std::vector<std::pair<std::string, double>> eval_metrics;
  double eval(const std::string& name) const {
    for (const auto& [n, v] : eval_metrics)
      if (n == name) return v;
    return -1;
  }
  std::string problem_type = "single_label_classification";  // or masked_lm, token_classification
  double eval_runtime = 0;
  int64_t eval_samples = 0, eval_steps = 0;  // eval_steps: the batches of the last evaluation
  double epoch = 0;                      // epochs done at the end (fractional)
  int64_t predict_samples = 0;           // --do-predict: rows of predict_results.txt
  std::string best_model_checkpoint;     // Note [best model]: the best checkpoint (--load-best-model-at-end: its weights end the run)
  double best_metric = 0;
  // Data parallelism (world size > 1): peak_bytes and the plan are rank 0's.
  int world_size = 1, zero_stage = 0;
  std::vector<int64_t> rank_optimizer_state_bytes;  // each rank's allocator
  int64_t reduction_buckets = 0;  // gradient reductions of the last backward (Note [bucketed reduction])
  std::vector<int64_t> rank_gradient_bytes;         // each rank's allocator (ZeRO-2 shards them)
  std::vector<int64_t> rank_peak_bytes, rank_planned_bytes;  // each rank's total: allocated (per-category peaks), planned
  std::vector<int64_t> gpu_memory_per_rank_mb;      // NVML used on each rank's device at the end
  std::optional<ClockSummary> gpu_clocks;  // the lead rank's GPU over the steady steps (Note [clock and power])
};

// The model configuration a run trains: --preset (with --num-labels) or the config.json of
// --model-name-or-path, validated, its position table long enough for --seq-len. Text data may
// still change the labels (the trainer's load_train_data).
BertConfig model_config(const TrainOptions& opt);
// --max-seq-length's default for a model (train, eval, plan): the scripts' defaults, never beyond
// its position table: run_glue.py's and run_classification.py's 128; for a masked LM or a token
// classifier run_mlm.py's and run_ner.py's the tokenizer's limit (the position table here),
// run_mlm.py capping it at 1024 (and here run_ner.py too).
int64_t default_max_seq_length(const BertConfig& cfg);

class Communicator;
struct TrainDevice;

// The loop of one rank of `comm` (a world of one is single-device training) on `device`
// (train/setup.h: make_train_device). Every rank of the group calls it with the same options
// (opt.nproc_per_node is not read: the group's size is the world size); rank 0 writes the output
// directory, each rank its optimizer shard of a checkpoint (the ranks share a file system). Errors (bad flags, files, a plan that cannot fit) throw
// anatomy::Error before anything is written to output_dir. On SIGINT or SIGTERM at any rank,
// every rank finishes the current step, the checkpoint is saved and the result says interrupted
// (Note [stopping cleanly]). A non-finite loss or gradient norm stops the run with an error
// naming the step (or, with skip_nonfinite_steps, skips the step and counts it). A rank that
// throws aborts `comm`, so the others throw at their next collective instead of waiting (a local
// group's throw GroupAborted, which a launcher reports after the failing rank's own error). The
// result's run-wide figures (losses, samples, evaluation) are the same on every rank.
TrainResult train(const TrainOptions& opt, Communicator& comm, TrainDevice& device);

// One process: a world of one, or --nproc-per-node N ranks as threads of this process (an
// in-process group on the CPU, NCCL over CUDA devices 0 .. N-1). The result is rank 0's; the
// first rank to fail ends the run with its error.
TrainResult train(const TrainOptions& opt);

}  // namespace anatomy
