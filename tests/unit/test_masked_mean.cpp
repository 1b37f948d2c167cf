// Mean pooling over the attention mask as one backend op (masked_mean_forward/backward; the
// registry checks its gradient and its CUDA twin): here through the backend's entry points, a
// sequence without a token (Note [empty mean pool]), and ModernBERT's mean-pooling step, which
// must not move anything between the host and the device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../common/golden_modernbert.h"
#include "ops/backend.h"

using namespace anatomy;

namespace {

Buffer f32_buffer(Backend& be, Shape s, const std::vector<float>& v) {
  Buffer b(be.allocator(), DType::F32, s, Category::Temporary);
  be.upload(b, v.data());
  return b;
}

std::vector<float> host(Backend& be, const Tensor& t) {
  std::vector<float> v(t.numel());
  be.download(v.data(), t);
  return v;
}

// Counts the ops a backend reports by profile name.
class OpCounter final : public OpObserver {
 public:
  void before(Backend&, const OpEvent&) override {}
  void after(Backend&, const OpEvent& e) override { ++count[e.name]; }
  std::map<std::string, int> count;
};

}  // namespace

// B = 2, T = 3, H = 2: sequence 0 keeps tokens 0 and 2, sequence 1 none.
TEST(MaskedMean, AveragesTheKeptTokensAndGivesAnEmptySequenceZero) {
  auto be = make_cpu_backend(1);
  const std::vector<float> xv = {1, 2, 100, 200, 5, 8, 7, 7, 7, 7, 7, 7};
  const std::vector<int32_t> mv = {1, 0, 1, 0, 0, 0};
  Buffer x = f32_buffer(*be, {2, 3, 2}, xv), out = f32_buffer(*be, {2, 2}, std::vector<float>(4, NAN));
  Buffer mask(be->allocator(), DType::I32, {2, 3}, Category::Temporary);
  be->upload(mask, mv.data());
  be->masked_mean_forward(out, x, mask);
  EXPECT_EQ(host(*be, out), (std::vector<float>{3, 5, 0, 0}));

  Buffer dout = f32_buffer(*be, {2, 2}, {2, -4, 9, 9}), dx = f32_buffer(*be, {2, 3, 2}, std::vector<float>(12, NAN));
  be->masked_mean_backward(dx, dout, mask);
  EXPECT_EQ(host(*be, dx), (std::vector<float>{1, -2, 0, 0, 1, -2, 0, 0, 0, 0, 0, 0}));

  be->masked_mean_forward(out, x, Tensor{});  // no mask: every token
  EXPECT_EQ(host(*be, out), (std::vector<float>{106.0f / 3, 210.0f / 3, 7, 7}));
}

// The mean-pooling fixture's step: the pooling is one op each way, and nothing crosses between
// the host and the device (the mask used to be read back every step).
TEST(MaskedMean, ModernBertMeanPoolingStepStaysOnTheDevice) {
  const std::string d = golden::modernbert_dir("modernbert-bias-mean");
  golden::Fixture f(d);
  ASSERT_NE(f.cfg.modern.classifier_pooling, "cls");
  auto be = make_cpu_backend(1);
  ModernBertForSequenceClassification model(*be, f.cfg, f.B, f.T);
  load_modernbert_weights(d, model);
  golden::Batch batch(*be, f);
  model.zero_grads();
  OpCounter ops;
  be->set_observer(&ops);
  model.forward_backward(batch.db, 1.0f / static_cast<float>(f.B));
  be->set_observer(nullptr);
  EXPECT_EQ(ops.count["masked_mean"], 2);
  EXPECT_EQ(ops.count["download"], 0);
  EXPECT_EQ(ops.count["upload"], 0);
  EXPECT_GT(ops.count["matmul+bias"] + ops.count["matmul"], 0);  // the observer saw the step
}
