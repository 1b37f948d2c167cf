#include <cmath>
#include <cstdlib>
#include <string>

#include "train/options.h"

namespace anatomy {

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::Fp32;
  if (s == "tf32") return Precision::Tf32;
  if (s == "bf16") return Precision::Bf16;
  if (s == "fp16") return Precision::Fp16;
  if (s == "fp8") return Precision::Fp8;
  fail("--precision: unknown precision '", s, "' (expected fp32, tf32, bf16, fp16 or fp8)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
    case Precision::Fp8: return "fp8";
  }
  return "?";
}

const char* fp8_format_name(Fp8Format grads) { return grads == Fp8Format::E4M3 ? "e4m3" : "hybrid"; }

DType compute_dtype(Precision p, Device device) {
  if (p == Precision::Fp8) return device == Device::CUDA ? DType::BF16 : DType::F32;
  return p == Precision::Bf16 ? DType::BF16 : p == Precision::Fp16 ? DType::F16 : DType::F32;
}

const char* cadence_name(Cadence c) { return c == Cadence::Steps ? "steps" : c == Cadence::Epoch ? "epoch" : "no"; }

PlanInput plan_input(const TrainOptions& o, const BertConfig& cfg, int64_t batch, Device device, int world, int rank) {
  const int zero = world > 1 ? o.zero_stage : 0;
  ModelShape shape{batch, o.seq_len, compute_dtype(o.precision, device), o.gradient_checkpointing, true,
                   resolve_gradient_placement(o.gradient_placement, o.gradient_accumulation_steps, zero == 2)};
  shape.packed_tokens = o.skip_padding && !o.train_file.empty() && shape.checkpointing != CheckpointPolicy::Layer;
  shape.fp8 = o.precision == Precision::Fp8;
  shape.fp8_grads = o.fp8_grads;
  // ANATOMY_LAST_LAYER=all: the last layer on every token, to compare (Note [last layer on the
  // first tokens] in model/bert.cpp).
  const char* last = std::getenv("ANATOMY_LAST_LAYER");
  shape.last_layer_first_tokens = !(last && std::string(last) == "all");
  return PlanInput{cfg,  shape, o.optim.kind, device, world, zero, rank, o.gradient_accumulation_steps,
                   o.model_name_or_path.empty() ? "--preset " + o.preset : "config.json", o.optim.momentum != 0.0f};
}

void TrainOptions::resolve_step_ratios(int64_t total) {
  auto resolve = [&](double ratio, int64_t& steps) {
    if (ratio > 0) steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * static_cast<double>(total))));
  };
  resolve(logging_ratio, logging_steps);
  resolve(eval_ratio, eval_steps);
  resolve(save_ratio, save_steps);
  logging_ratio = eval_ratio = save_ratio = 0;
}

void TrainOptions::validate() const {
  ANATOMY_CHECK(per_device_train_batch_size >= 1 || per_device_train_batch_size == kAutoBatch,
                "--per-device-train-batch-size must be at least 1 (got ",
                per_device_train_batch_size, ")");
  ANATOMY_CHECK(gradient_accumulation_steps >= 1, "--gradient-accumulation-steps must be at least 1 (got ",
                gradient_accumulation_steps, ")");
  ANATOMY_CHECK(num_samples >= 1, "--num-samples must be at least 1 (got ", num_samples, ")");
  ANATOMY_CHECK(seq_len >= 2, "--max-seq-length must be at least 2 (got ", seq_len, ")");
  ANATOMY_CHECK(num_train_epochs >= 1 || max_steps > 0, "--num-train-epochs must be at least 1 unless --max-steps is set");
  ANATOMY_CHECK(learning_rate >= 0 && std::isfinite(learning_rate), "--learning-rate must be a finite non-negative number");
  ANATOMY_CHECK(max_grad_norm >= 0, "--max-grad-norm must be non-negative (0 disables clipping)");
  ANATOMY_CHECK(logging_steps >= 0, "--logging-steps must be non-negative");
  ANATOMY_CHECK(warmup_steps >= 0, "--warmup-steps must be non-negative");
  ANATOMY_CHECK(prefetch >= 1, "--dataloader-prefetch must be at least 1");
  ANATOMY_CHECK(eval_steps >= 0, "--eval-steps must be non-negative (0: every --logging-steps)");
  ANATOMY_CHECK(save_steps >= 1, "--save-steps must be at least 1");
  ANATOMY_CHECK(save_total_limit >= 0, "--save-total-limit must be non-negative (0: keep all)");
  ANATOMY_CHECK(per_device_eval_batch_size >= 1, "--per-device-eval-batch-size must be at least 1");
  ANATOMY_CHECK(validation_split >= 0 && validation_split < 1, "--validation-split must be in [0, 1) (got ",
                validation_split, ")");
  ANATOMY_CHECK(validation_split == 0 || validation_file.empty(), "--validation-split and --validation-file exclude each other");
  ANATOMY_CHECK(validation_split_percentage >= 0 && validation_split_percentage < 100,
                "--validation-split-percentage must be in [0, 100) (got ", validation_split_percentage, ")");
  ANATOMY_CHECK(validation_split_percentage == 0 || (masked_lm() && validation_file.empty() && validation_split == 0),
                "--validation-split-percentage is run_mlm.py's: --task mlm without --validation-file or --validation-split");
  ANATOMY_CHECK(nproc_per_node >= 1 && nproc_per_node <= 64, "--nproc-per-node: expected 1 to 64 (got ", nproc_per_node, ")");
  ANATOMY_CHECK(zero_stage >= 0 && zero_stage <= 2, "--zero-stage: expected 0, 1 or 2 (got ", zero_stage, ")");
  ANATOMY_CHECK(!group_by_length || !train_file.empty(), "--group-by-length needs --train-file (synthetic samples all have one length)");
}

}  // namespace anatomy
