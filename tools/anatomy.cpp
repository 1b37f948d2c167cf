// The `anatomy` command line: train, eval, plan and report. Flags are read by src/cli/ (one table).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/help.h"
#include "cli/parse.h"
#include "core/error.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "dist/launch.h"
#include "dist/spawn.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/hub.h"
#include "io/read_file.h"
#include "model/config.h"
#include "model/heads.h"
#include "memory/planner.h"
#include "ops/backend.h"
#include "telemetry/nvml.h"
#include "telemetry/report.h"
#include "train/evaluate.h"
#include "train/setup.h"
#include "train/train_data.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {

// ---- `anatomy eval` ------------------------------------------------------------------------------
// A saved model (config.json, model.safetensors, its tokenizer) on a labelled text file: loss,
// accuracy, macro-F1 and per-sample predictions, from an inference-only model (weights in fp32
// plus the compute copy, activations of one layer) with the padding-skipping forward by default.
struct EvalFlags {
  std::string model, eval_file, text_column = "text", text_pair_column, label_column = "label", tokenizer;
  std::string precision = "fp32", output_dir, cache_dir;
  DeviceChoice device = DeviceChoice::Auto;
  bool overwrite_output_dir = false;
  int64_t max_seq_length = -1, batch = 8;  // -1: min(128, the model's max_position_embeddings)
  int threads = 0;
  bool skip_padding = true, sort_by_length = true;
  ColumnsNamed named;  // by the user; else the task script's columns (load_eval_file)
  EvalMasks masks;     // a masked LM's (--seed, --mlm-probability)
};

EvalFlags eval_flags(cli::RunArgs& a) {
  EvalFlags f;
  const TrainOptions& o = a.train;
  f.model = o.model_name_or_path;
  f.eval_file = o.validation_file;
  f.text_column = o.text_column;
  f.text_pair_column = o.text_pair_column;
  f.label_column = o.label_column;
  f.named = {a.text_columns_given(), a.was_given("label-column")};
  f.tokenizer = o.tokenizer;
  f.precision = cli::finish_eval_precision(a);
  f.device = o.device;
  f.output_dir = a.was_given("output-dir") ? o.output_dir : "";
  f.overwrite_output_dir = o.overwrite_output_dir;
  f.cache_dir = o.dataset_cache_dir;
  f.batch = o.per_device_eval_batch_size;
  f.threads = o.threads;
  f.skip_padding = a.skip_padding;
  f.sort_by_length = a.sort_by_length;
  f.masks = {o.seed, o.mlm_probability, o.line_by_line};
  // The shared default: Trainer's examples' 128, capped by the model's position table.
  f.max_seq_length = a.was_given("max-seq-length") ? o.seq_len : -1;
  return f;
}

// Before any work: results never land in the model's own directory (its training run's
// eval_results.json lives there) nor silently replace an earlier evaluation.
void check_eval_output_dir(const EvalFlags& f) {
  namespace fs = std::filesystem;
  if (f.output_dir.empty()) return;
  std::error_code ec;
  ANATOMY_CHECK(!(fs::exists(f.output_dir, ec) && fs::equivalent(f.output_dir, f.model, ec)), "--output-dir ",
                f.output_dir, " is the model's directory (--model-name-or-path): its eval_results.json would be "
                "replaced; name another directory");
  // Before the evaluation, not after it: the nearest existing part of the path is a directory.
  for (fs::path p = f.output_dir; !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      ANATOMY_CHECK(fs::is_directory(p, ec), "--output-dir ", f.output_dir, ": ", p.string(), " is not a directory");
      break;
    }
    if (p == p.parent_path()) break;
  }
  if (f.overwrite_output_dir) return;
  // A training run's directory holds its final evaluation too: say which it is.
  const bool run = fs::exists(fs::path(f.output_dir) / "train_results.json", ec);
  for (const char* name : {"eval_results.json", "predictions.jsonl"})
    ANATOMY_CHECK(!fs::exists(fs::path(f.output_dir) / name, ec), "--output-dir ", f.output_dir, " already holds ",
                  run ? "a training run's evaluation (" : "an evaluation (", name,
                  "): use --overwrite-output-dir to replace it, or name another directory");
}

