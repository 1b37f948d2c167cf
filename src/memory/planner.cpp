#include "memory/planner.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "dist/zero.h"
#include "model/params.h"
#include "optim/grad_norm.h"
#include "ops/backend_memory.h"

namespace anatomy {

MemoryPlan plan_memory(const PlanInput& in) {
  const BertConfig& c = in.config;
  const ModelShape& s = in.shape;
  MemoryPlan p;
  const ParamLayout lay = ParamLayout::for_sequence_classification(c);
  const int64_t n = static_cast<int64_t>(lay.total());
  p.num_parameters = static_cast<int64_t>(lay.num_parameters());
  // Weights: fp32 masters, plus the half copy in mixed precision.
  p.bytes[Category::Weights] = 4 * n + (s.compute == DType::F32 ? 0 : n * static_cast<int64_t>(dtype_size(s.compute)));
  if (s.training) {
    p.bytes[Category::Gradients] = 4 * n;
    p.bytes[Category::OptimizerState] =
        static_cast<int64_t>(zero_optimizer_state_bytes(in.optimizer, lay, in.world_size, in.zero_stage));
  }
  const ArenaBytes a = model_arena_bytes(c, s);
  p.bytes[Category::Activations] = static_cast<int64_t>(a.activations);
  if (a.block)  // gradients inside the activations' block: counted in both, once in the total
    p.bytes.shared = static_cast<int64_t>(a.activations) + p.bytes[Category::Gradients] - static_cast<int64_t>(a.block);
  p.bytes[Category::Temporary] = static_cast<int64_t>(a.temporary);
  if (in.device == Device::CUDA) {
    p.bytes[Category::Workspace] = static_cast<int64_t>(kCudaLtWorkspaceBytes);
    p.bytes[Category::Temporary] += static_cast<int64_t>(kCudaReduceScratchBytes);
    if (s.training)
      p.bytes[Category::Temporary] += static_cast<int64_t>(attention_scratch_bytes(
          s.max_batch, s.max_seq, static_cast<int>(c.num_attention_heads), static_cast<int>(c.head_dim()), s.compute));
  }
  // The trainer's device batch: ids, token types, mask [B, T] and labels [B] in I32, the
  // gradient norm with its block partials (GradNorm) and the step's per-sample loss sums (F32 [B]).
  p.bytes[Category::Other] = 12 * s.max_batch * s.max_seq + 4 * s.max_batch +
                             static_cast<int64_t>(GradNorm::bytes(static_cast<size_t>(n))) + 4 * s.max_batch;
  // Training on real tokens: the packing index, token rows I32 [B*T] and first rows I32 [B].
  if (s.training && s.packed_tokens) p.bytes[Category::Other] += 4 * (s.max_batch * s.max_seq + s.max_batch);
  return p;
}

int64_t parse_bytes(const std::string& s, const std::string& flag) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  ANATOMY_CHECK(i > 0, flag, ": expected a size like 16GB or 80GiB (got '", s, "')");
  const double v = std::stod(s.substr(0, i));
  std::string unit = s.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mult = 0;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "KIB" || unit == "K") mult = 1024.0;
  else if (unit == "MIB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GIB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  ANATOMY_CHECK(mult > 0, flag, ": unknown unit '", s.substr(i), "' (use B, KB, MB, GB, KiB, MiB or GiB)");
  return static_cast<int64_t>(v * mult);
}

int64_t largest_batch_that_fits(PlanInput in, int64_t capacity, int64_t reserved, int64_t limit) {
  auto fits = [&](int64_t b) {
    in.shape.max_batch = b;
    return plan_memory(in).total() + reserved <= capacity;
  };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 1;
  while (hi < limit && fits(std::min(limit, hi * 2))) hi = std::min(limit, hi * 2);
  if (hi == limit) return limit;
  int64_t bad = std::min(limit, hi * 2);
  lo = hi;
  while (bad - lo > 1) {
    int64_t mid = (lo + bad) / 2;
    (fits(mid) ? lo : bad) = mid;
  }
  return lo;
}

std::vector<Lever> levers_that_fit(const PlanInput& in, int64_t capacity, int64_t reserved, int64_t accum) {
  std::vector<Lever> out;
  auto consider = [&](PlanInput t, const std::string& what) {
    const int64_t total = plan_memory(t).total();
    if (total + reserved <= capacity) out.push_back({what, total});
  };
  const int64_t B = in.shape.max_batch;
  for (int64_t d = 2; d <= B && B / d >= 1; d *= 2) {
    PlanInput t = in;
    t.shape.max_batch = B / d;
    t.shape.gradients = GradientPlacement::Own;  // accumulated gradients need a buffer of their own
    consider(t, str_cat("--per-device-train-batch-size ", B / d, " --gradient-accumulation-steps ", accum * d));
  }
  for (CheckpointPolicy pol : {CheckpointPolicy::Selective, CheckpointPolicy::Layer}) {
    if (pol == in.shape.checkpointing) continue;
    PlanInput t = in;
    t.shape.checkpointing = pol;
    consider(t, str_cat("--gradient-checkpointing ", checkpoint_policy_name(pol)));
  }
  if (in.optimizer == OptimizerKind::AdamW) {
    PlanInput t = in;
    t.optimizer = OptimizerKind::AdamW8bit;
    consider(t, "--optim adamw-8bit");
    t.optimizer = OptimizerKind::Sgd;
    consider(t, "--optim sgd");
  }
  if (in.shape.compute == DType::F32) {
    PlanInput t = in;
    t.shape.compute = DType::BF16;
    consider(t, "--precision bf16");
  }
  std::sort(out.begin(), out.end(), [](const Lever& a, const Lever& b) { return a.total < b.total; });
  return out;
}

std::string format_plan(const MemoryPlan& p) {
  std::string s;
  char line[320];
  const double n = static_cast<double>(p.num_parameters);
  for (int i = 0; i < kNumCategories; ++i) {
    const int64_t b = p.bytes.v[i];
    std::snprintf(line, sizeof line, "  %-16s %12.1f MiB  %7.2f bytes/param\n",
                  std::string(category_name(static_cast<Category>(i))).c_str(), b / 1048576.0, b / n);
    s += line;
  }
  if (p.bytes.shared) {
    std::snprintf(line, sizeof line, "  %-16s %12.1f MiB  %7.2f bytes/param  (gradients in activation memory backward is done with)\n",
                  "counted twice", -p.bytes.shared / 1048576.0, -p.bytes.shared / n);
    s += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %12.1f MiB  %7.2f bytes/param\n", "total", p.total() / 1048576.0, p.total() / n);
  return s + line;
}

}  // namespace anatomy
