// The encoder for sequence classification (BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA: the
// variants of Note [encoder variants] in bert.cpp) with an explicit forward and backward per
// layer, written once against the Backend interface (ops/backend.h). Saved activations live in one arena
// (Category::Activations), backward scratch in another (Category::Temporary); both are sized
// by the same carving code that the planner runs dry (Note [allocation policy]).
#pragma once
#include <functional>
#include <memory>
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

// A batch on the backend's device: ids, token types and mask I32 [B, T]; labels I32 [B], or F32
// [B, num_labels] for regression and multi-label (Note [problem types] in model/heads.h).
// forward_eval computes on the tokens alone when the packing index is given (Note [packed
// inference] in bert.cpp): token_rows I32 [N], the rows b*T + t to compute, and first_rows I32
// [B], where each sequence's row b*T sits in token_rows. pack_token_rows builds both.
struct DeviceBatch {
  Tensor input_ids, token_type_ids, attention_mask, labels;
  Tensor token_rows{}, first_rows{};  // optional (an initializer: aggregates may leave them out)
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
struct PackedRows {
  std::vector<int32_t> token_rows, first_rows;
};
PackedRows pack_token_rows(const int32_t* mask, int64_t batch, int64_t seq, int64_t multiple = 1);

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
};

// Exact bytes of the model's arenas for a shape: the planner and the model share this.
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

class BertForSequenceClassification {
 public:
  BertForSequenceClassification(Backend& be, const BertConfig& cfg, const ModelShape& shape);
  ~BertForSequenceClassification();

  const BertConfig& config() const { return m_cfg; }
  const ParamLayout& layout() const { return m_layout; }
  const ModelShape& shape() const { return m_shape; }
  Backend& backend() { return m_be; }

  // Flat buffers (Note [flat parameter layout]).
  const Tensor& master() const { return m_master.tensor(); }  // F32 weights
  const Tensor& compute_params() const { return m_compute_view; }  // compute dtype (aliases master in F32)
  const Tensor& grads() const { return m_grads_view; }    // F32
  // Whether the gradients live in the activations' block (what forward_backward then zeroes and
  // overwrites): the shape asked for it and the plan found memory to share.
  bool gradients_in_activations() const { return m_act_block.data() != nullptr; }

  // Hugging Face initialization: Linear and Embedding weights ~ N(0, initializer_range),
  // the padding row of the word embeddings zero, biases zero, LayerNorm weight 1 and bias 0.
  void init_weights(uint64_t seed);
  // Host F32 values for the whole flat master buffer (length layout().total()).
  void set_master_from_host(const std::vector<float>& flat);
  std::vector<float> master_to_host();
  std::vector<float> grads_to_host();
  // Refresh the compute-dtype copy from the master weights (no-op in F32).
  void sync_compute_copy();
  void zero_grads();
  // Names of LayerNorm weights with an element below `limit` in magnitude: LayerNorm backward
  // divides by them (Note [layernorm backward from its output], ops/cpu/layernorm.cpp).
  std::vector<std::string> layernorm_weights_below(float limit);
  // Seed of the dropout masks (counter-based, so runs are reproducible and resumable).
  void set_dropout_seed(uint64_t seed) { m_seed = seed; }

  // Forward and backward of one micro-batch: accumulates parameter gradients scaled by
  // grad_scale (= loss_scale / samples in the optimizer step) and writes per-sample losses
  // F32 [B] into losses(). dropout_base makes the dropout masks of this micro-batch unique.
  // With GradientPlacement::InActivations it writes the gradients afresh instead (and
  // hidden_states() is not kept: backward reuses its memory). With batch.packed() (the shape
  // must have packed_tokens) every row-wise op runs on the batch's tokens alone (Note [packed
  // training]); hidden_states() is then undefined.
  void forward_backward(const DeviceBatch& batch, float grad_scale, uint64_t dropout_base);
  // The stages of the flat gradients (elements), in layout order: [0] the embedding matrices
  // (written last), [1 + l] layer l's matrices, [L + 1] the tail (pooler, classifier and every
  // vector, final only when backward ends). Adjacent and covering the buffer.
  const std::vector<std::pair<size_t, size_t>>& gradient_stages() const { return m_grad_ranges; }
  // Called by backward as soon as layer l's matrices are final, with gradient_stages()[1 + l]
  // (after the ops that wrote them are enqueued): how data parallelism starts reducing them
  // while backward goes on (Note [bucketed reduction] in dist/zero.h). Empty: no calls.
  void on_layer_gradients(std::function<void(size_t begin, size_t end)> f) { m_on_layer_grads = std::move(f); }
  // Forward only (no dropout, nothing saved beyond one layer): logits in the compute dtype.
  // With batch.packed(), the encoder runs on the batch's tokens alone (no padding rows;
  // hidden_states() is then undefined).
  void forward_eval(const DeviceBatch& batch);