int run_eval(EvalFlags f) {
  namespace fs = std::filesystem;
  ANATOMY_CHECK(!f.model.empty(), "--model-name-or-path is required (a saved model directory)");
  ANATOMY_CHECK(!f.eval_file.empty(), "--eval-file (or --validation-file) is required (a .jsonl, .csv or .tsv file)");
  ANATOMY_CHECK(fs::is_directory(f.model), "--model-name-or-path ", f.model, ": no such directory");
  const std::string config_file = config_path_of(f.model), weights = (fs::path(f.model) / "model.safetensors").string();
  ANATOMY_CHECK(fs::exists(config_file), "--model-name-or-path ", f.model, ": no config.json in it");
  ANATOMY_CHECK(fs::exists(weights), "--model-name-or-path ", f.model, ": no model.safetensors in it");
  ANATOMY_CHECK(fs::is_regular_file(f.eval_file), "--eval-file ", f.eval_file, ": no such file");
  check_eval_output_dir(f);
  const Precision precision = parse_precision(f.precision);
  const bool want_cuda = f.device == DeviceChoice::Cuda || (f.device == DeviceChoice::Auto && cuda_available());
  ANATOMY_CHECK(want_cuda || precision == Precision::Fp32, "--precision ", f.precision,
                " needs a GPU (--device cuda); the CPU backend computes in fp32");
  BertConfig cfg = BertConfig::from_json_file(config_file);
  cfg.validate(config_file);
  check_masked_lm_decoder(cfg, config_file);
  if (f.max_seq_length < 0) f.max_seq_length = default_max_seq_length(cfg);  // training's, for the model's task
  ANATOMY_CHECK(f.max_seq_length <= cfg.max_sequence_length(), "--max-seq-length ", f.max_seq_length,
                " is longer than the model's position table (max_position_embeddings = ", cfg.max_position_embeddings,
                cfg.position_offset() ? str_cat(", of which ", cfg.max_sequence_length(), " follow pad_token_id") : "", ")");
  const std::string tok_dir = f.tokenizer.empty() ? f.model : f.tokenizer;
  const Tokenizer tok = Tokenizer::from_directory(tok_dir, cfg.model_type());
  ANATOMY_CHECK(static_cast<int64_t>(tok.vocab_size()) <= cfg.vocab_size, "--tokenizer ", tok_dir, ": ", tok.vocab_size(),
                " tokens, more than the model's vocab_size of ", cfg.vocab_size);
  TextDataOptions topt;
  topt.text_column = f.text_column;
  topt.text_pair_column = f.text_pair_column;
  topt.label_column = f.label_column;
  topt.source_flag = "--validation-file";
  topt.max_length = f.max_seq_length;
  topt.cache_dir = f.cache_dir;
  std::shared_ptr<const Dataset> eval_data;
  try {
    eval_data = load_eval_file(f.eval_file, tok, topt, cfg, f.named, f.masks);
  } catch (const Error& e) {  // a file without the label column: say the two ways on
    const std::string m = e.what();
    const bool no_labels = !f.named.label && (m.find(": no column '") != std::string::npos ||
                                              m.find(": no field '") != std::string::npos ||
                                              m.find(": no list of tags '") != std::string::npos);
    if (!no_labels) throw;
    fail(m, "; --label-column-name names the labels' column, --label-column \"\" predicts without labels");
  }
  const Dataset& data = *eval_data;
  const std::string unknown = unknown_token_warning(data, tok, tok_dir, cfg.vocab_size, false);
  if (!unknown.empty()) std::fprintf(stderr, "anatomy: %s\n", unknown.c_str());

  // The inference-only model: no gradients, no optimizer state, one layer's activations.
  const Device device = want_cuda ? Device::CUDA : Device::CPU;
  const ModelShape shape{f.batch, f.max_seq_length, compute_dtype(precision, device), CheckpointPolicy::None, false};
  const MemoryPlan plan = plan_evaluation(cfg, shape, device, f.skip_padding);
  std::unique_ptr<Backend> be = want_cuda ? make_cuda_backend(0) : make_cpu_backend(f.threads);
  if (precision == Precision::Tf32) be->set_allow_tf32(true);
  const std::unique_ptr<EncoderModel> owned = make_model(*be, cfg, shape);
  EncoderModel& model = *owned;
  model.init_weights(42);  // what the file lacks stays initialized, as transformers does
  const LoadReport rep = load_pretrained_weights(f.model, model);
  if (!rep.newly_initialized.empty())
    std::fprintf(stderr, "anatomy: warning: %zu weights are not in %s and are random (e.g. %s): predictions mean nothing\n",
                 rep.newly_initialized.size(), weights.c_str(), rep.newly_initialized[0].c_str());
  std::fprintf(stderr, "anatomy: evaluating %s (%lld parameters) on %s: %zu samples, %s, %s, batch %lld, seq <= %lld%s\n",
               f.model.c_str(), static_cast<long long>(model.layout().num_parameters()), f.eval_file.c_str(), data.size(),
               be->name().c_str(), precision_name(precision), static_cast<long long>(f.batch),
               static_cast<long long>(f.max_seq_length), f.skip_padding ? ", skipping padding" : "");

  EvalOptions eo;
  eo.batch_size = f.batch;
  eo.skip_padding = f.skip_padding;
  eo.sort_by_length = f.sort_by_length;
  const EvalResult r = evaluate(model, data, eo);

  // The memory anatomy of inference: planned before loading | the tagged allocator's peaks.
  const CategoryBytes peak = be->allocator().stats().peak();
  const double n = static_cast<double>(model.layout().num_parameters());
  std::printf("\nMemory anatomy of inference (planned | allocated, peak per category):\n");
  for (int i = 0; i < kNumCategories; ++i) {
    const int64_t b = peak.v[i], pb = plan.bytes.v[i];
    if (!b && !pb) continue;
    std::printf("  %-16s %10.1f MiB | %10.1f MiB  %6.2f bytes/param\n", std::string(category_name(static_cast<Category>(i))).c_str(),
                pb / 1048576.0, b / 1048576.0, b / n);
  }
  std::printf("  %-16s %10.1f MiB | %10.1f MiB  %6.2f bytes/param\n", "total", plan.total() / 1048576.0,
              peak.total() / 1048576.0, peak.total() / n);
  std::printf("\nTokens: %lld computed of %lld in padded batches (%lld real; %.1f%% of the padded work skipped, "
              "%lld of %lld batches packed)\n",
              static_cast<long long>(r.computed_tokens), static_cast<long long>(r.padded_tokens),
              static_cast<long long>(r.tokens),
              r.padded_tokens ? 100.0 * static_cast<double>(r.padded_tokens - r.computed_tokens) / r.padded_tokens : 0.0,
              static_cast<long long>(r.packed_batches), static_cast<long long>(r.batches));
  if (r.labelled) {
    for (const std::string& m : metric_names(metric_kind(r))) std::printf("%s: %.4f\n", metric_key(m).c_str(), metric_value(r, m));
    if (r.masked_lm) std::printf("(%lld masked tokens)\n", static_cast<long long>(r.scored_tokens));
    if (r.problem == ProblemType::MultiLabel) std::printf("(micro-F1 at threshold 0.5)\n");
  }
  else
    std::printf("No labels (--label-column is empty): predictions only\n");
  std::printf("Samples: %lld\nTime: %.2f\nSamples/second: %.2f\n", static_cast<long long>(r.samples), r.runtime,
              r.samples_per_second);

  if (!f.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(f.output_dir, ec);
    ANATOMY_CHECK(!ec, "--output-dir ", f.output_dir, ": cannot create it: ", ec.message());
    nlohmann::json out = eval_metrics_json(r);
    out["model_name_or_path"] = f.model;
    out["eval_file"] = f.eval_file;
    out["device"] = be->name();
    out["precision"] = precision_name(precision);
    out["per_device_eval_batch_size"] = f.batch;
    out["max_seq_length"] = f.max_seq_length;
    out["num_parameters"] = static_cast<int64_t>(n);
    out["weights_bytes_per_param"] = peak[Category::Weights] / n;
    nlohmann::json cats, planned;
    for (int i = 0; i < kNumCategories; ++i) {
      cats[std::string(category_name(static_cast<Category>(i)))] = peak.v[i];
      planned[std::string(category_name(static_cast<Category>(i)))] = plan.bytes.v[i];
    }
    out["allocator_peak_bytes"] = cats;
    out["planned_bytes"] = planned;
    const std::string preds = (fs::path(f.output_dir) / "predictions.jsonl").string();
    write_predictions(preds, r, cfg.id2label);
    write_file_atomic((fs::path(f.output_dir) / "eval_results.json").string(), out.dump(2) + "\n");
    // A run's directory (--overwrite-output-dir): its all_results.json takes the new eval_ keys, as
    // the Trainer's save_metrics("eval", combined=True) does, so that the two files agree.
    if (const fs::path all = fs::path(f.output_dir) / "all_results.json"; fs::is_regular_file(all)) {
      nlohmann::json merged;
      try {
        merged = nlohmann::json::parse(read_regular_file(all.string()));
      } catch (const nlohmann::json::exception&) {
      }
      ANATOMY_CHECK(merged.is_object(), all.string(),
                    ": not a JSON object; eval_results.json was written, this file was not updated");
      merged.update(eval_metrics_json(r));
      write_file_atomic(all.string(), merged.dump(2) + "\n");
    }
    std::printf("Results: %s/eval_results.json, predictions: %s\n", f.output_dir.c_str(), preds.c_str());
  }
  return 0;
}

