#include "model/params.h"

namespace anatomy {

std::string layer_prefix(int l) { return "bert.encoder.layer." + std::to_string(l) + "."; }

void ParamLayout::add(const std::string& name, Shape shape, bool decay) {
  ParamInfo p{name, shape, (m_total + 7) / 8 * 8, decay};
  m_index[name] = m_params.size();
  m_params.push_back(p);
  m_total = p.offset + shape.numel();
}

ParamLayout ParamLayout::for_sequence_classification(const BertConfig& cfg) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  ParamLayout lay;
  // Group 1: weight decay.
  lay.add("bert.embeddings.word_embeddings.weight", {cfg.vocab_size, H}, true);
  lay.add("bert.embeddings.position_embeddings.weight", {cfg.max_position_embeddings, H}, true);
  lay.add("bert.embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, H}, true);
  for (int l = 0; l < L; ++l) {
    std::string p = layer_prefix(l);
    lay.add(p + "attention.self.query.weight", {H, H}, true);
    lay.add(p + "attention.self.key.weight", {H, H}, true);
    lay.add(p + "attention.self.value.weight", {H, H}, true);
    lay.add(p + "attention.output.dense.weight", {H, H}, true);
    lay.add(p + "intermediate.dense.weight", {I, H}, true);
    lay.add(p + "output.dense.weight", {H, I}, true);
  }
  lay.add("bert.pooler.dense.weight", {H, H}, true);
  lay.add("classifier.weight", {cfg.num_labels, H}, true);
  lay.m_decay_end = lay.m_total;
  // Group 2: no weight decay.
  lay.add("bert.embeddings.LayerNorm.weight", {H}, false);
  lay.add("bert.embeddings.LayerNorm.bias", {H}, false);
  for (int l = 0; l < L; ++l) {
    std::string p = layer_prefix(l);
    lay.add(p + "attention.self.query.bias", {H}, false);
    lay.add(p + "attention.self.key.bias", {H}, false);
    lay.add(p + "attention.self.value.bias", {H}, false);
    lay.add(p + "attention.output.dense.bias", {H}, false);
    lay.add(p + "attention.output.LayerNorm.weight", {H}, false);
    lay.add(p + "attention.output.LayerNorm.bias", {H}, false);
    lay.add(p + "intermediate.dense.bias", {I}, false);
    lay.add(p + "output.dense.bias", {H}, false);
    lay.add(p + "output.LayerNorm.weight", {H}, false);
    lay.add(p + "output.LayerNorm.bias", {H}, false);
  }
  lay.add("bert.pooler.dense.bias", {H}, false);
  lay.add("classifier.bias", {cfg.num_labels}, false);
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
