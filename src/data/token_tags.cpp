#include "data/token_tags.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/error.h"
#include "data/csv.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "io/read_file.h"

namespace anatomy {

namespace {

struct Row {
  std::vector<std::string> words;
  std::vector<nlohmann::json> tags;  // empty in an untagged file
  size_t line;
  bool tagged = true;
};

std::vector<Row> read_rows(const std::string& path, const TokenTagOptions& o) {
  const std::string text = read_regular_file(path);
  std::vector<Row> rows;
  size_t pos = 0, line = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view s(text.data() + pos, end - pos);
    pos = end + 1;
    ++line;
    if (s.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(s);
    } catch (const std::exception& e) {
      fail(path, ":", line, ": not a JSON object (", e.what(), ")");
    }
    ANATOMY_CHECK(j.is_object(), path, ":", line, ": not a JSON object");
    const auto w = j.find(o.words_column), t = j.find(o.tags_column);
    ANATOMY_CHECK(w != j.end() && w->is_array(), path, ":", line, ": no list of words '", o.words_column, "'");
    const bool tagged = t != j.end() || !o.tags_optional;
    ANATOMY_CHECK(!tagged || (t != j.end() && t->is_array()), path, ":", line, ": no list of tags '", o.tags_column, "'");
    ANATOMY_CHECK(rows.empty() || rows.front().tagged == tagged, path, ":", line, ": ",
                  tagged ? "a list of tags '" : "no list of tags '", o.tags_column, "' where line ", rows.front().line,
                  tagged ? " has none" : " has one");
    ANATOMY_CHECK(!tagged || w->size() == t->size(), path, ":", line, ": ", w->size(), " words but ", t->size(), " tags");
    Row r{{}, {}, line, tagged};
    if (tagged) r.tags.assign(t->begin(), t->end());
    for (const auto& x : *w) {
      ANATOMY_CHECK(x.is_string(), path, ":", line, ": word ", x.dump(), " is not a string");
      r.words.push_back(x.get<std::string>());
    }
    for (const auto& x : r.tags)
      ANATOMY_CHECK(x.is_string() || x.is_number_integer(), path, ":", line, ": tag ", x.dump(),
                    " is neither a string nor an integer");
    rows.push_back(std::move(r));
  }
  ANATOMY_CHECK(!rows.empty(), path, ": no tagged sentences");
  return rows;
}

}  // namespace

void use_run_ner_columns(TokenTagOptions& o, const std::string& path, const std::string& flag, bool words_named,
                         bool tags_named) {
  if (words_named && tags_named) return;
  const std::vector<std::string> keys = text_file_columns(path, TextFormat::Jsonl, ',');  // data/csv.h
  auto take = [&](std::string& column, size_t i, const char* what) {
    if (keys.size() <= i || std::find(keys.begin(), keys.end(), column) != keys.end()) return;
    std::fprintf(stderr, "anatomy: %s %s has no '%s': reading '%s' as the %s, as run_ner.py would\n", flag.c_str(),
                 path.c_str(), column.c_str(), keys[i].c_str(), what);
    column = keys[i];
  };
  if (!words_named) take(o.words_column, 0, "words");
  if (!tags_named) take(o.tags_column, 1, "tags");
}

TokenTagDataset::TokenTagDataset(const std::string& path, const Tokenizer& tok, const TokenTagOptions& o)
    : m_max_length(o.max_length), m_pad(tok.pad_id()) {
  const std::vector<Row> rows = read_rows(path, o);
  m_tagged = rows.front().tagged;
  ANATOMY_CHECK(m_tagged || o.tags || (o.tags_optional && o.num_ids), path, ": no list of tags '", o.tags_column, "'");
  m_integer = false;
  for (const Row& r : rows)
    if (!r.tags.empty()) {
      m_integer = r.tags.front().is_number_integer();
      break;
    }
  std::map<std::string, int32_t> index;
  if (o.tags) {
    m_tags = *o.tags;
  } else if ((m_integer || !m_tagged) && o.num_ids) {  // a trained head's ids: the file's tags must lie among them
    for (int64_t i = 0; i < *o.num_ids; ++i) m_tags.push_back(std::to_string(i));
  } else if (m_integer) {  // the sorted distinct ids as classes (LabelSet::from_integers)
    std::vector<int64_t> values;
    for (const Row& r : rows)
      for (const auto& t : r.tags)
        if (t.is_number_integer()) values.push_back(t.get<int64_t>());
    const LabelSet set = LabelSet::from_integers(std::move(values));
    m_integers_named = set.kind == LabelSet::Kind::Names;
    for (int64_t i = 0; i < set.num_labels; ++i) m_tags.push_back(m_integers_named ? set.names[i] : std::to_string(i));
  } else {
    std::set<std::string> names;
    for (const Row& r : rows)
      for (const auto& t : r.tags)
        if (t.is_string()) names.insert(t.get<std::string>());
    m_tags.assign(names.begin(), names.end());
  }
  for (size_t i = 0; i < m_tags.size(); ++i) index[m_tags[i]] = static_cast<int32_t>(i);
  for (const Row& r : rows) {
    const WordEncoding we =
        tok.encode_split_words(r.words, static_cast<size_t>(o.max_length), Truncation::LongestFirst, Padding::None);
    int32_t prev = -1;
    for (size_t k = 0; k < we.encoding.input_ids.size(); ++k) {
      m_ids.push_back(we.encoding.input_ids[k]);
      const int32_t w = we.word_ids[k];
      int32_t label = -100;
      if (w >= 0 && w != prev && !m_tagged) {
        label = 0;
      } else if (w >= 0 && w != prev) {
        const nlohmann::json& t = r.tags[static_cast<size_t>(w)];
        ANATOMY_CHECK(t.is_number_integer() == m_integer, path, ":", r.line, ": tag ", t.dump(), " is ",
                      t.is_number_integer() ? "an id" : "a name", " but the file's first tag is ",
                      m_integer ? "an id" : "a name");
        const auto it = index.find(t.is_string() ? t.get<std::string>() : std::to_string(t.get<int64_t>()));
        ANATOMY_CHECK(it != index.end(), path, ":", r.line, ": unknown tag ", t.dump(), " (the tags are ",
                      m_tags.size(), ": ", m_tags.empty() ? "" : m_tags.front(), " ...)");
        label = it->second;
      }
      if (w >= 0) prev = w;
      m_labels.push_back(label);
    }
    m_offsets.push_back(m_ids.size());
  }
}

