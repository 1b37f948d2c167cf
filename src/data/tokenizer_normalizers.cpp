// The normalizers of tokenizer.json files: NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents,
// Replace, Prepend, Sequence and SentencePiece's Precompiled character map.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "data/tokenizer_parts.h"
#include "data/unicode.h"

namespace anatomy::tok {

bool is_space(char32_t c) { return unicode::is_white_space_property(c); }

namespace {

using nlohmann::json;

struct Sequence final : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> parts;
  void apply(std::u32string& t, Front& front) const override {
    for (const auto& p : parts) p->apply(t, front);
  }
};

struct Unicode final : Normalizer {
  std::u32string (*fn)(std::u32string_view);
  explicit Unicode(std::u32string (*f)(std::u32string_view)) : fn(f) {}
  void apply(std::u32string& t, Front& front) const override {
    if (!t.empty()) front.span = std::max<size_t>(1, fn(std::u32string_view(t).substr(0, front.span)).size());
    t = fn(t);
  }
};

struct Lowercase final : Normalizer {
  void apply(std::u32string& t, Front& front) const override {
    std::u32string head = t.substr(0, front.span);
    unicode::char_lower(head);
    unicode::char_lower(t);
    front.span = std::max<size_t>(1, head.size());
  }
};

struct Strip final : Normalizer {
  bool left = true, right = true;
  void apply(std::u32string& t, Front& front) const override {
    size_t b = 0, e = t.size();
    if (left) while (b < e && is_space(t[b])) ++b;
    if (b >= front.span) front.dropped = front.dropped || b > 0;
    else front.span -= b;
    if (right) while (e > b && is_space(t[e - 1])) --e;
    t = t.substr(b, e - b);
  }
};

struct StripAccents final : Normalizer {
  void apply(std::u32string& t, Front& front) const override { 
    size_t kept = 0;
    for (size_t i = 0; i < std::min(front.span, t.size()); ++i) kept += !unicode::is_mark(t[i]);
    if (kept == 0) front.dropped = front.dropped || !t.empty();
    else front.span = kept;
    std::erase_if(t, [](char32_t c) { return unicode::is_mark(c); });
  }
};

struct Prepend final : Normalizer {
  std::u32string prefix;
  void apply(std::u32string& t, Front& front) const override {
    if (t.empty()) return;
    t.insert(0, prefix);
    front.span += prefix.size();
  }
};

// Replace's pattern: a literal string, or a regex of the one shape these files use, a single
// character repeated ("X+", "X*" is refused, "X{m,}", "X{m,n}"). Matches are leftmost, greedy and
// do not overlap, as Oniguruma finds them.
struct Replace final : Normalizer {
  std::u32string literal;  // a string pattern, or the repeated character
  bool repeat = false;
  size_t lo = 1, hi = SIZE_MAX;
  std::u32string content;
  // A match of n characters at the start: the library aligns its content with the match's last
  // character, so the front survives only when the match ends within it (and leaves something).
  void matched_front(size_t n, Front& front) const {
    if (n > front.span || (content.empty() && n == front.span)) front.dropped = true;
    else front.span = front.span - n + content.size();
  }
  void apply(std::u32string& t, Front& front) const override {
    std::u32string out;
    out.reserve(t.size());
    for (size_t i = 0; i < t.size();) {
      if (!repeat) {
        if (std::u32string_view(t).substr(i).starts_with(literal)) {
          if (i == 0) matched_front(literal.size(), front);
          out += content;
          i += literal.size();
          continue;
        }
      } else if (t[i] == literal[0]) {
        size_t j = i;
        while (j < t.size() && t[j] == literal[0] && j - i < hi) ++j;
        if (j - i >= lo) {
          if (i == 0) matched_front(j, front);
          out += content;
          i = j;
          continue;
        }
      }
      out += t[i++];
    }
    t = std::move(out);
  }
};

std::unique_ptr<Normalizer> make_replace(const json& j, const std::string& what) {
  auto r = std::make_unique<Replace>();
  r->content = unicode::decode_utf8(j.at("content").get<std::string>());
  const json& p = j.at("pattern");
  if (p.contains("String")) {
    r->literal = unicode::decode_utf8(p["String"].get<std::string>());
    ANATOMY_CHECK(!r->literal.empty(), "tokenizer file '", what, "': Replace with an empty pattern");
    return r;
  }
  const std::string re = p.at("Regex").get<std::string>();
  const std::u32string u = unicode::decode_utf8(re);
  auto refuse = [&] { fail("tokenizer file '", what, "': Replace regex \"", re, "\" is not supported (only \"X+\" or \"X{m,n}\")"); };
  size_t k = 0;
  if (u.size() >= 2 && u[0] == '\\') k = 1;
  if (u.size() < k + 2) refuse();
  const char32_t c = u[k];
  if (k == 0 && std::u32string_view(U".^$|()[]{}*+?\\").find(c) != std::u32string_view::npos) refuse();
  r->literal = std::u32string(1, c);
  r->repeat = true;
  const std::string q = unicode::encode_utf8(std::u32string_view(u).substr(k + 1));
  if (q == "+") return r;
  size_t m = 0, n = 0, used = 0;
  if (std::sscanf(q.c_str(), "{%zu,%zu}%zn", &m, &n, &used) == 2 && used == q.size() && m >= 1 && m <= n) {
    r->lo = m, r->hi = n;
  } else if (std::sscanf(q.c_str(), "{%zu,}%zn", &m, &used) == 1 && used == q.size() && m >= 1) {
    r->lo = m;
  } else {
    refuse();
  }
  return r;
}

// SentencePiece's precompiled character map: a little-endian u32 byte size of a double-array
// trie (darts-clone units), the trie, then NUL-terminated replacement strings. The trie maps UTF-8
// keys to offsets of their replacements.
//
// Note [Precompiled]
// tokenizers applies it per extended grapheme cluster: a cluster under 6 bytes is looked up whole
// and, when any prefix of it is a key, the whole cluster becomes the replacement of the SHORTEST
// matching prefix; otherwise each code point is looked up alone and kept when it is no key. This
// is the reference's behaviour (SentencePiece's own normalizer differs) and is reproduced as is.
struct Precompiled final : Normalizer {
  std::vector<uint32_t> units;
  std::string strings;

