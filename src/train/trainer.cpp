// The training loop: one loop for every world size (Note [one loop]).
//
// Note [one loop]
// Single-device training is a world of one. Each rank builds its device, model and step
// (train/setup.h, train/step.h), trains on its slice of every global batch (the batch order of
// one process whose micro-batch is the per-device batch times the ranks), and takes every
// decision that must be the same on every rank from a collective: the step's loss and samples,
// the gradient norm (fp16 overflow, non-finite steps), a stop signal. Rank 0 writes the output
// directory: metrics, checkpoints, the model, the summary.
#include "train/trainer.h"

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/read_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/heads.h"
#include "memory/planner.h"
#include "model/params.h"
#include "telemetry/nvml.h"
#include "telemetry/profiler.h"
#include "telemetry/sampler.h"
#include "train/checkpoints.h"
#include "train/eval_ranks.h"
#include "train/logging.h"
#include "train/setup.h"
#include "train/signals.h"
#include "train/step.h"
#include "train/summary.h"
#include "train/train_data.h"

namespace anatomy {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// What must match between a checkpoint and the run resuming it for the continuation to be the
// same run: flag name -> value. The batch is the global one, so a run may resume on another
// number of ranks with the same per-device batch times ranks.
nlohmann::json run_fingerprint(const TrainOptions& o, int64_t global_batch) {
  nlohmann::json fp = {{"--per-device-train-batch-size", global_batch},
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
  if (o.precision == Precision::Fp8) fp["--fp8-format"] = fp8_format_name(o.fp8_grads);
  if (o.optim.kind == OptimizerKind::Sgd) fp["--sgd-momentum"] = o.optim.momentum;
  if (o.masked_lm()) {
    fp["--line-by-line"] = o.line_by_line;  // the samples themselves (Note [grouped texts])
    fp["--validation-split-percentage"] = o.validation_split_percentage;
  }
  return fp;
}

// Fingerprint flags added after checkpoints already existed: the value a checkpoint without the
// flag ran with.
const nlohmann::json& fingerprint_defaults() {
  // SGD's momentum default until 2026-11-29; masked-LM samples were a text each until then, and
  // trained on every row of the file until 2026-11-30.
  static const nlohmann::json d = {{"--fp8-format", "hybrid"}, {"--sgd-momentum", 0.9f}, {"--line-by-line", true},
                                   {"--validation-split-percentage", 0}};
  return d;
}

// The best checkpoint a resumed checkpoint names, as a path that exists: the saving run named it
// by its own spelling of the output directory (relative to another working directory, or since
// moved), so its name is looked up in this run's output directory, then beside the checkpoint
// resumed from (a run resumed into another directory); "" when it names none.
std::string resolve_best_checkpoint(const std::string& named, const std::string& resumed_from, const std::string& output_dir) {
  if (named.empty()) return "";
  const fs::path name = fs::path(named).filename();
  std::error_code ec;
  for (const fs::path& dir : {fs::path(output_dir), fs::path(resumed_from).parent_path()})
    if (fs::is_directory(dir / name, ec)) return (dir / name).string();
  return fs::is_directory(named, ec) ? named : "";
}

// One value per rank, in rank order, on every rank.
std::vector<int64_t> gather_per_rank(Communicator& comm, int64_t mine) {
  std::vector<double> v(static_cast<size_t>(comm.size()), 0.0);
  v[static_cast<size_t>(comm.rank())] = static_cast<double>(mine);
  comm.all_reduce_host(v, Communicator::Op::Sum);
  return std::vector<int64_t>(v.begin(), v.end());
}

}  // namespace

int64_t default_max_seq_length(const BertConfig& cfg) {
  return std::min<int64_t>(is_masked_lm(cfg) || is_token_classification(cfg) ? 1024 : 128, cfg.max_sequence_length());
}

BertConfig model_config(const TrainOptions& opt) {
  BertConfig cfg = opt.model_name_or_path.empty() ? BertConfig::preset(opt.preset)
                                                  : BertConfig::from_json_file(config_path_of(opt.model_name_or_path));
  if (opt.model_name_or_path.empty() && cfg.num_labels != opt.num_labels) cfg.set_num_labels(opt.num_labels);
  cfg.validate(opt.model_name_or_path.empty() ? opt.preset : config_path_of(opt.model_name_or_path));
  ANATOMY_CHECK(opt.seq_len <= cfg.max_sequence_length(), "--max-seq-length ", opt.seq_len,
                " is longer than the model's position table (max_position_embeddings = ", cfg.max_position_embeddings,
                cfg.position_offset() ? str_cat(", of which ", cfg.max_sequence_length(), " follow pad_token_id") : "", ")");
  // What we train and save, whatever head it was saved with.
  cfg.architectures = {opt.masked_lm()              ? masked_lm_class(cfg)
                       : opt.token_classification() ? token_classification_class(cfg)
                                                    : cfg.sequence_classification_class()};
  if (!opt.model_name_or_path.empty()) check_masked_lm_decoder(cfg, config_path_of(opt.model_name_or_path));
  return cfg;
}


namespace {

// What a checkpoint carries besides weights and optimizer state: the run's running totals.
// Note [loss per step]: as the Trainer logs it, a window's loss and train_loss are the mean of
// the steps' losses (each step's the mean of its micro-batches'), not of the samples: a short
// last batch or step weighs as one step. loss_sum sums step losses over loss_steps steps.
struct Progress {
  int64_t micro = 0;  // global micro-batches done
  double loss_sum = 0, first_loss = 0, last_loss = 0;
  int64_t samples = 0, skipped = 0, nonfinite = 0, loss_steps = 0;
};

// One rank's run: set-up, the loop, the end (Note [one loop]).
class RankRun {
 public:
  RankRun(const TrainOptions& opt, Communicator& comm, TrainDevice& dev)
      : m_opt(opt), m_comm(comm), m_dev(dev), m_lead(comm.rank() == 0), m_prof(*dev.backend) {}

