#include "train/setup.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <thread>
#include <vector>

#include "data/csv.h"
#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "model/heads.h"
#include "optim/optimizer.h"
#include "train/checkpoints.h"
#include "train/evaluate.h"

namespace anatomy {

namespace fs = std::filesystem;

TrainDevice make_train_device(const TrainOptions& opt, int local_rank, int local_world) {
  TrainDevice d;
  d.cuda = opt.device == DeviceChoice::Cuda || (opt.device == DeviceChoice::Auto && cuda_available());
  d.index = local_rank;
  if (d.cuda) {
    ANATOMY_CHECK(cuda_device_count() > local_rank, "--nproc-per-node ", local_world, ": this machine has ",
                  cuda_device_count(), " CUDA device(s) (one rank per device; --device cpu runs ranks on the CPU)");
    d.nvml_index = nvml_index_of(local_rank);
    d.used_before = nvml_used_bytes(d);
    d.backend = make_cuda_backend(local_rank);
    d.used_context = nvml_used_bytes(d);
  } else {
    const int all = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    d.backend = make_cpu_backend(local_world > 1 ? std::max(1, all / local_world) : opt.threads);
  }
  if (opt.precision == Precision::Tf32) d.backend->set_allow_tf32(true);
  return d;
}

int64_t nvml_used_bytes(const TrainDevice& dev) {
  if (!dev.cuda) return -1;
  auto m = process_nvml().memory(dev.nvml_index);
  return m ? static_cast<int64_t>(m->used) : -1;
}

unsigned nvml_index_of(int cuda_device) {
  return process_nvml().index_of_pci_bus(cuda_pci_bus_id(cuda_device)).value_or(static_cast<unsigned>(std::max(0, cuda_device)));
}

namespace {

bool is_checkpoint_name(const std::string& name) {
  if (name.rfind("checkpoint-", 0) != 0 || name.size() == 11) return false;
  return std::all_of(name.begin() + 11, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What marks a directory as holding a run, or "" when it holds none.
std::string previous_run_in(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  for (const char* f : {"train_results.json", "model.safetensors"})
    if (fs::exists(dir / f, ec)) return f;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && is_checkpoint_name(e.path().filename().string())) return e.path().filename().string();
  return "";
}

// The temporary files of an atomic write (io/atomic_file.h: <name>.tmp-XXXXXX beside the file)
// that a killed run left behind, for the files a run writes into its output directory only: a
// user's own "notes.tmp-backup" is not ours to remove.
void remove_atomic_leftovers(const fs::path& dir) {
  static const char* const ours[] = {
      "model.safetensors", "config.json", "train_results.json", "eval_results.json", "all_results.json",
      "predict_results.txt", "trainer_state.json", "memory_timeline.json", "metrics.jsonl", "profile.json",
      "gemm_tuning.md", "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json",
      "special_tokens_map.json", "added_tokens.json", "sentencepiece.bpe.model", "spm.model"};
  std::error_code ec;
  std::vector<fs::path> left;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp-");
    std::error_code fe;
    if (at == std::string::npos || name.size() != at + 11 || !e.is_regular_file(fe)) continue;
    if (std::any_of(std::begin(ours), std::end(ours), [&](const char* f) { return name.compare(0, at, f) == 0; }))
      left.push_back(e.path());
  }
  for (const fs::path& p : left) fs::remove(p, ec);
}

}  // namespace

void check_output_dir(const TrainOptions& opt) {
  ANATOMY_CHECK(!opt.output_dir.empty(), "--output-dir: empty (name a directory for the run's files)");
  std::error_code ec;
  if (!opt.model_name_or_path.empty() && fs::exists(opt.output_dir, ec) &&
      fs::equivalent(opt.output_dir, opt.model_name_or_path, ec))
    fail("--output-dir ", opt.output_dir, " is the input model's directory (--model-name-or-path): the run would overwrite "
         "its own starting point; name another directory");
  // --overwrite-output-dir removes the directory's checkpoints: never the run's own input.
  const auto inside_output = [&](const std::string& p) {
    if (p.empty() || !fs::exists(opt.output_dir, ec) || !fs::exists(p, ec)) return false;
    const fs::path out = fs::canonical(opt.output_dir, ec), in = fs::canonical(p, ec);
    const auto [o, i] = std::mismatch(out.begin(), out.end(), in.begin(), in.end());
    return !ec && o == out.end() && i != in.end();
  };
  for (const auto& [flag, path] : {std::pair<const char*, std::string>{"--model-name-or-path", opt.model_name_or_path},
                                   {"--tokenizer", opt.tokenizer}})
    if (opt.overwrite_output_dir && opt.resume_from_checkpoint.empty() && inside_output(path))
      fail(flag, " ", path, " lies inside --output-dir ", opt.output_dir, ", whose checkpoints --overwrite-output-dir "
           "removes: copy it out first, or name another output directory");
  if (!opt.resume_from_checkpoint.empty() || opt.overwrite_output_dir) return;
  const std::string found = previous_run_in(opt.output_dir);
  ANATOMY_CHECK(found.empty(), "--output-dir ", opt.output_dir, " already holds a run (", found,
                "): use --overwrite-output-dir to replace it, or --resume-from-checkpoint latest to continue it");
}

void OutputDir::claim() {
  if (m_claimed) return;
  m_claimed = true;
  const fs::path dir(m_opt.output_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  ANATOMY_CHECK(!ec, m_opt.output_dir, ": cannot create the output directory: ", ec.message());
  fs::remove(dir / "train_results.json", ec);  // a run in progress does not look finished
  if (m_opt.overwrite_output_dir)  // Note [overwriting a run]; resumed too: the first attempt may have left them
    for (const char* f : {"model.safetensors", "config.json", "all_results.json", "eval_results.json", "predict_results.txt",
                          "profile.json", "gemm_tuning.md"})
      if (fs::exists(dir / f, ec)) m_previous_files.emplace_back((dir / f).string(), fs::last_write_time(dir / f, ec));
  if (m_opt.overwrite_output_dir && m_opt.resume_from_checkpoint.empty()) {
    std::vector<fs::path> old;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_directory() && is_checkpoint_name(e.path().filename().string())) old.push_back(e.path());
    for (const fs::path& p : old) fs::remove_all(p, ec);
  }
  rotate_checkpoints(m_opt.output_dir, 0);  // clears the staging leftovers of a killed run; keeps every checkpoint
  remove_atomic_leftovers(dir);
  const fs::path metrics = dir / "metrics.jsonl";
  if (!m_opt.report_jsonl) {  // --report-to none: no metrics.jsonl; the directory is still written to
    const fs::path probe = dir / ".anatomy-write-check";
    const bool ok = static_cast<bool>(std::ofstream(probe));
    const int err = errno;
    fs::remove(probe, ec);
    ANATOMY_CHECK(ok, m_opt.output_dir, ": cannot write in the output directory: ", std::strerror(err));
    return;
  }
  if (m_start_step > 0) {  // the lines up to the checkpoint's step, then the new ones
    std::ifstream in(metrics);
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) <= m_start_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        break;  // a line cut short by a kill: nothing after it was written
      }
    }
    write_file_atomic(metrics.string(), kept);
  }
  m_metrics = std::make_unique<std::ofstream>(metrics, m_start_step > 0 ? std::ios::app : std::ios::trunc);
  ANATOMY_CHECK(*m_metrics, metrics.string(), ": cannot be written: ", std::strerror(errno));
}

