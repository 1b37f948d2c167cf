#include "data/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/unicode.h"
#include "io/read_file.h"

// Note [Two references]
// Hugging Face has two BERT tokenizers and they disagree at the edges; a tokenizer.json follows
// the Rust library that reads it, and so does a model directory's vocab.txt (AutoTokenizer, as
// run_glue.py calls it, converts it to the fast tokenizer); from_vocab_txt alone follows the
// Python BertTokenizer (measured with transformers 5.23 and tokenizers 0.23):
//   - control characters: Python drops every C* category (so unassigned code points too),
//     Rust drops Cc, Cf and Co (private use) and keeps unassigned ones;
//   - whitespace in cleaning: Python maps ' ', \t, \n, \r and Zs to ' ' and splits words with
//     str.split() (bidi WS/B/S or Zs); Rust uses the White_Space property for both;
//   - Python composes the text (NFC) before lower-casing, Rust never does, so "e\u0301" is one
//     character to Python and two to Rust when accents are kept;
//   - Python lower-cases with str.lower() (Final_Sigma: ΟΔΟΣ -> οδος), Rust per character (οδοσ);
//     both lower U+0130 İ to "i\u0307";
//   - Python lower-cases then strips accents; Rust strips accents then lower-cases;
//   - longest-first truncation of a pair of equal lengths keeps one more token of the first text
//     in Python and of the second in Rust.
// Character categories come from utf8proc (Unicode 15 in Debian 12's 2.8). The references use their
// own tables: Python 3.11's unicodedata is Unicode 14 (so Unicode 15's additions are unassigned,
// hence control, to it), and tokenizers' punctuation, Mn and Cf tables predate Unicode 11 and its
// CJK ranges miss U+2B820..2B91F. unicode::reference_override() carries those differences, as
// measured code point by code point (Note [Reference tables] in unicode.cpp).

