// The pre-tokenizers of tokenizer.json files: ByteLevel (GPT-2's split and byte alphabet),
// Metaspace (SentencePiece's ▁), WhitespaceSplit and Sequence.
#include "core/error.h"
#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace anatomy::tok {
namespace {

using nlohmann::json;

struct Sequence final : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts) p->split(pieces);
  }
};

// Note [GPT-2 split]
// ByteLevel's regex, 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
// tried alternative by alternative at each position (Oniguruma takes the first that matches, not
// the longest). Its last alternatives cover every character, so the matches tile the text.
// \s+(?!\S) backtracks: a run of spaces followed by a non-space leaves its last space to start the
// next match (" ?\p{L}+" takes it with the word).
size_t gpt2_match(std::u32string_view t, size_t i) {
  const size_t n = t.size();
  auto other = [&](size_t k) { return k < n && !is_space(t[k]) && !unicode::is_letter(t[k]) && !unicode::is_number(t[k]); };
  if (t[i] == '\'' && i + 1 < n) {
    const char32_t a = t[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < n) {
      const char32_t b = t[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
  }
  const size_t s = t[i] == ' ' ? 1 : 0;
  for (auto cls : {+[](char32_t c) { return unicode::is_letter(c); }, +[](char32_t c) { return unicode::is_number(c); }}) {
    if (i + s < n && cls(t[i + s])) {
      size_t j = i + s;
      while (j < n && cls(t[j])) ++j;
      return j - i;
    }
  }
  if (other(i + s)) {
    size_t j = i + s;
    while (other(j)) ++j;
    return j - i;
  }
  size_t j = i;
  while (j < n && is_space(t[j])) ++j;
  if (j == n || j - i == 1) return j - i;
  return j - i - 1;
}

// Bytes to the printable code points GPT-2 uses for them: the printable Latin-1 bytes stand for
// themselves, the others (controls, space, soft hyphen) for 256, 257, ... in byte order.
struct ByteAlphabet {
  char32_t map[256];
  ByteAlphabet() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      map[b] = printable ? static_cast<char32_t>(b) : next++;
    }
  }
};

struct ByteLevel final : PreTokenizer {
  bool add_prefix_space = true, use_regex = true;
  void split(std::vector<Piece>& pieces) const override {
    static const ByteAlphabet alphabet;
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      if (add_prefix_space && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, 1, U' ');
      std::vector<std::u32string_view> parts;
      const std::u32string_view t(p.text);
      if (use_regex) {
        for (size_t i = 0; i < t.size();) {
          const size_t len = gpt2_match(t, i);
          parts.push_back(t.substr(i, len));
          i += len;
        }
      } else if (!t.empty()) {
        parts.push_back(t);
      }
      bool first = true;
      for (std::u32string_view part : parts) {
        Piece q;
        q.at_origin = p.at_origin && first;
        first = false;
        for (unsigned char b : unicode::encode_utf8(part)) q.text += alphabet.map[b];
        out.push_back(std::move(q));
      }
    }
    pieces = std::move(out);
  }
};

// Spaces become the replacement (▁), which then starts every part ("merged with next").
struct Metaspace final : PreTokenizer {
  char32_t replacement = U'\u2581';
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split_parts = true;
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      for (char32_t& c : p.text)
        if (c == ' ') c = replacement;
      const bool add = prepend == Prepend::Always || (prepend == Prepend::First && p.at_origin);
      if (add && !p.text.empty() && p.text[0] != replacement) p.text.insert(0, 1, replacement);
      if (!split_parts) {
        if (!p.text.empty()) out.push_back(std::move(p));
        continue;
      }
      size_t start = 0;
      for (size_t i = 0; i <= p.text.size(); ++i) {
        if (i < p.text.size() && (p.text[i] != replacement || i == start)) continue;
        if (i > start) out.push_back({p.text.substr(start, i - start), p.at_origin && start == 0});
        start = i;
      }
    }
    pieces = std::move(out);
  }
};

struct WhitespaceSplit final : PreTokenizer {
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& p : pieces) {
      size_t start = 0;
      for (size_t i = 0; i <= p.text.size(); ++i) {
        if (i < p.text.size() && !is_space(p.text[i])) continue;
        if (i > start) out.push_back({p.text.substr(start, i - start), p.at_origin && start == 0});
        start = i + 1;
      }
    }
    pieces = std::move(out);
  }
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& what) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    auto s = std::make_unique<Sequence>();
    for (const json& p : j.at("pretokenizers"))
      if (auto n = make_pre_tokenizer(p, what)) s->parts.push_back(std::move(n));
    return s;
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevel>();
    b->add_prefix_space = j.value("add_prefix_space", true);
    b->use_regex = j.value("use_regex", true);
    return b;
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<Metaspace>();
    const std::u32string r = unicode::decode_utf8(j.value("replacement", std::string("\u2581")));
    ANATOMY_CHECK(r.size() == 1, "tokenizer file '", what, "': Metaspace replacement must be one character");
    m->replacement = r[0];
    if (j.contains("prepend_scheme")) {
      const std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") m->prepend = Metaspace::Prepend::Always;
      else if (s == "first") m->prepend = Metaspace::Prepend::First;
      else if (s == "never") m->prepend = Metaspace::Prepend::Never;
      else fail("tokenizer file '", what, "': Metaspace prepend_scheme \"", s, "\" is unknown");
    } else {  // files written before tokenizers 0.19
      m->prepend = j.value("add_prefix_space", true) ? Metaspace::Prepend::Always : Metaspace::Prepend::Never;
    }
    m->split_parts = j.value("split", true);
    return m;
  }
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  fail("tokenizer file '", what, "': pre_tokenizer type \"", type, "\" is not supported");
}

}  // namespace anatomy::tok
