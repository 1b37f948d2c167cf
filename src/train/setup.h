// The set-up of a training rank: its device, the checks on the output directory, the memory
// plan, and the model with its starting weights. Everything here runs before anything is
// written, so a failing start-up leaves the previous run's files as they were.
#pragma once
#include <cstdint>
#include <fstream>
#include <filesystem>
#include <memory>
#include <string>

#include "memory/planner.h"
#include "model/encoder.h"
#include "telemetry/nvml.h"
#include "train/options.h"

namespace anatomy {

class Communicator;

// A rank's device and NVML's readings around its creation (-1 without a GPU).
struct TrainDevice {
  std::unique_ptr<Backend> backend;
  bool cuda = false;
  int index = 0;               // the CUDA device (the rank's local rank)
  unsigned nvml_index = 0;     // NVML's index of the same board (nvml_index_of)
  int64_t used_before = -1;    // NVML used bytes before the backend started
  int64_t used_context = -1;   // ... after (the CUDA context)
};

// The device of local rank `local_rank` of `local_world` ranks on this machine: CUDA device
// `local_rank` when there is one (--device auto|cuda), else the CPU with its share of the threads.
TrainDevice make_train_device(const TrainOptions& opt, int local_rank, int local_world);
int64_t nvml_used_bytes(const TrainDevice& dev);  // -1 without a GPU
// NVML's index of CUDA device `cuda_device`, found by its PCI bus id: CUDA_VISIBLE_DEVICES
// renumbers CUDA's devices but not NVML's, so with CUDA_VISIBLE_DEVICES=3 CUDA's device 0 is
// NVML's 3. Where NVML cannot tell, the CUDA index itself.
unsigned nvml_index_of(int cuda_device);

// Note [output directory]: a directory holding a run (train_results.json, a model or a
// checkpoint) is refused unless the run resumes from it or --overwrite-output-dir says to replace
// it; the old run's files are removed only when the new run first writes (OutputDir::claim), so
// a run that fails to start loses nothing. The input model's directory is never an output.
void check_output_dir(const TrainOptions& opt);

// Note [ranks agree]: every rank of a run must be started with the same flags. Those that would
// train something else without a word (another seed's weights stitched into the shards, another
// batch) or leave a rank waiting on collectives the others never call (other steps, other data)
// are compared at start-up, with the training data's rows; a difference ends every rank with
// one line naming the flags. A world of one has nothing to compare.
void check_ranks_agree(const TrainOptions& opt, int64_t train_rows, Communicator& comm);

// Note [task metrics] (train/evaluate.h): when the best model is tracked, --metric-for-best-model
// must name one of the metrics the model's task computes; refused before the first step, naming
// them, where the Trainer fails with a KeyError at its first evaluation.
void check_metric_for_best_model(const TrainOptions& opt, const BertConfig& cfg);

// The files of the output directory that the loop writes (rank 0 only).
class OutputDir {
 public:
  OutputDir(const TrainOptions& opt, int64_t start_step) : m_opt(opt), m_start_step(start_step) {}
  // Before the first write: creates the directory, removes what a previous run left that the new
  // one would mix with at once (its finished marker and, with --overwrite-output-dir, its
  // checkpoints; metrics past the resumed step when resuming). Idempotent.
  void claim();
  // Note [overwriting a run]: with --overwrite-output-dir the previous run's model and results go
  // just before this run writes its own at the end; a run that fails before then leaves them.
  // Acts once; claims first.
  void replace_previous_results();
  void append_metrics(const std::string& json_line);  // metrics.jsonl, claimed first
  const std::string& path() const { return m_opt.output_dir; }

 private:
  const TrainOptions& m_opt;
  int64_t m_start_step;
  bool m_claimed = false;
  // Found by claim() with --overwrite-output-dir, with their times then.
  std::vector<std::pair<std::string, std::filesystem::file_time_type>> m_previous_files;
  std::unique_ptr<std::ofstream> m_metrics;
};

// The micro-batch that the plan is made for: --per-device-train-batch-size, or with "auto" the
// largest that fits every rank's free memory (agreed across ranks: the smallest).
int64_t choose_micro_batch(const TrainOptions& opt, const BertConfig& cfg, const TrainDevice& dev, Communicator& comm);

// Refuses a plan that does not fit the device's free memory, with the levers that would make it.
void check_plan_fits(const PlanInput& in, const MemoryPlan& plan, const TrainDevice& dev, int64_t accum);

// The one line that says a run starts from random weights (a preset, or a directory with only
// config.json) and how to start from pretrained ones; "" when it loads weights.
std::string random_init_notice(const TrainOptions& opt);

// init_weights, then the weights of --model-name-or-path when it has them (notes on stderr from
// rank 0 about what was not loaded).
void load_starting_weights(const TrainOptions& opt, EncoderModel& model, bool announce);

}  // namespace anatomy
