// The one backend contract (Note [backend contract] in ops/backend.h): the CPU backend and a
// backend that claims to be CUDA but has nothing except the contract fail the same misuses with
// the same words, never run an implementation for them, and report every op they do run to an
// observer with its phase and cost. (The real CUDA backend against the CPU:
// tests/cuda/test_op_registry_cuda.cpp, CudaContract.MisusesFailAsOnTheCpu.)
#include <gtest/gtest.h>

#include <cstdlib>

#include "../common/contract_misuses.h"
#include "ops/backend.h"

using namespace anatomy;

namespace {

// Host memory labelled as CUDA memory: the contract reads shapes and dtypes, never data.
class HostAsCudaAllocator final : public Allocator {
 public:
  Device device() const override { return Device::CUDA; }

 protected:
  void* raw_allocate(size_t bytes) override { return std::malloc(bytes ? bytes : 1); }
  void raw_deallocate(void* p) noexcept override { std::free(p); }
};

// Every *_impl only counts: what reaches it has passed the contract.
class ContractOnlyCuda final : public Backend {
 public:
  int impl_calls = 0;
  Device device() const override { return Device::CUDA; }
  Allocator& allocator() override { return m_alloc; }
  std::string name() const override { return "contract-only cuda"; }
  void synchronize() override {}
  bool computes_in(DType dt) const override { return dt == DType::F32 || dt == DType::BF16 || dt == DType::F16; }
  // As CUDA: packed attention for BF16/F16 only.
  bool packed_attention_supported(DType dt, int64_t, int64_t) const override { return dt != DType::F32; }

 protected:
  void upload_impl(const Tensor&, const void*) override { ++impl_calls; }
  void download_impl(void*, const Tensor&) override { ++impl_calls; }
  void copy_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void cast_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void fill_impl(const Tensor&, float) override { ++impl_calls; }
  void matmul_impl(const Tensor&, const Tensor&, Trans, const Tensor&, Trans, const MatmulArgs&) override { ++impl_calls; }
  void bias_grad_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void fp8_scale_update_impl(const Tensor&) override { ++impl_calls; }
  void attention_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, const DropoutSpec&,
                              AttentionScope) override {
    ++impl_calls;
  }
  void attention_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               int, const DropoutSpec&, AttentionScope, const Tensor&) override {
    ++impl_calls;
  }
  void attention_packed_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int, const DropoutSpec&,
                                     AttentionScope) override {
    ++impl_calls;
  }
  void attention_packed_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, int, const DropoutSpec&, AttentionScope, const Tensor&) override {
    ++impl_calls;
  }
  void rotary_forward_impl(const Tensor&, const Tensor&, int, float, const Tensor&) override { ++impl_calls; }
  void rotary_backward_impl(const Tensor&, const Tensor&, int, float, const Tensor&) override { ++impl_calls; }
  void geglu_forward_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void geglu_backward_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void layernorm_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, float, const DropoutSpec&) override {
    ++impl_calls;
  }
  void layernorm_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&, const DropoutSpec&, const Tensor&) override {
    ++impl_calls;
  }
  void cross_entropy_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) override { ++impl_calls; }
  void token_cross_entropy_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, float) override {
    ++impl_calls;
  }
  void mse_loss_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) override { ++impl_calls; }
  void bce_with_logits_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) override { ++impl_calls; }
  void gelu_forward_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void gelu_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void tanh_forward_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void tanh_backward_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void relu_forward_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void relu_backward_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void dropout_forward_impl(const Tensor&, const Tensor&, const DropoutSpec&) override { ++impl_calls; }
  void dropout_backward_impl(const Tensor&, const Tensor&, const DropoutSpec&) override { ++impl_calls; }
  void add_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void embedding_forward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) override {
    ++impl_calls;
  }
  void embedding_backward_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&) override {
    ++impl_calls;
  }
  void select_token_impl(const Tensor&, const Tensor&, int64_t) override { ++impl_calls; }
  void masked_mean_forward_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void masked_mean_backward_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void select_token_backward_impl(const Tensor&, const Tensor&, int64_t) override { ++impl_calls; }
  void gather_rows_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void scatter_rows_impl(const Tensor&, const Tensor&, const Tensor&) override { ++impl_calls; }
  void block_sum_squares_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void sum_blocks_impl(const Tensor&, const Tensor&) override { ++impl_calls; }
  void adamw_update_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const GradTransform&, const AdamWArgs&) override {
    ++impl_calls;
  }
  void sgd_update_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const GradTransform&,
                       const SgdArgs&) override {
    ++impl_calls;
  }
  void adamw8bit_update_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const GradTransform&, const AdamWArgs&) override {
    ++impl_calls;
  }
  void adafactor_update_impl(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const AdafactorTable&, const GradTransform&, const AdafactorArgs&) override {
    ++impl_calls;
  }

 private:
  HostAsCudaAllocator m_alloc;
};