// `anatomy plan`: the memory table of a run without running it, whether it fits on the GPU
// present (or one named by --gpu-memory), and the largest micro-batch that would. The first
// line names the device planned for; a plan that does not fit exits 1 naming the lever.
// Each rank's exact bytes, which sharding makes differ (ranks with equal plans in one line).
void print_rank_plans(PlanInput in) {
  auto line = [](int first, int last, const MemoryPlan& p) {
    std::printf("  %s: optimizer_state %lld B, gradients %lld B, total %lld B\n",
                first == last ? str_cat("rank ", first).c_str() : str_cat("ranks ", first, "-", last).c_str(),
                static_cast<long long>(p.bytes[Category::OptimizerState]),
                static_cast<long long>(p.bytes[Category::Gradients]), static_cast<long long>(p.total()));
  };
  int first = 0;
  MemoryPlan run = plan_memory(in);
  for (int r = 1; r <= in.world_size; ++r) {
    MemoryPlan next;
    if (r < in.world_size) {
      in.rank = r;
      next = plan_memory(in);
      if (next.bytes.v == run.bytes.v && next.bytes.shared == run.bytes.shared) continue;
    }
    line(first, r - 1, run);
    first = r;
    run = next;
  }
}

int run_plan(const TrainOptions& o, int64_t gpu_memory, bool has_gpu) {
  ANATOMY_CHECK(o.per_device_train_batch_size >= 1,
                "--per-device-train-batch-size: plan needs a number (it prints the largest batch that fits)");
  ANATOMY_CHECK(o.device != DeviceChoice::Cpu || gpu_memory < 0,
                "--gpu-memory plans for a GPU of that size; --device cpu plans for the CPU: drop one of them");
  const BertConfig cfg = model_config(o);
  const bool cpu = o.device == DeviceChoice::Cpu || (o.device == DeviceChoice::Auto && !has_gpu && gpu_memory < 0);
  int64_t capacity = -1, reserved = 0;
  std::string where;
  if (cpu) {
    where = o.device == DeviceChoice::Cpu ? "the CPU (--device cpu)" : "the CPU (no GPU present; --gpu-memory 16GiB plans for a GPU)";
  } else if (gpu_memory >= 0) {
    capacity = gpu_memory;
    // The CUDA context and kernels (the seed page's ~1.3 GB on a V100) come on top of the plan.
    reserved = 1300 * 1000 * 1000;
    where = str_cat("a GPU of ", gpu_memory >> 20, " MiB (--gpu-memory; reserving 1300 MB for the CUDA context)");
  } else if (has_gpu) {
    const Nvml& nvml = process_nvml();
    const unsigned gpu = nvml_index_of(0);  // CUDA's device 0, whatever CUDA_VISIBLE_DEVICES made it
    if (auto m = nvml.memory(gpu)) {
      capacity = static_cast<int64_t>(m->free);
      reserved = int64_t{600} << 20;
      where = str_cat("the GPU present (", nvml.device_name(gpu), ", ", m->free >> 20, " MiB free, reserving 600 MiB for the context)");
    } else {
      where = "the GPU present (NVML reports no free memory: --gpu-memory names a size)";
    }
  } else {
    where = "a CUDA GPU (--device cuda; none present: --gpu-memory 16GiB asks whether it fits one)";
  }
  std::printf("Planning for %s\n", where.c_str());
  const PlanInput in =
      plan_input(o, cfg, o.per_device_train_batch_size, cpu ? Device::CPU : Device::CUDA, std::max(1, o.nproc_per_node));
  MemoryPlan p = plan_memory(in);
  if (in.world_size > 1)
    std::printf("Data parallel: %d ranks, ZeRO stage %d; the table is what rank 0 holds\n", in.world_size, in.zero_stage);
  std::printf("Memory plan: %s, batch %lld x seq %lld, %s, %s, checkpointing %s, gradients %s (%lld parameters)\n%s",
              o.model_name_or_path.empty() ? o.preset.c_str() : o.model_name_or_path.c_str(),
              static_cast<long long>(o.per_device_train_batch_size), static_cast<long long>(o.seq_len),
              precision_name(o.precision), optimizer_name(o.optim.kind), checkpoint_policy_name(o.gradient_checkpointing),
              gradient_placement_name(in.shape.gradients), static_cast<long long>(p.num_parameters),
              format_plan(p).c_str());
  if (in.world_size > 1) print_rank_plans(in);
  if (capacity < 0) return 0;
  const bool fits = p.total() + reserved <= capacity;
  std::printf("Fits on %s: %s (%.0f MiB needed)\n", where.c_str(), fits ? "yes" : "no", (p.total() + reserved) / 1048576.0);
  const int64_t largest = largest_batch_that_fits(in, capacity, reserved);
  std::printf("Largest micro-batch that fits: %lld\n", static_cast<long long>(largest));
  if (fits) return 0;
  const std::vector<Lever> levers = levers_that_fit(in, capacity, reserved, o.gradient_accumulation_steps);
  for (const Lever& l : levers) std::printf("  would fit: %s (%.0f MiB)\n", l.description.c_str(), l.total / 1048576.0);
  std::fprintf(stderr, "anatomy: the plan does not fit (%.0f MiB needed, %.0f MiB available): %s\n",
               (p.total() + reserved) / 1048576.0, capacity / 1048576.0,
               !levers.empty() ? str_cat("change ", levers.back().description).c_str()  // the one that keeps the most
               : largest > 0   ? str_cat("lower --per-device-train-batch-size to ", largest).c_str()
                               : "lower --max-seq-length or choose a smaller model (--preset)");
  return 1;
}

