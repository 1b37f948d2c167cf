// GradTransform::skip_nonfinite on the CPU backend: with an inf or NaN norm_sq every optimizer
// leaves params, its state and the half copy byte for byte as they were; with a finite norm_sq
// the update is the one without the flag, bit for bit (clipping on and off).
#include <gtest/gtest.h>

#include "../common/optim_skip.h"
#include "core/error.h"

using namespace anatomy;
using namespace anatomy::test;

TEST(OptimizerSkip, NonfiniteNormLeavesEverythingUntouched) {
  auto be = make_cpu_backend(2);
  for (SkipOpt opt : kSkipOpts)
    for (float max_norm : {1.0f, 0.0f})
      for (float bad : kSkipNonfinite) {
        SCOPED_TRACE(std::string(skip_opt_name(opt)) + " max_norm " + std::to_string(max_norm) + " norm_sq " +
                     std::to_string(bad));
        const SkipSnapshot before = skip_run(*be, opt, 11, bad, true, max_norm, /*before=*/true);
        const SkipSnapshot after = skip_run(*be, opt, 11, bad, true, max_norm);
        ASSERT_EQ(before.names, after.names);
        for (size_t i = 0; i < before.names.size(); ++i)
          EXPECT_TRUE(before.bytes[i] == after.bytes[i]) << before.names[i] << " changed";
      }
}

TEST(OptimizerSkip, FiniteNormAppliesTheUsualUpdate) {
  auto be = make_cpu_backend(2);
  const float norm = skip_test_norm_sq(11);
  for (SkipOpt opt : kSkipOpts)
    for (float max_norm : {1.0f, 0.0f}) {
      SCOPED_TRACE(std::string(skip_opt_name(opt)) + " max_norm " + std::to_string(max_norm));
      const SkipSnapshot before = skip_run(*be, opt, 11, norm, true, max_norm, /*before=*/true);
      const SkipSnapshot with = skip_run(*be, opt, 11, norm, true, max_norm);
      const SkipSnapshot without = skip_run(*be, opt, 11, norm, false, max_norm);
      for (size_t i = 0; i < with.names.size(); ++i)
        EXPECT_TRUE(with.bytes[i] == without.bytes[i]) << with.names[i] << " differs from the update without the flag";
      EXPECT_FALSE(with.at("params") == before.at("params")) << "params were not updated";
      EXPECT_FALSE(with.at("half") == before.at("half")) << "the half copy was not updated";
    }
}

TEST(OptimizerSkip, NeedsNormSq) {
  auto be = make_cpu_backend(2);
  std::vector<float> p(8, 1.0f), m(8, 0.0f), v(8, 0.0f), g(8, 1.0f);
  auto host = [](std::vector<float>& x) { return Tensor(x.data(), DType::F32, {static_cast<int64_t>(x.size())}, Device::CPU); };
  GradTransform gt{Tensor(), 1.0f, 0.0f};  // clipping off: norm_sq is optional ...
  be->adamw_update(host(p), host(m), host(v), Tensor(), host(g), gt, AdamWArgs{});
  gt.skip_nonfinite = true;  // ... but the skip decision reads it
  EXPECT_THROW(be->adamw_update(host(p), host(m), host(v), Tensor(), host(g), gt, AdamWArgs{}), Error);
}
