// Adafactor (--optim adafactor): Hugging Face / fairseq semantics with an explicit learning
// rate (scale_parameter=False, relative_step=False, warmup_init=False), no momentum (beta1 None),
// beta2_t = 1 - step^-0.8, eps1 = 1e-30, update-RMS clipping at 1.0, and decoupled weight decay
// p -= lr * wd * p on the decay group. Formulas: ref::adafactor_update in ops/cpu/reference.h.
//
// Each parameter is factored on its own shape, as Hugging Face factors each nn.Parameter: a 2-D
// weight [rows, cols] keeps running means of g^2 + eps1 per row and per column (rows + cols
// floats); a 1-D parameter keeps a full second moment (numel floats). The flat buffers hold
// many parameters, so the optimizer hands the backend a table of segments (AdafactorSegment in
// ops/backend.h) built from the ParamLayout, uploaded once; the backend updates every parameter
// in a fixed handful of launches, not one per parameter.
//
// Memory (all Category::OptimizerState), with F and U the 2-D and 1-D parameters:
//   4 (sum_F (rows + cols) + sum_U numel)       the statistics
// + 4 (sum_F (rows + 2) + sum_U (chunks + 2))   the kernels' reduction scratch (per-row sums,
//                                               per-chunk partial sums, two scalars each)
// + 96 (|F| + |U|)                              the segment table (12 I64 fields each)
// where a 1-D parameter of numel values has ceil(numel / 8192) chunks.
#pragma once
#include <memory>
#include <vector>

#include "optim/optimizer.h"

namespace anatomy {

struct AdafactorPlan {
  std::vector<AdafactorSegment> segments;
  int64_t state_floats = 0, scratch_floats = 0, chunks = 0, strips = 0;
};

// The segment table of a layout: one segment per parameter, in layout order.
AdafactorPlan adafactor_plan(const ParamLayout& layout);
size_t adafactor_state_bytes(const ParamLayout& layout);
std::unique_ptr<Optimizer> make_adafactor(Backend& be, const OptimizerOptions& o, const ParamLayout& layout);

}  // namespace anatomy
