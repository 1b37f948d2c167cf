#include "data/csv.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/unicode.h"

namespace anatomy {

void mangle_duplicate_columns(std::vector<std::string>& header) {
  std::set<std::string> taken(header.begin(), header.end());
  std::map<std::string, int> seen;
  for (std::string& name : header) {
    int& n = seen[name];
    if (n++ == 0) continue;
    std::string candidate;
    for (int k = n - 1;; ++k) {
      candidate = str_cat(name, ".", k);
      if (!taken.count(candidate)) break;
    }
    taken.insert(candidate);
    name = candidate;
  }
}

std::vector<std::string> joined_columns(const std::string& text_column) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= text_column.size(); ++i)
    if (i == text_column.size() || text_column[i] == kColumnJoin) {
      out.push_back(text_column.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

std::string column_label(const std::string& text_column) {
  std::string out = text_column;
  std::replace(out.begin(), out.end(), kColumnJoin, ',');
  return out;
}


namespace {

// For error messages: at most `max` bytes, control characters escaped, on one line.
std::string printable(std::string_view s, size_t max = 60) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 12; ++i) {
    if (i) out += ", ";
    out += '\'';
    out += printable(names[i], 40);
    out += '\'';
  }
  if (names.size() > 12) out += str_cat(", ... (", names.size(), " in all)");
  return out;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// nlohmann's error text without its prefix and without the "last read" echo of the input (which
// can be megabytes long): "syntax error while parsing object key - unexpected end of input".
// Parsing throws parse_error for bad syntax and out_of_range for a number too large for a double.
std::string json_error_reason(const nlohmann::json::exception& e) {
  std::string_view w = e.what();
  if (size_t c = w.find("] "); c != std::string_view::npos) w.remove_prefix(c + 2);
  if (size_t c = w.find(": "); c != std::string_view::npos && w.substr(0, 11) == "parse error") w.remove_prefix(c + 2);
  if (size_t l = w.find("; last read"); l != std::string_view::npos) w = w.substr(0, l);
  std::string out = printable(w, 160);
  if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e))
    out += str_cat(" (byte ", pe->byte, " of the line)");
  return out;
}

const char* json_type(const nlohmann::json& v) { return v.type_name(); }

// Records of a file worth a word, said once per file with their count and first line.
// Note [ill-formed UTF-8]: bytes that are not UTF-8 (a Latin-1 file) are read as U+FFFD, as
// Python decodes with errors="replace", and the tokenizer's cleaning drops them; pandas and
// datasets refuse such a file instead. A record whose text is empty trains as the special tokens
// alone; pandas reads the cell as NaN, which run_glue.py's tokenizer refuses.
struct LineTally {
  const char* what;  // "hold bytes that are not UTF-8 ...": completes "<file>: <n> record(s) "
  size_t count = 0, first = 0;
  void add(size_t line) {
    if (count++ == 0) first = line;
  }
  void say(const std::string& name) const {
    if (count == 0) return;
    std::fprintf(stderr, "anatomy: warning: %s: %zu record%s %s (the first at line %zu)\n", name.c_str(), count,
                 count == 1 ? "" : "s", what, first);
  }
};
struct RecordNotes {
  LineTally ill_formed{"with bytes that are not UTF-8, read as U+FFFD (re-encode the file as UTF-8 to keep those "
                       "characters)"};
  LineTally empty{"with an empty text, trained on as the special tokens alone"};
  void check(std::string_view bytes, std::string_view text, size_t line) {
    if (sanitize_utf8(bytes) != bytes) ill_formed.add(line);
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) empty.add(line);
  }
  void say(const std::string& name) const {
    ill_formed.say(name);
    empty.say(name);
  }
};

