// The registry's twin mode (tests/common/op_registry.h): every backend op on CUDA against the
// CPU on fresh random inputs (the seed is in the trace; ANATOMY_TEST_SEED reproduces it), at two
// sizes (OpDims{} and odd_dims()), in F32 (where CUDA has it) and, for ops with activations, BF16 and F16 (inputs
// rounded to the half type before either backend sees them). Outputs start as NaN on both sides,
// updated inputs from the same random values; each compared output must satisfy
// ||cuda - cpu|| / ||cpu|| <= the case's tolerance (0 for data movement: exact), and NaN never
// passes. Also: the real CUDA backend fails the contract's misuses with the CPU's words.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../common/contract_misuses.h"
#include "../common/op_registry.h"
#include "../unit/test_cpu_util.h"

using namespace anatomy;
using namespace anatomy::test;

namespace {

std::vector<std::string> entry_names() {
  std::vector<std::string> v;
  for (const OpEntry& e : op_registry()) v.push_back(e.op);
  return v;
}

void run_twin(Backend& cpu, Backend& gpu, const OpEntry& e, DType dt, const OpDims& dims, const char* dims_name) {
  SCOPED_TRACE(std::string(e.op) + " in " + std::string(dtype_name(dt)) + " at " + dims_name + " sizes");
  ANATOMY_FRESH_RNG(rng);
  const OpCase c = e.build(dims, rng);
  std::vector<std::vector<double>> values;
  for (const OpArg& a : c.args) values.push_back(arg_values(a, dt));
  CaseTensors on_cpu = make_tensors(cpu, c, dt, values), on_gpu = make_tensors(gpu, c, dt, values);
  c.run(cpu, on_cpu.tensors);
  c.run(gpu, on_gpu.tensors);
  gpu.synchronize();
  for (size_t i = 0; i < c.args.size(); ++i) {
    const OpArg& a = c.args[i];
    if (!a.compared) continue;
    const double tol = a.tol > 0 ? a.tol : dt == DType::F32 ? c.tol_f32 : c.tol_half;
    const double err = normalized_error(read_values(gpu, on_gpu.tensors[i]), read_values(cpu, on_cpu.tensors[i]));
    EXPECT_LE(err, tol) << a.name << ": normalized error " << err;
  }
}

}  // namespace

class OpTwin : public ::testing::TestWithParam<std::string> {};

TEST_P(OpTwin, CudaMatchesTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const OpEntry& e = *find_op(GetParam());
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  for (const auto& [dims, name] : {std::pair{OpDims{}, "small"}, std::pair{odd_dims(), "odd"}}) {
    if (e.f32_on_cuda) run_twin(*cpu, *gpu, e, DType::F32, dims, name);
    if (e.half) {
      run_twin(*cpu, *gpu, e, DType::BF16, dims, name);
      run_twin(*cpu, *gpu, e, DType::F16, dims, name);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, OpTwin, ::testing::ValuesIn(entry_names()), [](const auto& info) { return info.param; });

// The LayerNorm and GELU backwards at model widths, which the registry's small sizes do not reach:
// the LayerNorm's group path with 128, 96 and 64 threads a row (hidden 1024, 768, 384; Note
// [layernorm backward at bandwidth]) over 8448 rows, more than its persistent grid holds in
// kStages passes on a 132-SM device (528 groups at hidden 1024), so every group's ring of
// staged rows wraps around, with the bias gradient of the branch; the GELU backward with its
// bias gradient over 4096, 3072 and 1536 columns (Note [column sums at bandwidth]).
TEST(OpTwinWide, LayerNormAndGeluBackwardsAtModelWidths) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  for (int64_t hidden : {1024, 768, 384}) {
    OpDims d;
    d.hidden = hidden, d.ffn = 4 * hidden;
    const std::string name = "hidden " + std::to_string(hidden);
    for (DType dt : {DType::F32, DType::BF16}) {
      d.batch = 66, d.seq = 128;
      run_twin(*cpu, *gpu, *find_op("layernorm_backward"), dt, d, name.c_str());
      d.batch = 2;
      run_twin(*cpu, *gpu, *find_op("gelu_backward"), dt, d, name.c_str());
    }
  }
}

// The packed attention past one tile (Note [packed attention] in ops/cpu/attention.cpp): T 300
// with sequences of 300, 240, 180, 120 and 60 tokens, so query tiles past a sequence's end exit
// (forward tiles are 64 or 128 queries), keys span several tiles, a local window crosses them;
// head dims 32, 64 and 128, both forward tile heights. The padded backward too, at the same
// sizes: its flash kernels with the q|k|v bias gradient (the registry's small cases run the
// reference kernels there) under the registry's key mask (later sequences lose their last keys).
TEST(OpTwinLong, PackedAttentionPastOneTile) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  for (const char* mt : {"wgmma", "mma", "mma64", "mma-bwd"}) {
    // "mma-bwd": the default forward with the mma.sync backward (the others: the default backward).
    const bool bwd = std::string(mt) == "mma-bwd";
    ::setenv("ANATOMY_ATTENTION_FWD", bwd ? "" : mt, 1);
    ::setenv("ANATOMY_ATTENTION_BWD", bwd ? "mma" : "", 1);
    for (const char* op : {"attention_packed_forward", "attention_packed_backward", "attention_backward"})
      for (int64_t window : {0, 40})
        for (int64_t hidden : {64, 128, 256}) {
          OpDims d;
          d.batch = 5, d.seq = 300, d.heads = 2, d.hidden = hidden, d.window = window;
          run_twin(*cpu, *gpu, *find_op(op), DType::BF16, d, "long");
        }
  }
  ::unsetenv("ANATOMY_ATTENTION_FWD");
  ::unsetenv("ANATOMY_ATTENTION_BWD");
}

TEST(CudaContract, MisusesFailAsOnTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto cpu = make_cpu_backend(1);
  auto gpu = make_cuda_backend(0);
  for (const Misuse& m : contract_misuses()) {
    SCOPED_TRACE(m.name);
    const std::string on_cpu = misuse_message(*cpu, m);
    EXPECT_FALSE(on_cpu.empty());
    EXPECT_EQ(misuse_message(*gpu, m), on_cpu);
  }
}
