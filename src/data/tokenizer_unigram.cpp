// The Unigram model of tokenizer.json (SentencePiece): the segmentation of highest total score
// (Viterbi over every vocabulary piece that matches), characters no piece covers scored as unknown.
#include <cctype>
#include <cstdlib>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace anatomy::tok {
namespace {

using nlohmann::json;

// Note [Unigram ties]
// As the reference does: pieces starting at a position are tried shortest first and replace the
// best path into their end only when strictly better, so among equal scores the path found first
// stays; an unknown character costs min_score - 10 and consecutive unknowns fuse into one <unk>.
struct ViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Unigram final : Model {
  std::unordered_map<std::string, int32_t, ViewHash, std::equal_to<>> ids;  // looked up by string_view
  std::vector<std::pair<std::string, double>> pieces;
  int32_t unk = -1;
  bool byte_fallback = false;
  double min_score = std::numeric_limits<double>::infinity();
  size_t max_bytes = 0;

  void tokenize(std::u32string_view word, std::vector<int32_t>& out) const override {
    const std::string s = unicode::encode_utf8(word);
    const size_t n = s.size();
    if (n == 0) return;
    struct Node {
      double score = 0;
      size_t from = SIZE_MAX;  // SIZE_MAX: not reached
      int32_t id = -1;
    };
    std::vector<Node> best(n + 1);
    best[0].from = 0;
    const double unk_score = min_score - 10.0;
    auto char_len = [&](size_t i) {
      const auto b = static_cast<unsigned char>(s[i]);
      return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    };
    for (size_t i = 0; i < n;) {
      const size_t len = static_cast<size_t>(char_len(i));
      const double here = best[i].score;
      bool single = false;
      for (size_t e = i + 1; e <= n && e - i <= max_bytes; ++e) {
        if (e < n && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) continue;
        const auto it = ids.find(std::string_view(s).substr(i, e - i));
        if (it == ids.end()) continue;
        const double cand = here + pieces[static_cast<size_t>(it->second)].second;
        if (best[e].from == SIZE_MAX || cand > best[e].score) best[e] = {cand, i, it->second};
        single = single || e - i == len;
      }
      if (!single) {
        const double cand = here + unk_score;
        if (best[i + len].from == SIZE_MAX || cand > best[i + len].score) best[i + len] = {cand, i, unk};
      }
      i += len;
    }
    std::vector<std::pair<size_t, size_t>> spans;  // [from, to) of each token, back to front
    for (size_t e = n; e > 0;) {
      const Node& nd = best[e];
      if (nd.id == unk && !spans.empty() && best[spans.back().second].id == unk && spans.back().first == e) {
        spans.back().first = nd.from;  // fuse with the unknown after it
      } else {
        spans.push_back({nd.from, e});
      }
      e = nd.from;
    }
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      const std::string piece = s.substr(it->first, it->second - it->first);
      const auto f = ids.find(piece);
      if (f != ids.end()) {
        out.push_back(f->second);
        continue;
      }
      if (byte_fallback) {
        for (unsigned char b : piece) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", b);
          const auto bf = ids.find(name);
          out.push_back(bf == ids.end() ? unk : bf->second);
        }
        continue;
      }
      out.push_back(unk);
    }
  }

  std::vector<std::pair<std::string, int32_t>> vocabulary() const override {
    std::vector<std::pair<std::string, int32_t>> v;
    for (size_t i = 0; i < pieces.size(); ++i) v.emplace_back(pieces[i].first, static_cast<int32_t>(i));
    return v;
  }
  int32_t unk_id() const override { return unk; }
};

