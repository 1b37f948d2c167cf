// The `anatomy` command line: train, and (as they land) plan, eval and report.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "dist/spawn.h"
#include "train/setup.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "memory/planner.h"
#include "ops/backend.h"
#include "telemetry/nvml.h"
#include "telemetry/report.h"
#include "train/evaluate.h"
#include "train/trainer.h"

using namespace anatomy;

namespace {

struct TrainFlags {
  TrainOptions o;
  std::string precision = "fp32", checkpointing = "none", optim = "adamw", save_strategy = "final", batch = "4";
  bool seed_experiment = false;
};

void add_train_flags(CLI::App& cmd, TrainFlags& f) {
  TrainOptions& o = f.o;
  cmd.add_flag("--seed-experiment", f.seed_experiment,
               "The experiment of 'Model training anatomy': bert-large, seq 512, 512 random sequences, batch 4, fp32, "
               "one epoch (bert-tiny when no GPU is present)");
  auto* preset = cmd.add_option("--preset", o.preset, "Built-in model: bert-tiny, bert-mini, bert-base, bert-large")
                     ->capture_default_str();
  cmd.add_option("--model-name-or-path", o.model_name_or_path,
                 "A Hugging Face model directory (config.json, optionally model.safetensors)")
      ->excludes(preset);
  cmd.add_option("--num-labels", o.num_labels, "Classes of the classification head (presets)")->capture_default_str();
  cmd.add_option("--dataset", o.dataset, "Synthetic data: seed (random ids, labels 0) or learnable")->capture_default_str();
  cmd.add_option("--train-file", o.train_file,
                 "Labelled text (.jsonl, .csv, .tsv) to train on instead of synthetic data; tokenized once into a "
                 "cache beside it, batches padded to their longest sample");
  cmd.add_option("--validation-file", o.validation_file, "Labelled text to evaluate on (--eval-strategy)");
  cmd.add_option("--validation-split", o.validation_split, "Hold out this fraction of the training data for evaluation")
      ->capture_default_str();
  cmd.add_option("--text-column", o.text_column, "Column (JSON key or CSV header) holding the text")->capture_default_str();
  cmd.add_option("--text-pair-column", o.text_pair_column, "Column of the second text of a pair ([CLS] a [SEP] b [SEP])");
  cmd.add_option("--label-column", o.label_column, "Column holding the label (integers or class names)")
      ->capture_default_str();
  cmd.add_option("--tokenizer", o.tokenizer,
                 "Directory with vocab.txt or tokenizer.json (default: --model-name-or-path)");
  cmd.add_option("--dataset-cache-dir", o.dataset_cache_dir,
                 "Where the tokenized cache of --train-file goes (default: beside the file)");
  cmd.add_flag("--skip-padding,!--no-skip-padding", o.skip_padding,
               "With --train-file, train on real tokens only (default; the same losses and gradients as padded "
               "batches, no FLOPs on padding rows outside attention); --no-skip-padding computes padded batches");
  cmd.add_flag("--group-by-length", o.group_by_length, "Batch samples of similar length together (less padding)");
  cmd.add_option("--num-samples", o.num_samples, "Samples in the synthetic set")->capture_default_str();
  cmd.add_option("--seq-len,--max-seq-length", o.seq_len,
                 "Sequence length (text data: the longest a sample may be; longer ones are truncated)")
      ->capture_default_str();
  cmd.add_option("--dataloader-prefetch", o.prefetch, "Batches prepared ahead by the loader thread")->capture_default_str();
  cmd.add_option("--per-device-train-batch-size,--batch-size", f.batch,
                 "Micro-batch size, or auto: the largest that the memory plan fits on the GPU")->capture_default_str();
  cmd.add_option("--gradient-accumulation-steps", o.gradient_accumulation_steps,
                 "Micro-batches per optimizer step")->capture_default_str();
  cmd.add_option("--num-train-epochs", o.num_train_epochs, "Epochs")->capture_default_str();
  cmd.add_option("--max-steps", o.max_steps, "Optimizer steps (overrides epochs when > 0)")->capture_default_str();
  cmd.add_option("--seed", o.seed, "Seed of initialization, data order and dropout")->capture_default_str();
  cmd.add_option("--optim", f.optim, "Optimizer: adamw, adamw-8bit, sgd or adafactor")->capture_default_str();
  cmd.add_option("--learning-rate", o.learning_rate, "Peak learning rate")->capture_default_str();
  cmd.add_option("--weight-decay", o.optim.weight_decay, "Decoupled weight decay (not on biases and LayerNorm)")
      ->capture_default_str();
  cmd.add_option("--adam-beta1", o.optim.beta1, "AdamW beta1")->capture_default_str();
  cmd.add_option("--adam-beta2", o.optim.beta2, "AdamW beta2")->capture_default_str();
  cmd.add_option("--adam-epsilon", o.optim.eps, "AdamW epsilon")->capture_default_str();
  cmd.add_option("--sgd-momentum", o.optim.momentum, "SGD momentum")->capture_default_str();
  cmd.add_option("--lr-scheduler-type", o.lr_scheduler_type, "linear or constant")->capture_default_str();
  cmd.add_option("--warmup-steps", o.warmup_steps, "Linear warm-up steps")->capture_default_str();
  cmd.add_option("--max-grad-norm", o.max_grad_norm, "Gradient clipping norm (0: off)")->capture_default_str();
  cmd.add_option("--precision", f.precision, "fp32, tf32, bf16 or fp16 (mixed precision keeps fp32 master weights)")
      ->capture_default_str();
  cmd.add_option("--gradient-checkpointing", f.checkpointing, "none, layer or selective")->capture_default_str();
  cmd.add_option("--gradient-placement", o.gradient_placement,
                 "Where the fp32 gradients live: own (a buffer of their own), in-activations (written into "
                 "activation memory backward has finished with; one micro-batch per step only), or auto "
                 "(in-activations without accumulation)")
      ->capture_default_str();
  cmd.add_option("--device", o.device, "auto (the GPU when present), cpu or cuda")->capture_default_str();
  cmd.add_option("--nproc-per-node", o.nproc_per_node,
                 "Data-parallel ranks, one per device (CUDA devices 0..N-1 over NCCL; on the CPU an in-process group)")
      ->capture_default_str();
  cmd.add_option("--zero-stage", o.zero_stage,
                 "With --nproc-per-node > 1: 0 every rank keeps the whole optimizer state, 1 each keeps 1/N of it "
                 "(ZeRO-1; adamw or sgd)")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd.add_option("--output-dir", o.output_dir, "Where train_results.json, metrics.jsonl and the model go")
      ->capture_default_str();
  cmd.add_option("--logging-steps", o.logging_steps, "Log every N steps (0: summary only)")->capture_default_str();
  cmd.add_option("--save-strategy", f.save_strategy,
                 "final: the model at the end; steps: also a checkpoint every --save-steps; epoch: also one per epoch; "
                 "no: save nothing")
      ->capture_default_str();
  cmd.add_option("--save-steps", o.save_steps, "Steps between checkpoints (--save-strategy steps)")->capture_default_str();
  cmd.add_option("--save-total-limit", o.save_total_limit, "Keep only the newest N checkpoints (0: all)")
      ->capture_default_str();
  cmd.add_option("--resume-from-checkpoint", o.resume_from_checkpoint,
                 "Continue from a checkpoint directory, or 'latest' (the newest in --output-dir)");
  cmd.add_option("--eval-strategy", o.eval_strategy,
                 "Evaluate on the validation data: no, steps (every --eval-steps) or epoch; and once at the end")
      ->capture_default_str();
  cmd.add_option("--eval-steps", o.eval_steps, "Steps between evaluations (0: --logging-steps)")->capture_default_str();
  cmd.add_option("--per-device-eval-batch-size", o.per_device_eval_batch_size,
                 "Evaluation batch (at most the training micro-batch)")->capture_default_str();
  cmd.add_flag("--disable-tqdm", o.disable_progress_bar, "No progress bar on a terminal");
  cmd.add_flag("--overwrite-output-dir", o.overwrite_output_dir,
               "Replace the run already in --output-dir (its files are removed once this run first writes)");
  cmd.add_flag("--skip-nonfinite-steps", o.skip_nonfinite_steps,
               "Skip and count steps whose loss or gradient norm is not finite, instead of stopping the run");
  cmd.add_flag("--trace-memory-growth", o.trace_memory_growth,
               "GPU: synchronize after every op of the first step and report which ops grew NVML's used memory "
               "(kernels loaded on first use, library buffers)");
  cmd.add_option("--profile-steps", o.profile_steps,
                 "After training, time every op of N more steps (CUDA events) and write profile.json")
      ->capture_default_str();
}

TrainOptions finish_train_flags(CLI::App& cmd, TrainFlags& f, bool will_run = true) {
  TrainOptions o = f.o;
  o.precision = parse_precision(f.precision);
  o.gradient_checkpointing = parse_checkpoint_policy(f.checkpointing);
  resolve_gradient_placement(o.gradient_placement, o.gradient_accumulation_steps);  // a bad value fails here
  o.optim.kind = parse_optimizer(f.optim);
  ANATOMY_CHECK(f.save_strategy == "final" || f.save_strategy == "no" || f.save_strategy == "steps" ||
                    f.save_strategy == "epoch",
                "--save-strategy: expected final, no, steps or epoch (got '", f.save_strategy, "')");
  o.save_model = f.save_strategy != "no";
  o.checkpoint_strategy = (f.save_strategy == "steps" || f.save_strategy == "epoch") ? f.save_strategy : "no";
  if (f.batch == "auto") {
    o.per_device_train_batch_size = TrainOptions::kAutoBatch;
  } else {
    try {
      size_t used = 0;
      o.per_device_train_batch_size = std::stoll(f.batch, &used);
      ANATOMY_CHECK(used == f.batch.size(), "");
    } catch (const std::exception&) {
      fail("--per-device-train-batch-size: expected a positive integer or auto (got '", f.batch, "')");
    }
  }
  const bool gpu = o.device == "cuda" || (o.device == "auto" && cuda_available());
  if (f.seed_experiment) {
    for (const char* flag : {"--preset", "--model-name-or-path", "--num-samples", "--seq-len",
                             "--per-device-train-batch-size", "--precision", "--num-train-epochs", "--max-steps"})
      ANATOMY_CHECK(cmd.count(flag) == 0, "--seed-experiment fixes the model, data and batch; drop ", flag);
    o.preset = gpu ? "bert-large" : "bert-tiny";
    o.seq_len = 512;
    o.num_samples = 512;
    o.per_device_train_batch_size = 4;
    o.num_train_epochs = 1;
    o.precision = Precision::Fp32;
    o.dataset = "seed";
    if (!gpu)
      std::fprintf(stderr,
                   "anatomy: no GPU present: running the seed experiment on the CPU with the small bert-tiny preset "
                   "(the page uses bert-large on a V100)\n");
  }
  ANATOMY_CHECK(!will_run || gpu || o.precision == Precision::Fp32,
                "--precision ", f.precision, " needs a GPU (--device cuda); the CPU backend computes in fp32");
  return o;
}

// ---- `anatomy eval` ------------------------------------------------------------------------------
// A saved model (config.json, model.safetensors, its tokenizer) on a labelled text file: loss,
// accuracy, macro-F1 and per-sample predictions, from an inference-only model (weights in fp32
// plus the compute copy, activations of one layer) with the padding-skipping forward by default.
struct EvalFlags {
  std::string model, eval_file, text_column = "text", text_pair_column, label_column = "label", tokenizer;
  std::string precision = "fp32", device = "auto", output_dir, cache_dir;
  int64_t max_seq_length = 128, batch = 32;
  int threads = 0;
  bool skip_padding = true, sort_by_length = true;
};

void add_eval_flags(CLI::App& cmd, EvalFlags& f) {
  cmd.add_option("--model-name-or-path", f.model, "A saved model directory (config.json, model.safetensors, tokenizer)");
  cmd.add_option("--eval-file", f.eval_file, "Text to evaluate on (.jsonl, .csv, .tsv)");
  cmd.add_option("--text-column", f.text_column, "Column holding the text")->capture_default_str();
  cmd.add_option("--text-pair-column", f.text_pair_column, "Column of the second text of a pair");
  cmd.add_option("--label-column", f.label_column, "Column holding the label; empty: predictions only")
      ->capture_default_str();
  cmd.add_option("--max-seq-length,--seq-len", f.max_seq_length, "Longest sample in tokens (longer ones are truncated)")
      ->capture_default_str();
  cmd.add_option("--tokenizer", f.tokenizer, "Directory with vocab.txt or tokenizer.json (default: the model's)");
  cmd.add_option("--dataset-cache-dir", f.cache_dir, "Where the tokenized cache of --eval-file goes (default: beside it)");
  cmd.add_option("--per-device-eval-batch-size,--batch-size", f.batch, "Samples per forward")->capture_default_str();
  cmd.add_option("--precision", f.precision, "fp32, tf32, bf16 or fp16 (half precision keeps fp32 master weights)")
      ->capture_default_str();
  cmd.add_option("--device", f.device, "auto (the GPU when present), cpu or cuda")->capture_default_str();
  cmd.add_option("--threads", f.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd.add_option("--output-dir", f.output_dir, "Where eval_results.json and predictions.jsonl go (default: print only)");
  cmd.add_flag("--skip-padding,!--no-skip-padding", f.skip_padding,
               "Run the encoder on real tokens only (default) or, with --no-skip-padding, on padded batches");
  cmd.add_flag("--sort-by-length,!--no-sort-by-length", f.sort_by_length,
               "Batch the longest samples first so batches hold similar lengths (default), or keep the file's order");
}

int run_eval(const EvalFlags& f) {
  namespace fs = std::filesystem;
  ANATOMY_CHECK(!f.model.empty(), "--model-name-or-path is required (a saved model directory)");
  ANATOMY_CHECK(!f.eval_file.empty(), "--eval-file is required (a .jsonl, .csv or .tsv file)");
  ANATOMY_CHECK(fs::is_directory(f.model), "--model-name-or-path ", f.model, ": no such directory");
  const std::string config_file = config_path_of(f.model), weights = (fs::path(f.model) / "model.safetensors").string();
  ANATOMY_CHECK(fs::exists(config_file), "--model-name-or-path ", f.model, ": no config.json in it");
  ANATOMY_CHECK(fs::exists(weights), "--model-name-or-path ", f.model, ": no model.safetensors in it");
  ANATOMY_CHECK(fs::is_regular_file(f.eval_file), "--eval-file ", f.eval_file, ": no such file");
  ANATOMY_CHECK(f.batch >= 1, "--per-device-eval-batch-size must be at least 1 (got ", f.batch, ")");
  ANATOMY_CHECK(f.max_seq_length >= 2, "--max-seq-length must be at least 2 (got ", f.max_seq_length, ")");
  ANATOMY_CHECK(f.device == "auto" || f.device == "cpu" || f.device == "cuda", "--device: expected auto, cpu or cuda (got '",
                f.device, "')");
  const Precision precision = parse_precision(f.precision);
  const bool want_cuda = f.device == "cuda" || (f.device == "auto" && cuda_available());
  ANATOMY_CHECK(want_cuda || precision == Precision::Fp32, "--precision ", f.precision,
                " needs a GPU (--device cuda); the CPU backend computes in fp32");
  BertConfig cfg = BertConfig::from_json_file(config_file);
  cfg.validate(config_file);
  ANATOMY_CHECK(f.max_seq_length <= cfg.max_position_embeddings, "--max-seq-length ", f.max_seq_length,
                " is longer than the model's position table (max_position_embeddings = ", cfg.max_position_embeddings, ")");
  const std::string tok_dir = f.tokenizer.empty() ? f.model : f.tokenizer;
  const WordPieceTokenizer tok = WordPieceTokenizer::from_directory(tok_dir);
  ANATOMY_CHECK(static_cast<int64_t>(tok.vocab_size()) <= cfg.vocab_size, "--tokenizer ", tok_dir, ": ", tok.vocab_size(),
                " tokens, more than the model's vocab_size of ", cfg.vocab_size);
  TextDataOptions topt;
  topt.text_column = f.text_column;
  topt.text_pair_column = f.text_pair_column;
  topt.label_column = f.label_column;
  topt.max_length = f.max_seq_length;
  topt.cache_dir = f.cache_dir;
  topt.labels = LabelSet::from_id2label(cfg.id2label);  // the file's labels mean the model's classes
  const TextDataset data = TextDataset::load(f.eval_file, tok, topt);

  // The inference-only model: no gradients, no optimizer state, one layer's activations.
  const ModelShape shape{f.batch, f.max_seq_length, compute_dtype(precision), CheckpointPolicy::None, false};
  const MemoryPlan plan = plan_evaluation(cfg, shape, want_cuda ? Device::CUDA : Device::CPU, f.skip_padding);
  std::unique_ptr<Backend> be = want_cuda ? make_cuda_backend(0) : make_cpu_backend(f.threads);
  if (precision == Precision::Tf32) be->set_allow_tf32(true);
  BertForSequenceClassification model(*be, cfg, shape);
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
  if (r.labelled)
    std::printf("eval_loss: %.4f\neval_accuracy: %.4f\neval_macro_f1: %.4f\n", r.loss, r.accuracy, r.macro_f1);
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
    std::printf("Results: %s/eval_results.json, predictions: %s\n", f.output_dir.c_str(), preds.c_str());
  }
  return 0;
}

// `anatomy plan`: the memory table of a run without running it, whether it fits on the GPU
// present (or one named by --gpu-memory), and the largest micro-batch that would.
int run_plan(const TrainOptions& o, const std::string& gpu_memory, bool has_gpu) {
  ANATOMY_CHECK(o.per_device_train_batch_size >= 1,
                "--per-device-train-batch-size: plan needs a number (it prints the largest batch that fits)");
  const BertConfig cfg = model_config(o);
  const Device dev = (o.device == "cpu") ? Device::CPU : Device::CUDA;
  PlanInput in{cfg,
               {o.per_device_train_batch_size, o.seq_len, compute_dtype(o.precision), o.gradient_checkpointing, true,
                resolve_gradient_placement(o.gradient_placement, o.gradient_accumulation_steps)},
               o.optim.kind, dev, std::max(1, o.nproc_per_node), o.nproc_per_node > 1 ? o.zero_stage : 0};
  MemoryPlan p = plan_memory(in);
  if (in.world_size > 1)
    std::printf("Data parallel: %d ranks, ZeRO stage %d; the table is what each rank holds (rank 0's shard)\n", in.world_size,
                in.zero_stage);
  std::printf("Memory plan: %s, batch %lld x seq %lld, %s, %s, checkpointing %s, gradients %s (%lld parameters)\n%s",
              o.model_name_or_path.empty() ? o.preset.c_str() : o.model_name_or_path.c_str(),
              static_cast<long long>(o.per_device_train_batch_size), static_cast<long long>(o.seq_len),
              precision_name(o.precision), optimizer_name(o.optim.kind), checkpoint_policy_name(o.gradient_checkpointing),
              gradient_placement_name(in.shape.gradients), static_cast<long long>(p.num_parameters),
              format_plan(p).c_str());
  int64_t capacity = -1, reserved = 0;
  std::string where;
  if (!gpu_memory.empty()) {
    capacity = parse_bytes(gpu_memory, "--gpu-memory");
    // The CUDA context and kernels (the seed page's ~1.3 GB on a V100) come on top of the plan.
    reserved = parse_bytes("1300MB", "--context");
    where = "a " + gpu_memory + " GPU (reserving 1300 MB for the CUDA context)";
  } else if (has_gpu) {
    Nvml nvml;
    if (auto m = nvml.memory(0)) {
      capacity = static_cast<int64_t>(m->free);
      reserved = int64_t{600} << 20;
      where = str_cat("the GPU present (", nvml.device_name(0), ", ", m->free >> 20, " MiB free, reserving 600 MiB for the context)");
    }
  }
  if (capacity < 0) {
    std::printf("No GPU present and no --gpu-memory given: name one (e.g. --gpu-memory 16GB) to ask whether it fits.\n");
    return 0;
  }
  const bool fits = p.total() + reserved <= capacity;
  std::printf("Fits on %s: %s (%.0f MiB needed)\n", where.c_str(), fits ? "yes" : "no", (p.total() + reserved) / 1048576.0);
  std::printf("Largest micro-batch that fits: %lld\n", static_cast<long long>(largest_batch_that_fits(in, capacity, reserved)));
  if (!fits)
    for (const Lever& l : levers_that_fit(in, capacity, reserved, o.gradient_accumulation_steps))
      std::printf("  would fit: %s (%.0f MiB)\n", l.description.c_str(), l.total / 1048576.0);
  return 0;
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

}  // namespace

// Note [passive OpenMP]: libgomp reads OMP_WAIT_POLICY when it loads, before main. Its
// default lets idle workers spin, which on a small or busy CPU starves OpenBLAS's threads and
// the main thread: bert-tiny trained 4x slower on 2 cores. So the first thing the program does
// is to re-execute itself once with the passive policy unless the user chose one.
static void ensure_passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then carry on as we are
}

