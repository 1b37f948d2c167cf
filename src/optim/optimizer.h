// Optimizers over the flat parameter buffers (Note [flat parameter layout]). Each owns its state
// in Category::OptimizerState and updates the decay and no-decay groups in one call each.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "ops/backend.h"

namespace anatomy {

class ParamLayout;

enum class OptimizerKind : uint8_t { AdamW, Sgd, AdamW8bit, Adafactor };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::AdamW;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW and 8-bit AdamW (the Trainer's defaults)
  float momentum = 0.0f;  // SGD: torch.optim.SGD's default, as the Trainer's --optim sgd (0: no momentum buffer)
  float weight_decay = 0.0f;
};

OptimizerKind parse_optimizer(const std::string& s);  // throws naming --optim
const char* optimizer_name(OptimizerKind k);
// Bytes the optimizer allocates (all Category::OptimizerState) for a model's flat parameter
// layout: the planner's arithmetic, exactly what Optimizer::create allocates. SGD keeps a
// momentum buffer only with momentum (`sgd_momentum`), as torch.optim.SGD does.
size_t optimizer_state_bytes(OptimizerKind k, const ParamLayout& layout, bool sgd_momentum = false);

// The parameters an update touches: F32 masters and gradients, the optional half copy, and
// where the weight-decay group ends.
struct ParamGroups {
  Tensor master, half_copy, grads;
  size_t decay_end = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(const ParamGroups& p, const GradTransform& g, float lr) = 0;
  // Named state tensors (for checkpoints) and the number of steps taken.
  virtual std::vector<std::pair<std::string, Tensor>> state() = 0;
  int64_t steps() const { return m_steps; }
  OptimizerKind kind() const { return m_kind; }
  void set_steps(int64_t s) { m_steps = s; }

  // State for the flat buffers of `layout` (Adafactor factors each parameter's own shape).
  static std::unique_ptr<Optimizer> create(Backend& be, const OptimizerOptions& o, const ParamLayout& layout);
  // State for `n` elements of any flat range (a ZeRO shard): the element-wise optimizers only
  // (AdamW, SGD); throws naming --optim for the others, whose state follows parameter shapes.
  static std::unique_ptr<Optimizer> create_for_range(Backend& be, const OptimizerOptions& o, size_t n);
  static size_t range_state_bytes(OptimizerKind k, size_t n, bool sgd_momentum = false);

 protected:
  int64_t m_steps = 0;
  OptimizerKind m_kind = OptimizerKind::AdamW;  // set by create()
};

// Learning rate for optimizer step k (0-based): "linear" decays from lr to 0 over total steps
// after warmup (the Trainer's default), "constant" keeps lr (after warmup), "cosine" follows half
// a cosine from lr to 0 and "polynomial" decays linearly to 1e-7 (transformers' schedules).
// The learning-rate schedules after the linear warm-up (transformers' names: linear, constant,
// cosine, polynomial).
enum class Schedule : uint8_t { Linear, Constant, Cosine, Polynomial };
Schedule parse_schedule(const std::string& s);  // throws naming the learning-rate schedule
const char* schedule_name(Schedule s);
float scheduled_lr(Schedule schedule, float lr, int64_t k, int64_t total, int64_t warmup);

}  // namespace anatomy
