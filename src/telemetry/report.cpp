// The report page. Tables (configuration, headline numbers, memory and op-class tables) are
// written here as HTML, so they read without the script; the charts are <svg> elements that
// the inline script (report_assets.h) draws from one JSON block of validated numbers.
//
// Note [report escaping]: every string that comes from a run directory reaches the page by
// one of two roads. In HTML it goes through html_escape(). In the JSON block it is dumped by
// nlohmann (invalid UTF-8 replaced) and then '<', '>' and '&' are written as \u003c, \u003e,
// \u0026, so no "</script>" can close the block; the script puts strings into the DOM with
// textContent only, never innerHTML.
#include "telemetry/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"
#include "telemetry/report_assets.h"
#include "telemetry/report_data.h"
#include "telemetry/report_script.h"

namespace anatomy {

using nlohmann::json;
using report::number_or_nan;
using report::RunData;
using report::string_or_empty;

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        default:
          // Control characters other than tab and newlines are not allowed in HTML text.
          if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') out += "\xEF\xBF\xBD";
          else out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (no overlongs, no surrogates, at most U+10FFFF) is copied.
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len >= 3) {
      const unsigned char c1 = p[i + 1];
      if (c == 0xE0 && c1 < 0xA0) ok = false;
      if (c == 0xED && c1 >= 0xA0) ok = false;
      if (c == 0xF0 && c1 < 0x90) ok = false;
      if (c == 0xF4 && c1 >= 0x90) ok = false;
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

namespace {

// Ivanov et al. 2020, "Data Movement Is All You Need" (arXiv 2007.00072), BERT-large encoder
// layers on PyTorch: share of flops and of runtime per op class.
struct PaperRow {
  const char* cls;
  double flops_pct, time_pct;
};
constexpr PaperRow kPaper[] = {{"tensor_contraction", 99.80, 61.0},
                               {"statistical_normalization", 0.17, 25.5},
                               {"elementwise", 0.03, 13.5}};

const char* class_title(const std::string& c) {
  if (c == "tensor_contraction") return "Tensor contractions";
  if (c == "statistical_normalization") return "Statistical normalizations";
  if (c == "elementwise") return "Element-wise";
  if (c == "optimizer") return "Optimizer";
  if (c == "data") return "Data";
  if (c == "communication") return "Communication";
  return nullptr;
}

std::string fmt(double v, int decimals) {
  if (!std::isfinite(v)) return "&mdash;";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// An integer with thin-space thousands separators (12 345), as SI style writes them.
std::string fmt_int(double v) {
  if (!std::isfinite(v)) return "&mdash;";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", std::fabs(v));
  std::string digits = buf, out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += "&#8201;";
    out += digits[i];
  }
  return (v < 0 && out != "0" ? "-" : "") + out;
}

double mib(double bytes) { return bytes / 1048576.0; }

// A value of train_results.json as table text (escaped).
std::string result_text(const json& r, const char* key) {
  if (!r.contains(key)) return "<span class=\"na\">not recorded</span>";
  const json& v = r[key];
  if (v.is_string()) return html_escape(v.get<std::string>());
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return fmt_int(v.get<double>());
  if (v.is_number()) return fmt(v.get<double>(), 3);
  return html_escape(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

double category_bytes(const json& r, const char* group, const std::string& cat) {
  return r.contains(group) ? number_or_nan(r[group], cat.c_str()) : NAN;
}

// A group's category peaks added up, a category not recorded counting as 0.
double category_sum(const json& r, const char* group) {
  double sum = 0;
  for (const std::string& cat : report::category_names()) {
    const double b = category_bytes(r, group, cat);
    sum += std::isfinite(b) ? b : 0;
  }
  return sum;
}

// Bytes counted in both gradients and activations: with gradient_placement "in-activations" the
// fp32 gradients live in activation memory that backward has finished with, so the category sum
// holds them twice. Results written before the placement existed lack the key and shared
// nothing, hence 0.
double shared_bytes(const json& r, const char* key) {
  const double v = number_or_nan(r, key);
  return std::isfinite(v) && v > 0 ? v : 0;
}
double planned_shared(const json& r) { return shared_bytes(r, "planned_shared_bytes"); }
double allocated_shared(const json& r) { return shared_bytes(r, "allocator_shared_bytes"); }

// The seed page's bytes per parameter for a category under this run's settings, or "" when
// it does not name one (activations, temporary, ...).
std::string seed_bytes_per_param(const json& r, const std::string& cat) {
  const std::string prec = string_or_empty(r, "precision"), opt = string_or_empty(r, "optim");
  if (cat == "weights") return prec == "bf16" || prec == "fp16" ? "6" : prec.empty() ? "" : "4";
  if (cat == "optimizer_state") return opt == "adamw" ? "8" : opt == "sgd" ? "4" : opt == "adamw_8bit" ? "2" : "";
  if (cat == "gradients") return "4";
  return "";
}

bool nvml_measured(const json& r) {
  const double mb = number_or_nan(r, "gpu_memory_occupied_mb");
  return std::isfinite(mb) && mb >= 0;
}

void section_open(std::string& h, const char* id, const char* title, const std::string& explain) {
  h += str_cat("<section id=\"", id, "\"><h2>", title, "</h2><p class=\"explain\">", explain, "</p>\n");
}

void chart(std::string& h, const char* kind, int run, const std::string& caption, const char* wide = "") {
  h += str_cat("<figure class=\"chart-box", wide, "\"><svg class=\"chart\" data-chart=\"", kind, "\"",
               run >= 0 ? str_cat(" data-run=\"", run, "\"") : std::string(), " role=\"img\"></svg>");
  if (!caption.empty()) h += str_cat("<figcaption>", caption, "</figcaption>");
  h += "</figure>\n";
}

void missing(std::string& h, const std::string& what) { h += str_cat("<p class=\"missing\">", what, "</p>\n"); }

// A header row with one column per run.
void run_header(std::string& h, const std::vector<RunData>& runs, const char* first, int span = 1) {
  h += str_cat("<tr><th>", first, "</th>");
  for (const RunData& r : runs)
    h += str_cat("<th", span > 1 ? str_cat(" colspan=\"", span, "\"") : std::string(), " class=\"run\">",
                 html_escape(r.label), "</th>");
  h += "</tr>\n";
}

void page_header(std::string& h, const std::vector<RunData>& runs) {
  h += "<header><h1>Where the memory and the time of a training step go</h1>\n<p class=\"sub\">";
  h += runs.size() == 1 ? "Run " : str_cat(runs.size(), " runs side by side: ");
  for (size_t i = 0; i < runs.size(); ++i)
    h += str_cat(i ? ", " : "", "<span class=\"run-chip\" data-run=\"", i, "\">", html_escape(runs[i].label),
                 "</span> <code>", html_escape(runs[i].dir), "</code>");
  h += ". Written by <code>anatomy report</code> from the files the run left in its output directory.</p>\n";
  h += "<p id=\"script-status\" data-status=\"pending\">The charts are drawn by the page's own script, "
       "which has not run (scripts disabled?). The tables below read without it.</p>\n";
  // Set before anything else runs, so even a syntax error in the main script is recorded.
  h += "<script>" + std::string(report_assets::kErrorHook) + "</script>\n";
  h += "<nav><a href=\"#config\">Configuration</a><a href=\"#headline\">Headline numbers</a>"
       "<a href=\"#memory\">Memory anatomy</a><a href=\"#timeline\">Memory over one step</a>"
       "<a href=\"#classes\">Op classes</a><a href=\"#fwdbwd\">Forward vs backward</a>"
       "<a href=\"#roofline\">Roofline</a><a href=\"#curves\">Loss and throughput</a><a href=\"#nvml\">NVML</a></nav>\n";
  h += "</header>\n";
}

void notes_section(std::string& h, const std::vector<RunData>& runs) {
  bool any = false;
  for (const RunData& r : runs) any = any || !r.notes.empty();
  if (!any) return;
  h += "<section id=\"notes\"><h2>Missing inputs</h2><p class=\"explain\">Some files a run can write were not found "
       "or could not be read; the parts of the page that need them say so where they would be.</p><ul>\n";
  for (const RunData& r : runs)
    for (const std::string& n : r.notes)
      h += str_cat("<li><b>", html_escape(r.label), "</b>: ", html_escape(n), "</li>\n");
  h += "</ul></section>\n";
}

void config_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "config", "Configuration",
               "What was trained and how, as recorded in each run's train_results.json: these settings decide the "
               "memory and time figures below.");
  struct Row {
    const char* key;
    const char* title;
  };
  const Row rows[] = {{"device", "Device"},
                      {"precision", "Precision"},
                      {"num_parameters", "Parameters"},
                      {"seq_len", "Sequence length (tokens)"},
                      {"per_device_train_batch_size", "Batch size (sequences per micro-batch)"},
                      {"gradient_accumulation_steps", "Gradient accumulation (micro-batches per step)"},
                      {"gradient_checkpointing", "Gradient checkpointing"},
                      {"gradient_placement", "Gradients (own buffer, or in freed activation memory)"},
                      {"world_size", "Data-parallel ranks"},
                      {"zero_stage", "ZeRO stage (1: optimizer state split over the ranks)"},
                      {"optim", "Optimizer"},
                      {"steps", "Optimizer steps"},
                      {"samples", "Samples trained"},
                      {"skipped_steps", "Steps skipped (fp16 overflow)"},
                      {"data_wait_s", "Time waiting for data (s)"},
                      {"train_loss", "Mean training loss"}};
  h += "<table class=\"config\">\n";
  run_header(h, runs, "Setting");
  for (const Row& row : rows) {
    h += str_cat("<tr><th>", row.title, "</th>");
    for (const RunData& r : runs) h += str_cat("<td>", result_text(r.results, row.key), "</td>");
    h += "</tr>\n";
  }
  h += "</table></section>\n";
}

void headline_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "headline", "Headline numbers",
               "The three lines the seed page prints: <b>Time</b> is the wall-clock length of the training loop in "
               "seconds, <b>Samples/second</b> is the samples trained divided by that time, and <b>GPU memory "
               "occupied</b> is the device memory in use as nvidia-smi reports it (NVML, MiB, which nvidia-smi calls "
               "MB), CUDA context included.");
  auto gpu_mb = [](const json& r) {
    return nvml_measured(r) ? fmt_int(number_or_nan(r, "gpu_memory_occupied_mb"))
                            : std::string("<span class=\"na\">not measured (no NVML)</span>");
  };
  if (runs.size() == 1) {
    const json& r = runs[0].results;
    h += "<div class=\"cards\">";
    h += str_cat("<div class=\"card\"><div class=\"label\">Time</div><div class=\"big\">",
                 fmt(number_or_nan(r, "train_runtime"), 2), "</div><div class=\"unit\">seconds</div></div>");
    h += str_cat("<div class=\"card\"><div class=\"label\">Samples/second</div><div class=\"big\">",
                 fmt(number_or_nan(r, "train_samples_per_second"), 2),
                 "</div><div class=\"unit\">samples/s over the whole run; steady state ",
                 fmt(number_or_nan(r, "steady_samples_per_second"), 1), "</div></div>");
    h += str_cat("<div class=\"card\"><div class=\"label\">GPU memory occupied</div><div class=\"big\">", gpu_mb(r),
                 "</div><div class=\"unit\">MiB (nvidia-smi &ldquo;MB&rdquo;)</div></div>");
    h += "</div>\n";
  } else {
    h += "<table class=\"headline\">\n";
    run_header(h, runs, "Number");
    const std::pair<const char*, const char*> rows[] = {
        {"Time (s)", "train_runtime"},
        {"Samples/second (whole run)", "train_samples_per_second"},
        {"Samples/second (steady state, second half)", "steady_samples_per_second"}};
    for (const auto& [title, key] : rows) {
      h += str_cat("<tr><th>", title, "</th>");
      for (const RunData& r : runs) h += str_cat("<td class=\"num\">", fmt(number_or_nan(r.results, key), 2), "</td>");
      h += "</tr>\n";
    }
    h += "<tr><th>GPU memory occupied (MiB)</th>";
    for (const RunData& r : runs) h += str_cat("<td class=\"num\">", gpu_mb(r.results), "</td>");
    h += "</tr>\n</table>\n";
  }
  h += "<p class=\"explain\">As the trainer prints them:</p><div class=\"seed-lines\">";
  for (const RunData& r : runs) {
    const json& j = r.results;
    h += str_cat("<pre>", runs.size() > 1 ? str_cat("# ", html_escape(r.label), "\n") : std::string(),
                 "Time: ", fmt(number_or_nan(j, "train_runtime"), 2), "\nSamples/second: ",
                 fmt(number_or_nan(j, "train_samples_per_second"), 2), "\nGPU memory occupied: ",
                 nvml_measured(j) ? str_cat(fmt(number_or_nan(j, "gpu_memory_occupied_mb"), 0), " MB.") : "not measured",
                 "</pre>");
  }
  h += "</div></section>\n";
}

