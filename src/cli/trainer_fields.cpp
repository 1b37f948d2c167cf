// What anatomy says about the Hugging Face Trainer's arguments it does not take: every field of
// TrainingArguments (transformers 4.57 and 5.24, read from their training_args.py) and the
// run_glue.py / run_classification.py arguments users pass, each refused by name with a reason.
#include "cli/options_table.h"

#include <cctype>
#include <cstdlib>

namespace anatomy::cli {

const std::vector<const char*>& training_arguments_fields() {
  static const std::vector<const char*> fields = {
    "output_dir", "per_device_train_batch_size", "num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type",
    "lr_scheduler_kwargs", "warmup_steps", "optim", "optim_args", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "optim_target_modules", "gradient_accumulation_steps", "average_tokens_across_devices",
    "max_grad_norm", "label_smoothing_factor", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32",
    "activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "use_liger_kernel", "liger_kernel_config", "use_cache", "neftune_noise_alpha", "torch_empty_cache_steps",
    "auto_find_batch_size", "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node",
    "logging_nan_inf_filter", "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm",
    "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "prediction_loss_only", "eval_on_start",
    "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics",
    "batch_eval_metrics", "save_only_model", "save_strategy", "save_steps", "save_on_each_node", "save_total_limit",
    "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy",
    "hub_always_push", "hub_revision", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
    "ignore_data_skip", "restore_callback_states_from_checkpoint", "full_determinism", "seed", "data_seed", "use_cpu",
    "accelerator_config", "parallelism_config", "dataloader_drop_last", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns", "label_names",
    "train_sampling_strategy", "length_column_name", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
    "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout", "fsdp", "fsdp_config", "deepspeed",
    "debug", "skip_memory_metrics", "do_train", "do_eval", "do_predict", "resume_from_checkpoint", "local_rank",
    "overwrite_output_dir", "per_gpu_train_batch_size", "per_gpu_eval_batch_size", "warmup_ratio", "logging_dir",
    "save_safetensors", "no_cuda", "use_mps_device", "jit_mode_eval", "fp16_opt_level", "half_precision_backend",
    "tpu_num_cores", "tpu_metrics_debug", "past_index", "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap",
    "adafactor", "group_by_length", "use_legacy_prediction_loop", "include_inputs_for_metrics", "fp16_backend",
    "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token", "mp_parameters", "torchdynamo",
    "ray_scope", "include_tokens_per_second",
  };
  return fields;
}

// The reasons for the arguments users pass most; any other TrainingArguments field gets the
// generic one (cli/parse.cpp).
const std::vector<Refusal>& refused_arguments() {
  static const std::vector<Refusal> r = {
      {"auto_find_batch_size", "use --per-device-train-batch-size auto (the largest batch the memory plan fits)"},
      {"deepspeed", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"fsdp", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"fsdp_config", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"local_rank", "the rank comes from the launcher's environment (LOCAL_RANK, as torchrun sets it)"},
      {"push_to_hub", "anatomy does not upload; the output directory loads with transformers as it is"},
      {"hub_model_id", "anatomy does not upload"},
      {"hub_token", "anatomy does not upload"},
      {"torch_compile", "anatomy is not PyTorch: its kernels are its own"},
      {"label_smoothing_factor", "the loss is plain cross-entropy"},
      {"logging_dir", "logs go to metrics.jsonl in --output-dir"},
      {"run_name", "no tracking integrations (--report-to jsonl or none)"},
      {"per_gpu_train_batch_size", "use --per-device-train-batch-size"},
      {"per_gpu_eval_batch_size", "use --per-device-eval-batch-size"},
      {"task_name", "GLUE datasets are not downloaded; pass --train-file and --validation-file"},
      {"dataset_name", "datasets are not downloaded; pass --train-file and --validation-file"},
      {"dataset_config_name", "datasets are not downloaded; pass --train-file and --validation-file"},
      {"max_train_samples", "not supported: cut the training file instead"},
      {"max_eval_samples", "not supported: cut the validation file instead"},
      {"max_predict_samples", "not supported: cut the test file instead"},
      {"cache_dir", "the Hugging Face cache is found as huggingface_hub finds it: set HF_HUB_CACHE or HF_HOME"},
      {"config_name", "the config is --model-name-or-path's config.json"},
      {"trust_remote_code", "anatomy runs BERT-family encoders only"},
      {"token", "set HF_TOKEN (or log in with huggingface-cli): anatomy reads the token as huggingface_hub does"},
      {"metric_name", "evaluation reports the loss and the task's metrics (accuracy and macro-F1, MSE and Pearson, ...)"},
      // run_classification.py's own arguments.
      {"remove_splits", "the splits are the files: --train-file, --validation-file, --test-file"},
      {"remove_columns", "only the columns --text-column-names and --label-column-name name are read"},
      {"train_split_name", "the splits are the files: --train-file, --validation-file, --test-file"},
      {"validation_split_name", "the splits are the files: --train-file, --validation-file, --test-file"},
      {"test_split_name", "the splits are the files: --train-file, --validation-file, --test-file"},
      {"shuffle_seed", "the data order follows --seed"},
      {"do_regression", "the problem type follows the labels: numbers train a regression (or a config.json's "
                        "problem_type says it)"},
      // run_mlm.py's and run_ner.py's own arguments.
      {"label_all_tokens", "each word's first sub-token carries its tag, the others none (run_ner.py's default)"},
      {"return_entity_level_metrics", "entity precision, recall and F1 are reported over all entity types together "
                                      "(run_ner.py's default)"},
      {"logging_nan_inf_filter", "logged losses are never filtered: a non-finite loss stops the run, keeping the last "
                                 "checkpoint (--skip-nonfinite-steps skips and counts such steps instead)"},
  };
  return r;
}

const std::vector<NeutralValue>& neutral_values() {
  static const char* kLoader = "a PyTorch DataLoader setting; anatomy's loader thread prepares --dataloader-prefetch "
                               "batches ahead, the same batches in the same order";
  static const std::vector<NeutralValue> table = {
      {"push_to_hub", "false", "nothing is uploaded"},
      {"torch_compile", "false", "anatomy's kernels are its own"},
      {"label_smoothing_factor", "0", "the loss is plain cross-entropy"},
      {"fp16_full_eval", "false", "evaluation computes in the training precision"},
      {"bf16_full_eval", "false", "evaluation computes in the training precision"},
      {"auto_find_batch_size", "false", "the batch is --per-device-train-batch-size"},
      {"ddp_find_unused_parameters", "false", "anatomy's data parallelism reduces every gradient"},
      {"include_num_input_tokens_seen", "false", "nothing more is counted"},
      {"include_tokens_per_second", "false", "nothing more is counted"},
      {"local_rank", "-1", "no launcher's rank"},
      {"dataloader_num_workers", "*", kLoader},
      {"dataloader_pin_memory", "*", kLoader},
      {"dataloader_persistent_workers", "*", kLoader},
      {"remove_unused_columns", "*", "anatomy reads only the columns --text-column and --label-column name"},
      {"logging_nan_inf_filter", "false", "losses are logged as they are"},
      // The example scripts' data arguments whose values change nothing here.
      {"preprocessing_num_workers", "*", "texts are tokenized once, in this process, into a token cache"},
      {"metric_name", "accuracy", "evaluation reports the task's own metrics (Note [task metrics])"},
      {"metric_name", "f1", "evaluation reports the task's own metrics (Note [task metrics])"},
      {"metric_name", "mse", "evaluation reports the task's own metrics (Note [task metrics])"},
      {"label_all_tokens", "false", "each word's first sub-token carries its tag"},
      {"return_entity_level_metrics", "false", "entity metrics are over all types together"},
      // The defaults that TrainingArguments(...).to_json_string() writes for what anatomy does
      // not do: an arguments file dumped from the Trainer runs as it is.
      {"logging_nan_inf_filter", "true", "a non-finite loss is not filtered from the log: it stops the run, keeping the "
                                         "last checkpoint (--skip-nonfinite-steps skips and counts such steps)"},
      // Accelerate's defaults as to_json_string() writes them (split_batches true would make the
      // per-device batch the global one: refused).
      {"accelerator_config",
       R"({"dispatch_batches":null,"even_batches":true,"gradient_accumulation_kwargs":null,"non_blocking":false,)"
       R"("split_batches":false,"use_seedable_sampler":true})",
       "anatomy does not use Accelerate; these are its defaults"},
      {"activation_checkpointing", "false", "--gradient-checkpointing says what is recomputed"},
      {"average_tokens_across_devices", "true", "per-token losses are averaged over every rank's labelled tokens"},
      {"batch_eval_metrics", "false", "metrics are computed over the whole evaluation"},
      {"dataloader_drop_last", "false", "the last, smaller batch of an epoch is trained on"},
      {"dataloader_in_order", "true", kLoader},
      {"debug", "", "no PyTorch debug modes"},
      {"enable_jit_checkpoint", "false", "checkpoints are written every --save-steps or epoch"},
      {"eval_delay", "0", "evaluations start with the first --eval-steps"},
      {"eval_do_concat_batches", "true", "metrics are computed over the whole evaluation"},
      {"eval_on_start", "false", "the first evaluation comes after training starts"},
      {"eval_use_gather_object", "false", "metrics are computed over the whole evaluation"},
      {"full_determinism", "false", "CPU runs are deterministic; GPU kernels are not all bit-reproducible"},
      {"hub_always_push", "false", "nothing is uploaded"},
      {"hub_strategy", "*", "nothing is uploaded"},
      {"hub_token", "<hub_token>", "nothing is uploaded"},
      {"hub_private_repo", "*", "nothing is uploaded"},
      {"ignore_data_skip", "false", "resuming skips the batches already seen, exactly"},
      {"include_for_metrics", "", "metrics are computed from the predictions and labels"},
      {"length_column_name", "length", "--group-by-length measures the tokenized samples"},
      {"log_level", "passive", "logs are one line every --logging-steps and metrics.jsonl"},
      {"log_level_replica", "warning", "only rank 0 logs"},
      {"log_on_each_node", "true", "only rank 0 logs"},
      {"prediction_loss_only", "false", "evaluation reports the loss and the task's metrics"},
      {"project", "huggingface", "no tracking integrations"},
      {"restore_callback_states_from_checkpoint", "false", "anatomy has no callbacks"},
      {"save_on_each_node", "false", "rank 0 writes the model; each rank its optimizer shard"},
      {"save_only_model", "false", "checkpoints hold the model, optimizer and trainer state"},
      {"skip_memory_metrics", "true", "memory is always measured: that is anatomy's purpose"},
      {"train_sampling_strategy", "random", "samples are shuffled every epoch with --seed"},
      {"use_cache", "false", "BERT encoders keep no key/value cache"},
      {"use_liger_kernel", "false", "anatomy's kernels are its own"},
  };
  return table;
}

const NeutralValue* neutral_value(const std::string& field, const std::string& raw) {
  std::string v;
  for (char c : raw) v += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const NeutralValue& n : neutral_values()) {
    if (field != n.name) continue;
    const std::string want = n.value;
    bool match = false;
    if (want == "*") {
      match = true;
    } else if (want == "false" || want == "true") {  // HfArgumentParser's spellings of a boolean
      const bool no = v == "false" || v == "no" || v == "n" || v == "f" || v == "0";
      const bool yes = v == "true" || v == "yes" || v == "y" || v == "t" || v == "1";
      match = want == "false" ? no : yes;
    } else if (want.empty() || !(std::isdigit(static_cast<unsigned char>(want[0])) || want[0] == '-')) {
      match = v == want;  // a word (or an empty list), as TrainingArguments writes it
    } else {
      char* end = nullptr;
      const double got = std::strtod(v.c_str(), &end);
      match = !v.empty() && end == v.c_str() + v.size() && got == std::strtod(want.c_str(), nullptr);
    }
    if (match) return &n;
  }
  return nullptr;
}

