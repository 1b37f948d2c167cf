// The memory plan with the gradients in freed activations (Note [gradients in freed
// activations] in model/bert.cpp) against the plan with a buffer of their own, any encoder.
#pragma once
#include <gtest/gtest.h>

#include "memory/planner.h"

namespace anatomy::testing_plan {

// At shape `s` (its placement ignored), on CUDA with AdamW: the categories are the same in both
// plans, at least min_fraction of the gradient bytes are shared, and the total is smaller by them.
inline void expect_gradients_shared(const BertConfig& cfg, ModelShape s, double min_fraction) {
  s.gradients = GradientPlacement::InActivations;
  const MemoryPlan in = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CUDA});
  s.gradients = GradientPlacement::Own;
  const MemoryPlan own = plan_memory({cfg, s, OptimizerKind::AdamW, Device::CUDA});
  const double grads = static_cast<double>(own.bytes[Category::Gradients]);
  EXPECT_EQ(in.bytes[Category::Gradients], own.bytes[Category::Gradients]);
  EXPECT_EQ(in.bytes[Category::Activations], own.bytes[Category::Activations]);
  EXPECT_GE(static_cast<double>(in.bytes.shared), min_fraction * grads);
  EXPECT_LE(in.bytes.shared, own.bytes[Category::Gradients]);
  EXPECT_EQ(in.total(), own.total() - in.bytes.shared);
}

}  // namespace anatomy::testing_plan
