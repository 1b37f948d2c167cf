#include "data/float_labels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "data/text_dataset.h"
#include "io/read_file.h"

namespace anatomy {

namespace {

using Visit = std::function<void(const nlohmann::json& value, size_t line)>;

// A CSV field as JSON: a number when the whole field parses as one, else the string.
nlohmann::json csv_value(const std::string& s) {
  if (!s.empty()) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str() + s.size() && std::isfinite(v)) {
      const bool integer = s.find_first_of(".eE") == std::string::npos;
      if (integer) return nlohmann::json(static_cast<int64_t>(v));
      return nlohmann::json(v);
    }
  }
  return nlohmann::json(s);
}

// The label column's value of every record, in the order read_text_records visits them (blank
// lines skipped, a byte-order mark ignored).
void for_each_label(const std::string& path, TextFormat format, char delimiter, const std::string& column,
                    const Visit& visit) {
  const std::string bytes = read_regular_file(path);
  std::string_view data = bytes;
  if (data.substr(0, 3) == "\xEF\xBB\xBF") data.remove_prefix(3);
  if (format == TextFormat::Auto) format = format_from_path(path);
  if (format == TextFormat::Jsonl) {
    size_t line = 0, pos = 0;
    while (pos < data.size()) {
      const size_t end = std::min(data.find('\n', pos), data.size());
      const std::string_view text = data.substr(pos, end - pos);
      pos = end + 1;
      ++line;
      const size_t first = text.find_first_not_of(" \t\r");
      if (first == std::string_view::npos) continue;
      // The errors of the records' own reader (data/csv.cpp), which this scan runs before.
      ANATOMY_CHECK(text[first] != '[', path, ":", line, ": a JSON array; expected JSON Lines (one JSON object per line)");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(sanitize_utf8(text));  // as the record reader reads it (Note [ill-formed UTF-8])
      } catch (const std::exception& e) {
        fail(path, ":", line, ": not valid JSON: ", json_error_text(e));
      }
      ANATOMY_CHECK(j.is_object(), path, ":", line, ": not a JSON object");
      const auto it = j.find(column);
      ANATOMY_CHECK(it != j.end(), path, ":", line, ": no label field '", column, "'");
      ANATOMY_CHECK(!it->is_null(), path, ":", line, ": label field '", column, "' is null");
      visit(*it, line);
    }
    return;
  }
  CsvParser csv(data, delimiter ? delimiter : (format == TextFormat::Tsv ? '\t' : ','), path);
  std::vector<std::string> fields;
  ANATOMY_CHECK(csv.next(fields), path, ": empty file (no header)");
  mangle_duplicate_columns(fields);
  const auto at = std::find(fields.begin(), fields.end(), column);
  ANATOMY_CHECK(at != fields.end(), path, ": no column '", column, "' in the header");
  const size_t c = static_cast<size_t>(at - fields.begin());
  while (csv.next(fields)) {
    ANATOMY_CHECK(c < fields.size(), path, ":", csv.record_line(), ": no field for column '", column, "'");
    visit(csv_value(fields[c]), csv.record_line());
  }
}

LabelColumnKind kind_of(const nlohmann::json& v) {
  if (v.is_array()) return LabelColumnKind::Lists;
  if (v.is_number_float()) return LabelColumnKind::Numbers;
  return LabelColumnKind::Classes;
}

const char* kind_words(LabelColumnKind k) {
  switch (k) {
    case LabelColumnKind::Classes: return "a class (an integer or a string)";
    case LabelColumnKind::Numbers: return "a number";
    case LabelColumnKind::Lists: return "a list";
  }
  return "?";
}

}  // namespace

LabelColumnKind sniff_label_column(const std::string& path, TextFormat format, char delimiter,
                                   const std::string& label_column) {
  std::optional<LabelColumnKind> kind;
  size_t first = 0;
  bool integers = true;  // every label so far an integer: a fraction later makes them all numbers
  for_each_label(path, format, delimiter, label_column, [&](const nlohmann::json& v, size_t line) {
    const LabelColumnKind k = kind_of(v);
    if (!kind) {
      kind = k;
      first = line;
    } else if (*kind == LabelColumnKind::Numbers && v.is_number()) {
    } else if (*kind == LabelColumnKind::Classes && k == LabelColumnKind::Numbers && integers) {
      kind = k;
    } else {
      ANATOMY_CHECK(k == *kind, path, ":", line, ": label is ", kind_words(k), " but line ", first, "'s is ",
                    kind_words(*kind));
    }
    integers = integers && v.is_number_integer();
  });
  return kind.value_or(LabelColumnKind::Classes);
}