  TrainResult run() {
    setup();
    // Note [stopping cleanly] (train/signals.h): held through the end as well, so that a SIGINT
    // or SIGTERM after the last step lets the final save and results finish (at any world size:
    // a launcher forwards the signal to every rank) instead of killing a rank half way.
    StopSignals stop;
    if (loop(stop)) {
      if (m_opt.sigterm_at_end && m_lead) ::raise(SIGTERM);
      finish();
      if (m_lead && stop.pending())
        std::fprintf(stderr, "anatomy: %s arrived after the last step; the run's files were written in full\n",
                     stop.pending() == SIGINT ? "SIGINT" : "SIGTERM");
    }
    return m_res;
  }

 private:
  void setup();
  void resume(const std::string& dir);
  bool loop(const StopSignals& stop);  // false: stopped by a signal, the checkpoint saved
  void finish();
  void evaluate_now(int64_t step);
  void tune_gemms();
  void save_checkpoint(int64_t step);
  nlohmann::json trainer_state(int64_t step, const nlohmann::json& last = nullptr) const;
  void account(int64_t done, const StepOutcome& s, const TrainStep::Launched& l);
  void profile();
  void load_best_model();
  bool epoch_ends_at(int64_t step) const { return m_sched.ends_epoch(step); }  // `step` 1-based
  double epoch_of(int64_t micro) const { return static_cast<double>(micro) / static_cast<double>(m_sched.per_epoch); }
  int64_t per_rank() const { return m_comm.size() > 1 ? m_B : 0; }

