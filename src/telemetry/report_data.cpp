#include "telemetry/report_data.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace anatomy::report {

const std::vector<std::string>& category_names() {
  static const std::vector<std::string> names = {"weights",     "optimizer_state", "gradients", "activations",
                                                 "temporary",   "workspace",       "other"};
  return names;
}

const std::vector<std::string>& class_names() {
  static const std::vector<std::string> names = {"tensor_contraction", "statistical_normalization", "elementwise",
                                                 "optimizer", "data", "communication"};
  return names;
}

double number_or_nan(const json& j, const char* key) {
  if (!j.is_object()) return NAN;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return NAN;
  const double v = it->get<double>();
  return std::isfinite(v) ? v : NAN;
}

std::string string_or_empty(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

namespace {

// JSON has no NaN: a missing number travels to the page as null.
json num_json(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// nlohmann's messages are one line already; keep them so whatever they hold.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

bool read_text(const fs::path& p, std::string& out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

// Parses a JSON-lines file: each non-blank line an object. Bad lines are skipped and counted
// (a run that was killed may leave half a line at the end).
std::vector<json> read_jsonl(const fs::path& p, const std::string& name, std::vector<std::string>& notes) {
  std::string text;
  std::vector<json> rows;
  if (!read_text(p, text)) return rows;
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0, bad = 0, first_bad = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      if (!bad++) first_bad = lineno;
      continue;
    }
    rows.push_back(std::move(j));
  }
  if (bad)
    notes.push_back(str_cat(name, ": ", bad, " line(s) are not JSON objects and were skipped (the first is line ",
                            first_bad, ")."));
  return rows;
}

// Columns of the named numeric keys over rows that have the key `required`.
json columns(const std::vector<json>& rows, const char* required,
             const std::vector<std::pair<const char*, const char*>>& keys, int64_t& skipped) {
  json out = json::object();
  for (const auto& [key, col] : keys) out[col] = json::array();
  skipped = 0;
  for (const json& r : rows) {
    if (!std::isfinite(number_or_nan(r, required))) {
      ++skipped;
      continue;
    }
    for (const auto& [key, col] : keys) out[col].push_back(num_json(number_or_nan(r, key)));
  }
  return out;
}

json load_metrics(const fs::path& dir, std::vector<std::string>& notes) {
  const fs::path p = dir / "metrics.jsonl";
  if (!fs::exists(p)) {
    notes.push_back("metrics.jsonl is missing: no loss or throughput curves.");
    return nullptr;
  }
  std::vector<json> rows = read_jsonl(p, "metrics.jsonl", notes);
  int64_t skipped = 0;
  json m = columns(rows, "step",
                   {{"step", "step"}, {"loss", "loss"}, {"learning_rate", "lr"}, {"samples_per_second", "sps"},
                    {"elapsed_s", "elapsed"}, {"gpu_memory_used_mb", "mem"}},
                   skipped);
  if (skipped) notes.push_back(str_cat("metrics.jsonl: ", skipped, " line(s) without a numeric 'step' were skipped."));
  if (m["step"].empty()) {
    notes.push_back("metrics.jsonl holds no usable rows: no loss or throughput curves.");
    return nullptr;
  }
  return m;
}

json load_nvml(const fs::path& dir, std::vector<std::string>& notes) {
  const fs::path p = dir / "nvml.jsonl";
  if (!fs::exists(p)) {
    notes.push_back("nvml.jsonl is missing: no NVML samples over time.");
    return nullptr;
  }
  std::vector<json> rows = read_jsonl(p, "nvml.jsonl", notes);
  int64_t skipped = 0;
  json n = columns(rows, "t_s",
                   {{"t_s", "t"}, {"gpu_memory_used_mb", "mem"}, {"gpu_util_pct", "util"}, {"mem_util_pct", "mutil"},
                    {"sm_clock_mhz", "clock"}, {"power_w", "power"}},
                   skipped);
  if (skipped) notes.push_back(str_cat("nvml.jsonl: ", skipped, " line(s) without a numeric 't_s' were skipped."));
  if (n["t"].empty()) {
    notes.push_back("nvml.jsonl holds no usable samples: no NVML charts.");
    return nullptr;
  }
  return n;
}

// A whole-file JSON object, or null with a note when it is missing or garbled.
json load_object(const fs::path& dir, const char* name, const char* lost, std::vector<std::string>& notes) {
  const fs::path p = dir / name;
  std::string text;
  if (!fs::exists(p)) {
    notes.push_back(str_cat(name, " is missing: ", lost, "."));
    return nullptr;
  }
  if (!read_text(p, text)) {
    notes.push_back(str_cat(name, " cannot be read: ", lost, "."));
    return nullptr;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    notes.push_back(str_cat(name, " is not valid JSON (", one_line(e.what()), "): ", lost, "."));
    return nullptr;
  }
  if (!j.is_object()) {
    notes.push_back(str_cat(name, " is not a JSON object: ", lost, "."));
    return nullptr;
  }
  return j;
}

json load_profile(const fs::path& dir, std::vector<std::string>& notes) {
  json raw = load_object(dir, "profile.json", "no op-class table, forward/backward split or roofline", notes);
  if (raw.is_null()) return nullptr;
  json p = {{"step_ms", num_json(number_or_nan(raw, "step_time_ms"))},
            {"forward_ms", num_json(number_or_nan(raw, "forward_ms"))},
            {"backward_ms", num_json(number_or_nan(raw, "backward_ms"))},
            {"optimizer_ms", num_json(number_or_nan(raw, "optimizer_ms"))},
            {"data_ms", num_json(number_or_nan(raw, "data_ms"))},
            {"steps_profiled", num_json(number_or_nan(raw, "steps_profiled"))},
            {"ceil_tflops", num_json(number_or_nan(raw.value("ceilings", json::object()), "tflops"))},
            {"ceil_gbps", num_json(number_or_nan(raw.value("ceilings", json::object()), "gbps"))},
            {"ops", json::array()},
            {"classes", json::array()}};
  int64_t bad_ops = 0;
  if (raw.contains("ops") && raw["ops"].is_array()) {
    for (const json& o : raw["ops"]) {
      const double ms = number_or_nan(o, "time_ms");
      if (!o.is_object() || string_or_empty(o, "name").empty() || string_or_empty(o, "class").empty() ||
          !std::isfinite(ms)) {
        ++bad_ops;
        continue;
      }
      p["ops"].push_back({{"name", o["name"]},
                          {"cls", o["class"]},
                          {"phase", string_or_empty(o, "phase")},
                          {"calls", num_json(number_or_nan(o, "calls"))},
                          {"ms", ms},
                          {"flops", num_json(number_or_nan(o, "flops"))},
                          {"bytes", num_json(number_or_nan(o, "bytes"))}});
    }
  }
  if (bad_ops)
    notes.push_back(str_cat("profile.json: ", bad_ops, " op(s) without a name, class or time_ms were skipped."));

  if (raw.contains("classes") && raw["classes"].is_array()) {
    for (const json& c : raw["classes"]) {
      if (string_or_empty(c, "class").empty()) continue;
      // A class with no ops in this run (communication on one GPU) is left out.
      if (!(number_or_nan(c, "flops_pct") > 0) && !(number_or_nan(c, "time_pct") > 0)) continue;
      p["classes"].push_back({{"cls", c["class"]},
                              {"flops_pct", num_json(number_or_nan(c, "flops_pct"))},
                              {"time_pct", num_json(number_or_nan(c, "time_pct"))},
                              {"tflops", num_json(number_or_nan(c, "tflops"))},
                              {"gbps", num_json(number_or_nan(c, "gbps"))}});
    }
  } else if (!p["ops"].empty()) {
    // Sum the ops per class, keeping the profiler's class order, then any others by name.
    std::map<std::string, std::array<double, 3>> sums;  // flops, bytes, ms
    double total_flops = 0, total_ms = 0;
    for (const json& o : p["ops"]) {
      auto& s = sums[o["cls"].get<std::string>()];
      const double f = o["flops"].is_number() ? o["flops"].get<double>() : 0.0;
      const double b = o["bytes"].is_number() ? o["bytes"].get<double>() : 0.0;
      s[0] += f;
      s[1] += b;
      s[2] += o["ms"].get<double>();
      total_flops += f;
      total_ms += o["ms"].get<double>();
    }
    std::vector<std::string> order;
    for (const std::string& c : class_names())
      if (sums.count(c)) order.push_back(c);
    for (const auto& [c, s] : sums)
      if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
    for (const std::string& c : order) {
      const auto& s = sums[c];
      const double sec = s[2] * 1e-3;
      p["classes"].push_back({{"cls", c},
                              {"flops_pct", num_json(total_flops > 0 ? 100 * s[0] / total_flops : NAN)},
                              {"time_pct", num_json(total_ms > 0 ? 100 * s[2] / total_ms : NAN)},
                              {"tflops", num_json(sec > 0 ? s[0] / sec / 1e12 : NAN)},
                              {"gbps", num_json(sec > 0 ? s[1] / sec / 1e9 : NAN)}});
    }
  }
  return p;
}

json load_timeline(const fs::path& dir, std::vector<std::string>& notes) {
  json raw = load_object(dir, "memory_timeline.json", "no memory-over-one-step chart", notes);
  if (raw.is_null()) return nullptr;
  if (!raw.contains("events") || !raw["events"].is_array()) {
    notes.push_back("memory_timeline.json has no 'events' array: no memory-over-one-step chart.");
    return nullptr;
  }
  json t = {{"label", json::array()}, {"phase", json::array()}, {"bytes", json::object()}};
  for (const std::string& c : category_names()) t["bytes"][c] = json::array();
  int64_t bad = 0;
  for (const json& e : raw["events"]) {
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_object()) {
      ++bad;
      continue;
    }
    t["label"].push_back(string_or_empty(e, "label"));
    t["phase"].push_back(string_or_empty(e, "phase"));
    for (const std::string& c : category_names()) {
      const double b = number_or_nan(e["bytes"], c.c_str());
      t["bytes"][c].push_back(std::isfinite(b) ? b : 0.0);
    }
  }
  if (bad) notes.push_back(str_cat("memory_timeline.json: ", bad, " event(s) without a 'bytes' object were skipped."));
  if (t["label"].empty()) {
    notes.push_back("memory_timeline.json holds no usable events: no memory-over-one-step chart.");
    return nullptr;
  }
  return t;
}

}  // namespace

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  const fs::path d(dir);
  std::error_code ec;
  ANATOMY_CHECK(fs::is_directory(d, ec), dir, ": no such run directory");
  const fs::path rp = d / "train_results.json";
  std::string text;
  ANATOMY_CHECK(fs::exists(rp, ec), rp.string(), ": not found (is ", dir, " the output directory of a finished run?)");
  ANATOMY_CHECK(read_text(rp, text), rp.string(), ": cannot be read");
  try {
    r.results = json::parse(text);
  } catch (const json::exception& e) {
    fail(rp.string(), ": not valid JSON: ", one_line(e.what()));
  }
  ANATOMY_CHECK(r.results.is_object(), rp.string(), ": expected a JSON object");

  r.metrics = load_metrics(d, r.notes);
  r.nvml = load_nvml(d, r.notes);
  r.profile = load_profile(d, r.notes);
  r.timeline = load_timeline(d, r.notes);
  return r;
}

std::vector<RunData> load_runs(const std::vector<std::string>& dirs) {
  ANATOMY_CHECK(!dirs.empty(), "report: give at least one run directory");
  std::vector<RunData> runs;
  for (const std::string& d : dirs) runs.push_back(load_run(d));
  auto name_of = [](const std::string& dir) {
    fs::path p = fs::path(dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    std::string n = p.filename().string();
    if (n.empty() || n == ".") n = fs::absolute(p).lexically_normal().filename().string();
    return n.empty() ? dir : n;
  };
  std::map<std::string, int> seen;
  for (RunData& r : runs) seen[name_of(r.dir)]++;
  for (RunData& r : runs) r.label = seen[name_of(r.dir)] > 1 ? r.dir : name_of(r.dir);
  return runs;
}

}  // namespace anatomy::report
