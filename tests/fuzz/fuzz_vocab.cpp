// Arbitrary bytes as a vocab.txt or a tokenizer.json (the first byte picks which): the loader
// must succeed or throw anatomy::Error, and a tokenizer it accepts must encode text sanely.
#include <string_view>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_common.h"

using namespace anatomy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  fuzz::MemFile file(data + 1, size - 1);
  try {
    WordPieceTokenizer tok = (mode & 1) ? WordPieceTokenizer::from_tokenizer_json(file.path())
                                        : WordPieceTokenizer::from_vocab_txt(file.path(), mode & 2);
    const int32_t n = static_cast<int32_t>(tok.vocab_size());
    Encoding e = tok.encode("Hello, wörld! 你好 [SEP] unaffable", std::string_view("a b"), 16);
    FUZZ_EXPECT(e.input_ids.size() == 16 && e.token_type_ids.size() == 16);
    for (int32_t id : e.input_ids) FUZZ_EXPECT(id >= 0 && id < n);
    // A tokenizer.json may leave ids unassigned; those read back as "" and are not looked up.
    for (int32_t id = 0; id < n && id < 64; ++id)
      if (!tok.id_to_token(id).empty()) FUZZ_EXPECT(tok.token_to_id(tok.id_to_token(id)) >= 0);
  } catch (const Error&) {
  }
  return 0;
}