  TrainOptions m_opt;  // the run's, its step ratios resolved (TrainOptions::resolve_step_ratios)
  Communicator& m_comm;
  TrainDevice& m_dev;
  const bool m_lead;
  OpProfiler m_prof;  // observes the backend while profiling or probing memory (Note [op observer])
  BertConfig m_cfg;
  std::optional<TrainData> m_data;
  ModelShape m_shape{};
  MemoryPlan m_plan;
  std::unique_ptr<EncoderModel> m_model;
  std::unique_ptr<BatchPlan> m_batches;
  std::unique_ptr<TrainStep> m_step;
  std::unique_ptr<OutputDir> m_out;
  std::unique_ptr<TrainLog> m_log;
  int64_t m_B = 0, m_total_steps = 0, m_start_step = 0, m_last_save = 0;
  MicroBatchSchedule m_sched;  // micro-batches an epoch and a step: Note [accumulation within an epoch] (train/step.h)
  int64_t m_used_weights = -1;
  double m_window_loss = 0, m_data_wait = 0, m_runtime = 0;
  int64_t m_window_steps = 0, m_samples_before = 0;
  // Note [best model] (train/options.h): the last evaluation's metric and the best checkpoint's.
  double m_eval_metric = 0, m_best_metric = 0;
  int64_t m_eval_step = -1;
  bool m_best_loaded = false;  // load_best_model() replaced the last step's weights
  std::string m_best_ckpt;
  double m_now = 0;                     // seconds from the loop's start to the last step's end
  std::vector<double> m_train_stamps;   // each step's end, less the evaluations and checkpoints before it
  std::vector<double> m_step_ends_s;    // each step's end on the NVML sampler's clock (sampler_now_s)
  nlohmann::json m_fingerprint;
  std::vector<nlohmann::json> m_history;  // a resumed checkpoint's log_history (trainer_state.json), for m_log
  Progress m_p;
  TrainResult m_res;
};

void RankRun::setup() {
  m_opt.validate();
  check_output_dir(m_opt);
  m_cfg = model_config(m_opt);
  // Rank 0 loads first, so that a token cache is built once and the other ranks read it; they
  // wait as long as its tokenizing takes (wait_for_all: not bounded by ANATOMY_DIST_TIMEOUT).
  if (!m_lead) m_comm.wait_for_all();
  m_data.emplace(load_train_data(m_opt, m_cfg));
  if (m_lead) m_comm.wait_for_all();
  check_ranks_agree(m_opt, static_cast<int64_t>(m_data->train->size()), m_comm);
  for (const std::string& w : m_data->warnings)
    if (m_lead) std::fprintf(stderr, "anatomy: %s\n", w.c_str());
  ANATOMY_CHECK(m_opt.eval_strategy == Cadence::No || m_data->validation, "--eval-strategy ", cadence_name(m_opt.eval_strategy),
                " needs validation data: --validation-file or --validation-split",
                m_opt.validation_split_percentage > 0 ? str_cat(" (", m_data->description, ")") : std::string());
  ANATOMY_CHECK(!m_opt.eval_asked || m_data->validation, "--do-eval needs validation data: ", m_data->description);
  check_metric_for_best_model(m_opt, m_cfg);
  std::string resume_dir;
  if (!m_opt.resume_from_checkpoint.empty()) {
    std::vector<std::string> skipped;
    resume_dir = resolve_resume_path(m_opt.resume_from_checkpoint, m_opt.output_dir, &skipped);
    for (const std::string& s : skipped)
      if (m_lead) std::fprintf(stderr, "anatomy: warning: passing over %s, not a complete checkpoint\n", s.c_str());
  }
  const int N = m_comm.size();
  const int zero = N > 1 ? m_opt.zero_stage : 0;
  if (zero >= 1) Optimizer::range_state_bytes(m_opt.optim.kind, 0);  // refuses, naming --optim, what cannot be sharded

  // The plan before anything is allocated: a run that cannot fit is refused with its levers.
  m_B = choose_micro_batch(m_opt, m_cfg, m_dev, m_comm);
  m_sched.accum = m_opt.gradient_accumulation_steps;
  ANATOMY_CHECK(!m_opt.gemm_tuning || m_dev.cuda,
                "--gemm-tuning measure times cuBLASLt's algorithms: it needs the GPU (this run is on the CPU)");
  const PlanInput plan_in = plan_input(m_opt, m_cfg, m_B, m_dev.cuda ? Device::CUDA : Device::CPU, N, m_comm.rank());
  m_shape = plan_in.shape;
  m_plan = plan_memory(plan_in);
  if ((m_data->validation && (m_opt.eval_strategy != Cadence::No || m_opt.eval_at_end)) || m_data->test)  // evaluate() holds its batch while it runs
    m_plan.bytes[Category::Other] +=
        evaluation_buffer_bytes(std::min(m_opt.per_device_eval_batch_size, m_B), m_shape.max_seq, true);
  check_plan_fits(plan_in, m_plan, m_dev, m_sched.accum);

  m_model = make_model(*m_dev.backend, m_cfg, m_shape);
  load_starting_weights(m_opt, *m_model, m_lead);
  m_dev.backend->synchronize();
  m_used_weights = nvml_used_bytes(m_dev);

  // Global batches of B x N samples in the order one process with that micro-batch takes them.
  m_batches = std::make_unique<BatchPlan>(m_data->batch_plan(m_B * N, m_opt.seed, m_opt.group_by_length));
  m_sched.per_epoch = m_batches->batches_per_epoch();
  m_total_steps = m_opt.total_steps(m_sched.steps_per_epoch());
  m_opt.resolve_step_ratios(m_total_steps);
  m_step = std::make_unique<TrainStep>(m_opt, *m_model, *m_dev.backend, m_comm, *m_batches, m_total_steps);
  m_fingerprint = run_fingerprint(m_opt, m_B * N);
  m_res.device = N > 1 ? str_cat(m_dev.backend->name(), " x ", N, " ranks") : m_dev.backend->name();
  if (!resume_dir.empty()) resume(resume_dir);
  if (m_start_step > m_total_steps) {  // as the Trainer does: no step to take; the end (evaluation, saving) still runs
    if (m_lead)
      std::fprintf(stderr, "anatomy: the checkpoint is at step %lld, past this run's %lld steps: nothing to train\n",
                   static_cast<long long>(m_start_step), static_cast<long long>(m_total_steps));
    m_total_steps = m_start_step;
  }
  m_res.start_step = m_last_save = m_start_step;
  m_samples_before = m_p.samples;
  m_out = std::make_unique<OutputDir>(m_opt, m_start_step);
  m_log = std::make_unique<TrainLog>(m_opt, *m_out, m_start_step, m_total_steps);
  m_log->window_loss = m_window_loss;
  m_log->window_steps = m_window_steps;
  m_log->history = std::move(m_history);
}

// Weights, optimizer state (this rank's part of it) and position from a checkpoint; the data
// order and the dropout masks are pure functions of (seed, position), so the position restores them.
void RankRun::resume(const std::string& dir) {
  OptimizerPart part;
  if (m_step->zero_stage() >= 1) part = {true, m_step->shard().begin, m_step->shard().end};
  const nlohmann::json st = load_training_checkpoint(dir, *m_model, m_step->optimizer(), part);
  const nlohmann::json& then = st.at("fingerprint");
  for (auto it = m_fingerprint.begin(); it != m_fingerprint.end(); ++it) {
    const nlohmann::json was = then.contains(it.key()) ? then[it.key()]
                                                       : fingerprint_defaults().value(it.key(), nlohmann::json());
    if (was == it.value()) continue;
    // The batch is the global one: said as such, with this run's per-device batch and ranks.
    if (it.key() == "--per-device-train-batch-size")
      fail("--resume-from-checkpoint ", dir, ": the checkpoint was trained with a global batch of ", was.dump(),
           " (--per-device-train-batch-size x ranks), this run's is ", it.value().dump(), " (", m_B, " x ", m_comm.size(),
           " rank", m_comm.size() > 1 ? "s" : "", ")");
    fail("--resume-from-checkpoint ", dir, ": the checkpoint was trained with ", it.key(), " ", was.dump(), ", this run has ",
         it.value().dump());
  }
  m_start_step = st.at("global_step").get<int64_t>();
  m_p.micro = m_sched.first_of_step(m_start_step);  // an older schedule is refused below
  m_p.loss_sum = st.at("loss_sum").get<double>();
  m_p.samples = st.at("samples").get<int64_t>();
  m_p.loss_steps = st.value("loss_steps", int64_t{-1});
  m_p.first_loss = st.at("first_step_loss").get<double>();
  m_p.last_loss = st.value("last_step_loss", m_p.last_loss);  // a run resumed at its end trains no step
  m_p.skipped = st.at("skipped_steps").get<int64_t>();
  m_p.nonfinite = st.value("nonfinite_steps", int64_t{0});
  m_window_loss = st.at("window_loss").get<double>();
  m_window_steps = st.at("window_samples").get<int64_t>();  // steps since Note [loss per step]
  if (m_p.loss_steps < 0) {  // written before Note [loss per step] and [accumulation within an epoch]
    // Its steps per epoch were floor(M / A): the same schedule only when A divides M.
    ANATOMY_CHECK(m_sched.per_epoch % m_sched.accum == 0, "--resume-from-checkpoint ", dir, ": an anatomy before "
                  "2026-11-29 wrote it, whose steps carried the accumulation across epochs (", m_sched.per_epoch,
                  " micro-batches an epoch, ", m_sched.accum, " a step); resume it with that version, or start again");
    // Sums over samples, made means of steps: the open window's steps are those since the last log.
    m_p.loss_steps = std::max<int64_t>(0, m_start_step - m_p.nonfinite);
    m_p.loss_sum = m_p.loss_sum / static_cast<double>(std::max<int64_t>(1, m_p.samples)) * static_cast<double>(m_p.loss_steps);
    const int64_t open = m_opt.logging_steps > 0 ? m_start_step % m_opt.logging_steps : 0;
    const double mean = m_window_steps > 0 ? m_window_loss / static_cast<double>(m_window_steps) : 0.0;
    m_window_steps = m_window_steps > 0 ? std::max<int64_t>(1, open) : 0;
    m_window_loss = mean * static_cast<double>(m_window_steps);
  }
  m_step->scaler().scale = st.at("loss_scale").get<float>();
  m_step->scaler().clean = st.at("loss_scale_clean_steps").get<int64_t>();
  // The Trainer's log of the steps before (trainer_state.json; older checkpoints have none), so
  // that the log goes on whether or not metrics.jsonl is there (--report-to none, another directory).
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "trainer_state.json", ec)) {
    const nlohmann::json hf =
        nlohmann::json::parse(read_regular_file((fs::path(dir) / "trainer_state.json").string()), nullptr, false);
    if (hf.is_object() && hf.contains("log_history") && hf["log_history"].is_array())
      for (const nlohmann::json& e : hf["log_history"])
        if (e.is_object() && e.value("step", int64_t{0}) <= m_start_step && !e.contains("train_runtime"))
          m_history.push_back(e);
  }
  m_best_ckpt = resolve_best_checkpoint(st.value("best_model_checkpoint", std::string()), dir, m_opt.output_dir);
  m_best_metric = st.value("best_metric", 0.0);
  if (m_lead)
    std::fprintf(stderr, "anatomy: resumed from %s at step %lld of %lld\n", dir.c_str(), static_cast<long long>(m_start_step),
                 static_cast<long long>(m_total_steps));
}