// Note [Score parsing]
// The reference reads the file with serde_json, whose default float parser is not correctly
// rounded: it gathers the digits into a u64 significand s and a decimal exponent e and returns
// (double)s * 10^e or (double)s / 10^-e. With 17 significant digits (double)s already rounds,
// so about half of a trained vocabulary's scores land one ulp away from the exact value, and
// Viterbi's ties between equal-scoring segmentations (runs of "-") fall the other way. The
// scores are therefore re-read from the file's text the same way.
double serde_double(const std::string& text) {
  static const std::vector<double> pow10 = [] {
    std::vector<double> p;
    for (int i = 0; i <= 308; ++i) p.push_back(std::strtod(("1e" + std::to_string(i)).c_str(), nullptr));
    return p;
  }();
  size_t i = 0;
  const bool negative = i < text.size() && text[i] == '-';
  if (negative) ++i;
  uint64_t sig = 0;
  int64_t exp10 = 0;
  bool full = false;  // further digits no longer fit: ignored (only the exponent counts them)
  auto digit = [&](char c, bool fraction) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (!full && sig <= (UINT64_MAX - d) / 10) {
      sig = sig * 10 + d;
      if (fraction) --exp10;
    } else {
      full = true;
      if (!fraction) ++exp10;
    }
  };
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) digit(text[i], false);
  if (i < text.size() && text[i] == '.')
    for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) digit(text[i], true);
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) exp10 += std::strtoll(text.c_str() + i + 1, nullptr, 10);
  double f = static_cast<double>(sig);
  for (;;) {
    const uint64_t a = static_cast<uint64_t>(exp10 < 0 ? -exp10 : exp10);
    if (a < pow10.size()) {
      f = exp10 >= 0 ? f * pow10[a] : f / pow10[a];
      break;
    }
    if (f == 0.0 || exp10 >= 0) break;
    f /= 1e308;
    exp10 += 308;
  }
  return negative ? -f : f;
}

// The text of every number under model.vocab, in order (a SAX pass over the file).
struct VocabNumbers : nlohmann::json_sax<json> {
  std::vector<std::string> keys;  // the key of each open object, "" for arrays
  std::string pending;
  std::vector<std::string> numbers;
  bool in_vocab() const { return keys.size() >= 3 && keys[1] == "model" && keys[2] == "vocab"; }  // keys[0]: the root
  bool number(const std::string& raw) {
    if (in_vocab()) numbers.push_back(raw);
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return number(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return number(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& raw) override { return number(raw); }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys.push_back(pending);
    return true;
  }
  bool key(string_t& k) override {
    pending = k;
    return true;
  }
  bool end_object() override {
    keys.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    keys.push_back(pending);
    pending.clear();
    return true;
  }
  bool end_array() override {
    keys.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

std::unique_ptr<Model> make_unigram(const json& m, const std::string& file_text, const std::string& what) {
  auto u = std::make_unique<Unigram>();
  auto bad = [&](const auto&... x) { fail("tokenizer file '", what, "': ", x...); };
  if (!m.contains("vocab") || !m["vocab"].is_array() || m["vocab"].empty()) bad("Unigram model has no \"vocab\" list");
  VocabNumbers raw;
  json::sax_parse(file_text, &raw);
  const bool exact_text = raw.numbers.size() == m["vocab"].size();
  for (const json& e : m["vocab"]) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      bad("Unigram vocab entry ", e.dump(), " is not [piece, score]");
    const std::string piece = e[0].get<std::string>();
    const double score = exact_text ? serde_double(raw.numbers[u->pieces.size()]) : e[1].get<double>();
    u->ids.insert_or_assign(piece, static_cast<int32_t>(u->pieces.size()));  // a repeated piece: its last id
    u->pieces.emplace_back(piece, score);
    u->min_score = std::min(u->min_score, score);
    u->max_bytes = std::max(u->max_bytes, piece.size());
  }
  u->byte_fallback = m.value("byte_fallback", false);
  if (m.contains("unk_id") && !m["unk_id"].is_null()) {
    const int64_t id = m["unk_id"].get<int64_t>();
    if (id < 0 || static_cast<size_t>(id) >= u->pieces.size()) bad("Unigram unk_id ", id, " is outside the vocab");
    u->unk = static_cast<int32_t>(id);
  } else {
    bad("Unigram model has no unk_id (every character must have a fallback)");
  }
  return u;
}

}  // namespace anatomy::tok