size_t read_jsonl(std::string_view data, const std::string& name, const RecordColumns& cols, size_t max_record_bytes,
                  const std::function<void(const TextRecord&)>& fn) {
  size_t count = 0, line = 0, pos = 0;
  bool first = true;
  std::string label_text, joined_text;
  const std::vector<std::string> joined = joined_columns(cols.text);
  RecordNotes notes;
  while (pos < data.size()) {
    ++line;
    // Look for the line end no further than the bound, so a huge line is refused unbuffered.
    const size_t window = std::min(data.size() - pos, max_record_bytes + 2);
    const void* nl = std::memchr(data.data() + pos, '\n', window);
    size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - data.data()) : pos + window;
    if (!nl && pos + window < data.size()) end = data.size();  // over the bound; refused below
    std::string_view raw = data.substr(pos, end - pos);
    pos = end + 1;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    ANATOMY_CHECK(raw.size() <= max_record_bytes, name, ":", line, ": line longer than ", max_record_bytes,
                  " bytes (the most a record may hold); split it");
    if (is_blank(raw)) continue;
    if (first) {
      const size_t c = raw.find_first_not_of(" \t");
      ANATOMY_CHECK(raw[c] != '[', name, ":", line, ": a JSON array; expected JSON Lines (one JSON object per line)");
      first = false;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(sanitize_utf8(raw));
    } catch (const nlohmann::json::exception& e) {
      fail(name, ":", line, ": not valid JSON: ", json_error_reason(e));
    }
    ANATOMY_CHECK(j.is_object(), name, ":", line, ": expected a JSON object, found ", json_type(j));
    auto field = [&](const std::string& key) -> const nlohmann::json& {
      auto it = j.find(key);
      if (it == j.end()) {
        std::vector<std::string> keys;
        for (auto& [k, v] : j.items()) keys.push_back(k);
        fail(name, ":", line, ": no field '", printable(key), "' (the object has ",
             keys.empty() ? std::string("no fields") : join_names(keys), ")");
      }
      return *it;
    };
    auto text_field = [&](const std::string& key) -> std::string_view {
      const nlohmann::json& v = field(key);
      ANATOMY_CHECK(v.is_string(), name, ":", line, ": field '", printable(key), "' must be a string, not ",
                    json_type(v), v.is_array() ? " (a list of words is token classification's: --task token-classification)" : "");
      return v.get_ref<const std::string&>();
    };
    TextRecord rec;
    rec.line = line;
    if (joined.size() > 1) {
      joined_text.clear();
      for (size_t i = 0; i < joined.size(); ++i) joined_text.append(i ? " " : "").append(text_field(joined[i]));
      rec.text = joined_text;
    } else {
      rec.text = text_field(cols.text);
    }
    if (!cols.text_pair.empty()) rec.text_pair = text_field(cols.text_pair);
    notes.check(raw, std::string(rec.text) + std::string(rec.text_pair), line);
    if (!cols.label.empty()) {
      const nlohmann::json& v = field(cols.label);
      if (v.is_number_integer()) {
        label_text = v.dump();
        rec.label_is_integer = true;
      } else if (v.is_string()) {
        label_text = v.get<std::string>();
      } else if (v.is_boolean()) {  // two classes, named as Python prints them (run_glue.py's label list)
        label_text = v.get<bool>() ? "True" : "False";
      } else {
        fail(name, ":", line, ": label '", printable(cols.label), "' must be a string or an integer, not ",
             v.is_number_float() ? std::string("a fractional number ") + v.dump() : std::string(json_type(v)));
      }
      ANATOMY_CHECK(!label_text.empty(), name, ":", line, ": empty label");
      rec.label = label_text;
    }
    fn(rec);
    ++count;
  }
  notes.say(name);
  return count;
}