  // Offset of the replacement for the shortest key that is a prefix of `key`, or -1.
  int64_t lookup(std::string_view key) const {
    auto offset = [](uint32_t u) -> size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    size_t pos = 0;
    if (units.empty()) return -1;
    pos ^= offset(units[0]);
    for (unsigned char c : key) {
      if (c == 0) break;
      pos ^= c;
      if (pos >= units.size()) return -1;
      const uint32_t u = units[pos];
      if ((u & ((1u << 31) | 0xFF)) != c) return -1;
      pos ^= offset(u);
      if (pos >= units.size()) return -1;
      if ((u >> 8) & 1) return units[pos] & 0x7FFFFFFFu;
    }
    return -1;
  }
  bool transform(std::u32string_view chunk, std::u32string& out) const {
    const int64_t at = lookup(unicode::encode_utf8(chunk));
    if (at < 0 || static_cast<size_t>(at) >= strings.size()) return false;
    const size_t end = strings.find('\0', static_cast<size_t>(at));
    out += unicode::decode_utf8(std::string_view(strings).substr(static_cast<size_t>(at), end - static_cast<size_t>(at)));
    return true;
  }
  void apply(std::u32string& t, Front& front) const override {
    if (units.empty()) return;
    std::u32string out;
    out.reserve(t.size());
    const std::vector<size_t> b = unicode::grapheme_bounds(t);
    for (size_t g = 0; g + 1 < b.size(); ++g) {
      const std::u32string_view cluster = std::u32string_view(t).substr(b[g], b[g + 1] - b[g]);
      const size_t before = out.size();
      if (unicode::encode_utf8(cluster).size() < 6 && transform(cluster, out)) {
      } else {
        for (size_t i = 0; i < cluster.size(); ++i)
          if (!transform(cluster.substr(i, 1), out)) out += cluster[i];
      }
      if (g == 0) {  // the first cluster stands for the front (Note [Front])
        if (out.size() == before) front.dropped = true;
        else front.span = out.size();
      }
    }
    t = std::move(out);
  }
};

std::string base64_decode(std::string_view s, const std::string& what) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    int v;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    else if (ch == '=') break;
    else fail("tokenizer file '", what, "': precompiled_charsmap is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

std::unique_ptr<Normalizer> make_precompiled(const json& j, const std::string& what) {
  auto p = std::make_unique<Precompiled>();
  const json& m = j.at("precompiled_charsmap");
  if (m.is_null()) return p;
  const std::string blob = base64_decode(m.get<std::string>(), what);
  if (blob.empty()) return p;
  uint32_t n = 0;
  ANATOMY_CHECK(blob.size() >= 4, "tokenizer file '", what, "': precompiled_charsmap is truncated");
  for (int k = 3; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(blob[static_cast<size_t>(k)]);
  ANATOMY_CHECK(n % 4 == 0 && blob.size() >= 4 + size_t{n}, "tokenizer file '", what,
                "': precompiled_charsmap's trie size ", n, " does not fit its ", blob.size(), " bytes");
  p->units.resize(n / 4);
  std::memcpy(p->units.data(), blob.data() + 4, n);  // little-endian host (x86-64, aarch64)
  p->strings = blob.substr(4 + size_t{n});
  return p;
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& what) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    auto s = std::make_unique<Sequence>();
    for (const json& p : j.at("normalizers"))
      if (auto n = make_normalizer(p, what)) s->parts.push_back(std::move(n));
    return s;
  }
  if (type == "NFC") return std::make_unique<Unicode>(&unicode::nfc);
  if (type == "NFD") return std::make_unique<Unicode>(&unicode::nfd);
  if (type == "NFKC") return std::make_unique<Unicode>(&unicode::nfkc);
  if (type == "NFKD") return std::make_unique<Unicode>(&unicode::nfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip") {
    auto s = std::make_unique<Strip>();
    s->left = j.value("strip_left", true);
    s->right = j.value("strip_right", true);
    return s;
  }
  if (type == "Prepend") {
    auto p = std::make_unique<Prepend>();
    p->prefix = unicode::decode_utf8(j.at("prepend").get<std::string>());
    return p;
  }
  if (type == "Replace") return make_replace(j, what);
  if (type == "Precompiled") return make_precompiled(j, what);
  fail("tokenizer file '", what, "': normalizer type \"", type, "\" is not supported");
}

}  // namespace anatomy::tok