void memory_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "memory", "Memory anatomy",
               "Three views of each run's GPU memory, stacked by what the bytes are for: <b>planned</b> is what the "
               "planner computed before anything was allocated, <b>allocated</b> is the peak of each category in the "
               "tagged allocator during training, and <b>NVML</b> is what the whole device reports in use, which adds "
               "the CUDA context and memory the allocator holds but has not handed out.");
  bool any_shared = false;
  for (const RunData& r : runs) any_shared = any_shared || planned_shared(r.results) > 0 || allocated_shared(r.results) > 0;
  // Where gradients sit in freed activation memory, the script draws only the gradient bytes
  // outside the activations (the tooltip gives both), so a bar's length is what was held.
  chart(h, "memory", -1,
        str_cat("GiB (2<sup>30</sup> bytes). Each category's bar is its own peak, so a bar can exceed the largest "
                "amount live at one instant.",
                any_shared ? " Where gradients sit in activation memory that backward has finished with, the "
                             "gradients segment shows only the bytes outside the activations (the table's "
                             "&ldquo;counted twice&rdquo; row), so the bar's length is what was held."
                           : "",
                " Hover a segment for bytes and bytes per parameter."),
        " wide");
  h += "<p class=\"explain\">Bytes per parameter divide a category by the parameter count; the seed page's rule of "
       "thumb (last column) is 4 for fp32 weights or 6 with mixed precision (fp32 master and a half copy), 8 for "
       "AdamW's two moments, 4 for fp32 gradients; activations grow with batch size and sequence length.</p>\n";
  h += "<table class=\"memory\">\n";
  run_header(h, runs, "Category", 3);
  h += "<tr><th></th>";
  for (size_t i = 0; i < runs.size(); ++i) h += "<th>planned MiB</th><th>allocated MiB</th><th>bytes/param</th>";
  h += "<th>seed page bytes/param</th></tr>\n";
  for (const std::string& cat : report::category_names()) {
    h += str_cat("<tr><th><span class=\"swatch cat-", cat, "\"></span>", cat, "</th>");
    for (const RunData& r : runs) {
      const double pb = category_bytes(r.results, "planned_bytes", cat);
      const double ab = category_bytes(r.results, "allocator_peak_bytes", cat);
      const double n = number_or_nan(r.results, "num_parameters");
      h += str_cat("<td class=\"num\">", fmt(mib(pb), 1), "</td><td class=\"num\">", fmt(mib(ab), 1),
                   "</td><td class=\"num\">", fmt(n > 0 ? ab / n : NAN, 2), "</td>");
    }
    h += str_cat("<td class=\"num\">", html_escape(seed_bytes_per_param(runs[0].results, cat)), "</td></tr>\n");
  }
  // One row of per-run planned / allocated bytes, with allocated bytes per parameter.
  auto bytes_row = [&](const char* cls, const char* title, auto planned, auto allocated) {
    h += str_cat("<tr", cls, "><th>", title, "</th>");
    for (const RunData& r : runs) {
      const double pb = planned(r.results), ab = allocated(r.results);
      const double n = number_or_nan(r.results, "num_parameters");
      h += str_cat("<td class=\"num\">", fmt(mib(pb), 1), "</td><td class=\"num\">", fmt(mib(ab), 1),
                   "</td><td class=\"num\">", fmt(n > 0 ? ab / n : NAN, 2), "</td>");
    }
    h += "<td></td></tr>\n";
  };
  bytes_row(" class=\"total\"", "sum of category peaks", [](const json& r) { return category_sum(r, "planned_bytes"); },
            [](const json& r) { return category_sum(r, "allocator_peak_bytes"); });
  // Only when some run shares bytes between categories, so pages of runs that do not read as before.
  if (any_shared) {
    // 0 - x rather than -x, so a run that shares nothing shows 0.0, not -0.0.
    bytes_row("", "gradients in freed activation memory (counted twice)",
              [](const json& r) { return 0 - planned_shared(r); }, [](const json& r) { return 0 - allocated_shared(r); });
    bytes_row(" class=\"total\"", "total held",
              [](const json& r) { return category_sum(r, "planned_bytes") - planned_shared(r); },
              [](const json& r) { return category_sum(r, "allocator_peak_bytes") - allocated_shared(r); });
  }
  h += "<tr><th>NVML: CUDA context / weights / device in use (MiB)</th>";
  for (const RunData& r : runs) {
    const json& j = r.results;
    h += nvml_measured(j) ? str_cat("<td class=\"num\" colspan=\"3\">", fmt_int(number_or_nan(j, "cuda_context_mb")),
                                    " / ", fmt_int(number_or_nan(j, "weights_mb")), " / ",
                                    fmt_int(number_or_nan(j, "gpu_memory_occupied_mb")), "</td>")
                          : "<td colspan=\"3\" class=\"na\">not measured (no NVML)</td>";
  }
  h += "<td></td></tr>\n</table></section>\n";
}

