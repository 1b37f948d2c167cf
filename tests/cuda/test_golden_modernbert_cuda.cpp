// ModernBERT on the CUDA engine against transformers' fixtures (tests/common/golden_modernbert.h):
// fp32 within 1e-4 (the local layers' windowed attention takes the reference kernels), 5 AdamW steps.
#include <gtest/gtest.h>

#include "../common/golden_modernbert.h"

using namespace anatomy;
using namespace anatomy::golden;

namespace {
class GoldenModernBertCuda : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};
}  // namespace

TEST_P(GoldenModernBertCuda, Fp32MatchesTransformers) {
  auto be = make_cuda_backend(0);
  check_modernbert_step(*be, GetParam(), 1e-4);
}

TEST_P(GoldenModernBertCuda, Fp32SelectiveCheckpointingMatchesTransformers) {
  auto be = make_cuda_backend(0);
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::Selective);
}

TEST_P(GoldenModernBertCuda, Fp32GradientsInActivationsMatchTransformers) {
  auto be = make_cuda_backend(0);
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::None, GradientPlacement::InActivations);
  check_modernbert_step(*be, GetParam(), 1e-4, CheckpointPolicy::Selective, GradientPlacement::InActivations);
}

TEST_P(GoldenModernBertCuda, FiveAdamWStepsTrack) {
  auto be = make_cuda_backend(0);
  check_modernbert_adamw(*be, GetParam(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenModernBertCuda, testing::ValuesIn(modernbert_cases()),
                         modernbert_test_name);
