#include "data/tokenizer_json.h"

#include <utf8proc.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace anatomy {
namespace {

using nlohmann::json;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ANATOMY_CHECK(in.good(), "cannot open tokenizer file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  ANATOMY_CHECK(!in.bad(), "cannot read tokenizer file '", path, "'");
  return ss.str();
}

// The regex crate's \w (Alphabetic, marks, Nd, Pc, Join_Control), as added tokens' single_word
// checks it; letters and Nl stand for Alphabetic.
bool is_word_char(char32_t c) {
  const int k = unicode::category(c);
  return unicode::is_letter(c) || unicode::is_mark(c) || k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL ||
         k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

// Post-processors as templates (Note [Templates]).
using Template = std::vector<JsonTokenizer::TemplateItem>;

JsonTokenizer::TemplateItem special(std::vector<int32_t> ids, int32_t type_id) { return {-1, std::move(ids), type_id}; }
JsonTokenizer::TemplateItem sequence(int which, int32_t type_id) { return {which, {}, type_id}; }

// Note [Templates]
// Every post-processor these files use is a template of special tokens around the sequences:
//   none:                A | A B (B's type id 1, as the library encodes a pair);
//   BertProcessing:      cls A sep | cls A sep B sep, types 0 then 1 from B on;
//   RobertaProcessing:   cls A sep | cls A sep sep B sep, every type id 0 (RoBERTa has one type);
//   TemplateProcessing:  as written;
//   ByteLevel:           no tokens (it only trims offsets); Sequence: the one that has a template.
bool parse_post(const json& p, Template& single, Template& pair, const std::string& what) {
  auto bad = [&](const auto&... x) { fail("tokenizer file '", what, "': ", x...); };
  auto id_of = [&](const json& pairj) {
    if (!pairj.is_array() || pairj.size() != 2 || !pairj[1].is_number_integer()) bad("post_processor token ", pairj.dump(), " is not [token, id]");
    return static_cast<int32_t>(pairj[1].get<int64_t>());
  };
  const std::string type = p.at("type").get<std::string>();
  if (type == "ByteLevel") return false;
  if (type == "Sequence") {
    bool found = false;
    for (const json& q : p.at("processors")) found = parse_post(q, single, pair, what) || found;
    return found;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    const int32_t cls = id_of(p.at("cls")), sep = id_of(p.at("sep"));
    single = {special({cls}, 0), sequence(0, 0), special({sep}, 0)};
    pair = {special({cls}, 0), sequence(0, 0), special({sep}, 0)};
    const int32_t second = type == "RobertaProcessing" ? 0 : 1;
    if (type == "RobertaProcessing") pair.push_back(special({sep}, 0));
    pair.push_back(sequence(1, second));
    pair.push_back(special({sep}, second));
    return true;
  }
  if (type == "TemplateProcessing") {
    auto parse = [&](const json& items) {
      Template t;
      for (const json& it : items) {
        if (it.contains("SpecialToken")) {
          const std::string name = it["SpecialToken"].at("id").get<std::string>();
          const json& st = p.at("special_tokens");
          if (!st.contains(name)) bad("post_processor special token \"", name, "\" is not in special_tokens");
          std::vector<int32_t> ids;
          for (const json& v : st[name].at("ids")) ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
          t.push_back(special(std::move(ids), static_cast<int32_t>(it["SpecialToken"].at("type_id").get<int64_t>())));
        } else {
          const std::string s = it.at("Sequence").at("id").get<std::string>();
          if (s != "A" && s != "B") bad("post_processor sequence \"", s, "\" is neither A nor B");
          t.push_back(sequence(s == "A" ? 0 : 1, static_cast<int32_t>(it["Sequence"].at("type_id").get<int64_t>())));
        }
      }
      return t;
    };
    single = parse(p.at("single"));
    pair = parse(p.at("pair"));
    return true;
  }
  fail("tokenizer file '", what, "': post_processor type \"", type, "\" is not supported");
}

size_t specials_in(const Template& t) {
  size_t n = 0;
  for (const auto& it : t) n += it.ids.size();
  return n;
}

// tokenizers' longest-first split of `budget` tokens between two sequences of na and nb: the
// shorter keeps what it has when the longer can still get as much, else both get half (the odd
// one to the second).
std::pair<size_t, size_t> longest_first(size_t na, size_t nb, size_t budget) {
  if (na + nb <= budget) return {na, nb};
  size_t n1 = std::min(na, nb);
  size_t n2 = n1 > budget ? n1 : std::max(n1, budget - n1);
  if (n1 + n2 > budget) {
    n1 = budget / 2;
    n2 = n1 + budget % 2;
  }
  if (na > nb) std::swap(n1, n2);
  return {n1, n2};
}

}  // namespace

JsonTokenizer::JsonTokenizer() = default;
JsonTokenizer::JsonTokenizer(JsonTokenizer&&) noexcept = default;
JsonTokenizer& JsonTokenizer::operator=(JsonTokenizer&&) noexcept = default;
JsonTokenizer::~JsonTokenizer() = default;

JsonTokenizer JsonTokenizer::from_file(const std::string& path) { return from_text(read_all(path), path); }

// Note [prefix space for words]: transformers builds a byte-level tokenizer asked for
// add_prefix_space by rewriting its pre-tokenizer's state, as here: each ByteLevel pre-tokenizer
// (alone or in a Sequence) gets add_prefix_space true.
JsonTokenizer JsonTokenizer::with_prefix_space() const {
  json j = json::parse(m_file);
  auto set = [](json& pre) {
    if (pre.is_object() && pre.value("type", std::string()) == "ByteLevel") pre["add_prefix_space"] = true;
  };
  if (j.contains("pre_tokenizer")) {
    json& pre = j["pre_tokenizer"];
    set(pre);
    if (pre.is_object() && pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
      for (json& p : pre["pretokenizers"]) set(p);
  }
  return from_text(j.dump(), m_path);
}

// Note [XLM-R as transformers 5 builds it]
// transformers 5 builds the tokenizer of a class with its own constructor from the class, not
// from tokenizer.json: of the file it keeps the vocabulary and a Precompiled (SentencePiece)
// normalizer, and XLMRobertaTokenizer puts around them a pre-tokenizer that splits on whitespace
// before Metaspace (prepending ▁ to every word, or to none without add_prefix_space) and its own
// templates, <s> $A </s> and <s> $A </s> </s> $B </s>, every type id 0 (tokenizer_config.json's
// bos_token and eos_token), whatever post-processor the file has. xlm-roberta-base's own tokenizer.json (Precompiled, spaces collapsed,
// Metaspace alone) gives a ▁ token for leading and trailing whitespace and around added tokens
// where the class gives none, and the file's other normalizers are dropped: 2978 of the 12006
// lines of tests/fixtures/tokenizers/lines.txt.gz and 508 of its 2000 pairs tokenize otherwise. A model trained here is
// evaluated and served by transformers 5 with the class's tokens, so the class's are used
// (Tokenizer::from_directory, for a directory whose tokenizer_config.json names the class or
// whose config.json's model_type is xlm-roberta). BERT, RoBERTa, DistilBERT, ELECTRA and
// ModernBERT tokenize as their files say, in transformers 5 as here.
JsonTokenizer JsonTokenizer::as_xlm_roberta_class(bool add_prefix_space, const std::string& bos,
                                                  const std::string& eos) const {
  json j = json::parse(m_file);
  const int32_t bos_id = token_to_id(bos), eos_id = token_to_id(eos);
  if (bos_id >= 0 && eos_id >= 0) {  // else transformers fails to build it: the file's stays
    const auto special = [](const std::string& t) { return json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}}; };
    const auto seq = [](const char* s) { return json{{"Sequence", {{"id", s}, {"type_id", 0}}}}; };
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", json::array({special(bos), seq("A"), special(eos)})},
        {"pair", json::array({special(bos), seq("A"), special(eos), special(eos), seq("B"), special(eos)})},
        {"special_tokens",
         {{bos, {{"id", bos}, {"ids", json::array({bos_id})}, {"tokens", json::array({bos})}}},
          {eos, {{"id", eos}, {"ids", json::array({eos_id})}, {"tokens", json::array({eos})}}}}}};
  }
  json precompiled = nullptr;
  const json norm = j.value("normalizer", json());
  if (norm.is_object() && norm.value("type", std::string()) == "Precompiled") precompiled = norm;
  if (norm.is_object() && norm.value("type", std::string()) == "Sequence" && norm.contains("normalizers"))
    for (const json& n : norm["normalizers"])
      if (n.is_object() && n.value("type", std::string()) == "Precompiled" && precompiled.is_null()) precompiled = n;
  j["normalizer"] = precompiled;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "WhitespaceSplit"}},
                                      {{"type", "Metaspace"},
                                       {"replacement", "\u2581"},
                                       {"prepend_scheme", add_prefix_space ? "always" : "never"},
                                       {"split", true}}})}};
  return from_text(j.dump(), m_path);
}

