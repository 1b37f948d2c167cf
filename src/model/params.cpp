#include "model/params.h"

#include "model/heads.h"

namespace anatomy {

ParamNames param_names(const BertConfig& cfg) {
  const std::string base = std::string(cfg.base_name()) + ".";
  const std::string e = base + "embeddings.";
  ParamNames n;
  n.word = e + "word_embeddings.weight";
  n.position = e + "position_embeddings.weight";
  if (cfg.has_token_types()) n.token_type = e + "token_type_embeddings.weight";
  n.emb_ln_w = e + "LayerNorm.weight";
  n.emb_ln_b = e + "LayerNorm.bias";
  if (cfg.projects_embeddings()) {
    n.project_w = base + "embeddings_project.weight";
    n.project_b = base + "embeddings_project.bias";
  }
  if (is_masked_lm(cfg)) {
    masked_lm_class(cfg);  // refuses the variants without one
    // The same head under three sets of names: dense -> GELU -> LayerNorm -> the decoder tied to
    // the word embeddings, plus its bias.
    const Architecture a = cfg.architecture;
    const std::string p = a == Architecture::Bert ? "cls.predictions." : a == Architecture::DistilBert ? "" : "lm_head.";
    const std::string dense = a == Architecture::Bert         ? p + "transform.dense."
                              : a == Architecture::DistilBert ? "vocab_transform."
                                                              : p + "dense.";
    const std::string ln = a == Architecture::Bert         ? p + "transform.LayerNorm."
                           : a == Architecture::DistilBert ? "vocab_layer_norm."
                                                           : p + "layer_norm.";
    n.head_dense_w = dense + "weight";
    n.head_dense_b = dense + "bias";
    n.head_ln_w = ln + "weight";
    n.head_ln_b = ln + "bias";
    n.head_out_b = a == Architecture::DistilBert ? "vocab_projector.bias" : p + "bias";
    return n;
  }
  if (is_token_classification(cfg)) {  // Note [token classification head]: classifier only
    n.head_out_w = "classifier.weight";
    n.head_out_b = "classifier.bias";
    return n;
  }
  std::string dense, out;
  switch (cfg.architecture) {
    case Architecture::Bert: dense = "bert.pooler.dense."; out = "classifier."; break;
    case Architecture::DistilBert: dense = "pre_classifier."; out = "classifier."; break;
    default: dense = "classifier.dense."; out = "classifier.out_proj."; break;
  }
  n.head_dense_w = dense + "weight";
  n.head_dense_b = dense + "bias";
  n.head_out_w = out + "weight";
  n.head_out_b = out + "bias";
  return n;
}

LayerNames layer_names(const BertConfig& cfg, int l) {
  const std::string i = std::to_string(l);
  std::string q, k, v, ao, ln1, ff1, ff2, ln2;
  if (cfg.architecture == Architecture::DistilBert) {
    const std::string p = "distilbert.transformer.layer." + i + ".";
    q = p + "attention.q_lin.";
    k = p + "attention.k_lin.";
    v = p + "attention.v_lin.";
    ao = p + "attention.out_lin.";
    ln1 = p + "sa_layer_norm.";
    ff1 = p + "ffn.lin1.";
    ff2 = p + "ffn.lin2.";
    ln2 = p + "output_layer_norm.";
  } else {
    const std::string p = std::string(cfg.base_name()) + ".encoder.layer." + i + ".";
    q = p + "attention.self.query.";
    k = p + "attention.self.key.";
    v = p + "attention.self.value.";
    ao = p + "attention.output.dense.";
    ln1 = p + "attention.output.LayerNorm.";
    ff1 = p + "intermediate.dense.";
    ff2 = p + "output.dense.";
    ln2 = p + "output.LayerNorm.";
  }
  return {q + "weight", q + "bias", k + "weight", k + "bias", v + "weight", v + "bias", ao + "weight", ao + "bias",
          ln1 + "weight", ln1 + "bias", ff1 + "weight", ff1 + "bias", ff2 + "weight", ff2 + "bias", ln2 + "weight",
          ln2 + "bias"};
}

bool is_layernorm_weight(const std::string& name) {
  for (const char* end : {"LayerNorm.weight", "layer_norm.weight"}) {
    const size_t n = std::char_traits<char>::length(end);
    if (name.size() >= n && name.compare(name.size() - n, n, end) == 0) return true;
  }
  return false;
}

void ParamLayout::add(const std::string& name, Shape shape, bool decay, bool packed) {
  ParamInfo p{name, shape, packed ? m_total : (m_total + 7) / 8 * 8, decay};
  m_index[name] = m_params.size();
  m_params.push_back(p);
  m_total = p.offset + shape.numel();
}

ParamLayout ParamLayout::for_sequence_classification(const BertConfig& cfg) {
  if (cfg.is_modernbert()) return for_modernbert(cfg);
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers, E = cfg.embedding_width();
  const ParamNames n = param_names(cfg);
  ParamLayout lay;
  // Group 1: weight decay. The embeddings (with ELECTRA's projection) come first and the head's
  // matrices last: the gradient ranges of Note [gradients in freed activations] rely on it.
  lay.add(n.word, {cfg.vocab_size, E}, true);
  lay.add(n.position, {cfg.max_position_embeddings, E}, true);
  if (!n.token_type.empty()) lay.add(n.token_type, {cfg.type_vocab_size, E}, true);
  if (!n.project_w.empty()) lay.add(n.project_w, {H, E}, true);
  for (int l = 0; l < L; ++l) {
    const LayerNames p = layer_names(cfg, l);
    lay.add(p.q_w, {H, H}, true);
    lay.add(p.k_w, {H, H}, true, true);
    lay.add(p.v_w, {H, H}, true, true);
    lay.add(p.ao_w, {H, H}, true);
    lay.add(p.ff1_w, {I, H}, true);
    lay.add(p.ff2_w, {H, I}, true);
  }
  if (!n.head_dense_w.empty()) lay.add(n.head_dense_w, {H, H}, true);
  if (!n.head_out_w.empty()) lay.add(n.head_out_w, {cfg.num_labels, H}, true);
  lay.m_decay_end = lay.m_total;
  // Group 2: no weight decay.
  lay.add(n.emb_ln_w, {E}, false);
  lay.add(n.emb_ln_b, {E}, false);
  if (!n.project_b.empty()) lay.add(n.project_b, {H}, false);
  for (int l = 0; l < L; ++l) {
    const LayerNames p = layer_names(cfg, l);
    lay.add(p.q_b, {H}, false);
    lay.add(p.k_b, {H}, false, true);
    lay.add(p.v_b, {H}, false, true);
    lay.add(p.ao_b, {H}, false);
    lay.add(p.ln1_w, {H}, false);
    lay.add(p.ln1_b, {H}, false);
    lay.add(p.ff1_b, {I}, false);
    lay.add(p.ff2_b, {H}, false);
    lay.add(p.ln2_w, {H}, false);
    lay.add(p.ln2_b, {H}, false);
  }
  if (!n.head_dense_b.empty()) lay.add(n.head_dense_b, {H}, false);
  if (!n.head_ln_w.empty()) {  // masked-LM: the transform's LayerNorm and the vocabulary bias
    lay.add(n.head_ln_w, {H}, false);
    lay.add(n.head_ln_b, {H}, false);
    lay.add(n.head_out_b, {cfg.vocab_size}, false);
  } else {
    lay.add(n.head_out_b, {cfg.num_labels}, false);
  }
  return lay;
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_params[it->second];
}

const ParamInfo& ParamLayout::get(const std::string& name) const {
  const ParamInfo* p = find(name);
  ANATOMY_CHECK(p, "internal error: no parameter named ", name);
  return *p;
}

size_t ParamLayout::num_parameters() const {
  size_t n = 0;
  for (const auto& p : m_params) n += p.numel();
  return n;
}

Tensor ParamLayout::range(const Tensor& flat, size_t offset, Shape shape) {
  ANATOMY_ASSERT(offset + shape.numel() <= flat.numel());
  return Tensor(static_cast<char*>(flat.data) + offset * dtype_size(flat.dtype), flat.dtype, shape, flat.device);
}

Tensor ParamLayout::view(const Tensor& flat, const ParamInfo& p) const { return range(flat, p.offset, p.shape); }
Tensor ParamLayout::view(const Tensor& flat, const std::string& name) const { return view(flat, get(name)); }

}  // namespace anatomy
