// BERT WordPiece tokenization with Hugging Face's semantics, from a vocab.txt or a tokenizer.json.
//
// Text is UTF-8; ill-formed bytes become U+FFFD exactly as Python's
// bytes.decode("utf-8", errors="replace") would make them, and text cleaning then drops U+FFFD
// (as Hugging Face does), so invalid bytes vanish and never raise.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace anatomy {

// Whose rules to follow where Hugging Face's two implementations disagree. The differences, all
// at the edges of Unicode (see Note [Two references] in tokenizer.cpp):
//   Transformers: the Python BertTokenizer (BertTokenizerLegacy in transformers 5): NFC before
//     splitting, Python's str.lower() with Final_Sigma, every C* category dropped as control,
//     pair truncation by transformers' longest-first split.
//   Tokenizers: the Rust library behind BertTokenizerFast and tokenizer.json: no NFC, lowercase
//     per character, Cc/Cf/Co dropped, pair truncation by tokenizers' longest-first split.
enum class BertSemantics { Transformers, Tokenizers };

struct BertNormalizerConfig {
  bool clean_text = true;              // drop NUL, U+FFFD and controls; whitespace becomes ' '
  bool handle_chinese_chars = true;    // put spaces around CJK ideographs
  bool lowercase = true;
  std::optional<bool> strip_accents;   // NFD and drop Mn; unset means "as lowercase"
};

enum class Truncation { None, LongestFirst };
enum class Padding { None, MaxLength };

struct Encoding {
  std::vector<int32_t> input_ids;       // (n) [CLS] a [SEP] (b [SEP]) then [PAD]s
  std::vector<int32_t> token_type_ids;  // (n) 0 for [CLS] a [SEP], 1 for b [SEP], 0 for padding
  std::vector<int32_t> attention_mask;  // (n) 1 for tokens, 0 for padding
};

class WordPieceTokenizer {
 public:
  // A vocab.txt (one token a line, the line number its id) with the Python BertTokenizer's rules
  // (or the fast tokenizer's, which AutoTokenizer converts it to). strip_accents unset strips
  // accents exactly when lower-casing.
  static WordPieceTokenizer from_vocab_txt(const std::string& path, bool do_lower_case = true,
                                           std::optional<bool> strip_accents = std::nullopt,
                                           BertSemantics semantics = BertSemantics::Transformers);
  // A tokenizer.json of the BERT kind (WordPiece model, BertNormalizer, BertPreTokenizer, and a
  // BERT post-processor) with the tokenizers library's rules. Its truncation and padding
  // sections are ignored: encode() takes them as arguments.
  static WordPieceTokenizer from_tokenizer_json(const std::string& path);
  // A Hugging Face model directory: its tokenizer.json when present, else its vocab.txt with
  // do_lower_case / strip_accents from tokenizer_config.json (lower-casing when it says nothing),
  // read as AutoTokenizer reads it: the fast tokenizer's rules (BertSemantics::Tokenizers).
  // The error names the directory when it holds neither.
  static WordPieceTokenizer from_directory(const std::string& dir);
  // The tokenizer files of a model directory (tokenizer.json, vocab.txt, tokenizer_config.json,
  // special_tokens_map.json) that exist, so a trainer can copy them next to the saved model.
  static std::vector<std::string> files_in(const std::string& dir);

  // Word-piece ids of the text, without [CLS]/[SEP]. Special tokens written in the text
  // ("[SEP]", case-sensitive) map to their ids.
  std::vector<int32_t> encode_words(std::string_view text) const;
  std::vector<std::string> tokenize(std::string_view text) const;

  // [CLS] a [SEP] or [CLS] a [SEP] b [SEP]. With LongestFirst the word pieces are cut so the whole
  // fits max_length; with MaxLength padding a shorter result is padded to max_length.
  Encoding encode(std::string_view text_a, std::optional<std::string_view> text_b = std::nullopt,
                  size_t max_length = 512, Truncation truncation = Truncation::LongestFirst,
                  Padding padding = Padding::MaxLength) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  const std::string& id_to_token(int32_t id) const;
  size_t vocab_size() const { return m_id_to_token.size(); }
  int32_t cls_id() const { return m_cls; }
  int32_t sep_id() const { return m_sep; }
  int32_t pad_id() const { return m_pad; }
  int32_t unk_id() const { return m_unk; }
  const BertNormalizerConfig& normalizer() const { return m_norm; }
  // Note [BERT as transformers 5 builds it] (data/tokenizer_any.cpp): the same vocabulary and
  // special tokens with `n`, the "##" prefix and 100 characters a word, as BertTokenizer sets them.
  WordPieceTokenizer with_normalizer(const BertNormalizerConfig& n) const;
  BertSemantics semantics() const { return m_semantics; }
  size_t max_input_chars_per_word() const { return m_max_input_chars_per_word; }

