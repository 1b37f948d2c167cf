#include "memory/planner.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "dist/zero.h"
#include "model/bert.h"
#include "model/heads.h"
#include "model/params.h"
#include "optim/grad_norm.h"
#include "ops/backend_memory.h"

namespace anatomy {

namespace {

// Note [plan overflow]: the plan multiplies batch, sequence, layers and widths in int64; a batch
// of 1e11 or a sequence of 1e6 would wrap and print a negative (or small, "fitting") size. Before
// any of that arithmetic, a generous upper bound of the activations is computed in long double
// (BertConfig::validate() has already bounded the parameter count the same way) and anything
// above kMaxPlanBytes (an exbibyte: no machine holds it) is refused naming the flags that size
// it; the per-category figures are then checked non-negative and summed with overflow
// detection, so a plan is either exact or an error, never a wrapped number.
constexpr long double kMaxPlanBytes = 1152921504606846976.0L;  // 2^60

// Whole MiB, never wrapped: figures beyond a terabyte of MiB in three significant digits.
std::string mib(long double bytes) {
  char s[64];
  const long double m = bytes / 1048576.0L;
  std::snprintf(s, sizeof s, m < 1e12L ? "%.0Lf MiB" : "%.3Lg MiB", m);
  return s;
}

// The flags that size the batch: the trainer's, or `anatomy eval`'s for an inference plan.
struct SizeFlags {
  const char *batch, *seq;
};
SizeFlags size_flags(const PlanInput& in) {
  if (in.shape.training) return {"--per-device-train-batch-size", "--max-seq-length"};
  return {"--per-device-eval-batch-size", "--max-seq-length"};
}

// Generous upper bound of the activations (Note [plan overflow]): per layer and token at most a
// few dozen H-wide and I-wide fp32 rows, and heads x T scores.
long double activation_bound(const PlanInput& in) {
  const BertConfig& c = in.config;
  const long double B = static_cast<long double>(in.shape.max_batch), T = static_cast<long double>(in.shape.max_seq);
  const long double L = static_cast<long double>(c.num_hidden_layers), H = static_cast<long double>(c.hidden_size),
                    I = static_cast<long double>(c.intermediate_size), A = static_cast<long double>(c.num_attention_heads);
  return (L + 2) * B * T * (64 * H + 16 * I + 16 * A * T);
}

void refuse_sizes_that_overflow(const PlanInput& in) {
  const SizeFlags f = size_flags(in);
  const ModelShape& s = in.shape;
  ANATOMY_CHECK(s.max_batch >= 1, f.batch, " must be at least 1 (got ", s.max_batch, ")");
  ANATOMY_CHECK(s.max_seq >= 1, f.seq, " must be at least 1 (got ", s.max_seq, ")");
  const long double activations = activation_bound(in);
  ANATOMY_CHECK(activations <= kMaxPlanBytes, f.batch, " ", s.max_batch, " with ", f.seq, " ", s.max_seq,
                ": the activations alone would need about ", mib(activations), ", more than any machine holds; lower ",
                f.batch, " (or ", f.seq, ")");
}

// The sum of the categories, refused (rather than wrapped) when it does not fit int64.
void check_plan_arithmetic(const PlanInput& in, const MemoryPlan& p) {
  const SizeFlags f = size_flags(in);
  int64_t total = 0;
  for (int i = 0; i < kNumCategories; ++i)
    ANATOMY_CHECK(p.bytes.v[i] >= 0 && !__builtin_add_overflow(total, p.bytes.v[i], &total), f.batch, " ",
                  in.shape.max_batch, " with ", f.seq, " ", in.shape.max_seq, ": the memory plan's ",
                  category_name(static_cast<Category>(i)), " overflow 64-bit arithmetic; lower ", f.batch, " (or ", f.seq,
                  ")");
}

// The categories, exactly, for sizes refuse_sizes_that_overflow() has accepted.
MemoryPlan plan_categories(const PlanInput& in) {
  const BertConfig& c = in.config;
  const ModelShape& s = in.shape;
  MemoryPlan p;
  const ParamLayout lay = ParamLayout::for_sequence_classification(c);
  const int64_t n = static_cast<int64_t>(lay.total());
  p.num_parameters = static_cast<int64_t>(lay.num_parameters());
  // Weights: fp32 masters, plus the half copy in mixed precision.
  p.bytes[Category::Weights] = 4 * n + (s.compute == DType::F32 ? 0 : n * static_cast<int64_t>(dtype_size(s.compute)));
  if (s.training) {
    p.bytes[Category::Gradients] = 4 * n;  // the full gradients (one micro-batch's, under ZeRO-2)
    p.bytes[Category::OptimizerState] =
        static_cast<int64_t>(zero_optimizer_state_bytes(in.optimizer, lay, in.world_size, in.zero_stage, in.rank, in.sgd_momentum) +
                             fp8_meta_bytes(c, s));
  }
  const ArenaBytes a = model_arena_bytes(c, s);
  p.bytes[Category::Activations] = static_cast<int64_t>(a.activations);
  if (a.block)  // gradients inside the activations' block: counted in both, once in the total
    p.bytes.shared = static_cast<int64_t>(a.activations) + p.bytes[Category::Gradients] - static_cast<int64_t>(a.block);
  if (s.training)  // ZeRO-2 with accumulation: this rank's gradient sum, a buffer of its own
    p.bytes[Category::Gradients] += static_cast<int64_t>(
        zero_gradient_shard_bytes(lay, in.world_size, in.zero_stage, in.accumulation, in.rank));
  p.bytes[Category::Temporary] = static_cast<int64_t>(a.temporary);
  if (in.device == Device::CUDA) {
    p.bytes[Category::Workspace] = static_cast<int64_t>(kCudaLtWorkspaceBytes);
    p.bytes[Category::Temporary] += static_cast<int64_t>(kCudaReduceScratchBytes);
    if (s.training)
      p.bytes[Category::Temporary] += static_cast<int64_t>(
          attention_scratch_bytes(s.max_batch, s.max_seq, static_cast<int>(c.num_attention_heads),
                                  static_cast<int>(c.head_dim()), s.compute) +
          fp8_layer_scratch_bytes(c, s));
  }
  // The trainer's device batch: ids, token types, mask [B, T] in I32 and labels (I32 [B], or
  // F32 [B, num_labels] for regression and multi-label, I32 [B, T] for masked-LM: model/heads.h), the gradient norm with
  // its block partials (GradNorm) and the step's per-sample loss sums (F32 [B]).
  p.bytes[Category::Other] = 12 * s.max_batch * s.max_seq + 4 * s.max_batch * label_width(c, s.max_seq) +
                             static_cast<int64_t>(GradNorm::bytes(static_cast<size_t>(n))) + 4 * s.max_batch;
  // Training on real tokens: the packing index, token rows I32 [B*T] and first rows I32 [B + 1]
  // (or the sequence offsets, which begin with them).
  if (s.training && s.packed_tokens) p.bytes[Category::Other] += 4 * (s.max_batch * s.max_seq + s.max_batch + 1);
  check_plan_arithmetic(in, p);
  return p;
}

// The planned total, or -1 for sizes whose plan would overflow: what the searches below compare
// against a capacity, where such a size simply does not fit.
int64_t total_or_minus_one(const PlanInput& in) {
  if (in.shape.max_batch < 1 || in.shape.max_seq < 1 || activation_bound(in) > kMaxPlanBytes) return -1;
  return plan_categories(in).total();
}

}  // namespace

void refuse_model_beyond(const PlanInput& in, const MemoryPlan& p, int64_t capacity, const std::string& memory) {
  const int64_t model = p.bytes[Category::Weights] + p.bytes[Category::Gradients] + p.bytes[Category::OptimizerState];
  const bool preset = in.config_source != "config.json";
  if (model > capacity)
    fail("the model alone (", p.num_parameters, " parameters, most of them from ", in.config.largest_field(), " in ",
         in.config_source, ") needs ", mib(static_cast<long double>(model)), " for weights",
         in.shape.training ? ", gradients and optimizer state" : "", " but ", memory, "; ",
         preset ? "use a smaller model" : "lower that field or use a smaller model",
         in.device == Device::CPU && in.world_size > 1 ? " or fewer ranks" : "");
}

void refuse_plan_beyond(const PlanInput& in, const MemoryPlan& p, int64_t capacity, const std::string& memory) {
  refuse_model_beyond(in, p, capacity, memory);
  if (p.total() <= capacity) return;
  const SizeFlags f = size_flags(in);
  fail(f.batch, " ", in.shape.max_batch, " with ", f.seq, " ", in.shape.max_seq, ": the plan needs ",
       mib(static_cast<long double>(p.total())), " but ", memory, "; lower ", f.batch, " (or ", f.seq, ")");
}

MemoryPlan plan_memory(const PlanInput& in) {
  refuse_sizes_that_overflow(in);
  const MemoryPlan p = plan_categories(in);
  // Note [host memory refusal]: on the CPU every planned byte is host memory, and the ranks of
  // a CPU data-parallel run are threads of this one process; a plan larger than the machine's
  // physical memory cannot run (it would die in bad_alloc or swap for hours), so it is refused
  // before anything is allocated, naming what to lower.
  if (in.device == Device::CPU) {
    const int64_t host = host_memory_bytes(), ranks = std::max(1, in.world_size);
    refuse_plan_beyond(in, p, host / ranks,
                       str_cat("this machine has ", mib(static_cast<long double>(host)), " of memory",
                               ranks > 1 ? str_cat(", ", mib(static_cast<long double>(host / ranks)), " for each of the ",
                                                   ranks, " ranks")
                                         : std::string()));
  }
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
    const int64_t total = total_or_minus_one(in);
    return total >= 0 && total <= capacity - reserved;
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
    const int64_t total = total_or_minus_one(t);
    if (total >= 0 && total <= capacity - reserved) out.push_back({what, total});
  };
  const int64_t B = in.shape.max_batch;
  // Micro-batch x accumulation equal to the batch asked for: B's divisors d (15: 5 x 3, 3 x 5, 1 x 15).
  std::vector<int64_t> divisors;
  for (int64_t d = 2; d <= B / d; ++d)
    if (B % d == 0) divisors.insert(divisors.end(), {d, B / d});
  if (B >= 2) divisors.push_back(B);
  std::sort(divisors.begin(), divisors.end());
  divisors.erase(std::unique(divisors.begin(), divisors.end()), divisors.end());
  for (const int64_t d : divisors) {
    if (accum > std::numeric_limits<int64_t>::max() / d) break;
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
    t.sgd_momentum = false;
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
