// Training on real tokens (Note [packed training] in model/bert.cpp): forward_backward on a
// packed batch against the padded one on the CPU, fp32, same weights: per-sample losses and
// every parameter gradient, under each checkpointing policy that supports it and with the
// gradients in freed activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../common/compare.h"
#include "../common/packed_step.h"
#include "core/error.h"
#include "model/bert.h"
#include "model/heads.h"
#include "model/modernbert.h"
#include "ops/backend.h"
#include "ops/observer.h"

using namespace anatomy;
using anatomy::testing_compare::largest_magnitude;
using anatomy::testing_compare::same_values;

namespace {

using namespace anatomy::testing_packed;

}  // namespace

// Each packing: attention on the packed rows (Note [packed attention] in ops/cpu/attention.cpp)
// or on the padded layout, without and with padding rows after the tokens (a row multiple).
TEST(PackedTraining, LossesAndGradientsEqualThePaddedStep) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
    for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      const Step padded = step(*cpu, cfg, hb, false, policy, place);
      ASSERT_GT(largest_magnitude(padded.grads), 1e-4);  // the comparison below is not between zeros
      for (Packing how : {Packing{true, 1}, Packing{true, 16}, Packing{false, 1}, Packing{false, 16}}) {
        SCOPED_TRACE(std::string(checkpoint_policy_name(policy)) + " / " + gradient_placement_name(place) +
                     (how.attention ? " / packed attention" : " / padded attention") + " / multiple " +
                     std::to_string(how.multiple));
        const Step packed = step(*cpu, cfg, hb, true, policy, place, DType::F32, how);
        EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
        EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest_magnitude(padded.grads)));
      }
    }
  }
}

// Attention on the packed rows drops the per-layer scatters, gathers and fills around attention:
// 5 copies and 2 fills a layer (forward: a fill and a scatter of q|k|v, a gather of the context;
// backward: a gather of the context, a fill and a scatter of dctx, a gather of dq|dk|dv).
TEST(PackedTraining, PackedAttentionDropsTheRowCopiesAroundAttention) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = config(false);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  OpTally rows, layout;
  cpu->set_observer(&rows);
  step(*cpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own, DType::F32, Packing{true, 1});
  cpu->set_observer(&layout);
  step(*cpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own, DType::F32, Packing{false, 1});
  cpu->set_observer(nullptr);
  const int L = static_cast<int>(cfg.num_hidden_layers);
  EXPECT_EQ(rows.attention, 2 * L);
  EXPECT_EQ(layout.attention, 2 * L);
  // The embeddings' rows each way; the last layer's first tokens (Note [last layer on the first
  // tokens]): their context and input rows gathered, their dctx and ds1 scattered.
  EXPECT_EQ(rows.copies, 2 + 4);
  // The last layer's output projection reads the first tokens' context in backward: no gather.
  EXPECT_EQ(layout.copies - rows.copies, 5 * L - 1);
  EXPECT_EQ(layout.fills - rows.fills, 2 * L);
}

