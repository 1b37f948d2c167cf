// ModernBertForSequenceClassification (model_type "modernbert"): the encoder variant whose layer
// differs from BERT's throughout (Note [modernbert] in modernbert.cpp), written against the
// Backend interface with its own forward and backward, behind the EncoderModel interface
// (model/encoder.h) that the trainer uses. Parameters live in one flat buffer with
// transformers' names (ParamLayout::for_modernbert): fp32 master weights and gradients, and in
// BF16/FP16 a compute-dtype copy; saved activations (compute dtype, statistics and the pooled
// head in F32: Note [modernbert fp32 pooled head]) in one
// arena, backward scratch in another, both sized by the carving that the planner runs dry
// (modernbert_arena_bytes), so planned == allocated. With GradientPlacement::InActivations the
// gradients live in activation memory that backward is done with (Note [modernbert gradients in
// freed activations] in modernbert.cpp).
//
// Gradient checkpointing: none, layer (Note [layer recompute] in modernbert.cpp) or selective
// (Note [modernbert selective recompute]).
// Packed batches (training on real tokens, packed evaluation) run the encoder on the token rows
// where the backend has the packed attention, else padded (Note [modernbert packed tokens]).
// What it does not do (the BERT class does): dropout (config.json's dropouts must be 0).
// With config.json's architectures ModernBertForTokenClassification or ModernBertForMaskedLM the
// same class is that model: the head on every token (Note [modernbert token head] in
// modernbert.cpp), logits [B*T, num_labels or vocab_size].
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memory/allocator.h"
#include "model/config.h"
#include "model/encoder.h"
#include "model/params.h"
#include "ops/backend.h"

namespace anatomy {

class ModernBertForSequenceClassification : public EncoderModel {
 public:
  // The config must be a validated ModernBERT config; packed_tokens does not combine with layer
  // checkpointing (refused naming the flag).
  ModernBertForSequenceClassification(Backend& be, const BertConfig& cfg, const ModelShape& shape);
  // A training model in F32 for batches up to [max_batch, max_seq].
  ModernBertForSequenceClassification(Backend& be, const BertConfig& cfg, int64_t max_batch, int64_t max_seq)
      : ModernBertForSequenceClassification(be, cfg, ModelShape{max_batch, max_seq}) {}
  ~ModernBertForSequenceClassification() override;

  const BertConfig& config() const override { return m_cfg; }
  const ParamLayout& layout() const override { return m_layout; }
  const ModelShape& shape() const override { return m_shape; }
  Backend& backend() override { return m_be; }
  const Tensor& master() const override { return m_master.tensor(); }
  const Tensor& compute_params() const override { return m_compute_view; }
  const Tensor& grads() const override { return m_grads_view; }
  bool gradients_in_activations() const override { return m_act_block.data() != nullptr; }
  std::pair<void*, size_t> activation_memory() const override { return {m_act_arena.base(), m_act_arena.capacity()}; }

  // transformers' initialization: matrices ~ N(0, initializer_range) (not truncated), norms 1,
  // biases 0.
  void init_weights(uint64_t seed) override;
  void set_master_from_host(const std::vector<float>& flat) override;
  std::vector<float> master_to_host() override;
  std::vector<float> grads_to_host() override;
  void sync_compute_copy() override;
  void zero_grads() override;
  std::vector<std::string> layernorm_weights_below(float limit) override;
  void set_dropout_seed(uint64_t) override {}  // no dropout (Note [modernbert])

  // One micro-batch: gradients accumulate (+=) scaled by grad_scale, or are written afresh when
  // they live in the activations; per-sample losses F32 [B].
  // dropout_base is unused (no dropout).
  void forward_backward(const DeviceBatch& batch, float grad_scale, uint64_t dropout_base = 0) override;
  // [0] the token embeddings, [1 + l] layer l's four matrices (final when layer l's backward
  // ends), [L + 1] the head's matrices and every vector (final when backward ends).
  const std::vector<std::pair<size_t, size_t>>& gradient_stages() const override { return m_grad_ranges; }
  void on_layer_gradients(std::function<void(size_t begin, size_t end)> f) override { m_on_layer_grads = std::move(f); }
  void forward_eval(const DeviceBatch& batch) override;
  bool last_forward_packed() const override;
  const Tensor& losses() const override { return m_losses; }
  const Tensor& logits() const override { return m_logits; }
  // final_norm's output [B, T, H]; after a packed forward the padded copy the per-token heads read
  // (padding positions 0 or a padding row's output), undefined under a pooled head.
  const Tensor& hidden_states() const override { return m_hidden; }

  struct Acts;  // modernbert.cpp