FloatLabels read_float_labels(const std::string& path, TextFormat format, char delimiter,
                              const std::string& label_column, const FloatLabelOptions& o) {
  FloatLabels out;
  if (!o.lists) {
    ANATOMY_CHECK(o.width >= 1, "internal error: regression labels of width ", o.width);
    out.width = o.width;
    for_each_label(path, format, delimiter, label_column, [&](const nlohmann::json& v, size_t line) {
      if (o.width == 1) {
        ANATOMY_CHECK(v.is_number(), path, ":", line, ": regression label ", v.dump(), " is not a number");
        out.values.push_back(v.get<float>());
        return;
      }
      ANATOMY_CHECK(v.is_array() && static_cast<int64_t>(v.size()) == o.width, path, ":", line,
                    ": regression label ", v.dump(), " is not a list of ", o.width, " numbers (num_labels)");
      for (const auto& x : v) {
        ANATOMY_CHECK(x.is_number(), path, ":", line, ": regression label ", v.dump(), " holds a non-number");
        out.values.push_back(x.get<float>());
      }
    });
    return out;
  }
  // Multi-label: the lists as ids, then multi-hot.
  std::vector<std::vector<nlohmann::json>> rows;
  std::vector<size_t> lines;
  std::optional<bool> integers;
  for_each_label(path, format, delimiter, label_column, [&](const nlohmann::json& v, size_t line) {
    ANATOMY_CHECK(v.is_array(), path, ":", line, ": multi-label label ", v.dump(), " is not a list of classes");
    for (const auto& x : v) {
      ANATOMY_CHECK(x.is_number_integer() || x.is_string(), path, ":", line, ": class ", x.dump(),
                    " is neither an integer id nor a name");
      if (!integers) integers = x.is_number_integer();
      ANATOMY_CHECK(*integers == x.is_number_integer(), path, ":", line, ": class ", x.dump(), " is ",
                    x.is_number_integer() ? "an id" : "a name", " but the file's first class is ",
                    *integers ? "an id" : "a name", "; a label list holds ids or names, not both");
    }
    rows.emplace_back(v.begin(), v.end());
    lines.push_back(line);
  });
  out.integer_ids = integers.value_or(!o.classes.has_value());
  if (o.classes) {
    out.classes = *o.classes;
  } else if (out.integer_ids && !o.num_ids) {  // the sorted distinct ids, as for single labels (LabelSet)
    std::vector<int64_t> values;
    for (const auto& row : rows)
      for (const auto& x : row) values.push_back(x.get<int64_t>());
    ANATOMY_CHECK(!values.empty(), path, ": no classes in the label lists");
    const LabelSet set = LabelSet::from_integers(std::move(values));
    if (set.kind == LabelSet::Kind::Names) out.classes = set.names;
    else out.width = set.num_labels;
  } else if (!out.integer_ids) {
    std::set<std::string> names;
    for (const auto& row : rows)
      for (const auto& x : row) names.insert(x.get<std::string>());
    out.classes.assign(names.begin(), names.end());
  }
  if (o.num_ids && !o.classes) out.width = *o.num_ids;
  if (!out.classes.empty()) out.width = static_cast<int64_t>(out.classes.size());
  ANATOMY_CHECK(out.width >= 1, path, ": no classes in the label lists");
  // Names are looked up; integers too when the classes are integers named by their text (a head
  // trained on ids 1..5), else they are the ids themselves.
  const bool by_name = !out.classes.empty() && (!out.integer_ids || std::all_of(out.classes.begin(), out.classes.end(),
                                                                                [](const std::string& c) {
                                                                                  return is_integer_text(c);
                                                                                }));
  std::map<std::string, int64_t> index;
  for (size_t i = 0; i < out.classes.size(); ++i) index[out.classes[i]] = static_cast<int64_t>(i);
  out.values.assign(rows.size() * static_cast<size_t>(out.width), 0.0f);
  for (size_t r = 0; r < rows.size(); ++r)
    for (const auto& x : rows[r]) {
      int64_t id;
      if (!by_name) {
        id = x.get<int64_t>();
        ANATOMY_CHECK(id >= 0 && id < out.width, path, ":", lines[r], ": class id ", id,
                      " is unknown (the classes are 0..", out.width - 1, ")");
      } else {
        const auto it = index.find(x.is_string() ? x.get<std::string>() : std::to_string(x.get<int64_t>()));
        ANATOMY_CHECK(it != index.end(), path, ":", lines[r], ": unknown class ", x.dump());
        id = it->second;
      }
      out.values[r * static_cast<size_t>(out.width) + static_cast<size_t>(id)] = 1.0f;
    }
  return out;
}

FloatLabelDataset::FloatLabelDataset(std::shared_ptr<const Dataset> base, FloatLabels labels)
    : m_base(std::move(base)), m_labels(std::move(labels)) {
  ANATOMY_CHECK(m_labels.size() == m_base->size(), "internal error: ", m_labels.size(), " label rows for ",
                m_base->size(), " samples");
}

void FloatLabelDataset::get(size_t i, HostBatch& out, int64_t row) const {
  m_base->get(i, out, row);
  const size_t w = static_cast<size_t>(m_labels.width);
  if (out.target_width != m_labels.width || out.targets.size() < static_cast<size_t>(out.batch) * w) {
    out.target_width = m_labels.width;
    out.targets.resize(static_cast<size_t>(out.batch) * w);
  }
  std::copy_n(m_labels.values.begin() + static_cast<std::ptrdiff_t>(i * w), w,
              out.targets.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(row) * w));
}

}  // namespace anatomy
