// The report page's style sheet and its error hook, inlined into every page (no network).
// The drawing script is in report_script.h.
#pragma once

namespace anatomy::report_assets {

// Runs before the main script, so any error after it, a syntax error in the main script
// included, is counted in <body data-errors> and shown in #script-status. The main script
// sets data-errors="0" and data-status="ok" when every chart was drawn without one.
inline constexpr const char* kErrorHook = R"JS(
window.__anatomyErrors = [];
window.__anatomyError = function (m) {
  window.__anatomyErrors.push(String(m));
  document.body.setAttribute('data-errors', String(window.__anatomyErrors.length));
  var s = document.getElementById('script-status');
  if (s) { s.setAttribute('data-status', 'error'); s.textContent = 'Script errors: ' + window.__anatomyErrors.join('; '); }
};
window.onerror = function (msg, src, line, col) { window.__anatomyError(msg + ' (line ' + line + ':' + col + ')'); };
)JS";

// Category and class colours here match the script's (report_script.h).
inline constexpr const char* kStyle = R"CSS(
:root { --ink: #1d2430; --muted: #5b6472; --line: #d9dee6; --bg: #f4f6f9; --card: #ffffff; --accent: #2f6fb3; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 14px/1.45 "Liberation Sans", "Helvetica Neue", Arial, sans-serif; }
header, main, footer { max-width: 1340px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 18px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 2px; }
p.sub { margin: 0 0 6px; color: var(--muted); }
code { font: 12px "Liberation Mono", Menlo, monospace; color: var(--muted); }
nav { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 6px 0 10px; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; }
#script-status { font-size: 12px; margin: 0; color: var(--muted); }
#script-status[data-status="error"], #script-status[data-status="pending"] {
  color: #9b1c1c; background: #fdecec; padding: 4px 8px; border-radius: 4px; }
section#notes { border-color: #f1dca6; background: #fffaf0; }
section#notes ul { margin: 4px 0 0; padding-left: 20px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px; }
section { margin: 0 0 14px; }
main { padding: 0 20px; }
main > section { max-width: 1300px; }
p.explain { margin: 2px 0 10px; color: var(--muted); max-width: 980px; }
p.missing { color: #8a5a00; background: #fff6e0; border: 1px solid #f1dca6; border-radius: 4px; padding: 6px 10px; margin: 6px 0; }
table { border-collapse: collapse; margin: 6px 0 8px; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px; text-align: left; vertical-align: top; }
th { font-weight: 600; }
th.run { text-align: center; background: #eef3fa; border-left: 2px solid #fff; }
th.paper, td.paper { background: #f7f3ea; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.total th, tr.total td { border-top: 2px solid #aab3c0; }
.na { color: var(--muted); font-style: italic; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; vertical-align: 0; }
.cat-weights { background: #4e79a7; } .cat-optimizer_state { background: #f28e2b; } .cat-gradients { background: #e15759; }
.cat-activations { background: #76b7b2; } .cat-temporary { background: #59a14f; } .cat-workspace { background: #edc948; }
.cat-other { background: #b07aa1; }
.cls-tensor_contraction { background: #4e79a7; } .cls-statistical_normalization { background: #f28e2b; }
.cls-elementwise { background: #e15759; } .cls-optimizer { background: #59a14f; } .cls-data { background: #b07aa1; }
.cls-communication { background: #9c755f; } .cls-unknown { background: #999999; }
.cards { display: flex; gap: 14px; flex-wrap: wrap; }
.card { flex: 1 1 220px; border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; background: #fbfcfe; }
.card .label { font-weight: 600; color: var(--muted); }
.card .big { font-size: 34px; font-weight: 700; font-variant-numeric: tabular-nums; }
.card .unit { color: var(--muted); font-size: 12px; }
.seed-lines { display: flex; gap: 12px; flex-wrap: wrap; }
.seed-lines pre { margin: 0; padding: 6px 12px; background: #1d2430; color: #e8edf4; border-radius: 6px; font-size: 12px; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 10px 18px; }
figure.chart-box { margin: 4px 0 8px; min-width: 0; }
figure.chart-box figcaption { font-size: 12px; color: var(--muted); margin-top: 2px; }
svg.chart { display: block; width: 100%; height: auto; overflow: visible; }
svg.chart text { font: 11px "Liberation Sans", Arial, sans-serif; fill: var(--ink); }
svg.chart text.title { font-size: 12px; font-weight: 600; }
svg.chart text.muted, svg.chart text.tick { fill: var(--muted); }
svg.chart text.inbar { fill: #fff; font-size: 10px; }
svg.chart line.grid { stroke: #e8ebf0; }
svg.chart line.axis { stroke: #8a93a0; }
svg.chart .mark:hover { opacity: 0.75; }
svg.chart rect.hover { fill: transparent; }
svg.chart rect.hover:hover { fill: rgba(0, 0, 0, 0.06); }
details { margin: 6px 0; }
details summary { cursor: pointer; color: var(--accent); }
table.ops td { font-size: 12px; padding: 1px 8px; }
footer { color: var(--muted); font-size: 12px; padding-bottom: 24px; }
)CSS";

}  // namespace anatomy::report_assets
