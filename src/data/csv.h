// Records of a labelled text file: CSV/TSV (RFC 4180) and JSON Lines, read from bytes in memory.
//
// Every problem is an anatomy::Error whose one-line message is "<name>:<line>: what is wrong",
// the line being 1-based and the one where the offending record starts.
//
// Note [Hostile text files]: what the readers do with input that is not what they expect.
//   - Invalid UTF-8: replaced, never an error. Each maximal ill-formed sequence becomes U+FFFD
//     (Python's bytes.decode("utf-8", errors="replace")) in JSON lines and in labels; CSV text
//     fields are passed on as bytes and the tokenizer applies the same rule. The tokenizer's
//     text cleaning then drops U+FFFD, so invalid bytes vanish from the token ids.
//   - A UTF-8 byte-order mark at the start of the file is skipped.
//   - Blank lines are skipped (in JSONL also lines of only spaces).
//   - A record (a JSON line, or a CSV record with its quoted newlines) longer than
//     max_record_bytes (16 MiB by default) is an error; nothing longer is ever buffered.
//   - CSV: a quote inside an unquoted field is kept as a character (as Python's csv does);
//     anything but a delimiter or a line end after a closing quote is an error, and so is a quote
//     left open at the end of the file, a record with more or fewer fields than the header, and
//     a header without the requested columns (or naming one of them twice).
//   - JSONL: a line that is not a JSON object, a missing field, a text that is not a string, and
//     a label that is neither a string nor an integer are errors. A file whose first character is
//     '[' is refused with a hint (a JSON array, not JSON Lines).
#pragma once
#include <exception>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy {

enum class TextFormat { Auto, Jsonl, Csv, Tsv };

inline constexpr size_t kMaxRecordBytes = size_t{16} << 20;

// By extension: .jsonl/.ndjson/.json are JSON Lines, .tsv/.tab TSV, .csv/.txt CSV. Anything else
// is an error asking for an explicit format.
TextFormat format_from_path(const std::string& path);
TextFormat parse_text_format(const std::string& s);  // "auto", "jsonl", "csv", "tsv"
const char* text_format_name(TextFormat f);

// RFC 4180 records: fields separated by `delimiter`, records by "\r\n", "\n" or "\r"; a field in
// double quotes may hold delimiters, line ends and doubled quotes ("" for ").
class CsvParser {
 public:
  CsvParser(std::string_view data, char delimiter, std::string name, size_t max_record_bytes = kMaxRecordBytes);
  // The next non-blank record into `fields` (reusing its strings); false at the end.
  bool next(std::vector<std::string>& fields);
  // 1-based line where the record last returned by next() starts.
  size_t record_line() const { return m_record_line; }

 private:
  std::string_view m_data;
  char m_delim;
  std::string m_name;
  size_t m_max;
  size_t m_pos = 0;
  size_t m_line = 1;
  size_t m_record_line = 0;
};

// One sample as read: views valid only during the callback.
struct TextRecord {
  std::string_view text;
  std::string_view text_pair;     // empty when no pair column is read
  std::string_view label;         // the label as text; empty when no label column is read
  bool label_is_integer = false;  // an integer: a JSON integer, or a CSV field of [-]digits
  size_t line = 0;                // 1-based line where the record starts
};

// A CSV header's names as pandas reads them (the datasets library's CSV loader): a name that
// repeats becomes name.1, name.2, ... (skipping names the header already has).
void mangle_duplicate_columns(std::vector<std::string>& header);

// Note [joined text columns]: run_classification.py's --text_column_names a,b,c makes one text of
// the columns' values joined by its text_column_delimiter (a space by default, the only one taken
// here). Such a text column's name holds the names separated by kColumnJoin, so that it passes
// through every option and cache key as one string; the readers look each up and join the values.
constexpr char kColumnJoin = '\x1f';
std::vector<std::string> joined_columns(const std::string& text_column);  // the names, one when not joined
std::string column_label(const std::string& text_column);                 // "a,b" for messages

struct RecordColumns {
  std::string text = "text";
  std::string text_pair;        // empty: single texts
  std::string label = "label";  // empty: unlabelled
};

// Reads every record of `data` (the bytes of the file called `name`) in order and calls `fn`
// for each; returns the number of records. `format` must not be Auto. `delimiter` 0 means ','
// for CSV and '\t' for TSV.
size_t read_text_records(std::string_view data, const std::string& name, TextFormat format, char delimiter,
                         const RecordColumns& columns, size_t max_record_bytes,
                         const std::function<void(const TextRecord&)>& fn);

// Note [run_glue.py's text columns]
// A user who names no text column (--text-column, --text-column-names, --text-pair-column) gets
// the column `text` when the file has one, as always. A file without it is read the way
// run_glue.py reads a --train_file: of the columns other than the label (and any named "label"),
// sentence1 and sentence2 when both exist, else the first two in file order as a pair, else the
// only one; the caller says which it took. Training takes the training file's choice for its
// validation and test files too, as run_glue.py does. The columns are those of the first
// record: a CSV/TSV header, or the first JSON line's keys in their order in the line.
std::vector<std::string> text_file_columns(const std::string& path, TextFormat format, char delimiter);
// `columns` (text and pair) chosen from `names` as the note says; `label` may be empty. The text
// is empty when no column is left.
RecordColumns glue_text_columns(const std::vector<std::string>& names, const std::string& label);
// The columns to read `path` with when the user named no text column: `columns` when the file
// has columns.text (or its first record cannot be read: loading it says why), else run_glue.py's
// choice, with `said` set to the one line the caller prints about it ("" otherwise). `flag`
// names the file in that line ("--train-file").
RecordColumns default_text_columns(const std::string& path, const std::string& flag, TextFormat format, char delimiter,
                                   const RecordColumns& columns, std::string& said);

// `s` with each ill-formed UTF-8 sequence replaced by U+FFFD (Python's errors="replace"); `s`
// itself when it is valid.
std::string sanitize_utf8(std::string_view s);

// A JSON parse error in one line, without nlohmann's echo of the input (megabytes, raw bytes).
std::string json_error_text(const std::exception& e);

// Whether s is a decimal integer: an optional '-' and digits only (how a CSV label is taken as a class id).
bool is_integer_text(std::string_view s);

}  // namespace anatomy