// Note [gemm tuning] in ops/cuda/matmul.cpp, over the first step's products, with the activation
// arena as scratch: the step is over (its figures were read), so it holds nothing. Each rank
// tunes its own device; the lead prints the summary and writes the table.
void RankRun::tune_gemms() {
  const auto [scratch, bytes] = m_model->activation_memory();
  const std::string report = m_dev.backend->tune_matmuls(scratch, bytes);
  if (!m_lead) return;
  std::fprintf(stderr, "%sanatomy: --gemm-tuning measure: %s", m_log->tty() ? "\n" : "",
               report.substr(0, report.find('\n') + 1).c_str());
  m_out->claim();
  write_file_atomic((fs::path(m_opt.output_dir) / "gemm_tuning.md").string(), report);
}

// A checkpoint of everything the next step depends on (collective: every rank its part).
void RankRun::save_checkpoint(int64_t step) {
  const int64_t micro = m_p.micro;
  if (m_opt.track_best_model && m_eval_step == step && !std::isnan(m_eval_metric) &&
      (m_best_ckpt.empty() || (m_opt.greater_is_better ? m_eval_metric > m_best_metric : m_eval_metric < m_best_metric))) {
    m_best_metric = m_eval_metric;
    m_best_ckpt = (fs::path(m_opt.output_dir) / str_cat("checkpoint-", step)).string();
  }
  const nlohmann::json st = {{"global_step", step},
                             {"epoch", epoch_of(micro)},
                             {"micro_batches", micro},
                             {"data", {{"seed", m_opt.seed}, {"epoch", micro / m_sched.per_epoch},
                                       {"batch_in_epoch", micro % m_sched.per_epoch}}},
                             {"rng", {{"dropout_seed", m_opt.seed}, {"dropout_counter", micro}}},
                             {"loss_sum", m_p.loss_sum},
                             {"samples", m_p.samples},
                             {"loss_steps", m_p.loss_steps},
                             {"first_step_loss", m_p.first_loss},
                             {"last_step_loss", m_p.last_loss},
                             {"skipped_steps", m_p.skipped},
                             {"nonfinite_steps", m_p.nonfinite},
                             {"window_loss", m_log->window_loss},
                             {"window_samples", m_log->window_steps},
                             {"loss_scale", m_step->scaler().scale},
                             {"loss_scale_clean_steps", m_step->scaler().clean},
                             {"world_size", m_comm.size()},
                             {"fingerprint", m_fingerprint},
                             {"best_model_checkpoint", m_best_ckpt},
                             {"best_metric", m_best_metric}};
  if (m_lead) m_out->claim();
  m_step->complete_masters();
  OptimizerPart part;
  if (m_step->zero_stage() >= 1) part = {true, m_step->shard().begin, m_step->shard().end};
  m_res.last_checkpoint =
      save_training_checkpoint(m_opt.output_dir, step, *m_model, m_step->optimizer(), st, m_comm, part, m_data->tokenizer_files,
                               m_lead ? trainer_state(step) : nlohmann::json());
  if (m_lead) rotate_checkpoints(m_opt.output_dir, m_opt.save_total_limit, m_best_ckpt);
  m_last_save = step;
}

