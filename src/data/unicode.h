// Unicode helpers for the tokenizer: UTF-8 decoding with Python's replacement rule, and the
// character properties and normalizations (through utf8proc) that BERT's text cleaning needs.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anatomy::unicode {

// Decodes UTF-8 the way Python's bytes.decode("utf-8", errors="replace") does: each maximal
// ill-formed subsequence (a bad start byte, or a valid prefix of a sequence cut short by a bad
// continuation byte or the end) becomes one U+FFFD, and decoding resumes right after it.
// Overlong forms, surrogates (ED A0..BF) and code points above U+10FFFF are ill-formed.
std::u32string decode_utf8(std::string_view bytes);

// Like decode_utf8 but returns false at the first ill-formed sequence (for files that must be valid).
bool decode_utf8_strict(std::string_view bytes, std::u32string& out);

void append_utf8(std::string& out, char32_t c);
std::string encode_utf8(std::u32string_view text);

// General category as utf8proc numbers it (UTF8PROC_CATEGORY_*): 0 is Cn (unassigned).
int category(char32_t c);
bool is_mark_nonspacing(char32_t c);   // Mn
bool is_punctuation_category(char32_t c);  // Pc Pd Ps Pe Pi Pf Po

// Where a reference tokenizer's own Unicode tables disagree with utf8proc's: +1 when the reference
// gives c the property and utf8proc does not, -1 for the reverse, 0 when they agree. Python is
// 3.11's unicodedata (Unicode 14); Tokenizers is the Rust tokenizers library's tables (0.23).
enum class Reference { Python, Tokenizers };
enum class Property { Control, Punctuation, NonspacingMark, Cjk };
int reference_override(Reference ref, Property prop, char32_t c);

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool is_python_space(char32_t c);
// Empty, or every character is_python_space (Python's str.isspace()).
bool is_blank_text(std::string_view utf8);
// Rust's char::is_whitespace(): the White_Space property.
bool is_white_space_property(char32_t c);

// Python's str.lower() on a whole string: full lowercase mapping (U+0130 becomes "i̇") and the
// Final_Sigma rule (Σ at the end of a word becomes ς).
void python_lower(std::u32string& text);
// Rust's per-character char::to_lowercase() as Hugging Face tokenizers applies it: the full
// mapping (U+0130 becomes "i̇") without Final_Sigma, which needs context.
void char_lower(std::u32string& text);

// Canonical decomposition (NFD) and composition (NFC).
std::u32string nfd(std::u32string_view text);
std::u32string nfc(std::u32string_view text);
// Compatibility decomposition (NFKD) and composition (NFKC).
std::u32string nfkd(std::u32string_view text);
std::u32string nfkc(std::u32string_view text);

bool is_letter(char32_t c);  // L*: Lu Ll Lt Lm Lo
bool is_number(char32_t c);  // N*: Nd Nl No
bool is_mark(char32_t c);    // M*: Mn Mc Me

// Where each extended grapheme cluster of the text begins (UAX #29, as utf8proc implements it),
// then text.size(): clusters are [b[i], b[i+1]).
std::vector<size_t> grapheme_bounds(std::u32string_view text);

}  // namespace anatomy::unicode
