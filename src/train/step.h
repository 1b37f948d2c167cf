// One optimizer step of a rank: its micro-batches (gradient accumulation), the reduction over
// the ranks and the update (dist/zero.h), fp16 loss scaling, and the step's global figures:
// the summed loss, the samples, the gradient norm, and whether the update was applied.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "dist/zero.h"
#include "memory/allocator.h"
#include "model/encoder.h"
#include "train/options.h"
#include "train/staging.h"

namespace anatomy {

// fp16 dynamic loss scaling: skip the step on overflow and halve the scale; double it after
// `interval` clean steps (the defaults of torch.amp.GradScaler). The overflow is the global
// gradient norm's, which every rank reads alike, so every rank's scaler makes the same decision.
struct LossScaler {
  float scale = 1.0f;
  int64_t clean = 0, interval = 2000;
  bool at_floor() const { return scale <= 1.0f; }
  bool update(bool overflow) {
    if (overflow) {
      scale = std::max(scale * 0.5f, 1.0f);
      clean = 0;
      return false;
    }
    if (++clean >= interval) {
      scale *= 2.0f;
      clean = 0;
    }
    return true;
  }
};

struct StepOutcome {
  // Summed per-sample losses over every rank (per-token tasks: the step's mean token loss times
  // samples, so that loss_sum / samples is that mean).
  double loss_sum = 0;
  int64_t samples = 0;   // over every rank
  double grad_norm = 0;  // the global norm before clipping, unscaled (NaN/Inf when not finite)
  float lr = 0;
  bool applied = true;   // false: the update skipped itself (fp16 overflow, or a non-finite step)
  bool overflow = false;  // fp16: skipped by the loss scaler, which has halved its scale
  const char* nonfinite = nullptr;  // the first non-finite quantity ("loss", "grad_norm"), or null
  int stop_signal = 0;   // SIGINT or SIGTERM when some rank received one (agreed: every rank stops)
};

// Note [accumulation within an epoch]
// As the Trainer (4.x from 4.46, 5.x) does, each epoch starts a fresh accumulation: an epoch of M
// micro-batches makes S = ceil(M / A) optimizer steps (A = --gradient-accumulation-steps), the
// last of them taking the M - (S - 1) A micro-batches left, and a step's gradient is the mean of
// its micro-batches' mean losses (divided by its own count of micro-batches). Step s (0-based)
// starts at micro-batch (s / S) M + (s % S) A; so a step's count follows from where it starts.
struct MicroBatchSchedule {
  int64_t per_epoch = 1, accum = 1;  // M, A
  int64_t steps_per_epoch() const { return (per_epoch + accum - 1) / accum; }
  int64_t first_of_step(int64_t step) const {  // also where `step` steps end
    const int64_t S = steps_per_epoch();
    return step / S * per_epoch + step % S * accum;
  }
  int64_t count_from(int64_t micro) const { return std::min(accum, per_epoch - micro % per_epoch); }
  bool ends_epoch(int64_t step) const { return step % steps_per_epoch() == 0; }  // 1-based `step`
};

class TrainStep {
 public:
  // plan: the global batches (per-device batch x ranks); this rank trains on its slice of each.
  TrainStep(const TrainOptions& opt, EncoderModel& model, Backend& be, Communicator& comm,
            const BatchPlan& plan, int64_t total_steps);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // A step whose device work is queued and whose figures are on their way to the host.
  struct Launched {
    float lr = 0, scale = 1;       // the learning rate and the loss scale it ran with
    // Note [loss per step]: the step's micro-batches but the last (all of one size) summed row by
    // row, the last one's own losses apart: widest / last_rows rows of each (last_rows: this
    // rank's samples of the last; mine: of the others).
    int64_t widest = 0, mine = 0, last_rows = 0;
    int64_t micro_batches = 1;  // of this step
    int64_t micro_end = 0;         // the micro-batches done once it has run
    double data_wait_end = 0;      // the data wait so far, its own included
    int signal = 0;
    int token = 0;                 // the copy of its figures to wait for
    int64_t index = 0;             // launches before it (its figures' host block: index % 2)
  };
  // Queues one step from `source` (this rank's slices, from micro-batch `micro` on); `micro`
  // advances by the step's micro-batches (Note [accumulation within an epoch]). `signal` is this rank's pending SIGINT/SIGTERM (0: none).
  // At most two steps may be launched and not finished; finish them in order.
  Launched launch(Prefetcher& source, int64_t& micro, double& data_wait, int signal);
  // Waits for a launched step's figures and agrees the step's outcome with the other ranks.
  StepOutcome finish(const Launched& l);
  StepOutcome run(Prefetcher& source, int64_t& micro, double& data_wait, int signal) {
    return finish(launch(source, micro, data_wait, signal));
  }
  // Whether the next step may be launched before this one's outcome is read: only where no
  // outcome changes what the next step does (fp16's loss scaler halves its scale on an overflow;
  // a skipped non-finite step leaves the optimizer's step count behind).
  bool can_run_ahead() const { return m_opt.precision != Precision::Fp16 && !m_opt.skip_nonfinite_steps; }
  LossScaler& scaler() { return m_scaler; }
  Optimizer& optimizer() { return m_dps.optimizer(); }
  const ShardRange& shard() const { return m_dps.shard(); }
  int zero_stage() const { return m_dps.stage(); }
  int64_t reduction_buckets() const { return m_dps.buckets_last_step(); }
  void time_reduction(bool on) { m_dps.time_reduction(on); }  // --profile-steps (Note [overlap timing])
  // Before a save, on every rank: the fp32 masters made whole (Note [ZeRO gathers half weights]).
  void complete_masters() { m_dps.complete_masters(m_model); }
  DataParallelStep::ReductionTiming take_reduction_timing() { return m_dps.take_reduction_timing(); }

 private:
  // Per-token tasks: reads the step's micro-batches into m_ahead and returns their labelled
  // tokens summed over the ranks (Note [labelled tokens per step] in step.cpp).
  int64_t labelled_tokens_of_step(Prefetcher& source, int64_t micro, int64_t count, double& data_wait,
                                  const std::function<std::pair<int64_t, int64_t>(int64_t)>& real_rows);
  const TrainOptions& m_opt;
  EncoderModel& m_model;
  Backend& m_be;
  Communicator& m_comm;
  const BatchPlan& m_plan;
  int64_t m_B, m_T, m_total_steps;
  MicroBatchSchedule m_sched;  // Note [accumulation within an epoch]
  LossScaler m_scaler;
  DataParallelStep m_dps;
  Buffer m_ids, m_types, m_mask, m_labels, m_loss_sums;
  // Training on real tokens: each micro-batch's packing index (Note [packed training]); on the
  // GPU rounded up to a multiple of 128 rows, so that few GEMM shapes recur.
  Buffer m_rows, m_first;
  int64_t m_row_multiple = 1;
  HostBatch m_hb;
  std::vector<HostBatch> m_ahead;  // the step's micro-batches, read ahead (per-token tasks)
  // Page-locked, two blocks: the squared gradient norm, the loss sums, the last micro-batch's losses.
  float* m_host = nullptr;
  float* figures(int64_t index) const { return m_host + (index % 2) * (2 * m_B + 1); }  // a launch's block
  int64_t m_launched = 0, m_finished = 0;  // steps launched and finished
  UploadStaging m_staging;
};

}  // namespace anatomy