TEST(PackedTraining, OffsetsOnlyWhenEverySequenceIsRightPadded) {
  const std::vector<int32_t> right = {1, 1, 1, 0, 1, 0, 0, 0}, hole = {1, 0, 1, 0, 1, 1, 1, 1},
                             empty = {1, 1, 0, 0, 0, 0, 0, 0};
  const PackedRows r = pack_token_rows(right.data(), 2, 4, 8);
  EXPECT_EQ(r.seq_offsets(), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(r.attended_pairs.every, 9 + 1);
  EXPECT_EQ(r.attended_pairs.first, 3 + 1);
  EXPECT_EQ(r.token_rows.size(), 8u);  // padded to the multiple with rows after the sequences
  EXPECT_TRUE(pack_token_rows(hole.data(), 2, 4).seq_offsets().empty());
  EXPECT_TRUE(pack_token_rows(empty.data(), 2, 4).seq_offsets().empty());  // sequence 1 attends to nothing
}

// The per-token heads (token classification, masked LM) run padded on the encoder's real-token
// output (Note [packed training]): the losses and every gradient are the padded step's.
TEST(PackedTraining, PerTokenHeadsEqualThePaddedStep) {
  auto cpu = make_cpu_backend(1);
  for (const char* arch : {"BertForTokenClassification", "BertForMaskedLM"}) {
    const BertConfig cfg = token_config(false, arch);
    ASSERT_TRUE(has_token_labels(cfg));
    const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3, std::string(arch) == "BertForMaskedLM" ? cfg.vocab_size : 3);
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
      for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
        const Step padded = step(*cpu, cfg, hb, false, policy, place);
        ASSERT_GT(largest_magnitude(padded.grads), 1e-4);
        for (Packing how : {Packing{true, 16}, Packing{false, 1}}) {
          SCOPED_TRACE(std::string(arch) + " / " + checkpoint_policy_name(policy) + " / " +
                       gradient_placement_name(place) + (how.attention ? " / packed attention" : " / padded attention"));
          const Step packed = step(*cpu, cfg, hb, true, policy, place, DType::F32, how);
          EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
          EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest_magnitude(padded.grads)));
        }
      }
    }
  }
}

// Their evaluation too: the packed inference forward's logits equal the padded one's on every
// token (the padding rows' logits are read by nobody).
TEST(PackedTraining, PerTokenHeadsEvaluateLikeThePaddedForward) {
  auto cpu = make_cpu_backend(1);
  for (const char* arch : {"BertForTokenClassification", "BertForMaskedLM"}) {
    const BertConfig cfg = token_config(false, arch);
    const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
    const std::vector<float> padded = eval_logits(*cpu, cfg, hb, false);
    const int64_t C = static_cast<int64_t>(padded.size()) / (hb.batch * hb.seq);
    ASSERT_EQ(static_cast<size_t>(hb.batch * hb.seq * C), padded.size());
    for (Packing how : {Packing{true, 16}, Packing{false, 1}}) {
      SCOPED_TRACE(std::string(arch) + (how.attention ? " / packed attention" : " / padded attention"));
      const std::vector<float> packed = eval_logits(*cpu, cfg, hb, true, how);
      ASSERT_EQ(packed.size(), padded.size());
      double worst = 0;
      int64_t compared = 0;
      for (int64_t r = 0; r < hb.batch * hb.seq; ++r) {
        if (hb.attention_mask[static_cast<size_t>(r)] == 0) continue;
        ++compared;
        for (int64_t c = 0; c < C; ++c)
          worst = std::max(worst, std::fabs(static_cast<double>(packed[r * C + c]) - padded[r * C + c]));
      }
      EXPECT_EQ(compared, 5 + 12 + 3 + 16 + 9);
      EXPECT_LT(worst, 1e-5);
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
  EXPECT_THROW(ModernBertForSequenceClassification(*be, modernbert_config("ModernBertForSequenceClassification"), shape),
               Error);
}

// ---- ModernBERT (Note [modernbert packed tokens] in model/modernbert.cpp) --------------------------

namespace {

struct Head {
  const char* architecture;
  const char* pooling;
};
constexpr Head kModernHeads[] = {{"ModernBertForSequenceClassification", "mean"},
                                 {"ModernBertForSequenceClassification", "cls"},
                                 {"ModernBertForTokenClassification", "mean"},
                                 {"ModernBertForMaskedLM", "mean"}};

}  // namespace

// Each head (mean and first-token pooling, per token, masked LM), each checkpointing policy that
// packs and each gradient placement, attention on the packed rows with and without padding rows
// after the tokens: the losses and every gradient are the padded step's. Without the offsets
// (Packing{false}) the model computes padded: the same again.
TEST(PackedTraining, ModernBertEqualsThePaddedStep) {
  auto cpu = make_cpu_backend(1);
  const HostBatch base = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (const Head& head : kModernHeads) {
    const BertConfig cfg = modernbert_config(head.architecture, head.pooling);
    const HostBatch hb = is_masked_lm(cfg) ? batch_of({5, 12, 3, 16, 9}, 16, 3, cfg.vocab_size) : base;
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
      for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
        const Step padded = step(*cpu, cfg, hb, false, policy, place);
        ASSERT_GT(largest_magnitude(padded.grads), 1e-4);
        for (Packing how : {Packing{true, 1}, Packing{true, 16}, Packing{false, 1}}) {
          SCOPED_TRACE(std::string(head.architecture) + " / " + head.pooling + " / " + checkpoint_policy_name(policy) +
                       " / " + gradient_placement_name(place) + (how.attention ? " / packed" : " / no offsets") +
                       " / multiple " + std::to_string(how.multiple));
          const Step packed = step(*cpu, cfg, hb, true, policy, place, DType::F32, how);
          EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 1e-6));
          EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 1e-5 * largest_magnitude(padded.grads)));
        }
      }
    }
  }
}

