// The stages of a tokenizer.json pipeline, as the Hugging Face tokenizers library (0.23) runs
// them: normalizer, pre-tokenizer, model. Built from the file's JSON by the make_* functions,
// which fail with a one-line error naming the file for a type or option they do not implement.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy::tok {

// Everything here works on code points; `what` names the file in errors.
// Note [Front]
// Metaspace's "first" scheme prepends only to text that starts at original offset 0, which the
// library knows from its alignments. Only the front matters here: span counts the leading
// characters that came from the original first character (NFKC turns "¨" into " \u0308", both
// from it), and dropped is set once all of those are removed (Strip of a leading space), after which
// the text starts later in the original.
struct Front {
  bool dropped = false;
  size_t span = 1;
};
struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::u32string& text, Front& front) const = 0;
};
// Null JSON gives nullptr (no normalization).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& what);

// A piece of text between added tokens, then between pre-tokenizer splits. at_origin: it starts
// at offset 0 of the original text (Metaspace's "first" scheme prepends only there).
struct Piece {
  std::u32string text;
  bool at_origin = false;
};
struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  // Replaces each piece by its parts, in order; empty parts are dropped.
  virtual void split(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& what);

struct Model {
  virtual ~Model() = default;
  virtual void tokenize(std::u32string_view word, std::vector<int32_t>& ids) const = 0;
  // Every (token, id) the model knows, for the id -> token table.
  virtual std::vector<std::pair<std::string, int32_t>> vocabulary() const = 0;
  virtual int32_t unk_id() const = 0;  // -1 when none
};
std::unique_ptr<Model> make_bpe(const nlohmann::json& model, const std::string& what);
// file_text: the whole file, for the scores' digits (Note [Score parsing] in tokenizer_unigram.cpp).
std::unique_ptr<Model> make_unigram(const nlohmann::json& model, const std::string& file_text, const std::string& what);

// Rust's char::is_whitespace (the White_Space property).
bool is_space(char32_t c);

}  // namespace anatomy::tok
