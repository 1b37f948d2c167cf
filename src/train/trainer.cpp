#include "train/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "memory/planner.h"
#include "model/config.h"
#include "optim/grad_norm.h"
#include "telemetry/nvml.h"
#include "telemetry/profiler.h"
#include "telemetry/sampler.h"
#include "train/checkpoints.h"
#include "train/evaluate.h"
#include "dist/data_parallel.h"
#include "train/staging.h"
#include "train/summary.h"
#include "train/train_data.h"

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
  ANATOMY_CHECK(eval_strategy == "no" || eval_strategy == "steps" || eval_strategy == "epoch",
                "--eval-strategy: expected no, steps or epoch (got '", eval_strategy, "')");
  ANATOMY_CHECK(checkpoint_strategy == "no" || checkpoint_strategy == "steps" || checkpoint_strategy == "epoch",
                "--save-strategy: expected final, no, steps or epoch (got '", checkpoint_strategy, "')");
  ANATOMY_CHECK(eval_steps >= 0, "--eval-steps must be non-negative (0: every --logging-steps)");
  ANATOMY_CHECK(save_steps >= 1, "--save-steps must be at least 1");
  ANATOMY_CHECK(save_total_limit >= 0, "--save-total-limit must be non-negative (0: keep all)");
  ANATOMY_CHECK(per_device_eval_batch_size >= 1, "--per-device-eval-batch-size must be at least 1");
  ANATOMY_CHECK(validation_split >= 0 && validation_split < 1, "--validation-split must be in [0, 1) (got ",
                validation_split, ")");
  ANATOMY_CHECK(validation_split == 0 || validation_file.empty(), "--validation-split and --validation-file exclude each other");
  ANATOMY_CHECK(!group_by_length || !train_file.empty(), "--group-by-length needs --train-file (synthetic samples all have one length)");
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

}  // namespace

namespace {

// Note [stopping cleanly]: SIGINT and SIGTERM only set a flag (the handler does nothing else, so
// it is async-signal-safe) and restore the default action, so a second Ctrl-C kills at once.
// The loop looks at the flag after each optimizer step: it saves a checkpoint, prints the command
// that resumes, and returns. A SIGKILL cannot be caught; checkpoints are written to a staging
// directory and renamed into place (train/checkpoints.h), so the newest complete one survives.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &m_old_int);
    sigaction(SIGTERM, &sa, &m_old_term);
  }
  ~StopSignals() {
    sigaction(SIGINT, &m_old_int, nullptr);
    sigaction(SIGTERM, &m_old_term, nullptr);
  }
  int pending() const { return g_stop_signal.load(); }

 private:
  struct sigaction m_old_int {}, m_old_term {};
};

// What must match between a checkpoint and the run resuming it for the continuation to be the
// same run: flag name -> value.
nlohmann::json run_fingerprint(const TrainOptions& o, int64_t batch) {
  return {{"--per-device-train-batch-size", batch},
          {"--gradient-accumulation-steps", o.gradient_accumulation_steps},
          {"--seed", o.seed},
          {"--precision", precision_name(o.precision)},
          {"--optim", optimizer_name(o.optim.kind)},
          {"--seq-len", o.seq_len},
          {"--train-file", o.train_file},
          {"--dataset", o.train_file.empty() ? o.dataset : ""},
          {"--num-samples", o.train_file.empty() ? o.num_samples : 0},
          {"--validation-split", o.validation_split},
          {"--group-by-length", o.group_by_length}};
}

// metrics.jsonl of a resumed run: the lines up to the checkpoint's step, then the new ones.
void keep_metrics_up_to(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      break;  // a line cut short by a kill: nothing after it was written
    }
  }
  write_file_atomic(path.string(), kept);
}

}  // namespace

BertConfig model_config(const TrainOptions& opt) {
  BertConfig cfg = opt.model_name_or_path.empty() ? BertConfig::preset(opt.preset)
                                                  : BertConfig::from_json_file(config_path_of(opt.model_name_or_path));
  if (opt.model_name_or_path.empty() && cfg.num_labels != opt.num_labels) cfg.set_num_labels(opt.num_labels);
  cfg.validate(opt.model_name_or_path.empty() ? opt.preset : config_path_of(opt.model_name_or_path));
  ANATOMY_CHECK(opt.seq_len <= cfg.max_position_embeddings, "--seq-len ", opt.seq_len,
                " is longer than the model's position table (max_position_embeddings = ", cfg.max_position_embeddings, ")");
  cfg.architectures = {"BertForSequenceClassification"};  // what we train and save, whatever head it was saved with
  return cfg;
}

