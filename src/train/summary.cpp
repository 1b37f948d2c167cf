#include "train/summary.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "model/bert.h"
#include "train/evaluate.h"

namespace anatomy {

namespace fs = std::filesystem;

namespace {
double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
}  // namespace

void write_run_summary(const TrainOptions& opt, const TrainResult& res, const MemoryPlan& mem_plan, const BertConfig& cfg,
                       const ModelShape& shape, int64_t used_before) {
  nlohmann::json out = {{"train_runtime", speed_metric(res.train_runtime, 4)},
                        {"train_samples_per_second", speed_metric(res.train_samples_per_second, 3)},
                        {"train_steps_per_second", speed_metric(res.train_steps_per_second, 3)},
                        {"steady_samples_per_second", res.steady_samples_per_second},
                        {"train_loss", res.train_loss},
                        {"train_samples", res.train_dataset_samples},
                        {"epoch", res.epoch},
                        {"first_step_loss", res.first_loss},
                        {"last_step_loss", res.last_loss},
                        {"steps", res.steps},
                        {"resumed_from_step", res.start_step},
                        {"samples", res.samples},
                        {"skipped_steps", res.skipped_steps},
                        {"nonfinite_steps", res.nonfinite_steps},
                        {"device", res.device},
                        {"precision", precision_name(opt.precision)},
                        {"per_device_train_batch_size", shape.max_batch},
                        {"gradient_accumulation_steps", opt.gradient_accumulation_steps},
                        {"gradient_checkpointing", checkpoint_policy_name(opt.gradient_checkpointing)},
                        {"optim", optimizer_name(opt.optim.kind)},
                        {"seq_len", shape.max_seq},
                        {"num_parameters", res.num_parameters},
                        {"data_wait_s", res.data_wait_s},
                        {"gpu_memory_occupied_mb", res.gpu_memory_occupied_mb},
                        {"cuda_context_mb", res.cuda_context_mb},
                        {"weights_mb", res.weights_mb},
                        {"model_allocation_nvml_mb", res.model_nvml_mb},
                        {"nvml_baseline_mb", used_before >= 0 ? used_before >> 20 : -1},
                        {"nvml_after_setup_mb", res.nvml_after_setup_mb},
                        {"nvml_after_first_step_mb", res.nvml_after_first_step_mb},
                        {"process_peak_rss_mb", res.process_peak_rss_mb}};
  if (opt.precision == Precision::Fp8) out["fp8_format"] = fp8_format_name(opt.fp8_grads);
  if (const auto& c = res.gpu_clocks) {
    out["gpu_sm_clock_mhz_median"] = c->sm_median_mhz;
    out["gpu_sm_clock_mhz_max"] = c->sm_max_mhz;
    out["gpu_power_w_median"] = c->power_median_w;
    out["gpu_power_limit_w"] = c->power_limit_w;
    out["gpu_power_capped_share"] = c->power_capped;
    out["gpu_thermal_slowdown_share"] = c->thermal;
  }
  // run_glue.py's files beside anatomy's own: eval_results.json (the last evaluation) and
  // all_results.json (the train_ and eval_ keys together).
  nlohmann::json all = {{"epoch", res.epoch},
                        {"train_loss", res.train_loss},
                        {"train_runtime", speed_metric(res.train_runtime, 4)},
                        {"train_samples", res.train_dataset_samples},
                        {"train_samples_per_second", speed_metric(res.train_samples_per_second, 3)},
                        {"train_steps_per_second", speed_metric(res.train_steps_per_second, 3)}};
  if (!res.eval_metrics.empty()) {
    const double rt = std::max(res.eval_runtime, 1e-9);
    nlohmann::json ev = {{"epoch", res.epoch},
                         {"eval_runtime", speed_metric(res.eval_runtime, 4)},
                         {"eval_samples", res.eval_samples},
                         {"eval_samples_per_second", speed_metric(static_cast<double>(res.eval_samples) / rt, 3)},
                         {"eval_steps_per_second", speed_metric(static_cast<double>(res.eval_steps) / rt, 3)}};
    for (const auto& [name, value] : res.eval_metrics) ev[metric_key(name)] = out[metric_key(name)] = value;
    write_file_atomic((fs::path(opt.output_dir) / "eval_results.json").string(), ev.dump(4) + "\n");
    all.update(ev);
  }
  if (res.predict_samples > 0) all["predict_samples"] = res.predict_samples;
  if (!res.best_model_checkpoint.empty()) {
    out["best_model_checkpoint"] = res.best_model_checkpoint;
    out["best_metric"] = res.best_metric;
  }
  write_file_atomic((fs::path(opt.output_dir) / "all_results.json").string(), all.dump(4) + "\n");
  nlohmann::json cats, planned;
  for (int i = 0; i < kNumCategories; ++i) {
    const std::string name(category_name(static_cast<Category>(i)));
    cats[name] = res.peak_bytes.v[i];
    planned[name] = mem_plan.bytes.v[i];
  }
  out["allocator_peak_bytes"] = cats;
  out["planned_bytes"] = planned;
  // Bytes counted in two categories (gradients in freed activation memory): the run's total is
  // the sum of the categories minus these.
  out["allocator_shared_bytes"] = res.peak_bytes.shared;
  out["planned_shared_bytes"] = mem_plan.bytes.shared;
  out["gradient_placement"] = gradient_placement_name(shape.gradients);
  out["world_size"] = res.world_size;
  out["zero_stage"] = res.zero_stage;
  if (res.world_size > 1) {
    out["rank_optimizer_state_bytes"] = res.rank_optimizer_state_bytes;
    out["rank_gradient_bytes"] = res.rank_gradient_bytes;
    out["reduction_buckets"] = res.reduction_buckets;
    out["rank_peak_bytes"] = res.rank_peak_bytes;
    out["rank_planned_bytes"] = res.rank_planned_bytes;
    out["gpu_memory_per_rank_mb"] = res.gpu_memory_per_rank_mb;
  }
  // Memory over one step: the static categories as planned, saved activations as they live.
  nlohmann::json events = nlohmann::json::array();
  for (const LivenessPoint& lp : activation_liveness(cfg, shape)) {
    nlohmann::json bytes;
    for (int i = 0; i < kNumCategories; ++i) bytes[std::string(category_name(static_cast<Category>(i)))] = mem_plan.bytes.v[i];
    bytes["activations"] = lp.activation_bytes;
    if (lp.gradient_bytes >= 0) bytes["gradients"] = lp.gradient_bytes;  // written so far (in activation memory)
    events.push_back({{"label", lp.label}, {"phase", lp.label.find("backward") != std::string::npos ? "backward"
                                                     : lp.label.find("optimizer") != std::string::npos ? "optimizer"
                                                                                                      : "forward"},
                      {"bytes", bytes}});
  }
  write_file_atomic((fs::path(opt.output_dir) / "memory_timeline.json").string(), nlohmann::json{{"events", events}}.dump(1) + "\n");
  write_file_atomic((fs::path(opt.output_dir) / "train_results.json").string(), out.dump(2) + "\n");

  // The memory anatomy: planned before the run, and the tagged allocator's peaks.
  const double n = static_cast<double>(res.num_parameters);
  std::printf("\nMemory anatomy (planned before the run | allocated, peak per category):\n");
  for (int i = 0; i < kNumCategories; ++i) {
    const int64_t b = res.peak_bytes.v[i], pb = mem_plan.bytes.v[i];
    if (!b && !pb) continue;
    std::printf("  %-16s %10.1f MiB | %10.1f MiB  %6.2f bytes/param\n",
                std::string(category_name(static_cast<Category>(i))).c_str(), mib(pb), mib(b), static_cast<double>(b) / n);
  }
  if (mem_plan.bytes.shared || res.peak_bytes.shared)
    std::printf("  %-16s %10.1f MiB | %10.1f MiB  %6.2f bytes/param  gradients in activation memory backward is done with\n",
                "counted twice", -mib(mem_plan.bytes.shared), -mib(res.peak_bytes.shared),
                -static_cast<double>(res.peak_bytes.shared) / n);
  std::printf("  %-16s %10.1f MiB | %10.1f MiB\n", "total", mib(mem_plan.total()), mib(res.peak_bytes.total()));
  if (res.gpu_memory_occupied_mb >= 0)
    std::printf("  NVML: CUDA context %lld MB, model allocation %lld MB, used at the end %lld MB (minus context: %lld MB vs %.0f MB planned)\n",
                static_cast<long long>(res.cuda_context_mb), static_cast<long long>(res.model_nvml_mb),
                static_cast<long long>(res.gpu_memory_occupied_mb),
                static_cast<long long>(res.gpu_memory_occupied_mb - res.cuda_context_mb - (used_before >> 20)),
                mib(mem_plan.total()));
  if (!res.memory_growth.empty()) {
    nlohmann::json g = nlohmann::json::array();
    int64_t total = 0;
    std::printf("  NVML growth during the first step, by op (--trace-memory-growth):\n");
    for (const auto& [op, bytes] : res.memory_growth) {
      g.push_back({{"op", op}, {"bytes", bytes}});
      total += bytes;
      std::printf("    %-32s %8.1f MiB\n", op.c_str(), mib(bytes));
    }
    std::printf("    %-32s %8.1f MiB\n", "total", mib(total));
  }
  if (res.gpu_clocks)
    std::printf("GPU over the steady steps (NVML, %d samples): %s\n", res.gpu_clocks->samples,
                clock_summary_line(*res.gpu_clocks).c_str());
  // Skipped steps: fp16's overflows (the loss scale backs off), and with --skip-nonfinite-steps the
  // steps whose loss or gradient norm was not finite.
  if (const int64_t overflow = res.skipped_steps - res.nonfinite_steps; overflow > 0)
    std::printf("fp16: %lld steps skipped on overflow\n", static_cast<long long>(overflow));
  if (res.nonfinite_steps)
    std::printf("%lld steps skipped: their loss or gradient norm was not finite (--skip-nonfinite-steps)\n",
                static_cast<long long>(res.nonfinite_steps));
  if (res.train_runtime > 0)
    std::printf("Data loading: the loop waited %.2f s for batches (%.1f%% of the run)\n", res.data_wait_s,
                100.0 * res.data_wait_s / res.train_runtime);
  if (!res.eval_metrics.empty()) {
    std::printf("Evaluation (%s):", res.problem_type.c_str());
    for (const auto& [name, value] : res.eval_metrics) std::printf(" %s %.4f", name.c_str(), value);
    std::printf("%s\n", res.problem_type == "masked_lm"                  ? " (loss and accuracy over the masked tokens)"
                        : res.problem_type == "token_classification"       ? " (precision, recall, f1 of entities; accuracy of tokens)"
                        : res.problem_type == "multi_label_classification" ? " (threshold 0.5)"
                                                                           : "");
  }
  if (res.world_size > 1) {
    std::printf("Data parallel: %d ranks, ZeRO stage %d; optimizer state per rank:", res.world_size, res.zero_stage);
    for (int64_t b : res.rank_optimizer_state_bytes) std::printf(" %.1f MiB", mib(b));
    std::printf("; gradients per rank:");
    for (int64_t b : res.rank_gradient_bytes) std::printf(" %.1f MiB", mib(b));
    if (!res.gpu_memory_per_rank_mb.empty()) {
      std::printf("; NVML used per GPU:");
      for (int64_t m : res.gpu_memory_per_rank_mb) std::printf(" %lld MB", static_cast<long long>(m));
    }
    std::printf("\n");
  }
  // The seed page's three lines.
  std::printf("\nTime: %.2f\nSamples/second: %.2f\n", res.train_runtime, res.train_samples_per_second);
  if (res.gpu_memory_occupied_mb >= 0)
    std::printf("GPU memory occupied: %lld MB.\n", static_cast<long long>(res.gpu_memory_occupied_mb));
  else
    std::printf("GPU memory occupied: none (no GPU in use; process peak memory %lld MB).\n",
                static_cast<long long>(res.process_peak_rss_mb));
}


}  // namespace anatomy
