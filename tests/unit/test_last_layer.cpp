// The last layer on the first tokens (Note [last layer on the first tokens] in model/bert.cpp,
// Note [modernbert first tokens] in model/modernbert.cpp): the same losses and gradients as the
// last layer on every token, for each encoder of the BERT class and ModernBERT, padded and
// packed, under each checkpointing policy and gradient placement, with exactly the GEMM FLOPs of
// the other rows left out and the attention FLOPs of the other queries (so a silent fallback to
// every token fails); the packed evaluation;
// the activation bytes it saves for bert-large; the trainer's switch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/compare.h"
#include "../common/packed_step.h"
#include "memory/planner.h"
#include "model/bert.h"
#include "ops/backend.h"
#include "train/options.h"

using namespace anatomy;
using anatomy::testing_compare::largest_magnitude;
using namespace anatomy::testing_packed;
using anatomy::testing_compare::same_values;

namespace {

BertConfig family_config(Architecture arch) {
  BertConfig c = config(false);
  c.architecture = arch;
  if (arch == Architecture::Roberta) c.pad_token_id = 1;  // positions from row pad + 1 (Note [roberta positions])
  if (arch == Architecture::Electra) c.embedding_size = 16;  // projected to the hidden size
  return c;
}

// The FLOPs of the GEMMs a backend ran ("matmul", "matmul+bias", "matmul (weight grad)", ...),
// and of its attention ops.
struct GemmFlops : OpObserver {
  double flops = 0, attention = 0;
  void before(Backend&, const OpEvent& e) override {
    if (std::string(e.name).rfind("matmul", 0) == 0) flops += e.cost.flops;
    if (std::string(e.name) == "attention") attention += e.cost.flops;
  }
  void after(Backend&, const OpEvent&) override {}
};

// The attention FLOPs (forward 4 and backward 10 a query-key pair and head dimension, times
// `forwards` forwards) of the queries after the first (Note [attention scope] in ops/op_args.h):
// padded, each sequence's T - 1 later queries on its T keys; packed, len - 1 on len.
double later_query_flops(const BertConfig& cfg, const std::vector<int64_t>& lens, int64_t T, bool packed, int forwards = 1) {
  double pairs = 0;
  for (int64_t len : lens) pairs += packed ? static_cast<double>(len) * (len - 1) : static_cast<double>(T) * (T - 1);
  return (4.0 * forwards + 10.0) * static_cast<double>(cfg.hidden_size) * pairs;
}

// The GEMM FLOPs of one row of a BERT layer past attention: forward, dX and dW of three Linears,
// and the forward's epilogues (one operation an element for each bias, 8 more for the GELU:
// telemetry/op_cost.cpp).
double bert_row_flops(const BertConfig& cfg) {
  const double H = static_cast<double>(cfg.hidden_size), I = static_cast<double>(cfg.intermediate_size);
  return 3 * 2 * (H * H + 2 * H * I) + (H + I + H) + 8 * I;
}

}  // namespace

