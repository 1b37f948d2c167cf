// `anatomy report`: the page holds every section, escapes what it reads, compares runs side by
// side, names missing inputs, fails cleanly on bad ones, and renders in headless Chromium
// without script errors and with every chart drawn (tests/data/report/ holds the inputs).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "core/error.h"
#include "telemetry/report.h"
#include "telemetry/report_data.h"

namespace fs = std::filesystem;
using anatomy::render_report;

namespace {

const std::string kData = std::string(ANATOMY_SOURCE_DIR) + "/tests/data/report";
const std::string kBs4 = kData + "/run_bs4", kBs32 = kData + "/run_bs32";

std::string tmp(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("report_" + name);
  fs::remove_all(p);
  return p.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

bool has(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// The text between `open` and the next `close` after it.
std::string between(const std::string& s, const std::string& open, const std::string& close) {
  const size_t a = s.find(open);
  if (a == std::string::npos) return "";
  const size_t b = s.find(close, a);
  return s.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

// A run directory holding only a copy of run_bs32's train_results.json.
std::string results_only_run(const std::string& name) {
  const std::string d = tmp(name);
  fs::create_directories(d);
  fs::copy_file(kBs32 + "/train_results.json", d + "/train_results.json");
  return d;
}

std::string error_of(const std::vector<std::string>& dirs) {
  try {
    render_report(dirs);
  } catch (const anatomy::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct CmdResult {
  int status = -1;
  std::string output;
};

CmdResult run(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

const char* const kSectionIds[] = {"config", "headline", "memory", "timeline", "classes",
                                   "fwdbwd", "roofline", "curves", "nvml"};

}  // namespace

TEST(Report, SingleRunHasEverySection) {
  const std::string h = render_report({kBs32});
  for (const char* id : kSectionIds) EXPECT_TRUE(has(h, std::string("<section id=\"") + id + "\">")) << id;
  // Every chart kind, one svg each for one run.
  for (const char* kind : {"memory", "timeline", "classes", "fwdbwd", "roofline", "loss", "throughput", "nvml-memory",
                           "nvml-util"})
    EXPECT_EQ(count(h, std::string("data-chart=\"") + kind + "\""), 1u) << kind;
  // Each section explains itself in a sentence under its title.
  EXPECT_EQ(count(h, "<p class=\"explain\">"), count(h, "<section id=") + 2);  // + bytes/param and "as printed"
  // The three headline numbers, the configuration and the paper's figures.
  EXPECT_TRUE(has(h, ">Time<") && has(h, ">Samples/second<") && has(h, ">GPU memory occupied<"));
  EXPECT_TRUE(has(h, "NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(has(h, "99.80") && has(h, "0.17") && has(h, "0.03") && has(h, "61.0") && has(h, "25.5") &&
              has(h, "13.5"));
  EXPECT_TRUE(has(h, "Ivanov"));
  EXPECT_TRUE(has(h, "Time: 5.86\nSamples/second: 349.26\nGPU memory occupied: 19857 MB."));  // the trainer's own lines, formatted as it prints them
  // Bytes per parameter of the persistent categories: 6 (bf16 weights), 8 (AdamW), 4 (gradients).
  const std::string mem = between(h, "<table class=\"memory\">", "</table>");
  EXPECT_TRUE(has(mem, ">6.00<") && has(mem, ">8.00<") && has(mem, ">4.00<")) << mem;
  // Self-contained: no network, no external script or style sheet.
  EXPECT_FALSE(has(h, "http://") && !has(h, "http://www.w3.org/2000/svg"));
  EXPECT_FALSE(has(h, "https://"));
  EXPECT_FALSE(has(h, "<script src") || has(h, "<link"));
  // Nothing is missing from the fixture, so no notice.
  EXPECT_FALSE(has(h, "id=\"notes\""));
}

TEST(Report, ComparisonHasOneColumnPerRun) {
  const std::string h = render_report({kBs4, kBs32});
  for (const char* table : {"<table class=\"config\">", "<table class=\"headline\">", "<table class=\"fwdbwd\">"}) {
    const std::string t = between(h, table, "</table>");
    ASSERT_FALSE(t.empty()) << table;
    EXPECT_EQ(count(t, "<th class=\"run\">"), 2u) << table;
    EXPECT_TRUE(has(t, ">run_bs4<") && has(t, ">run_bs32<")) << table;
  }
  // Memory and class tables: one group of columns per run.
  EXPECT_EQ(count(between(h, "<table class=\"memory\">", "</table>"), "<th colspan=\"3\" class=\"run\">"), 2u);
  EXPECT_EQ(count(between(h, "<table class=\"classes\">", "</table>"), "<th colspan=\"5\" class=\"run\">"), 2u);
  // One memory chart with both runs; per-run timelines and rooflines.
  EXPECT_EQ(count(h, "data-chart=\"memory\""), 1u);
  EXPECT_EQ(count(h, "data-chart=\"timeline\" data-run=\"0\""), 1u);
  EXPECT_EQ(count(h, "data-chart=\"timeline\" data-run=\"1\""), 1u);
  EXPECT_EQ(count(h, "data-chart=\"roofline\""), 2u);
  EXPECT_TRUE(has(h, "data-runs=\"2\""));
  EXPECT_TRUE(has(h, "<title>anatomy report: run_bs4 vs run_bs32</title>"));
}

// Gradients placed in freed activation memory are counted in both categories; the memory table
// says by how much and gives the total without the double count. Runs whose results lack the
// keys (written before the placement existed) share nothing.
TEST(Report, SharedGradientBytesAreSubtractedFromTheTotal) {
  const std::string shared_row = "<th>gradients in freed activation memory (counted twice)</th>";
  const std::string total_row = "<th>total held</th>";
  auto cells = [](const std::string& table, const std::string& row) { return between(table, row, "</tr>"); };

  // Without the keys: no extra rows, the sum as before.
  const std::string plain = between(render_report({kBs32}), "<table class=\"memory\">", "</table>");
  EXPECT_FALSE(has(plain, shared_row)) << plain;
  EXPECT_FALSE(has(plain, total_row)) << plain;
  EXPECT_TRUE(has(cells(plain, "<th>sum of category peaks</th>"), ">19219.4<"));

  // run_bs32 with all of its planned gradients (1 340 575 752 bytes) and 1 MiB less of its
  // allocated ones in activation memory.
  const std::string d = tmp("shared") + "/run_shared";
  fs::create_directories(d);
  nlohmann::json r = nlohmann::json::parse(slurp(kBs32 + "/train_results.json"));
  r["planned_shared_bytes"] = 1340575752;
  r["allocator_shared_bytes"] = 1340575752 - 1048576;
  r["gradient_placement"] = "in-activations";
  spit(d + "/train_results.json", r.dump());
  const std::string h = render_report({d, kBs4});
  const std::string mem = between(h, "<table class=\"memory\">", "</table>");
  // The configuration names where the gradients live (run_bs4 predates the key).
  EXPECT_TRUE(has(cells(between(h, "<table class=\"config\">", "</table>"), "<th>Gradients (own buffer, or in freed activation memory)</th>"),
                  "<td>in-activations</td><td><span class=\"na\">not recorded</span></td>"));
  // The sum of category peaks still counts them twice...
  EXPECT_EQ(cells(mem, "<th>sum of category peaks</th>"),
            "<th>sum of category peaks</th><td class=\"num\">19219.4</td><td class=\"num\">19211.4</td>"
            "<td class=\"num\">60.11</td><td class=\"num\">7474.9</td><td class=\"num\">7466.9</td>"
            "<td class=\"num\">23.36</td><td></td>");
  // ...the next row takes them off (run_bs4, without the keys, shares nothing)...
  EXPECT_EQ(cells(mem, shared_row),
            shared_row + "<td class=\"num\">-1278.5</td><td class=\"num\">-1277.5</td><td class=\"num\">-4.00</td>"
                         "<td class=\"num\">0.0</td><td class=\"num\">0.0</td><td class=\"num\">0.00</td><td></td>");
  // ...and the total held is the difference; run_bs4's is its sum.
  EXPECT_EQ(cells(mem, total_row),
            total_row + "<td class=\"num\">17941.0</td><td class=\"num\">17934.0</td><td class=\"num\">56.11</td>"
                        "<td class=\"num\">7474.9</td><td class=\"num\">7466.9</td><td class=\"num\">23.36</td>"
                        "<td></td>");
  // In that order, below the sum.
  EXPECT_LT(mem.find("sum of category peaks"), mem.find(shared_row));
  EXPECT_LT(mem.find(shared_row), mem.find(total_row));
  // The chart draws the gradients without the shared bytes, and its caption says so.
  EXPECT_TRUE(has(h, "the bar's length is what was held"));
  EXPECT_TRUE(has(h, "\"planned_shared\":1340575752"));  // the chart draws gradients without the shared bytes
  EXPECT_FALSE(has(render_report({kBs32}), "the bar's length is what was held"));
}

TEST(Report, SameNamedRunsGetDistinctLabels) {
  const std::string a = tmp("same_a") + "/run", b = tmp("same_b") + "/run";
  fs::create_directories(a);
  fs::create_directories(b);
  fs::copy_file(kBs4 + "/train_results.json", a + "/train_results.json");
  fs::copy_file(kBs32 + "/train_results.json", b + "/train_results.json");
  auto runs = anatomy::report::load_runs({a, b});
  EXPECT_NE(runs[0].label, runs[1].label);
}

TEST(Report, EscapesEverythingReadFromFiles) {
  EXPECT_EQ(anatomy::html_escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(anatomy::html_escape("caf\xC3\xA9 \xE2\x9C\x93"), "caf\xC3\xA9 \xE2\x9C\x93");  // valid UTF-8 kept
  EXPECT_EQ(anatomy::html_escape("a\xFF" "b\xC3"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");      // invalid replaced
  EXPECT_EQ(anatomy::html_escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // no surrogates
  EXPECT_EQ(anatomy::html_escape(std::string("x\0y", 3)), "x\xEF\xBF\xBDy");

  const std::string evil = "<script>alert(1)</script>&\"'";
  const std::string d = tmp("evil") + "/run<b>&\"x";
  fs::create_directories(d);
  std::string results = slurp(kBs32 + "/train_results.json");
  const std::string dev = "\"device\": \"cuda:0 (NVIDIA H100 80GB HBM3, sm_90, 81079 MiB)\"";
  ASSERT_TRUE(has(results, dev));
  results.replace(results.find(dev), dev.size(), "\"device\": \"<script>alert(1)<\\/script>&\\\"'\"");
  spit(d + "/train_results.json", results);
  spit(d + "/profile.json",
       "{\"step_time_ms\": 10, \"forward_ms\": 3, \"backward_ms\": 6, \"optimizer_ms\": 1, \"ceilings\": {\"tflops\": "
       "700, \"gbps\": 3000}, \"ops\": [{\"name\": \"</script><script>alert(2)</script>\", \"class\": "
       "\"<i>odd</i>\", \"phase\": \"forward\", \"calls\": 1, \"time_ms\": 1.0, \"flops\": 1e9, \"bytes\": 1e6}]}");
  spit(d + "/metrics.jsonl", "{\"step\": 1, \"loss\": 0.5, \"samples_per_second\": 10}\n");
  const std::string h = render_report({d});
  EXPECT_FALSE(has(h, "<script>alert"));
  EXPECT_FALSE(has(h, "<i>odd"));
  EXPECT_FALSE(has(h, "<b>&"));
  EXPECT_TRUE(has(h, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;"));
  EXPECT_TRUE(has(h, "run&lt;b&gt;&amp;&quot;x"));
  // The JSON block cannot be closed early: only the page's own three scripts end.
  EXPECT_EQ(count(h, "</script>"), 3u);
  EXPECT_EQ(count(h, "<script"), 3u);
  EXPECT_TRUE(has(h, "\\u003c/script\\u003e\\u003cscript\\u003ealert(2)"));
}

TEST(Report, MissingOptionalFilesAreNamedInThePage) {
  const std::string d = results_only_run("bare");
  const std::string h = render_report({d});
  EXPECT_TRUE(has(h, "id=\"notes\""));
  for (const char* f : {"metrics.jsonl is missing", "nvml.jsonl is missing", "profile.json is missing",
                        "memory_timeline.json is missing"})
    EXPECT_TRUE(has(h, f)) << f;
  // What can be drawn still is; what cannot is replaced by a sentence, not an empty chart.
  EXPECT_EQ(count(h, "data-chart=\"memory\""), 1u);
  for (const char* kind : {"timeline", "classes", "fwdbwd", "roofline", "loss", "nvml-util"})
    EXPECT_FALSE(has(h, std::string("data-chart=\"") + kind + "\"")) << kind;
  EXPECT_GE(count(h, "<p class=\"missing\">"), 6u);
  for (const char* id : kSectionIds) EXPECT_TRUE(has(h, std::string("<section id=\"") + id + "\">")) << id;
}

// The SM clock and power charts (Note [clock and power]) appear when a run's nvml.jsonl has
// clock samples; the fixture runs, sampled before the clock was read, show none.
TEST(Report, ClockAndPowerChartsOnlyWithClockSamples) {
  EXPECT_FALSE(has(render_report({kBs32}), "data-chart=\"nvml-clock\""));
  const std::string d = results_only_run("clocks");
  spit(d + "/nvml.jsonl",
       "{\"t_s\": 0.0, \"gpu_util_pct\": 10, \"sm_clock_mhz\": 1980, \"power_w\": 120.5}\n"
       "{\"t_s\": 0.1, \"gpu_util_pct\": 100, \"sm_clock_mhz\": 1725, \"power_w\": 692.0}\n");
  const std::string h = render_report({kBs32, d});
  EXPECT_EQ(count(h, "data-chart=\"nvml-clock\""), 1u);
  EXPECT_EQ(count(h, "data-chart=\"nvml-power\""), 1u);
  EXPECT_TRUE(has(h, "1725") && has(h, "692"));  // the samples travel in the page's data
}

TEST(Report, GarbledOptionalFilesAreReportedNotFatal) {
  const std::string d = results_only_run("garbled");
  spit(d + "/profile.json", "{\"ops\": [");
  spit(d + "/memory_timeline.json", "[1, 2, 3]");
  spit(d + "/metrics.jsonl", "{\"step\": 1, \"loss\": 0.7}\n{\"step\": 2, \"loss\": 0.6}\n{\"step\": 3, \"lo");
  spit(d + "/nvml.jsonl", "{\"gpu_util_pct\": 90}\n");
  const std::string h = render_report({d});
  EXPECT_TRUE(has(h, "profile.json is not valid JSON")) << h.substr(0, 4000);
  EXPECT_TRUE(has(h, "memory_timeline.json is not a JSON object"));
  EXPECT_TRUE(has(h, "metrics.jsonl: 1 line(s) are not JSON objects and were skipped (the first is line 3)"));
  EXPECT_TRUE(has(h, "nvml.jsonl holds no usable samples"));
  EXPECT_EQ(count(h, "data-chart=\"loss\""), 1u);  // the two good lines still draw
}

TEST(Report, ClassesAreComputedFromOpsWhenAbsent) {
  const std::string d = results_only_run("noclasses");
  spit(d + "/profile.json",
       "{\"step_time_ms\": 4, \"ops\": ["
       "{\"name\": \"gemm\", \"class\": \"tensor_contraction\", \"phase\": \"forward\", \"calls\": 2, \"time_ms\": 3, "
       "\"flops\": 3e12, \"bytes\": 1e9},"
       "{\"name\": \"ln\", \"class\": \"statistical_normalization\", \"phase\": \"forward\", \"calls\": 2, "
       "\"time_ms\": 1, \"flops\": 1e9, \"bytes\": 2e9},"
       "{\"name\": \"bad\", \"class\": \"elementwise\"}]}");
  const auto r = anatomy::report::load_run(d);
  ASSERT_EQ(r.profile["classes"].size(), 2u);
  const auto& tc = r.profile["classes"][0];
  EXPECT_EQ(tc["cls"], "tensor_contraction");
  EXPECT_NEAR(tc["time_pct"].get<double>(), 75.0, 1e-9);
  EXPECT_NEAR(tc["flops_pct"].get<double>(), 100.0 * 3e12 / (3e12 + 1e9), 1e-9);
  EXPECT_NEAR(tc["tflops"].get<double>(), 1000.0, 1e-6);  // 3e12 flop in 3 ms
  EXPECT_NEAR(r.profile["classes"][1]["gbps"].get<double>(), 2000.0, 1e-6);
  ASSERT_EQ(r.notes.size(), 4u);  // metrics, nvml, timeline missing; one op skipped
  EXPECT_TRUE(has(r.notes[2], "1 op(s) without a name, class or time_ms were skipped")) << r.notes[2];
}

TEST(Report, BadInputIsAOneLineErrorNamingTheFile) {
  const std::string nodir = tmp("nope");
  std::string e = error_of({nodir});
  EXPECT_TRUE(has(e, nodir) && has(e, "no such run directory")) << e;

  const std::string empty = tmp("empty");
  fs::create_directories(empty);
  e = error_of({empty});
  EXPECT_TRUE(has(e, empty + "/train_results.json") && has(e, "not found")) << e;

  spit(empty + "/train_results.json", "{\"train_runtime\": 1.0,\n \"oops\"");
  e = error_of({empty});
  EXPECT_TRUE(has(e, "train_results.json: not valid JSON")) << e;
  EXPECT_FALSE(has(e, "\n")) << e;

  spit(empty + "/train_results.json", "[1, 2]");
  e = error_of({empty});
  EXPECT_TRUE(has(e, "train_results.json: expected a JSON object")) << e;

  // A good run and a bad one: the bad one is named.
  e = error_of({kBs4, nodir});
  EXPECT_TRUE(has(e, nodir)) << e;
  EXPECT_TRUE(has(error_of({}), "at least one run directory"));
}

TEST(Report, CommandLineWritesThePage) {
  const std::string bin = ANATOMY_BINARY;
  // One run: report.html inside the run directory by default.
  const std::string d = results_only_run("cli");
  CmdResult r = run(bin + " report " + d + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(d + "/report.html")) << r.output;
  // Several runs and an explicit output path.
  const std::string out = tmp("cli_out.html");
  r = run(bin + " report " + kBs4 + " " + kBs32 + " -o " + out + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(slurp(out), "data-runs=\"2\""));
  // Errors: one line, exit 2, and no file left behind.
  const std::string bad_out = tmp("cli_bad.html");
  r = run(bin + " report " + tmp("cli_missing") + " -o " + bad_out + " 2>&1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "anatomy: error:") && has(r.output, "no such run directory")) << r.output;
  EXPECT_EQ(count(r.output, "\n"), 1u) << r.output;
  EXPECT_FALSE(fs::exists(bad_out));
  r = run(bin + " report 2>&1");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "anatomy: error: report: RUN_DIR is required")) << r.output;
  EXPECT_EQ(count(r.output, "\n"), 1u) << r.output;
  r = run(bin + " report " + d + " -o '' 2>&1");  // an empty name is not the default
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "anatomy: error: report: -o/--output needs a file name")) << r.output;
}

// ---- headless Chromium ------------------------------------------------------------------

namespace {

std::string find_chromium() {
  if (const char* env = std::getenv("ANATOMY_CHROMIUM")) return env;
  for (const char* name : {"chromium", "chromium-browser"}) {
    CmdResult r = run(std::string("command -v ") + name + " 2>/dev/null");
    if (r.status == 0 && !r.output.empty()) return r.output.substr(0, r.output.find('\n'));
  }
  return "";
}

// Runs Chromium headless on `html` with one more flag; returns stdout (the DOM for --dump-dom).
CmdResult chromium(const std::string& bin, const std::string& html, const std::string& flag, const std::string& tag) {
  const std::string profile = tmp("chromium_profile_" + tag);
  // Chromium reserves tens of GB of address space up front (its JavaScript heap cage): it runs
  // without the suite's soft address-space cap (Note [test memory cap]), bounded by its timeout.
  const std::string cmd = "ulimit -S -v unlimited; timeout 180 '" + bin +
                          "' --headless --disable-gpu --no-sandbox --hide-scrollbars --force-device-scale-factor=1 "
                          "--no-first-run --disable-extensions --user-data-dir='" + profile +
                          "' --window-size=1400,4000 " + flag + " 'file://" + fs::absolute(html).string() + "' 2>'" +
                          tmp("chromium_" + tag + ".log") + "'";
  return run(cmd);
}

// The attributes of every <svg class="chart" ...> in a dumped DOM: data-chart -> drawn counts.
std::multimap<std::string, int> drawn_charts(const std::string& dom) {
  std::multimap<std::string, int> out;
  const std::regex svg("<svg[^>]*class=\"chart\"[^>]*>");
  const std::regex kind("data-chart=\"([^\"]+)\""), drawn("data-drawn=\"([0-9]+)\"");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), svg); it != std::sregex_iterator(); ++it) {
    const std::string tag = it->str();
    std::smatch k, d;
    const bool hk = std::regex_search(tag, k, kind), hd = std::regex_search(tag, d, drawn);
    out.emplace(hk ? k[1].str() : "?", hd ? std::stoi(d[1].str()) : -1);
  }
  return out;
}

// Checks a dumped DOM: the script ran without errors and every chart drew marks.
void expect_rendered(const std::string& dom, size_t charts, const std::string& what) {
  ASSERT_FALSE(dom.empty()) << what << ": Chromium printed no DOM";
  EXPECT_TRUE(has(dom, "data-errors=\"0\"")) << what << ": " << between(dom, "<p id=\"script-status\"", "</p>");
  EXPECT_TRUE(has(dom, "data-status=\"ok\"")) << what << ": " << between(dom, "<p id=\"script-status\"", "</p>");
  const auto c = drawn_charts(dom);
  EXPECT_EQ(c.size(), charts) << what;
  for (const auto& [kind, n] : c) EXPECT_GT(n, 0) << what << ": chart " << kind << " is empty";
}

}  // namespace

TEST(Report, RendersInHeadlessChromium) {
  const std::string bin = find_chromium();
  // CI installs Chromium (scripts/setup.sh); without it this test fails rather than skips.
  ASSERT_FALSE(bin.empty()) << "chromium not found: install Debian's chromium (scripts/setup.sh does), or point "
                               "ANATOMY_CHROMIUM at a Chromium binary";

  const std::string single = tmp("single.html"), compare = tmp("compare.html"), bare = tmp("bare.html");
  anatomy::write_report({kBs32}, single);
  anatomy::write_report({kBs4, kBs32}, compare);
  anatomy::write_report({results_only_run("chromium_bare")}, bare);

  CmdResult r = chromium(bin, single, "--dump-dom", "single");
  EXPECT_EQ(r.status, 0);
  expect_rendered(r.output, 9, "one run");
  r = chromium(bin, compare, "--dump-dom", "compare");
  EXPECT_EQ(r.status, 0);
  expect_rendered(r.output, 11, "two runs");
  const auto c = drawn_charts(r.output);
  EXPECT_EQ(c.count("timeline"), 2u);
  EXPECT_EQ(c.count("roofline"), 2u);
  r = chromium(bin, bare, "--dump-dom", "bare");
  EXPECT_EQ(r.status, 0);
  expect_rendered(r.output, 1, "train_results.json only");

  // Degenerate inputs (one sample, one event, no ceilings, no NVML memory) draw without errors.
  const std::string edge = results_only_run("chromium_edge"), edge_html = tmp("edge.html");
  spit(edge + "/metrics.jsonl", "{\"step\": 1, \"loss\": 0.7, \"samples_per_second\": 5}\n");
  spit(edge + "/nvml.jsonl", "{\"t_s\": 0.0, \"gpu_util_pct\": 50, \"sm_clock_mhz\": 1725, \"power_w\": 690}\n");
  spit(edge + "/profile.json",
       "{\"step_time_ms\": 3, \"ops\": [{\"name\": \"copy\", \"class\": \"data\", \"phase\": \"data\", \"calls\": 1, "
       "\"time_ms\": 0.1, \"flops\": 0, \"bytes\": 100}, {\"name\": \"mm\", \"class\": \"tensor_contraction\", "
       "\"phase\": \"forward\", \"calls\": 1, \"time_ms\": 1, \"flops\": 1e9, \"bytes\": 1e6}]}");
  spit(edge + "/memory_timeline.json", "{\"events\": [{\"label\": \"only\", \"phase\": \"forward\", \"bytes\": {\"weights\": 100}}]}");
  anatomy::write_report({edge}, edge_html);
  r = chromium(bin, edge_html, "--dump-dom", "edge");
  EXPECT_TRUE(has(r.output, "data-errors=\"0\"")) << between(r.output, "<p id=\"script-status\"", "</p>");
  const auto e = drawn_charts(r.output);
  EXPECT_EQ(e.size(), 11u);  // with the SM clock and power charts
  for (const auto& [kind, n] : e) {
    if (kind == "nvml-memory") EXPECT_EQ(n, 0) << "no memory samples, so nothing to draw";
    else EXPECT_GT(n, 0) << kind;
  }

  // The screenshot: a PNG of the window's size that is far from blank. A page of one colour
  // compresses to a few tens of kB; the same window showing a white page is the yardstick.
  const std::string png = tmp("report.png"), blank_png = tmp("blank.png"), blank = tmp("blank.html");
  spit(blank, "<!DOCTYPE html><html><body style=\"background:#f4f6f9\"></body></html>");
  EXPECT_EQ(chromium(bin, compare, "--screenshot='" + png + "'", "shot").status, 0);
  EXPECT_EQ(chromium(bin, blank, "--screenshot='" + blank_png + "'", "blank").status, 0);
  ASSERT_TRUE(fs::exists(png)) << "no screenshot written";
  const std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
           (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
  };
  EXPECT_EQ(be32(16), 1400u);  // IHDR width and height
  EXPECT_EQ(be32(20), 4000u);
  const auto blank_size = fs::exists(blank_png) ? fs::file_size(blank_png) : 0;
  EXPECT_GT(bytes.size(), 150u * 1024) << "the screenshot looks blank";
  EXPECT_GT(bytes.size(), 4 * blank_size) << "the screenshot is hardly larger than a blank page's (" << blank_size << ")";

  if (std::getenv("ANATOMY_SAVE_SCREENSHOT")) {
    const fs::path dst = fs::path(ANATOMY_SOURCE_DIR) / "bench/results/report_screenshot.png";
    fs::create_directories(dst.parent_path());
    fs::copy_file(png, dst, fs::copy_options::overwrite_existing);
    std::printf("screenshot saved to %s\n", dst.string().c_str());
  }
}