// The command that resumes this run: the same arguments without --resume-from-checkpoint
// (the caller appends "--resume-from-checkpoint latest"), quoted for a POSIX shell.
std::string resume_command(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--resume-from-checkpoint") {
      ++i;
      continue;
    }
    if (a.rfind("--resume-from-checkpoint=", 0) == 0) continue;
    const bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+") == std::string::npos;
    if (!plain) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    out += (out.empty() ? "" : " ") + a;
  }
  return out;
}


// Note [passive OpenMP]: libgomp reads OMP_WAIT_POLICY when it loads, before main. Its
// default lets idle workers spin, which on a small or busy CPU starves OpenBLAS's threads and
// the main thread: bert-tiny trained 4x slower on 2 cores. So the first thing the program does
// is to re-execute itself once with the passive policy unless the user chose one.
void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on as we are
}

// `anatomy report RUN_DIR... [-o FILE]`.
int run_report(int argc, char** argv) {
  CLI::App app{"Write one self-contained HTML page on where the memory and time of runs went", "anatomy report"};
  std::vector<std::string> report_dirs;
  std::string report_out;
  app.add_option("RUN_DIR", report_dirs, "Output directories of finished runs (several: side by side)")->required();
  app.add_option("-o,--output", report_out,
                 "The HTML file (default: RUN_DIR/report.html for one run, report.html here for several)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "anatomy: error: report: %s (anatomy report --help)\n", e.what());
    return 2;
  }
  ANATOMY_CHECK(app.count("--output") == 0 || !report_out.empty(), "report: -o/--output needs a file name");
  if (report_out.empty()) report_out = report_dirs.size() == 1 ? report_dirs[0] + "/report.html" : "report.html";
  write_report(report_dirs, report_out);
  std::printf("Report: %s\n", report_out.c_str());
  return 0;
}

