// Tokenizer: WordPiece or a tokenizer.json pipeline behind one interface.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_json.h"

namespace anatomy {

Tokenizer::Tokenizer(WordPieceTokenizer wordpiece)
    : m_wordpiece(std::make_shared<const WordPieceTokenizer>(std::move(wordpiece))) {}
Tokenizer::Tokenizer(JsonTokenizer json) : m_json(std::make_shared<const JsonTokenizer>(std::move(json))) {}

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ANATOMY_CHECK(in.good(), "cannot open tokenizer file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string type;
  try {
    const auto j = nlohmann::json::parse(ss.str());
    if (j.is_object() && j.contains("model") && j["model"].is_object())
      type = j["model"].value("type", std::string(j["model"].contains("merges") ? "BPE" : "WordPiece"));
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer file '", path, "' is not valid JSON: ", e.what());
  }
  if (type == "BPE" || type == "Unigram") return JsonTokenizer::from_file(path);
  return WordPieceTokenizer::from_tokenizer_json(path);  // WordPiece, or its error for other types
}

namespace {

// transformers truncates on the side tokenizer_config.json's truncation_side names (right by
// default); anatomy truncates on the right only, so a left-truncating tokenizer is refused rather
// than given other tokens than the user's script would see.
void refuse_left_truncation(const std::filesystem::path& dir) {
  const auto cfg = dir / "tokenizer_config.json";
  if (!std::filesystem::is_regular_file(cfg)) return;
  std::ifstream in(cfg, std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("truncation_side") || !j["truncation_side"].is_string()) return;
  const std::string side = j["truncation_side"].get<std::string>();
  ANATOMY_CHECK(side != "left", cfg.string(), ": truncation_side \"left\" is not supported: anatomy keeps a text's "
                "first tokens (truncation_side \"right\", transformers' default); set it to \"right\" or shorten the texts");
}

// A JSON object file of a tokenizer directory, {} when absent; one that is not a JSON object is an
// error naming it (read as {}, a cased tokenizer would have been lower-cased without a word).
nlohmann::json read_json_object(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path)) return nlohmann::json::object();
  std::ifstream in(path, std::ios::binary);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ANATOMY_CHECK(j.is_object(), path.string(), " is not a JSON object (", j.is_discarded() ? "not valid JSON" : j.type_name(),
                ")");
  return j;
}

// The model type whose tokenizer class AutoTokenizer takes for `dir` when tokenizer_config.json
// names no class: config.json's model_type, else `fallback`.
//
// Note [the class of a bare tokenizer]
// A tokenizer directory naming no class (only a tokenizer.json, say, passed with --tokenizer) is
// built as the model's type builds it: the run saves that tokenizer.json beside a config.json of
// the model's type, so transformers (and `anatomy eval`) build the saved model's tokenizer as that
// type's class; training on the same tokens keeps the saved model's tokens its training's.
std::string model_type_of(const std::filesystem::path& dir, const std::string& fallback) {
  const nlohmann::json config = read_json_object(dir / "config.json");
  if (config.value("model_type", nlohmann::json()).is_string()) return config["model_type"].get<std::string>();
  return fallback;
}

// Note [XLM-R as transformers 5 builds it] (data/tokenizer_json.cpp): the class AutoTokenizer
// would build for `dir` is XLMRobertaTokenizer: tokenizer_config.json's tokenizer_class, or
// without one the model type's.
bool xlm_roberta_class(const std::filesystem::path& dir, const nlohmann::json& tokenizer_config, const std::string& type) {
  if (tokenizer_config.contains("tokenizer_class") && tokenizer_config["tokenizer_class"].is_string())
    return tokenizer_config["tokenizer_class"].get<std::string>().rfind("XLMRobertaTokenizer", 0) == 0;
  return model_type_of(dir, type) == "xlm-roberta";
}

// Note [BERT as transformers 5 builds it]
// transformers 5's BertTokenizer (DistilBERT's and ELECTRA's too) builds its pipeline from its
// constructor's arguments, tokenizer_config.json's: BertNormalizer(clean_text, handle_chinese_chars
// = tokenize_chinese_chars, strip_accents, lowercase = do_lower_case), defaults true, true, unset,
// true, whatever the tokenizer.json's normalizer says (a cased tokenizer.json with no
// tokenizer_config.json is lower-cased: "Hello" becomes "hello"); the vocabulary and special
// tokens are the file's. So for such a directory (the class named, or none named and config.json's
// model_type bert, distilbert or electra) the normalizer is tokenizer_config.json's. Hub models
// state both alike; the rule matters for a tokenizer saved without its config.
bool bert_class(const std::filesystem::path& dir, const nlohmann::json& tokenizer_config, const std::string& model_type) {
  if (tokenizer_config.contains("tokenizer_class") && tokenizer_config["tokenizer_class"].is_string()) {
    const std::string c = tokenizer_config["tokenizer_class"].get<std::string>();
    for (const char* name : {"BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer"})
      if (c.rfind(name, 0) == 0) return true;
    return false;
  }
  const std::string type = model_type_of(dir, model_type);
  return type == "bert" || type == "distilbert" || type == "electra";
}

