// Encoder hyper-parameters with Hugging Face names and defaults (transformers BertConfig), read from
// and written to config.json so a checkpoint directory loads in transformers as the
// *ForSequenceClassification class of its model_type. One encoder with explicit variants
// (Architecture): the fields below are BERT's; DistilBERT's own spellings (dim, n_layers, ...)
// are mapped onto them when read and written back under their own names.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy {

// config.json's model_type. The variants differ only at the embeddings, the classification head
// and the tensor names (Note [encoder variants] in model/bert.cpp).
//   Bert:       word + position + token type embeddings; pooler (dense + tanh) then classifier.
//   Roberta:    positions start after pad_token_id; head dense + tanh + out_proj, no pooler.
//   XlmRoberta: RoBERTa under model_type "xlm-roberta" (the same tensors, prefix "roberta.").
//   DistilBert: no token types; pre_classifier + ReLU + classifier; no dropout after attention.
//   Electra:    embedding tables of width embedding_size, projected to hidden_size when they
//               differ; head dense + GELU + out_proj.
//   ModernBert: a different layer (rotary positions, pre-norm, gated GELU, local attention);
//               its own model class (model/modernbert.h), fields in BertConfig::modern.
enum class Architecture : uint8_t { Bert, Roberta, XlmRoberta, DistilBert, Electra, ModernBert };

// ModernBertConfig's own fields (transformers' names and defaults); layer_norm_eps holds norm_eps.
struct ModernBertFields {
  // Per layer: true for global ("full_attention"), false for local ("sliding_attention").
  // From layer_types when config.json has it, else layer l is global iff l % every_n == 0.
  std::vector<bool> global_layers;
  int64_t global_attn_every_n_layers = 3;
  int64_t local_attention = 128;  // a local layer's query sees keys within +-local_attention/2
  double global_rope_theta = 160000.0, local_rope_theta = 10000.0;
  bool attention_bias = false, mlp_bias = false, norm_bias = false, classifier_bias = false;
  bool decoder_bias = true;  // ModernBertForMaskedLM's decoder.bias
  std::string classifier_pooling = "cls";  // or "mean" over the attention mask
  std::string classifier_activation = "gelu";
  int64_t cls_token_id = 50281, sep_token_id = 50282;
  bool operator==(const ModernBertFields&) const = default;
};

struct BertConfig {
  Architecture architecture = Architecture::Bert;
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";  // exact (erf) GELU is the only activation implemented
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  std::optional<double> classifier_dropout;  // unset: the head uses hidden_dropout_prob
  bool tie_word_embeddings = true;  // false: a masked-LM decoder of its own (refused: check_masked_lm_decoder)
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double initializer_range = 0.02;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
  std::optional<int64_t> bos_token_id, eos_token_id;  // carried through when the file has them
  int64_t embedding_size = 128;  // ELECTRA only (its default); the others embed at hidden_size
  std::string position_embedding_type = "absolute";  // the only one implemented
  ModernBertFields modern;  // Architecture::ModernBert only

  // Classification head. As in transformers, id2label decides num_labels when present; use
  // set_num_labels() to change the count with default "LABEL_i" names.
  int64_t num_labels = 2;
  std::map<int, std::string> id2label{{0, "LABEL_0"}, {1, "LABEL_1"}};
  std::map<std::string, int> label2id{{"LABEL_0", 0}, {"LABEL_1", 1}};
  // "regression", "single_label_classification" or "multi_label_classification"; unset lets
  // the model infer it from num_labels and the label dtype, as transformers does.
  std::optional<std::string> problem_type;
  std::vector<std::string> architectures{"BertForSequenceClassification"};

  bool operator==(const BertConfig&) const = default;

  // "bert-tiny", "bert-mini", "bert-base", "bert-large", ..., "modernbert-base"; anything else is an error naming these.
  static BertConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Errors: "<path>: cannot open ...", "<path>: not valid JSON at byte N: ...",
  // "<path>: field 'hidden_size' must be a positive integer", and everything validate() finds.
  static BertConfig from_json_file(const std::string& path);
  static BertConfig from_json(const nlohmann::json& j, const std::string& source_name);
  nlohmann::json to_json() const;  // keys sorted, as transformers writes them
  void save(const std::string& path) const;  // atomically, 2-space indented

  // ModernBERT: global_layers from global_attn_every_n_layers unless it already lists every layer.
  void fill_modernbert_layers();

  // Sets num_labels with id2label {i: "LABEL_i"} and the matching label2id.
  void set_num_labels(int64_t n);

  // Throws a one-line "<source>: ..." error for any inconsistent or unsupported setting.
  void validate(std::string_view source = "config") const;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool is_modernbert() const { return architecture == Architecture::ModernBert; }
  bool is_global_layer(int64_t l) const { return modern.global_layers.at(static_cast<size_t>(l)); }

  // "bert", "roberta", "xlm-roberta", "distilbert", "electra".
  const char* model_type() const;
  // The base model's attribute in *ForSequenceClassification: "bert", "roberta", "distilbert", "electra".
  const char* base_name() const;
  std::string sequence_classification_class() const;  // e.g. "RobertaForSequenceClassification"
  // Width of the embedding tables and their LayerNorm (ELECTRA's embedding_size).
  int64_t embedding_width() const { return architecture == Architecture::Electra ? embedding_size : hidden_size; }
  bool projects_embeddings() const { return embedding_width() != hidden_size; }
  bool has_token_types() const { return architecture != Architecture::DistilBert; }
  bool has_pooler() const { return architecture == Architecture::Bert; }
  // Row of the position table that the first token reads: RoBERTa counts positions from
  // pad_token_id + 1 (Note [roberta positions] in model/bert.cpp).
  int64_t position_offset() const { return is_roberta() ? pad_token_id + 1 : 0; }
  // The longest sequence the position table holds.
  int64_t max_sequence_length() const { return max_position_embeddings - position_offset(); }
  bool is_roberta() const { return architecture == Architecture::Roberta || architecture == Architecture::XlmRoberta; }
  // Exact parameter count of the variant's *ForSequenceClassification (validate() first:
  // unvalidated sizes may overflow int64).
  int64_t num_parameters() const;
  // The same count in long double, which no field can overflow (validate() bounds it).
  long double approximate_parameters() const;
  // The field whose size holds most of the parameters, with its value ("max_position_embeddings
  // 1000000"): what an error about a model too large for memory asks the user to lower.
  std::string largest_field() const;
};

}  // namespace anatomy