void timeline_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "timeline", "Memory over one step",
               "Bytes live in the tagged allocator after each op of one training step, stacked by category: "
               "activations pile up through the forward pass and are released as the backward pass consumes them, "
               "while weights, optimizer state and gradients stay for the whole run (gradients in freed activation "
               "memory instead appear as backward writes them, into the space the activations leave).");
  h += "<div class=\"grid\">";
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].timeline.is_null()) {
      missing(h, str_cat(html_escape(runs[i].label), ": no memory_timeline.json, so no allocation timeline."));
      continue;
    }
    chart(h, "timeline", static_cast<int>(i),
          str_cat(html_escape(runs[i].label), ": GiB against op index within the step (", runs[i].timeline["label"].size(),
                  " ops); shaded bands mark the forward, backward and optimizer phases. Hover for the op."));
  }
  h += "</div></section>\n";
}

void classes_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "classes", "Op classes: share of flops versus share of runtime",
               "Every op of the profiled steps is put in a class; matrix multiplications (tensor contractions) do "
               "almost all the arithmetic, yet softmax, LayerNorm (statistical normalizations) and element-wise ops "
               "take a far larger share of the time because they move data without doing much arithmetic on it. "
               "The first row is Ivanov et al. 2020 (&ldquo;Data Movement Is All You Need&rdquo;), BERT-large "
               "encoder layers on PyTorch.");
  bool any = false;
  for (const RunData& r : runs) any = any || (!r.profile.is_null() && !r.profile["classes"].empty());
  if (!any) {
    missing(h, "No run has a profile.json with op classes: record one with <code>anatomy train --profile-steps N</code>.");
    h += "</section>\n";
    return;
  }
  chart(h, "classes", -1,
        "Percent of the step's flops (left) and runtime (right) per class. The paper measured the encoder layers "
        "alone, without optimizer or data loading; the table gives this run's runtime share among the paper's three "
        "classes for a like-for-like comparison.",
        " wide");
  h += "<table class=\"classes\">\n<tr><th rowspan=\"2\">Class</th><th colspan=\"2\" class=\"paper\">Ivanov et al. "
       "2020</th>";
  for (const RunData& r : runs) h += str_cat("<th colspan=\"5\" class=\"run\">", html_escape(r.label), "</th>");
  h += "</tr>\n<tr><th>% flops</th><th>% runtime</th>";
  for (size_t i = 0; i < runs.size(); ++i)
    h += "<th>% flops</th><th>% runtime</th><th>% runtime of the three</th><th>TFLOP/s</th><th>GB/s</th>";
  h += "</tr>\n";
  // Rows: every class any run reports, the profiler's order first.
  std::vector<std::string> order;
  auto add = [&](const std::string& c) {
    if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
  };
  for (const PaperRow& p : kPaper) add(p.cls);
  for (const RunData& r : runs)
    if (!r.profile.is_null())
      for (const json& c : r.profile["classes"]) add(c["cls"].get<std::string>());
  for (const std::string& cls : order) {
    const char* title = class_title(cls);
    const auto& known = report::class_names();
    const bool is_known = std::find(known.begin(), known.end(), cls) != known.end();
    h += str_cat("<tr><th><span class=\"swatch cls-", is_known ? cls : std::string("unknown"), "\"></span>",
                 title ? std::string(title) : html_escape(cls), "</th>");
    const PaperRow* paper = nullptr;
    for (const PaperRow& p : kPaper)
      if (cls == p.cls) paper = &p;
    h += paper ? str_cat("<td class=\"num paper\">", fmt(paper->flops_pct, 2), "</td><td class=\"num paper\">",
                         fmt(paper->time_pct, 1), "</td>")
               : "<td class=\"paper\"></td><td class=\"paper\"></td>";
    for (const RunData& r : runs) {
      const json* row = nullptr;
      double three = 0;
      if (!r.profile.is_null())
        for (const json& c : r.profile["classes"]) {
          if (c["cls"] == cls) row = &c;
          for (const PaperRow& p : kPaper)
            if (c["cls"] == p.cls && c["time_pct"].is_number()) three += c["time_pct"].get<double>();
        }
      if (!row) {
        h += "<td colspan=\"5\" class=\"na\">&mdash;</td>";
        continue;
      }
      const double tp = number_or_nan(*row, "time_pct");
      h += str_cat("<td class=\"num\">", fmt(number_or_nan(*row, "flops_pct"), 3), "</td><td class=\"num\">",
                   fmt(tp, 1), "</td><td class=\"num\">", paper && three > 0 ? fmt(100 * tp / three, 1) : "",
                   "</td><td class=\"num\">", fmt(number_or_nan(*row, "tflops"), 1), "</td><td class=\"num\">",
                   fmt(number_or_nan(*row, "gbps"), 0), "</td>");
    }
    h += "</tr>\n";
  }
  h += "</table>\n";
  // The per-op table, folded away: it can be long.
  for (const RunData& r : runs) {
    if (r.profile.is_null() || r.profile["ops"].empty()) continue;
    std::vector<const json*> ops;
    for (const json& o : r.profile["ops"]) ops.push_back(&o);
    std::stable_sort(ops.begin(), ops.end(),
                     [](const json* a, const json* b) { return (*a)["ms"].get<double>() > (*b)["ms"].get<double>(); });
    h += str_cat("<details><summary>Every op of ", html_escape(r.label), " (", ops.size(),
                 "), slowest first</summary><table class=\"ops\"><tr><th>Op</th><th>Class</th><th>Phase</th>"
                 "<th>Calls</th><th>ms per step</th><th>GFLOP</th><th>MB moved</th><th>TFLOP/s</th><th>GB/s</th></tr>\n");
    for (const json* o : ops) {
      const double ms = (*o)["ms"].get<double>(), f = number_or_nan(*o, "flops"), b = number_or_nan(*o, "bytes");
      h += str_cat("<tr><td>", html_escape((*o)["name"].get<std::string>()), "</td><td>",
                   html_escape((*o)["cls"].get<std::string>()), "</td><td>",
                   html_escape((*o)["phase"].get<std::string>()), "</td><td class=\"num\">",
                   fmt_int(number_or_nan(*o, "calls")), "</td><td class=\"num\">", fmt(ms, 3),
                   "</td><td class=\"num\">", fmt(f / 1e9, 1), "</td><td class=\"num\">", fmt(b / 1e6, 1),
                   "</td><td class=\"num\">", fmt(ms > 0 ? f / (ms * 1e-3) / 1e12 : NAN, 1), "</td><td class=\"num\">",
                   fmt(ms > 0 ? b / (ms * 1e-3) / 1e9 : NAN, 0), "</td></tr>\n");
    }
    h += "</table></details>\n";
  }
  h += "</section>\n";
}