void RankRun::evaluate_now(int64_t step) {
  if (m_opt.evaluation_pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(m_opt.evaluation_pause_s));
  const EvalResult ev = evaluate_over_ranks(*m_model, *m_data->validation, m_data->validation_lengths,
                                            std::min(m_opt.per_device_eval_batch_size, m_B), m_comm);
  m_res.eval_metrics.clear();
  for (const std::string& name : metric_names(metric_kind(ev))) m_res.eval_metrics.emplace_back(name, metric_value(ev, name));
  m_res.eval_runtime = ev.runtime;
  m_res.eval_samples = ev.samples;
  m_res.eval_steps = ev.batches;
  m_eval_step = step;
  m_res.problem_type = ev.masked_lm ? "masked_lm" : ev.token_classification ? "token_classification"
                                                                            : problem_type_name(ev.problem);
  // --metric-for-best-model names one of the task's metrics (checked at setup); Pearson's is NaN
  // when the outputs are constant, and a NaN is never taken as the best (save_checkpoint).
  m_eval_metric = m_res.eval(m_opt.metric_for_best_model.substr(std::string("eval_").size()));
  if (m_lead) m_log->eval(step, epoch_of(m_p.micro), ev);
}

// The step's figures into the totals; a non-finite step stops the run (every rank alike: the
// figures are global) or, with --skip-nonfinite-steps, is counted and left out.
void RankRun::account(int64_t done, const StepOutcome& s, const TrainStep::Launched& l) {
  if (s.nonfinite) {
    ANATOMY_CHECK(m_opt.skip_nonfinite_steps, "step ", done, ": the ", s.nonfinite, " is not finite (",
                  s.nonfinite == std::string("loss") ? s.loss_sum : s.grad_norm, "); the run stops here, keeping ",
                  m_last_save > 0 ? str_cat("the checkpoint of step ", m_last_save) : std::string("no checkpoint"),
                  " (--skip-nonfinite-steps skips such steps instead)");
    ++m_p.skipped;
    ++m_p.nonfinite;
    if (m_lead)
      std::fprintf(stderr, "%sanatomy: step %lld: the %s is not finite; the step is skipped (%lld so far)\n",
                   m_log->tty() ? "\r\033[K" : "", static_cast<long long>(done), s.nonfinite,
                   static_cast<long long>(m_p.nonfinite));
  }
  if (s.overflow) ++m_p.skipped;
  const bool counted = s.nonfinite == nullptr;
  const double mean = s.loss_sum / static_cast<double>(std::max<int64_t>(1, s.samples));
  if (counted) {
    if (done == 1) m_p.first_loss = mean;
    m_p.last_loss = mean;
    m_p.loss_sum += mean;  // Note [loss per step]
    ++m_p.loss_steps;
    m_p.samples += s.samples;
  }
  if (m_lead) {
    m_log->step(done, counted ? std::optional<double>(mean) : std::nullopt, s.grad_norm, s.lr, epoch_of(l.micro_end), m_now,
                (m_sched.first_of_step(done) - m_sched.first_of_step(m_start_step)) * m_B * m_comm.size(), l.data_wait_end,
                m_step->scaler().scale);
  }
}