void TokenTagDataset::get(size_t i, HostBatch& out, int64_t row) const {
  const int64_t T = out.seq, len = static_cast<int64_t>(m_offsets[i + 1] - m_offsets[i]);
  ANATOMY_CHECK(len <= T, "internal error: tagged sample ", i, " has ", len, " tokens, more than the batch length ", T);
  const size_t n = static_cast<size_t>(out.batch * T);
  if (out.token_labels.size() != n) out.token_labels.assign(n, -100);
  for (int64_t t = 0; t < T; ++t) {
    const bool tok = t < len;
    const size_t src = m_offsets[i] + static_cast<size_t>(t);
    out.input_ids[row * T + t] = tok ? m_ids[src] : m_pad;
    out.token_type_ids[row * T + t] = 0;
    out.attention_mask[row * T + t] = tok ? 1 : 0;
    out.token_labels[row * T + t] = tok ? m_labels[src] : -100;
  }
  out.labels[static_cast<size_t>(row)] = 0;
}

std::vector<int64_t> TokenTagDataset::lengths() const {
  std::vector<int64_t> out(size());
  for (size_t i = 0; i < size(); ++i) out[i] = static_cast<int64_t>(m_offsets[i + 1] - m_offsets[i]);
  return out;
}

namespace {

// (type, first word, last word) of each entity of a tag sequence, conlleval's chunking.
std::set<std::tuple<size_t, std::string, size_t, size_t>> entities(const std::vector<std::string>& tags, size_t seq) {
  std::set<std::tuple<size_t, std::string, size_t, size_t>> out;
  auto split = [](const std::string& t) -> std::pair<char, std::string> {
    if (t == "O" || t.size() < 2 || t[1] != '-') return {t == "O" ? 'O' : 'I', t == "O" ? "" : t};
    return {t[0], t.substr(2)};
  };
  char prev_tag = 'O';
  std::string prev_type;
  size_t start = 0;
  bool open = false;
  for (size_t i = 0; i <= tags.size(); ++i) {
    const auto [tag, type] = i < tags.size() ? split(tags[i]) : std::pair<char, std::string>{'O', ""};
    const bool ends = open && (tag == 'O' || tag == 'B' || tag == 'S' || prev_tag == 'E' || prev_tag == 'S' ||
                               type != prev_type);
    if (ends) {
      out.insert({seq, prev_type, start, i - 1});
      open = false;
    }
    const bool starts = tag == 'B' || tag == 'S' || (tag != 'O' && (!open || type != prev_type));
    if (starts && tag != 'O') {
      start = i;
      open = true;
    }
    prev_tag = tag;
    prev_type = type;
  }
  return out;
}

}  // namespace

EntityScores entity_scores(const std::vector<std::vector<std::string>>& predicted,
                           const std::vector<std::vector<std::string>>& gold) {
  ANATOMY_CHECK(predicted.size() == gold.size(), "entity_scores: ", predicted.size(), " predicted sequences for ",
                gold.size());
  EntityScores s;
  for (size_t i = 0; i < gold.size(); ++i) {
    const auto p = entities(predicted[i], i), g = entities(gold[i], i);
    s.predicted += static_cast<int64_t>(p.size());
    s.gold += static_cast<int64_t>(g.size());
    for (const auto& e : p) s.correct += g.count(e) ? 1 : 0;
  }
  return entity_scores_of_counts(s.predicted, s.gold, s.correct);
}

EntityScores entity_scores_of_counts(int64_t predicted, int64_t gold, int64_t correct) {
  EntityScores s;
  s.predicted = predicted;
  s.gold = gold;
  s.correct = correct;
  s.precision = s.predicted ? static_cast<double>(s.correct) / static_cast<double>(s.predicted) : 0.0;
  s.recall = s.gold ? static_cast<double>(s.correct) / static_cast<double>(s.gold) : 0.0;
  s.f1 = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0.0;
  return s;
}

}  // namespace anatomy
