// The time anatomy: declared flops and bytes per op against hand computation, the class
// grouping, and a profiled CPU run whose per-op times add up to the step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/dirs.h"
#include "telemetry/op_cost.h"
#include "telemetry/profiler.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {
Tensor t(DType dt, Shape s) { return Tensor(reinterpret_cast<void*>(256), dt, s, Device::CPU); }  // never dereferenced
}  // namespace

TEST(OpCost, MatmulFlopsAndBytesByHand) {
  // bert-large FFN in: [16384, 1024] x [4096, 1024]^T in bf16, bias + GELU.
  Tensor x = t(DType::BF16, {16384, 1024}), w = t(DType::BF16, {4096, 1024}), y = t(DType::BF16, {16384, 4096});
  Tensor b = t(DType::BF16, {4096}), pre = t(DType::BF16, {16384, 4096});
  OpCost plain = matmul_cost(y, x, Trans::N, w, {});
  EXPECT_DOUBLE_EQ(plain.flops, 2.0 * 16384 * 4096 * 1024);
  EXPECT_DOUBLE_EQ(plain.bytes, 2.0 * (16384.0 * 1024 + 4096.0 * 1024 + 16384.0 * 4096));
  EXPECT_EQ(plain.cls, OpClass::TensorContraction);
  OpCost fused = matmul_cost(y, x, Trans::N, w, {1, 0, Epilogue::BiasGelu, b, pre});
  EXPECT_DOUBLE_EQ(fused.flops, plain.flops + 9.0 * 16384 * 4096);
  EXPECT_DOUBLE_EQ(fused.bytes, plain.bytes + 2.0 * 4096 + 2.0 * 16384 * 4096);
  // Weight gradient accumulating into F32 (beta = 1): C is read and written.
  Tensor dw = t(DType::F32, {4096, 1024}), dy = t(DType::BF16, {16384, 4096});
  OpCost wg = matmul_cost(dw, dy, Trans::T, x, {1, 1, Epilogue::None, {}, {}});
  EXPECT_DOUBLE_EQ(wg.flops, 2.0 * 4096 * 1024 * 16384);
  EXPECT_DOUBLE_EQ(wg.bytes, 2.0 * 16384 * 4096 + 2.0 * 16384 * 1024 + 2 * 4.0 * 4096 * 1024);
}

TEST(OpCost, AttentionAndNormalizationByHand) {
  Tensor qkv = t(DType::BF16, {32, 512, 3072}), ctx = t(DType::BF16, {32, 512, 1024});
  OpCost f = attention_cost(qkv, ctx, 16, 0, false), b = attention_cost(qkv, ctx, 16, 0, true);
  EXPECT_DOUBLE_EQ(f.flops, 4.0 * 32 * 16 * 512 * 512 * 64);
  EXPECT_DOUBLE_EQ(b.flops, 2.5 * f.flops);
  // A scope of the first query (Note [attention scope]): that query's pairs; past T, every query's.
  EXPECT_DOUBLE_EQ(attention_cost(qkv, ctx, 16, 1, false).flops, f.flops / 512);
  EXPECT_DOUBLE_EQ(attention_cost(qkv, ctx, 16, 1, true).flops, b.flops / 512);
  EXPECT_DOUBLE_EQ(attention_cost(qkv, ctx, 16, 600, false).flops, f.flops);
  EXPECT_DOUBLE_EQ(f.bytes, 2.0 * 32 * 512 * 3072 + 2.0 * 32 * 512 * 1024 + 4.0 * 32 * 16 * 512);
  Tensor y = t(DType::BF16, {16384, 1024});
  OpCost ln = layernorm_cost(y, true, false);  // reads branch and residual, writes y
  EXPECT_DOUBLE_EQ(ln.flops, 8.0 * 16384 * 1024);
  EXPECT_DOUBLE_EQ(ln.bytes, 3 * 2.0 * 16384 * 1024 + 8.0 * 16384);
  EXPECT_DOUBLE_EQ(layernorm_cost(y, true, false, true).bytes, 4 * 2.0 * 16384 * 1024 + 8.0 * 16384);
  // Backward from the output: reads dy and y, writes dsum and dbranch, reads rstd.
  EXPECT_DOUBLE_EQ(layernorm_cost(y, true, true).bytes, 4 * 2.0 * 16384 * 1024 + 4.0 * 16384);
  EXPECT_EQ(ln.cls, OpClass::StatisticalNormalization);
  EXPECT_EQ(cross_entropy_cost(t(DType::F32, {32, 2})).cls, OpClass::StatisticalNormalization);
  OpCost d = elementwise_cost(y, 2, 1, 1);
  EXPECT_DOUBLE_EQ(d.bytes, 2 * 2.0 * 16384 * 1024);
  EXPECT_EQ(d.cls, OpClass::Elementwise);
  EXPECT_EQ(op_class_name(OpClass::TensorContraction), "tensor_contraction");
}

