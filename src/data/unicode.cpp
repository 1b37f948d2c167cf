#include "data/unicode.h"

#include <utf8proc.h>

#include <cstdint>
#include <vector>

#include "core/error.h"

namespace anatomy::unicode {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Length of the well-formed prefix of the sequence at s[i] (lead byte included) and whether it is a
// complete code point; Table 3-7 of the Unicode standard gives the allowed second bytes.
struct Step {
  size_t len;   // bytes consumed
  char32_t cp;  // the code point, or kReplacement when ill-formed
  bool ok;
};

Step decode_one(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, b0, true};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, kReplacement, false};  // continuation byte, C0/C1 overlong lead, or F5..FF
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) return {j - i, kReplacement, false};  // cut short by the end: one U+FFFD
    const auto b = static_cast<uint8_t>(s[j]);
    if (b < lo || b > hi) return {j - i, kReplacement, false};  // the bad byte starts the next step
    cp = (cp << 6) | (b & 0x3F);
    lo = 0x80, hi = 0xBF;
  }
  return {j - i, cp, true};
}

// Other_Lowercase and Other_Uppercase ranges whose characters have no case mapping of their own.
constexpr std::pair<char32_t, char32_t> kOtherCased[] = {
    {0xAA, 0xAA},       {0xBA, 0xBA},       {0x2B0, 0x2B8},     {0x2C0, 0x2C1},
    {0x2E0, 0x2E4},     {0x345, 0x345},     {0x37A, 0x37A},     {0x1D2C, 0x1D6A},
    {0x1D78, 0x1D78},   {0x1D9B, 0x1DBF},   {0x2071, 0x2071},   {0x207F, 0x207F},
    {0x2090, 0x209C},   {0x2C7C, 0x2C7D},   {0xA69C, 0xA69D},   {0xA770, 0xA770},
    {0xA7F8, 0xA7F9},   {0xAB5C, 0xAB5F},   {0x1F130, 0x1F149}, {0x1F150, 0x1F169},
    {0x1F170, 0x1F189},
};

// Python's Cased: Lowercase, Uppercase or Lt.
bool is_cased(char32_t c) {
  const int cat = category(c);
  if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT) return true;
  const auto i = static_cast<utf8proc_int32_t>(c);
  if (utf8proc_tolower(i) != i || utf8proc_toupper(i) != i) return true;
  for (auto [lo, hi] : kOtherCased)
    if (c >= lo && c <= hi) return true;
  return false;
}

// Case_Ignorable: Mn Me Cf Lm Sk, and Word_Break MidLetter, MidNumLet and Single_Quote.
bool is_case_ignorable(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0xB7: case 0x387: case 0x55F: case 0x5F4:
    case 0x2018: case 0x2019: case 0x2024: case 0x2027: case 0xFE13: case 0xFE52:
    case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
      return true;
    default:
      return false;
  }
}

// Σ at i is final when a cased letter precedes it and none follows it, skipping case-ignorables.
bool final_sigma(const std::u32string& s, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(s[j - 1])) --j;
  if (j == 0 || !is_cased(s[j - 1])) return false;
  size_t k = i + 1;
  while (k < s.size() && is_case_ignorable(s[k])) ++k;
  return k == s.size() || !is_cased(s[k]);
}

// Lowercases in place; U+0130 is the one character whose full lowercase is two code points.
void lower_impl(std::u32string& text, bool python_final_sigma) {
  bool has_dotted_i = false;
  std::u32string orig;
  if (python_final_sigma) orig = text;
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c < 0x80) {
      if (c >= 'A' && c <= 'Z') text[i] = c + 32;
      continue;
    }
    if (c == 0x130) {
      has_dotted_i = true;
      continue;
    }
    if (c == 0x3A3 && python_final_sigma && final_sigma(orig, i)) {
      text[i] = 0x3C2;
      continue;
    }
    text[i] = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  }
  if (!has_dotted_i) return;
  std::u32string out;
  out.reserve(text.size() + 4);
  for (char32_t c : text) {
    if (c == 0x130) {
      out += U'i';
      out += char32_t{0x307};
    } else {
      out += c;
    }
  }
  text = std::move(out);
}

std::u32string normalize(std::u32string_view text, utf8proc_option_t options) {
  // Below U+00C0 nothing decomposes or composes canonically; compatibility mappings start at U+00A0.
  const char32_t limit = (options & UTF8PROC_COMPAT) ? 0xA0 : 0xC0;
  bool plain = true;
  for (char32_t c : text) plain = plain && c < limit;
  if (plain) return std::u32string(text);
  const std::string utf8 = encode_utf8(text);
  std::vector<utf8proc_int32_t> buf(text.size() * 2 + 8);
  utf8proc_ssize_t n;
  for (;;) {
    n = utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                           static_cast<utf8proc_ssize_t>(utf8.size()), buf.data(),
                           static_cast<utf8proc_ssize_t>(buf.size()), options);
    ANATOMY_CHECK(n >= 0, "utf8proc_decompose failed: ", utf8proc_errmsg(n));
    if (static_cast<size_t>(n) <= buf.size()) break;
    buf.resize(static_cast<size_t>(n));
  }
  if (options & UTF8PROC_COMPOSE) {
    n = utf8proc_normalize_utf32(buf.data(), n, options);
    ANATOMY_CHECK(n >= 0, "utf8proc_normalize_utf32 failed: ", utf8proc_errmsg(n));
  }
  return std::u32string(buf.begin(), buf.begin() + n);
}

