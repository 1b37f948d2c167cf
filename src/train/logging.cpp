#include "train/logging.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace anatomy {

namespace {

std::string fmt_duration(double s) {
  char b[32];
  int h = static_cast<int>(s / 3600), m = static_cast<int>(std::fmod(s, 3600) / 60), sec = static_cast<int>(std::fmod(s, 60));
  if (h) std::snprintf(b, sizeof b, "%d:%02d:%02d", h, m, sec);
  else std::snprintf(b, sizeof b, "%02d:%02d", m, sec);
  return b;
}

std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

}  // namespace

std::string evaluation_line(const TrainOptions& opt, bool has_validation, bool has_test, int64_t micro_batch) {
  if (!has_validation && !has_test) return "";
  std::string when;
  if (has_validation) {
    if (opt.eval_strategy == Cadence::Steps)
      when = str_cat("validation data evaluated every ", opt.eval_interval(),
                     " steps and at the end");
    else if (opt.eval_strategy == Cadence::Epoch)
      when = "validation data evaluated every epoch and at the end";
    else if (opt.eval_at_end)
      when = "validation data evaluated at the end, as --do-eval does (no --eval-strategy; --do-eval false turns it off)";
    else
      when = "validation data not evaluated (--do-eval false, no --eval-strategy)";
  }
  if (has_test) when += str_cat(when.empty() ? "" : "; ", "--test-file predicted at the end");
  const int64_t batch = std::min(opt.per_device_eval_batch_size, micro_batch);
  // Note [evaluation batch]: the model's buffers are planned for the training micro-batch, so a
  // larger evaluation batch runs as batches of the micro-batch (same results, more batches).
  return str_cat(when, ", batch ", batch,
                 batch < opt.per_device_eval_batch_size
                     ? str_cat(" (--per-device-eval-batch-size ", opt.per_device_eval_batch_size,
                               " capped at the training micro-batch, which the model's buffers are planned for)")
                     : std::string());
}

TrainLog::TrainLog(const TrainOptions& opt, OutputDir& out, int64_t start_step, int64_t total_steps)
    : m_opt(opt), m_out(out), m_start(start_step), m_total(total_steps), m_tty(!opt.disable_progress_bar && isatty(STDERR_FILENO)) {}

void TrainLog::startup(const StartupInfo& s) {
  std::fprintf(stderr,
               "anatomy: training %s (%lld parameters; %s)\n"
               "anatomy: device: %s, %lld rank(s)%s, %s\n"
               "anatomy: data: %s; %lld training samples, %lld validation samples\n"
               "anatomy: batch %lld per device x %lld rank(s) x %lld accumulation, seq %lld, %lld steps%s\n"
               "anatomy: planned memory per device: %.1f MiB\n",
               s.model.c_str(), static_cast<long long>(s.num_parameters), s.model_source.c_str(), s.device.c_str(),
               static_cast<long long>(s.world_size), s.world_size > 1 ? str_cat(", ZeRO stage ", s.zero_stage).c_str() : "",
               precision_name(m_opt.precision), s.data.c_str(), static_cast<long long>(s.train_samples),
               static_cast<long long>(s.validation_samples), static_cast<long long>(s.micro_batch),
               static_cast<long long>(s.world_size), static_cast<long long>(m_opt.gradient_accumulation_steps),
               static_cast<long long>(m_opt.seq_len), static_cast<long long>(s.total_steps),
               s.start_step > 0 ? str_cat(" (from step ", s.start_step, ")").c_str() : "",
               static_cast<double>(s.planned_bytes) / (1024.0 * 1024.0));
  const std::string ev = evaluation_line(m_opt, s.validation_samples > 0, s.has_test, s.micro_batch);
  if (!ev.empty()) std::fprintf(stderr, "anatomy: evaluation: %s\n", ev.c_str());
  std::fflush(stderr);
}

void TrainLog::step(int64_t done, std::optional<double> loss_of_step, double grad_norm, float lr, double epoch,
                    double elapsed, int64_t samples_here, double data_wait, float loss_scale) {
  if (loss_of_step) {
    window_loss += *loss_of_step;
    ++window_steps;
  }
  // Every --logging-steps, as the Trainer's DefaultFlowCallback: a last partial window is not
  // logged (its steps count in train_loss).
  const bool log_now = (m_opt.logging_steps > 0 && done % m_opt.logging_steps == 0) || (m_opt.logging_first_step && done == 1);
  if (!log_now && !m_tty) return;
  const double sps = static_cast<double>(samples_here) / std::max(elapsed, 1e-9);
  if (log_now) {
    // A window of skipped steps only (--skip-nonfinite-steps) has no loss: NaN (JSON null), not 0.
    const double loss = window_steps > 0 ? window_loss / static_cast<double>(window_steps) : std::nan("");
    nlohmann::json j = {{"loss", loss},
                        {"grad_norm", grad_norm},
                        {"learning_rate", lr},
                        {"epoch", epoch},
                        {"step", done},
                        {"samples_per_second", sps},
                        {"elapsed_s", elapsed},
                        {"data_wait_s", data_wait},
                        {"loss_scale", loss_scale}};
    if (m_opt.report_jsonl) m_out.append_metrics(j.dump());
    history.push_back(j);
    std::fprintf(stderr, "%s{'loss': %.4f, 'grad_norm': %.4g, 'learning_rate': %.3g, 'epoch': %.2f, 'step': %lld/%lld, "
                 "'samples_per_second': %.2f}\n",
                 m_tty ? "\r\033[K" : "", loss, grad_norm, lr, epoch, static_cast<long long>(done),
                 static_cast<long long>(m_total), sps);
    std::fflush(stderr);
    window_loss = 0;
    window_steps = 0;
  }
  if (m_tty) {
    const double eta = elapsed * static_cast<double>(m_total - done) / static_cast<double>(std::max<int64_t>(1, done - m_start));
    const int width = 30, filled = static_cast<int>(width * done / m_total);
    std::fprintf(stderr, "\r%3d%%|%s%s| %lld/%lld [%s<%s, %.2f samples/s]", static_cast<int>(100 * done / m_total),
                 std::string(filled, '#').c_str(), std::string(width - filled, ' ').c_str(), static_cast<long long>(done),
                 static_cast<long long>(m_total), fmt_duration(elapsed).c_str(), fmt_duration(eta).c_str(), sps);
  }
}

void TrainLog::eval(int64_t step, double epoch, const EvalResult& ev) {
  nlohmann::json j = eval_metrics_json(ev);
  j["epoch"] = epoch;  // as the Trainer's log() adds it to every entry
  j["step"] = step;
  if (m_opt.report_jsonl) m_out.append_metrics(j.dump());
  history.push_back(j);
  std::string line;
  for (const std::string& m : metric_names(metric_kind(ev)))
    line += str_cat("'", metric_key(m), "': ", fixed(metric_value(ev, m), 4), ", ");
  std::fprintf(stderr, "%s{%s'epoch': %.2f, 'step': %lld}\n", m_tty ? "\r\033[K" : "", line.c_str(), epoch,
               static_cast<long long>(step));
  std::fflush(stderr);
}

void TrainLog::end_of_bar() const {
  if (m_tty) std::fprintf(stderr, "\n");
}

}  // namespace anatomy