namespace anatomy {
namespace {

using unicode::category;
using unicode::Property;

unicode::Reference reference(BertSemantics s) {
  return s == BertSemantics::Transformers ? unicode::Reference::Python : unicode::Reference::Tokenizers;
}

// The utf8proc answer unless the reference's own tables say otherwise (Note [Reference tables]).
bool with_override(bool base, BertSemantics s, Property p, char32_t c) {
  const int o = unicode::reference_override(reference(s), p, c);
  return o == 0 ? base : o > 0;
}

bool is_chinese_char(char32_t c, BertSemantics s) {
  const bool base = (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
  return with_override(base, s, Property::Cjk, c);
}

bool is_ascii_punctuation(char32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

bool is_punctuation(char32_t c, BertSemantics s) {
  if (c < 0x80) return is_ascii_punctuation(c);
  return with_override(unicode::is_punctuation_category(c), s, Property::Punctuation, c);
}

bool is_control(char32_t c, BertSemantics s) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int cat = category(c);
  const bool base = s == BertSemantics::Transformers
                        ? cat == UTF8PROC_CATEGORY_CN || cat >= UTF8PROC_CATEGORY_CC  // Cc Cf Cs Co and Cn
                        : cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CO;
  return with_override(base, s, Property::Control, c);
}

bool is_clean_whitespace(char32_t c, BertSemantics s) {
  if (s == BertSemantics::Tokenizers) return unicode::is_white_space_property(c);
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || (c >= 0x80 && category(c) == UTF8PROC_CATEGORY_ZS);
}

bool is_split_space(char32_t c, BertSemantics s) {
  return s == BertSemantics::Tokenizers ? unicode::is_white_space_property(c) : unicode::is_python_space(c);
}

void strip_accents(std::u32string& text, BertSemantics s) {
  text = unicode::nfd(text);
  std::erase_if(text, [s](char32_t c) {
    return with_override(unicode::is_mark_nonspacing(c), s, Property::NonspacingMark, c);
  });
}

std::string read_file(const std::string& path, const char* what) {
  try {
    return read_regular_file(path);
  } catch (const Error& e) {
    fail(what, " ", e.what());
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char ch : s) n += (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
  return n;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

WordPieceTokenizer WordPieceTokenizer::from_vocab_txt(const std::string& path, bool do_lower_case,
                                                      std::optional<bool> strip_accents, BertSemantics semantics) {
  const std::string data = read_file(path, "vocabulary file");
  ANATOMY_CHECK(!data.empty(), "vocabulary file '", path, "' is empty");
  WordPieceTokenizer t;
  t.m_semantics = semantics;
  t.m_norm.lowercase = do_lower_case;
  t.m_norm.strip_accents = strip_accents;
  // Python reads it in text mode: \n, \r\n and \r all end a line; an id is a line number.
  std::u32string check;
  size_t line_no = 0;
  for (size_t i = 0; i < data.size();) {
    size_t j = data.find_first_of("\r\n", i);
    if (j == std::string::npos) j = data.size();
    const std::string_view tok(data.data() + i, j - i);
    ++line_no;
    if (!unicode::decode_utf8_strict(tok, check))
      fail("vocabulary file '", path, "' line ", line_no, " is not valid UTF-8");
    const auto id = static_cast<int32_t>(t.m_id_to_token.size());
    t.m_id_to_token.emplace_back(tok);
    t.m_vocab.insert_or_assign(std::string(tok), id);  // a repeated token keeps its last id
    i = j;
    if (i < data.size()) i += (data[i] == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ? 2 : 1;
  }
  for (const char* name : {"[UNK]", "[CLS]", "[SEP]", "[PAD]"}) {
    ANATOMY_CHECK(t.m_vocab.count(name), "vocabulary file '", path, "' has no ", name,
                  " token (", t.m_id_to_token.size(), " lines read): is it a BERT vocab.txt?");
  }
  t.m_unk = t.m_vocab.at("[UNK]");
  t.m_cls = t.m_vocab.at("[CLS]");
  t.m_sep = t.m_vocab.at("[SEP]");
  t.m_pad = t.m_vocab.at("[PAD]");
  // BertTokenizer keeps its five special tokens whole; one missing from the vocabulary is [UNK].
  for (const char* name : {"[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"}) {
    const auto it = t.m_vocab.find(name);
    t.m_special.emplace_back(unicode::decode_utf8(name), it == t.m_vocab.end() ? t.m_unk : it->second);
  }
  t.finish(path);
  return t;
}

WordPieceTokenizer WordPieceTokenizer::from_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  if (fs::is_regular_file(d / "tokenizer.json")) return from_tokenizer_json((d / "tokenizer.json").string());
  ANATOMY_CHECK(fs::is_regular_file(d / "vocab.txt"), "'", dir,
                "' has no tokenizer: expected tokenizer.json or vocab.txt in it (or pass --tokenizer)");
  bool lower = true;
  std::optional<bool> strip;
  if (fs::is_regular_file(d / "tokenizer_config.json")) {
    const std::string path = (d / "tokenizer_config.json").string();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(path, "tokenizer config"));
    } catch (const nlohmann::json::exception& e) {
      fail("tokenizer config '", path, "' is not valid JSON: ", e.what());
    }
    if (j.is_object() && j.contains("do_lower_case") && j["do_lower_case"].is_boolean()) lower = j["do_lower_case"].get<bool>();
    if (j.is_object() && j.contains("strip_accents") && j["strip_accents"].is_boolean()) strip = j["strip_accents"].get<bool>();
  }
  // What AutoTokenizer gives run_glue.py (use_fast=True) for such a directory: the fast
  // tokenizer converted from vocab.txt, with the tokenizers library's rules (Note [Two references]).
  return from_vocab_txt((d / "vocab.txt").string(), lower, strip, BertSemantics::Tokenizers);
}

std::vector<std::string> WordPieceTokenizer::files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const char* name : {"tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
    const auto p = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(p)) out.push_back(p.string());
  }
  return out;
}

WordPieceTokenizer WordPieceTokenizer::from_tokenizer_json(const std::string& path) {
  using nlohmann::json;
  const std::string data = read_file(path, "tokenizer file");
  json j;
  try {
    j = json::parse(data);
  } catch (const json::exception& e) {
    fail("tokenizer file '", path, "' is not valid JSON: ", e.what());
  }
  auto bad = [&](const auto&... what) { fail("tokenizer file '", path, "': ", what...); };
  // json::get<int> on a float is an unchecked cast (undefined beyond the range): check first.
  auto integer = [&](const json& v, const char* what, int64_t hi) -> int64_t {  // in [0, hi]
    if (!v.is_number_integer()) bad(what, " must be an integer, not ", v.type_name());
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                             : v.get<int64_t>() >= 0 && v.get<int64_t>() <= hi;
    if (!fits) bad(what, " ", v.dump(), " is out of range [0, ", hi, "]");
    return v.get<int64_t>();
  };
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  try {
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      bad("no \"model\" object: is it a tokenizer.json?");
    const json& model = j["model"];
    const std::string type = model.value("type", std::string("WordPiece"));
    if (type != "WordPiece") bad("model type is \"", type, "\"; only WordPiece (BERT) is supported");
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      bad("model has no \"vocab\" object");

    WordPieceTokenizer t;
    t.m_semantics = BertSemantics::Tokenizers;
    t.m_prefix = model.value("continuing_subword_prefix", std::string("##"));
    if (model.contains("max_input_chars_per_word"))
      t.m_max_input_chars_per_word =
          static_cast<size_t>(integer(model["max_input_chars_per_word"], "max_input_chars_per_word", kMaxId));
    auto add = [&](const std::string& tok, int64_t id) {
      if (id < 0 || id > 50'000'000) bad("token \"", tok, "\" has id ", id, " out of range");
      if (static_cast<size_t>(id) >= t.m_id_to_token.size()) t.m_id_to_token.resize(static_cast<size_t>(id) + 1);
      t.m_id_to_token[static_cast<size_t>(id)] = tok;
      t.m_vocab.insert_or_assign(tok, static_cast<int32_t>(id));
    };
    for (const auto& [tok, id] : model["vocab"].items()) {
      if (!id.is_number_integer()) bad("vocab entry \"", tok, "\" has no integer id");
      add(tok, id.get<int64_t>());
    }
    const std::string unk = model.value("unk_token", std::string("[UNK]"));
    if (!t.m_vocab.count(unk)) bad("unk_token \"", unk, "\" is not in the vocab");
    t.m_unk = t.m_vocab.at(unk);

    const json& norm = j.contains("normalizer") ? j["normalizer"] : json();
    if (norm.is_null()) {
      t.m_norm = {false, false, false, false};
    } else {
      if (norm.value("type", std::string()) != "BertNormalizer")
        bad("normalizer type is \"", norm.value("type", std::string()), "\"; only BertNormalizer is supported");
      t.m_norm.clean_text = norm.value("clean_text", true);
      t.m_norm.handle_chinese_chars = norm.value("handle_chinese_chars", true);
      t.m_norm.lowercase = norm.value("lowercase", true);
      if (norm.contains("strip_accents") && !norm["strip_accents"].is_null())
        t.m_norm.strip_accents = norm["strip_accents"].get<bool>();
    }
    const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    if (pre.is_null() || pre.value("type", std::string()) != "BertPreTokenizer")
      bad("pre_tokenizer is not BertPreTokenizer; only BERT tokenizers are supported");

    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        const std::string content = a.at("content").get<std::string>();
        add(content, integer(a.at("id"), "added token id", kMaxId));
        if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) ||
            a.value("normalized", false))
          bad("added token \"", content, "\" asks for lstrip/rstrip/single_word/normalized, which is not supported");
        t.m_special.emplace_back(unicode::decode_utf8(content), t.m_vocab.at(content));
      }
    }
    // [CLS] and [SEP] come from the post-processor: BertProcessing, or a TemplateProcessing of the
    // BERT shape; without one, from the vocabulary.
    auto lookup = [&](const std::string& tok) {
      if (!t.m_vocab.count(tok)) bad("special token \"", tok, "\" is not in the vocab");
      return t.m_vocab.at(tok);
    };
    const json& post = j.contains("post_processor") ? j["post_processor"] : json();
    const std::string post_type = post.is_null() ? "" : post.value("type", std::string());
    if (post_type == "BertProcessing") {
      t.m_cls = static_cast<int32_t>(integer(post.at("cls").at(1), "post_processor cls id", kMaxId));
      t.m_sep = static_cast<int32_t>(integer(post.at("sep").at(1), "post_processor sep id", kMaxId));
    } else if (post_type == "TemplateProcessing") {
      auto piece = [&](const json& p) -> std::string {
        if (p.contains("SpecialToken"))
          return "S:" + p["SpecialToken"].at("id").get<std::string>() + ":" +
                 std::to_string(integer(p["SpecialToken"].at("type_id"), "type_id", kMaxId));
        return "Q:" + p.at("Sequence").at("id").get<std::string>() + ":" +
               std::to_string(integer(p["Sequence"].at("type_id"), "type_id", kMaxId));
      };
      const json& single = post.at("single");
      const json& pair = post.at("pair");
      if (single.size() != 3 || pair.size() != 5) bad("post_processor template is not [CLS] A [SEP] B [SEP]");
      const std::string cls = piece(single[0]), sep = piece(single[2]);
      const std::string sep1 = sep.substr(0, sep.rfind(':')) + ":1";
      if (cls.rfind("S:", 0) != 0 || sep.rfind("S:", 0) != 0 || piece(single[1]) != "Q:A:0" ||
          piece(pair[0]) != cls || piece(pair[1]) != "Q:A:0" || piece(pair[2]) != sep ||
          piece(pair[3]) != "Q:B:1" || piece(pair[4]) != sep1 || !cls.ends_with(":0") || !sep.ends_with(":0"))
        bad("post_processor template is not [CLS] A [SEP] B [SEP] with type ids 0 and 1");
      auto special_id = [&](const std::string& p) {
        const std::string name = p.substr(2, p.rfind(':') - 2);
        const json& st = post.at("special_tokens").at(name);
        if (st.at("ids").size() != 1) bad("special token \"", name, "\" is not one id");
        return static_cast<int32_t>(integer(st.at("ids").at(0), "special token id", kMaxId));
      };
      t.m_cls = special_id(cls);
      t.m_sep = special_id(sep);
    } else if (post_type.empty()) {
      t.m_cls = lookup("[CLS]");
      t.m_sep = lookup("[SEP]");
    } else {
      bad("post_processor type is \"", post_type, "\"; expected BertProcessing or TemplateProcessing");
    }
    if (j.contains("padding") && j["padding"].is_object()) {
      const json& pad = j["padding"];
      t.m_pad = pad.contains("pad_id") ? static_cast<int32_t>(integer(pad["pad_id"], "pad_id", kMaxId)) : 0;
    } else {
      const auto it = t.m_vocab.find("[PAD]");
      t.m_pad = it == t.m_vocab.end() ? -1 : it->second;
    }
    t.finish(path);
    return t;
  } catch (const json::exception& e) {
    fail("tokenizer file '", path, "' is malformed: ", e.what());
  }
}

