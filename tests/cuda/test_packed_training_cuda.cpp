// Training on real tokens on the GPU (Note [packed training] in model/bert.cpp): the packed
// step against the padded one on the same device and against the CPU twin, F32 (the cuBLAS
// attention path) and BF16 (the flash kernels).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../common/compare.h"
#include "../common/packed_step.h"
#include "ops/backend.h"

using namespace anatomy;
using anatomy::testing_compare::largest_magnitude;
using namespace anatomy::testing_packed;
using anatomy::testing_compare::same_values;

TEST(PackedTrainingCuda, MatchesThePaddedStepAndTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend(1);
  const BertConfig cfg = config(false);
  // Head dim 8: the F32 attention path.
  const HostBatch hb = batch_of({5, 12, 3, 16, 9}, 16, 3);
  for (CheckpointPolicy policy : {CheckpointPolicy::None, CheckpointPolicy::Selective}) {
    SCOPED_TRACE(checkpoint_policy_name(policy));
    const Step cpu_padded = step(*cpu, cfg, hb, false, policy, GradientPlacement::Own);
    const Step gpu_padded = step(*gpu, cfg, hb, false, policy, GradientPlacement::Own);
    const Step gpu_packed = step(*gpu, cfg, hb, true, policy, GradientPlacement::Own);
    const double g = largest_magnitude(cpu_padded.grads);
    EXPECT_TRUE(same_values<float>(gpu_packed.losses, gpu_padded.losses, 1e-5));
    EXPECT_TRUE(same_values<float>(gpu_packed.grads, gpu_padded.grads, 1e-4 * g));
    EXPECT_TRUE(same_values<float>(gpu_packed.grads, cpu_padded.grads, 1e-4 * g));
  }
}

TEST(PackedTrainingCuda, Bf16FlashPathMatchesThePaddedStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  const BertConfig cfg = on_flash_kernels(config(false));
  const HostBatch hb = batch_of({5, 40, 3, 64, 33}, 64, 4);
  const Step padded = step(*gpu, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own, DType::BF16);
  const double g = largest_magnitude(padded.grads);
  ASSERT_GT(g, 1e-4);
  // Attention on the packed rows (Note [packed attention] in ops/cpu/attention.cpp), with and
  // without padding rows after the tokens, and on the padded layout.
  for (Packing how : {Packing{true, 1}, Packing{true, 128}, Packing{false, 1}}) {
    SCOPED_TRACE(std::string(how.attention ? "packed attention" : "padded attention") + ", multiple " +
                 std::to_string(how.multiple));
    // Which attention ran: the padded layout's copies 5 per layer (2 layers; 4 in the last, Note
    // [last layer on the first tokens]), besides the embeddings' 2 and the last layer's first tokens' 4.
    OpTally ops;
    gpu->set_observer(&ops);
    const Step packed = step(*gpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own, DType::BF16, how);
    gpu->set_observer(nullptr);
    EXPECT_EQ(ops.copies, how.attention ? 6 : 15);
    // Same arithmetic per token row except the GEMMs' shapes (N vs B*T rows): bf16 rounding.
    EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 2e-2));
    EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 2e-2 * g));
  }
}

// With dropout the packed step draws hidden-state masks by packed row (unlike the padded step)
// but attention masks by padded position: attention on the packed rows and on the padded layout
// then see the same masks everywhere, and their steps agree.
TEST(PackedTrainingCuda, PackedAttentionWithDropoutMatchesThePaddedLayoutsAttention) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  BertConfig cfg = config(true);
  cfg.hidden_size = 128;  // two heads of 64
  cfg.num_attention_heads = 2;
  cfg.max_position_embeddings = 96;
  const HostBatch hb = batch_of({17, 96, 1, 70, 64, 2}, 96, 5);
  const Step rows = step(*gpu, cfg, hb, true, CheckpointPolicy::Selective, GradientPlacement::Own, DType::BF16,
                         Packing{true, 128});
  const Step layout = step(*gpu, cfg, hb, true, CheckpointPolicy::Selective, GradientPlacement::Own, DType::BF16,
                           Packing{false, 128});
  const double g = largest_magnitude(layout.grads);
  ASSERT_GT(g, 1e-4);
  for (float x : rows.grads) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(same_values<float>(rows.losses, layout.losses, 2e-2));
  EXPECT_TRUE(same_values<float>(rows.grads, layout.grads, 2e-2 * g));
}

