// Tokenizers read from a Hugging Face tokenizer.json whose model is BPE (byte-level: RoBERTa,
// GPT-2, ModernBERT) or Unigram (SentencePiece: XLM-R), with the ids the tokenizers library
// (0.23) gives: added tokens split out first (lstrip/rstrip, normalized or not), then the
// normalizer, pre-tokenizer and model, then the post-processor's special tokens and longest-first
// truncation. WordPiece files are read by WordPieceTokenizer (tokenizer.h).
//
// What these files use, and so what is implemented (anything else is a one-line error naming
// the file): normalizers NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, Replace
// (a string, or a repeated character such as " {2,}"), Precompiled (SentencePiece's map) and
// Sequence; pre-tokenizers ByteLevel, Metaspace, WhitespaceSplit and Sequence; models BPE
// (without dropout) and Unigram; post-processors RobertaProcessing, BertProcessing,
// TemplateProcessing, ByteLevel and Sequence. The file's own truncation and padding sections are
// not applied: encode() takes them as arguments, as for WordPiece.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace anatomy {

namespace tok {
struct Normalizer;
struct PreTokenizer;
struct Model;
}  // namespace tok

class JsonTokenizer {
 public:
  static JsonTokenizer from_file(const std::string& path);
  // The same pipeline with its byte-level pre-tokenizer adding a space before the text (each
  // word, for pre-split words), as AutoTokenizer(add_prefix_space=True) builds it (Note [prefix
  // space for words]); a pipeline without one is the same.
  JsonTokenizer with_prefix_space() const;
  // Note [XLM-R as transformers 5 builds it]: the file's vocabulary and Precompiled normalizer
  // with transformers 5's XLMRobertaTokenizer pipeline around them (`bos` $A `eos` templates).
  JsonTokenizer as_xlm_roberta_class(bool add_prefix_space, const std::string& bos, const std::string& eos) const;
  JsonTokenizer(JsonTokenizer&&) noexcept;
  JsonTokenizer& operator=(JsonTokenizer&&) noexcept;
  ~JsonTokenizer();

  // Ids of the text without the post-processor's special tokens.
  std::vector<int32_t> encode_words(std::string_view text) const;
  // The post-processor's template around the text (and the pair), cut longest-first so the whole
  // fits max_length, padded with the pad id to max_length when asked.
  Encoding encode(std::string_view text_a, std::optional<std::string_view> text_b = std::nullopt,
                  size_t max_length = 512, Truncation truncation = Truncation::LongestFirst,
                  Padding padding = Padding::MaxLength) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string& id_to_token(int32_t id) const;
  size_t vocab_size() const { return m_id_to_token.size(); }
  int32_t cls_id() const { return m_cls; }  // the first special token of the single template
  int32_t sep_id() const { return m_sep; }  // the last one
  int32_t pad_id() const { return m_pad; }
  int32_t unk_id() const;
  const std::string& file_bytes() const { return m_file; }  // for cache keys

  // One item of a post-processor template: a special token's ids, or sequence A (0) or B (1).
  struct TemplateItem {
    int sequence = -1;  // -1: special
    std::vector<int32_t> ids;
    int32_t type_id = 0;
  };
  const std::vector<TemplateItem>& single_template() const { return m_single; }

  struct AddedToken {
    std::u32string content;  // as matched: normalized content for normalized tokens
    int32_t id = 0;
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
  };

 private:
  JsonTokenizer();
  struct Segment {
    std::u32string text;
    int32_t id = -1;  // an added token's id, or -1 for text
    bool at_origin = false;
  };
  std::vector<Segment> split_added(std::u32string_view text, bool normalized, bool at_origin) const;
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  static JsonTokenizer from_text(std::string bytes, const std::string& path);

  std::string m_file, m_path;
  std::unique_ptr<tok::Normalizer> m_normalizer;
  std::unique_ptr<tok::PreTokenizer> m_pre;
  std::unique_ptr<tok::Model> m_model;
  std::vector<AddedToken> m_added;
  std::vector<TemplateItem> m_single, m_pair;
  std::unordered_map<std::string, int32_t> m_vocab;
  std::vector<std::string> m_id_to_token;
  int32_t m_cls = -1, m_sep = -1, m_pad = -1;
};

}  // namespace anatomy
