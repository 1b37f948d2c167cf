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
#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "model/bert.h"
#include "ops/backend.h"

using namespace anatomy;
using anatomy::testing_compare::same_values;

namespace {

// Small and deliberately irregular: intermediate 48 < 3 * hidden, so backward's scratch is
// sized by q|k|v, not by the feed-forward.
BertConfig config(bool dropout) {
  BertConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 48;
  c.max_position_embeddings = 32;
  c.num_labels = 3;
  c.hidden_dropout_prob = dropout ? 0.1 : 0.0;
  c.attention_probs_dropout_prob = dropout ? 0.1 : 0.0;
  return c;
}

// Sequence b has lengths[b] tokens ([CLS] words [SEP]), then padding.
HostBatch batch_of(const std::vector<int64_t>& lengths, int64_t T, uint64_t seed) {
  Rng rng(seed);
  HostBatch hb;
  hb.resize(static_cast<int64_t>(lengths.size()), T);
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int64_t t = 0; t < lengths[b]; ++t) {
      hb.input_ids[b * T + t] = t == 0 ? 2 : t == lengths[b] - 1 ? 3 : static_cast<int32_t>(rng.randint(5, 40));
      hb.token_type_ids[b * T + t] = t >= lengths[b] / 2 ? 1 : 0;
      hb.attention_mask[b * T + t] = 1;
    }
    hb.labels[b] = static_cast<int32_t>(b % 3);
  }
  return hb;
}

struct Uploaded {
  Buffer ids, types, mask, labels, rows, first;
  DeviceBatch db;
  Uploaded(Backend& be, const HostBatch& hb, bool packed) {
    Allocator& al = be.allocator();
    const int64_t B = hb.batch, T = hb.seq;
    ids = Buffer(al, DType::I32, {B, T}, Category::Other);
    types = Buffer(al, DType::I32, {B, T}, Category::Other);
    mask = Buffer(al, DType::I32, {B, T}, Category::Other);
    labels = Buffer(al, DType::I32, {B}, Category::Other);
    be.upload(ids, hb.input_ids.data());
    be.upload(types, hb.token_type_ids.data());
    be.upload(mask, hb.attention_mask.data());
    be.upload(labels, hb.labels.data());
    db = DeviceBatch{ids.tensor(), types.tensor(), mask.tensor(), labels.tensor()};
    if (packed) {
      const PackedRows pr = pack_token_rows(hb.attention_mask.data(), B, T);
      rows = Buffer(al, DType::I32, {static_cast<int64_t>(pr.token_rows.size())}, Category::Other);
      first = Buffer(al, DType::I32, {B}, Category::Other);
      be.upload(rows, pr.token_rows.data());
      be.upload(first, pr.first_rows.data());
      db.token_rows = rows.tensor();
      db.first_rows = first.tensor();
    }
  }
};

struct Step {
  std::vector<float> losses, grads;
};

// One forward_backward of `hb` on a fresh model (seeded weights), packed or padded.
Step step(const BertConfig& cfg, const HostBatch& hb, bool packed, CheckpointPolicy policy, GradientPlacement place) {
  auto be = make_cpu_backend(1);
  ModelShape shape;
  shape.max_batch = hb.batch;
  shape.max_seq = hb.seq;
  shape.checkpointing = policy;
  shape.gradients = place;
  shape.packed_tokens = packed;
  BertForSequenceClassification m(*be, cfg, shape);
  m.init_weights(7);
  m.set_dropout_seed(11);
  if (!m.gradients_in_activations()) m.zero_grads();
  Uploaded up(*be, hb, packed);
  m.forward_backward(up.db, 1.0f / static_cast<float>(hb.batch), 0);
  Step s;
  s.losses.resize(static_cast<size_t>(hb.batch));
  be->download(s.losses.data(), m.losses());
  s.grads = m.grads_to_host();
  return s;
}

double largest(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

}  // namespace

TEST(PackedTraining, LossesAndGradientsEqualThePaddedStep) {
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
    for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      SCOPED_TRACE(std::string(checkpoint_policy_name(policy)) + " / " + gradient_placement_name(place));
      const Step padded = step(cfg, hb, false, policy, place);
      const Step packed = step(cfg, hb, true, policy, place);
      ASSERT_GT(largest(padded.grads), 1e-4);  // the comparison below is not between zeros
      EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
      EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest(padded.grads)));
    }
  }
}

TEST(PackedTraining, IsBitForBitThePaddedStepWhenNothingIsPadding) {
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({8, 8, 8}, 8, 5);
  const Step padded = step(cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  const Step packed = step(cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own);
  EXPECT_TRUE(same_values<float>(packed.losses, padded.losses));
  EXPECT_TRUE(same_values<float>(packed.grads, padded.grads));
}

TEST(PackedTraining, WithDropoutTheGradientsStayFiniteAndDifferFromNoDropout) {
  const HostBatch hb = batch_of({5, 12, 3, 16}, 16, 9);
  const Step with = step(config(true), hb, true, CheckpointPolicy::Selective, GradientPlacement::Own);
  const Step without = step(config(false), hb, true, CheckpointPolicy::Selective, GradientPlacement::Own);
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