// Note [overwriting a run]
// --overwrite-output-dir replaces a previous run, its model and results not before this run
// writes its own at the end, so a run that fails early (a non-finite loss, a full disk, a kill)
// leaves the previous one's model usable. Its train_results.json goes at once (the directory does
// not look finished while a run is in progress), its metrics.jsonl is this run's from the first
// line, and its checkpoints go at once too: resuming "latest" after this run was killed would
// take the old run's later step with this run's flags (the fingerprint holds not every flag), and
// the --save-total-limit rotation would count them. The previous results a run does not write
// again (an eval_results.json of a run that evaluated) go with the rest at the end, also when an
// overwriting run was stopped and resumed (with the flag, as its resume hint says); a file written
// since the claim (gemm_tuning.md at the first step) is this run's and stays. A checkpoint given
// as the run's model or tokenizer is refused up front (check_output_dir), not removed.
void OutputDir::replace_previous_results() {
  claim();
  std::error_code ec;
  for (const auto& [p, when] : m_previous_files)  // unchanged since the claim: not this run's (gemm_tuning.md is)
    if (fs::last_write_time(p, ec) == when && !ec) fs::remove(p, ec);
  m_previous_files.clear();
}

void OutputDir::append_metrics(const std::string& json_line) {
  claim();
  if (!m_metrics) return;
  *m_metrics << json_line << "\n" << std::flush;
  ANATOMY_CHECK(*m_metrics, (fs::path(m_opt.output_dir) / "metrics.jsonl").string(),
                ": write failed (is the disk full?); the run stops rather than lose its log");
}

