// Training checkpoints (--save-strategy, --save-steps, --save-total-limit,
// --resume-from-checkpoint): everything a run needs to continue bitwise identically.
//
// Note [checkpoint directory]: OUTPUT_DIR/checkpoint-<step>/ holds
//   config.json, model.safetensors  the F32 master weights under Hugging Face names
//                                   (save_pretrained: loadable by transformers as is);
//   optimizer.safetensors           every tensor of Optimizer::state(), raw bytes with their
//                                   dtype and shape; metadata "optimizer" (its kind) and
//                                   "steps" (the optimizer's step count);
//   anatomy_state.json              {"format_version", "step", "optimizer", "optimizer_steps",
//                                    "files": {name: {"bytes", "checksum"}}, "trainer": <the
//                                    trainer's JSON, verbatim>} (trainer_state.json in
//                                    checkpoints written before 2026-11-29, still read);
//   trainer_state.json              the Trainer's TrainerState, for the tools that read it
//                                   (Note [two state files] in checkpoints.cpp).
// Under ZeRO stage 1 (Note [optimizer shards]) optimizer.safetensors is replaced by one file per
// rank, optimizer-shard-<r>.safetensors, each holding elements [begin, end) of every flat state
// tensor, listed in anatomy_state.json as "optimizer_shards": [{"file", "begin", "end"}].
// The directory is written as "checkpoint-<step>.tmp-XXXXXX", every file fsynced, then renamed
// into place (AtomicDir), so a checkpoint-<step> directory is complete or absent, whenever the
// process dies. "files" records each file's size and a checksum: listing (latest_checkpoint)
// checks the sizes, loading checks the checksums too, so truncation or corruption after the
// fact is a clear error rather than a silently different run.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "model/encoder.h"
#include "optim/optimizer.h"

namespace anatomy {

inline constexpr int kCheckpointFormatVersion = 1;

// Writes OUTPUT_DIR/checkpoint-<step>/ (Note [checkpoint directory]), replacing one of the same
// step atomically, with the tokenizer's files (save_tokenizer_into: a checkpoint loads with
// transformers as it is) and `hf_state` as its trainer_state.json (null: none). Returns the
// checkpoint's path.
std::string save_training_checkpoint(const std::string& output_dir, int64_t step, EncoderModel& model,
                                     Optimizer& opt, const nlohmann::json& trainer_state,
                                     const TokenizerFiles& tokenizer = {},
                                     const nlohmann::json& hf_state = nullptr);

// Copies each of the tokenizer's files into `dir` under its own name, atomically (a file already
// there as itself is left), then writes its tokenizer_config.json when it has one of its own.
void save_tokenizer_into(const std::string& dir, const TokenizerFiles& tokenizer);

// Note [optimizer shards]: AdamW's and SGD's state is flat over the parameter layout, so a ZeRO
// shard is a range of it. A rank's part of the state is the whole state (a world of one, ZeRO
// stage 0: rank 0 writes it) or the range [begin, end) (stage 1: each rank writes its own file).
// Loading assembles any range from any saved form, so a run resumes on another number of ranks
// or another stage; the optimizers whose state follows parameter shapes (Adafactor, 8-bit AdamW)
// only ever have the whole form.
struct OptimizerPart {
  bool sharded = false;
  size_t begin = 0, end = 0;  // sharded only
};

// The same, collectively over `comm` (every rank calls it with the same step and state): rank 0
// writes the model and the state files, each rank its part of the optimizer state; the
// directory appears whole once every part is written. Returns the checkpoint's path.
std::string save_training_checkpoint(const std::string& output_dir, int64_t step, EncoderModel& model,
                                     Optimizer& opt, const nlohmann::json& trainer_state, Communicator& comm,
                                     const OptimizerPart& part, const TokenizerFiles& tokenizer = {},
                                     const nlohmann::json& hf_state = nullptr);

// Keeps the newest `limit` complete checkpoint-<step> directories of output_dir by step (limit
// <= 0: keeps all) and removes the older ones, each renamed to a hidden ".trash-..." name first
// so no half-removed directory ever looks like a checkpoint. Also removes leftovers of crashed
// runs: staging ("checkpoint-<step>.tmp-*", ".old-*") and trash directories. Directories named
// checkpoint-<step> that are not complete checkpoints are left alone. `keep` (the best checkpoint,
// Note [best model]) is never removed: the newest limit - 1 others stay beside it (at least one,
// the newest, to resume from), as the Trainer keeps its best checkpoint.
void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& keep = "");

// The complete checkpoint of output_dir with the highest step (numeric: 10 beats 9), or nullopt.
// Complete: anatomy_state.json parses, names the step of the directory's name, and every file it
// lists is there with its recorded size. `skipped`: the newer ones passed over, with why.
std::optional<std::string> latest_checkpoint(const std::string& output_dir, std::vector<std::string>* skipped = nullptr);

// --resume-from-checkpoint: "latest" is latest_checkpoint(output_dir) (the newer checkpoints it
// passed over, with why, into `skipped`); anything else must be a complete checkpoint directory.
// Errors name the flag (and the path).
std::string resolve_resume_path(const std::string& arg, const std::string& output_dir,
                                std::vector<std::string>* skipped = nullptr);

// Loads a checkpoint into the model's master weights (and its compute copy) and the optimizer's
// state and step count; returns the trainer's JSON. Everything is read and checked first (sizes,
// checksums, config, optimizer kind, every tensor's dtype and shape), then applied: a failure is
// a one-line error naming the file and leaves model and optimizer untouched. The trainer's JSON
// is checked by validate_trainer_state, and the step against the directory's name.
nlohmann::json load_training_checkpoint(const std::string& dir, EncoderModel& model, Optimizer& opt);
// The same for a rank whose optimizer holds `part` of the state (Note [optimizer shards]).
nlohmann::json load_training_checkpoint(const std::string& dir, EncoderModel& model, Optimizer& opt,
                                        const OptimizerPart& part);

// The trainer's part of anatomy_state.json (`file`), field by field (Note [trainer state checks]):
// global_step, skipped_steps, samples, window_samples, loss_scale_clean_steps non-negative
// integers; loss_sum, first_step_loss, window_loss finite; loss_scale positive; fingerprint an
// object; global_step equal to `step` and to optimizer_steps + skipped_steps; micro_batches, when
// present, global_step steps of 1 to the fingerprint's --gradient-accumulation-steps. load_training_checkpoint
// calls it; one-line errors name the file and the field.
void validate_trainer_state(const nlohmann::json& trainer, const std::string& file, int64_t step, int64_t optimizer_steps);

// The step of a checkpoint directory's name ("checkpoint-12" -> 12), or nullopt.
std::optional<int64_t> checkpoint_step_of(const std::string& name);

// The checksum anatomy_state.json records for a file (Note [checkpoint checksum]), 16 hex digits.
std::string checkpoint_file_checksum(const std::string& path);

}  // namespace anatomy