size_t read_delimited(std::string_view data, const std::string& name, char delim, const RecordColumns& cols,
                      size_t max_record_bytes, const std::function<void(const TextRecord&)>& fn) {
  CsvParser parser(data, delim, name, max_record_bytes);
  std::vector<std::string> header, row;
  ANATOMY_CHECK(parser.next(header), name, ": no header row (the file holds only blank lines)");
  mangle_duplicate_columns(header);
  const size_t header_line = parser.record_line();
  auto column = [&](const std::string& want) -> size_t {
    if (want.empty()) return SIZE_MAX;
    auto it = std::find(header.begin(), header.end(), want);
    ANATOMY_CHECK(it != header.end(), name, ":", header_line, ": no column '", printable(want),
                  "' in the header (columns: ", join_names(header), ")");
    return static_cast<size_t>(it - header.begin());
  };
  std::vector<size_t> c_texts;
  for (const std::string& c : joined_columns(cols.text)) c_texts.push_back(column(c));
  const size_t c_text = c_texts.front(), c_pair = column(cols.text_pair), c_label = column(cols.label);
  std::string joined_text;
  size_t count = 0;
  std::string label_text;
  RecordNotes notes;
  while (parser.next(row)) {
    const size_t line = parser.record_line();
    ANATOMY_CHECK(row.size() == header.size(), name, ":", line, ": ", row.size(), " field", row.size() == 1 ? "" : "s",
                  " where the header has ", header.size(), delim == '\t' ? "" : " (a delimiter in an unquoted field?)");
    TextRecord rec;
    rec.line = line;
    rec.text = row[c_text];
    if (c_texts.size() > 1) {
      joined_text.clear();
      for (size_t i = 0; i < c_texts.size(); ++i) joined_text.append(i ? " " : "").append(row[c_texts[i]]);
      rec.text = joined_text;
    }
    std::string fields(rec.text);
    if (c_pair != SIZE_MAX) rec.text_pair = row[c_pair];
    if (c_pair != SIZE_MAX) fields += row[c_pair];
    const size_t text_bytes = fields.size();
    if (c_label != SIZE_MAX) fields += row[c_label];
    notes.check(fields, std::string_view(fields).substr(0, text_bytes), line);
    if (c_label != SIZE_MAX) {
      label_text = sanitize_utf8(row[c_label]);
      ANATOMY_CHECK(!label_text.empty(), name, ":", line, ": empty label");
      rec.label = label_text;
      rec.label_is_integer = is_integer_text(label_text);
    }
    fn(rec);
    ++count;
  }
  notes.say(name);
  return count;
}

}  // namespace

TextFormat format_from_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const size_t dot = path.find_last_of('.');
  const std::string ext = (dot == std::string::npos || (slash != std::string::npos && dot < slash))
                              ? std::string()
                              : lower(path.substr(dot + 1));
  if (ext == "jsonl" || ext == "ndjson" || ext == "json") return TextFormat::Jsonl;
  if (ext == "tsv" || ext == "tab") return TextFormat::Tsv;
  if (ext == "csv" || ext == "txt") return TextFormat::Csv;
  fail(path, ": cannot tell the format from the extension '", ext,
       "'; name it .jsonl, .csv or .tsv or give the format (jsonl, csv, tsv)");
}

TextFormat parse_text_format(const std::string& s) {
  const std::string l = lower(s);
  if (l == "auto") return TextFormat::Auto;
  if (l == "jsonl" || l == "json") return TextFormat::Jsonl;
  if (l == "csv") return TextFormat::Csv;
  if (l == "tsv") return TextFormat::Tsv;
  fail("unknown data format '", s, "' (expected auto, jsonl, csv or tsv)");
}

const char* text_format_name(TextFormat f) {
  switch (f) {
    case TextFormat::Auto:
      return "auto";
    case TextFormat::Jsonl:
      return "jsonl";
    case TextFormat::Csv:
      return "csv";
    case TextFormat::Tsv:
      return "tsv";
  }
  return "?";
}

std::string sanitize_utf8(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(s);
  std::u32string tmp;
  if (unicode::decode_utf8_strict(s, tmp)) return std::string(s);
  return unicode::encode_utf8(unicode::decode_utf8(s));
}

CsvParser::CsvParser(std::string_view data, char delimiter, std::string name, size_t max_record_bytes)
    : m_data(data), m_delim(delimiter), m_name(std::move(name)), m_max(max_record_bytes) {
  ANATOMY_CHECK(delimiter != '"' && delimiter != '\n' && delimiter != '\r' && delimiter != '\0', m_name,
                ": the delimiter cannot be a quote, a line end or NUL");
}

