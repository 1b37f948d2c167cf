// The interface every encoder model class implements (Note [encoder model]): what the trainer
// (train/*), data parallelism (dist/zero.h), checkpoints and evaluation call on a model, so that
// one training loop trains BertForSequenceClassification (bert.h: BERT, RoBERTa, XLM-R,
// DistilBERT, ELECTRA) and ModernBertForSequenceClassification (modernbert.h) alike.
//
// Note [encoder model]
// A model owns its flat parameter buffers (Note [flat parameter layout], model/params.h): the
// fp32 master weights, a compute-dtype copy (the master itself in F32) and the fp32 gradients,
// plus its activation and scratch arenas, all from the backend's allocator under the categories
// the planner (memory/planner.h) predicts. make_model picks the class from config.json's
// model_type (BertConfig::architecture).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memory/allocator.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/backend.h"

namespace anatomy {

// What forward keeps for backward (--gradient-checkpointing).
//   None:      every tensor backward needs.
//   Layer:     only each layer's input; backward re-runs the layer's forward first (keeping its
//              GELU output in backward's scratch, as Selective does).
//   Selective: everything except the GELU output (B*T x intermediate per layer), which
//              backward recomputes from the saved pre-activation: one cheap element-wise op
//              buys back about a quarter of the activation memory. The first ceil(L / 12)
//              layers keep no pre-activation either (one FFN-in GEMM each in backward, Note [recomputed
//              FFN input] in bert.cpp).
enum class CheckpointPolicy : uint8_t { None, Layer, Selective };

const char* checkpoint_policy_name(CheckpointPolicy p);
CheckpointPolicy parse_checkpoint_policy(const std::string& s);  // throws with the flag name

// The (query, key) pairs of a right-padded packed batch, the packed attention's cost: every query
// of each sequence on its keys (the sum of the squared lengths), and its first query alone (the
// sum of the lengths: Note [attention scope] in ops/op_args.h).
struct AttendedPairs {
  int64_t every = 0, first = 0;
  // The pairs of a scope asking for every query (0) or the first (1).
  int64_t of(int queries) const;
};

// A batch on the backend's device: ids, token types and mask I32 [B, T]; labels I32 [B], or F32
// [B, num_labels] for regression and multi-label (Note [problem types] in model/heads.h).
// forward_eval computes on the tokens alone when the packing index is given (Note [packed
// inference] in bert.cpp): token_rows I32 [N], the rows b*T + t to compute, and first_rows I32
// [B], where each sequence's row b*T sits in token_rows. pack_token_rows builds both.
struct DeviceBatch {
  Tensor input_ids, token_type_ids, attention_mask, labels;
  Tensor token_rows{}, first_rows{};  // optional (an initializer: aggregates may leave them out)
  // With the packing index, when every sequence is right-padded (PackedRows::right_padded()):
  // I32 [B + 1], sequence b the packed rows [seq_offsets[b], seq_offsets[b + 1]) (Note [packed
  // attention] in ops/cpu/attention.cpp), and their attended pairs (the attention's cost).
  Tensor seq_offsets{};
  AttendedPairs attended_pairs{};
  // Masked-LM (Note [masked LM head] in model/heads.h): labels are I32 [B, T] with -100 where a
  // token is not masked, and this counts the masked ones (the loss is their mean; 0: no loss).
  int64_t masked_tokens = 0;
  int64_t batch() const { return input_ids.dim(0); }
  int64_t seq() const { return input_ids.dim(1); }
  bool packed() const { return token_rows.defined(); }
};

// The packing index of a host mask I32 [B, T]: per sequence its first row and every row whose
// mask is set, ascending; all T rows of a sequence that attends to nothing (whose padded
// attention averages over every key). Equal results to the padded forward on those rows.
// With multiple > 1, padding rows are appended until the count is a multiple of it (or B*T):
// fewer distinct GEMM shapes (cuBLASLt plans are made per shape); they are computed as the
// padded forward computes them, and nothing reads them.
// When every sequence is a prefix of valid tokens (mask 1...1 0...0, at least one 1), its rows
// are consecutive in token_rows: sequence_rows counts them (the sequence offsets are first_rows
// followed by it), and attended_pairs counts their pairs; else sequence_rows is -1.
struct PackedRows {
  std::vector<int32_t> token_rows, first_rows;
  int32_t sequence_rows = -1;
  AttendedPairs attended_pairs{};
  bool right_padded() const { return sequence_rows >= 0; }
  // The B + 1 sequence offsets (DeviceBatch::seq_offsets), empty unless right_padded().
  std::vector<int32_t> seq_offsets() const {
    if (!right_padded()) return {};
    std::vector<int32_t> o = first_rows;
    o.push_back(sequence_rows);
    return o;
  }
};
PackedRows pack_token_rows(const int32_t* mask, int64_t batch, int64_t seq, int64_t multiple = 1);

// Whether a batch's attention runs on its packed rows (Note [packed attention] in
// ops/cpu/attention.cpp): it comes packed with sequence offsets, and the backend has the kernels
// for the compute dtype, the batch's length and the config's head dim.
bool packed_attention_applies(const Backend& be, DType compute, const BertConfig& cfg, const DeviceBatch& b);

// Where the fp32 gradients live (Note [gradients in freed activations] in bert.cpp).
//   Own:           a buffer of their own; forward_backward adds to them (accumulation).
//   InActivations: inside the activation arena, each layer's gradients in the memory of
//                  activations that backward has already consumed; forward_backward overwrites
//                  them, and they hold until the next forward. For one micro-batch per step.
enum class GradientPlacement : uint8_t { Own, InActivations };

// --gradient-placement auto|own|in-activations; auto is in-activations with one micro-batch per
// step, or whenever each micro-batch's gradients are reduced away before the next forward
// (`reduced_each_micro_batch`: ZeRO stage 2, dist/zero.h). Throws naming the flag
// (in-activations with accumulation into the model's gradients cannot work).
GradientPlacement resolve_gradient_placement(const std::string& flag, int64_t gradient_accumulation_steps,
                                             bool reduced_each_micro_batch = false);
const char* gradient_placement_name(GradientPlacement p);

struct ModelShape {
  int64_t max_batch = 1;  // micro-batch
  int64_t max_seq = 128;
  DType compute = DType::F32;
  CheckpointPolicy checkpointing = CheckpointPolicy::None;
  bool training = true;  // false: inference only, activations of one layer at a time
  GradientPlacement gradients = GradientPlacement::Own;
  // Training on the batch's real tokens (Note [packed training] in bert.cpp): forward_backward
  // takes packed batches; the arenas gain the packed q|k|v scratch. Not with layer checkpointing.
  bool packed_tokens = false;
  // --precision fp8 (Note [fp8 training] in core/fp8.h): the encoder layers' Linear layers
  // multiply in fp8 in training; compute stays BF16.
  bool fp8 = false;
  // The output gradients' fp8 format (--fp8-format): E5M2 ("hybrid", the default) or E4M3.
  Fp8Format fp8_grads = Fp8Format::E5M2;
  // A head on the first token (sequence classification, regression, multi-label; ModernBERT's
  // cls pooling): in training and in the packed evaluation the last layer computes past its
  // attention on the first tokens alone (Note [last layer on the first tokens] in bert.cpp, Note
  // [modernbert first tokens]). false: on every token.
  bool last_layer_first_tokens = true;
};

// fp8 scaling rows (Note [fp8 training]): for each layer, each of its fp8 Linear sites x the
// three tensors a site quantizes; one row of kFp8MetaWidth F32 each (Category::OptimizerState).
enum Fp8Site : int { kFp8Qkv, kFp8AttnOut, kFp8FfnIn, kFp8FfnOut, kFp8Sites };
enum Fp8Role : int { kFp8Input, kFp8Weight, kFp8Grad, kFp8Roles };
inline Fp8Format fp8_format(Fp8Role r, Fp8Format grads) { return r == kFp8Grad ? grads : Fp8Format::E4M3; }
size_t fp8_meta_bytes(const BertConfig& cfg, const ModelShape& shape);
// The CUDA backend's fp8 operand scratch for the largest of the layers' fp8 GEMMs at `rows`
// token rows (ops/backend_memory.h's fp8_scratch_bytes); 0 without fp8.
size_t fp8_layer_scratch_bytes(const BertConfig& cfg, const ModelShape& shape);

// Exact bytes of the model's arenas for a shape, any architecture: the planner and the model
// share this (model/bert.cpp; ModernBERT's in model/modernbert.cpp).
// With GradientPlacement::InActivations the activations and the gradients share one block of
// `block` bytes: the gradients start at byte `gradient_offset` of it, and
// activations + gradient bytes - block of them are counted in both categories.
struct ArenaBytes {
  size_t activations = 0;
  size_t temporary = 0;
  size_t gradient_offset = 0;
  size_t block = 0;  // 0 unless the gradients share the activations' block
};
ArenaBytes model_arena_bytes(const BertConfig& cfg, const ModelShape& shape);

// Saved-activation bytes that are live after each stage of one training step (forward adds a
// layer's saved tensors, backward releases them): the shape of memory over a step. The arena
// holds the peak for the whole run; this says which part of it is in use when.
struct LivenessPoint {
  std::string label;
  int64_t activation_bytes = 0;
  // Gradients in freed activations: the gradient bytes written so far in this step (the
  // ranges backward has reached); -1 when the gradients have a buffer of their own (all live).
  int64_t gradient_bytes = -1;
};
std::vector<LivenessPoint> activation_liveness(const BertConfig& cfg, const ModelShape& shape);

class EncoderModel {
 public:
  virtual ~EncoderModel() = default;

