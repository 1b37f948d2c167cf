// What a run says while it runs (rank 0 only): the start-up block, printed at once; one line
// every --logging-steps with the Hugging Face Trainer's keys (loss, grad_norm, learning_rate,
// epoch), the same keys in metrics.jsonl, and the same at any world size; a progress bar when
// stderr is a terminal.
#pragma once
#include <optional>
#include <cstdint>
#include <string>

#include "memory/planner.h"
#include "train/evaluate.h"
#include "train/options.h"
#include "train/setup.h"

namespace anatomy {

struct StartupInfo {
  std::string model, model_source;  // name; "pretrained weights from DIR" or "randomly initialized (preset ...)"
  std::string device, data;
  int64_t num_parameters = 0, train_samples = 0, validation_samples = 0, total_steps = 0, start_step = 0;
  int64_t micro_batch = 0, world_size = 1, zero_stage = 0;
  int64_t planned_bytes = 0;
  bool has_test = false;  // --test-file to predict at the end
};

// The start-up block's line on evaluation and prediction: when the validation data is evaluated
// (every --eval-strategy, at the end, said so when it is only at the end) and with which batch,
// --per-device-eval-batch-size listed when the training micro-batch caps it; "" with neither.
std::string evaluation_line(const TrainOptions& opt, bool has_validation, bool has_test, int64_t micro_batch);

class TrainLog {
 public:
  TrainLog(const TrainOptions& opt, OutputDir& out, int64_t start_step, int64_t total_steps);
  void startup(const StartupInfo& s);
  // The figures of optimizer step `done` (1-based); prints and records a line when it is a
  // logging step, and keeps the progress bar moving on a terminal.
  // `loss`: the step's (Note [loss per step] in trainer.cpp); none for a skipped non-finite step.
  void step(int64_t done, std::optional<double> loss, double grad_norm, float lr, double epoch, double elapsed,
            int64_t samples_here, double data_wait, float loss_scale);
  void eval(int64_t step, double epoch, const EvalResult& ev);
  void end_of_bar() const;  // the newline after the progress bar
  bool tty() const { return m_tty; }
  // The loss window of a checkpoint (what is logged at the next logging step): the sum of its
  // steps' losses and their count (the checkpoint's window_loss and window_samples).
  double window_loss = 0;
  int64_t window_steps = 0;
  // The Trainer's log_history (trainer_state.json): a resumed checkpoint's, then every line logged
  // and every evaluation.
  std::vector<nlohmann::json> history;

 private:
  const TrainOptions& m_opt;
  OutputDir& m_out;
  int64_t m_start, m_total;
  bool m_tty;
};

}  // namespace anatomy