JsonTokenizer JsonTokenizer::from_text(std::string bytes, const std::string& path) {
  JsonTokenizer t;
  t.m_file = std::move(bytes);
  t.m_path = path;
  json j;
  try {
    j = json::parse(t.m_file);
  } catch (const json::exception& e) {
    fail("tokenizer file '", path, "' is not valid JSON: ", e.what());
  }
  auto bad = [&](const auto&... x) { fail("tokenizer file '", path, "': ", x...); };
  try {
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) bad("no \"model\" object: is it a tokenizer.json?");
    const json& model = j["model"];
    const std::string type = model.value("type", std::string());
    if (type == "BPE" || (type.empty() && model.contains("merges"))) t.m_model = tok::make_bpe(model, path);
    else if (type == "Unigram") t.m_model = tok::make_unigram(model, t.m_file, path);
    else bad("model type \"", type, "\" is not BPE or Unigram");
    t.m_normalizer = tok::make_normalizer(j.value("normalizer", json()), path);
    t.m_pre = tok::make_pre_tokenizer(j.value("pre_tokenizer", json()), path);

    auto add = [&](const std::string& tok, int32_t id) {
      if (static_cast<size_t>(id) >= t.m_id_to_token.size()) t.m_id_to_token.resize(static_cast<size_t>(id) + 1);
      t.m_id_to_token[static_cast<size_t>(id)] = tok;
      t.m_vocab.insert_or_assign(tok, id);
    };
    for (const auto& [tok, id] : t.m_model->vocabulary()) add(tok, id);
    for (const json& a : j.value("added_tokens", json::array())) {
      AddedToken at;
      const std::string content = a.at("content").get<std::string>();
      const int64_t id = a.at("id").get<int64_t>();
      if (id < 0 || id > 50'000'000) bad("added token \"", content, "\" has id ", id, " out of range");
      at.id = static_cast<int32_t>(id);
      at.lstrip = a.value("lstrip", false);
      at.rstrip = a.value("rstrip", false);
      at.single_word = a.value("single_word", false);
      at.normalized = a.value("normalized", false);
      at.content = unicode::decode_utf8(content);
      tok::Front front;
      if (at.normalized && t.m_normalizer) t.m_normalizer->apply(at.content, front);
      add(content, at.id);
      if (!at.content.empty()) t.m_added.push_back(std::move(at));
    }
    for (size_t i = 0; i < t.m_id_to_token.size(); ++i)
      if (t.m_id_to_token[i].empty() && !t.m_vocab.count("")) bad("id ", i, " names no token (ids must be 0..n-1)");

    const json post = j.value("post_processor", json());
    if (post.is_null() || !parse_post(post, t.m_single, t.m_pair, path)) {
      t.m_single = {sequence(0, 0)};
      t.m_pair = {sequence(0, 0), sequence(1, 1)};
    }
    const auto n = static_cast<int64_t>(t.m_id_to_token.size());
    for (const Template* tp : {&t.m_single, &t.m_pair})
      for (const auto& it : *tp)
        for (int32_t id : it.ids)
          if (id < 0 || id >= n) bad("post_processor token id ", id, " is outside the vocabulary (", n, " entries)");
    for (const auto& it : t.m_single) {
      if (it.sequence >= 0 || it.ids.empty()) continue;
      if (t.m_cls < 0) t.m_cls = it.ids.front();
      t.m_sep = it.ids.back();
    }
    const json pad = j.value("padding", json());
    if (pad.is_object() && pad.contains("pad_id")) {
      t.m_pad = static_cast<int32_t>(pad["pad_id"].get<int64_t>());
      if (t.m_pad < 0 || t.m_pad >= n) bad("pad_id ", t.m_pad, " is outside the vocabulary");
    } else {
      for (const char* name : {"<pad>", "[PAD]", "<|padding|>"})
        if (t.m_pad < 0) t.m_pad = t.token_to_id(name);
    }
  } catch (const json::exception& e) {
    fail("tokenizer file '", path, "' is malformed: ", e.what());
  }
  return t;
}

