// What a backend tells an observer about each op it runs (Note [op observer] in
// ops/contract.cpp): its name, the phase of the step that issued it, and its declared cost
// (computed by telemetry/op_cost.h).
#pragma once
#include <cstdint>

namespace anatomy {

class Backend;

// Which part of a training step issues an op (set by the model and trainer; observers read it).
enum class Phase : uint8_t { Forward, Backward, Optimizer, Data };

enum class OpClass : uint8_t {
  TensorContraction,         // GEMMs and the fused attention (its flops are all matrix products)
  StatisticalNormalization,  // LayerNorm, softmax cross-entropy
  Elementwise,               // bias gradients, dropout, GELU, tanh, residual adds, embeddings, casts
  Optimizer,                 // gradient norm and the parameter update
  Data,                      // host <-> device copies
};
constexpr int kNumOpClasses = 5;

// Floating-point operations and the fewest bytes the op must move.
struct OpCost {
  double flops = 0;
  double bytes = 0;
  OpClass cls = OpClass::Elementwise;
};

struct OpEvent {
  const char* name;  // the profile's row name ("matmul+bias", "layernorm", ...)
  Phase phase;
  OpCost cost;
};

// Called on the thread that issues the op, before and after the backend runs it (on the GPU
// in stream order: after() returns before the device has finished the op).
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void before(Backend& be, const OpEvent& e) = 0;
  virtual void after(Backend& be, const OpEvent& e) = 0;
};

}  // namespace anatomy