int main(int argc, char** argv) {
  ensure_passive_openmp(argv);
  CLI::App app{"anatomy: train BERT on the GPU and see where every byte and millisecond goes.\n"
               "Reproduces Hugging Face's 'Model training anatomy' experiment (see README.md)."};
  app.require_subcommand(1);
  TrainFlags tf;
  CLI::App* train_cmd = app.add_subcommand("train", "Train BertForSequenceClassification and report time and memory");
  add_train_flags(*train_cmd, tf);
  TrainFlags pf;
  std::string gpu_memory;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Print the memory plan of a training run without running it");
  add_train_flags(*plan_cmd, pf);
  plan_cmd->add_option("--gpu-memory", gpu_memory, "Ask about a GPU of this size instead of the one present (e.g. 16GB)");
  EvalFlags ef;
  CLI::App* eval_cmd = app.add_subcommand("eval", "Evaluate a saved model on a text file: loss, accuracy, macro-F1, predictions");
  add_eval_flags(*eval_cmd, ef);
  std::vector<std::string> report_dirs;
  std::string report_out;
  CLI::App* report_cmd = app.add_subcommand("report", "Write one self-contained HTML page on where the memory and time of runs went");
  report_cmd->add_option("RUN_DIR", report_dirs, "Output directories of finished runs (several: side by side)")->required();
  report_cmd->add_option("-o,--output", report_out,
                         "The HTML file (default: RUN_DIR/report.html for one run, report.html here for several)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train_cmd->parsed()) {
      TrainOptions o = finish_train_flags(*train_cmd, tf);
      o.command_line = resume_command(argc, argv);
      // One process per rank (dist/spawn.h): under a launcher (torchrun, mpirun, srun) this
      // process is one rank of its group; --nproc-per-node N without one spawns N such processes.
      const int rc = run_ranks(o.nproc_per_node, argv, [&](const LaunchEnv& env) {
        if (!env.launched()) {
          train(o);  // interrupted by SIGINT/SIGTERM: a checkpoint was saved; still exit 0
          return 0;
        }
        TrainDevice device = make_train_device(o, env.local_rank, env.local_world_size);
        std::unique_ptr<Communicator> comm = make_process_group(env, *device.backend);
        try {
          train(o, *comm, device);
        } catch (...) {
          comm->abort();  // the other ranks throw at their next collective instead of waiting
          throw;
        }
        return 0;
      }, /*spawn=*/true);
      if (rc != 0) return rc;
    }
    if (eval_cmd->parsed()) return run_eval(ef);
    if (plan_cmd->parsed()) return run_plan(finish_train_flags(*plan_cmd, pf, false), gpu_memory, cuda_available());
    if (report_cmd->parsed()) {
      if (report_out.empty()) report_out = report_dirs.size() == 1 ? report_dirs[0] + "/report.html" : "report.html";
      write_report(report_dirs, report_out);
      std::printf("Report: %s\n", report_out.c_str());
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "anatomy: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anatomy: error: %s\n", e.what());
    return 3;
  }
}