TEST(LastLayerFirstTokens, EqualsEveryTokenInEachFamilyPaddedAndPacked) {
  auto cpu = make_cpu_backend(1);
  const std::vector<int64_t> lens = {5, 12, 3, 16, 9};
  const HostBatch hb = batch_of(lens, 16, 3);
  for (Architecture arch : {Architecture::Bert, Architecture::Roberta, Architecture::DistilBert, Architecture::Electra}) {
    const BertConfig cfg = family_config(arch);
    for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
      for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
        for (int packing = 0; packing < (policy == CheckpointPolicy::Layer ? 1 : 3); ++packing) {
          const bool packed = packing > 0;
          const Packing how{packing == 1, 1};
          SCOPED_TRACE(std::to_string(static_cast<int>(arch)) + " / " + checkpoint_policy_name(policy) + " / " +
                       gradient_placement_name(place) + " / packing " + std::to_string(packing));
          GemmFlops all_ops, first_ops;
          cpu->set_observer(&all_ops);
          const Step all = step(*cpu, cfg, hb, packed, policy, place, DType::F32, how, false);
          cpu->set_observer(&first_ops);
          const Step first = step(*cpu, cfg, hb, packed, policy, place, DType::F32, how, true);
          cpu->set_observer(nullptr);
          ASSERT_GT(largest_magnitude(all.grads), 1e-4);  // the comparison below is not between zeros
          EXPECT_TRUE(same_values<float>(first.losses, all.losses, 1e-6));
          EXPECT_TRUE(same_values<float>(first.grads, all.grads, 1e-6 * largest_magnitude(all.grads)));
          // The first tokens' path ran (the last layer is never recomputed): its GEMMs' FLOPs, exactly.
          const double rows = packed ? 5 + 12 + 3 + 16 + 9 : 5 * 16;
          EXPECT_DOUBLE_EQ(all_ops.flops - first_ops.flops, (rows - 5) * bert_row_flops(cfg));
          EXPECT_DOUBLE_EQ(all_ops.attention - first_ops.attention, later_query_flops(cfg, lens, 16, packing == 1));
        }
      }
    }
  }
}

TEST(LastLayerFirstTokens, ModernBertEqualsEveryTokenPaddedAndPacked) {
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = modernbert_config("ModernBertForSequenceClassification", "cls");
  const std::vector<int64_t> lens = {5, 12, 3, 16, 9};
  const HostBatch hb = batch_of(lens, 16, 3);
  const double H = static_cast<double>(cfg.hidden_size), I = static_cast<double>(cfg.intermediate_size);
  // Forward, dX and dW of the output projection, Wi (H -> 2I) and the MLP's Wo, and their bias epilogues.
  const double per_row = 3 * 2 * (H * H + 2 * H * I + I * H) + (H + 2 * I + H);
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    for (GradientPlacement place : {GradientPlacement::Own, GradientPlacement::InActivations}) {
      for (bool packed : {false, true}) {
        if (packed && policy == CheckpointPolicy::Layer) continue;  // refused (Note [modernbert packed tokens])
        SCOPED_TRACE(std::string(checkpoint_policy_name(policy)) + " / " + gradient_placement_name(place) +
                     (packed ? " / packed" : " / padded"));
        GemmFlops all_ops, first_ops;
        cpu->set_observer(&all_ops);
        const Step all = step(*cpu, cfg, hb, packed, policy, place, DType::F32, {}, false);
        cpu->set_observer(&first_ops);
        const Step first = step(*cpu, cfg, hb, packed, policy, place, DType::F32, {}, true);
        cpu->set_observer(nullptr);
        ASSERT_GT(largest_magnitude(all.grads), 1e-4);
        EXPECT_TRUE(same_values<float>(first.losses, all.losses, 1e-6));
        EXPECT_TRUE(same_values<float>(first.grads, all.grads, 1e-6 * largest_magnitude(all.grads)));
        const double rows = packed ? 5 + 12 + 3 + 16 + 9 : 5 * 16;
        const double recomputed = policy == CheckpointPolicy::Layer ? 2 : 1;  // layer recompute runs forward again
        EXPECT_DOUBLE_EQ(all_ops.flops - first_ops.flops,
                         (rows - 5) * (per_row + (recomputed - 1) * (2 * (H * H + 2 * H * I + I * H) + H + 2 * I + H)));
        EXPECT_DOUBLE_EQ(all_ops.attention - first_ops.attention,
                         later_query_flops(cfg, lens, 16, packed, static_cast<int>(recomputed)));
      }
    }
  }
}