TEST(Profiler, CpuRunWritesAProfileWhoseOpsAddUpToTheStep) {
  TrainOptions o;
  o.preset = "bert-tiny";
  o.device = DeviceChoice::Cpu;
  o.seq_len = 64;
  o.num_samples = 32;
  o.per_device_train_batch_size = 8;
  o.max_steps = 1;
  o.profile_steps = 2;
  o.logging_steps = 0;
  o.save_model = false;
  o.disable_progress_bar = true;
  o.output_dir = anatomy::testing_dirs::fresh_dir("anatomy_profile");
  train(o);
  std::ifstream in(std::filesystem::path(o.output_dir) / "profile.json");
  ASSERT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["steps_profiled"], 2);
  const double step = j["step_time_ms"], ops = j["ops_time_ms"];
  EXPECT_GT(step, 0);
  EXPECT_NEAR(ops / step, 1.0, 0.05);  // per-op times cover the step within 5%
  EXPECT_GT(j["forward_ms"].get<double>(), 0);
  EXPECT_GT(j["backward_ms"].get<double>(), 0);
  double flops_pct = 0;
  bool contraction = false;
  for (const auto& c : j["classes"]) {
    flops_pct += c["flops_pct"].get<double>();
    contraction |= c["class"] == "tensor_contraction";
  }
  EXPECT_NEAR(flops_pct, 100.0, 1e-6);
  EXPECT_TRUE(contraction);
  EXPECT_GT(j["ops"].size(), 10u);
}

// With NVML's clocks (the trainer reads them on a GPU) the table says at which clocks the steps
// and the ceilings ran, and profile.json keeps them; without them (the CPU) neither mentions a clock.
TEST(Profiler, TheClocksOfTheStepsAndCeilingsArePrintedWhenKnown) {
  ProfileSummary s;
  s.steps = 1;
  s.step_ms = 2.0;
  s.ops.push_back(OpStat{"matmul", Phase::Forward, OpClass::TensorContraction, 1, 2.0, 1e9, 1e6});
  Ceilings c{100.0, 1000.0};
  const std::string path = testing_dirs::fresh_dir("profile_clocks") + "/profile.json";
  for (bool known : {false, true}) {
    if (known) {
      s.steps_sm_mhz = 1740;
      s.max_sm_mhz = 1980;
      c.sm_mhz = 1965;
    }
    testing::internal::CaptureStdout();
    print_profile(s, c);
    const std::string out = testing::internal::GetCapturedStdout();
    write_profile(path, s, c);
    nlohmann::json j;
    std::ifstream(path) >> j;
    if (known) {
      EXPECT_NE(out.find("SM clock (NVML): 1740 MHz at the end of the profiled steps, 1965 MHz after the ceilings, "
                         "1980 at most"),
                std::string::npos)
          << out;
      EXPECT_EQ(j.at("sm_clock_mhz").at("profiled_steps").get<unsigned>(), 1740u);
      EXPECT_EQ(j.at("sm_clock_mhz").at("ceilings").get<unsigned>(), 1965u);
    } else {
      EXPECT_EQ(out.find("SM clock"), std::string::npos) << out;
      EXPECT_FALSE(j.contains("sm_clock_mhz"));
    }
  }
}
