#include "model/config.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/read_file.h"

namespace anatomy {
namespace {

using nlohmann::json;

// Reads the typed fields of a config.json object, each error naming the source and the field.
class FieldReader {
 public:
  FieldReader(const json& j, const std::string& source) : m_j(j), m_source(source) {}

  const json* get(const char* key) const {
    auto it = m_j.find(key);
    return it == m_j.end() ? nullptr : &*it;
  }
  const json* get_non_null(const char* key) const {
    const json* v = get(key);
    return v && !v->is_null() ? v : nullptr;
  }

  // Integers only: 768.0, "768" and true are refused, as nn.Linear would refuse them.
  void integer(const char* key, int64_t& out, int64_t min, const char* what) const {
    const json* v = get(key);
    if (!v) return;
    bool ok = false;
    if (v->is_number_unsigned()) {
      ok = v->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      if (ok) out = v->get<int64_t>();
    } else if (v->is_number_integer()) {
      out = v->get<int64_t>();
      ok = true;
    }
    ANATOMY_CHECK(ok && out >= min, m_source, ": field '", key, "' must be ", what, ", got ", v->dump());
  }
  void number(const char* key, double& out) const {
    const json* v = get(key);
    if (!v) return;
    ANATOMY_CHECK(v->is_number(), m_source, ": field '", key, "' must be a number, got ", v->dump());
    out = v->get<double>();
  }
  void string(const char* key, std::string& out) const {
    const json* v = get(key);
    if (!v) return;
    ANATOMY_CHECK(v->is_string(), m_source, ": field '", key, "' must be a string, got ", v->dump());
    out = v->get<std::string>();
  }

  const std::string& source() const { return m_source; }

