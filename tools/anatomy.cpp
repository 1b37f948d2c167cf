// The `anatomy` command line: train, and (as they land) plan, eval and report.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "memory/planner.h"
#include "ops/backend.h"
#include "telemetry/nvml.h"
#include "telemetry/report.h"
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
  cmd.add_option("--num-samples", o.num_samples, "Samples in the synthetic set")->capture_default_str();
  cmd.add_option("--seq-len", o.seq_len, "Sequence length")->capture_default_str();
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
  cmd.add_option("--device", o.device, "auto (the GPU when present), cpu or cuda")->capture_default_str();
  cmd.add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd.add_option("--output-dir", o.output_dir, "Where train_results.json, metrics.jsonl and the model go")
      ->capture_default_str();
  cmd.add_option("--logging-steps", o.logging_steps, "Log every N steps (0: summary only)")->capture_default_str();
  cmd.add_option("--save-strategy", f.save_strategy, "final (save the model at the end) or no")->capture_default_str();
  cmd.add_flag("--disable-tqdm", o.disable_progress_bar, "No progress bar on a terminal");
  cmd.add_option("--profile-steps", o.profile_steps,
                 "After training, time every op of N more steps (CUDA events) and write profile.json")
      ->capture_default_str();
}

TrainOptions finish_train_flags(CLI::App& cmd, TrainFlags& f, bool will_run = true) {
  TrainOptions o = f.o;
  o.precision = parse_precision(f.precision);
  o.gradient_checkpointing = parse_checkpoint_policy(f.checkpointing);
  o.optim.kind = parse_optimizer(f.optim);
  ANATOMY_CHECK(f.save_strategy == "final" || f.save_strategy == "no", "--save-strategy: expected final or no (got '",
                f.save_strategy, "')");
  o.save_model = f.save_strategy == "final";
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

// `anatomy plan`: the memory table of a run without running it, whether it fits on the GPU
// present (or one named by --gpu-memory), and the largest micro-batch that would.
int run_plan(const TrainOptions& o, const std::string& gpu_memory, bool has_gpu) {
  ANATOMY_CHECK(o.per_device_train_batch_size >= 1,
                "--per-device-train-batch-size: plan needs a number (it prints the largest batch that fits)");
  BertConfig cfg = o.model_name_or_path.empty() ? BertConfig::preset(o.preset)
                                                : BertConfig::from_json_file(config_path_of(o.model_name_or_path));
  if (o.model_name_or_path.empty() && cfg.num_labels != o.num_labels) cfg.set_num_labels(o.num_labels);
  const Device dev = (o.device == "cpu") ? Device::CPU : Device::CUDA;
  PlanInput in{cfg, {o.per_device_train_batch_size, o.seq_len, compute_dtype(o.precision), o.gradient_checkpointing, true},
               o.optim.kind, dev};
  MemoryPlan p = plan_memory(in);
  std::printf("Memory plan: %s, batch %lld x seq %lld, %s, %s, checkpointing %s (%lld parameters)\n%s",
              o.model_name_or_path.empty() ? o.preset.c_str() : o.model_name_or_path.c_str(),
              static_cast<long long>(o.per_device_train_batch_size), static_cast<long long>(o.seq_len),
              precision_name(o.precision), optimizer_name(o.optim.kind), checkpoint_policy_name(o.gradient_checkpointing),
              static_cast<long long>(p.num_parameters), format_plan(p).c_str());
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
      train(o);
    }
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