TrainResult train(const TrainOptions& opt) {
  if (opt.nproc_per_node > 1) return train_data_parallel(opt);
  opt.validate();
  // Model configuration and data (text data decides the classes of the head).
  BertConfig cfg = model_config(opt);
  const TrainData data = load_train_data(opt, cfg);
  ANATOMY_CHECK(opt.eval_strategy == "no" || data.validation, "--eval-strategy ", opt.eval_strategy,
                " needs validation data: --validation-file or --validation-split");
  std::string resume_dir;
  if (!opt.resume_from_checkpoint.empty()) resume_dir = resolve_resume_path(opt.resume_from_checkpoint, opt.output_dir);

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

  ModelShape shape{opt.per_device_train_batch_size, opt.seq_len, compute_dtype(opt.precision), opt.gradient_checkpointing, true,
                   resolve_gradient_placement(opt.gradient_placement, opt.gradient_accumulation_steps)};
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
  MemoryPlan mem_plan = plan_memory(plan_in);
  if (opt.eval_strategy != "no")  // evaluate() holds its batch while it runs
    mem_plan.bytes[Category::Other] += evaluation_buffer_bytes(std::min(opt.per_device_eval_batch_size, shape.max_batch),
                                                               shape.max_seq, true);
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
    if (const auto small = model.layernorm_weights_below(1e-3f); !small.empty())
      std::fprintf(stderr, "note: %zu LayerNorm weights of %s have elements below 1e-3 in magnitude (e.g. %s); LayerNorm "
                   "backward divides by them, so their gradients are less precise (exactly 0: not exact)\n",
                   small.size(), opt.model_name_or_path.c_str(), small[0].c_str());
  }
  be->synchronize();
  const int64_t used_weights = want_cuda ? nvml_used() : -1;

  auto optimizer = Optimizer::create(*be, opt.optim, model.layout());

  // Batches and the device-side batch buffers.
  const int64_t B = shape.max_batch, T = opt.seq_len, accum = opt.gradient_accumulation_steps;
  const BatchPlan plan = data.batch_plan(B, opt.seed, opt.group_by_length);
  const int64_t micro_per_epoch = plan.batches_per_epoch();
  const int64_t steps_per_epoch = std::max<int64_t>(1, micro_per_epoch / accum);
  const int64_t total_steps = opt.total_steps(steps_per_epoch);
  Allocator& al = be->allocator();
  Buffer d_ids(al, DType::I32, {B, T}, Category::Other), d_types(al, DType::I32, {B, T}, Category::Other),
      d_mask(al, DType::I32, {B, T}, Category::Other), d_labels(al, DType::I32, {B}, Category::Other),
      d_loss_sums(al, DType::F32, {B}, Category::Other);
  GradNorm grad_norm(*be, model.layout().total());

  // Resume: weights, optimizer state and step from the checkpoint; the data order and the
  // dropout masks are pure functions of (seed, position), so the position restores them.
  LossScaler scaler;
  if (opt.precision == Precision::Fp16) scaler.scale = opt.fp16_initial_scale;
  TrainResult res;
  res.device = be->name();
  double loss_sum_all = 0, window_loss = 0;
  int64_t window_samples = 0, start_step = 0;
  const nlohmann::json fingerprint = run_fingerprint(opt, B);
  if (!resume_dir.empty()) {
    const nlohmann::json st = load_training_checkpoint(resume_dir, model, *optimizer);
    const nlohmann::json& then = st.at("fingerprint");
    for (auto it = fingerprint.begin(); it != fingerprint.end(); ++it)
      ANATOMY_CHECK(then.contains(it.key()) && then[it.key()] == it.value(), "--resume-from-checkpoint ", resume_dir,
                    ": the checkpoint was trained with ", it.key(), " ", then.value(it.key(), nlohmann::json()).dump(),
                    ", this run has ", it.value().dump());
    start_step = st.at("global_step").get<int64_t>();
    loss_sum_all = st.at("loss_sum").get<double>();
    res.samples = st.at("samples").get<int64_t>();
    res.first_loss = st.at("first_step_loss").get<double>();
    res.skipped_steps = st.at("skipped_steps").get<int64_t>();
    window_loss = st.at("window_loss").get<double>();
    window_samples = st.at("window_samples").get<int64_t>();
    scaler.scale = st.at("loss_scale").get<float>();
    scaler.clean = st.at("loss_scale_clean_steps").get<int64_t>();
    std::fprintf(stderr, "anatomy: resumed from %s at step %lld of %lld\n", resume_dir.c_str(),
                 static_cast<long long>(start_step), static_cast<long long>(total_steps));
  }
  res.start_step = start_step;
  const int64_t samples_before = res.samples;

  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  ANATOMY_CHECK(!ec, opt.output_dir, ": cannot create the output directory: ", ec.message());
  fs::remove(fs::path(opt.output_dir) / "train_results.json", ec);  // a run in progress does not look finished
  rotate_checkpoints(opt.output_dir, 0);  // clears the staging leftovers of a killed run; keeps every checkpoint
  const fs::path metrics_path = fs::path(opt.output_dir) / "metrics.jsonl";
  if (start_step > 0) keep_metrics_up_to(metrics_path, start_step);
  std::ofstream metrics(metrics_path, start_step > 0 ? std::ios::app : std::ios::trunc);

  std::fprintf(stderr, "anatomy: training %s (%lld parameters) on %s, %s, batch %lld x %lld accumulation, seq %lld, %lld steps\n"
               "anatomy: data: %s\n",
               opt.model_name_or_path.empty() ? opt.preset.c_str() : opt.model_name_or_path.c_str(),
               static_cast<long long>(model.layout().num_parameters()), be->name().c_str(), precision_name(opt.precision),
               static_cast<long long>(B), static_cast<long long>(accum), static_cast<long long>(T),
               static_cast<long long>(total_steps), data.description.c_str());

  const bool tty = !opt.disable_progress_bar && isatty(STDERR_FILENO);
  std::vector<double> stamps;
  double data_wait = 0;
  int64_t micro = start_step * accum;
  HostBatch hb;
  std::vector<float> host_losses(B);
  UploadStaging staging(*be, B, T);

  // One optimizer step: accumulation over micro-batches, gradient norm, (fp16) overflow
  // check, update. The per-sample losses are summed on the device and read once, after the
  // step. Returns the learning rate it used.
  auto run_step = [&](Prefetcher& source, double& step_loss, int64_t& step_samples) -> float {
    be->set_phase(Phase::Optimizer);  // clearing the gradients is the update's bookkeeping, not data
    // In activation memory, backward clears each gradient range itself, just before writing it.
    if (!model.gradients_in_activations()) model.zero_grads();
    be->fill(d_loss_sums, 0.0f);
    step_samples = 0;
    int64_t widest = 0;
    for (int64_t m = 0; m < accum; ++m, ++micro) {
      double waited = 0;
      ANATOMY_CHECK(source.next(hb, waited), "internal error: the data loader ran dry");
      data_wait += waited;
      const int64_t b = hb.batch, t = hb.seq;
      auto rows = [&](const Buffer& buf) { return buf.tensor().view({B * T}).slice(0, b * t).view({b, t}); };
      DeviceBatch db{rows(d_ids), rows(d_types), rows(d_mask), d_labels.tensor().slice(0, b)};
      be->set_phase(Phase::Data);
      staging.upload(hb, db, micro);
      model.forward_backward(db, scaler.scale / static_cast<float>(b * accum), static_cast<uint64_t>(micro) << 12);
      be->set_phase(Phase::Data);
      const Tensor sums = d_loss_sums.tensor().slice(0, b);
      be->add(sums, sums, model.losses().slice(0, b));
      step_samples += b;
      widest = std::max(widest, b);
    }
    be->set_phase(Phase::Optimizer);
    grad_norm.compute(model.grads());
    // fp16: the update kernels skip themselves when the norm is not finite (an overflow), so the
    // step needs no host synchronization; the scaler learns of it after the step.
    const bool fp16 = opt.precision == Precision::Fp16;
    const float lr = scheduled_lr(opt.lr_scheduler_type, opt.learning_rate, optimizer->steps(), total_steps, opt.warmup(total_steps));
    ParamGroups groups{model.master(), model.shape().compute == DType::F32 ? Tensor() : model.compute_params(),
                       model.grads(), model.layout().decay_end()};
    optimizer->step(groups, GradTransform{grad_norm.norm_sq(), 1.0f / scaler.scale, opt.max_grad_norm, fp16}, lr);
    be->set_phase(Phase::Data);
    be->download(host_losses.data(), d_loss_sums.tensor().slice(0, widest));
    if (fp16) {
      float norm_sq = 0;
      be->download(&norm_sq, grad_norm.norm_sq());
      if (!scaler.update(!std::isfinite(norm_sq))) {
        ++res.skipped_steps;
        optimizer->set_steps(optimizer->steps() - 1);  // the update did not happen
      }
    }
    step_loss = 0;
    for (int64_t i = 0; i < widest; ++i) step_loss += host_losses[i];
    return lr;
  };

  // Evaluation on the validation data, logged to metrics.jsonl.
  auto run_eval = [&](int64_t step) {
    EvalOptions eo;
    eo.batch_size = std::min(opt.per_device_eval_batch_size, B);
    eo.lengths = data.validation_lengths;
    eo.keep_probabilities = false;
    const EvalResult ev = evaluate(model, *data.validation, eo);
    res.eval_loss = ev.loss;
    res.eval_accuracy = ev.accuracy;
    res.eval_macro_f1 = ev.macro_f1;
    nlohmann::json j = eval_metrics_json(ev);
    j["step"] = step;
    metrics << j.dump() << "\n" << std::flush;
    std::fprintf(stderr, "%s{'eval_loss': %.4f, 'eval_accuracy': %.4f, 'eval_macro_f1': %.4f, 'step': %lld}\n",
                 tty ? "\r\033[K" : "", ev.loss, ev.accuracy, ev.macro_f1, static_cast<long long>(step));
  };

  // A checkpoint of everything the next step depends on.
  auto save_checkpoint = [&](int64_t step) {
    const nlohmann::json st = {{"global_step", step},
                               {"epoch", static_cast<double>(micro) / static_cast<double>(micro_per_epoch)},
                               {"micro_batches", micro},
                               {"data", {{"seed", opt.seed}, {"epoch", micro / micro_per_epoch},
                                         {"batch_in_epoch", micro % micro_per_epoch}}},
                               {"rng", {{"dropout_seed", opt.seed}, {"dropout_counter", micro}}},
                               {"loss_sum", loss_sum_all},
                               {"samples", res.samples},
                               {"first_step_loss", res.first_loss},
                               {"skipped_steps", res.skipped_steps},
                               {"window_loss", window_loss},
                               {"window_samples", window_samples},
                               {"loss_scale", scaler.scale},
                               {"loss_scale_clean_steps", scaler.clean},
                               {"fingerprint", fingerprint}};
    res.last_checkpoint = save_training_checkpoint(opt.output_dir, step, model, *optimizer, st);
    rotate_checkpoints(opt.output_dir, opt.save_total_limit);
  };
  auto epoch_ends_at = [&](int64_t step) {  // does optimizer step `step` (1-based) finish an epoch?
    return (step * accum) / micro_per_epoch > ((step - 1) * accum) / micro_per_epoch;
  };
  const int64_t eval_every = opt.eval_steps > 0 ? opt.eval_steps : std::max<int64_t>(1, opt.logging_steps);

  StopSignals stop;
  Prefetcher loader(*data.train, plan, start_step * accum, total_steps * accum, opt.prefetch);
  NvmlSampler sampler(nvml, (fs::path(opt.output_dir) / "nvml.jsonl").string(), 0.2);
  if (want_cuda) sampler.start();
  if (want_cuda) {
    be->synchronize();
    res.nvml_after_setup_mb = nvml_used() >> 20;
    if (opt.trace_memory_growth) prof.probe_memory(nvml_used);
  }
  const auto t0 = Clock::now();
  int64_t last_eval = -1, last_save = start_step;
  for (int64_t step = start_step; step < total_steps; ++step) {
    double step_loss = 0;
    int64_t step_samples = 0;
    const float lr = run_step(loader, step_loss, step_samples);
    be->synchronize();
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    stamps.push_back(now);
    if (want_cuda && step == start_step) {
      res.nvml_after_first_step_mb = nvml_used() >> 20;
      prof.probe_memory({});
      for (const auto& g : prof.memory_growth())
        res.memory_growth.emplace_back(str_cat(phase_name(g.phase), " ", g.op), g.bytes);
    }
    const double mean_loss = step_loss / std::max<int64_t>(1, step_samples);
    if (step == 0) res.first_loss = mean_loss;
    res.last_loss = mean_loss;
    loss_sum_all += step_loss;
    res.samples += step_samples;
    window_loss += step_loss;
    window_samples += step_samples;
    const int64_t done = step + 1, done_here = done - start_step;
    const bool log_now = opt.logging_steps > 0 && (done % opt.logging_steps == 0 || done == total_steps);
    if (log_now || tty) {
      const double sps = static_cast<double>(done_here) * static_cast<double>(B * accum) / std::max(now, 1e-9);
      const double eta = static_cast<double>(total_steps - done) * now / static_cast<double>(done_here);
      if (log_now) {
        nlohmann::json j = {{"step", done}, {"loss", window_loss / std::max<int64_t>(1, window_samples)},
                            {"learning_rate", lr}, {"samples_per_second", sps}, {"elapsed_s", now},
                            {"data_wait_s", data_wait}, {"loss_scale", scaler.scale}};
        if (auto mem = nvml.memory(0)) j["gpu_memory_used_mb"] = mem->used >> 20;
        metrics << j.dump() << "\n" << std::flush;
        std::fprintf(stderr, "%s{'loss': %.4f, 'learning_rate': %.3g, 'samples_per_second': %.2f, 'step': %lld/%lld, 'eta': '%s'}\n",
                     tty ? "\r\033[K" : "", window_loss / std::max<int64_t>(1, window_samples), lr, sps,
                     static_cast<long long>(done), static_cast<long long>(total_steps), fmt_duration(eta).c_str());
        window_loss = 0;
        window_samples = 0;
      }
      if (tty) {
        const int width = 30, filled = static_cast<int>(width * done / total_steps);
        std::fprintf(stderr, "\r%3d%%|%s%s| %lld/%lld [%s<%s, %.2f samples/s]", static_cast<int>(100 * done / total_steps),
                     std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(),
                     static_cast<long long>(done), static_cast<long long>(total_steps), fmt_duration(now).c_str(),
                     fmt_duration(eta).c_str(), sps);
      }
    }
    if ((opt.eval_strategy == "steps" && done % eval_every == 0) || (opt.eval_strategy == "epoch" && epoch_ends_at(done))) {
      run_eval(done);
      last_eval = done;
    }
    if ((opt.checkpoint_strategy == "steps" && done % opt.save_steps == 0) ||
        (opt.checkpoint_strategy == "epoch" && epoch_ends_at(done))) {
      save_checkpoint(done);
      last_save = done;
    }
    if (const int sig = stop.pending(); sig != 0 && done < total_steps) {
      if (last_save != done) save_checkpoint(done);
      std::fprintf(stderr, "%sanatomy: stopped by %s after step %lld of %lld; checkpoint: %s\nresume with: %s --resume-from-checkpoint latest\n",
                   tty ? "\n" : "", sig == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(done),
                   static_cast<long long>(total_steps), res.last_checkpoint.c_str(),
                   opt.command_line.empty() ? "anatomy train ..." : opt.command_line.c_str());
      res.interrupted = true;
      res.steps = done;
      return res;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  be->synchronize();
  res.train_runtime = std::chrono::duration<double>(Clock::now() - t0).count();
  if (opt.eval_strategy != "no" && last_eval != total_steps && total_steps > start_step) run_eval(total_steps);
  res.steps = total_steps;
  res.final_loss_scale = scaler.scale;
  const int64_t steps_here = total_steps - start_step;
  res.train_samples_per_second = static_cast<double>(res.samples - samples_before) / std::max(res.train_runtime, 1e-9);
  res.train_steps_per_second = static_cast<double>(steps_here) / std::max(res.train_runtime, 1e-9);
  res.train_loss = loss_sum_all / static_cast<double>(std::max<int64_t>(1, res.samples));
  const size_t half = stamps.size() / 2;
  if (stamps.size() > 3) {
    const int64_t per_step = B * accum;
    res.steady_samples_per_second = static_cast<double>((stamps.size() - 1 - half) * per_step) / (stamps.back() - stamps[half]);
  } else {
    res.steady_samples_per_second = res.train_samples_per_second;
  }
  res.data_wait_s = data_wait;
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

  // The model (before --profile-steps, whose extra steps change the weights), with its tokenizer.
  if (opt.save_model) {
    save_pretrained(opt.output_dir, model);
    for (const std::string& f : data.tokenizer_files) {
      const fs::path to = fs::path(opt.output_dir) / fs::path(f).filename();
      if (fs::exists(to) && fs::equivalent(to, f)) continue;
      std::ifstream in(f, std::ios::binary);
      write_file_atomic(to.string(), std::string(std::istreambuf_iterator<char>(in), {}));
    }
  }

  // --profile-steps: extra steps, outside the timed ones, with every op between timing marks.
  if (opt.profile_steps > 0) {
    Prefetcher source(*data.train, plan, 0, opt.profile_steps * accum, opt.prefetch);
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

  write_run_summary(opt, res, mem_plan, cfg, shape, used_before);
  return res;
}

}  // namespace anatomy