struct Recorder final : OpObserver {
  std::vector<OpEvent> before_events, after_events;
  void before(Backend&, const OpEvent& e) override { before_events.push_back(e); }
  void after(Backend&, const OpEvent& e) override { after_events.push_back(e); }
};

}  // namespace

TEST(BackendContract, MisusesFailWithTheSameWordsOnTheCpuAndOnTheCudaPath) {
  auto cpu = make_cpu_backend(1);
  ContractOnlyCuda cuda;
  for (const test::Misuse& m : test::contract_misuses()) {
    SCOPED_TRACE(m.name);
    const std::string on_cpu = test::misuse_message(*cpu, m), on_cuda = test::misuse_message(cuda, m);
    EXPECT_FALSE(on_cpu.empty()) << "the CPU backend accepted it";
    EXPECT_EQ(on_cpu, on_cuda);
    EXPECT_EQ(on_cpu.find('\n'), std::string::npos) << on_cpu;  // one line
  }
  EXPECT_EQ(cuda.impl_calls, 0);
}

TEST(BackendContract, MessagesNameTheOpAndTheTensor) {
  auto cpu = make_cpu_backend(1);
  const auto misuses = test::contract_misuses();
  auto message = [&](const char* name) {
    for (const auto& m : misuses)
      if (std::string(m.name) == name) return test::misuse_message(*cpu, m);
    return std::string("no such misuse");
  };
  EXPECT_EQ(message("layernorm gamma of the wrong width"), "layernorm_forward: gamma [7] has 7 elements, expected 8");
  EXPECT_EQ(message("cross_entropy labels in F32"), "cross_entropy: labels is F32, expected I32");
  EXPECT_EQ(message("undefined output"), "gelu_forward: output is undefined");
  EXPECT_EQ(message("clipping without a norm"), "sgd_update: norm_sq (clipping is on) is undefined");
  EXPECT_EQ(message("matmul bias gradient of the wrong length"),
            "matmul: bias gradient [3] has 3 elements, expected 4");
  EXPECT_EQ(message("matmul bias gradient in BF16"), "matmul: bias gradient is BF16, expected F32");
  EXPECT_EQ(message("matmul bias gradient with beta 0.5"),
            "matmul: the BiasGrad epilogue needs alpha 1 and beta 0 or 1, not alpha 1 beta 0.5");
  EXPECT_EQ(message("matmul bias gradient in C's memory"), "matmul: the bias gradient and C are one buffer");
  EXPECT_EQ(message("attention_packed offsets not B + 1"),
            "attention_packed_forward: offsets [2] has 2 elements, expected 3");
  EXPECT_EQ(message("attention_packed lse not [B, heads, T]"),
            "attention_packed_backward: lse [2, 12] is not [B, heads, T]");
  EXPECT_EQ(message("attention backward bias gradient of the wrong length"),
            "attention_backward: dbias [8] has 8 elements, expected 24");
  EXPECT_EQ(message("attention backward bias gradient in BF16"), "attention_backward: dbias is BF16, expected F32");
  EXPECT_EQ(message("attention scope of negative queries"), "attention_forward: queries -1 is negative");
}

// A backend without packed attention for the dtype refuses the call before any kernel runs,
// naming the shape; the model asks packed_attention_supported first (Note [packed attention]).
TEST(BackendContract, PackedAttentionWhereTheBackendHasNoneIsRefused) {
  ContractOnlyCuda cuda;
  Buffer qkv(cuda.allocator(), DType::F32, {10, 3 * 8}, Category::Temporary);
  Buffer ctx(cuda.allocator(), DType::F32, {10, 8}, Category::Temporary);
  Buffer lse(cuda.allocator(), DType::F32, {2, 2, 6}, Category::Temporary);
  Buffer offsets(cuda.allocator(), DType::I32, {3}, Category::Temporary);
  try {
    cuda.attention_packed_forward(ctx, lse, qkv, offsets, 2, {}, 0);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "attention_packed_forward: the contract-only cuda backend has no packed attention for F32, T 6, head dim 4");
  }
  EXPECT_EQ(cuda.impl_calls, 0);
}