bool RankRun::loop(const StopSignals& stop) {
  Prefetcher loader(*m_data->train, *m_batches, m_sched.first_of_step(m_start_step), m_sched.first_of_step(m_total_steps), m_opt.prefetch,
                    m_comm.rank(), per_rank());
  NvmlSampler sampler(process_nvml(), (fs::path(m_opt.output_dir) / "nvml.jsonl").string(), 0.1, m_dev.nvml_index);
  auto used = [&] { return nvml_used_bytes(m_dev); };
  if (m_lead) {
    StartupInfo si;
    si.model = m_opt.model_name_or_path.empty() ? m_opt.preset
               : m_opt.model_name.empty()         ? m_opt.model_name_or_path
                                                  : m_opt.model_name;
    si.model_source = random_init_notice(m_opt).empty() ? "pretrained weights from " + m_opt.model_name_or_path
                                                        : "randomly initialized";
    si.device = m_dev.backend->name();
    si.data = m_data->description;
    si.num_parameters = static_cast<int64_t>(m_model->layout().num_parameters());
    si.train_samples = static_cast<int64_t>(m_data->train->size());
    si.validation_samples = m_data->validation ? static_cast<int64_t>(m_data->validation->size()) : 0;
    si.total_steps = m_total_steps;
    si.start_step = m_start_step;
    si.micro_batch = m_B;
    si.world_size = m_comm.size();
    si.zero_stage = m_step->zero_stage();
    si.planned_bytes = m_plan.total();
    si.has_test = m_data->test != nullptr;
    m_log->startup(si);
    m_out->claim();  // before the first step: an output directory that cannot be written ends the run now
    if (m_dev.cuda) sampler.start();
  }
  if (m_dev.cuda) {
    m_dev.backend->synchronize();
    m_res.nvml_after_setup_mb = used() >> 20;
    if (m_opt.trace_memory_growth) m_prof.probe_memory(used);
  }
  const int64_t eval_every = m_opt.eval_interval();
  const auto t0 = Clock::now();
  // Note [the last step ends an epoch]: as the Trainer, the run's last step ends its (maybe
  // partial) epoch, evaluated and saved under the epoch strategies; under the steps strategy it is
  // saved (DefaultFlowCallback's should_save at max_steps), so that the best checkpoint and a
  // resume can be the last step's.
  auto evaluates_at = [&](int64_t done) {
    return (m_opt.eval_strategy == Cadence::Steps && done % eval_every == 0) ||
           (m_opt.eval_strategy == Cadence::Epoch && (epoch_ends_at(done) || done == m_total_steps));
  };
  auto saves_at = [&](int64_t done) {
    return (m_opt.checkpoint_strategy == Cadence::Steps && (done % m_opt.save_steps == 0 || done == m_total_steps)) ||
           (m_opt.checkpoint_strategy == Cadence::Epoch && (epoch_ends_at(done) || done == m_total_steps));
  };
  // Note [a step in flight]
  // Reading a step's figures waits for its device work; with nothing queued behind it, the GPU
  // would then idle while the host packs, uploads and launches the next step (22% of a MiniLM
  // step on real tokens, bench/results/2026-11-26-h200). So on the GPU the next step is launched
  // before this one's figures are read (the CPU computes a step as it launches it), wherever
  // nothing done after this step reads the model or could change the next one: not after the
  // first step (its memory is probed), an evaluation or a checkpoint, nor once a stop was
  // agreed, and only where TrainStep::can_run_ahead. Every input of that decision is global (the
  // schedule and agreed outcomes), so every rank launches the same steps. A stop agreed while a
  // step is in flight ends after that step: the checkpoint then holds the weights of the last
  // step accounted. A non-finite step still stops the run naming its own step; the step launched
  // behind it is left to end, and nothing more is written. Over several GPUs the step's host
  // exchange (all_reduce_host) goes through NCCL on the stream that already holds the next step,
  // so reading step N would wait for step N + 1: there it runs one step at a time, as before
  // (the logic itself is tested at every world size on the CPU, where tests force it on).
  const bool run_ahead = m_step->can_run_ahead() && (m_opt.run_ahead == TrainOptions::RunAhead::On ||
                                                      (m_opt.run_ahead == TrainOptions::RunAhead::Auto && m_dev.cuda &&
                                                       m_comm.size() == 1));
  std::optional<TrainStep::Launched> ahead;
  int stop_signal = 0;
  double paused = 0;  // seconds of evaluations and checkpoints between steps
  const bool last_rank = m_comm.rank() == m_comm.size() - 1;
  auto launch = [&](int64_t step) {  // step: 0-based
    const bool injected = m_opt.sigterm_at_step > 0 && last_rank && step + 1 >= m_opt.sigterm_at_step;
    return m_step->launch(loader, m_p.micro, m_data_wait, injected ? SIGTERM : stop.pending());
  };
  for (int64_t step = m_start_step; step < m_total_steps; ++step) {
    const TrainStep::Launched cur = ahead ? *ahead : launch(step);
    ahead.reset();
    const int64_t done = step + 1;
    if (run_ahead && stop_signal == 0 && done < m_total_steps && step > m_start_step && !evaluates_at(done) &&
        !saves_at(done)) {
      ahead = launch(step + 1);
      ++m_res.steps_launched_ahead;
    }
    const StepOutcome s = m_step->finish(cur);
    m_now = std::chrono::duration<double>(Clock::now() - t0).count();
    m_train_stamps.push_back(m_now - paused);
    m_step_ends_s.push_back(sampler_now_s());
    if (m_dev.cuda && step == m_start_step) {
      m_res.nvml_after_first_step_mb = used() >> 20;
      m_prof.probe_memory({});
      for (const auto& g : m_prof.memory_growth())
        m_res.memory_growth.emplace_back(str_cat(phase_name(g.phase), " ", g.op), g.bytes);
    }
    account(done, s, cur);
    const auto between = Clock::now();
    if (m_opt.gemm_tuning && step == m_start_step) tune_gemms();  // nothing in flight after the first step
    if (evaluates_at(done)) evaluate_now(done);
    if (saves_at(done)) save_checkpoint(done);
    paused += std::chrono::duration<double>(Clock::now() - between).count();
    if (s.stop_signal != 0) stop_signal = s.stop_signal;
    if (stop_signal != 0 && done < m_total_steps && !ahead) {
      if (m_last_save != done) save_checkpoint(done);
      if (m_lead)
        std::fprintf(stderr, "%sanatomy: stopped by %s after step %lld of %lld; checkpoint: %s\nresume with: %s "
                     "--resume-from-checkpoint latest\n",
                     m_log->tty() ? "\n" : "", stop_signal == SIGINT ? "SIGINT" : "SIGTERM",
                     static_cast<long long>(done), static_cast<long long>(m_total_steps), m_res.last_checkpoint.c_str(),
                     m_opt.command_line.empty() ? "anatomy train ..." : m_opt.command_line.c_str());
      m_res.interrupted = true;
      m_res.steps = done;
      m_res.skipped_steps = m_p.skipped;
      m_res.nonfinite_steps = m_p.nonfinite;
      return false;
    }
  }
  if (m_lead) m_log->end_of_bar();
  m_dev.backend->synchronize();
  m_runtime = std::chrono::duration<double>(Clock::now() - t0).count();
  if (m_opt.track_best_model) load_best_model();  // evaluated in finish(), once saved
  sampler.stop();
  // The clock and power of the steps steady samples/s counts (Note [clock and power]).
  if (m_step_ends_s.size() > 3)
    m_res.gpu_clocks = summarize_clocks(sampler.clock_samples(), m_step_ends_s[m_step_ends_s.size() / 2], m_step_ends_s.back());
  return true;
}