// Note [Reference tables]
// The tables below were measured by asking each reference about every code point; rerun
// make_tokenizer_parity.py --compat-tables after a change of utf8proc, Python or tokenizers.
struct Range {
  char32_t lo, hi;
};

// Generated by tests/golden/make_tokenizer_parity.py --compat-tables: utf8proc 15.0.0, tokenizers 0.23.3, Python unicodedata 14.0.0.
constexpr Range k_rust_control[] = {{0x110000, 0x110000}};  // none
constexpr Range k_rust_not_control[] = {  // 20 code points
    {0x890, 0x891}, {0x8E2, 0x8E2}, {0x110CD, 0x110CD}, {0x13430, 0x1343F},
};
constexpr Range k_rust_punct[] = {{0x166D, 0x166D}, {0x111C9, 0x111C9}};  // 2 code points
constexpr Range k_rust_not_punct[] = {  // 127 code points
    {0x61D, 0x61D}, {0x9FD, 0x9FD}, {0xA76, 0xA76}, {0xC77, 0xC77}, {0xC84, 0xC84},
    {0x1B7D, 0x1B7E}, {0x2E43, 0x2E4F}, {0x2E52, 0x2E5D}, {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59},
    {0x10F86, 0x10F89}, {0x1144B, 0x1144F}, {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C},
    {0x116B9, 0x116B9}, {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46},
    {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71},
    {0x11EF7, 0x11EF8}, {0x11F43, 0x11F4F}, {0x11FFF, 0x11FFF}, {0x12FF1, 0x12FF2}, {0x16E97, 0x16E9A},
    {0x16FE2, 0x16FE2}, {0x1E95E, 0x1E95F},
};
constexpr Range k_rust_mn[] = {{0x1734, 0x1734}};  // 1 code points
constexpr Range k_rust_not_mn[] = {  // 419 code points
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8E1}, {0x9FE, 0x9FE}, {0xAFA, 0xAFF},
    {0xB55, 0xB55}, {0xC04, 0xC04}, {0xC3C, 0xC3C}, {0xD00, 0xD00}, {0xD3B, 0xD3C},
    {0xD81, 0xD81}, {0xEBA, 0xEBA}, {0xECE, 0xECE}, {0x180F, 0x180F}, {0x1885, 0x1886},
    {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFB}, {0xA82C, 0xA82C}, {0xA8C5, 0xA8C5}, {0xA8FF, 0xA8FF},
    {0xA9BD, 0xA9BD}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074}, {0x110C2, 0x110C2}, {0x111C9, 0x111C9},
    {0x111CF, 0x111CF}, {0x1123E, 0x1123E}, {0x11241, 0x11241}, {0x1133B, 0x1133B}, {0x11438, 0x1143F},
    {0x11442, 0x11444}, {0x11446, 0x11446}, {0x1145E, 0x1145E}, {0x1182F, 0x11837}, {0x11839, 0x1183A},
    {0x1193B, 0x1193C}, {0x1193E, 0x1193E}, {0x11943, 0x11943}, {0x119D4, 0x119D7}, {0x119DA, 0x119DB},
    {0x119E0, 0x119E0}, {0x11A01, 0x11A0A}, {0x11A33, 0x11A38}, {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47},
    {0x11A51, 0x11A56}, {0x11A59, 0x11A5B}, {0x11A8A, 0x11A96}, {0x11A98, 0x11A99}, {0x11C30, 0x11C36},
    {0x11C38, 0x11C3D}, {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7}, {0x11CAA, 0x11CB0}, {0x11CB2, 0x11CB3},
    {0x11CB5, 0x11CB6}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D45},
    {0x11D47, 0x11D47}, {0x11D90, 0x11D91}, {0x11D95, 0x11D95}, {0x11D97, 0x11D97}, {0x11EF3, 0x11EF4},
    {0x11F00, 0x11F01}, {0x11F36, 0x11F3A}, {0x11F40, 0x11F40}, {0x11F42, 0x11F42}, {0x13440, 0x13440},
    {0x13447, 0x13455}, {0x16F4F, 0x16F4F}, {0x16FE4, 0x16FE4}, {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46},
    {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024}, {0x1E026, 0x1E02A},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
    {0x1E944, 0x1E94A},
};
constexpr Range k_rust_cjk[] = {{0x110000, 0x110000}};  // none
constexpr Range k_rust_not_cjk[] = {{0x2B820, 0x2B91F}};  // 256 code points
constexpr Range k_python_control[] = {  // 4482 code points
    {0xCF3, 0xCF3}, {0xECE, 0xECE}, {0x10EFD, 0x10EFF}, {0x1123F, 0x11241}, {0x11B00, 0x11B09},
    {0x11F00, 0x11F10}, {0x11F12, 0x11F3A}, {0x11F3E, 0x11F59}, {0x1342F, 0x1342F}, {0x13440, 0x13455},
    {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1D2C0, 0x1D2D3}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D},
    {0x1E08F, 0x1E08F}, {0x1E4D0, 0x1E4F9}, {0x1F6DC, 0x1F6DC}, {0x1F774, 0x1F776}, {0x1F77B, 0x1F77F},
    {0x1F7D9, 0x1F7D9}, {0x1FA75, 0x1FA77}, {0x1FA87, 0x1FA88}, {0x1FAAD, 0x1FAAF}, {0x1FABB, 0x1FABD},
    {0x1FABF, 0x1FABF}, {0x1FACE, 0x1FACF}, {0x1FADA, 0x1FADB}, {0x1FAE8, 0x1FAE8}, {0x1FAF7, 0x1FAF8},
    {0x2B739, 0x2B739}, {0x31350, 0x323AF},
};
constexpr Range k_python_not_control[] = {{0x110000, 0x110000}};  // none
constexpr Range k_python_punct[] = {{0x110000, 0x110000}};  // none
constexpr Range k_python_not_punct[] = {{0x110000, 0x110000}};  // none
constexpr Range k_python_mn[] = {{0x110000, 0x110000}};  // none
constexpr Range k_python_not_mn[] = {{0x110000, 0x110000}};  // none