  virtual const BertConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual const ModelShape& shape() const = 0;
  virtual Backend& backend() = 0;

  // Flat buffers (Note [flat parameter layout]).
  virtual const Tensor& master() const = 0;          // F32 weights
  virtual const Tensor& compute_params() const = 0;  // compute dtype (aliases master in F32)
  virtual const Tensor& grads() const = 0;           // F32
  // Whether the gradients live in the activations' block (what forward_backward then zeroes
  // and overwrites).
  virtual bool gradients_in_activations() const = 0;
  // The activation arena's memory. Between optimizer steps it holds nothing a later call reads
  // (every forward writes before it reads; gradients placed there are consumed by the update),
  // so the trainer lends it out then (Note [gemm tuning] in ops/cuda/matmul.cpp).
  virtual std::pair<void*, size_t> activation_memory() const = 0;

  // Hugging Face's initialization for the architecture.
  virtual void init_weights(uint64_t seed) = 0;
  // Host F32 values for the whole flat master buffer (length layout().total()); the
  // compute-dtype copy follows.
  virtual void set_master_from_host(const std::vector<float>& flat) = 0;
  virtual std::vector<float> master_to_host() = 0;
  virtual std::vector<float> grads_to_host() = 0;
  // Refresh the compute-dtype copy from the master weights (no-op in F32).
  virtual void sync_compute_copy() = 0;
  // After each optimizer step with fp8 (Note [fp8 training]): the delayed scaling's update.
  virtual void fp8_scale_update() {}
  virtual void zero_grads() = 0;
  // Names of LayerNorm weights with an element below `limit` in magnitude: LayerNorm backward
  // divides by them (Note [layernorm backward from its output], ops/cpu/layernorm.cpp).
  virtual std::vector<std::string> layernorm_weights_below(float limit) = 0;
  // Seed of the dropout masks (counter-based, so runs are reproducible and resumable).
  virtual void set_dropout_seed(uint64_t seed) = 0;

