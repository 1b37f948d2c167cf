// Parameters of the *ForSequenceClassification (or *ForMaskedLM) model of each encoder variant
// with Hugging Face names, laid out in one flat buffer per category (fp32 master weights, the compute-dtype copy,
// fp32 gradients).
//
// Note [flat parameter layout]: parameters that take weight decay come first (all matrices:
// embeddings, ELECTRA's embedding projection, attention, feed-forward, the head's two), then those that do not (biases and
// LayerNorm parameters, the Trainer's no-decay rule). Within a layer the query, key and value
// weights are adjacent, so they form one [3H, H] matrix and one [3H] bias: a single GEMM makes
// q, k and v. Every offset is a multiple of 8 elements (16-byte aligned in bf16); with
// hidden and intermediate sizes divisible by 8 the layout has no padding at all.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace anatomy {

struct ParamInfo {
  std::string name;  // Hugging Face name, e.g. "bert.encoder.layer.0.attention.self.query.weight"
  Shape shape;
  size_t offset = 0;  // in elements, into the flat buffer
  bool decay = false;
  size_t numel() const { return shape.numel(); }
};

class ParamLayout {
 public:
  // ModernBERT's layout comes from for_modernbert (model/modernbert.cpp).
  static ParamLayout for_sequence_classification(const BertConfig& cfg);
  static ParamLayout for_modernbert(const BertConfig& cfg);

  const std::vector<ParamInfo>& params() const { return m_params; }
  const ParamInfo& get(const std::string& name) const;
  const ParamInfo* find(const std::string& name) const;
  size_t total() const { return m_total; }        // flat buffer length in elements
  size_t decay_end() const { return m_decay_end; }  // [0, decay_end) takes weight decay
  size_t num_parameters() const;                  // sum of numel (no padding)

  // View of one parameter inside a flat buffer (any dtype, any device).
  Tensor view(const Tensor& flat, const std::string& name) const;
  Tensor view(const Tensor& flat, const ParamInfo& p) const;
  // A contiguous range [offset, offset + n) of the flat buffer with a shape.
  static Tensor range(const Tensor& flat, size_t offset, Shape shape);

 private:
  // Each parameter starts at a multiple of 8 elements, unless `packed`: then right after the
  // previous one, as the key and value weights and biases follow the query's so that the three
  // form one [3H, H] matrix and one [3H] bias whatever H is.
  void add(const std::string& name, Shape shape, bool decay, bool packed = false);
  std::vector<ParamInfo> m_params;
  std::unordered_map<std::string, size_t> m_index;
  size_t m_total = 0, m_decay_end = 0;
};

// Every parameter name the model reads, for the config's variant: the one place that knows the
// spellings (BERT's, RoBERTa's and ELECTRA's modules differ only in the prefix and the head;
// DistilBERT's differ throughout).
struct ParamNames {
  std::string word, position, token_type;  // token_type empty without token types (DistilBERT)
  std::string emb_ln_w, emb_ln_b;
  std::string project_w, project_b;        // ELECTRA's embeddings_project; empty when not projecting
  std::string head_dense_w, head_dense_b;  // bert.pooler.dense, classifier.dense or pre_classifier
  std::string head_out_w, head_out_b;      // classifier or classifier.out_proj
  // Masked-LM (Note [masked LM head] in model/heads.h): head_dense is the transform's dense,
  // head_ln its LayerNorm, head_out_b the vocabulary bias; head_out_w is empty (tied to word).
  std::string head_ln_w, head_ln_b;
};
struct LayerNames {
  std::string q_w, q_b, k_w, k_b, v_w, v_b;  // query, key, value
  std::string ao_w, ao_b;                    // attention output projection
  std::string ln1_w, ln1_b;                  // LayerNorm after attention
  std::string ff1_w, ff1_b, ff2_w, ff2_b;    // feed-forward in and out
  std::string ln2_w, ln2_b;                  // LayerNorm after the feed-forward
};
ParamNames param_names(const BertConfig& cfg);
LayerNames layer_names(const BertConfig& cfg, int l);
// LayerNorm gammas under every variant's spelling (LayerNorm.weight, sa_layer_norm.weight, ...).
bool is_layernorm_weight(const std::string& name);

}  // namespace anatomy
