// The per-op registry (issue 14; ggml's test-backend-ops is the model): one small description
// per backend op builds the op's tensors from a few dimensions and the run's compute dtype, and
// three modes run from it:
//   - twin: CUDA against the CPU on fresh random inputs, outputs poisoned with NaN, normalized
//     error (tests/cuda/test_op_registry_cuda.cpp; run_twin below);
//   - gradient: float64 central differences of the CPU reference for every op with a backward
//     (tests/unit/test_op_registry.cpp);
//   - timing: achieved TFLOP/s and GB/s from the op's declared cost (tools/bench_ops.cpp).
// Adding a backend op adds one entry in op_registry.cpp; OpRegistry.EveryBackendOpHasAnEntry
// reads ops/backend.h and fails until it is there.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/backend.h"

namespace anatomy::test {

// The sizes one instance of every op is built from (small for tests, large for the bench).
struct OpDims {
  int64_t batch = 2, seq = 8, hidden = 32, heads = 2, vocab = 50, classes = 3, ffn = 48;
  int64_t window = 0;  // the attention cases' local window (Note [local attention window]); 0: none
  int64_t params = 10000;  // optimizer ops: flat parameter count (more than two norm blocks)
  int64_t rows() const { return batch * seq; }
};
OpDims bench_dims();  // bert-base-like: batch 32, seq 128, hidden 768, 12 heads, 2^24 parameters
// Odd sizes everywhere (head dim 15, widths that are no multiple of a vector pack, short tails):
// the kernels' scalar and tail paths; attention there with a local window (ModernBERT's).
OpDims odd_dims();

// How an argument's values are made.
enum class Fill : uint8_t {
  Normal,      // N(0, scale^2): an input
  Output,      // NaN on both sides: every element must be written
  Accumulate,  // random on both sides: the op adds to it or updates it in place
  Given,       // `values`
};

struct OpArg {
  std::string name;
  bool act;       // in the run's compute dtype (F32 on the CPU; F32, BF16 or F16 on CUDA)
  DType dtype;    // when !act
  Shape shape;
  Fill fill;
  double scale = 1.0;
  std::vector<double> values;  // Fill::Given
  bool compared = false;       // an output (or updated input) the twins must agree on
  double tol = 0;              // its tolerance when not the case's (0: the case's)
};

// One op at one size: its arguments and the call (tensors in argument order, on `be`).
struct OpCase {
  std::vector<OpArg> args;
  std::function<void(Backend&, const std::vector<Tensor>&)> run;
  double tol_f32 = 1e-5, tol_half = 1e-2;  // normalized error ||cuda - cpu|| / ||cpu||
};

struct OpEntry {
  const char* op;  // the Backend method (ops/backend.h)
  std::function<OpCase(const OpDims&, Rng&)> build;
  bool half = true;  // also in BF16 and F16 on CUDA
  // Float64 central differences of the CPU reference for an op with a backward (nullptr: none);
  // reports through gtest.
  std::function<void(Rng&)> gradient;
  bool f32_on_cuda = true;  // also in F32 on CUDA (the packed attention has BF16/F16 kernels only)
};

const std::vector<OpEntry>& op_registry();
const OpEntry* find_op(const std::string& op);

// Values of one argument (rounded to `dt` when it is an activation in a half dtype).
std::vector<double> arg_values(const OpArg& a, DType dt);
// Tensors of a case on `be`, filled with `values` (F32 on a backend that computes in F32 only).
struct CaseTensors {
  std::vector<Buffer> buffers;
  std::vector<Tensor> tensors;
};
CaseTensors make_tensors(Backend& be, const OpCase& c, DType dt, const std::vector<std::vector<double>>& values);
std::vector<double> read_values(Backend& be, const Tensor& t);

// ||got - want|| / max(||want||, 1e-30), or +inf when either has a NaN.
double normalized_error(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace anatomy::test