 private:
  WordPieceTokenizer() = default;
  void finish(const std::string& path);
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_segment(std::u32string_view segment, std::vector<int32_t>& ids) const;
  void word_pieces(std::u32string_view word, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> m_vocab;
  std::vector<std::string> m_id_to_token;
  std::vector<std::pair<std::u32string, int32_t>> m_special;  // split out before normalizing
  BertNormalizerConfig m_norm;
  BertSemantics m_semantics = BertSemantics::Transformers;
  std::string m_prefix = "##";
  size_t m_max_input_chars_per_word = 100;
  size_t m_max_token_chars = 0;  // the longest vocabulary entry, in code points
  int32_t m_cls = -1, m_sep = -1, m_pad = -1, m_unk = -1;
};

class JsonTokenizer;

// A text given as words (Hugging Face's is_split_into_words), and which word each token is from.
struct WordEncoding {
  Encoding encoding;
  std::vector<int32_t> word_ids;  // (n) the word's index, -1 for special tokens and padding
};

// The tokenizer saved beside a model: its directory's files, copied, and the tokenizer_config.json
// written in their stead (empty: the directory's own, if it has one).
struct TokenizerFiles {
  std::vector<std::string> files;
  std::string config;
};

// Any tokenizer a model directory holds: WordPiece (vocab.txt, or a tokenizer.json with a
// WordPiece model) or a BPE / Unigram tokenizer.json (tokenizer_json.h). Copies share the
// tokenizer (it is immutable).
class Tokenizer {
 public:
  Tokenizer(WordPieceTokenizer wordpiece);  // NOLINT: implicit, so WordPiece callers need no change
  Tokenizer(JsonTokenizer json);            // NOLINT

  // A tokenizer.json of any supported model type.
  static Tokenizer from_tokenizer_json(const std::string& path);
  // A model directory: its tokenizer.json when present, else its vocab.txt (as
  // WordPieceTokenizer::from_directory reads it), built as transformers 5 builds the class the
  // directory names (Note [XLM-R as transformers 5 builds it], [BERT as transformers 5 builds it]):
  // tokenizer_config.json's tokenizer_class, else config.json's model_type, else `model_type`
  // (the model's, whose saved directory will name it: Note [the class of a bare tokenizer]).
  static Tokenizer from_directory(const std::string& dir, const std::string& model_type = "");
  // What to save beside a model trained with `dir`'s tokenizer, built for `model_type` (the
  // model's): Note [the class of a saved tokenizer].
  static TokenizerFiles files_to_save(const std::string& dir, const std::string& model_type);
  // Note [prefix space for words] (data/tokenizer_json.h): a byte-level tokenizer that adds a
  // space before each text, as run_ner.py loads RoBERTa's; any other tokenizer unchanged.
  Tokenizer with_prefix_space() const;

  std::vector<int32_t> encode_words(std::string_view text) const;
  Encoding encode(std::string_view text_a, std::optional<std::string_view> text_b = std::nullopt,
                  size_t max_length = 512, Truncation truncation = Truncation::LongestFirst,
                  Padding padding = Padding::MaxLength) const;
  // Each word tokenized on its own, as the tokenizers library does for pre-split input (so a
  // byte-level BPE with add_prefix_space and a Metaspace start every word as a new word), then the
  // single-sequence special tokens around them, cut to max_length and padded as encode() does.
  WordEncoding encode_split_words(const std::vector<std::string>& words, size_t max_length = 512,
                                  Truncation truncation = Truncation::LongestFirst,
                                  Padding padding = Padding::MaxLength) const;
  int32_t token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;
  size_t vocab_size() const;
  int32_t cls_id() const;
  int32_t sep_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;

  const WordPieceTokenizer* wordpiece() const { return m_wordpiece.get(); }  // null for the others
  const JsonTokenizer* json() const { return m_json.get(); }                 // null for WordPiece

 private:
  std::shared_ptr<const WordPieceTokenizer> m_wordpiece;
  std::shared_ptr<const JsonTokenizer> m_json;
};

}  // namespace anatomy