int64_t choose_micro_batch(const TrainOptions& opt, const BertConfig& cfg, const TrainDevice& dev, Communicator& comm) {
  if (opt.per_device_train_batch_size != TrainOptions::kAutoBatch) return opt.per_device_train_batch_size;
  auto mem = dev.cuda ? process_nvml().memory(dev.nvml_index) : std::nullopt;
  ANATOMY_CHECK(mem.has_value(), "--per-device-train-batch-size auto needs a GPU whose free memory NVML reports");
  double b = static_cast<double>(largest_batch_that_fits(plan_input(opt, cfg, 1, Device::CUDA, comm.size(), comm.rank()),
                                                         static_cast<int64_t>(mem->free), int64_t{256} << 20));
  comm.all_reduce_host(std::span<double>(&b, 1), Communicator::Op::Min);  // every rank runs the same batch
  ANATOMY_CHECK(b > 0, "--per-device-train-batch-size auto: not even a batch of 1 fits in ", mem->free >> 20, " MiB free");
  if (comm.rank() == 0) std::fprintf(stderr, "anatomy: --per-device-train-batch-size auto chose %lld\n", static_cast<long long>(b));
  return static_cast<int64_t>(b);
}

void check_plan_fits(const PlanInput& in, const MemoryPlan& plan, const TrainDevice& dev, int64_t accum) {
  auto mem = dev.cuda ? process_nvml().memory(dev.nvml_index) : std::nullopt;
  if (!mem) return;
  const int64_t free_bytes = static_cast<int64_t>(mem->free), slack = int64_t{256} << 20;
  if (plan.total() + slack <= free_bytes) return;
  std::fprintf(stderr, "Memory plan (does not fit):\n%s", format_plan(plan).c_str());
  refuse_model_beyond(in, plan, free_bytes - slack, str_cat("GPU ", dev.index, " has ", free_bytes >> 20, " MiB free"));
  std::string levers;
  for (const Lever& l : levers_that_fit(in, free_bytes, slack, accum))
    levers += str_cat("; ", l.description, " (", l.total >> 20, " MiB)");
  fail("--per-device-train-batch-size ", in.shape.max_batch, ": the plan needs ", plan.total() >> 20, " MiB but GPU ",
       dev.index, " has ", free_bytes >> 20, " MiB free",
       levers.empty() ? std::string("; no single lever makes it fit") : " -- would fit" + levers);
}

namespace {

// The Hub model with a preset's shape, pretrained: where a user of the preset would start from.
const char* pretrained_counterpart(const std::string& preset) {
  if (preset == "bert-tiny") return "google/bert_uncased_L-2_H-128_A-2";
  if (preset == "bert-mini") return "google/bert_uncased_L-4_H-256_A-4";
  if (preset == "bert-base") return "google-bert/bert-base-uncased";
  if (preset == "roberta-base") return "FacebookAI/roberta-base";
  if (preset == "xlm-roberta-base") return "FacebookAI/xlm-roberta-base";
  if (preset == "distilbert-base") return "distilbert/distilbert-base-uncased";
  if (preset == "electra-small") return "google/electra-small-discriminator";
  if (preset == "electra-base") return "google/electra-base-discriminator";
  if (preset == "modernbert-base") return "answerdotai/ModernBERT-base";
  return "google-bert/bert-large-uncased";
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += str_cat(i ? ", '" : "'", names[i], "'");
  return out + "]";
}

}  // namespace

