// The end of a training run: train_results.json (written last, atomically: its presence means
// the run finished), the memory timeline, and the printed summary ending with the seed page's
// three lines (Time, Samples/second, GPU memory occupied).
#pragma once
#include <cstdint>

#include "memory/planner.h"
#include "train/trainer.h"

namespace anatomy {

// used_before: NVML's used bytes before the backend started (-1 without a GPU).
void write_run_summary(const TrainOptions& opt, const TrainResult& res, const MemoryPlan& mem_plan, const BertConfig& cfg,
                       const ModelShape& shape, int64_t used_before);

}  // namespace anatomy