void fwdbwd_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "fwdbwd", "Forward versus backward",
               "One training step split into the forward pass, the backward pass and the optimizer update, from "
               "CUDA events around every op; the backward pass computes gradients with respect to both the "
               "activations and the weights, so it costs about twice the forward pass.");
  bool any = false;
  for (const RunData& r : runs) any = any || !r.profile.is_null();
  if (!any) {
    missing(h, "No run has a profile.json: no forward/backward split.");
    h += "</section>\n";
    return;
  }
  std::string profiled;
  for (const RunData& r : runs) {
    const double n = number_or_nan(r.profile, "steps_profiled");
    if (n > 0) profiled += str_cat(profiled.empty() ? "" : ", ", html_escape(r.label), ": ", fmt(n, 0));
  }
  chart(h, "fwdbwd", -1,
        str_cat("Milliseconds per step (mean over the profiled steps", profiled.empty() ? "" : "; " + profiled,
                "); &ldquo;other&rdquo; is step time the per-op timers do not cover (gaps between kernels, host work)."),
        " wide");
  h += "<table class=\"fwdbwd\">\n";
  run_header(h, runs, "Milliseconds per step");
  const std::pair<const char*, const char*> rows[] = {{"Forward", "forward_ms"},
                                                      {"Backward", "backward_ms"},
                                                      {"Optimizer", "optimizer_ms"},
                                                      {"Data (batch to the device)", "data_ms"},
                                                      {"Whole step", "step_ms"}};
  for (const auto& [title, key] : rows) {
    h += str_cat("<tr><th>", title, "</th>");
    for (const RunData& r : runs)
      h += str_cat("<td class=\"num\">", r.profile.is_null() ? "&mdash;" : fmt(number_or_nan(r.profile, key), 2),
                   "</td>");
    h += "</tr>\n";
  }
  h += "<tr class=\"total\"><th>Backward / forward</th>";
  for (const RunData& r : runs) {
    const double f = number_or_nan(r.profile, "forward_ms"), b = number_or_nan(r.profile, "backward_ms");
    h += str_cat("<td class=\"num\">", f > 0 ? fmt(b / f, 2) + "&times;" : "&mdash;", "</td>");
  }
  h += "</tr>\n</table></section>\n";
}