int32_t JsonTokenizer::unk_id() const { return m_model->unk_id(); }

int32_t JsonTokenizer::token_to_id(std::string_view token) const {
  const auto it = m_vocab.find(std::string(token));
  return it == m_vocab.end() ? -1 : it->second;
}

const std::string& JsonTokenizer::id_to_token(int32_t id) const {
  ANATOMY_CHECK(id >= 0 && static_cast<size_t>(id) < m_id_to_token.size(), "token id ", id,
                " is outside the vocabulary (", m_id_to_token.size(), " entries)");
  return m_id_to_token[static_cast<size_t>(id)];
}

// Added tokens (normalized or not, per pass) split the text: at each place the leftmost match,
// the longest there; lstrip/rstrip take the spaces beside it into the token; single_word tokens
// match only between non-word characters.
std::vector<JsonTokenizer::Segment> JsonTokenizer::split_added(std::u32string_view t, bool normalized,
                                                               bool at_origin) const {
  std::vector<Segment> out;
  size_t done = 0;  // end of the last token taken
  for (size_t i = 0; i < t.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : m_added)
      if (a.normalized == normalized && (!hit || a.content.size() > hit->content.size()) && t.substr(i).starts_with(a.content))
        hit = &a;
    if (!hit) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + hit->content.size();
    if (hit->single_word && ((start > 0 && is_word_char(t[start - 1])) || (stop < t.size() && is_word_char(t[stop])))) {
      i = stop;  // the search goes on after the rejected match, as the reference's matcher does
      continue;
    }
    if (hit->lstrip) {
      while (start > done && tok::is_space(t[start - 1])) --start;
    }
    if (hit->rstrip) {
      while (stop < t.size() && tok::is_space(t[stop])) ++stop;
    }
    if (start > done) out.push_back({std::u32string(t.substr(done, start - done)), -1, at_origin && done == 0});
    out.push_back({std::u32string(), hit->id, false});
    done = i = stop;
  }
  if (done < t.size()) out.push_back({std::u32string(t.substr(done)), -1, at_origin && done == 0});
  return out;
}