// The per-token heads on the real-token encoder (Note [packed training] in model/bert.cpp):
// bf16 on the flash kernels, against the padded step.
TEST(PackedTrainingCuda, Bf16PerTokenHeadsMatchThePaddedStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  for (const char* arch : {"BertForTokenClassification", "BertForMaskedLM"}) {
    SCOPED_TRACE(arch);
    const BertConfig cfg = on_flash_kernels(token_config(false, arch));
    const HostBatch hb = batch_of({5, 40, 3, 64, 33}, 64, 4, std::string(arch) == "BertForMaskedLM" ? cfg.vocab_size : 3);
    const Step padded = step(*gpu, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own, DType::BF16);
    const Step packed = step(*gpu, cfg, hb, true, CheckpointPolicy::None, GradientPlacement::Own, DType::BF16,
                             Packing{true, 128});
    const double g = largest_magnitude(padded.grads);
    ASSERT_GT(g, 1e-4);
    EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 2e-2));
    EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 2e-2 * g));
  }
}

// ModernBERT on the real tokens (Note [modernbert packed tokens] in model/modernbert.cpp): bf16 on
// the flash kernels with the local window, rotary at the packed rows' positions, each head,
// against the padded step; the rotary op's FLOPs show the packed path ran (the token rows alone).
TEST(PackedTrainingCuda, Bf16ModernBertMatchesThePaddedStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  const std::vector<int64_t> lengths{5, 40, 3, 64, 33};
  for (const char* arch : {"ModernBertForSequenceClassification", "ModernBertForTokenClassification",
                           "ModernBertForMaskedLM"}) {
    for (const char* pooling : {"mean", "cls"}) {
      if (std::string(pooling) == "cls" && std::string(arch) != "ModernBertForSequenceClassification") continue;
      SCOPED_TRACE(std::string(arch) + " / " + pooling);
      const BertConfig cfg = on_flash_kernels(modernbert_config(arch, pooling));
      const HostBatch hb = batch_of(lengths, 64, 4, is_masked_lm(cfg) ? cfg.vocab_size : 3);
      OpTally padded_flops, packed_flops;
      gpu->set_observer(&padded_flops);
      const Step padded = step(*gpu, cfg, hb, false, CheckpointPolicy::None, GradientPlacement::Own, DType::BF16);
      gpu->set_observer(&packed_flops);
      const Step packed = step(*gpu, cfg, hb, true, CheckpointPolicy::Selective, GradientPlacement::InActivations,
                               DType::BF16, Packing{true, 128});
      gpu->set_observer(nullptr);
      // 145 token rows, padded to the multiple 128: 256 of the 320 padded rows.
      EXPECT_NEAR(packed_flops.rotary_flops / padded_flops.rotary_flops, 256.0 / 320.0, 1e-9);
      const double g = largest_magnitude(padded.grads);
      ASSERT_GT(g, 1e-4);
      EXPECT_TRUE(same_values<float>(packed.losses, padded.losses, 2e-2));
      EXPECT_TRUE(same_values<float>(packed.grads, padded.grads, 2e-2 * g));
    }
  }
}

// The packed evaluation runs the last layer on the first tokens (Note [last layer on the first
// tokens] in model/bert.cpp, Note [modernbert first tokens]): bf16 on the GPU, the same logits as
// every token to bf16 rounding (other GEMM shapes), with fewer FLOPs (so the path ran).
TEST(PackedTrainingCuda, Bf16PackedEvaluationOnTheFirstTokensMatchesEveryToken) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  const HostBatch hb = batch_of({5, 40, 3, 64, 33}, 64, 4);
  for (const BertConfig& cfg : {on_flash_kernels(config(false)),
                                on_flash_kernels(modernbert_config("ModernBertForSequenceClassification", "cls"))}) {
    SCOPED_TRACE(cfg.is_modernbert() ? "modernbert" : "bert");
    OpTally all_ops, first_ops;
    gpu->set_observer(&all_ops);
    const std::vector<float> all = eval_logits(*gpu, cfg, hb, true, Packing{true, 1}, false, DType::BF16);
    gpu->set_observer(&first_ops);
    const std::vector<float> first = eval_logits(*gpu, cfg, hb, true, Packing{true, 1}, true, DType::BF16);
    gpu->set_observer(nullptr);
    const double g = largest_magnitude(all);
    ASSERT_GT(g, 1e-3);
    EXPECT_TRUE(same_values<float>(first, all, 2e-2 * g));
    EXPECT_LT(first_ops.flops, all_ops.flops);
  }
}