void roofline_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "roofline", "Roofline",
               "Each dot is one op: its arithmetic intensity (flops per byte it moves to or from GPU memory) against "
               "the arithmetic throughput it achieved. Under the slanted roof an op is limited by memory bandwidth, "
               "under the flat roof by arithmetic; a dot far below its roof leaves the GPU underused.");
  h += "<div class=\"grid\">";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunData& r = runs[i];
    if (r.profile.is_null() || r.profile["ops"].empty()) {
      missing(h, str_cat(html_escape(r.label), ": no profile.json with ops, so no roofline."));
      continue;
    }
    const double tf = number_or_nan(r.profile, "ceil_tflops"), gb = number_or_nan(r.profile, "ceil_gbps");
    chart(h, "roofline", static_cast<int>(i),
          str_cat(html_escape(r.label), ": log-log; x in flop/byte, y in TFLOP/s; roofs at ", fmt(tf, 0),
                  " TFLOP/s and ", fmt(gb, 0),
                  " GB/s (the device's measured ceilings). Dot area grows with the op's time; hover a dot for its "
                  "name and numbers."));
  }
  h += "</div></section>\n";
}

void curves_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "curves", "Loss and throughput over training",
               "The training loss as logged (mean over the samples since the previous log line) and the samples per "
               "second since the start of training; the dashed line is the steady-state throughput measured over "
               "the second half of the run, after start-up costs.");
  bool any = false;
  for (const RunData& r : runs) any = any || !r.metrics.is_null();
  if (!any) {
    missing(h, "No run has a metrics.jsonl: no loss or throughput curves.");
  } else {
    h += "<div class=\"grid\">";
    chart(h, "loss", -1, "Loss (cross-entropy, nats) against optimizer step.");
    chart(h, "throughput", -1, "Samples/second since the start of training against optimizer step.");
    h += "</div>";
  }
  h += "</section>\n";
}

