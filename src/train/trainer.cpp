#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "memory/planner.h"
#include "model/config.h"
#include "telemetry/nvml.h"
#include "telemetry/profiler.h"
#include "telemetry/sampler.h"

namespace anatomy {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::Fp32;
  if (s == "tf32") return Precision::Tf32;
  if (s == "bf16") return Precision::Bf16;
  if (s == "fp16") return Precision::Fp16;
  fail("--precision: unknown precision '", s, "' (expected fp32, tf32, bf16 or fp16)");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

DType compute_dtype(Precision p) {
  return p == Precision::Bf16 ? DType::BF16 : p == Precision::Fp16 ? DType::F16 : DType::F32;
}

void TrainOptions::validate() const {
  ANATOMY_CHECK(per_device_train_batch_size >= 1 || per_device_train_batch_size == kAutoBatch,
                "--per-device-train-batch-size must be at least 1 (got ",
                per_device_train_batch_size, ")");
  ANATOMY_CHECK(gradient_accumulation_steps >= 1, "--gradient-accumulation-steps must be at least 1 (got ",
                gradient_accumulation_steps, ")");
  ANATOMY_CHECK(num_samples >= 1, "--num-samples must be at least 1 (got ", num_samples, ")");
  ANATOMY_CHECK(seq_len >= 2, "--seq-len must be at least 2 (got ", seq_len, ")");
  ANATOMY_CHECK(num_train_epochs >= 1 || max_steps > 0, "--num-train-epochs must be at least 1 unless --max-steps is set");
  ANATOMY_CHECK(learning_rate >= 0 && std::isfinite(learning_rate), "--learning-rate must be a finite non-negative number");
  ANATOMY_CHECK(max_grad_norm >= 0, "--max-grad-norm must be non-negative (0 disables clipping)");
  ANATOMY_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--device: expected auto, cpu or cuda (got '",
                device, "')");
  ANATOMY_CHECK(logging_steps >= 0, "--logging-steps must be non-negative");
  ANATOMY_CHECK(warmup_steps >= 0, "--warmup-steps must be non-negative");
  ANATOMY_CHECK(prefetch >= 1, "--dataloader-prefetch must be at least 1");
}

namespace {

// fp16 dynamic loss scaling: skip the step on overflow and halve the scale; double it after
// `interval` clean steps (the defaults of torch.amp.GradScaler).
struct LossScaler {
  float scale = 1.0f;
  int64_t clean = 0, interval = 2000;
  bool update(bool overflow) {
    if (overflow) {
      scale = std::max(scale * 0.5f, 1.0f);
      clean = 0;
      return false;
    }
    if (++clean >= interval) {
      scale *= 2.0f;
      clean = 0;
    }
    return true;
  }
};

std::string fmt_duration(double s) {
  char b[32];
  int h = static_cast<int>(s / 3600), m = static_cast<int>(std::fmod(s, 3600) / 60), sec = static_cast<int>(std::fmod(s, 60));
  if (h) std::snprintf(b, sizeof b, "%d:%02d:%02d", h, m, sec);
  else std::snprintf(b, sizeof b, "%02d:%02d", m, sec);
  return b;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

TrainResult train(const TrainOptions& opt) {
  opt.validate();
  // Model configuration.
  BertConfig cfg = opt.model_name_or_path.empty() ? BertConfig::preset(opt.preset)
                                                  : BertConfig::from_json_file(config_path_of(opt.model_name_or_path));
  if (opt.model_name_or_path.empty() && cfg.num_labels != opt.num_labels) cfg.set_num_labels(opt.num_labels);
  cfg.validate(opt.model_name_or_path.empty() ? opt.preset : config_path_of(opt.model_name_or_path));
  ANATOMY_CHECK(opt.seq_len <= cfg.max_position_embeddings, "--seq-len ", opt.seq_len,
                " is longer than the model's position table (max_position_embeddings = ", cfg.max_position_embeddings, ")");

  // Device: the GPU when present; NVML readings bracket what the context and weights take.
  Nvml nvml;
  const bool want_cuda = opt.device == "cuda" || (opt.device == "auto" && cuda_available());
  auto nvml_used = [&]() -> int64_t {
    auto m = nvml.memory(0);
    return m ? static_cast<int64_t>(m->used) : -1;
  };
  const int64_t used_before = want_cuda ? nvml_used() : -1;
  std::unique_ptr<Backend> device = want_cuda ? make_cuda_backend(0) : make_cpu_backend(opt.threads);
  const int64_t used_context = want_cuda ? nvml_used() : -1;
  if (opt.precision == Precision::Tf32) device->set_allow_tf32(true);
  ProfilingBackend prof(*device);  // the model runs through it; it only forwards until enabled
  Backend* be = &prof;

  ModelShape shape{opt.per_device_train_batch_size, opt.seq_len, compute_dtype(opt.precision), opt.gradient_checkpointing, true};
  if (shape.max_batch == TrainOptions::kAutoBatch) {  // the largest micro-batch the plan fits in free memory
    auto mem = want_cuda ? nvml.memory(0) : std::nullopt;
    ANATOMY_CHECK(mem.has_value(), "--per-device-train-batch-size auto needs a GPU whose free memory NVML reports");
    shape.max_batch = largest_batch_that_fits({cfg, shape, opt.optim.kind, Device::CUDA}, static_cast<int64_t>(mem->free),
                                              int64_t{256} << 20);
    ANATOMY_CHECK(shape.max_batch > 0, "--per-device-train-batch-size auto: not even a batch of 1 fits in ",
                  mem->free >> 20, " MiB free");
    std::fprintf(stderr, "anatomy: --per-device-train-batch-size auto chose %lld\n", static_cast<long long>(shape.max_batch));
  }
  // The plan, before anything is allocated: refuse a run that cannot fit, with the levers
  // that would make it fit.
  const PlanInput plan_in{cfg, shape, opt.optim.kind, want_cuda ? Device::CUDA : Device::CPU};
  const MemoryPlan mem_plan = plan_memory(plan_in);
  if (auto mem = want_cuda ? nvml.memory(0) : std::nullopt) {
    const int64_t free_bytes = static_cast<int64_t>(mem->free), slack = int64_t{256} << 20;
    if (mem_plan.total() + slack > free_bytes) {
      std::fprintf(stderr, "Memory plan (does not fit):\n%s", format_plan(mem_plan).c_str());
      std::string levers;
      for (const Lever& l : levers_that_fit(plan_in, free_bytes, slack, opt.gradient_accumulation_steps))
        levers += str_cat("; ", l.description, " (", l.total >> 20, " MiB)");
      fail("--per-device-train-batch-size ", shape.max_batch, ": the plan needs ", mem_plan.total() >> 20, " MiB but the GPU has ",
           free_bytes >> 20, " MiB free", levers.empty() ? std::string("; no single lever makes it fit") : " -- would fit" + levers);
    }
  }
  BertForSequenceClassification model(*be, cfg, shape);
  model.set_dropout_seed(opt.seed);
  model.init_weights(opt.seed);
  if (!opt.model_name_or_path.empty() && fs::exists(fs::path(opt.model_name_or_path) / "model.safetensors")) {
    LoadReport rep = load_pretrained_weights(opt.model_name_or_path, model);
    if (!rep.newly_initialized.empty())
      std::fprintf(stderr, "note: %zu weights were not in %s and are newly initialized (e.g. %s)\n",
                   rep.newly_initialized.size(), opt.model_name_or_path.c_str(), rep.newly_initialized[0].c_str());
    if (!rep.unused.empty())
      std::fprintf(stderr, "note: %zu tensors of %s are not used by BertForSequenceClassification (e.g. %s)\n",
                   rep.unused.size(), opt.model_name_or_path.c_str(), rep.unused[0].c_str());
  }
  be->synchronize();
  const int64_t used_weights = want_cuda ? nvml_used() : -1;

  OptimizerOptions oo = opt.optim;
  auto optimizer = Optimizer::create(*be, oo, model.layout());

  // Data and the device-side batch buffers.
  SyntheticDataset data(parse_synthetic_kind(opt.dataset), static_cast<size_t>(opt.num_samples), opt.seq_len,
                        cfg.vocab_size, opt.seed);
  const int64_t B = shape.max_batch, T = opt.seq_len, accum = opt.gradient_accumulation_steps;
  BatchPlan plan(data.size(), B, opt.seed);
  const int64_t micro_per_epoch = plan.batches_per_epoch();
  const int64_t steps_per_epoch = std::max<int64_t>(1, micro_per_epoch / accum);
  const int64_t total_steps = opt.max_steps > 0 ? opt.max_steps : steps_per_epoch * opt.num_train_epochs;
  Allocator& al = be->allocator();
  Buffer d_ids(al, DType::I32, {B, T}, Category::Other), d_types(al, DType::I32, {B, T}, Category::Other),
      d_mask(al, DType::I32, {B, T}, Category::Other), d_labels(al, DType::I32, {B}, Category::Other),
      d_norm(al, DType::F32, {1}, Category::Other);
  Prefetcher loader(data, plan, 0, total_steps * accum, opt.prefetch);

  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  ANATOMY_CHECK(!ec, opt.output_dir, ": cannot create the output directory: ", ec.message());
  fs::remove(fs::path(opt.output_dir) / "train_results.json", ec);  // a run in progress does not look finished
  std::ofstream metrics(fs::path(opt.output_dir) / "metrics.jsonl");

  std::fprintf(stderr, "anatomy: training %s (%lld parameters) on %s, %s, batch %lld x %lld accumulation, seq %lld, %lld steps\n",
               opt.model_name_or_path.empty() ? opt.preset.c_str() : opt.model_name_or_path.c_str(),
               static_cast<long long>(model.layout().num_parameters()), be->name().c_str(), precision_name(opt.precision),
               static_cast<long long>(B), static_cast<long long>(accum), static_cast<long long>(T),
               static_cast<long long>(total_steps));

  LossScaler scaler;
  if (opt.precision == Precision::Fp16) scaler.scale = opt.fp16_initial_scale;
  const bool tty = !opt.disable_progress_bar && isatty(STDERR_FILENO);
  TrainResult res;
  res.device = be->name();
  std::vector<double> stamps;
  double loss_sum_all = 0, data_wait = 0, window_loss = 0;
  int64_t window_samples = 0, micro = 0;
  HostBatch hb;
  std::vector<float> host_losses(B);

  // One optimizer step: accumulation over micro-batches, gradient norm, (fp16) overflow
  // check, update. Returns the summed loss and the samples it saw.
  auto run_step = [&](Prefetcher& source, double& step_loss, int64_t& step_samples) -> float {
    model.zero_grads();
    step_loss = 0;
    step_samples = 0;
    for (int64_t m = 0; m < accum; ++m, ++micro) {
      double waited = 0;
      ANATOMY_CHECK(source.next(hb, waited), "internal error: the data loader ran dry");
      data_wait += waited;
      const int64_t b = hb.batch;
      DeviceBatch db{d_ids.tensor().slice(0, b), d_types.tensor().slice(0, b), d_mask.tensor().slice(0, b),
                     d_labels.tensor().slice(0, b)};
      be->set_phase(Phase::Data);
      be->upload(db.input_ids, hb.input_ids.data());
      be->upload(db.token_type_ids, hb.token_type_ids.data());
      be->upload(db.attention_mask, hb.attention_mask.data());
      be->upload(db.labels, hb.labels.data());
      model.forward_backward(db, scaler.scale / static_cast<float>(b * accum), static_cast<uint64_t>(micro) << 12);
      be->set_phase(Phase::Data);
      be->download(host_losses.data(), model.losses().slice(0, b));
      for (int64_t i = 0; i < b; ++i) step_loss += host_losses[i];
      step_samples += b;
    }
    be->set_phase(Phase::Optimizer);
    be->fill(d_norm, 0.0f);
    be->sum_squares(d_norm, model.grads());
    bool apply = true;
    if (opt.precision == Precision::Fp16) {
      float norm_sq = 0;
      be->download(&norm_sq, d_norm);
      apply = scaler.update(!std::isfinite(norm_sq));
      if (!apply) ++res.skipped_steps;
    }
    const float lr = scheduled_lr(opt.lr_scheduler_type, opt.learning_rate, optimizer->steps(), total_steps, opt.warmup_steps);
    if (apply) {
      ParamGroups groups{model.master(), model.shape().compute == DType::F32 ? Tensor() : model.compute_params(),
                         model.grads(), model.layout().decay_end()};
      optimizer->step(groups, GradTransform{d_norm, 1.0f / scaler.scale, opt.max_grad_norm}, lr);
    }
    return lr;
  };

  NvmlSampler sampler(nvml, (fs::path(opt.output_dir) / "nvml.jsonl").string(), 0.2);
  if (want_cuda) sampler.start();
  const auto t0 = Clock::now();
  for (int64_t step = 0; step < total_steps; ++step) {
    double step_loss = 0;
    int64_t step_samples = 0;
    const float lr = run_step(loader, step_loss, step_samples);
    be->synchronize();
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    stamps.push_back(now);
    const double mean_loss = step_loss / std::max<int64_t>(1, step_samples);
    if (step == 0) res.first_loss = mean_loss;
    res.last_loss = mean_loss;
    loss_sum_all += step_loss;
    res.samples += step_samples;
    window_loss += step_loss;
    window_samples += step_samples;
    const bool log_now = opt.logging_steps > 0 && ((step + 1) % opt.logging_steps == 0 || step + 1 == total_steps);
    if (log_now || tty) {
      const double sps = res.samples / std::max(now, 1e-9);
      const double eta = (total_steps - step - 1) * now / (step + 1);
      if (log_now) {
        nlohmann::json j = {{"step", step + 1}, {"loss", window_loss / std::max<int64_t>(1, window_samples)},
                            {"learning_rate", lr}, {"samples_per_second", sps}, {"elapsed_s", now},
                            {"data_wait_s", data_wait}, {"loss_scale", scaler.scale}};
        if (auto mem = nvml.memory(0)) j["gpu_memory_used_mb"] = mem->used >> 20;
        metrics << j.dump() << "\n" << std::flush;
        std::fprintf(stderr, "%s{'loss': %.4f, 'learning_rate': %.3g, 'samples_per_second': %.2f, 'step': %lld/%lld, 'eta': '%s'}\n",
                     tty ? "\r\033[K" : "", window_loss / std::max<int64_t>(1, window_samples), lr, sps,
                     static_cast<long long>(step + 1), static_cast<long long>(total_steps), fmt_duration(eta).c_str());
        window_loss = 0;
        window_samples = 0;
      }
      if (tty) {
        const int width = 30, filled = static_cast<int>(width * (step + 1) / total_steps);
        std::fprintf(stderr, "\r%3d%%|%s%s| %lld/%lld [%s<%s, %.2f samples/s]", static_cast<int>(100 * (step + 1) / total_steps),
                     std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(),
                     static_cast<long long>(step + 1), static_cast<long long>(total_steps), fmt_duration(now).c_str(),
                     fmt_duration(eta).c_str(), sps);
      }
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  be->synchronize();
  res.train_runtime = std::chrono::duration<double>(Clock::now() - t0).count();
  res.steps = total_steps;
  res.final_loss_scale = scaler.scale;
  res.train_samples_per_second = res.samples / res.train_runtime;
  res.train_steps_per_second = total_steps / res.train_runtime;
  res.train_loss = loss_sum_all / std::max<int64_t>(1, res.samples);
  const size_t half = stamps.size() / 2;
  if (stamps.size() > 3) {
    const int64_t per_step = B * accum;
    res.steady_samples_per_second = static_cast<double>((stamps.size() - 1 - half) * per_step) / (stamps.back() - stamps[half]);
  } else {
    res.steady_samples_per_second = res.train_samples_per_second;
  }
  res.num_parameters = static_cast<int64_t>(model.layout().num_parameters());
  res.peak_bytes = al.stats().peak();
  res.weights_mb = res.peak_bytes[Category::Weights] >> 20;
  res.process_peak_rss_mb = static_cast<int64_t>(process_peak_rss_bytes() >> 20);
  if (want_cuda && used_before >= 0) {
    res.gpu_memory_occupied_mb = nvml_used() >> 20;
    res.cuda_context_mb = (used_context - used_before) >> 20;
    res.model_nvml_mb = (used_weights - used_context) >> 20;
  }
  sampler.stop();

  // --profile-steps: extra steps, outside the timed ones, with every op between timing marks.
  if (opt.profile_steps > 0) {
    Prefetcher source(data, plan, 0, opt.profile_steps * accum, opt.prefetch);
    prof.enable(true);
    for (int64_t k = 0; k < opt.profile_steps; ++k) {
      double l = 0;
      int64_t n = 0;
      prof.step_begin();
      run_step(source, l, n);
      prof.step_end();
    }
    ProfileSummary ps = prof.summarize();
    prof.enable(false);
    const Ceilings ceil = measure_ceilings(*device);
    write_profile((fs::path(opt.output_dir) / "profile.json").string(), ps, ceil);
    print_profile(ps, ceil);
  }

  if (opt.save_model) save_pretrained(opt.output_dir, model);
  nlohmann::json out = {{"train_runtime", res.train_runtime},
                        {"train_samples_per_second", res.train_samples_per_second},
                        {"train_steps_per_second", res.train_steps_per_second},
                        {"steady_samples_per_second", res.steady_samples_per_second},
                        {"train_loss", res.train_loss},
                        {"first_step_loss", res.first_loss},
                        {"last_step_loss", res.last_loss},
                        {"steps", res.steps},
                        {"samples", res.samples},
                        {"skipped_steps", res.skipped_steps},
                        {"device", res.device},
                        {"precision", precision_name(opt.precision)},
                        {"per_device_train_batch_size", B},
                        {"gradient_accumulation_steps", accum},
                        {"gradient_checkpointing", checkpoint_policy_name(opt.gradient_checkpointing)},
                        {"optim", optimizer_name(opt.optim.kind)},
                        {"seq_len", T},
                        {"num_parameters", res.num_parameters},
                        {"data_wait_s", data_wait},
                        {"gpu_memory_occupied_mb", res.gpu_memory_occupied_mb},
                        {"cuda_context_mb", res.cuda_context_mb},
                        {"weights_mb", res.weights_mb},
                        {"model_allocation_nvml_mb", res.model_nvml_mb},
                        {"process_peak_rss_mb", res.process_peak_rss_mb}};
  nlohmann::json cats;
  for (int i = 0; i < kNumCategories; ++i) cats[std::string(category_name(static_cast<Category>(i)))] = res.peak_bytes.v[i];
  out["allocator_peak_bytes"] = cats;
  nlohmann::json planned;
  for (int i = 0; i < kNumCategories; ++i) planned[std::string(category_name(static_cast<Category>(i)))] = mem_plan.bytes.v[i];
  out["planned_bytes"] = planned;
  // Memory over one step: the static categories as planned, saved activations as they live.
  nlohmann::json events = nlohmann::json::array();
  for (const LivenessPoint& lp : activation_liveness(cfg, shape)) {
    nlohmann::json bytes;
    for (int i = 0; i < kNumCategories; ++i) bytes[std::string(category_name(static_cast<Category>(i)))] = mem_plan.bytes.v[i];
    bytes["activations"] = lp.activation_bytes;
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
                std::string(category_name(static_cast<Category>(i))).c_str(), mib(pb), mib(b), b / n);
  }
  std::printf("  %-16s %10.1f MiB | %10.1f MiB\n", "total", mib(mem_plan.total()), mib(res.peak_bytes.total()));
  if (res.gpu_memory_occupied_mb >= 0)
    std::printf("  NVML: CUDA context %lld MB, model allocation %lld MB, used at the end %lld MB (minus context: %lld MB vs %.0f MB planned)\n",
                static_cast<long long>(res.cuda_context_mb), static_cast<long long>(res.model_nvml_mb),
                static_cast<long long>(res.gpu_memory_occupied_mb),
                static_cast<long long>(res.gpu_memory_occupied_mb - res.cuda_context_mb - (used_before >> 20)),
                mem_plan.total() / 1e6 * (1e6 / 1048576.0));
  if (res.skipped_steps) std::printf("fp16: %lld steps skipped on overflow\n", static_cast<long long>(res.skipped_steps));
  // The seed page's three lines.
  std::printf("\nTime: %.2f\nSamples/second: %.2f\n", res.train_runtime, res.train_samples_per_second);
  if (res.gpu_memory_occupied_mb >= 0)
    std::printf("GPU memory occupied: %lld MB.\n", static_cast<long long>(res.gpu_memory_occupied_mb));
  else
    std::printf("GPU memory occupied: none (no GPU in use; process peak memory %lld MB).\n",
                static_cast<long long>(res.process_peak_rss_mb));
  return res;
}

}  // namespace anatomy