template <size_t N>
bool in(const Range (&table)[N], char32_t c) {
  size_t lo = 0, hi = N;  // first range with hi >= c
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid].hi < c) lo = mid + 1; else hi = mid;
  }
  return lo < N && table[lo].lo <= c;
}

}  // namespace

int reference_override(Reference ref, Property prop, char32_t c) {
  if (c < 0x600) return 0;  // every table starts above
  auto pick = [&](const auto& yes, const auto& no) { return in(yes, c) ? 1 : in(no, c) ? -1 : 0; };
  const bool py = ref == Reference::Python;
  switch (prop) {
    case Property::Control:
      return py ? pick(k_python_control, k_python_not_control) : pick(k_rust_control, k_rust_not_control);
    case Property::Punctuation:
      return py ? pick(k_python_punct, k_python_not_punct) : pick(k_rust_punct, k_rust_not_punct);
    case Property::NonspacingMark:
      return py ? pick(k_python_mn, k_python_not_mn) : pick(k_rust_mn, k_rust_not_mn);
    case Property::Cjk:
      return py ? 0 : pick(k_rust_cjk, k_rust_not_cjk);
  }
  return 0;
}

std::u32string decode_utf8(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Step st = decode_one(bytes, i);
    out += st.cp;
    i += st.len;
  }
  return out;
}

bool decode_utf8_strict(std::string_view bytes, std::u32string& out) {
  out.clear();
  for (size_t i = 0; i < bytes.size();) {
    const Step st = decode_one(bytes, i);
    if (!st.ok) return false;
    out += st.cp;
    i += st.len;
  }
  return true;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(out, c);
  return out;
}

int category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_mark_nonspacing(char32_t c) { return c >= 0x300 && category(c) == UTF8PROC_CATEGORY_MN; }

bool is_punctuation_category(char32_t c) {
  const int cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_python_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

bool is_white_space_property(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

void python_lower(std::u32string& text) { lower_impl(text, true); }
void char_lower(std::u32string& text) { lower_impl(text, false); }

std::u32string nfd(std::u32string_view text) { return normalize(text, UTF8PROC_DECOMPOSE); }
std::u32string nfc(std::u32string_view text) { return normalize(text, UTF8PROC_COMPOSE); }

}  // namespace anatomy::unicode

namespace anatomy::unicode {

std::u32string nfkd(std::u32string_view text) { return normalize(text, static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)); }
std::u32string nfkc(std::u32string_view text) { return normalize(text, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT)); }

bool is_letter(char32_t c) {
  const int k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_number(char32_t c) {
  const int k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_mark(char32_t c) {
  const int k = category(c);
  return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}

std::vector<size_t> grapheme_bounds(std::u32string_view text) {
  std::vector<size_t> b;
  utf8proc_int32_t state = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (i == 0 || utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(text[i - 1]),
                                                   static_cast<utf8proc_int32_t>(text[i]), &state))
      b.push_back(i);
  }
  b.push_back(text.size());
  return b;
}

bool is_blank_text(std::string_view utf8) {
  for (char32_t c : decode_utf8(utf8))
    if (!is_python_space(c)) return false;
  return true;
}

}  // namespace anatomy::unicode