void nvml_section(std::string& h, const std::vector<RunData>& runs) {
  section_open(h, "nvml", "NVML samples over time",
               "GPU memory in use and utilization, sampled by NVML in the background while the run went on: "
               "utilization is the share of time a kernel was running (GPU) or device memory was being read or "
               "written (memory). Where the sampler read them, the SM clock and the board's power too.");
  bool any = false, clocks = false;
  for (const RunData& r : runs) {
    any = any || !r.nvml.is_null();
    if (!r.nvml.is_null() && r.nvml.contains("clock"))
      for (const json& v : r.nvml["clock"]) clocks = clocks || v.is_number();
  }
  if (!any) {
    missing(h, "No run has an nvml.jsonl: no samples over time.");
  } else {
    h += "<div class=\"grid\">";
    chart(h, "nvml-memory", -1, "Device memory in use, MiB, against seconds since sampling began.");
    chart(h, "nvml-util", -1, "Utilization, percent: GPU (solid) and memory (dashed), against seconds.");
    // Runs written before the sampler read clocks have none: their charts would be empty.
    if (clocks) {
      chart(h, "nvml-clock", -1,
            "SM clock, MHz, against seconds: below its maximum while the board is held at its power limit "
            "(Note [clock and power]).");
      chart(h, "nvml-power", -1, "Board power, W, against seconds.");
    }
    h += "</div>";
  }
  h += "</section>\n";
}

