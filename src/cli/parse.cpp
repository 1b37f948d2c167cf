#include "cli/parse.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "memory/planner.h"

namespace anatomy::cli {

const char* command_name(Command c) {
  switch (c) {
    case kTrain: return "train";
    case kEval: return "eval";
    case kPlan: return "plan";
    default: return "anatomy";
  }
}

namespace {

template <class... A>
[[noreturn]] void usage(const A&... parts) {
  throw UsageError(str_cat(parts...));
}

std::string dashed(std::string s) {
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}
std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

bool names(const OptionSpec& s, const std::string& name) {
  if (name == s.name) return true;
  for (const char* a : s.aliases)
    if (name == a) return true;
  return false;
}

const OptionSpec* find(Command cmd, const std::string& name) {
  for (const OptionSpec& s : options())
    if ((s.commands & cmd) && names(s, name)) return &s;
  return nullptr;
}

// Edit distance (insertions, deletions, substitutions, adjacent swaps) for suggestions.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::optional<bool> parse_bool(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "true" || s == "1" || s == "yes") return true;
  if (s == "false" || s == "0" || s == "no") return false;
  return std::nullopt;
}

bool has_unit(const std::string& s) {
  return !s.empty() && std::isalpha(static_cast<unsigned char>(s.back()));
}

// Converts `raw` to the option's type and checks its range: the one place every value is checked.
Value convert(const OptionSpec& s, const std::string& raw) {
  const std::string f = flag(s);
  Value v;
  switch (s.type) {
    case OptType::Bool: {
      const auto b = parse_bool(raw);
      if (!b) usage(f, ": expected true or false (got '", raw, "')");
      v.b = *b;
      return v;
    }
    case OptType::Int: {
      if (s.auto_ok && raw == "auto") {
        v.i = -1;
        return v;
      }
      errno = 0;
      char* end = nullptr;
      const long long x = std::strtoll(raw.c_str(), &end, 10);
      if (raw.empty() || *end != '\0' || errno == ERANGE)
        usage(f, ": expected an integer in ", range_text(s), " (got '", raw, "')");
      if (static_cast<double>(x) < s.lo || static_cast<double>(x) > s.hi)
        usage(f, " ", raw, " is out of range: allowed ", range_text(s));
      v.i = x;
      return v;
    }
    case OptType::Float: {
      char* end = nullptr;
      const double x = std::strtod(raw.c_str(), &end);
      if (raw.empty() || *end != '\0' || !std::isfinite(x))
        usage(f, ": expected a number in ", range_text(s), " (got '", raw, "')");
      if (x < s.lo || x > s.hi || (s.lo_open && x == s.lo) || (s.hi_open && x == s.hi))
        usage(f, " ", raw, " is out of range: allowed ", range_text(s));
      v.d = x;
      return v;
    }
    case OptType::Text:
      if (s.nonempty && raw.empty()) usage(f, ": must not be empty");
      v.s = raw;
      return v;
    case OptType::Choice: {
      for (const auto& [spelling, meaning] : s.choices)  // an empty list (report_to=[]) is "none"
        if (raw == spelling || (raw.empty() && std::string_view(meaning) == "none")) {
          v.s = meaning;
          return v;
        }
      std::string list;
      for (const auto& c : s.choices) list += (list.empty() ? "" : ", ") + std::string(c.first);
      usage(f, " ", raw, ": anatomy does not have this; expected one of ", list);
    }
    case OptType::Size: {
      if (!has_unit(raw))
        usage(f, " ", raw, ": a size needs its unit, e.g. 16GiB, 80GB or 16000MiB (B, KB, MB, GB, KiB, MiB, GiB)");
      int64_t bytes = 0;
      try {
        bytes = parse_bytes(raw, f);
      } catch (const Error& e) {
        usage(e.what());
      } catch (const std::exception&) {
        usage(f, ": expected a size like 16GiB (got '", raw, "')");
      }
      if (bytes <= 0 || bytes > (int64_t{1} << 50)) usage(f, " ", raw, " is out of range: allowed (0B, 1024TiB]");
      v.i = bytes;
      return v;
    }
  }
  return v;
}

// Why an unknown name is refused: a Trainer argument anatomy does not take, an option of another
// command, or a misspelling (with the nearest flag).
[[noreturn]] void refuse_unknown(Command cmd, const std::string& name) {
  const std::string u = underscored(name);
  const bool field = std::any_of(training_arguments_fields().begin(), training_arguments_fields().end(),
                                 [&](const char* f) { return u == f; });
  const std::string why = refusal_reason(u);
  if (!why.empty()) usage("--", name, ": not supported by anatomy: ", why);
  for (const OptionSpec& s : options())  // another command's (--disable-tqdm is train's, not plan's)
    if (names(s, name)) usage("--", name, ": not an option of `anatomy ", command_name(cmd), "`");
  if (field) usage("--", name, ": a TrainingArguments field that anatomy does not do (docs/trainer-arguments.md)");
  const std::string near = nearest_flag(cmd, name);
  if (!near.empty()) usage("unknown flag --", name, "; did you mean ", near, "?");
  usage("unknown flag --", name, " (`anatomy ", command_name(cmd), " --help` lists them)");
}

// A refused Trainer argument whose value asks for nothing anatomy does not do: noted, not refused.
bool accept_neutral(RunArgs& out, const std::string& name, const std::string& raw) {
  const NeutralValue* n = neutral_value(underscored(name), raw);
  if (n == nullptr) return false;
  out.notes.push_back(str_cat("--", name, " ", raw, ": accepted, it changes nothing here: ", n->why));
  return true;
}

struct Setter {
  Command cmd;
  RunArgs& out;
  void set(const OptionSpec& s, const std::string& raw) {
    s.apply(out, convert(s, raw));
    out.given.push_back(s.name);
  }
};

// A JSON file of arguments, keys as TrainingArguments spells them: each becomes --key value.
std::vector<std::pair<std::string, std::string>> read_json_args(const std::string& path) {
  std::ifstream in(path);
  if (!in) usage(path, ": cannot read this arguments file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    usage(path, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) usage(path, ": expected a JSON object of arguments");
  std::vector<std::pair<std::string, std::string>> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    std::string s;
    if (v.is_string()) s = v.get<std::string>();
    else if (v.is_boolean()) s = v.get<bool>() ? "true" : "false";
    else if (v.is_number_integer()) s = std::to_string(v.get<int64_t>());
    else if (v.is_number()) s = str_cat(v.get<double>());
    else if (v.is_array()) {  // report_to: ["none"], text_column_names as a list
      for (const auto& e : v) {
        if (!e.is_string()) usage(path, ": ", it.key(), ": expected a list of strings");
        s += (s.empty() ? "" : ",") + e.get<std::string>();
      }
    } else if (v.is_null()) continue;  // HfArgumentParser: null is the default
    else s = v.dump();  // an object (accelerator_config): the field decides, by name
    out.emplace_back(it.key(), s);
  }
  return out;
}

}  // namespace

