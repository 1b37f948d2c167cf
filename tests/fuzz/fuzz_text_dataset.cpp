// Arbitrary bytes as a JSONL, CSV or TSV data file (the first byte picks the format and the
// columns): the readers must yield records or throw anatomy::Error with a one-line message, and
// every record must be well formed. A few records are tokenized, and the whole file is also
// loaded as a TextDataset (in memory, no cache) once in a while to cover label resolution.
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/csv.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "fuzz_common.h"

using namespace anatomy;

namespace {
// A small vocabulary (specials, a few words, every letter and digit with and without "##") keeps
// each load, whose cache key hashes the whole vocabulary, cheap enough to run on every input.
const WordPieceTokenizer& tokenizer() {
  static const WordPieceTokenizer t = [] {
    std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ngood\nbad\nfilm\nhello\nworld\n,\n.\n!\n\"\n";
    for (char c : std::string_view("abcdefghijklmnopqrstuvwxyz0123456789")) {
      vocab += std::string(1, c) + "\n";
      vocab += "##" + std::string(1, c) + "\n";
    }
    fuzz::MemFile file(reinterpret_cast<const uint8_t*>(vocab.data()), vocab.size());
    return WordPieceTokenizer::from_vocab_txt(file.path());
  }();
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const TextFormat format = (mode & 3) == 0 ? TextFormat::Jsonl : (mode & 3) == 1 ? TextFormat::Csv : TextFormat::Tsv;
  RecordColumns cols;
  if (mode & 4) cols.text_pair = "text_pair";
  if (mode & 8) cols.label = "";
  const char delimiter = (mode & 3) == 3 ? ';' : 0;
  const size_t max_record = (mode & 16) ? 64 : kMaxRecordBytes;  // exercise the bound too
  size_t tokenized = 0;
  try {
    const size_t n = read_text_records(bytes, "fuzz", format, delimiter, cols, max_record, [&](const TextRecord& r) {
      FUZZ_EXPECT(r.line >= 1);
      FUZZ_EXPECT(cols.label.empty() == r.label.empty());
      FUZZ_EXPECT(cols.text_pair.empty() <= r.text_pair.empty());
      if (tokenized++ < 4) {
        Encoding e = tokenizer().encode(r.text, cols.text_pair.empty() ? std::nullopt : std::optional(r.text_pair), 16,
                                        Truncation::LongestFirst, Padding::None);
        FUZZ_EXPECT(e.input_ids.size() <= 16);
      }
    });
    FUZZ_EXPECT(n >= 1 && n == tokenized);
  } catch (const Error& e) {
    FUZZ_EXPECT(std::strchr(e.what(), '\n') == nullptr);
    FUZZ_EXPECT(std::strncmp(e.what(), "fuzz", 4) == 0);
  }
  if (mode & 32) {  // the whole loader, labels included
    fuzz::MemFile file(data + 1, size - 1);
    TextDataOptions o;
    o.format = format;
    o.delimiter = delimiter;
    o.text_pair_column = cols.text_pair;
    o.label_column = cols.label;
    o.max_length = 16;
    o.cache = CacheMode::Off;
    try {
      TextDataset ds = TextDataset::load(file.path(), tokenizer(), o);
      FUZZ_EXPECT(ds.size() >= 1);
      HostBatch b;
      b.resize(1, ds.seq_len());
      for (size_t i = 0; i < ds.size() && i < 8; ++i) {
        ds.get(i, b, 0);
        FUZZ_EXPECT(b.labels[0] >= 0 &&
                    (ds.labels().kind == LabelSet::Kind::None || b.labels[0] < ds.labels().num_labels));
      }
      // Up to 65536 integer labels are legal; building their maps under ASan is slow, so only
      // small sets (the interesting ones) are mapped here.
      if (ds.labels().num_labels <= 4096) (void)ds.labels().label2id();
    } catch (const Error& e) {
      FUZZ_EXPECT(std::strchr(e.what(), '\n') == nullptr);
    }
  }
  return 0;
}
