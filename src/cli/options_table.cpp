// The table itself. An entry's `trainer` column says how it relates to the Hugging Face
// Trainer's argument of that name: "same" (same meaning), "differs: how", or "" (anatomy's own).
#include "cli/options_table.h"

#include <algorithm>
#include <cmath>

#include "cli/parse.h"
#include "core/error.h"
#include "data/csv.h"

namespace anatomy::cli {

bool RunArgs::was_given(const std::string& name) const {
  return std::find(given.begin(), given.end(), name) != given.end();
}

std::string flag(const OptionSpec& s) { return std::string("--") + s.name; }

namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  return str_cat(v);
}

constexpr double kInf = INFINITY;
constexpr double kBig = 1e12;       // steps, counts: far beyond any run, far below overflow
constexpr double kMaxBatch = 1 << 20;

using R = RunArgs;
using V = Value;

std::vector<OptionSpec> build() {
  std::vector<OptionSpec> t;
  auto add = [&](OptionSpec s) { t.push_back(std::move(s)); };
  // ---- model ----
  add({"preset", {}, OptType::Choice, kTrainPlan, "bert-large (bert-tiny without a GPU)",
       "Built-in model, randomly initialized (said at start-up)",
       0, 0, false, false, false, false,
       {{"bert-tiny", "bert-tiny"}, {"bert-mini", "bert-mini"}, {"bert-base", "bert-base"}, {"bert-large", "bert-large"},
        {"roberta-base", "roberta-base"}, {"xlm-roberta-base", "xlm-roberta-base"}, {"distilbert-base", "distilbert-base"},
        {"electra-small", "electra-small"}, {"electra-base", "electra-base"}, {"modernbert-base", "modernbert-base"}},
       [](R& r, const V& v) { r.train.preset = v.s; }});
  add({"model-name-or-path", {}, OptType::Text, kAll, "",
       "A Hugging Face model directory, or a Hub name (org/name) found in the local Hugging Face cache "
       "(HF_HUB_CACHE, HF_HOME) or downloaded into it (HF_ENDPOINT, HF_TOKEN; not with HF_HUB_OFFLINE)",
       0, 0, false, false, false, true, {}, [](R& r, const V& v) { r.train.model_name_or_path = v.s; }, "same"});
  add({"revision", {"model-revision"}, OptType::Text, kTrain | kEval | kPlan, "main",
       "With a Hub name: the branch, tag or commit to use", 0, 0, false, false, false, true, {},
       [](R& r, const V& v) { r.revision = v.s; }, "same (run_glue's model_revision)"});
  add({"num-labels", {}, OptType::Int, kTrainPlan, "2", "Classes of the classification head (presets)", 1, 100000, false,
       false, false, false, {}, [](R& r, const V& v) { r.train.num_labels = v.i; },
       "differs: with a labelled file, must equal the file's number of labels (refused otherwise)"});
  add({"ignore-mismatched-sizes", {}, OptType::Bool, kTrain, "false",
       "A tensor of --model-name-or-path whose shape differs from the model's (a head of another number of labels) "
       "is newly initialized instead of refused",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.train.ignore_mismatched_sizes = v.b; }, "same"});
  add({"tokenizer", {"tokenizer-name"}, OptType::Text, kAll, "the model's",
       "Directory with vocab.txt or tokenizer.json", 0, 0, false, false, false, true, {},
       [](R& r, const V& v) { r.train.tokenizer = v.s; }, "differs: tokenizer_name is a local directory"});
  // ---- task ----
  add({"task", {}, OptType::Choice, kTrainPlan, "text-classification",
       "What to train: text-classification (single-label, regression or multi-label, from the labels), mlm "
       "(masked-language modelling on the texts, as run_mlm.py; BERT, RoBERTa, XLM-R, DistilBERT, ModernBERT; not "
       "ELECTRA) or token-classification "
       "(JSONL with a list of words and of their tags, as run_ner.py: --text-column tokens, --label-column ner_tags)",
       0, 0, false, false, false, false,
       {{"text-classification", "text-classification"}, {"sequence-classification", "text-classification"},
        {"mlm", "mlm"}, {"fill-mask", "mlm"}, {"token-classification", "token-classification"},
        {"ner", "token-classification"}},
       [](R& r, const V& v) { r.train.task = v.s; }});
  add({"line-by-line", {}, OptType::Bool, kTrainPlan | kEval, "false",
       "--task mlm: each text (a .txt file's non-empty line, a record) is a sample, cut to --max-seq-length; false "
       "(run_mlm.py's default): the texts are joined and cut into blocks of --max-seq-length tokens, each 1000 "
       "texts' last partial block dropped",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.train.line_by_line = v.b; }, "same"});
  add({"mlm-probability", {}, OptType::Float, kTrainPlan | kEval, "0.15",
       "--task mlm: the fraction of tokens masked (of them 80% [MASK], 10% a random token, 10% unchanged); eval of a "
       "masked LM: the same, as the run trained", 0.001, 0.999,
       false, true, false, false, {}, [](R& r, const V& v) { r.train.mlm_probability = v.d; }, "same"});
  // ---- data ----
  add({"dataset", {}, OptType::Choice, kTrainPlan, "seed", "Synthetic data without --train-file: seed (random ids) or learnable",
       0, 0, false, false, false, false, {{"seed", "seed"}, {"learnable", "learnable"}},
       [](R& r, const V& v) { r.train.dataset = v.s; }});
  add({"num-samples", {}, OptType::Int, kTrainPlan, "512", "Samples in the synthetic set", 1, 1e8, false, false, false,
       false, {}, [](R& r, const V& v) { r.train.num_samples = v.i; }});
  add({"train-file", {}, OptType::Text, kTrainPlan, "", "Labelled text (.jsonl, .csv, .tsv) to train on", 0, 0, false,
       false, false, true, {}, [](R& r, const V& v) { r.train.train_file = v.s; }, "same"});
  add({"validation-file", {"eval-file"}, OptType::Text, kAll, "",
       "Labelled text to evaluate on (train: every --eval-strategy, and at the end unless --do-eval false with no "
       "--eval-strategy; eval: the file evaluated)",
       0, 0, false, false, false, true, {}, [](R& r, const V& v) { r.train.validation_file = v.s; }, "same"});
  add({"validation-split", {}, OptType::Float, kTrainPlan, "0", "Hold out this fraction of the training data", 0, 1, false,
       true, false, false, {}, [](R& r, const V& v) { r.train.validation_split = v.d; }});
  add({"validation-split-percentage", {}, OptType::Int, kTrainPlan, "5 (--task mlm)",
       "--task mlm without --validation-file or --validation-split: the first N% of --train-file's rows validate and "
       "the rest train, as run_mlm.py splits train[:N%] (0: train on every row, no validation)", 0, 99, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.validation_split_percentage = static_cast<int>(v.i); }, "same"});
  add({"text-column", {"text-column-name"}, OptType::Text, kAll, "text", "Column (JSON key or CSV header) holding the text; when no text column is named and the file "
       "has no 'text', run_glue.py's: sentence1 and sentence2, else the first one or two columns beside the label "
       "(--task mlm: run_mlm.py's first column; token-classification: 'tokens', else run_ner.py's first column)",
       0, 0, false, false, false, true, {}, [](R& r, const V& v) { r.train.text_column = v.s; }});
  add({"text-pair-column", {}, OptType::Text, kAll, "", "Column of the second text of a pair", 0, 0, false, false, false,
       false, {}, [](R& r, const V& v) { r.train.text_pair_column = v.s; }});
  add({"text-column-names", {}, OptType::Text, kAll, "text",
       "run_classification.py's comma-separated text columns, their values joined by a space into one text (Note "
       "[joined text columns]; --text-column and --text-pair-column make a pair)", 0, 0, false, false, false, true, {},
       [](R& r, const V& v) {
         std::string names = v.s;
         std::replace(names.begin(), names.end(), ',', kColumnJoin);
         for (const std::string& c : joined_columns(names))
           ANATOMY_CHECK(!c.empty(), "--text-column-names ", v.s, ": an empty column name");
         r.train.text_column = names;
       },
       "same"});
  add({"text-column-delimiter", {}, OptType::Text, kAll, "\" \"",
       "run_classification.py's: what joins --text-column-names' values; a space, its default, is the one taken", 0, 0,
       false, false, false, false, {},
       [](R&, const V& v) {
         ANATOMY_CHECK(v.s == " ", "--text-column-delimiter '", v.s,
                       "': the columns are joined with a space here (run_classification.py's default)");
       },
       "differs: a space only"});
  add({"label-column", {"label-column-name"}, OptType::Text, kAll, "label",
       "Column holding the label (integers or class names; token-classification: 'ner_tags', else run_ner.py's "
       "second column); eval: empty for predictions only", 0, 0, false, false, false,
       false, {}, [](R& r, const V& v) { r.train.label_column = v.s; }, "same"});
  add({"max-seq-length", {"seq-len"}, OptType::Int, kAll,
       "min(128, max_position_embeddings); --task mlm and token-classification: min(1024, max_position_embeddings)",
       "Longest sample in tokens (longer ones are truncated); synthetic data: the sequence length", 2, 1 << 20, false,
       false, false, false, {}, [](R& r, const V& v) { r.train.seq_len = v.i; },
       "same (run_glue.py's and run_classification.py's 128; run_mlm.py's and run_ner.py's the tokenizer's limit, "
       "run_mlm.py capping it at 1024, here run_ner.py's too)"});
  add({"dataset-cache-dir", {}, OptType::Text, kAll, "beside the data file", "Where the tokenized cache goes", 0, 0,
       false, false, false, true, {}, [](R& r, const V& v) { r.train.dataset_cache_dir = v.s; }});
  // run_glue.py's data flags where their value is what anatomy does anyway; the other is refused.
  add({"pad-to-max-length", {}, OptType::Bool, kAll, "false",
       "run_glue.py's: false pads each batch to its longest sample, as anatomy always does; true (every batch "
       "padded to --max-seq-length: the same results, computed on padding) is refused",
       0, 0, false, false, false, false, {},
       [](R&, const V& v) {
         if (v.b)
           throw UsageError("--pad-to-max-length true: not supported by anatomy: batches are padded to their longest "
                            "sample (the same results, without computing on padding); drop it or pass false");
       },
       "differs: run_glue.py's default is true"});
  add({"overwrite-cache", {}, OptType::Bool, kAll, "false",
       "run_glue.py's: accepted either way; the token cache is keyed by the text file's bytes and the tokenizer, "
       "so a cache that is reused holds exactly what tokenizing again would make",
       0, 0, false, false, false, false, {}, [](R&, const V&) {}, "differs: nothing stale is ever reused"});
  add({"use-fast-tokenizer", {}, OptType::Bool, kAll, "true",
       "run_glue.py's: true, anatomy's tokenizer reads tokenizer.json (or vocab.txt) as the fast tokenizers do; "
       "false (a slow Python tokenizer) is refused",
       0, 0, false, false, false, false, {},
       [](R&, const V& v) {
         if (!v.b)
           throw UsageError("--use-fast-tokenizer false: not supported by anatomy: its tokenizer reads tokenizer.json "
                            "(or vocab.txt) as the fast tokenizers do; drop it or pass true");
       },
       "same"});
  add({"shuffle-train-dataset", {}, OptType::Bool, kTrainPlan, "false",
       "run_classification.py's: accepted either way; the training samples are shuffled every epoch with --seed",
       0, 0, false, false, false, false, {}, [](R&, const V&) {}, "differs: the order is shuffled every epoch regardless"});
  add({"group-by-length", {}, OptType::Bool, kTrainPlan, "false", "Batch samples of similar length together", 0, 0,
       false, false, false, false, {}, [](R& r, const V& v) { r.train.group_by_length = v.b; }, "same"});
  add({"dataloader-prefetch", {"dataloader-prefetch-factor"}, OptType::Int, kTrainPlan, "2",
       "Batches prepared ahead by the loader thread", 1, 64, false, false, false, false, {},
       [](R& r, const V& v) { r.train.prefetch = static_cast<int>(v.i); },
       "differs: batches ahead of one loader thread (no worker processes)"});
  // ---- loop ----
  add({"do-train", {}, OptType::Bool, kTrain, "true", "Train (anatomy train always trains: false, TrainingArguments' default in a dumped arguments file, is said and "
       "trains)", 0, 0,
       false, false, false, false, {}, [](R& r, const V& v) { r.do_train = v.b; },
       "differs: implied by `anatomy train`"});
  add({"do-eval", {}, OptType::Bool, kTrain, "true with validation data",
       "Evaluate on the validation data at the end (eval_results.json); false: no evaluation, unless an "
       "--eval-strategy evaluates (then the end is evaluated too, as the Trainer turns do_eval on for any eval_strategy)",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.do_eval = v.b; },
       "differs: on whenever there is validation data (false turns it off)"});
  add({"do-predict", {}, OptType::Bool, kTrain, "false",
       "After training, predict --test-file's labels into predict_results.txt (index, prediction)", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { r.do_predict = v.b; }, "same"});
  add({"test-file", {}, OptType::Text, kTrain, "", "Text (.jsonl, .csv, .tsv) to predict with --do-predict; labels ignored",
       0, 0, false, false, false, true, {}, [](R& r, const V& v) { r.train.test_file = v.s; }, "same"});
  add({"per-device-train-batch-size", {"batch-size"}, OptType::Int, kTrainPlan, "8",
       "Micro-batch size, or auto: the largest that the memory plan fits on the GPU", 1, kMaxBatch, false, false, true,
       false, {}, [](R& r, const V& v) { r.train.per_device_train_batch_size = v.i; },
       "same (plus auto, as auto_find_batch_size from the plan)"});
  add({"per-device-eval-batch-size", {}, OptType::Int, kAll, "8", "Evaluation batch", 1, kMaxBatch, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.per_device_eval_batch_size = v.i; }, "same"});
  add({"batch-size", {}, OptType::Int, kEval, "8", "Same as --per-device-eval-batch-size", 1, kMaxBatch, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.per_device_eval_batch_size = v.i; }});
  add({"gradient-accumulation-steps", {}, OptType::Int, kTrainPlan, "1", "Micro-batches per optimizer step", 1,
       kMaxBatch, false, false, false, false, {},
       [](R& r, const V& v) { r.train.gradient_accumulation_steps = v.i; }, "same"});
  add({"num-train-epochs", {}, OptType::Float, kTrainPlan, "1", "Epochs; a fraction trains ceil(epochs x steps per epoch) steps",
       0, 1e6, true, false, false, false, {},
       [](R& r, const V& v) {
         r.train.train_epochs = v.d;
         r.train.num_train_epochs = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(v.d)));
       },
       "differs: default 1 (Trainer: 3)"});
  add({"max-steps", {}, OptType::Int, kTrainPlan, "-1", "Optimizer steps (overrides epochs when > 0)", -1, kBig, false,
       false, false, false, {}, [](R& r, const V& v) { r.train.max_steps = v.i; }, "same"});
  add({"seed", {}, OptType::Int, kTrainPlan | kEval, "42",
       "Seed of initialization, data order and dropout; eval of a masked LM: the seed of the masks, which with the "
       "run's own seed and --mlm-probability are its --validation-file's", 0, 4294967295.0,
       false, false, false, false, {}, [](R& r, const V& v) { r.train.seed = static_cast<uint64_t>(v.i); }, "same"});
  add({"data-seed", {}, OptType::Int, kTrainPlan, "--seed", "Seed of the data order; anatomy has one seed, so it must equal --seed",
       0, 4294967295.0, false, false, false, false, {},
       [](R& r, const V& v) { r.data_seed = v.i; },
       "differs: one seed for initialization and data order; data_seed sets it when seed is not given"});
  // ---- optimizer and schedule ----
  add({"optim", {}, OptType::Choice, kTrainPlan, "adamw_torch", "Optimizer", 0, 0, false, false, false, false,
       {{"adamw_torch", "adamw"}, {"adamw_torch_fused", "adamw"}, {"adamw_hf", "adamw"}, {"adamw", "adamw"},
        {"adamw_bnb_8bit", "adamw-8bit"}, {"adamw_8bit", "adamw-8bit"}, {"adamw-8bit", "adamw-8bit"}, {"sgd", "sgd"},
        {"adafactor", "adafactor"}},
       [](R& r, const V& v) { r.optim = v.s; },
       "differs: adamw_torch/adamw_torch_fused/adamw_hf are one fused AdamW; adamw_bnb_8bit/adamw_8bit anatomy's own "
       "blockwise 8-bit AdamW"});
  add({"learning-rate", {}, OptType::Float, kTrainPlan, "5e-05", "Peak learning rate", 0, 1e6, false, false, false, false,
       {}, [](R& r, const V& v) { r.train.learning_rate = static_cast<float>(v.d); }, "same"});
  add({"weight-decay", {}, OptType::Float, kTrainPlan, "0", "Decoupled weight decay (not on biases and LayerNorm)", 0,
       10, false, false, false, false, {}, [](R& r, const V& v) { r.train.optim.weight_decay = static_cast<float>(v.d); },
       "same"});
  add({"adam-beta1", {}, OptType::Float, kTrainPlan, "0.9", "AdamW beta1", 0, 1, false, true, false, false, {},
       [](R& r, const V& v) { r.train.optim.beta1 = static_cast<float>(v.d); }, "same"});
  add({"adam-beta2", {}, OptType::Float, kTrainPlan, "0.999", "AdamW beta2", 0, 1, false, true, false, false, {},
       [](R& r, const V& v) { r.train.optim.beta2 = static_cast<float>(v.d); }, "same"});
  add({"adam-epsilon", {}, OptType::Float, kTrainPlan, "1e-08", "AdamW epsilon", 0, 1, false, false, false, false, {},
       [](R& r, const V& v) { r.train.optim.eps = static_cast<float>(v.d); }, "same"});
  add({"sgd-momentum", {}, OptType::Float, kTrainPlan, "0",
       "SGD momentum: 0 (torch.optim.SGD's default, the Trainer's --optim sgd) keeps no momentum buffer; "
       "0.9 keeps one (4 bytes/param)",
       0, 1, false, true, false, false, {},
       [](R& r, const V& v) { r.train.optim.momentum = static_cast<float>(v.d); }});
  add({"lr-scheduler-type", {}, OptType::Choice, kTrainPlan, "linear", "Learning-rate schedule after the warm-up", 0, 0,
       false, false, false, false,
       {{"linear", "linear"}, {"cosine", "cosine"}, {"cosine_with_restarts", "cosine"}, {"polynomial", "polynomial"},
        {"constant", "constant-no-warmup"}, {"constant_with_warmup", "constant"}},
       [](R& r, const V& v) {
         r.schedule_without_warmup = v.s == "constant-no-warmup";
         r.train.lr_scheduler_type = parse_schedule(r.schedule_without_warmup ? "constant" : v.s);
       },
       "same for linear, cosine, cosine_with_restarts (one cycle), polynomial (power 1, lr_end 1e-7), constant and "
       "constant_with_warmup; the others are refused"});
  add({"warmup-steps", {}, OptType::Float, kTrainPlan, "0",
       "Linear warm-up: a whole number of steps, or a value below 1 as a fraction of the total steps", 0, kBig, false,
       false, false, false, {}, [](R& r, const V& v) { r.warmup_steps = v.d; }, "same (Trainer 5's: a ratio below 1)"});
  add({"warmup-ratio", {}, OptType::Float, kTrainPlan, "0", "Warm-up as a fraction of the total steps (when --warmup-steps is 0)",
       0, 1, false, false, false, false, {}, [](R& r, const V& v) { r.train.warmup_ratio = v.d; }, "same"});
  add({"max-grad-norm", {}, OptType::Float, kTrainPlan, "1", "Gradient clipping norm (0: off)", 0, 1e6, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.max_grad_norm = static_cast<float>(v.d); }, "same"});
  // ---- precision, memory, device ----
  add({"precision", {}, OptType::Choice, kAll, "fp32",
       "Compute precision (mixed precision keeps fp32 master weights; fp8: the encoder layers' Linear layers in "
       "E4M3/E5M2 with delayed scaling, the rest in bf16, on Hopper GPUs; on the CPU the same rounding, in fp32)",
       0, 0, false, false, false, false,
       {{"fp32", "fp32"}, {"tf32", "tf32"}, {"bf16", "bf16"}, {"fp16", "fp16"}, {"fp8", "fp8"}},
       [](R& r, const V& v) { r.precision = v.s; }});
  add({"fp8-format", {}, OptType::Choice, kTrain, "hybrid",
       "With --precision fp8, the output gradients' format: hybrid (E5M2, the inputs and weights E4M3) or e4m3 "
       "(every operand E4M3); Transformer Engine's Format.HYBRID and Format.E4M3",
       0, 0, false, false, false, false, {{"hybrid", "hybrid"}, {"e4m3", "e4m3"}},
       [](R& r, const V& v) { r.train.fp8_grads = v.s == "e4m3" ? Fp8Format::E4M3 : Fp8Format::E5M2; }});
  add({"bf16", {}, OptType::Bool, kAll, "false", "bf16 mixed precision (same as --precision bf16)", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { r.bf16 = v.b; }, "same"});
  add({"fp16", {}, OptType::Bool, kAll, "false", "fp16 mixed precision with a dynamic loss scale", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { r.fp16 = v.b; }, "same"});
  add({"tf32", {}, OptType::Bool, kAll, "false", "TF32 matrix multiplies (same as --precision tf32)", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { r.tf32 = v.b; }, "differs: not combined with --bf16/--fp16"});
  add({"gradient-checkpointing", {}, OptType::Choice, kTrainPlan, "none",
       "Recompute activations in backward: none, layer (true) or selective", 0, 0, false, false, false, false,
       {{"none", "none"}, {"false", "none"}, {"layer", "layer"}, {"true", "layer"}, {"selective", "selective"}},
       [](R& r, const V& v) { r.checkpointing = v.s; }, "same (true: every layer), plus selective"});
  add({"gemm-tuning", {}, OptType::Choice, kTrain, "off",
       "measure: after the first step, time cuBLASLt's other algorithms for each of that step's matrix products (in "
       "the idle activation memory) and keep one that is 3% faster than the library's pick; the choices go to "
       "OUTPUT_DIR/gemm_tuning.md. Another algorithm sums in another order: runs are then not bitwise equal to "
       "untuned ones or, where timings differ, to each other (GPU only)",
       0, 0, false, false, false, false, {{"off", "off"}, {"measure", "measure"}},
       [](R& r, const V& v) { r.train.gemm_tuning = v.s == "measure"; }});
  add({"gradient-placement", {}, OptType::Choice, kTrainPlan, "auto",
       "Where fp32 gradients live: own, in-activations (one micro-batch per step only) or auto", 0, 0, false, false,
       false, false, {{"auto", "auto"}, {"own", "own"}, {"in-activations", "in-activations"}},
       [](R& r, const V& v) { r.train.gradient_placement = v.s; }});
  add({"device", {}, OptType::Choice, kAll, "auto", "auto (the GPU when present), cpu or cuda", 0, 0, false, false, false,
       false, {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}}, [](R& r, const V& v) {
         r.train.device = v.s == "cpu" ? DeviceChoice::Cpu : v.s == "cuda" ? DeviceChoice::Cuda : DeviceChoice::Auto;
       }});
  add({"use-cpu", {"no-cuda"}, OptType::Bool, kAll, "false", "Run on the CPU (same as --device cpu)", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { if (v.b) r.train.device = DeviceChoice::Cpu; }, "same"});
  add({"nproc-per-node", {"world-size"}, OptType::Int, kTrainPlan, "1", "Data-parallel ranks, one per device", 1, 1024, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.nproc_per_node = static_cast<int>(v.i); }});
  add({"zero-stage", {}, OptType::Int, kTrainPlan, "1 (0 for adafactor, adamw_8bit)",
       "With several ranks: 0 replicated optimizer state, 1 sharded (ZeRO-1), 2 sharded state and gradients (ZeRO-2); "
       "1 and 2 shard adamw and sgd only", 0, 2, false, false, false, false,
       {}, [](R& r, const V& v) { r.train.zero_stage = static_cast<int>(v.i); }});
  add({"ddp-bucket-cap-mb", {}, OptType::Int, kTrain, "25",
       "With several ranks: gradients are reduced while backward runs, in buckets of this many MiB (0: each layer)",
       0, 65536, false, false, false, false, {},
       [](R& r, const V& v) { r.train.ddp_bucket_cap_mb = static_cast<int>(v.i); }, "same"});
  add({"ddp-timeout", {}, OptType::Int, kTrain, "300",
       "With several ranks: seconds a collective waits for the others before the job ends with an error "
       "(ANATOMY_DIST_TIMEOUT, when set, wins)",
       1, 1 << 30, false, false, false, false, {}, [](R& r, const V& v) { r.ddp_timeout = v.i; },
       "differs: default 300 s (Trainer: 1800)"});
  add({"threads", {}, OptType::Int, kAll, "0", "CPU threads (0: all cores)", 0, 4096, false, false, false, false, {},
       [](R& r, const V& v) { r.train.threads = static_cast<int>(v.i); }});
  // ---- evaluation ----
  add({"eval-strategy", {"evaluation-strategy"}, OptType::Choice, kTrainPlan, "no",
       "Evaluate on the validation data: no, steps (every --eval-steps) or epoch; and once at the end", 0, 0, false, false,
       false, false, {{"no", "no"}, {"steps", "steps"}, {"epoch", "epoch"}},
       [](R& r, const V& v) {
         r.train.eval_strategy = v.s == "steps" ? Cadence::Steps : v.s == "epoch" ? Cadence::Epoch : Cadence::No;
       }, "same"});
  add({"eval-steps", {}, OptType::Float, kTrainPlan, "0",
       "Steps between evaluations (0: --logging-steps; below 1: that fraction of the total steps, rounded up)", 0, kBig,
       false, false, false, false, {}, [](R& r, const V& v) { r.eval_steps = v.d; }, "same"});
  add({"skip-padding", {}, OptType::Bool, kAll, "true",
       "Compute on real tokens only (eval; train with a text file, Note [packed training]); --no-skip-padding: padded",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.skip_padding = v.b; }});
  add({"sort-by-length", {}, OptType::Bool, kEval, "true", "Batch the longest samples first (--no-sort-by-length: file order)",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.sort_by_length = v.b; }});
  // ---- output ----
  add({"output-dir", {}, OptType::Text, kAll, "runs/train (eval: print only)",
       "Where results, metrics.jsonl, checkpoints and the model go", 0, 0, false, false, false, true, {},
       [](R& r, const V& v) { r.train.output_dir = v.s; }, "same"});
  add({"overwrite-output-dir", {}, OptType::Bool, kTrain | kEval, "false",
       "Replace a previous run (eval: evaluation) in --output-dir: its checkpoints go at the new run's first write, "
       "its model and results when the new run writes its own", 0, 0, false,
       false, false, false, {}, [](R& r, const V& v) { r.train.overwrite_output_dir = v.b; }, "same"});
  add({"skip-nonfinite-steps", {}, OptType::Bool, kTrain, "false",
       "Skip (and count) steps whose loss or gradient norm is not finite instead of stopping", 0, 0, false, false,
       false, false, {}, [](R& r, const V& v) { r.train.skip_nonfinite_steps = v.b; }});
  add({"logging-steps", {}, OptType::Float, kTrainPlan, "50",
       "Log every N steps (0: summary only; below 1: that fraction of the total steps, rounded up)", 0, kBig, false,
       false, false, false, {}, [](R& r, const V& v) { r.logging_steps = v.d; }, "differs: default 50 (Trainer: 500)"});
  add({"logging-first-step", {}, OptType::Bool, kTrain, "false", "Also log the first step", 0, 0, false, false, false,
       false, {}, [](R& r, const V& v) { r.train.logging_first_step = v.b; }, "same"});
  add({"logging-strategy", {}, OptType::Choice, kTrain, "steps", "steps: a line every --logging-steps; no: the summary only",
       0, 0, false, false, false, false, {{"steps", "steps"}, {"no", "no"}},
       [](R& r, const V& v) { r.logging_strategy = v.s; }, "differs: epoch is refused"});
  add({"report-to", {}, OptType::Choice, kTrain, "jsonl", "Where logs go besides stdout: jsonl (metrics.jsonl) or none",
       0, 0, false, false, false, false, {{"jsonl", "jsonl"}, {"none", "none"}},
       [](R& r, const V& v) {
         r.report_to = v.s;
         r.train.report_jsonl = v.s != "none";
       },
       "differs: jsonl (metrics.jsonl in --output-dir) or none; other integrations are refused"});
  add({"save-strategy", {}, OptType::Choice, kTrainPlan, "final",
       "final: the model at the end; steps: also a checkpoint every --save-steps; epoch: also one per epoch; no: nothing",
       0, 0, false, false, false, false, {{"final", "final"}, {"no", "no"}, {"steps", "steps"}, {"epoch", "epoch"}},
       [](R& r, const V& v) { r.save_strategy = v.s; },
       "differs: default final (the model, no checkpoints); no saves nothing, not even the final model"});
  add({"save-steps", {}, OptType::Float, kTrainPlan, "500",
       "Steps between checkpoints (--save-strategy steps; below 1: that fraction of the total steps, rounded up)", 0,
       kBig, true, false, false, false, {}, [](R& r, const V& v) { r.save_steps = v.d; }, "same"});
  add({"save-total-limit", {}, OptType::Int, kTrainPlan, "0", "Keep only the newest N checkpoints (0: all)", 0, kBig,
       false, false, false, false, {}, [](R& r, const V& v) { r.train.save_total_limit = v.i; }, "same"});
  add({"load-best-model-at-end", {}, OptType::Bool, kTrain, "false",
       "Keep the checkpoint best by --metric-for-best-model (whatever --save-total-limit) and end with its weights; "
       "needs --eval-strategy equal to --save-strategy",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.train.load_best_model_at_end = v.b; }, "same"});
  add({"metric-for-best-model", {}, OptType::Choice, kTrain, "loss",
       "What makes a checkpoint best: one of the task's metrics (as the Trainer, given one it tracks the best "
       "checkpoint, keeps it whatever --save-total-limit and names it in trainer_state.json; "
       "--load-best-model-at-end ends with its weights)",
       0, 0, false, false, false, false,
       {{"loss", "eval_loss"}, {"eval_loss", "eval_loss"}, {"accuracy", "eval_accuracy"}, {"eval_accuracy", "eval_accuracy"},
        {"macro_f1", "eval_macro_f1"}, {"eval_macro_f1", "eval_macro_f1"}, {"mse", "eval_mse"}, {"eval_mse", "eval_mse"},
        {"pearson", "eval_pearson"}, {"eval_pearson", "eval_pearson"}, {"micro_f1", "eval_micro_f1"},
        {"eval_micro_f1", "eval_micro_f1"}, {"f1", "eval_f1"}, {"eval_f1", "eval_f1"}, {"precision", "eval_precision"},
        {"eval_precision", "eval_precision"}, {"recall", "eval_recall"}, {"eval_recall", "eval_recall"}},
       [](R& r, const V& v) { r.train.metric_for_best_model = v.s; },
       "differs: the metrics anatomy computes (loss, accuracy, macro_f1; regression mse, pearson; multi-label f1 "
       "and micro_f1; "
       "token classification precision, recall, f1, accuracy; masked LM accuracy), refused before the first step when "
       "the task does not compute it"});
  add({"greater-is-better", {}, OptType::Bool, kTrain, "false for loss, else true", "Whether a larger metric is better",
       0, 0, false, false, false, false, {}, [](R& r, const V& v) { r.greater_is_better = v.b; }, "same"});
  add({"resume-from-checkpoint", {}, OptType::Text, kTrain, "",
       "Continue from a checkpoint directory, or latest (the newest in --output-dir; true, as the Trainer's "
       "resume_from_checkpoint=True, means the same; false: no resume)",
       0, 0, false, false, false, true, {},
       [](R& r, const V& v) {
         const bool yes = v.s == "true" || v.s == "True", no = v.s == "false" || v.s == "False";
         r.train.resume_from_checkpoint = yes ? "latest" : no ? "" : v.s;
       },
       "same (a path, or true for the newest); latest names the newest too"});
  add({"disable-tqdm", {}, OptType::Bool, kTrain, "false", "No progress bar on a terminal", 0, 0, false, false, false,
       false, {}, [](R& r, const V& v) { r.train.disable_progress_bar = v.b; }, "same"});
  // ---- anatomy's own ----
  add({"seed-experiment", {}, OptType::Bool, kTrainPlan, "false",
       "The 'Model training anatomy' experiment: bert-large, seq 512, 512 samples, batch 4, fp32, one epoch "
       "(bert-tiny without a GPU)", 0, 0, false, false, false, false, {},
       [](R& r, const V& v) { r.seed_experiment = v.b; }});
  add({"trace-memory-growth", {}, OptType::Bool, kTrain, "false",
       "GPU: report which ops of the first step grew NVML's used memory", 0, 0, false, false, false, false, {},
       [](R& r, const V& v) { r.train.trace_memory_growth = v.b; }});
  add({"profile-steps", {}, OptType::Int, kTrain, "0", "After training, time every op of N more steps (profile.json)", 0,
       1e6, false, false, false, false, {}, [](R& r, const V& v) { r.train.profile_steps = v.i; }});
  add({"gpu-memory", {}, OptType::Size, kPlan, "the GPU present",
       "Plan for a GPU of this size, with its unit: 16GiB, 80GB, 16000MiB", 0, 0, false, false, false, false, {},
       [](R& r, const V& v) { r.gpu_memory = v.i; }});
  return t;
}

}  // namespace

const std::vector<OptionSpec>& options() {
  static const std::vector<OptionSpec> table = build();
  return table;
}

std::string range_text(const OptionSpec& s) {
  if (s.type != OptType::Int && s.type != OptType::Float) return "";
  std::string r = str_cat(s.lo_open ? "(" : "[", number(s.lo), ", ", number(s.hi), s.hi_open ? ")" : "]");
  if (s.auto_ok) r += " or auto";
  return r;
}

}  // namespace anatomy::cli