 private:
  void forward(const DeviceBatch& b, bool training);
  void backward(const DeviceBatch& b);
  void pool_forward(const DeviceBatch& b);
  // The first Acts::n rows of a [B*T, width] tensor: the rows the encoder runs on.
  Tensor rows(const Tensor& t, int64_t width) const;
  // Layer l's rotary theta and attention scope: its local window (0: global) and, in the last
  // layer under a first-token head, the first query alone (Note [modernbert first tokens]).
  std::pair<float, AttentionScope> attention_of(int l) const;
  // Per-sample losses F32 [B] of the head's logits, and dlogits (when defined) scaled by grad_scale.
  void loss(const DeviceBatch& b, const Tensor& dlogits, float grad_scale);
  void layer_forward(int l, const DeviceBatch& b);
  void layer_backward(int l, const DeviceBatch& b, const Tensor& dout, const Tensor& din);
  // A layer past attention on the rows of ctx, and its backward; attention's backward
  // (Note [modernbert first tokens] runs the last layer's first part on the first tokens alone).
  void mlp_forward(int l, const Tensor& ctx, const Tensor& x, const Tensor& out);
  void mlp_backward(int l, const Tensor& dout, const Tensor& ctx);
  void attention_backward_part(int l, const DeviceBatch& b, const Tensor& dctx, const Tensor& dx1, const Tensor& free,
                               const Tensor& din);
  // A linear layer's or a LayerNorm's parameters in the layout, found once by the constructor
  // so that a step builds no names and looks nothing up; bias is null where the config has none.
  struct Params {
    const ParamInfo* weight = nullptr;
    const ParamInfo* bias = nullptr;
  };
  struct LayerParams {
    Params attn_norm;  // none in layer 0 (an Identity, Note [modernbert])
    Params wqkv, attn_wo, mlp_norm, wi, mlp_wo;
  };
  void norm_forward(const Params& p, const Tensor& y, const Tensor& rstd, const Tensor& branch, const Tensor& residual,
                    const Tensor& sum);
  void norm_backward(const Params& p, const Tensor& dsum, const Tensor& dy, const Tensor& y, const Tensor& rstd);
  // y = x W^T (+ b), with the compute copy of the weights, or with the fp32 master weights when x
  // is F32 (the pooled head: Note [modernbert fp32 pooled head]).
  void linear(const Tensor& y, const Tensor& x, const Params& p);
  // dW += dy^T x (unless !weight_gradient: the caller adds it later; dW = dy^T x when store),
  // db += colsum(dy) (when there is a bias), dx = dy W (when dx is defined); W as linear's.
  void linear_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Params& p,
                       bool weight_gradient = true, bool store = false);
  Tensor weights_for(const ParamInfo* p, const Tensor& x) const { return x.dtype == DType::F32 ? M(p) : W(p); }
  Tensor W(const ParamInfo* p) const { return m_layout.view(m_compute_view, *p); }
  Tensor G(const ParamInfo* p) const { return m_layout.view(m_grads_view, *p); }
  // The F32 master weights: the norms read their parameters here in every precision (Note
  // [normalization parameters in fp32] in bert.cpp).
  Tensor M(const ParamInfo* p) const { return m_layout.view(m_master.tensor(), *p); }
  void zero_grad_range(const std::pair<size_t, size_t>& range);  // elements of the flat gradients

  Backend& m_be;
  BertConfig m_cfg;
  ParamLayout m_layout;
  ModelShape m_shape;
  std::vector<LayerParams> m_layer_params;
  // The token embeddings, and the head's output layer: the classifier, or the masked-LM decoder
  // whose weight is the token embeddings (Note [modernbert token head]).
  const ParamInfo* m_tok_embeddings = nullptr;
  Params m_emb_norm, m_final_norm, m_head_dense, m_head_norm, m_head_out;
  Buffer m_master, m_compute, m_grads;
  Tensor m_compute_view, m_grads_view;
  std::vector<std::pair<size_t, size_t>> m_grad_ranges;
  std::function<void(size_t, size_t)> m_on_layer_grads;
  SharedBlock m_act_block;  // activations with the gradients inside (GradientPlacement::InActivations)
  Arena m_act_arena, m_tmp_arena;
  std::unique_ptr<Acts> m_acts;
  Tensor m_losses, m_logits, m_hidden;
};

// The model's arenas for a shape, from the carving the model itself runs (Note [allocation
// policy] in bert.cpp): model_arena_bytes answers this for ModernBERT configs.
ArenaBytes modernbert_arena_bytes(const BertConfig& cfg, const ModelShape& shape);
// Saved-activation bytes over one training step (forward adds each layer's, backward releases
// them): activation_liveness answers this for ModernBERT configs.
std::vector<LivenessPoint> modernbert_liveness(const BertConfig& cfg, const ModelShape& shape);

// The bytes the model allocates per category for an F32 training model of batches up to
// [B, T] (weights, gradients, activations, temporary).
CategoryBytes modernbert_bytes(const BertConfig& cfg, int64_t B, int64_t T);

// DIR/model.safetensors (transformers' names) into the model: every parameter must be there
// with its shape (an error names the file and the tensor); returns the file's tensors the model
// does not read.
std::vector<std::string> load_modernbert_weights(const std::string& dir, EncoderModel& model);
// DIR/config.json and DIR/model.safetensors as transformers' save_pretrained writes them.
void save_modernbert(const std::string& dir, EncoderModel& model);

}  // namespace anatomy
