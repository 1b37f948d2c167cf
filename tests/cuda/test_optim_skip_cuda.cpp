// GradTransform::skip_nonfinite on the GPU against the CPU twin: with an inf or NaN norm_sq on
// the device, every optimizer's kernels leave params, state and the half copy byte for byte as
// they were (no host synchronization decides it); with a finite norm_sq the update equals the
// one without the flag bit for bit, and agrees with the CPU twin's.
#include <gtest/gtest.h>

#include <cmath>

#include "../common/optim_skip.h"
#include "optim/grad_norm.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST(OptimizerSkipCuda, NonfiniteNormLeavesEverythingUntouched) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  for (SkipOpt opt : kSkipOpts)
    for (float max_norm : {1.0f, 0.0f})
      for (float bad : kSkipNonfinite) {
        SCOPED_TRACE(std::string(skip_opt_name(opt)) + " max_norm " + std::to_string(max_norm) + " norm_sq " +
                     std::to_string(bad));
        const SkipSnapshot before = skip_run(*gpu, opt, 21, bad, true, max_norm, /*before=*/true);
        const SkipSnapshot after = skip_run(*gpu, opt, 21, bad, true, max_norm);
        ASSERT_EQ(before.names, after.names);
        for (size_t i = 0; i < before.names.size(); ++i)
          EXPECT_TRUE(before.bytes[i] == after.bytes[i]) << before.names[i] << " changed";
      }
}

TEST(OptimizerSkipCuda, FiniteNormAppliesTheUsualUpdateLikeTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  auto cpu = make_cpu_backend();
  const float norm = skip_test_norm_sq(21);
  for (SkipOpt opt : kSkipOpts)
    for (float max_norm : {1.0f, 0.0f}) {
      SCOPED_TRACE(std::string(skip_opt_name(opt)) + " max_norm " + std::to_string(max_norm));
      const SkipSnapshot before = skip_run(*gpu, opt, 21, norm, true, max_norm, /*before=*/true);
      const SkipSnapshot with = skip_run(*gpu, opt, 21, norm, true, max_norm);
      const SkipSnapshot without = skip_run(*gpu, opt, 21, norm, false, max_norm);
      for (size_t i = 0; i < with.names.size(); ++i)
        EXPECT_TRUE(with.bytes[i] == without.bytes[i]) << with.names[i] << " differs from the update without the flag";
      // The update (not the parameters, which move little) against the CPU twin's.
      const SkipSnapshot twin = skip_run(*cpu, opt, 21, norm, true, max_norm);
      const std::vector<float> p0 = skip_floats(before.at("params")), pg = skip_floats(with.at("params")),
                               pc = skip_floats(twin.at("params"));
      std::vector<float> dg(p0.size()), dc(p0.size());
      for (size_t i = 0; i < p0.size(); ++i) dg[i] = pg[i] - p0[i], dc[i] = pc[i] - p0[i];
      EXPECT_LT(rel_diff(dg, dc), 1e-3) << "GPU update vs the CPU twin's";
      EXPECT_FALSE(with.at("half") == before.at("half")) << "the half copy was not updated";
    }
}

// The skip decision is read on the device when the kernels run: a norm_sq that becomes inf
// after the update is enqueued (here: written by an earlier kernel on the same stream) is seen.
TEST(OptimizerSkipCuda, DecisionIsMadeOnTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto gpu = make_cuda_backend(0);
  std::vector<float> p(1000, 1.0f), m(1000, 0.0f), v(1000, 0.0f), g(1000, 1e30f);
  Allocator& al = gpu->allocator();
  Buffer bp(al, DType::F32, {1000}, Category::Other), bm(al, DType::F32, {1000}, Category::Other),
      bv(al, DType::F32, {1000}, Category::Other), bg(al, DType::F32, {1000}, Category::Other);
  GradNorm bn(*gpu, 1000);
  gpu->upload(bp, p.data());
  gpu->upload(bm, m.data());
  gpu->upload(bv, v.data());
  gpu->upload(bg, g.data());
  bn.compute(bg);  // 1000 * 1e60 overflows F32: inf, on the device only
  GradTransform gt{bn.norm_sq(), 1.0f, 1.0f};
  gt.skip_nonfinite = true;
  gpu->adamw_update(bp, bm, bv, Tensor(), bg, gt, AdamWArgs{});
  std::vector<float> out(1000);
  gpu->download(out.data(), bp);
  for (float x : out) ASSERT_EQ(x, 1.0f);
}
