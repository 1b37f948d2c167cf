// The static memory planner: exact bytes per category for a training or inference run, before
// anything is allocated. It runs the model's own carving code dry (model_arena_bytes), so the
// plan and the allocation cannot drift apart; tests hold the allocator's peaks equal to it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/host_memory.h"
#include "memory/category.h"
#include "model/bert.h"
#include "optim/optimizer.h"

namespace anatomy {

struct PlanInput {
  BertConfig config;
  ModelShape shape;            // micro-batch, sequence, compute dtype, checkpointing, training
  OptimizerKind optimizer = OptimizerKind::AdamW;
  Device device = Device::CUDA;
  int world_size = 1, zero_stage = 0;  // data parallelism (Note [ZeRO over the flat buffers])
  int rank = 0;                         // whose shard: the last rank's may be smaller
  int64_t accumulation = 1;             // micro-batches per step (ZeRO-2's gradient shard buffer)
  std::string config_source = "config.json";  // where `config` came from, for errors ("--preset bert-large")
  bool sgd_momentum = false;                  // --optim sgd with momentum: a momentum buffer
};

struct MemoryPlan {
  CategoryBytes bytes;         // what the tagged allocator will hold at its peak, per category
  int64_t num_parameters = 0;
  int64_t total() const { return bytes.total(); }
};

// Refuses, before any allocation, sizes whose plan would overflow int64 (Note [plan overflow])
// and, on the CPU, plans larger than the machine's memory (Note [host memory refusal]); the
// one-line error names the flag (or config.json field) to lower.
MemoryPlan plan_memory(const PlanInput& in);

// Refuses a plan that does not fit `capacity` bytes, in one line ending "but <memory>; lower
// ...": the config.json field that holds most parameters when the model's own state (weights,
// gradients, optimizer state) does not fit (refuse_model_beyond checks only that), else the
// batch and sequence flags.
void refuse_model_beyond(const PlanInput& in, const MemoryPlan& p, int64_t capacity, const std::string& memory);
void refuse_plan_beyond(const PlanInput& in, const MemoryPlan& p, int64_t capacity, const std::string& memory);

// Parses sizes like "16GB", "16GiB", "80G", "1500MB" (decimal units are powers of 1000,
// binary ones powers of 1024, a bare G means GiB as nvidia-smi prints it).
int64_t parse_bytes(const std::string& s, const std::string& flag);

// The largest micro-batch (up to `limit`) whose plan plus `reserved` fits in `capacity`;
// 0 when not even a batch of one fits.
int64_t largest_batch_that_fits(PlanInput in, int64_t capacity, int64_t reserved, int64_t limit = 4096);

// A cheaper configuration that would fit, with its planned total: what the out-of-memory
// refusal suggests.
struct Lever {
  std::string description;
  int64_t total = 0;
};
std::vector<Lever> levers_that_fit(const PlanInput& in, int64_t capacity, int64_t reserved,
                                   int64_t gradient_accumulation_steps);

// The table, one line per category: MiB and bytes per parameter.
std::string format_plan(const MemoryPlan& p);

}  // namespace anatomy