BertNormalizerConfig bert_class_normalizer(const nlohmann::json& cfg, const std::filesystem::path& dir) {
  // A value of another type ("false", a string) fails in transformers' BertNormalizer: here too.
  for (const char* key : {"do_lower_case", "tokenize_chinese_chars", "strip_accents"})
    ANATOMY_CHECK(!cfg.contains(key) || cfg[key].is_boolean() || (cfg[key].is_null() && key == std::string("strip_accents")),
                  (dir / "tokenizer_config.json").string(), ": ", key, " must be true or false (got ", cfg[key].dump(), ")");
  const auto flag = [&](const char* key, bool fallback) {
    return cfg.contains(key) && cfg[key].is_boolean() ? cfg[key].get<bool>() : fallback;
  };
  BertNormalizerConfig n;
  n.clean_text = true;
  n.handle_chinese_chars = flag("tokenize_chinese_chars", true);
  n.lowercase = flag("do_lower_case", true);
  if (cfg.contains("strip_accents") && cfg["strip_accents"].is_boolean()) n.strip_accents = cfg["strip_accents"].get<bool>();
  return n;
}

}  // namespace

Tokenizer Tokenizer::with_prefix_space() const { return m_json ? Tokenizer(m_json->with_prefix_space()) : *this; }

Tokenizer Tokenizer::from_directory(const std::string& dir, const std::string& model_type) {
  refuse_left_truncation(dir);
  const auto file = std::filesystem::path(dir) / "tokenizer.json";
  Tokenizer t = std::filesystem::is_regular_file(file) ? from_tokenizer_json(file.string())
                                                       : Tokenizer(WordPieceTokenizer::from_directory(dir));
  const nlohmann::json cfg = read_json_object(std::filesystem::path(dir) / "tokenizer_config.json");
  if (t.m_wordpiece && bert_class(dir, cfg, model_type)) return Tokenizer(t.m_wordpiece->with_normalizer(bert_class_normalizer(cfg, dir)));
  if (t.m_json && xlm_roberta_class(dir, cfg, model_type)) {
    const nlohmann::json prefix = cfg.value("add_prefix_space", nlohmann::json(true));
    // bos_token / eos_token: a string, or an AddedToken's {"content": ...}.
    const auto token = [&](const char* key, const char* fallback) {
      const nlohmann::json v = cfg.value(key, nlohmann::json());
      if (v.is_string()) return v.get<std::string>();
      if (v.is_object() && v.value("content", nlohmann::json()).is_string()) return v["content"].get<std::string>();
      return std::string(fallback);
    };
    return Tokenizer(t.m_json->as_xlm_roberta_class(!prefix.is_boolean() || prefix.get<bool>(), token("bos_token", "<s>"),
                                                    token("eos_token", "</s>")));
  }
  return t;
}