std::string random_init_notice(const TrainOptions& opt) {
  if (opt.model_name_or_path.empty())
    return str_cat("anatomy: --preset ", opt.preset, " is randomly initialized: the result is not a fine-tuned model; "
                   "to start from pretrained weights pass --model-name-or-path ", pretrained_counterpart(opt.preset),
                   " (or a local model directory)");
  if (!fs::exists(fs::path(opt.model_name_or_path) / "model.safetensors"))
    return str_cat("anatomy: ", opt.model_name_or_path, " has a config.json but no model.safetensors: the model is "
                   "randomly initialized from its config; to start from pretrained weights pass a directory saved with "
                   "save_pretrained(...)");
  return "";
}

void load_starting_weights(const TrainOptions& opt, EncoderModel& model, bool announce) {
  model.set_dropout_seed(opt.seed);
  model.init_weights(opt.seed);
  if (const std::string notice = random_init_notice(opt); !notice.empty()) {
    if (announce) std::fprintf(stderr, "%s\n", notice.c_str());
    return;
  }
  LoadReport rep = load_pretrained_weights(opt.model_name_or_path, model, opt.ignore_mismatched_sizes);
  if (!announce) return;
  const BertConfig& cfg = model.config();  // the class transformers would name for this model and task
  const std::string cls_name = is_masked_lm(cfg)                ? masked_lm_class(cfg)
                               : is_token_classification(cfg)   ? token_classification_class(cfg)
                                                                : cfg.sequence_classification_class();
  const char* cls = cls_name.c_str();
  // In transformers' words, so that a user searching for them finds what they mean.
  if (!rep.newly_initialized.empty())
    std::fprintf(stderr, "Some weights of %s were not initialized from the model checkpoint "
                 "at %s and are newly initialized: %s\nYou should probably TRAIN this model on a down-stream task to be "
                 "able to use it for predictions and inference.\n",
                 cls, opt.model_name_or_path.c_str(), quoted_list(rep.newly_initialized).c_str());
  if (!rep.mismatched.empty()) {
    std::string lines;
    for (const std::string& m : rep.mismatched) lines += "- " + m + "\n";
    std::fprintf(stderr, "Some weights of %s were not initialized from the model checkpoint "
                 "at %s and are newly initialized because the shapes did not match (--ignore-mismatched-sizes):\n%s",
                 cls, opt.model_name_or_path.c_str(), lines.c_str());
  }
  if (!rep.unused.empty())
    std::fprintf(stderr, "note: %zu tensors of %s are not used by %s (e.g. %s)\n", rep.unused.size(),
                 opt.model_name_or_path.c_str(), cls, rep.unused[0].c_str());
  if (const auto small = model.layernorm_weights_below(1e-3f); !small.empty())
    std::fprintf(stderr, "note: %zu LayerNorm weights of %s have elements below 1e-3 in magnitude (e.g. %s); LayerNorm "
                 "backward divides by them, so their gradients are less precise (exactly 0: not exact)\n",
                 small.size(), opt.model_name_or_path.c_str(), small[0].c_str());
}

// A float flag's value as given (5e-05), not as the float widened to a double prints it
// (4.999999873689376e-05): its shortest decimal, read back as a double.
static double as_given(float v) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::strtod(std::string(text, end).c_str(), nullptr);
}

