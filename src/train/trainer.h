// The training loop: data, micro-batches with gradient accumulation, loss scaling, clipping,
// the optimizer step, logging with throughput and ETA, and the run's summary: the seed page's
// Time / Samples/second / GPU memory occupied, plus the memory anatomy read off the allocator.
#pragma once
#include <cstdint>
#include <string>

#include "memory/category.h"
#include "train/options.h"

namespace anatomy {

struct TrainResult {
  double train_runtime = 0;              // seconds, the whole loop
  double train_samples_per_second = 0;   // samples / train_runtime
  double train_steps_per_second = 0;
  double steady_samples_per_second = 0;  // second half of the steps (warm-up excluded)
  double train_loss = 0;                 // mean over all samples seen
  double first_loss = 0, last_loss = 0;  // mean of the first and last optimizer step
  int64_t steps = 0, samples = 0, skipped_steps = 0;
  float final_loss_scale = 1.0f;         // fp16 dynamic loss scale at the end
  std::string device;
  int64_t num_parameters = 0;
  CategoryBytes peak_bytes;              // tagged allocator, per category
  int64_t gpu_memory_occupied_mb = -1;   // NVML used at the end (-1 without a GPU)
  int64_t cuda_context_mb = -1;          // NVML used by the context before any model memory
  int64_t weights_mb = -1;               // the weights category of the tagged allocator
  int64_t model_nvml_mb = -1;            // NVML growth from allocating the model (weights, grads, arenas)
  int64_t process_peak_rss_mb = 0;
};

TrainResult train(const TrainOptions& opt);

}  // namespace anatomy