// The packed step does the work of the real tokens: attention's and rotary's FLOPs shrink with
// the tokens (5 + 12 + 3 + 16 + 9 = 45 token rows of B*T = 5 x 16).
TEST(PackedTraining, ModernBertComputesOnTheRealTokens) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = modernbert_config("ModernBertForSequenceClassification");
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  OpTally packed, padded;
  cpu->set_observer(&packed);
  step(*cpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own);
  cpu->set_observer(&padded);
  step(*cpu, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own);
  cpu->set_observer(nullptr);
  ASSERT_GT(padded.rotary_flops, 0);
  EXPECT_NEAR(packed.rotary_flops / padded.rotary_flops, 45.0 / 80.0, 1e-9);
  EXPECT_LT(packed.attention_flops, 0.75 * padded.attention_flops);
  EXPECT_LT(packed.flops, 0.75 * padded.flops);
}

// Evaluation packs too: the inference forward's logits are the padded forward's (every sample's,
// or every token's under the per-token heads).
TEST(PackedTraining, ModernBertEvaluatesLikeThePaddedForward) {
  auto cpu = make_cpu_backend(1);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (const Head& head : kModernHeads) {
    const BertConfig cfg = modernbert_config(head.architecture, head.pooling);
    const std::vector<float> padded = eval_logits(*cpu, cfg, hb, false);
    const bool tokens = has_token_labels(cfg);
    const int64_t rows = tokens ? hb.batch * hb.seq : hb.batch, C = static_cast<int64_t>(padded.size()) / rows;
    for (Packing how : {Packing{true, 1}, Packing{true, 16}}) {
      SCOPED_TRACE(std::string(head.architecture) + " / " + head.pooling + " / multiple " + std::to_string(how.multiple));
      OpTally ran;  // the packed rows ran: rotary's FLOPs are those of the 45 token rows (or 48), not 80
      cpu->set_observer(&ran);
      const std::vector<float> packed = eval_logits(*cpu, cfg, hb, true, how);
      cpu->set_observer(nullptr);
      OpTally all;
      cpu->set_observer(&all);
      eval_logits(*cpu, cfg, hb, false);
      cpu->set_observer(nullptr);
      EXPECT_NEAR(ran.rotary_flops / all.rotary_flops, (how.multiple == 1 ? 45.0 : 48.0) / 80.0, 1e-9);
      ASSERT_EQ(packed.size(), padded.size());
      double worst = 0, largest_logit = 0;
      for (int64_t r = 0; r < rows; ++r) {
        if (tokens && hb.attention_mask[static_cast<size_t>(r)] == 0) continue;
        for (int64_t c = 0; c < C; ++c) {
          worst = std::max(worst, std::fabs(static_cast<double>(packed[r * C + c]) - padded[r * C + c]));
          largest_logit = std::max(largest_logit, std::fabs(static_cast<double>(padded[r * C + c])));
        }
      }
      ASSERT_GT(largest_logit, 1e-3);
      EXPECT_LT(worst, 1e-5 * std::max(1.0, largest_logit));
    }
  }
}