WordPieceTokenizer WordPieceTokenizer::with_normalizer(const BertNormalizerConfig& n) const {
  WordPieceTokenizer t = *this;
  t.m_norm = n;
  t.m_prefix = "##";
  t.m_max_input_chars_per_word = 100;
  return t;
}

void WordPieceTokenizer::finish(const std::string& path) {
  ANATOMY_CHECK(!m_vocab.empty(), "tokenizer '", path, "' has an empty vocabulary");
  ANATOMY_CHECK(m_max_input_chars_per_word > 0, "tokenizer '", path, "': max_input_chars_per_word is 0");
  // Ids the encoder emits must name vocabulary entries (a tokenizer.json states them separately).
  const auto n = static_cast<int64_t>(m_id_to_token.size());
  for (auto [name, id] : {std::pair{"[CLS]", m_cls}, {"[SEP]", m_sep}, {"[UNK]", m_unk}})
    ANATOMY_CHECK(id >= 0 && id < n, "tokenizer '", path, "': the ", name, " id ", id, " is outside the vocabulary (",
                  n, " entries)");
  ANATOMY_CHECK(m_pad >= -1 && m_pad < n, "tokenizer '", path, "': the [PAD] id ", m_pad,
                " is outside the vocabulary (", n, " entries)");
  for (const auto& [tok, id] : m_vocab) m_max_token_chars = std::max(m_max_token_chars, count_code_points(tok));
  // Leftmost match wins; among matches at one place, the longest.
  std::stable_sort(m_special.begin(), m_special.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::erase_if(m_special, [](const auto& s) { return s.first.empty(); });
}

// ---------------------------------------------------------------------------------------------
// Tokenizing

int32_t WordPieceTokenizer::token_to_id(std::string_view token) const {
  const auto it = m_vocab.find(std::string(token));
  return it == m_vocab.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int32_t id) const {
  ANATOMY_CHECK(id >= 0 && static_cast<size_t>(id) < m_id_to_token.size(), "token id ", id,
                " is outside the vocabulary (", m_id_to_token.size(), " entries)");
  return m_id_to_token[static_cast<size_t>(id)];
}

std::vector<int32_t> WordPieceTokenizer::encode_words(std::string_view text) const {
  std::vector<int32_t> ids;
  encode_into(text, ids);
  return ids;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int32_t id : encode_words(text)) out.push_back(id_to_token(id));
  return out;
}

void WordPieceTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  const std::u32string t = unicode::decode_utf8(text);
  const std::u32string_view v(t);
  size_t start = 0;
  for (size_t i = 0; i < v.size();) {
    const auto hit = std::find_if(m_special.begin(), m_special.end(),
                                  [&](const auto& s) { return v.substr(i).starts_with(s.first); });
    if (hit == m_special.end()) {
      ++i;
      continue;
    }
    encode_segment(v.substr(start, i - start), ids);
    ids.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_segment(v.substr(start), ids);
}

void WordPieceTokenizer::encode_segment(std::u32string_view segment, std::vector<int32_t>& ids) const {
  if (segment.empty()) return;
  const BertSemantics sem = m_semantics;
  std::u32string text;
  text.reserve(segment.size() + 8);
  for (char32_t c : segment) {
    if (m_norm.clean_text) {
      if (c == 0 || c == 0xFFFD || is_control(c, sem)) continue;
      if (is_clean_whitespace(c, sem)) c = ' ';
    }
    if (m_norm.handle_chinese_chars && is_chinese_char(c, sem)) {
      text += U' ';
      text += c;
      text += U' ';
    } else {
      text += c;
    }
  }
  const bool strip = m_norm.strip_accents.value_or(m_norm.lowercase);
  if (sem == BertSemantics::Tokenizers) {
    if (strip) strip_accents(text, sem);
    if (m_norm.lowercase) unicode::char_lower(text);
  } else {
    text = unicode::nfc(text);
  }

  std::u32string word;
  auto flush = [&] {
    if (!word.empty()) word_pieces(word, ids);
    word.clear();
  };
  auto split_punctuation = [&](std::u32string_view w) {
    for (char32_t c : w) {
      if (is_punctuation(c, sem)) {
        flush();
        word += c;
        flush();
      } else {
        word += c;
      }
    }
    flush();
  };
  std::u32string token;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && !is_split_space(text[i], sem)) {
      token += text[i];
      continue;
    }
    if (token.empty()) continue;
    if (sem == BertSemantics::Transformers) {
      // A token that cleaning turned into a special token ("[SE\0P]") stays whole and cased.
      const bool special = std::any_of(m_special.begin(), m_special.end(),
                                       [&](const auto& s) { return s.first == token; });
      if (special) {
        word_pieces(token, ids);
        token.clear();
        continue;
      }
      // Per whitespace-separated token: lower-case (with Final_Sigma) then strip accents.
      if (m_norm.lowercase) unicode::python_lower(token);
      if (strip) strip_accents(token, sem);
    }
    split_punctuation(token);
    token.clear();
  }
}