// The numbers the script draws, as one JSON document.
std::string chart_data(const std::vector<RunData>& runs) {
  json d = {{"categories", report::category_names()}, {"classes", report::class_names()}, {"runs", json::array()}};
  json paper = json::array();
  for (const PaperRow& p : kPaper) paper.push_back({{"cls", p.cls}, {"flops_pct", p.flops_pct}, {"time_pct", p.time_pct}});
  d["paper"] = paper;
  for (const RunData& r : runs) {
    json planned = json::object(), allocated = json::object();
    for (const std::string& c : report::category_names()) {
      const double pb = category_bytes(r.results, "planned_bytes", c), ab = category_bytes(r.results, "allocator_peak_bytes", c);
      if (std::isfinite(pb)) planned[c] = pb;
      if (std::isfinite(ab)) allocated[c] = ab;
    }
    auto num = [&](const char* k) { const double v = number_or_nan(r.results, k); return std::isfinite(v) ? json(v) : json(nullptr); };
    d["runs"].push_back({{"label", r.label},
                         {"params", num("num_parameters")},
                         {"steady_sps", num("steady_samples_per_second")},
                         {"nvml_mb", nvml_measured(r.results) ? num("gpu_memory_occupied_mb") : json(nullptr)},
                         {"context_mb", num("cuda_context_mb")},
                         {"planned", planned},
                         {"allocated", allocated},
                         {"planned_shared", planned_shared(r.results)},
                         {"allocated_shared", allocated_shared(r.results)},
                         {"metrics", r.metrics},
                         {"nvml", r.nvml},
                         {"profile", r.profile},
                         {"timeline", r.timeline}});
  }
  const std::string s = d.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

}  // namespace