  const Tensor& losses() const { return m_losses; }  // F32 [B] of the last call
  const Tensor& logits() const { return m_logits; }  // [B, num_labels] of the last call; masked-LM [B*T, vocab]
  // [B, T, H] encoder output (BertModel's last_hidden_state) of the last forward_eval or
  // forward_backward call, in the compute dtype; valid until the next call.
  const Tensor& hidden_states() const { return m_hidden; }

  // Saved activations and scratch views (defined in bert.cpp; public for the planner's dry run).
  struct LayerActs;
  struct Acts;

 private:
  void carve(int64_t B, int64_t T, bool training, bool packed = false);
  void forward(const DeviceBatch& batch, bool training, uint64_t dropout_base);
  void forward_packed(const DeviceBatch& batch);
  void embeddings_forward(const DeviceBatch& b, bool training, uint64_t dropout_base, int64_t n);
  void embeddings_backward(const DeviceBatch& b, uint64_t dropout_base, int64_t n, Tensor& X1, Tensor& X2, Tensor& X3);
  void head_forward(bool training, uint64_t dropout_base);
  void head_backward(uint64_t dropout_base);
  // The masked-LM head on the encoder output x [R, H] (Note [masked LM head] in model/heads.h).
  void masked_lm_head_forward(const Tensor& x);
  void masked_lm_head_backward(const Tensor& x, const Tensor& dx, const Tensor& d1, const Tensor& d2);
  void token_head_forward(const Tensor& x, bool training, uint64_t dropout_base);
  void token_head_backward(const Tensor& x, const Tensor& dx, uint64_t dropout_base);
  // The position table from the row the first token reads (Note [roberta positions]).
  Tensor position_table(const Tensor& flat) const;
  void layer_forward(int l, const Tensor& x, const Tensor& out, LayerActs& a, const DeviceBatch& b,
                     bool training, uint64_t dropout_base, const Tensor& scratch);
  Tensor layer_backward(int l, const Tensor& dout, LayerActs& a, const Tensor& x, const Tensor& out, const DeviceBatch& b,
                        uint64_t dropout_base, const Tensor& t1, const Tensor& t2, const Tensor& t3);
  DropoutSpec drop(float p, uint64_t base, int site, bool training) const;
  Tensor W(const std::string& name) const { return m_layout.view(m_compute_view, name); }
  // The F32 master weights: the normalizations' parameters and the embedding tables read these
  // in every precision (Note [normalization parameters in fp32] in bert.cpp).
  Tensor M(const std::string& name) const { return m_layout.view(m_master.tensor(), name); }
  Tensor G(const std::string& name) const { return m_layout.view(m_grads_view, name); }

  Backend& m_be;
  BertConfig m_cfg;
  ParamLayout m_layout;
  ParamNames m_names;
  std::vector<LayerNames> m_layer_names;
  ModelShape m_shape;
  uint64_t m_seed = 0;
  void zero_grad_range(size_t begin, size_t end);  // elements of the flat gradients
  Buffer m_master, m_compute, m_grads;
  SharedBlock m_act_block;  // activations with the gradients inside (GradientPlacement::InActivations)
  // The flat gradient ranges backward writes stage by stage (elements): the embeddings, each
  // layer, and the tail (pooler, classifier, every vector); with m_act_block each is zeroed first.
  std::vector<std::pair<size_t, size_t>> m_grad_ranges;
  std::function<void(size_t, size_t)> m_on_layer_grads;
  Tensor m_compute_view, m_grads_view;
  Arena m_act_arena, m_tmp_arena;
  std::unique_ptr<Acts> m_acts;
  Tensor m_losses, m_logits, m_hidden;
};

}  // namespace anatomy
