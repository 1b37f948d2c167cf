// Arbitrary bytes as text for the committed uncased vocabulary, under both rule sets: encode must
// never fault, and its output must be well formed (ids in range, [CLS] first, types and mask
// consistent, lengths bounded by max_length).
#include <memory>
#include <optional>
#include <string_view>

#include "data/tokenizer.h"
#include "fuzz_common.h"

using namespace anatomy;

namespace {
struct Tokenizers {
  WordPieceTokenizer slow = WordPieceTokenizer::from_vocab_txt(ANATOMY_SOURCE_DIR "/tests/data/tokenizer/vocab.txt");
  WordPieceTokenizer fast =
      WordPieceTokenizer::from_tokenizer_json(ANATOMY_SOURCE_DIR "/tests/data/tokenizer/tokenizer.json");
  WordPieceTokenizer cased =
      WordPieceTokenizer::from_vocab_txt(ANATOMY_SOURCE_DIR "/tests/data/tokenizer/vocab.txt", false);
};
const Tokenizers& tokenizers() {
  static const Tokenizers t;  // loaded once per process
  return t;
}

void check(const WordPieceTokenizer& tok, const Encoding& e, size_t max_length, Padding padding) {
  const size_t n = e.input_ids.size();
  FUZZ_EXPECT(e.token_type_ids.size() == n && e.attention_mask.size() == n);
  FUZZ_EXPECT(n >= 2 && n <= max_length);
  if (padding == Padding::MaxLength) FUZZ_EXPECT(n == max_length);
  FUZZ_EXPECT(e.input_ids[0] == tok.cls_id());
  bool padded = false;
  for (size_t i = 0; i < n; ++i) {
    FUZZ_EXPECT(e.input_ids[i] >= 0 && static_cast<size_t>(e.input_ids[i]) < tok.vocab_size());
    FUZZ_EXPECT(e.token_type_ids[i] == 0 || e.token_type_ids[i] == 1);
    FUZZ_EXPECT(e.attention_mask[i] == 0 || e.attention_mask[i] == 1);
    if (e.attention_mask[i] == 0)
      padded = true;
    else
      FUZZ_EXPECT(!padded);  // padding only at the end
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizers& t = tokenizers();
  const uint8_t mode = data[0];
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const WordPieceTokenizer& tok = (mode & 3) == 0 ? t.slow : (mode & 3) == 1 ? t.fast : t.cased;
  const size_t max_length = 3 + (mode >> 3);  // 3..34: short enough to exercise truncation
  const Padding padding = (mode & 4) ? Padding::MaxLength : Padding::None;

  for (int32_t id : tok.encode_words(text)) FUZZ_EXPECT(id >= 0 && static_cast<size_t>(id) < tok.vocab_size());
  check(tok, tok.encode(text, std::nullopt, max_length, Truncation::LongestFirst, padding), max_length, padding);
  // The same bytes split in two as a pair.
  const size_t cut = text.size() / 2;
  if (max_length >= 4)
    check(tok, tok.encode(text.substr(0, cut), text.substr(cut), max_length, Truncation::LongestFirst, padding),
          max_length, padding);
  return 0;
}