void WordPieceTokenizer::word_pieces(std::u32string_view word, std::vector<int32_t>& ids) const {
  if (word.size() > m_max_input_chars_per_word) {
    ids.push_back(m_unk);
    return;
  }
  // UTF-8 bytes of the word and the byte offset of each code point.
  std::string bytes;
  std::vector<size_t> off;
  off.reserve(word.size() + 1);
  for (char32_t c : word) {
    off.push_back(bytes.size());
    unicode::append_utf8(bytes, c);
  }
  off.push_back(bytes.size());

  const size_t mark = ids.size();
  const size_t n = word.size();
  std::string key;
  for (size_t start = 0; start < n;) {
    int32_t found = -1;
    size_t end = std::min(n, start + m_max_token_chars);
    for (; end > start; --end) {
      key.clear();
      if (start > 0) key += m_prefix;
      key.append(bytes, off[start], off[end] - off[start]);
      const auto it = m_vocab.find(key);
      if (it != m_vocab.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) {  // some piece matches nothing: the whole word is [UNK]
      ids.resize(mark);
      ids.push_back(m_unk);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

Encoding WordPieceTokenizer::encode(std::string_view text_a, std::optional<std::string_view> text_b,
                                    size_t max_length, Truncation truncation, Padding padding) const {
  std::vector<int32_t> a = encode_words(text_a);
  std::vector<int32_t> b;
  if (text_b) b = encode_words(*text_b);
  const size_t specials = text_b ? 3 : 2;
  if (truncation == Truncation::LongestFirst) {
    ANATOMY_CHECK(max_length >= specials, "max_length ", max_length, " cannot hold the ", specials,
                  " special tokens of a ", text_b ? "pair" : "single", " encoding");
    const size_t budget = max_length - specials;
    size_t na = a.size(), nb = b.size();
    if (na + nb > budget) {
      if (!text_b) {
        na = budget;
      } else if (m_semantics == BertSemantics::Transformers) {
        // transformers: take the difference from the longer, then split the rest, the odd one
        // from the second text.
        const size_t remove = na + nb - budget;
        const size_t first = std::min(na > nb ? na - nb : nb - na, remove);
        const size_t second = remove - first;
        if (na > nb) {
          na -= first + second / 2;
          nb -= second - second / 2;
        } else {
          na -= second / 2;
          nb -= first + second - second / 2;
        }
      } else {
        // tokenizers: the shorter keeps what it has (up to the budget), the longer gets the rest
        // (at least as much as the shorter); if both overflow, halves, the odd token to the second.
        size_t n1 = std::min(na, nb);
        size_t n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
        if (n1 + n2 > budget) {
          n1 = budget / 2;
          n2 = n1 + budget % 2;
        }
        if (na > nb) std::swap(n1, n2);
        na = n1, nb = n2;
      }
    }
    a.resize(na);
    b.resize(nb);
  }
  Encoding e;
  const size_t n = specials + a.size() + b.size();
  const size_t total = padding == Padding::MaxLength ? std::max(n, max_length) : n;
  e.input_ids.reserve(total);
  e.input_ids.push_back(m_cls);
  e.input_ids.insert(e.input_ids.end(), a.begin(), a.end());
  e.input_ids.push_back(m_sep);
  e.token_type_ids.assign(e.input_ids.size(), 0);
  if (text_b) {
    e.input_ids.insert(e.input_ids.end(), b.begin(), b.end());
    e.input_ids.push_back(m_sep);
    e.token_type_ids.resize(e.input_ids.size(), 1);
  }
  e.attention_mask.assign(n, 1);
  if (total > n) {
    ANATOMY_CHECK(m_pad >= 0, "padding needs a [PAD] token and the vocabulary has none");
    e.input_ids.resize(total, m_pad);
    e.token_type_ids.resize(total, 0);
    e.attention_mask.resize(total, 0);
  }
  return e;
}

}  // namespace anatomy