std::string refusal_reason(const std::string& field) {
  for (const Refusal& r : refused_arguments())
    if (field == r.name) return r.why;
  // By family: the prefix says what part of the Trainer a field configures.
  static const std::vector<std::pair<const char*, const char*>> families = {
      {"hub_", "anatomy does not upload to the Hub"},
      {"push_to_hub", "anatomy does not upload to the Hub"},
      {"fsdp", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"ddp_", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"parallelism_config", "anatomy's data parallelism is its own (--nproc-per-node, --zero-stage)"},
      {"accelerator_config", "anatomy does not use Accelerate"},
      {"average_tokens_across_devices", "per-token losses are always averaged over every rank's labelled tokens"},
      {"torch", "a PyTorch setting; anatomy's kernels are its own"},
      {"jit_mode_eval", "a PyTorch setting; anatomy's kernels are its own"},
      {"use_liger_kernel", "a PyTorch setting; anatomy's kernels are its own"},
      {"liger_kernel_config", "a PyTorch setting; anatomy's kernels are its own"},
      {"use_mps_device", "anatomy runs on CUDA or the CPU"},
      {"tpu_", "anatomy runs on CUDA or the CPU"},
      {"fp16_opt_level", "fp16 is anatomy's own mixed precision (--fp16)"},
      {"fp16_backend", "fp16 is anatomy's own mixed precision (--fp16)"},
      {"half_precision_backend", "fp16 is anatomy's own mixed precision (--fp16)"},
      {"bf16_full_eval", "evaluation computes in the training precision"},
      {"fp16_full_eval", "evaluation computes in the training precision"},
      {"trackio", "no tracking integrations (--report-to jsonl or none)"},
      {"project", "no tracking integrations (--report-to jsonl or none)"},
      {"ray_scope", "no hyperparameter search"},
      {"log", "logs are one line every --logging-steps and metrics.jsonl"},
      {"include_", "evaluation reports the loss and the task's metrics over the whole file"},
      {"eval_", "evaluation runs over the whole validation set with --per-device-eval-batch-size"},
      {"batch_eval_metrics", "evaluation reports the loss and the task's metrics over the whole file"},
      {"prediction_loss_only", "evaluation reports the loss and the task's metrics over the whole file"},
      {"past_index", "BERT encoders keep no past state"},
      {"use_legacy_prediction_loop", "one evaluation loop"},
      {"dataloader_", "one loader thread prepares --dataloader-prefetch batches ahead"},
      {"remove_unused_columns", "the data files' columns are named by --text-column and --label-column"},
      {"label_names", "the label column is --label-column"},
      {"length_column_name", "--group-by-length measures the tokenized samples"},
      {"train_sampling_strategy", "samples are shuffled every epoch with --seed (--group-by-length groups them)"},
      {"save_", "checkpoints hold the model, optimizer, scheduler and RNG state, as safetensors"},
      {"enable_jit_checkpoint", "checkpoints are written every --save-steps or epoch"},
      {"restore_callback_states_from_checkpoint", "anatomy has no callbacks"},
      {"ignore_data_skip", "resuming skips the batches already seen, exactly"},
      {"full_determinism", "CPU runs are deterministic; GPU kernels are not all bit-reproducible"},
      {"gradient_checkpointing_kwargs", "--gradient-checkpointing takes none, layer or selective"},
      {"activation_checkpointing", "--gradient-checkpointing takes none, layer or selective"},
      {"optim_", "--optim takes anatomy's optimizers with their Trainer names and defaults"},
      {"lr_scheduler_kwargs", "the schedules take transformers' default arguments"},
      {"adafactor", "use --optim adafactor"},
      {"neftune_noise_alpha", "no embedding noise"},
      {"use_cache", "BERT encoders keep no key/value cache"},
      {"debug", "no PyTorch debug modes"},
      {"skip_memory_metrics", "memory is always measured: that is anatomy's purpose"},
      {"mp_parameters", "no SageMaker"},
  };
  for (const auto& [prefix, why] : families)
    if (field.rfind(prefix, 0) == 0) return why;
  return "";
}

}  // namespace anatomy::cli