void RankRun::finish() {
  TrainResult& res = m_res;
  const int N = m_comm.size();
  // Note [saved before the final evaluation]: the model (before --profile-steps, whose extra
  // steps change the weights), with its tokenizer, then the evaluation of the run's end (the
  // Trainer's do_eval, whatever the strategy did before; the best model's when it was loaded),
  // as run_glue.py saves before it evaluates: an evaluation that fails (a rank lost, memory short
  // for the evaluation batch) leaves the trained model saved.
  if (m_lead) m_out->replace_previous_results();  // Note [overwriting a run]
  if (m_opt.save_model) m_step->complete_masters();  // every rank: a collective
  if (m_lead && m_opt.save_model) {
    m_out->claim();
    save_pretrained(m_opt.output_dir, *m_model);
    save_tokenizer_into(m_opt.output_dir, m_data->tokenizer_files);
  }
  if (m_opt.save_model) m_comm.wait_for_all();  // as long as rank 0's writing takes
  if (m_data->validation && (m_opt.eval_strategy != Cadence::No || m_opt.eval_at_end) &&
      (m_eval_step != m_total_steps || m_best_loaded))
    evaluate_now(m_total_steps);
  res.steps = m_total_steps;
  res.samples = m_p.samples;
  res.train_dataset_samples = static_cast<int64_t>(m_data->train->size());
  res.skipped_steps = m_p.skipped;
  res.nonfinite_steps = m_p.nonfinite;
  res.first_loss = m_p.first_loss;
  res.last_loss = m_p.last_loss;
  res.final_loss_scale = m_step->scaler().scale;
  res.epoch = epoch_of(m_p.micro);
  res.train_runtime = m_runtime;
  const int64_t steps_here = m_total_steps - m_start_step;
  res.train_samples_per_second = static_cast<double>(res.samples - m_samples_before) / std::max(m_runtime, 1e-9);
  res.train_steps_per_second = static_cast<double>(steps_here) / std::max(m_runtime, 1e-9);
  res.train_loss = m_p.loss_sum / static_cast<double>(std::max<int64_t>(1, m_p.loss_steps));  // Note [loss per step]
  const std::vector<double>& t = m_train_stamps;
  const size_t half = t.size() / 2;
  const int64_t per_step = m_B * N * (m_sched.first_of_step(m_total_steps) - m_sched.first_of_step(m_start_step)) /
                           std::max<int64_t>(1, steps_here);  // a short step at an epoch's end: the mean
  res.steady_samples_per_second =
      t.size() > 3 ? static_cast<double>((t.size() - 1 - half) * per_step) / (t.back() - t[half]) : res.train_samples_per_second;
  res.data_wait_s = m_data_wait;
  res.num_parameters = static_cast<int64_t>(m_model->layout().num_parameters());
  res.peak_bytes = m_dev.backend->allocator().stats().peak();
  res.weights_mb = res.peak_bytes[Category::Weights] >> 20;
  res.process_peak_rss_mb = static_cast<int64_t>(process_peak_rss_bytes() >> 20);
  res.world_size = N;
  res.zero_stage = m_step->zero_stage();
  res.rank_optimizer_state_bytes = gather_per_rank(m_comm, res.peak_bytes[Category::OptimizerState]);
  res.reduction_buckets = m_step->reduction_buckets();
  res.rank_gradient_bytes = gather_per_rank(m_comm, res.peak_bytes[Category::Gradients]);
  res.rank_peak_bytes = gather_per_rank(m_comm, res.peak_bytes.total());
  res.rank_planned_bytes = gather_per_rank(m_comm, m_plan.total());
  if (m_dev.cuda && m_dev.used_before >= 0) {
    res.gpu_memory_occupied_mb = nvml_used_bytes(m_dev) >> 20;
    res.cuda_context_mb = (m_dev.used_context - m_dev.used_before) >> 20;
    res.model_nvml_mb = (m_used_weights - m_dev.used_context) >> 20;
    if (N > 1) res.gpu_memory_per_rank_mb = gather_per_rank(m_comm, res.gpu_memory_occupied_mb);
  }

  if (m_lead && m_data->test) {
    m_out->claim();  // with --save-strategy no, nothing has made the directory yet
    res.predict_samples = predict_into(m_opt, *m_model, *m_data->test, std::min(m_opt.per_device_eval_batch_size, m_B), m_cfg);
  }
  // Every rank is still there before the run is marked finished (train_results.json): a rank
  // lost while rank 0 predicted alone ends the job here, its directory not looking finished.
  // The others wait as long as the prediction takes (a CPU prediction past ANATOMY_DIST_TIMEOUT
  // failed the run), before the collectives of the profiled steps.
  m_comm.wait_for_all();
  if (m_opt.profile_steps > 0) profile();
  if (m_lead) {
    m_out->claim();
    // trainer_state.json beside the model, as run_glue.py's trainer.save_state() leaves it,
    // its log ending with the run's totals.
    const nlohmann::json last = {{"epoch", res.epoch},
                                 {"step", m_total_steps},
                                 {"total_flos", 0.0},
                                 {"train_loss", res.train_loss},
                                 {"train_runtime", speed_metric(res.train_runtime, 4)},
                                 {"train_samples_per_second", speed_metric(res.train_samples_per_second, 3)},
                                 {"train_steps_per_second", speed_metric(res.train_steps_per_second, 3)}};
    write_file_atomic((fs::path(m_opt.output_dir) / "trainer_state.json").string(),
                      trainer_state(m_total_steps, last).dump(2) + "\n");
    write_run_summary(m_opt, res, m_plan, m_cfg, m_shape, m_dev.used_before);
  }
  m_comm.barrier();  // the run's files are written when any rank returns
}