std::string nearest_flag(Command cmd, const std::string& name) {
  const std::string n = dashed(name);
  size_t best = std::string::npos;
  std::string found;
  for (const OptionSpec& s : options()) {
    if (!(s.commands & cmd)) continue;
    std::vector<const char*> all = s.aliases;
    all.push_back(s.name);
    for (const char* a : all) {
      const size_t d = distance(n, a);
      if (d < best) best = d, found = std::string("--") + a;
    }
  }
  return best <= std::max<size_t>(2, n.size() / 4) ? found : "";
}

RunArgs parse_args(Command cmd, const std::vector<std::string>& args) {
  RunArgs out;
  // The defaults are the table's: every default that reads as a value of its option is applied
  // first. Text defaults describe (e.g. "the model's") and stay TrainOptions' own; the
  // model-dependent ones are resolved by finish_train_args.
  for (const OptionSpec& s : options())
    if ((s.commands & cmd) && *s.default_text && s.type != OptType::Text) try {
        s.apply(out, convert(s, s.default_text));
      } catch (const UsageError&) {
      }
  Setter set{cmd, out};
  size_t first = 0;
  // HfArgumentParser's convention: the first argument may be a .json file of arguments.
  if (!args.empty() && args[0].size() > 5 && args[0].rfind("--", 0) != 0 &&
      args[0].compare(args[0].size() - 5, 5, ".json") == 0) {
    for (const auto& [key, value] : read_json_args(args[0])) {
      const std::string name = dashed(key);
      const OptionSpec* s = find(cmd, name);
      if (!s && accept_neutral(out, name, value)) continue;
      if (!s) refuse_unknown(cmd, name);
      set.set(*s, value);
    }
    first = 1;
  }
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      usage("unexpected argument '", a, "' (flags start with --; a JSON file of arguments comes first)");
    const size_t eq = a.find('=');
    const std::string name = dashed(a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2));
    const bool inline_value = eq != std::string::npos;
    const std::string inline_raw = inline_value ? a.substr(eq + 1) : "";
    const OptionSpec* s = find(cmd, name);
    if (!s && name.rfind("no-", 0) == 0) {  // --no-flag: a boolean set to false
      const OptionSpec* b = find(cmd, name.substr(3));
      if (b && b->type == OptType::Bool) {
        if (inline_value) usage("--", name, " takes no value");
        set.set(*b, "false");
        continue;
      }
    }
    const bool next_is_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    if (!s) {
      const std::string raw = inline_value ? inline_raw : next_is_value ? args[i + 1] : "true";
      if (!accept_neutral(out, name, raw)) refuse_unknown(cmd, name);
      if (!inline_value && next_is_value) ++i;
      continue;
    }
    if (inline_value) {
      set.set(*s, inline_raw);
    } else if (s->type == OptType::Bool) {
      // A bare boolean is true; a following word (HfArgumentParser's `--bf16 false`) is its value:
      // these commands take no positional arguments after the JSON file, so it can be nothing else.
      if (next_is_value) set.set(*s, args[++i]);
      else set.set(*s, "true");
    } else if (s->type == OptType::Choice && !next_is_value &&
               std::any_of(s->choices.begin(), s->choices.end(), [](auto& c) { return std::string(c.first) == "true"; })) {
      set.set(*s, "true");  // --gradient-checkpointing as Trainer's boolean
    } else {
      if (i + 1 >= args.size()) usage(flag(*s), " needs a value");
      set.set(*s, args[++i]);
    }
  }
  return out;
}

}  // namespace anatomy::cli
