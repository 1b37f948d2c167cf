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
#include "model/encoder.h"
#include "model/params.h"
#include "ops/backend.h"

namespace anatomy {

class BertForSequenceClassification : public EncoderModel {
 public:
  BertForSequenceClassification(Backend& be, const BertConfig& cfg, const ModelShape& shape);
  ~BertForSequenceClassification() override;

  const BertConfig& config() const override { return m_cfg; }
  const ParamLayout& layout() const override { return m_layout; }
  const ModelShape& shape() const override { return m_shape; }
  Backend& backend() override { return m_be; }

  // Flat buffers (Note [flat parameter layout]).
  const Tensor& master() const override { return m_master.tensor(); }  // F32 weights
  const Tensor& compute_params() const override { return m_compute_view; }  // compute dtype (aliases master in F32)
  const Tensor& grads() const override { return m_grads_view; }    // F32
  // Whether the gradients live in the activations' block (what forward_backward then zeroes and
  // overwrites): the shape asked for it and the plan found memory to share.
  bool gradients_in_activations() const override { return m_act_block.data() != nullptr; }
  std::pair<void*, size_t> activation_memory() const override { return {m_act_arena.base(), m_act_arena.capacity()}; }

  // Hugging Face initialization: Linear and Embedding weights ~ N(0, initializer_range),
  // the padding row of the word embeddings zero, biases zero, LayerNorm weight 1 and bias 0.
  void init_weights(uint64_t seed) override;
  // Host F32 values for the whole flat master buffer (length layout().total()).
  void set_master_from_host(const std::vector<float>& flat) override;
  std::vector<float> master_to_host() override;
  std::vector<float> grads_to_host() override;
  // Refresh the compute-dtype copy from the master weights (no-op in F32).
  void sync_compute_copy() override;
  void fp8_scale_update() override;
  void zero_grads() override;
  // Names of LayerNorm weights with an element below `limit` in magnitude: LayerNorm backward
  // divides by them (Note [layernorm backward from its output], ops/cpu/layernorm.cpp).
  std::vector<std::string> layernorm_weights_below(float limit) override;
  // Seed of the dropout masks (counter-based, so runs are reproducible and resumable).
  void set_dropout_seed(uint64_t seed) override { m_seed = seed; }

  // Forward and backward of one micro-batch: accumulates parameter gradients scaled by
  // grad_scale (= loss_scale / samples in the optimizer step) and writes per-sample losses
  // F32 [B] into losses(). dropout_base makes the dropout masks of this micro-batch unique.
  // With GradientPlacement::InActivations it writes the gradients afresh instead (and
  // hidden_states() is not kept: backward reuses its memory). With batch.packed() (the shape
  // must have packed_tokens) every row-wise op runs on the batch's tokens alone (Note [packed
  // training]); hidden_states() is then undefined, and so it is under a head on the first token,
  // whose last layer runs on the first tokens alone (Note [last layer on the first tokens]).
  void forward_backward(const DeviceBatch& batch, float grad_scale, uint64_t dropout_base) override;
  // The stages of the flat gradients (elements), in layout order: [0] the embedding matrices
  // (written last), [1 + l] layer l's matrices, [L + 1] the tail (pooler, classifier and every
  // vector, final only when backward ends). Adjacent and covering the buffer.
  const std::vector<std::pair<size_t, size_t>>& gradient_stages() const override { return m_grad_ranges; }
  // Called by backward as soon as layer l's matrices are final, with gradient_stages()[1 + l]
  // (after the ops that wrote them are enqueued): how data parallelism starts reducing them
  // while backward goes on (Note [bucketed reduction] in dist/zero.h). Empty: no calls.
  void on_layer_gradients(std::function<void(size_t begin, size_t end)> f) override { m_on_layer_grads = std::move(f); }
  // Forward only (no dropout, nothing saved beyond one layer): logits in the compute dtype.
  // With batch.packed(), the encoder runs on the batch's tokens alone (no padding rows;
  // hidden_states() is then undefined).
  void forward_eval(const DeviceBatch& batch) override;
  bool last_forward_packed() const override;

  const Tensor& losses() const override { return m_losses; }  // F32 [B] of the last call
  const Tensor& logits() const override { return m_logits; }  // [B, num_labels] of the last call; masked-LM [B*T, vocab]
  // [B, T, H] encoder output (BertModel's last_hidden_state) of the last forward_eval or
  // forward_backward call, in the compute dtype; valid until the next call; undefined where the
  // call did not compute it (see forward_backward and forward_eval).
  const Tensor& hidden_states() const override { return m_hidden; }

  // Saved activations and scratch views (defined in bert.cpp; public for the planner's dry run).
  struct LayerActs;
  struct Acts;

 private:
  void carve(int64_t B, int64_t T, bool training, bool packed = false);
  // The per-token heads' padded input on a packed batch: built from batch b's token rows (the
  // encoder's output rows `out`, by default training's), or as built (backward, b null).
  Tensor padded_head_input(const DeviceBatch* b = nullptr, Tensor out = {});
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
  // A layer in two parts: attention (its rows are the sequences' tokens) and what follows it,
  // row by row (the output projection, the LayerNorms, the feed-forward), which the last layer
  // runs on the first tokens alone (Note [last layer on the first tokens]); there attention's
  // scope asks for the first query alone (queries 1; Note [attention scope] in ops/op_args.h).
  Tensor attention_forward_rows(int l, const Tensor& x, LayerActs& a, const DeviceBatch& b, bool training,
                                uint64_t dropout_base, int queries = 0);
  void rows_forward(int l, const Tensor& ctx_rows, const Tensor& x, const Tensor& out, LayerActs& a, bool training,
                    uint64_t dropout_base, const Tensor& branch);
  void rows_backward(int l, const Tensor& dy, LayerActs& a, const Tensor& out, uint64_t dropout_base,
                     const Tensor& x1, const Tensor& x2, const Tensor& x3);
  Tensor attention_backward_rows(int l, LayerActs& a, const Tensor& x, const DeviceBatch& b, uint64_t dropout_base,
                                 const Tensor& dao, const Tensor& t1, const Tensor& dctx_rows, const Tensor& t3,
                                 int queries = 0);
  void last_layer_forward(const Tensor& x, LayerActs& a, const DeviceBatch& b, bool training, uint64_t dropout_base,
                          const Tensor& ctx0, const Tensor& x0);
  Tensor last_layer_backward(LayerActs& a, const Tensor& x, const DeviceBatch& b, uint64_t dropout_base,
                             const Tensor& t1, const Tensor& t2, const Tensor& t3);
  // The q|k|v projection's backward from dqkv [N, 3H]: its weight and bias gradients, and
  // dx[:N] += dqkv Wqkv; returns dx.
  Tensor qkv_backward(int l, const Tensor& dqkv, const Tensor& x, const Tensor& dx);
  DropoutSpec drop(float p, uint64_t base, int site, bool training) const;
  // args with layer l's fp8 rows of `site` for A (role ra) and B (role rb) when the step runs in
  // fp8 (Note [fp8 training]); unchanged otherwise.
  MatmulArgs fp8(MatmulArgs args, int l, Fp8Site site, Fp8Role ra, Fp8Role rb, bool training = true) const;
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
  MatmulArgs weight_gradient_args() const;  // a layer's dW GEMM: stored or accumulated (Note [layer gradients stored])
  Buffer m_master, m_compute, m_grads;
  Buffer m_fp8;  // F32 [layers * kFp8Sites * kFp8Roles, kFp8MetaWidth] with shape.fp8
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