// Note [two state files] (train/checkpoints.cpp): the Trainer's TrainerState, field for field as
// transformers 5 declares it, for the tools that read trainer_state.json (its log_history above
// all); `last`: the run's final log entry. total_flos is not counted (0).
nlohmann::json RankRun::trainer_state(int64_t step, const nlohmann::json& last) const {
  std::vector<nlohmann::json> history = m_log->history;
  if (!last.is_null()) history.push_back(last);
  const std::string best = m_best_ckpt.empty() ? "" : fs::path(m_best_ckpt).filename().string();
  const nlohmann::json none;
  const int64_t per_epoch = m_sched.steps_per_epoch();
  const std::optional<int64_t> best_step = best.empty() ? std::nullopt : checkpoint_step_of(best);
  return {{"best_global_step", best_step ? nlohmann::json(*best_step) : none},
          {"best_metric", best.empty() ? none : nlohmann::json(m_best_metric)},
          {"best_model_checkpoint", best.empty() ? none : nlohmann::json(m_best_ckpt)},
          {"epoch", epoch_of(m_sched.first_of_step(step))},
          {"eval_steps", m_opt.eval_interval()},
          {"global_step", step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", history},
          {"logging_steps", m_opt.logging_steps},
          {"max_steps", m_total_steps},
          {"num_input_tokens_seen", 0},
          {"num_train_epochs", (m_total_steps + per_epoch - 1) / per_epoch},
          {"save_steps", m_opt.save_steps},
          {"stateful_callbacks", nlohmann::json::object()},
          {"total_flos", 0.0},
          {"train_batch_size", m_B},
          {"trial_name", none},
          {"trial_params", none}};
}

// Note [best model]: the best checkpoint is the run's result's; with --load-best-model-at-end its
// weights become the model (every rank: the weights are replicated), and the validation data is
// evaluated on them, as the Trainer's evaluate() after train() does.
void RankRun::load_best_model() {
  if (m_best_ckpt.empty()) return;
  m_res.best_model_checkpoint = m_best_ckpt;
  m_res.best_metric = m_best_metric;
  if (!m_opt.load_best_model_at_end || m_best_ckpt == (fs::path(m_opt.output_dir) / str_cat("checkpoint-", m_total_steps)).string()) return;
  load_pretrained_weights(m_best_ckpt, *m_model);
  if (m_lead)
    std::fprintf(stderr, "anatomy: loading the best model, %s (%s %.6g), as --load-best-model-at-end says\n",
                 m_best_ckpt.c_str(), m_opt.metric_for_best_model.c_str(), m_best_metric);
  m_best_loaded = true;
}

// --profile-steps: extra steps, outside the timed ones, with every op between timing marks.
void RankRun::profile() {
  Prefetcher source(*m_data->train, *m_batches, 0, m_sched.first_of_step(m_opt.profile_steps), m_opt.prefetch, m_comm.rank(),
                    per_rank());
  m_prof.enable(true);
  m_step->time_reduction(m_comm.size() > 1);
  int64_t micro = 0;
  double waited = 0;
  for (int64_t k = 0; k < m_opt.profile_steps; ++k) {
    m_prof.step_begin();
    m_step->run(source, micro, waited, 0);
    m_prof.step_end();
  }
  ProfileSummary ps = m_prof.summarize();
  m_prof.enable(false);
  const DataParallelStep::ReductionTiming rt = m_step->take_reduction_timing();
  m_step->time_reduction(false);
  const double steps = static_cast<double>(m_opt.profile_steps);
  ps.ranks = m_comm.size();
  ps.reduce_buckets = static_cast<double>(rt.buckets) / steps;
  ps.reduce_ms = rt.reduce_ms / steps, ps.reduce_exposed_ms = rt.exposed_ms / steps;
  if (!m_lead) return;
  // The clocks of the profiled steps and of the ceilings (none on the CPU).
  const Nvml& nvml = process_nvml();
  const std::optional<GpuClocks> at_steps = m_dev.cuda ? nvml.clocks(m_dev.nvml_index) : std::nullopt;
  Ceilings ceil = measure_ceilings(*m_dev.backend);
  const std::optional<GpuClocks> at_ceilings = m_dev.cuda ? nvml.clocks(m_dev.nvml_index) : std::nullopt;
  if (at_steps && at_ceilings) {
    ps.steps_sm_mhz = at_steps->sm_mhz;
    ps.max_sm_mhz = at_steps->max_sm_mhz;
    ceil.sm_mhz = at_ceilings->sm_mhz;
  }
  write_profile((fs::path(m_opt.output_dir) / "profile.json").string(), ps, ceil);
  print_profile(ps, ceil);
}

}  // namespace

TrainResult train(const TrainOptions& opt, Communicator& comm, TrainDevice& device) {
  try {
    return RankRun(opt, comm, device).run();
  } catch (...) {
    comm.abort();  // the other ranks throw at their next collective instead of waiting for this one
    throw;
  }
}

}  // namespace anatomy