void JsonTokenizer::encode_into(std::string_view text, std::vector<int32_t>& ids) const {
  for (Segment& raw : split_added(unicode::decode_utf8(text), false, true)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    tok::Front front;
    if (m_normalizer) m_normalizer->apply(raw.text, front);
    for (Segment& seg : split_added(raw.text, true, raw.at_origin && !front.dropped)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      std::vector<tok::Piece> pieces{{std::move(seg.text), seg.at_origin}};
      if (m_pre) m_pre->split(pieces);
      for (const tok::Piece& p : pieces) m_model->tokenize(p.text, ids);
    }
  }
}

std::vector<int32_t> JsonTokenizer::encode_words(std::string_view text) const {
  std::vector<int32_t> ids;
  encode_into(text, ids);
  return ids;
}

Encoding JsonTokenizer::encode(std::string_view text_a, std::optional<std::string_view> text_b, size_t max_length,
                               Truncation truncation, Padding padding) const {
  std::vector<int32_t> seq[2];
  seq[0] = encode_words(text_a);
  if (text_b) seq[1] = encode_words(*text_b);
  const Template& tpl = text_b ? m_pair : m_single;
  const size_t specials = specials_in(tpl);
  if (truncation == Truncation::LongestFirst) {
    ANATOMY_CHECK(max_length >= specials, "max_length ", max_length, " cannot hold the ", specials,
                  " special tokens of a ", text_b ? "pair" : "single", " encoding");
    const size_t budget = max_length - specials;
    if (!text_b) {
      if (seq[0].size() > budget) seq[0].resize(budget);
    } else {
      const auto [na, nb] = longest_first(seq[0].size(), seq[1].size(), budget);
      seq[0].resize(na);
      seq[1].resize(nb);
    }
  }
  Encoding e;
  for (const TemplateItem& it : tpl) {
    const std::vector<int32_t>& ids = it.sequence < 0 ? it.ids : seq[it.sequence];
    e.input_ids.insert(e.input_ids.end(), ids.begin(), ids.end());
    e.token_type_ids.insert(e.token_type_ids.end(), ids.size(), it.type_id);
  }
  const size_t n = e.input_ids.size();
  e.attention_mask.assign(n, 1);
  if (padding == Padding::MaxLength && n < max_length) {
    ANATOMY_CHECK(m_pad >= 0, "padding needs a pad token and the tokenizer has none");
    e.input_ids.resize(max_length, m_pad);
    e.token_type_ids.resize(max_length, 0);
    e.attention_mask.resize(max_length, 0);
  }
  return e;
}

}  // namespace anatomy