 private:
  const json& m_j;
  const std::string& m_source;
};

// "3" -> 3; id2label keys are JSON strings holding integers.
bool parse_label_id(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

std::string truncated(std::string s) {
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace

std::vector<std::string> BertConfig::preset_names() {
  return {"bert-tiny",    "bert-mini",        "bert-base",       "bert-large",   "roberta-base",
          "xlm-roberta-base", "distilbert-base", "electra-small", "electra-base", "modernbert-base"};
}

// The bert presets are BertConfig's defaults at other sizes; the others are the config.json of
// the Hub checkpoint of that name (roberta-base, xlm-roberta-base, distilbert-base-uncased,
// google/electra-{small,base}-discriminator) for sequence classification.
BertConfig BertConfig::preset(std::string_view name) {
  BertConfig c;  // HF defaults are bert-base
  auto shape = [&](int64_t layers, int64_t hidden, int64_t heads, int64_t inter) {
    c.num_hidden_layers = layers;
    c.hidden_size = hidden;
    c.num_attention_heads = heads;
    c.intermediate_size = inter;
  };
  auto roberta = [&](Architecture a, int64_t vocab) {
    c.architecture = a;
    c.vocab_size = vocab;
    c.max_position_embeddings = 514;
    c.type_vocab_size = 1;
    c.pad_token_id = 1;
    c.bos_token_id = 0;
    c.eos_token_id = 2;
    c.layer_norm_eps = 1e-5;
  };
  if (name == "bert-tiny") shape(2, 128, 2, 512);
  else if (name == "bert-mini") shape(4, 256, 4, 1024);
  else if (name == "bert-base") shape(12, 768, 12, 3072);
  else if (name == "bert-large") shape(24, 1024, 16, 4096);
  else if (name == "roberta-base") roberta(Architecture::Roberta, 50265);
  else if (name == "xlm-roberta-base") roberta(Architecture::XlmRoberta, 250002);
  else if (name == "modernbert-base") {
    BertConfig m = from_json(json{{"model_type", "modernbert"}}, "preset modernbert-base");
    m.architectures = {m.sequence_classification_class()};
    return m;
  } else if (name == "distilbert-base") {
    c.architecture = Architecture::DistilBert;
    shape(6, 768, 12, 3072);
    c.classifier_dropout = 0.2;  // seq_classif_dropout
  } else if (name == "electra-small" || name == "electra-base") {
    c.architecture = Architecture::Electra;
    if (name == "electra-small") shape(12, 256, 4, 1024);
    c.embedding_size = name == "electra-small" ? 128 : 768;
  } else {
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    fail("unknown model preset '", name, "' (valid: ", valid, ")");
  }
  c.architectures = {c.sequence_classification_class()};
  return c;
}

void BertConfig::set_num_labels(int64_t n) {
  ANATOMY_CHECK(n > 0 && n <= std::numeric_limits<int>::max(), "num_labels must be a positive integer, got ", n);
  num_labels = n;
  id2label.clear();
  label2id.clear();
  for (int i = 0; i < static_cast<int>(n); ++i) {
    id2label[i] = "LABEL_" + std::to_string(i);
    label2id[id2label[i]] = i;
  }
}

namespace {

bool read_bool(const FieldReader& f, const char* key, bool fallback) {
  const json* v = f.get_non_null(key);
  if (!v) return fallback;
  ANATOMY_CHECK(v->is_boolean(), f.source(), ": field '", key, "' must be true or false, got ", truncated(v->dump()));
  return v->get<bool>();
}

// ModernBertConfig: layer_types and rope_parameters (transformers 5) or the older
// global_attn_every_n_layers, global_rope_theta and local_rope_theta.
void read_modernbert(const FieldReader& f, BertConfig& c) {
  ModernBertFields& m = c.modern;
  f.string("hidden_activation", c.hidden_act);
  f.number("norm_eps", c.layer_norm_eps);
  double drop = 0;
  for (const char* key : {"embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout"}) {
    double p = 0;
    f.number(key, p);
    drop = std::max(drop, p);
  }
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = drop;
  c.classifier_dropout = drop;
  f.integer("global_attn_every_n_layers", m.global_attn_every_n_layers, 1, "a positive integer");
  f.integer("local_attention", m.local_attention, 2, "an integer >= 2");
  f.number("global_rope_theta", m.global_rope_theta);
  f.number("local_rope_theta", m.local_rope_theta);
  if (const json* r = f.get_non_null("rope_parameters")) {
    ANATOMY_CHECK(r->is_object(), f.source(), ": field 'rope_parameters' must be an object");
    for (auto [key, theta] : {std::pair<const char*, double*>{"full_attention", &m.global_rope_theta},
                              std::pair<const char*, double*>{"sliding_attention", &m.local_rope_theta}}) {
      auto it = r->find(key);
      if (it == r->end() || it->is_null()) continue;
      const std::string type = it->value("rope_type", std::string("default"));
      ANATOMY_CHECK(type == "default", f.source(), ": rope_parameters.", key, ".rope_type '", truncated(type),
                    "' is not supported (only \"default\")");
      if (it->contains("rope_theta") && (*it)["rope_theta"].is_number()) *theta = (*it)["rope_theta"].get<double>();
    }
  }
  m.global_layers.clear();
  if (const json* t = f.get_non_null("layer_types")) {
    ANATOMY_CHECK(t->is_array() && static_cast<int64_t>(t->size()) == c.num_hidden_layers, f.source(),
                  ": field 'layer_types' must list num_hidden_layers ", c.num_hidden_layers, " layer types");
    for (const json& v : *t) {
      const std::string s = v.is_string() ? v.get<std::string>() : "";
      ANATOMY_CHECK(s == "full_attention" || s == "sliding_attention", f.source(), ": field 'layer_types' has ",
                    truncated(v.dump()), " (expected full_attention or sliding_attention)");
      m.global_layers.push_back(s == "full_attention");
    }
  }
  m.attention_bias = read_bool(f, "attention_bias", m.attention_bias);
  m.mlp_bias = read_bool(f, "mlp_bias", m.mlp_bias);
  m.norm_bias = read_bool(f, "norm_bias", m.norm_bias);
  m.classifier_bias = read_bool(f, "classifier_bias", m.classifier_bias);
  m.decoder_bias = read_bool(f, "decoder_bias", m.decoder_bias);
  f.string("classifier_pooling", m.classifier_pooling);
  f.string("classifier_activation", m.classifier_activation);
  f.integer("cls_token_id", m.cls_token_id, 0, "a non-negative integer");
  f.integer("sep_token_id", m.sep_token_id, 0, "a non-negative integer");
  c.fill_modernbert_layers();
}

json modernbert_json(const BertConfig& c) {
  const ModernBertFields& m = c.modern;
  json types = json::array();
  for (bool g : m.global_layers) types.push_back(g ? "full_attention" : "sliding_attention");
  return {
      {"attention_bias", m.attention_bias},
      {"attention_dropout", c.attention_probs_dropout_prob},
      {"classifier_activation", m.classifier_activation},
      {"classifier_bias", m.classifier_bias},
      {"classifier_dropout", c.classifier_dropout.value_or(0.0)},
      {"classifier_pooling", m.classifier_pooling},
      {"cls_token_id", m.cls_token_id},
      {"decoder_bias", m.decoder_bias},
      {"embedding_dropout", c.hidden_dropout_prob},
      {"global_attn_every_n_layers", m.global_attn_every_n_layers},
      {"global_rope_theta", m.global_rope_theta},
      {"hidden_activation", c.hidden_act},
      {"hidden_size", c.hidden_size},
      {"initializer_range", c.initializer_range},
      {"intermediate_size", c.intermediate_size},
      {"layer_types", types},
      {"local_attention", m.local_attention},
      {"local_rope_theta", m.local_rope_theta},
      {"max_position_embeddings", c.max_position_embeddings},
      {"mlp_bias", m.mlp_bias},
      {"mlp_dropout", c.hidden_dropout_prob},
      {"model_type", c.model_type()},
      {"norm_bias", m.norm_bias},
      {"norm_eps", c.layer_norm_eps},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"pad_token_id", c.pad_token_id},
      {"rope_parameters",
       {{"full_attention", {{"rope_theta", m.global_rope_theta}, {"rope_type", "default"}}},
        {"sliding_attention", {{"rope_theta", m.local_rope_theta}, {"rope_type", "default"}}}}},
      {"sep_token_id", m.sep_token_id},
      {"torch_dtype", "float32"},
      {"vocab_size", c.vocab_size},
  };
}

}  // namespace

void BertConfig::fill_modernbert_layers() {
  if (static_cast<int64_t>(modern.global_layers.size()) == num_hidden_layers) return;
  modern.global_layers.clear();
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    modern.global_layers.push_back(l % modern.global_attn_every_n_layers == 0);
}

BertConfig BertConfig::from_json_file(const std::string& path) {
  const std::string text = read_regular_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    std::string msg = e.what();
    if (auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    const auto* pe = dynamic_cast<const json::parse_error*>(&e);
    fail(path, ": not valid JSON", pe ? str_cat(" at byte ", pe->byte) : std::string(), ": ", msg);
  }
  // Without model_type, transformers' AutoConfig takes the longest model type named in the model's
  // name (old BERT checkpoints such as google/bert_uncased_L-2_H-128_A-2 have none) and refuses
  // the file when the name holds none; so does anatomy, rather than read another family's fields
  // as BERT's defaults. The name: the directory's, or a Hub cache snapshot's models--org--name
  // (not the directories above it). Families whose names contain a supported one's (ALBERT,
  // CamemBERT, DeBERTa, ...) are named so as to be refused, not read as BERT.
  if (j.is_object() && !j.contains("model_type")) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::string name = dir.filename().string();
    for (const std::filesystem::path& part : dir)
      if (part.string().starts_with("models--")) name = part.string();
    std::string named;
    for (const char* t : {"xlm-roberta", "modernbert", "distilbert", "roberta", "electra", "bert", "albert", "camembert",
                          "mobilebert", "deberta", "megatron-bert", "squeezebert", "convbert", "flaubert", "rembert",
                          "roc_bert", "bert-generation"})
      if (name.find(t) != std::string::npos && std::strlen(t) > named.size()) named = t;
    if (named.empty())
      fail(path, ": has no model_type and its directory's name names no model type (bert, roberta, xlm-roberta, ",
           "distilbert, electra, modernbert); add \"model_type\" to it, as transformers' AutoConfig asks");
    j["model_type"] = named;
  }
  return from_json(j, path);
}

BertConfig BertConfig::from_json(const json& j, const std::string& source) {
  ANATOMY_CHECK(j.is_object(), source, ": must be a JSON object, got ", j.type_name());
  FieldReader f(j, source);
  BertConfig c;

  std::string model_type = "bert";
  f.string("model_type", model_type);
  if (model_type == "bert") c.architecture = Architecture::Bert;
  else if (model_type == "roberta") c.architecture = Architecture::Roberta;
  else if (model_type == "xlm-roberta") c.architecture = Architecture::XlmRoberta;
  else if (model_type == "distilbert") c.architecture = Architecture::DistilBert;
  else if (model_type == "electra") c.architecture = Architecture::Electra;
  else if (model_type == "modernbert") c.architecture = Architecture::ModernBert;
  else
    fail(source, ": model_type '", truncated(model_type),
         "' is not supported (expected bert, roberta, xlm-roberta, distilbert, electra or modernbert)");
  const bool modern = c.architecture == Architecture::ModernBert;
  if (modern) {  // ModernBertConfig's defaults where they differ from BertConfig's
    c.vocab_size = 50368, c.intermediate_size = 1152, c.num_hidden_layers = 22, c.max_position_embeddings = 8192;
    c.layer_norm_eps = 1e-5, c.pad_token_id = 50283, c.bos_token_id = 50281, c.eos_token_id = 50282;
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0, c.classifier_dropout = 0.0;
    c.type_vocab_size = 1;
  }
  c.architectures = {c.sequence_classification_class()};
  if (c.is_roberta()) c.pad_token_id = 1;  // RobertaConfig's default

  const char* positive = "a positive integer";
  const bool distil = c.architecture == Architecture::DistilBert;
  f.integer("vocab_size", c.vocab_size, 1, positive);
  f.integer(distil ? "dim" : "hidden_size", c.hidden_size, 1, positive);
  f.integer(distil ? "n_layers" : "num_hidden_layers", c.num_hidden_layers, 1, positive);
  f.integer(distil ? "n_heads" : "num_attention_heads", c.num_attention_heads, 1, positive);
  f.integer(distil ? "hidden_dim" : "intermediate_size", c.intermediate_size, 1, positive);
  f.integer("max_position_embeddings", c.max_position_embeddings, 1, positive);
  if (!distil && !modern) f.integer("type_vocab_size", c.type_vocab_size, 1, positive);
  if (c.architecture == Architecture::Electra) f.integer("embedding_size", c.embedding_size, 1, positive);
  f.integer("pad_token_id", c.pad_token_id, 0, "a non-negative integer");
  for (auto [key, field] : {std::pair<const char*, std::optional<int64_t>*>{"bos_token_id", &c.bos_token_id},
                            std::pair<const char*, std::optional<int64_t>*>{"eos_token_id", &c.eos_token_id}})
    if (f.get_non_null(key)) {
      int64_t v = 0;
      f.integer(key, v, 0, "a non-negative integer");
      *field = v;
    }
  f.number("initializer_range", c.initializer_range);
  if (modern) {
    read_modernbert(f, c);
  } else {
    f.string(distil ? "activation" : "hidden_act", c.hidden_act);
    f.number(distil ? "dropout" : "hidden_dropout_prob", c.hidden_dropout_prob);
    f.number(distil ? "attention_dropout" : "attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  }
  if (distil) {
    // DistilBertConfig: LayerNorm eps fixed at 1e-12, the head's dropout seq_classif_dropout (0.2).
    const json* sin = f.get("sinusoidal_pos_embds");
    ANATOMY_CHECK(!sin || sin->is_null() || (sin->is_boolean() && !sin->get<bool>()), source,
                  ": sinusoidal_pos_embds ", sin ? truncated(sin->dump()) : "", " is not supported (only learned positions, false)");
    double d = 0.2;
    f.number("seq_classif_dropout", d);
    c.classifier_dropout = d;
  } else if (!modern) {  // ModernBERT's norm_eps: read_modernbert
    f.string("position_embedding_type", c.position_embedding_type);
    f.number("layer_norm_eps", c.layer_norm_eps);
  }
  if (!distil && !modern && f.get_non_null("classifier_dropout")) {
    double d = 0;
    f.number("classifier_dropout", d);
    c.classifier_dropout = d;
  }
  if (f.get_non_null("problem_type")) {
    std::string p;
    f.string("problem_type", p);
    c.problem_type = p;
  }
  if (const json* a = f.get_non_null("architectures")) {
    ANATOMY_CHECK(a->is_array(), source, ": field 'architectures' must be an array of strings");
    c.architectures.clear();
    for (const json& s : *a) {
      ANATOMY_CHECK(s.is_string(), source, ": field 'architectures' must be an array of strings");
      c.architectures.push_back(s.get<std::string>());
    }
  }

  // Labels, as PretrainedConfig does: id2label (keys are strings in JSON) sets num_labels and
  // wins over a disagreeing num_labels; otherwise num_labels makes LABEL_i names.
  if (const json* m = f.get_non_null("id2label")) {
    ANATOMY_CHECK(m->is_object() && !m->empty(), source, ": field 'id2label' must be a non-empty object");
    c.id2label.clear();
    for (const auto& [k, v] : m->items()) {
      int id = 0;
      ANATOMY_CHECK(parse_label_id(k, id), source, ": field 'id2label' keys must be non-negative integers, got '",
                    truncated(k), "'");
      // run_glue.py writes integer labels' values as numbers ({"0": 1} for the label 1) and boolean
      // labels' as booleans ({"0": false}): their text names them (Python's, False / True).
      ANATOMY_CHECK(v.is_string() || v.is_number_integer() || v.is_boolean(), source,
                    ": field 'id2label' values must be strings, integers or booleans, got ", truncated(v.dump()));
      const std::string name = v.is_string() ? v.get<std::string>() : v.is_boolean() ? (v.get<bool>() ? "True" : "False")
                                                                                       : v.dump();
      ANATOMY_CHECK(c.id2label.emplace(id, name).second, source,
                    ": field 'id2label' has the id ", id, " twice");
    }
    c.num_labels = static_cast<int64_t>(c.id2label.size());
    c.label2id.clear();
    for (const auto& [id, name] : c.id2label) c.label2id[name] = id;
  } else if (f.get("num_labels")) {
    int64_t n = 0;
    f.integer("num_labels", n, 1, positive);
    ANATOMY_CHECK(n <= 1'000'000, source, ": field 'num_labels' is implausibly large (", n, ")");
    c.set_num_labels(n);
  }
  if (const json* m = f.get_non_null("label2id")) {
    ANATOMY_CHECK(m->is_object(), source, ": field 'label2id' must be an object of integers");
    c.label2id.clear();
    for (const auto& [k, v] : m->items()) {
      ANATOMY_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= std::numeric_limits<int>::max(),
                    source, ": field 'label2id' values must be non-negative integers, got ", truncated(v.dump()));
      c.label2id[k] = v.get<int>();
    }
  }
  if (const json* tie = f.get_non_null("tie_word_embeddings")) {
    ANATOMY_CHECK(tie->is_boolean(), source, ": field 'tie_word_embeddings' must be true or false, got ",
                  truncated(tie->dump()));
    c.tie_word_embeddings = tie->get<bool>();
  }
  c.validate(source);
  return c;
}

json BertConfig::to_json() const {
  json id2 = json::object(), l2i = json::object();
  for (const auto& [id, name] : id2label) id2[std::to_string(id)] = name;
  for (const auto& [name, id] : label2id) l2i[name] = id;
  json j;
  if (architecture == Architecture::ModernBert) {
    j = modernbert_json(*this);
    j["architectures"] = architectures;
    j["id2label"] = id2;
    j["label2id"] = l2i;
  } else if (architecture == Architecture::DistilBert) {  // DistilBertConfig's own field names
    j = {
        {"activation", hidden_act},
        {"architectures", architectures},
        {"attention_dropout", attention_probs_dropout_prob},
        {"dim", hidden_size},
        {"dropout", hidden_dropout_prob},
        {"hidden_dim", intermediate_size},
        {"id2label", id2},
        {"initializer_range", initializer_range},
        {"label2id", l2i},
        {"max_position_embeddings", max_position_embeddings},
        {"model_type", model_type()},
        {"n_heads", num_attention_heads},
        {"n_layers", num_hidden_layers},
        {"pad_token_id", pad_token_id},
        {"seq_classif_dropout", classifier_dropout.value_or(0.2)},
        {"sinusoidal_pos_embds", false},
        {"torch_dtype", "float32"},
        {"vocab_size", vocab_size},
    };
  } else {
    j = {
        {"architectures", architectures},
        {"attention_probs_dropout_prob", attention_probs_dropout_prob},
        {"classifier_dropout", classifier_dropout ? json(*classifier_dropout) : json(nullptr)},
        {"hidden_act", hidden_act},
        {"hidden_dropout_prob", hidden_dropout_prob},
        {"hidden_size", hidden_size},
        {"id2label", id2},
        {"initializer_range", initializer_range},
        {"intermediate_size", intermediate_size},
        {"label2id", l2i},
        {"layer_norm_eps", layer_norm_eps},
        {"max_position_embeddings", max_position_embeddings},
        {"model_type", model_type()},
        {"num_attention_heads", num_attention_heads},
        {"num_hidden_layers", num_hidden_layers},
        {"pad_token_id", pad_token_id},
        {"position_embedding_type", position_embedding_type},
        {"torch_dtype", "float32"},
        {"type_vocab_size", type_vocab_size},
        {"use_cache", true},
        {"vocab_size", vocab_size},
    };
    if (architecture == Architecture::Electra) j["embedding_size"] = embedding_size;
  }
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_id) j["eos_token_id"] = *eos_token_id;
  if (problem_type) j["problem_type"] = *problem_type;
  if (!tie_word_embeddings) j["tie_word_embeddings"] = false;
  return j;
}

const char* BertConfig::model_type() const {
  switch (architecture) {
    case Architecture::Bert: return "bert";
    case Architecture::Roberta: return "roberta";
    case Architecture::XlmRoberta: return "xlm-roberta";
    case Architecture::DistilBert: return "distilbert";
    case Architecture::Electra: return "electra";
    case Architecture::ModernBert: return "modernbert";
  }
  return "?";
}

const char* BertConfig::base_name() const {
  switch (architecture) {
    case Architecture::Bert: return "bert";
    case Architecture::Roberta:
    case Architecture::XlmRoberta: return "roberta";
    case Architecture::DistilBert: return "distilbert";
    case Architecture::Electra: return "electra";
    case Architecture::ModernBert: return "model";
  }
  return "?";
}

std::string BertConfig::sequence_classification_class() const {
  switch (architecture) {
    case Architecture::Bert: return "BertForSequenceClassification";
    case Architecture::Roberta: return "RobertaForSequenceClassification";
    case Architecture::XlmRoberta: return "XLMRobertaForSequenceClassification";
    case Architecture::DistilBert: return "DistilBertForSequenceClassification";
    case Architecture::Electra: return "ElectraForSequenceClassification";
    case Architecture::ModernBert: return "ModernBertForSequenceClassification";
  }
  return "?";
}

void BertConfig::save(const std::string& path) const {
  validate(path);
  write_file_atomic(path, to_json().dump(2) + "\n");
}

void BertConfig::validate(std::string_view src) const {
  auto positive = [&](const char* field, int64_t v) {
    ANATOMY_CHECK(v > 0, src, ": field '", field, "' must be a positive integer, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("intermediate_size", intermediate_size);
  positive("max_position_embeddings", max_position_embeddings);
  positive("type_vocab_size", type_vocab_size);
  positive("num_labels", num_labels);
  ANATOMY_CHECK(hidden_size % num_attention_heads == 0, src, ": hidden_size ", hidden_size,
                " is not a multiple of num_attention_heads ", num_attention_heads);
  // num_parameters() and every size derived from it are int64 products: a field such as
  // max_position_embeddings 1e12 would wrap them. The count is bounded here in long double
  // (2^40 parameters, 4 TiB of fp32 weights, beyond any one machine); the planner then refuses
  // what does not fit the memory actually present.
  const long double n = approximate_parameters();
  ANATOMY_CHECK(n <= 1099511627776.0L, src, ": the model would have about ", static_cast<double>(n),
                " parameters, more than 2^40 (most of them from ", largest_field(), "); lower it");

  auto probability = [&](const char* field, double p) {
    ANATOMY_CHECK(p >= 0.0 && p < 1.0, src, ": field '", field, "' must be a probability in [0, 1), got ", p);
  };
  probability("hidden_dropout_prob", hidden_dropout_prob);
  probability("attention_probs_dropout_prob", attention_probs_dropout_prob);
  if (classifier_dropout) probability("classifier_dropout", *classifier_dropout);
  ANATOMY_CHECK(std::isfinite(layer_norm_eps) && layer_norm_eps > 0, src,
                ": field 'layer_norm_eps' must be a positive number, got ", layer_norm_eps);
  ANATOMY_CHECK(std::isfinite(initializer_range) && initializer_range >= 0, src,
                ": field 'initializer_range' must be a non-negative number, got ", initializer_range);
  ANATOMY_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, src, ": field 'pad_token_id' ", pad_token_id,
                " is outside the vocabulary [0, ", vocab_size, ")");

  if (architecture == Architecture::Electra)
    ANATOMY_CHECK(embedding_size > 0 && embedding_size <= hidden_size, src, ": embedding_size ", embedding_size,
                  " is not supported (anatomy needs 1 <= embedding_size <= hidden_size ", hidden_size, ")");
  ANATOMY_CHECK(max_position_embeddings > position_offset(), src, ": max_position_embeddings ",
                max_position_embeddings, " leaves no position after pad_token_id ", pad_token_id,
                " (RoBERTa counts positions from pad_token_id + 1)");
  ANATOMY_CHECK(hidden_act == "gelu", src, ": hidden_act '", hidden_act,
                "' is not supported (anatomy implements only \"gelu\", the exact erf form)");
  ANATOMY_CHECK(position_embedding_type == "absolute", src, ": position_embedding_type '", position_embedding_type,
                "' is not supported (only \"absolute\")");
  if (architecture == Architecture::ModernBert) {
    ANATOMY_CHECK(head_dim() % 2 == 0, src, ": hidden_size / num_attention_heads = ", head_dim(),
                  " is odd (rotary embeddings rotate pairs of a head's columns)");
    ANATOMY_CHECK(modern.classifier_pooling == "cls" || modern.classifier_pooling == "mean", src,
                  ": classifier_pooling '", modern.classifier_pooling, "' is not cls or mean");
    ANATOMY_CHECK(modern.classifier_activation == "gelu", src, ": classifier_activation '",
                  modern.classifier_activation, "' is not supported (only \"gelu\")");
    ANATOMY_CHECK(static_cast<int64_t>(modern.global_layers.size()) == num_hidden_layers, src,
                  ": layer_types lists ", modern.global_layers.size(), " layers, not ", num_hidden_layers);
    ANATOMY_CHECK(modern.local_attention >= 2, src, ": local_attention ", modern.local_attention, " is below 2");
    ANATOMY_CHECK(hidden_dropout_prob == 0 && attention_probs_dropout_prob == 0 && classifier_dropout.value_or(0) == 0,
                  src, ": ModernBERT with dropout is not implemented in anatomy (its dropouts must be 0, as by default)");
    ANATOMY_CHECK(modern.global_rope_theta > 0 && modern.local_rope_theta > 0, src, ": rope_theta must be positive");
  }
  if (problem_type) {
    const std::string& p = *problem_type;
    ANATOMY_CHECK(p == "regression" || p == "single_label_classification" || p == "multi_label_classification", src,
                  ": problem_type '", p,
                  "' is not one of regression, single_label_classification, multi_label_classification");
  }

  ANATOMY_CHECK(static_cast<int64_t>(id2label.size()) == num_labels, src, ": id2label has ", id2label.size(),
                " labels but num_labels is ", num_labels);
  int expect = 0;
  for (const auto& [id, name] : id2label) {
    ANATOMY_CHECK(id == expect, src, ": id2label ids must be 0..", num_labels - 1, " with none missing; ", expect,
                  " is missing");
    ++expect;
  }
}

long double BertConfig::approximate_parameters() const {
  const long double H = static_cast<long double>(hidden_size), I = static_cast<long double>(intermediate_size);
  const long double E = static_cast<long double>(embedding_width());
  const long double tables = (static_cast<long double>(vocab_size) + static_cast<long double>(max_position_embeddings) +
                              static_cast<long double>(has_token_types() ? type_vocab_size : 0)) * E +
                             (projects_embeddings() ? E * H : 0);
  return tables + static_cast<long double>(num_hidden_layers) * (4 * H * H + 2 * H * I + 16 * H) + H * H +
         H * static_cast<long double>(num_labels + 2);
}

std::string BertConfig::largest_field() const {
  // Each field's share of approximate_parameters(): the embedding tables grow with their row
  // counts, the encoder with its layer count (times its widths), the head with its classes.
  const long double H = static_cast<long double>(hidden_size), I = static_cast<long double>(intermediate_size);
  const std::pair<long double, std::string> shares[] = {
      {static_cast<long double>(vocab_size) * H, str_cat("vocab_size ", vocab_size)},
      {static_cast<long double>(max_position_embeddings) * H, str_cat("max_position_embeddings ", max_position_embeddings)},
      {static_cast<long double>(type_vocab_size) * H, str_cat("type_vocab_size ", type_vocab_size)},
      {static_cast<long double>(num_hidden_layers) * (4 * H * H + 2 * H * I),
       str_cat("num_hidden_layers ", num_hidden_layers, " x (hidden_size ", hidden_size, ", intermediate_size ",
               intermediate_size, ")")},
      {static_cast<long double>(num_labels) * H, str_cat("num_labels ", num_labels)},
  };
  const auto* best = &shares[0];
  for (const auto& s : shares)
    if (s.first > best->first) best = &s;
  return best->second;
}

int64_t BertConfig::num_parameters() const {
  const int64_t H = hidden_size, I = intermediate_size, L = num_labels;
  if (architecture == Architecture::ModernBert) {  // ModernBertForSequenceClassification
    const ModernBertFields& m = modern;
    const int64_t norm = m.norm_bias ? 2 * H : H;
    const int64_t layer = 3 * H * H + (m.attention_bias ? 3 * H : 0) + H * H + (m.attention_bias ? H : 0) + norm +
                          2 * I * H + (m.mlp_bias ? 2 * I : 0) + I * H + (m.mlp_bias ? H : 0);
    // ModernBertForMaskedLM: the decoder tied to the token embeddings, its bias of vocab_size.
    const bool mlm = !architectures.empty() && architectures.front() == "ModernBertForMaskedLM";
    return vocab_size * H + norm + num_hidden_layers * layer + (num_hidden_layers - 1) * norm + norm + H * H +
           (m.classifier_bias ? H : 0) + norm + (mlm ? (m.decoder_bias ? vocab_size : 0) : H * L + L);
  }
  const int64_t E = embedding_width();
  int64_t embeddings = (vocab_size + max_position_embeddings + (has_token_types() ? type_vocab_size : 0)) * E + 2 * E;
  if (projects_embeddings()) embeddings += E * H + H;  // ELECTRA's embeddings_project
  const int64_t attention = 4 * (H * H + H) + 2 * H;        // q, k, v, output dense + LayerNorm
  const int64_t ffn = (H * I + I) + (I * H + H) + 2 * H;    // intermediate, output + LayerNorm
  const int64_t pooler = H * H + H;  // or the head's dense / pre_classifier layer: the same size
  const int64_t classifier = H * L + L;
  return embeddings + num_hidden_layers * (attention + ffn) + pooler + classifier;
}

}  // namespace anatomy