// Note [the class of a saved tokenizer]
// A tokenizer directory naming no class is built as its own config.json's model_type says, as
// AutoTokenizer builds it (run_glue.py's --tokenizer_name), and only without one as the model's
// type (Note [the class of a bare tokenizer]). The saved model's config.json is the model's: a
// --tokenizer directory of another type (a RoBERTa tokenizer directory beside an XLM-R model)
// reloaded as the model's type's class, tokenizing otherwise than in training. The class it was
// built as is then written in the saved tokenizer_config.json, as transformers' save_pretrained
// writes tokenizer_class; a directory whose class is the model type's is copied as it is.
TokenizerFiles Tokenizer::files_to_save(const std::string& dir, const std::string& model_type) {
  TokenizerFiles out;
  for (const char* name : {"tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model",
                           "spm.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"}) {
    const auto p = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(p)) out.files.push_back(p.string());
  }
  nlohmann::json cfg = read_json_object(std::filesystem::path(dir) / "tokenizer_config.json");
  const auto class_of = [](const std::string& type) -> std::string {
    for (const auto& [t, c] : std::initializer_list<std::pair<const char*, const char*>>{
             {"bert", "BertTokenizer"}, {"distilbert", "DistilBertTokenizer"}, {"electra", "ElectraTokenizer"},
             {"roberta", "RobertaTokenizer"}, {"xlm-roberta", "XLMRobertaTokenizer"}})
      if (type == t) return c;
    return "PreTrainedTokenizerFast";
  };
  const std::string built = class_of(model_type_of(dir, model_type));
  // A class named (as from_directory reads it), or the model type's: nothing to record. Nor a
  // generic class for a vocab.txt directory, which transformers cannot build as one.
  if ((cfg.contains("tokenizer_class") && cfg["tokenizer_class"].is_string()) || built == class_of(model_type) ||
      (built == "PreTrainedTokenizerFast" && !std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json")))
    return out;
  cfg["tokenizer_class"] = built;
  out.config = cfg.dump(2) + "\n";
  return out;
}

#define ANATOMY_DISPATCH(call) (m_wordpiece ? m_wordpiece->call : m_json->call)

std::vector<int32_t> Tokenizer::encode_words(std::string_view text) const { return ANATOMY_DISPATCH(encode_words(text)); }
Encoding Tokenizer::encode(std::string_view a, std::optional<std::string_view> b, size_t max_length, Truncation t,
                           Padding p) const {
  return ANATOMY_DISPATCH(encode(a, b, max_length, t, p));
}
int32_t Tokenizer::token_to_id(std::string_view token) const { return ANATOMY_DISPATCH(token_to_id(token)); }
const std::string& Tokenizer::id_to_token(int32_t id) const { return ANATOMY_DISPATCH(id_to_token(id)); }
size_t Tokenizer::vocab_size() const { return ANATOMY_DISPATCH(vocab_size()); }
int32_t Tokenizer::cls_id() const { return ANATOMY_DISPATCH(cls_id()); }
int32_t Tokenizer::sep_id() const { return ANATOMY_DISPATCH(sep_id()); }
int32_t Tokenizer::pad_id() const { return ANATOMY_DISPATCH(pad_id()); }
int32_t Tokenizer::unk_id() const { return ANATOMY_DISPATCH(unk_id()); }

#undef ANATOMY_DISPATCH

WordEncoding Tokenizer::encode_split_words(const std::vector<std::string>& words, size_t max_length,
                                           Truncation truncation, Padding padding) const {
  std::vector<int32_t> ids, from;
  for (size_t w = 0; w < words.size(); ++w) {
    const std::vector<int32_t> piece = encode_words(words[w]);
    ids.insert(ids.end(), piece.begin(), piece.end());
    from.insert(from.end(), piece.size(), static_cast<int32_t>(w));
  }
  // The single-sequence template: [CLS] A [SEP] for WordPiece, the post-processor's otherwise.
  using Item = JsonTokenizer::TemplateItem;
  const std::vector<Item> tpl = m_json ? m_json->single_template()
                                       : std::vector<Item>{{-1, {cls_id()}, 0}, {0, {}, 0}, {-1, {sep_id()}, 0}};
  size_t specials = 0;
  for (const Item& it : tpl) specials += it.ids.size();
  if (truncation == Truncation::LongestFirst) {
    ANATOMY_CHECK(max_length >= specials, "max_length ", max_length, " cannot hold the ", specials,
                  " special tokens of a single encoding");
    if (ids.size() > max_length - specials) ids.resize(max_length - specials), from.resize(max_length - specials);
  }
  WordEncoding out;
  Encoding& e = out.encoding;
  for (const Item& it : tpl) {
    const bool text = it.sequence >= 0;
    const std::vector<int32_t>& part = text ? ids : it.ids;
    e.input_ids.insert(e.input_ids.end(), part.begin(), part.end());
    e.token_type_ids.insert(e.token_type_ids.end(), part.size(), it.type_id);
    if (text) out.word_ids.insert(out.word_ids.end(), from.begin(), from.end());
    else out.word_ids.insert(out.word_ids.end(), part.size(), -1);
  }
  const size_t n = e.input_ids.size();
  e.attention_mask.assign(n, 1);
  if (padding == Padding::MaxLength && n < max_length) {
    ANATOMY_CHECK(pad_id() >= 0, "padding needs a pad token and the tokenizer has none");
    e.input_ids.resize(max_length, pad_id());
    e.token_type_ids.resize(max_length, 0);
    e.attention_mask.resize(max_length, 0);
    out.word_ids.resize(max_length, -1);
  }
  return out;
}

}  // namespace anatomy