// Note [failure before the group] in dist/launch.cpp: a rank of `anatomy train` under an outside
// launcher that fails before it joins its group tells the others.
bool g_joined_group = false;

void tell_group_unless_joined(int argc, char** argv, const std::string& error) {
  if (g_joined_group || argc < 2 || std::string(argv[1]) != "train") return;
  try {
    tell_group_of_failure(detect_launch(), error);
  } catch (const Error&) {  // the launch variables themselves are wrong: there is no group to tell
  }
}

int run_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(cli::top_help().c_str(), stderr);
    return 2;
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    const bool markdown = args.size() > 1 && args[1] == "--markdown";
    std::fputs((markdown ? cli::markdown_doc() : cli::top_help()).c_str(), stdout);
    return 0;
  }
  if (name == "report") return run_report(argc - 1, argv + 1);
  const cli::Command cmd = name == "train" ? cli::kTrain : name == "eval" ? cli::kEval : name == "plan" ? cli::kPlan
                                                                                                     : cli::Command{};
  if (!cmd) throw cli::UsageError(str_cat("unknown command '", name, "' (train, eval, plan, report or help)"));
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  for (const std::string& a : rest)
    if (a == "--help" || a == "-h") {
      std::fputs(cli::command_help(cmd).c_str(), stdout);
      return 0;
    }
  cli::RunArgs a = cli::parse_args(cmd, rest);
  auto print_notes = [&] {
    if (a.notes.empty()) return;  // once per job: rank 0, or a process no launcher started
    int rank = 0;
    try {
      rank = detect_launch().rank;
    } catch (const Error&) {  // the launch itself reports inconsistent variables
    }
    if (rank == 0)
      for (const std::string& n : a.notes) std::fprintf(stderr, "anatomy: %s\n", n.c_str());
  };
  // A Hub name becomes its directory in the local Hugging Face cache, downloaded there when
  // missing (io/hub.h); before any process is spawned, so that the ranks find it cached.
  if (!a.train.model_name_or_path.empty()) {
    a.train.model_name = a.train.model_name_or_path;
    a.train.model_name_or_path = resolve_model(a.train.model_name_or_path, a.revision);
  }
  if (cmd == cli::kEval) {
    print_notes();
    return run_eval(eval_flags(a));
  }
  TrainOptions o = cli::finish_train_args(a, cmd, cuda_available());
  print_notes();  // with those finishing the arguments adds
  if (cmd == cli::kPlan) return run_plan(o, a.gpu_memory, cuda_available());
  o.command_line = resume_command(argc, argv);
  // --ddp-timeout (the Trainer's ddp_timeout) reaches the collectives, and the spawned ranks,
  // as ANATOMY_DIST_TIMEOUT, which wins when the user set it (dist/launch.h).
  if (a.was_given("ddp-timeout") && std::getenv("ANATOMY_DIST_TIMEOUT") == nullptr)
    ::setenv("ANATOMY_DIST_TIMEOUT", std::to_string(a.ddp_timeout).c_str(), 1);
  // One process per rank (dist/spawn.h): under a launcher (torchrun, mpirun, srun) this process
  // is one rank of its group; --nproc-per-node N without one spawns N such processes.
  return run_ranks(o.nproc_per_node, argv, [&](const LaunchEnv& env) {
    // Under an outside launcher the command alone would resume a world of one: the hint names it.
    if (env.launched() && !env.by_anatomy) o.command_line = str_cat(env.launcher, " [its options] ", o.command_line);
    if (!env.launched()) {
      train(o);  // interrupted by SIGINT/SIGTERM: a checkpoint was saved; still exit 0
      return 0;
    }
    TrainDevice device = make_train_device(o, env.local_rank, env.local_world_size);
    g_joined_group = true;  // from here a failure is the group's (its rendezvous, then Note [failure watch])
    std::unique_ptr<Communicator> comm = make_process_group(env, *device.backend);
    try {
      train(o, *comm, device);
    } catch (...) {
      comm->abort();  // the other ranks throw at their next collective instead of waiting
      throw;
    }
    return 0;
  }, /*spawn=*/true);
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_openmp(argv);
  try {
    return run_command(argc, argv);
  } catch (const Error& e) {  // bad flags, files and values: one line, exit 2
    std::fprintf(stderr, "anatomy: error: %s\n", e.what());
    tell_group_unless_joined(argc, argv, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy: error: %s\n", e.what());
    tell_group_unless_joined(argc, argv, e.what());
    return 3;
  }
}