std::string render_report(const std::vector<std::string>& run_dirs) {
  const std::vector<RunData> runs = report::load_runs(run_dirs);
  std::string title = "anatomy report: ";
  for (size_t i = 0; i < runs.size(); ++i) title += (i ? " vs " : "") + runs[i].label;
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += str_cat("<title>", html_escape(title), "</title>\n<style>", report_assets::kStyle, "</style>\n</head>\n");
  h += str_cat("<body data-errors=\"unknown\" data-runs=\"", runs.size(), "\">\n");
  page_header(h, runs);
  h += "<main>\n";
  notes_section(h, runs);
  config_section(h, runs);
  headline_section(h, runs);
  memory_section(h, runs);
  timeline_section(h, runs);
  classes_section(h, runs);
  fwdbwd_section(h, runs);
  roofline_section(h, runs);
  curves_section(h, runs);
  nvml_section(h, runs);
  h += "</main>\n<footer>Drawn with inline SVG by the page's own script; no network access, no external libraries. "
       "Paper figures: A. Ivanov, N. Dryden, T. Ben-Nun, S. Li, T. Hoefler, &ldquo;Data Movement Is All You Need: "
       "A Case Study on Optimizing Transformers&rdquo;, arXiv:2007.00072 (2020), MLSys 2021.</footer>\n";
  h += str_cat("<script type=\"application/json\" id=\"anatomy-data\">", chart_data(runs), "</script>\n");
  h += str_cat("<script>", report_assets::kScript, "</script>\n</body></html>\n");
  return h;
}

void write_report(const std::vector<std::string>& run_dirs, const std::string& out_path) {
  const std::string html = render_report(run_dirs);
  const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  ANATOMY_CHECK(parent.empty() || std::filesystem::is_directory(parent, ec), out_path,
                ": the directory to write the report into does not exist");
  write_file_atomic(out_path, html);
}

}  // namespace anatomy