// The packed evaluation (no hidden state kept) runs the last layer the same way, BERT-class and
// ModernBERT: the same logits, fewer FLOPs.
TEST(LastLayerFirstTokens, PackedEvaluationGivesTheSameLogits) {
  auto cpu = make_cpu_backend(1);
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (Architecture arch : {Architecture::Bert, Architecture::Electra}) {
    const BertConfig cfg = family_config(arch);
    for (Packing how : {Packing{true, 1}, Packing{false, 16}}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(arch)) + (how.attention ? " / packed attention" : " / padded attention"));
      GemmFlops all_ops, first_ops;
      cpu->set_observer(&all_ops);
      const std::vector<float> all = eval_logits(*cpu, cfg, hb, true, how, false);
      cpu->set_observer(&first_ops);
      const std::vector<float> first = eval_logits(*cpu, cfg, hb, true, how, true);
      cpu->set_observer(nullptr);
      ASSERT_GT(largest_magnitude(all), 1e-3);
      EXPECT_TRUE(same_values<float>(first, all, 1e-6 * largest_magnitude(all)));
      EXPECT_LT(first_ops.flops, all_ops.flops);
    }
  }
  // ModernBERT's cls head, on the packed rows (its packed evaluation needs the packed attention).
  const BertConfig mb = modernbert_config("ModernBertForSequenceClassification", "cls");
  GemmFlops all_ops, first_ops;
  cpu->set_observer(&all_ops);
  const std::vector<float> all = eval_logits(*cpu, mb, hb, true, Packing{true, 1}, false);
  cpu->set_observer(&first_ops);
  const std::vector<float> first = eval_logits(*cpu, mb, hb, true, Packing{true, 1}, true);
  cpu->set_observer(nullptr);
  ASSERT_GT(largest_magnitude(all), 1e-3);
  EXPECT_TRUE(same_values<float>(first, all, 1e-6 * largest_magnitude(all)));
  EXPECT_LT(first_ops.flops, all_ops.flops);
}

// bert-large, seq 512, bf16, batch 32: the last layer's rows past attention (h1, the GELU input and
// output, two rstd vectors) and its output become B rows; the planner counts exactly that, and
// the plan is what the model allocates (the planner tests hold that for every shape).
TEST(LastLayerFirstTokens, PlansTheLastLayersRowsForBertLarge) {
  const BertConfig cfg = BertConfig::preset("bert-large");
  ModelShape all{32, 512, DType::BF16, CheckpointPolicy::None, true, GradientPlacement::Own};
  all.last_layer_first_tokens = false;
  ModelShape first = all;
  first.last_layer_first_tokens = true;
  const MemoryPlan a = plan_memory({cfg, all, OptimizerKind::AdamW, Device::CUDA});
  const MemoryPlan f = plan_memory({cfg, first, OptimizerKind::AdamW, Device::CUDA});
  const int64_t R = 32 * 512, B = 32, H = 1024, I = 4096;
  // h1, pre and g (2 bytes), rstd1 and rstd2 (4 bytes) on R - B rows fewer; the output's R rows
  // become the first tokens' context (B rows; cls moves from the head into the layer).
  const int64_t saved = (R - B) * (2 * H + 2 * 2 * I + 2 * 4) + (R - B) * H * 2;
  const int64_t diff = a.bytes[Category::Activations] - f.bytes[Category::Activations];
  std::printf("[ last layer ] bert-large bf16 batch 32: activations %.1f -> %.1f MiB\n",
              a.bytes[Category::Activations] / 1048576.0, f.bytes[Category::Activations] / 1048576.0);
  EXPECT_NEAR(static_cast<double>(diff), static_cast<double>(saved), 4096.0);  // arena alignment
  EXPECT_EQ(a.bytes[Category::Weights], f.bytes[Category::Weights]);
}

TEST(LastLayerFirstTokens, TheTrainersSwitchComparesWithEveryToken) {
  const BertConfig cfg = BertConfig::preset("bert-tiny");
  TrainOptions o;
  ASSERT_EQ(unsetenv("ANATOMY_LAST_LAYER"), 0);
  EXPECT_TRUE(plan_input(o, cfg, 4, Device::CPU, 1).shape.last_layer_first_tokens);
  ASSERT_EQ(setenv("ANATOMY_LAST_LAYER", "all", 1), 0);
  EXPECT_FALSE(plan_input(o, cfg, 4, Device::CPU, 1).shape.last_layer_first_tokens);
  ASSERT_EQ(unsetenv("ANATOMY_LAST_LAYER"), 0);
}