bool CsvParser::next(std::vector<std::string>& fields) {
  const std::string_view d = m_data;
  // Skip blank lines, and lines of spaces (of tabs too, where the tab is not the delimiter), as
  // pandas does.
  for (;;) {
    size_t e = m_pos;
    while (e < d.size() && (d[e] == ' ' || (d[e] == '\t' && m_delim != '\t'))) ++e;
    if (e < d.size() && d[e] != '\n' && d[e] != '\r') break;
    if (e >= d.size()) {
      m_pos = e;
      break;
    }
    if (d[e] == '\r' && e + 1 < d.size() && d[e + 1] == '\n') ++e;
    m_pos = e + 1;
    ++m_line;
  }
  if (m_pos >= d.size()) return false;
  m_record_line = m_line;
  const size_t start = m_pos;
  auto check_size = [&](size_t upto) {
    ANATOMY_CHECK(upto - start <= m_max, m_name, ":", m_record_line, ": record longer than ", m_max,
                  " bytes (the most a record may hold); split it");
  };
  // Consumes a line end at m_pos (which must be one): "\r\n", "\n" or "\r".
  auto end_line = [&] {
    if (d[m_pos] == '\r' && m_pos + 1 < d.size() && d[m_pos + 1] == '\n') ++m_pos;
    ++m_pos;
    ++m_line;
  };
  size_t n = 0;
  for (;;) {
    if (n == fields.size()) fields.emplace_back();
    std::string& f = fields[n++];
    f.clear();
    if (m_pos < d.size() && d[m_pos] == '"') {
      const size_t open_line = m_line;
      ++m_pos;
      for (;;) {
        // Search no further than the record bound; m_pos may already be past it after a "".
        const size_t limit = std::min(d.size(), start + m_max + 1);
        const void* q = nullptr;
        size_t end = m_pos;
        if (m_pos < limit) {
          q = std::memchr(d.data() + m_pos, '"', limit - m_pos);
          end = q ? static_cast<size_t>(static_cast<const char*>(q) - d.data()) : limit;
        }
        for (size_t i = m_pos; i < end; ++i)  // line ends inside the quotes
          if (d[i] == '\n' || (d[i] == '\r' && (i + 1 >= d.size() || d[i + 1] != '\n'))) ++m_line;
        f.append(d.data() + m_pos, end - m_pos);
        m_pos = end;
        check_size(m_pos);
        ANATOMY_CHECK(q != nullptr, m_name, ":", open_line,
                      ": unterminated quoted field (the quote opened on this line is never closed)");
        ++m_pos;
        if (m_pos < d.size() && d[m_pos] == '"') {  // "" is one quote
          f += '"';
          ++m_pos;
          continue;
        }
        break;
      }
    }
    // The unquoted field, or the text after a closing quote, which joins the field as pandas and
    // Python's csv read it ("quoted start" and more -> quoted start and more).
    const size_t limit = std::min(d.size(), start + m_max + 1);
    size_t e = m_pos;
    while (e < limit && d[e] != m_delim && d[e] != '\n' && d[e] != '\r') ++e;
    check_size(e);
    f.append(d.data() + m_pos, e - m_pos);
    m_pos = e;
    if (m_pos >= d.size()) break;
    if (d[m_pos] == m_delim) {
      ++m_pos;
      continue;
    }
    end_line();
    break;
  }
  fields.resize(n);
  return true;
}