TEST(BackendContract, WrongDeviceAndDtypeNameTheBackend) {
  auto cpu = make_cpu_backend(1);
  ContractOnlyCuda cuda;
  Buffer on_cpu(cpu->allocator(), DType::F32, {4}, Category::Temporary);
  Buffer on_cuda(cuda.allocator(), DType::F32, {4}, Category::Temporary);
  Buffer bf16(cpu->allocator(), DType::BF16, {4}, Category::Temporary);
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(msg([&] { cpu->tanh_forward(on_cpu, on_cuda); }),
            "tanh_forward: input is on cuda; the cpu backend needs cpu tensors");
  EXPECT_EQ(msg([&] { cuda.tanh_forward(on_cuda, on_cpu); }),
            "tanh_forward: input is on cpu; the cuda backend needs cuda tensors");
  // The CPU computes in F32 only; the contract says so from the backend's computes_in().
  EXPECT_EQ(msg([&] { cpu->tanh_forward(bf16, bf16); }), "tanh_forward: input is BF16; the cpu backend computes in F32");
}

TEST(BackendContract, ValidCallsReachTheImplementationAndTheObserver) {
  ContractOnlyCuda cuda;
  Recorder rec;
  Buffer c(cuda.allocator(), DType::BF16, {4, 3}, Category::Temporary);
  Buffer a(cuda.allocator(), DType::BF16, {4, 5}, Category::Temporary);
  Buffer b(cuda.allocator(), DType::BF16, {3, 5}, Category::Temporary);
  cuda.matmul(c, a, Trans::N, b, Trans::T, {});  // no observer: runs, reports nothing
  EXPECT_EQ(cuda.impl_calls, 1);
  cuda.set_observer(&rec);
  cuda.set_phase(Phase::Backward);
  cuda.matmul(c, a, Trans::N, b, Trans::T, {});
  cuda.set_phase(Phase::Optimizer);
  cuda.fill(c, 0.0f);
  cuda.set_observer(nullptr);
  cuda.fill(c, 1.0f);
  EXPECT_EQ(cuda.impl_calls, 4);
  ASSERT_EQ(rec.before_events.size(), 2u);
  ASSERT_EQ(rec.after_events.size(), 2u);
  EXPECT_STREQ(rec.after_events[0].name, "matmul");
  EXPECT_EQ(rec.after_events[0].phase, Phase::Backward);
  EXPECT_EQ(rec.after_events[0].cost.cls, OpClass::TensorContraction);
  EXPECT_DOUBLE_EQ(rec.after_events[0].cost.flops, 2.0 * 4 * 3 * 5);
  EXPECT_STREQ(rec.after_events[1].name, "fill");
  EXPECT_EQ(rec.after_events[1].phase, Phase::Optimizer);
}

// Note [fused bias gradient]: the weight gradient with the bias gradient is one op in the profile
// (named apart from the plain weight gradient), costing the GEMM plus the column sums of A.
TEST(BackendContract, FusedBiasGradientIsOneObservedOp) {
  ContractOnlyCuda cuda;
  Recorder rec;
  const int64_t M = 6, N = 3, K = 5;
  Buffer dw(cuda.allocator(), DType::F32, {M, N}, Category::Temporary);
  Buffer db(cuda.allocator(), DType::F32, {M}, Category::Temporary);
  Buffer dy(cuda.allocator(), DType::BF16, {K, M}, Category::Temporary);
  Buffer x(cuda.allocator(), DType::BF16, {K, N}, Category::Temporary);
  cuda.set_observer(&rec);
  cuda.matmul(dw, dy, Trans::T, x, Trans::N, {1, 1, Epilogue::BiasGrad, db, {}});
  cuda.matmul(dw, dy, Trans::T, x, Trans::N, {1, 0, Epilogue::BiasGrad, db, {}});
  cuda.set_observer(nullptr);
  EXPECT_EQ(cuda.impl_calls, 2);
  ASSERT_EQ(rec.after_events.size(), 2u);
  EXPECT_STREQ(rec.after_events[0].name, "matmul (wgrad+bgrad)");
  EXPECT_EQ(rec.after_events[0].cost.cls, OpClass::TensorContraction);
  EXPECT_DOUBLE_EQ(rec.after_events[0].cost.flops, 2.0 * M * N * K + M * K);
  // beta 1 reads and writes db (and C); beta 0 writes them only.
  EXPECT_DOUBLE_EQ(rec.after_events[0].cost.bytes - rec.after_events[1].cost.bytes, 4.0 * M * N + 4.0 * M);
}
