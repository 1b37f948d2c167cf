// `anatomy report`: one self-contained HTML page (inline CSS, SVG drawn by an inline script of
// our own, no network) that shows where a run's memory and time went, or several runs side by
// side. Inputs per run directory: train_results.json (required), and when present
// metrics.jsonl, nvml.jsonl, profile.json and memory_timeline.json; see report_data.h for the
// exact formats read.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anatomy {

// The page for one or more run directories. Throws anatomy::Error (one line, naming the file)
// when a directory or its train_results.json is missing or unreadable; a missing or garbled
// optional file is reported inside the page instead.
std::string render_report(const std::vector<std::string>& run_dirs);

// render_report() written to `out_path` atomically.
void write_report(const std::vector<std::string>& run_dirs, const std::string& out_path);

// Text made safe for HTML element content and quoted attribute values (& < > " ' escaped);
// invalid UTF-8 becomes U+FFFD.
std::string html_escape(std::string_view s);

}  // namespace anatomy
