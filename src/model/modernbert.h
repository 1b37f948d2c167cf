// ModernBertForSequenceClassification (model_type "modernbert"): the encoder variant whose layer
// differs from BERT's throughout (Note [modernbert] in modernbert.cpp), written against the
// Backend interface with its own forward and backward. Parameters live in one flat buffer with
// transformers' names (ParamLayout::for_modernbert); saved activations and backward scratch in
// buffers of their own, sized for the largest batch at construction.
//
// What it does not do yet (the BERT class does): mixed precision, dropout, gradient
// checkpointing, packed batches, gradients in freed activations, the memory planner's arenas.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/backend.h"

namespace anatomy {

class ModernBertForSequenceClassification {
 public:
  // F32 only; the config must be a validated ModernBERT config.
  ModernBertForSequenceClassification(Backend& be, const BertConfig& cfg, int64_t max_batch, int64_t max_seq);
  ~ModernBertForSequenceClassification();

  const BertConfig& config() const { return m_cfg; }
  const ParamLayout& layout() const { return m_layout; }
  const Tensor& master() const { return m_master.tensor(); }
  const Tensor& grads() const { return m_grads.tensor(); }
  void set_master_from_host(const std::vector<float>& flat);
  std::vector<float> master_to_host();
  std::vector<float> grads_to_host();
  void zero_grads();
  // transformers' initialization: matrices ~ N(0, initializer_range) (not truncated), norms 1,
  // biases 0.
  void init_weights(uint64_t seed);

  // One micro-batch: gradients accumulate (+=) scaled by grad_scale; per-sample losses F32 [B].
  void forward_backward(const DeviceBatch& batch, float grad_scale);
  void forward_eval(const DeviceBatch& batch);
  const Tensor& losses() const { return m_losses; }
  const Tensor& logits() const { return m_logits; }

  struct Acts;  // modernbert.cpp

 private:
  void forward(const DeviceBatch& b);
  void backward(const DeviceBatch& b);
  void layer_forward(int l, const DeviceBatch& b);
  void layer_backward(int l, const DeviceBatch& b, const Tensor& dout, const Tensor& din);
  void norm_forward(const std::string& name, const Tensor& y, const Tensor& rstd, const Tensor& branch,
                    const Tensor& residual, const Tensor& sum);
  void norm_backward(const std::string& name, const Tensor& dsum, const Tensor& dy, const Tensor& y,
                     const Tensor& rstd);
  void linear(const Tensor& y, const Tensor& x, const std::string& w, const std::string& b);
  // dW += dy^T x, db += colsum(dy) (when the layout has b), dx = dy W (when dx is defined).
  void linear_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const std::string& w, const std::string& b);
  Tensor W(const std::string& name) const { return m_layout.view(m_master.tensor(), name); }
  Tensor G(const std::string& name) const { return m_layout.view(m_grads.tensor(), name); }
  bool has(const std::string& name) const { return m_layout.find(name) != nullptr; }

  Backend& m_be;
  BertConfig m_cfg;
  ParamLayout m_layout;
  int64_t m_max_batch, m_max_seq;
  Buffer m_master, m_grads;
  std::unique_ptr<Acts> m_acts;
  Tensor m_losses, m_logits;
};

// The bytes the model allocates per category for batches up to [B, T] (weights, gradients,
// activations, temporary), computed from the shapes alone: the plan that construction must meet.
CategoryBytes modernbert_bytes(const BertConfig& cfg, int64_t B, int64_t T);

// DIR/model.safetensors (transformers' names) into the model: every parameter must be there
// with its shape (an error names the file and the tensor); returns the file's tensors the model
// does not read.
std::vector<std::string> load_modernbert_weights(const std::string& dir, ModernBertForSequenceClassification& model);
// DIR/config.json and DIR/model.safetensors as transformers' save_pretrained writes them.
void save_modernbert(const std::string& dir, ModernBertForSequenceClassification& model);

}  // namespace anatomy