  // Forward and backward of one micro-batch: gradients scaled by grad_scale (= loss_scale /
  // samples in the optimizer step), accumulated (or written afresh with the gradients in the
  // activations); per-sample losses F32 [B] into losses(). dropout_base makes the dropout masks
  // of this micro-batch unique.
  virtual void forward_backward(const DeviceBatch& batch, float grad_scale, uint64_t dropout_base) = 0;
  // The stages of the flat gradients (elements), in layout order, adjacent and covering the
  // buffer; stage 1 + l is final when backward calls on_layer_gradients for layer l.
  virtual const std::vector<std::pair<size_t, size_t>>& gradient_stages() const = 0;
  // Called by backward as soon as a stage's gradients are final (Note [bucketed reduction] in
  // dist/zero.h). Empty: no calls.
  virtual void on_layer_gradients(std::function<void(size_t begin, size_t end)> f) = 0;
  // Forward only (no dropout): logits in the compute dtype.
  virtual void forward_eval(const DeviceBatch& batch) = 0;
  // Whether the last forward_eval ran on the batch's packed token rows (a packing index may be
  // ignored: the logits are the same), so that evaluation reports the work it skipped.
  virtual bool last_forward_packed() const = 0;

  virtual const Tensor& losses() const = 0;  // F32 [B] of the last call
  virtual const Tensor& logits() const = 0;  // [B, num_labels] of the last call; masked-LM [B*T, vocab]
  // [B, T, H] encoder output of the last call in the compute dtype (undefined where the model
  // does not keep it).
  virtual const Tensor& hidden_states() const = 0;
};

// The model class of cfg.architecture, built for `shape`.
std::unique_ptr<EncoderModel> make_model(Backend& be, const BertConfig& cfg, const ModelShape& shape);

}  // namespace anatomy
