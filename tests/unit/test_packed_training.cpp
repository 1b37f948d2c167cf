// Training on real tokens (Note [packed training] in model/bert.cpp): forward_backward on a
// packed batch against the padded one on the CPU, fp32, same weights: per-sample losses and
// every parameter gradient, under each checkpointing policy that supports it and with the
// gradients in freed activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../common/compare.h"
#include "../common/packed_step.h"
#include "core/error.h"
#include "model/bert.h"
#include "ops/backend.h"

using namespace anatomy;
using anatomy::testing_compare::same_values;

namespace {

using namespace anatomy::testing_packed;

double largest(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace

TEST(PackedTraining, LossesAndGradientsEqualThePaddedStep) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
    for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      SCOPED_TRACE(std::string(checkpoint_policy_name(policy)) + " / " + gradient_placement_name(place));
      const Step padded = step(*cpu, cfg, hb, false, policy, place);
      const Step packed = step(*cpu, cfg, hb, true, policy, place);
      ASSERT_GT(largest(padded.grads), 1e-4);  // the comparison below is not between zeros
      EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
      EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest(padded.grads)));
    }
  }
}

TEST(PackedTraining, IsBitForBitThePaddedStepWhenNothingIsPadding) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({8, 8, 8}, 8, 5);
  const Step padded = step(*cpu, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  const Step packed = step(*cpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own);
  EXPECT_TRUE(same_values<float>(packed.losses, padded.losses));
  EXPECT_TRUE(same_values<float>(packed.grads, padded.grads));
}

TEST(PackedTraining, WithDropoutTheGradientsStayFiniteAndDifferFromNoDropout) {
  auto cpu = make_cpu_backend(1);
  const HostBatch hb = batch_of({5, 12, 3, 16}, 16, 9);
  const Step with = step(*cpu, config(true), hb, true, CheckpointPolicy::Selective, GradientPlacement::Own);
  const Step without = step(*cpu, config(false), hb, true, CheckpointPolicy::Selective, GradientPlacement::Own);
  for (float g : with.grads) ASSERT_TRUE(std::isfinite(g));
  EXPECT_FALSE(same_values<float>(with.grads, without.grads, 1e-6));
}

TEST(PackedTraining, RefusesLayerCheckpointing) {
  auto be = make_cpu_backend(1);
  ModelShape shape;
  shape.max_batch = 2;
  shape.max_seq = 8;
  shape.checkpointing = CheckpointPolicy::Layer;
  shape.packed_tokens = true;
  EXPECT_THROW(BertForSequenceClassification(*be, config(false), shape), Error);
}