void check_ranks_agree(const TrainOptions& o, int64_t train_rows, Communicator& comm) {
  if (comm.size() == 1) return;
  const nlohmann::json run = {{"--per-device-train-batch-size", o.per_device_train_batch_size},
                              {"--gradient-accumulation-steps", o.gradient_accumulation_steps},
                              {"--seed", o.seed},
                              {"--precision", precision_name(o.precision)},
                              {"--optim", optimizer_name(o.optim.kind)},
                              {"--max-seq-length", o.seq_len},
                              {"--max-steps", o.max_steps},
                              {"--num-train-epochs",
                               o.train_epochs > 0 ? o.train_epochs : static_cast<double>(o.num_train_epochs)},
                              {"--learning-rate", as_given(o.learning_rate)},
                              {"--lr-scheduler-type", schedule_name(o.lr_scheduler_type)},
                              {"--warmup-steps", o.warmup_steps},
                              {"--warmup-ratio", o.warmup_ratio},
                              {"--weight-decay", as_given(o.optim.weight_decay)},
                              {"--max-grad-norm", as_given(o.max_grad_norm)},
                              {"--zero-stage", o.zero_stage},
                              {"--ddp-bucket-cap-mb", o.ddp_bucket_cap_mb},
                              {"--gradient-checkpointing", checkpoint_policy_name(o.gradient_checkpointing)},
                              {"--model-name-or-path", o.model_name.empty() ? o.model_name_or_path : o.model_name},
                              {"--ignore-mismatched-sizes", o.ignore_mismatched_sizes},
                              {"--num-labels", o.num_labels_given ? o.num_labels : 0},
                              {"--text-column", column_label(o.text_column) + "," + o.text_pair_column},
                              {"--label-column", o.label_column},
                              {"--preset", o.model_name_or_path.empty() ? o.preset : ""},
                              {"--task", o.task},
                              {"--train-file", o.train_file},
                              {"--dataset", o.train_file.empty() ? o.dataset : ""},
                              {"--num-samples", o.train_file.empty() ? o.num_samples : 0},
                              {"--validation-file", o.validation_file},
                              {"--validation-split", o.validation_split},
                              {"--group-by-length", o.group_by_length},
                              {"--output-dir", o.output_dir},
                              {"--resume-from-checkpoint", o.resume_from_checkpoint},
                              {"--eval-strategy", cadence_name(o.eval_strategy)},
                              {"--do-eval", o.eval_at_end},
                              {"--load-best-model-at-end", o.load_best_model_at_end},
                              {"--metric-for-best-model", o.metric_for_best_model},
                              {"--profile-steps", o.profile_steps},
                              {"--eval-steps", o.eval_ratio > 0 ? o.eval_ratio : static_cast<double>(o.eval_steps)},
                              {"--save-strategy",  // as the flag spells it: final is no checkpoints, a final model
                               o.checkpoint_strategy == Cadence::No
                                   ? std::string(o.save_model ? "final" : "no")
                                   : str_cat(cadence_name(o.checkpoint_strategy), o.save_model ? "" : ", no final model")},
                              {"--save-steps", o.save_ratio > 0 ? o.save_ratio : static_cast<double>(o.save_steps)},
                              {"--skip-nonfinite-steps", o.skip_nonfinite_steps},
                              {"the training data's rows", train_rows}};
  // 32 bits of each value's hash: exact in a double, the same on every rank of one binary.
  std::vector<double> lo, hi;
  for (const auto& [flag, value] : run.items())
    lo.push_back(static_cast<double>(std::hash<std::string>{}(value.dump()) & 0xffffffffu));
  hi = lo;
  comm.all_reduce_host(lo, Communicator::Op::Min);
  comm.all_reduce_host(hi, Communicator::Op::Max);
  std::string differ;
  size_t i = 0;
  for (const auto& [flag, value] : run.items()) {
    if (lo[i] != hi[i])
      differ += str_cat(differ.empty() ? "" : ", ", flag, " (rank ", comm.rank(), ": ", value.dump(), ")");
    ++i;
  }
  ANATOMY_CHECK(differ.empty(), "the ranks were started with different flags: ", differ,
                "; start every rank with the same command");
}

void check_metric_for_best_model(const TrainOptions& opt, const BertConfig& cfg) {
  if (!opt.track_best_model) return;
  const MetricKind kind = metric_kind(cfg);
  std::string names;
  for (const std::string& m : metric_names(kind)) {
    if (m == "perplexity") continue;  // run_mlm.py reports it at the end only, never eval_perplexity
    if (opt.metric_for_best_model == "eval_" + m) return;
    names += (names.empty() ? "" : ", ") + m;
  }
  const char* task = kind == MetricKind::MaskedLm ? "a masked-LM model"
                     : kind == MetricKind::Tokens ? "a token-classification model"
                                                  : nullptr;
  fail("--metric-for-best-model ", opt.metric_for_best_model.substr(5), " is not computed for ",
       task ? task : str_cat("problem_type ", problem_type_name(problem_type_of(cfg))), "; it computes ", names);
}

}  // namespace anatomy
