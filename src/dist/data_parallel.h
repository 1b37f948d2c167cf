// Data-parallel training on one machine: --nproc-per-node N ranks, one per device (CUDA devices
// 0 .. N-1 through NCCL, or an in-process group on the CPU), each a thread of this process with
// its own backend, model replica and micro-batches; ZeRO stage 0 or 1 for the optimizer
// (Note [ZeRO over the flat buffers] in dist/zero.h).
#pragma once
#include "train/trainer.h"

namespace anatomy {

// Synthetic data only (--dataset seed|learnable); refuses, naming the flag, what it does not
// support (text files, evaluation, checkpoints, fp16, profiling, --batch-size auto). Rank 0
// writes the output directory; the summary shows the memory anatomy of one rank and NVML's
// figure for every device.
TrainResult train_data_parallel(const TrainOptions& opt);

}  // namespace anatomy