size_t read_text_records(std::string_view data, const std::string& name, TextFormat format, char delimiter,
                         const RecordColumns& columns, size_t max_record_bytes,
                         const std::function<void(const TextRecord&)>& fn) {
  ANATOMY_CHECK(!columns.text.empty(), name, ": no text column named");
  ANATOMY_CHECK(!data.empty(), name, ": the file is empty");
  if (data.substr(0, 3) == "\xEF\xBB\xBF") data.remove_prefix(3);
  size_t n = 0;
  switch (format) {
    case TextFormat::Jsonl:
      n = read_jsonl(data, name, columns, max_record_bytes, fn);
      break;
    case TextFormat::Csv:
    case TextFormat::Tsv:
      if (delimiter == 0) delimiter = format == TextFormat::Tsv ? '\t' : ',';
      n = read_delimited(data, name, delimiter, columns, max_record_bytes, fn);
      break;
    case TextFormat::Auto:
      fail(name, ": internal error: read_text_records needs a concrete format");
  }
  ANATOMY_CHECK(n > 0, name, ": no samples (", format == TextFormat::Jsonl ? "only blank lines" : "only a header", ")");
  return n;
}

std::vector<std::string> text_file_columns(const std::string& path, TextFormat format, char delimiter) {
  // Only the first record is needed: read at most one record's worth of bytes. A file that cannot
  // be read so gives no columns; loading it then says what is wrong with it.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return {};
  std::ifstream in(path, std::ios::binary);
  std::string head(static_cast<size_t>(std::min<uintmax_t>(size, kMaxRecordBytes + 3)), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  std::string_view data = head;
  if (data.substr(0, 3) == "\xEF\xBB\xBF") data.remove_prefix(3);
  if (format == TextFormat::Auto) format = format_from_path(path);
  std::vector<std::string> names;
  try {
    if (format == TextFormat::Jsonl) {
      size_t pos = 0;
      while (pos < data.size()) {
        const size_t end = std::min(data.find('\n', pos), data.size());
        const std::string_view line = data.substr(pos, end - pos);
        pos = end + 1;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
        if (j.is_object())
          for (const auto& [k, v] : j.items()) names.push_back(k);
        break;
      }
    } else {
      CsvParser csv(data, delimiter ? delimiter : (format == TextFormat::Tsv ? '\t' : ','), path);
      csv.next(names);
      mangle_duplicate_columns(names);
    }
  } catch (const std::exception&) {
    return {};
  }
  return names;
}

RecordColumns glue_text_columns(const std::vector<std::string>& names, const std::string& label) {
  std::vector<std::string> rest;
  for (const std::string& n : names)
    if (n != label && n != "label") rest.push_back(n);  // run_glue.py sets aside "label" by name
  RecordColumns c;
  c.label = label;
  auto has = [&](const char* n) { return std::find(rest.begin(), rest.end(), n) != rest.end(); };
  if (has("sentence1") && has("sentence2")) {
    c.text = "sentence1";
    c.text_pair = "sentence2";
  } else {
    c.text = rest.empty() ? "" : rest[0];
    c.text_pair = rest.size() >= 2 ? rest[1] : "";
  }
  return c;
}

RecordColumns default_text_columns(const std::string& path, const std::string& flag, TextFormat format, char delimiter,
                                   const RecordColumns& columns, std::string& said) {
  said.clear();
  const std::vector<std::string> names = text_file_columns(path, format, delimiter);
  if (names.empty() || std::find(names.begin(), names.end(), columns.text) != names.end()) return columns;
  const RecordColumns glue = glue_text_columns(names, columns.label);
  if (glue.text.empty()) return columns;  // only a label column: loading names what is missing
  said = str_cat(flag, flag.empty() ? "" : " ", path, " has no '", columns.text, "' column: reading '", glue.text, "'",
                 glue.text_pair.empty() ? std::string(" as the text") : str_cat(" and '", glue.text_pair, "' as a text pair"),
                 ", as run_glue.py would (--text-column-names names others)");
  return glue;
}

std::string json_error_text(const std::exception& e) {
  if (const auto* je = dynamic_cast<const nlohmann::json::exception*>(&e)) return json_error_reason(*je);
  return printable(e.what(), 160);
}

bool is_integer_text(std::string_view s) {
  size_t i = (!s.empty() && s[0] == '-') ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

}  // namespace anatomy
