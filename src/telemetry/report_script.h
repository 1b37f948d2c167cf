// The report page's drawing script, inlined into every page. It reads the JSON block
// #anatomy-data (written and validated by report.cpp), draws each <svg class="chart"> by its
// data-chart kind, and marks every drawn data element with class "mark"; the count goes into
// the svg's data-drawn attribute so a test can check the chart is not empty. Strings reach
// the DOM through textContent only (Note [report escaping] in report.cpp).
#pragma once

namespace anatomy::report_assets {

inline constexpr const char* kScript = R"JS(
(function () {
  'use strict';
  var NS = 'http://www.w3.org/2000/svg';
  var MIB = 1048576, GIB = 1073741824;
  var DATA = JSON.parse(document.getElementById('anatomy-data').textContent);
  var CAT_COLOR = { weights: '#4e79a7', optimizer_state: '#f28e2b', gradients: '#e15759', activations: '#76b7b2',
                    temporary: '#59a14f', workspace: '#edc948', other: '#b07aa1', context: '#9c755f', held: '#bab0ac' };
  var CAT_TITLE = { context: 'CUDA context', held: 'rest of the process (allocator cache, libraries)' };
  var CLS_COLOR = { tensor_contraction: '#4e79a7', statistical_normalization: '#f28e2b', elementwise: '#e15759',
                    optimizer: '#59a14f', data: '#b07aa1', communication: '#9c755f' };
  var CLS_TITLE = { tensor_contraction: 'tensor contractions', statistical_normalization: 'statistical normalizations',
                    elementwise: 'element-wise', optimizer: 'optimizer', data: 'data', communication: 'communication' };
  var PHASE_FILL = { forward: '#e9f1fa', backward: '#fbefe6', optimizer: '#eaf5ea', data: '#f3eef6' };
  var RUN_COLOR = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];

  function runColor(i) { return RUN_COLOR[i % RUN_COLOR.length]; }
  function clsColor(c) { return CLS_COLOR[c] || '#999999'; }
  function ok(v) { return typeof v === 'number' && isFinite(v); }
  function fmt(v, d) { return ok(v) ? v.toFixed(d) : '\u2014'; }
  function el(parent, tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function tip(e, text) { el(e, 'title', null, text); return e; }
  function mark(e) { e.setAttribute('class', ((e.getAttribute('class') || '') + ' mark').trim()); return e; }

  // ---- scales and axes -------------------------------------------------------------------
  function linear(d0, d1, r0, r1) {
    var s = function (v) { return r0 + (v - d0) / ((d1 - d0) || 1) * (r1 - r0); };
    s.d0 = d0; s.d1 = d1; s.log = false;
    return s;
  }
  function logScale(d0, d1, r0, r1) {
    var a = Math.log10(d0), b = Math.log10(d1);
    var s = function (v) { return r0 + (Math.log10(v) - a) / ((b - a) || 1) * (r1 - r0); };
    s.d0 = d0; s.d1 = d1; s.log = true;
    return s;
  }
  function niceStep(span, n) {
    var raw = span / Math.max(1, n), p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }
  function niceMax(v) { if (!(v > 0)) return 1; var st = niceStep(v, 5); return Math.ceil(v / st - 1e-9) * st; }
  function ticks(s, n) {
    var out = [];
    if (s.log) {
      for (var e = Math.ceil(Math.log10(s.d0) - 1e-9); e <= Math.floor(Math.log10(s.d1) + 1e-9); e++) out.push(Math.pow(10, e));
      out.step = 0;
      return out;
    }
    var st = niceStep(s.d1 - s.d0 || 1, n);
    for (var v = Math.ceil(s.d0 / st - 1e-9) * st; v <= s.d1 + st * 1e-6; v += st) out.push(Math.abs(v) < st * 1e-6 ? 0 : v);
    out.step = st;
    return out;
  }
  function tickText(v, step) {
    if (step === 0) {  // a power of ten on a log axis
      if (v >= 1e5 || v < 1e-3) return '1e' + Math.round(Math.log10(v));
      return String(+v.toPrecision(1));
    }
    var d = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    return Math.abs(v) >= 1e4 ? (v / 1e3).toFixed(Math.max(0, d - 3)) + 'k' : v.toFixed(d);
  }
  // A plot area inside an svg sized to its box in CSS pixels, so text stays at its font size.
  function plot(svg, height, m) {
    var W = Math.max(460, Math.round(svg.getBoundingClientRect().width || svg.parentNode.clientWidth || 640));
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + height);
    var g = el(svg, 'g', { transform: 'translate(' + m.l + ',' + m.t + ')' });
    return { svg: svg, g: g, W: W, H: height, w: W - m.l - m.r, h: height - m.t - m.b, m: m };
  }
  function axes(p, x, y, o) {
    var g = el(p.g, 'g');
    var yt = ticks(y, o.ny || 5), xt = o.xticks || ticks(x, o.nx || 7);
    yt.forEach(function (v) {
      var py = y(v);
      el(g, 'line', { x1: 0, x2: p.w, y1: py, y2: py, 'class': 'grid' });
      el(g, 'text', { x: -6, y: py + 4, 'class': 'tick', 'text-anchor': 'end' }, o.ytext ? o.ytext(v) : tickText(v, yt.step));
    });
    xt.forEach(function (v) {
      var px = x(v);
      if (o.xgrid) el(g, 'line', { x1: px, x2: px, y1: 0, y2: p.h, 'class': 'grid' });
      el(g, 'line', { x1: px, x2: px, y1: p.h, y2: p.h + 4, 'class': 'axis' });
      el(g, 'text', { x: px, y: p.h + 16, 'class': 'tick', 'text-anchor': 'middle' }, o.xtext ? o.xtext(v) : tickText(v, xt.step));
    });
    el(g, 'line', { x1: 0, x2: p.w, y1: p.h, y2: p.h, 'class': 'axis' });
    el(g, 'line', { x1: 0, x2: 0, y1: 0, y2: p.h, 'class': 'axis' });
    if (o.xlabel) el(g, 'text', { x: p.w / 2, y: p.h + 32, 'text-anchor': 'middle', 'class': 'muted' }, o.xlabel);
    if (o.ylabel) el(g, 'text', { transform: 'translate(' + (-p.m.l + 14) + ',' + p.h / 2 + ') rotate(-90)', 'text-anchor': 'middle', 'class': 'muted' }, o.ylabel);
  }
  // items: [{label, color, line, dash}]; returns the y below the legend.
  function legend(g, items, x, y, maxW) {
    var cx = x, cy = y;
    items.forEach(function (it) {
      var w = 26 + it.label.length * 6.2;
      if (cx > x && cx + w > x + maxW) { cx = x; cy += 16; }
      if (it.line) el(g, 'line', { x1: cx, x2: cx + 16, y1: cy, y2: cy, stroke: it.color, 'stroke-width': 2.5, 'stroke-dasharray': it.dash || null });
      else el(g, 'rect', { x: cx + 2, y: cy - 5, width: 11, height: 11, rx: 2, fill: it.color });
      el(g, 'text', { x: cx + 20, y: cy + 4 }, it.label);
      cx += w;
    });
    return cy + 16;
  }

  // ---- memory anatomy: planned vs allocated vs NVML per run --------------------------------
  function drawMemory(svg) {
    var rows = [], cats = DATA.categories, maxB = 0;
    DATA.runs.forEach(function (r, i) {
      // Gradients inside activation memory: draw only their bytes outside it; the tooltip keeps the full size.
      function segs(src, shared) {
        return cats.filter(function (c) { return ok(src[c]); }).map(function (c) {
          var sh = c === 'gradients' && ok(shared) && shared > 0 ? Math.min(shared, src[c]) : 0;
          return { key: c, bytes: src[c] - sh, full: src[c], shared: sh };
        });
      }
      var nv = null;
      if (ok(r.nvml_mb)) {
        var ctx = ok(r.context_mb) && r.context_mb > 0 ? Math.min(r.context_mb, r.nvml_mb) : 0;
        nv = [{ key: 'context', bytes: ctx * MIB }, { key: 'held', bytes: (r.nvml_mb - ctx) * MIB }];
      }
      rows.push({ run: r, i: i, first: true, kind: 'planned (before the run)', segs: segs(r.planned, r.planned_shared) });
      rows.push({ run: r, i: i, kind: 'allocated (peak per category)', segs: segs(r.allocated, r.allocated_shared) });
      rows.push({ run: r, i: i, kind: 'NVML (device in use)', segs: nv });
    });
    rows.forEach(function (row) {
      row.total = (row.segs || []).reduce(function (a, s) { return a + s.bytes; }, 0);
      maxB = Math.max(maxB, row.total);
    });
    var rowH = 24, gap = 12, legendH = 40;
    var height = legendH + rows.length * rowH + (DATA.runs.length - 1) * gap + 48;
    var p = plot(svg, height, { l: 300, r: 80, t: legendH, b: 44 });
    var x = linear(0, niceMax(maxB / GIB), 0, p.w);
    var y = 0;
    rows.forEach(function (row, k) {
      if (row.first && k > 0) y += gap;
      row.y = y;
      y += rowH;
    });
    var yAxis = linear(0, 1, p.h, p.h);  // only the x axis carries values
    axes(p, x, yAxis, { xgrid: true, xlabel: 'GiB', ny: 1, ytext: function () { return ''; } });
    var items = cats.map(function (c) { return { label: c, color: CAT_COLOR[c] }; });
    items.push({ label: CAT_TITLE.context, color: CAT_COLOR.context }, { label: 'NVML: rest of the process', color: CAT_COLOR.held });
    legend(svg, items, 8, 14, p.W - 16);
    rows.forEach(function (row) {
      var g = el(p.g, 'g'), cy = row.y + rowH / 2;
      if (row.first) el(g, 'text', { x: -p.m.l + 8, y: cy + 4, 'class': 'title', fill: runColor(row.i) }, row.run.label);
      el(g, 'text', { x: -8, y: cy + 4, 'text-anchor': 'end' }, row.kind);
      if (!row.segs || !row.segs.length) {
        el(g, 'text', { x: 6, y: cy + 4, 'class': 'muted' }, row.segs ? 'not recorded' : 'not measured (no NVML on this run)');
        return;
      }
      var acc = 0;
      row.segs.forEach(function (s) {
        if (!(s.bytes > 0)) return;
        var x0 = x(acc / GIB), x1 = x((acc + s.bytes) / GIB);
        var bpp = ok(row.run.params) && row.run.params > 0 ? (s.bytes / row.run.params).toFixed(2) + ' bytes/param' : '';
        tip(mark(el(g, 'rect', { x: x0, y: row.y + 3, width: Math.max(0.5, x1 - x0), height: rowH - 6, fill: CAT_COLOR[s.key] || '#999' })),
            row.run.label + ', ' + row.kind + '\n' + (CAT_TITLE[s.key] || s.key) + ': ' + (s.bytes / GIB).toFixed(3) + ' GiB = ' +
            (s.bytes / MIB).toFixed(1) + ' MiB' + (bpp ? ', ' + bpp : '') +
            (s.shared > 0 ? '\n(of ' + (s.full / MIB).toFixed(1) + ' MiB of gradients, ' + (s.shared / MIB).toFixed(1) +
                            ' MiB are in activation memory backward had finished with)' : ''));
        acc += s.bytes;
      });
      el(g, 'text', { x: x(acc / GIB) + 6, y: cy + 4, 'class': 'muted' }, (acc / GIB).toFixed(2) + ' GiB');
    });
  }

  // ---- memory over one step: stacked steps by category ------------------------------------
  var timelineMax = 0;
  DATA.runs.forEach(function (r) {
    if (!r.timeline) return;
    for (var i = 0; i < r.timeline.label.length; i++) {
      var t = 0;
      DATA.categories.forEach(function (c) { t += r.timeline.bytes[c][i]; });
      timelineMax = Math.max(timelineMax, t);
    }
  });
  function drawTimeline(svg, run) {
    var t = run.timeline, n = t.label.length, cats = DATA.categories;
    var used = cats.filter(function (c) { return t.bytes[c].some(function (b) { return b > 0; }); });
    var p = plot(svg, 330, { l: 58, r: 14, t: 44, b: 42 });
    var x = linear(0, n, 0, p.w), y = linear(0, niceMax(timelineMax / GIB), p.h, 0);
    // Phase bands behind everything.
    var start = 0;
    for (var i = 1; i <= n; i++) {
      if (i === n || t.phase[i] !== t.phase[start]) {
        el(p.g, 'rect', { x: x(start), y: 0, width: x(i) - x(start), height: p.h, fill: PHASE_FILL[t.phase[start]] || '#f3f3f3' });
        if (x(i) - x(start) > 50) el(p.g, 'text', { x: (x(start) + x(i)) / 2, y: 12, 'text-anchor': 'middle', 'class': 'muted' }, t.phase[start] || '?');
        start = i;
      }
    }
    axes(p, x, y, { ylabel: 'GiB live', xlabel: 'op within the step', nx: 8 });
    var lower = new Array(n).fill(0);
    used.forEach(function (c) {
      var upper = lower.map(function (b, i) { return b + t.bytes[c][i]; });
      var d = '';
      for (var i = 0; i < n; i++) d += (i ? 'L' : 'M') + x(i) + ',' + y(upper[i] / GIB) + 'L' + x(i + 1) + ',' + y(upper[i] / GIB);
      for (var j = n - 1; j >= 0; j--) d += 'L' + x(j + 1) + ',' + y(lower[j] / GIB) + 'L' + x(j) + ',' + y(lower[j] / GIB);
      tip(mark(el(p.g, 'path', { d: d + 'Z', fill: CAT_COLOR[c] || '#999', 'fill-opacity': 0.9 })), c);
      lower = upper;
    });
    // One transparent column per op carries its hover text.
    var hover = el(p.g, 'g');
    for (var k = 0; k < n; k++) {
      var lines = [k + ': ' + t.label[k] + ' (' + t.phase[k] + '), ' + (lower[k] / GIB).toFixed(3) + ' GiB live'];
      used.forEach(function (c) { if (t.bytes[c][k] > 0) lines.push('  ' + c + ': ' + (t.bytes[c][k] / MIB).toFixed(1) + ' MiB'); });
      tip(el(hover, 'rect', { x: x(k), y: 0, width: Math.max(0.5, x(k + 1) - x(k)), height: p.h, 'class': 'hover' }), lines.join('\n'));
    }
    legend(svg, used.map(function (c) { return { label: c, color: CAT_COLOR[c] }; }), p.m.l, 14, p.w);
    var peak = 0, at = 0;
    lower.forEach(function (b, i) { if (b > peak) { peak = b; at = i; } });
    el(p.g, 'line', { x1: 0, x2: p.w, y1: y(peak / GIB), y2: y(peak / GIB), stroke: '#333', 'stroke-dasharray': '3 3' });
    var py = y(peak / GIB) < 30 ? y(peak / GIB) + 14 : y(peak / GIB) - 4;  // below the line when the band labels are above it
    el(p.g, 'text', { x: p.w - 4, y: py, 'text-anchor': 'end' }, 'peak ' + (peak / GIB).toFixed(2) + ' GiB after ' + t.label[at]);
  }

  // ---- op classes: share of flops and of runtime -----------------------------------------
  function drawClasses(svg) {
    var rows = [{ label: 'Ivanov et al. 2020 (PyTorch)', classes: DATA.paper, color: '#6b5a2e' }];
    DATA.runs.forEach(function (r, i) {
      if (r.profile && r.profile.classes.length) rows.push({ label: r.label, classes: r.profile.classes, color: runColor(i) });
    });
    var rowH = 28, legendH = 40;
    var p = plot(svg, legendH + 20 + rows.length * rowH + 40, { l: 220, r: 20, t: legendH + 20, b: 40 });
    var gap = 40, pw = (p.w - gap) / 2;
    var seen = {};
    [['flops_pct', 'share of flops (%)'], ['time_pct', 'share of runtime (%)']].forEach(function (panel, k) {
      var g = el(p.g, 'g', { transform: 'translate(' + k * (pw + gap) + ',0)' });
      var x = linear(0, 100, 0, pw);
      el(g, 'text', { x: pw / 2, y: -8, 'text-anchor': 'middle', 'class': 'title' }, panel[1]);
      [0, 25, 50, 75, 100].forEach(function (v) {
        el(g, 'line', { x1: x(v), x2: x(v), y1: 0, y2: rows.length * rowH, 'class': 'grid' });
        el(g, 'text', { x: x(v), y: rows.length * rowH + 16, 'text-anchor': 'middle', 'class': 'tick' }, v + '%');
      });
      rows.forEach(function (row, r) {
        var acc = 0, y0 = r * rowH + 4;
        if (k === 0) el(p.g, 'text', { x: -8, y: y0 + rowH / 2, 'text-anchor': 'end', fill: row.color, 'class': 'title' }, row.label);
        row.classes.forEach(function (c) {
          var v = c[panel[0]];
          if (!ok(v) || v <= 0) return;
          seen[c.cls] = true;
          var x0 = x(acc), x1 = x(Math.min(100, acc + v));
          tip(mark(el(g, 'rect', { x: x0, y: y0, width: Math.max(0.6, x1 - x0), height: rowH - 8, fill: clsColor(c.cls) })),
              row.label + '\n' + (CLS_TITLE[c.cls] || c.cls) + ': ' + v.toFixed(v < 1 ? 3 : 1) + ' % of ' + (k ? 'runtime' : 'flops'));
          if (x1 - x0 > 36) el(g, 'text', { x: (x0 + x1) / 2, y: y0 + rowH / 2, 'text-anchor': 'middle', 'class': 'inbar' }, v.toFixed(v < 10 ? 1 : 0) + '%');
          acc += v;
        });
      });
    });
    var items = DATA.classes.concat(Object.keys(seen).filter(function (c) { return DATA.classes.indexOf(c) < 0; }))
      .filter(function (c) { return seen[c]; }).map(function (c) { return { label: CLS_TITLE[c] || c, color: clsColor(c) }; });
    legend(svg, items, 8, 14, p.W - 16);
  }

  // ---- forward vs backward per run -------------------------------------------------------
  function drawFwdBwd(svg) {
    var parts = [['data_ms', 'data', '#b07aa1'], ['forward_ms', 'forward', '#4e79a7'], ['backward_ms', 'backward', '#e15759'],
                 ['optimizer_ms', 'optimizer', '#59a14f']];
    var rows = DATA.runs.map(function (r, i) { return { r: r, i: i }; }).filter(function (o) { return o.r.profile; });
    var maxMs = 0;
    rows.forEach(function (o) {
      var pr = o.r.profile, sum = 0;
      o.segs = parts.map(function (q) { var v = ok(pr[q[0]]) ? pr[q[0]] : 0; sum += v; return { label: q[1], color: q[2], ms: v }; });
      if (ok(pr.step_ms) && pr.step_ms > sum) o.segs.push({ label: 'other', color: '#bab0ac', ms: pr.step_ms - sum });
      o.total = Math.max(sum, ok(pr.step_ms) ? pr.step_ms : 0);
      maxMs = Math.max(maxMs, o.total);
    });
    var rowH = 30;
    var p = plot(svg, 40 + rows.length * rowH + 44, { l: 220, r: 230, t: 40, b: 44 });
    var x = linear(0, niceMax(maxMs), 0, p.w);
    axes(p, x, linear(0, 1, p.h, p.h), { xgrid: true, xlabel: 'milliseconds per training step', ny: 1, ytext: function () { return ''; } });
    legend(svg, parts.filter(function (q) { return rows.some(function (o) { return o.r.profile[q[0]] > 0; }); })
      .map(function (q) { return { label: q[1], color: q[2] }; }).concat([{ label: 'other (not in an op timer)', color: '#bab0ac' }]), 8, 14, p.W - 16);
    rows.forEach(function (o, k) {
      var y0 = k * rowH + 4, acc = 0, pr = o.r.profile;
      el(p.g, 'text', { x: -8, y: y0 + rowH / 2 + 1, 'text-anchor': 'end', 'class': 'title', fill: runColor(o.i) }, o.r.label);
      o.segs.forEach(function (s) {
        if (!(s.ms > 0)) return;
        tip(mark(el(p.g, 'rect', { x: x(acc), y: y0, width: Math.max(0.5, x(acc + s.ms) - x(acc)), height: rowH - 8, fill: s.color })),
            o.r.label + '\n' + s.label + ': ' + s.ms.toFixed(2) + ' ms (' + (100 * s.ms / o.total).toFixed(1) + '% of the step)');
        if (x(acc + s.ms) - x(acc) > 44) el(p.g, 'text', { x: x(acc + s.ms / 2), y: y0 + rowH / 2 + 1, 'text-anchor': 'middle', 'class': 'inbar' }, s.ms.toFixed(1));
        acc += s.ms;
      });
      var ratio = ok(pr.forward_ms) && pr.forward_ms > 0 && ok(pr.backward_ms) ? (pr.backward_ms / pr.forward_ms).toFixed(2) + '\u00d7' : '\u2014';
      el(p.g, 'text', { x: x(acc) + 8, y: y0 + rowH / 2 + 1 }, 'step ' + fmt(o.total, 1) + ' ms; backward/forward = ' + ratio);
    });
  }

  // ---- roofline --------------------------------------------------------------------------
  function drawRoofline(svg, run) {
    var pr = run.profile, tf = pr.ceil_tflops, gb = pr.ceil_gbps;
    var pts = [], skipped = 0, totalMs = 0;
    pr.ops.forEach(function (o) { totalMs += o.ms; });
    pr.ops.forEach(function (o) {
      if (!(o.flops > 0 && o.bytes > 0 && o.ms > 0)) { skipped++; return; }
      pts.push({ o: o, ai: o.flops / o.bytes, perf: o.flops / (o.ms * 1e-3) / 1e12 });
    });
    var p = plot(svg, 420, { l: 62, r: 18, t: 44, b: 46 });
    var ais = pts.map(function (q) { return q.ai; }), perfs = pts.map(function (q) { return q.perf; });
    var hasRoof = ok(tf) && tf > 0 && ok(gb) && gb > 0;
    if (hasRoof) { ais.push(tf * 1e3 / gb); perfs.push(tf); }
    if (!ais.length) { el(p.g, 'text', { x: 10, y: 20, 'class': 'muted' }, 'no op has flops, bytes and time to place'); return; }
    var xlo = Math.pow(10, Math.floor(Math.log10(Math.min.apply(null, ais) / 1.5)));
    var xhi = Math.pow(10, Math.ceil(Math.log10(Math.max.apply(null, ais) * 1.5)));
    var ylo = Math.pow(10, Math.floor(Math.log10(Math.min.apply(null, perfs) / 1.5)));
    var yhi = Math.pow(10, Math.ceil(Math.log10(Math.max.apply(null, perfs) * 1.5)));
    var x = logScale(xlo, xhi, 0, p.w), y = logScale(ylo, yhi, p.h, 0);
    axes(p, x, y, { xgrid: true, xlabel: 'arithmetic intensity (flop per byte of GPU memory traffic)', ylabel: 'achieved TFLOP/s' });
    if (hasRoof) {
      var ridge = tf * 1e3 / gb, x0 = Math.max(xlo, ylo * 1e3 / gb);
      el(p.g, 'polyline', { points: x(x0) + ',' + y(x0 * gb / 1e3) + ' ' + x(ridge) + ',' + y(tf) + ' ' + x(xhi) + ',' + y(tf),
                            fill: 'none', stroke: '#333', 'stroke-width': 2 });
      el(p.g, 'text', { x: x(xhi) - 4, y: y(tf) - 6, 'text-anchor': 'end' }, 'compute roof ' + tf.toFixed(0) + ' TFLOP/s');
      var lx = Math.max(x0 * 1.5, ridge / 40);
      var angle = Math.atan2(y(lx * 4 * gb / 1e3) - y(lx * gb / 1e3), x(lx * 4) - x(lx)) * 180 / Math.PI;
      el(p.g, 'text', { transform: 'translate(' + x(lx) + ',' + (y(lx * gb / 1e3) - 6) + ') rotate(' + angle + ')' }, 'memory roof ' + gb.toFixed(0) + ' GB/s');
    }
    var seen = {};
    pts.sort(function (a, b) { return b.o.ms - a.o.ms; });  // big dots first, small on top
    pts.forEach(function (q) {
      var o = q.o;
      seen[o.cls] = true;
      tip(mark(el(p.g, 'circle', { cx: x(q.ai), cy: y(q.perf), r: 3 + 11 * Math.sqrt(o.ms / (totalMs || 1)),
                                   fill: clsColor(o.cls), 'fill-opacity': 0.8, stroke: '#fff', 'stroke-width': 1 })),
          o.name + ' (' + (o.phase || '?') + ', ' + (CLS_TITLE[o.cls] || o.cls) + ')\n' + fmt(o.calls, 0) + ' calls, ' +
          o.ms.toFixed(3) + ' ms per step (' + (100 * o.ms / (totalMs || 1)).toFixed(1) + '% of op time)\n' +
          q.ai.toPrecision(3) + ' flop/byte, ' + q.perf.toPrecision(3) + ' TFLOP/s, ' + (o.bytes / (o.ms * 1e-3) / 1e9).toFixed(0) + ' GB/s');
    });
    var order = DATA.classes.concat(Object.keys(seen).filter(function (c) { return DATA.classes.indexOf(c) < 0; }));
    var items = order.filter(function (c) { return seen[c]; }).map(function (c) { return { label: CLS_TITLE[c] || c, color: clsColor(c) }; });
    var below = legend(svg, items, p.m.l, 14, p.w);
    if (skipped) el(svg, 'text', { x: p.W - p.m.r, y: below + 2, 'text-anchor': 'end', 'class': 'muted' }, skipped + ' op(s) with no flops (copies, zeroing) are not drawn');
  }

  // ---- line charts: loss, throughput, NVML -------------------------------------------------
  // series: [{label, color, dash, x: [], y: []}]; hlines: [{y, color, label}]
  function drawLines(svg, series, o) {
    var p = plot(svg, 270, { l: 62, r: 16, t: 40, b: 44 });
    var xs = [], ys = [];
    series.forEach(function (s) { s.x.forEach(function (v, i) { if (ok(v) && ok(s.y[i])) { xs.push(v); ys.push(s.y[i]); } }); });
    (o.hlines || []).forEach(function (h) { ys.push(h.y); });
    if (!xs.length) { el(p.g, 'text', { x: 10, y: 20, 'class': 'muted' }, 'no samples'); return; }
    var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs);
    if (xlo > 0 && xlo < 0.2 * (xhi - xlo)) xlo = 0;  // start at zero when the data nearly do
    var x = linear(xlo, xhi, 0, p.w);
    var y = linear(0, o.ymax || niceMax(Math.max.apply(null, ys) * 1.05), p.h, 0);
    axes(p, x, y, { xlabel: o.xlabel, ylabel: o.ylabel, xgrid: false });
    series.forEach(function (s) {
      var d = '', pen = false, n = 0;
      s.x.forEach(function (v, i) {
        if (!ok(v) || !ok(s.y[i])) { pen = false; return; }
        d += (pen ? 'L' : 'M') + x(v).toFixed(1) + ',' + y(s.y[i]).toFixed(1);
        pen = true; n++;
      });
      if (!n) return;
      tip(mark(el(p.g, 'path', { d: d, fill: 'none', stroke: s.color, 'stroke-width': 2, 'stroke-dasharray': s.dash || null })), s.label);
      if (n <= 80) s.x.forEach(function (v, i) {
        if (!ok(v) || !ok(s.y[i])) return;
        tip(el(p.g, 'circle', { cx: x(v), cy: y(s.y[i]), r: 2.5, fill: s.color }), s.label + ': ' + o.xname + ' ' + +v.toPrecision(6) + ', ' + o.yname + ' ' + +s.y[i].toPrecision(4));
      });
    });
    (o.hlines || []).forEach(function (h) {
      mark(el(p.g, 'line', { x1: 0, x2: p.w, y1: y(h.y), y2: y(h.y), stroke: h.color, 'stroke-dasharray': '6 4', 'stroke-width': 1.5 }));
      el(p.g, 'text', { x: p.w - 4, y: y(h.y) - 5, 'text-anchor': 'end', fill: h.color }, h.label);
    });
    legend(svg, series.map(function (s) { return { label: s.label, color: s.color, line: true, dash: s.dash }; }), p.m.l, 14, p.w);
  }
  function metricSeries(key) {
    return DATA.runs.map(function (r, i) { return r.metrics ? { label: r.label, color: runColor(i), x: r.metrics.step, y: r.metrics[key] } : null; })
      .filter(Boolean);
  }
  function drawLoss(svg) { drawLines(svg, metricSeries('loss'), { xlabel: 'optimizer step', ylabel: 'loss', xname: 'step', yname: 'loss' }); }
  function drawThroughput(svg) {
    var hl = [];
    DATA.runs.forEach(function (r, i) { if (r.metrics && ok(r.steady_sps)) hl.push({ y: r.steady_sps, color: runColor(i), label: r.label + ' steady ' + r.steady_sps.toFixed(1) }); });
    drawLines(svg, metricSeries('sps'), { xlabel: 'optimizer step', ylabel: 'samples/second', xname: 'step', yname: 'samples/s', hlines: hl });
  }
  function nvmlSeries(keys) {
    var out = [];
    DATA.runs.forEach(function (r, i) {
      if (!r.nvml) return;
      keys.forEach(function (k) { out.push({ label: r.label + (k[1] ? ' ' + k[1] : ''), color: runColor(i), dash: k[2], x: r.nvml.t, y: r.nvml[k[0]] }); });
    });
    return out;
  }
  function drawNvmlMemory(svg) {
    drawLines(svg, nvmlSeries([['mem', '', null]]), { xlabel: 'seconds', ylabel: 'MiB in use', xname: 't', yname: 'MiB' });
  }
  function drawNvmlUtil(svg) {
    drawLines(svg, nvmlSeries([['util', 'GPU', null], ['mutil', 'memory', '5 3']]), { xlabel: 'seconds', ylabel: 'utilization %', xname: 't', yname: '%', ymax: 100 });
  }

  function drawNvmlClock(svg) {
    drawLines(svg, nvmlSeries([['clock', '', null]]), { xlabel: 'seconds', ylabel: 'SM clock, MHz', xname: 't', yname: 'MHz' });
  }
  function drawNvmlPower(svg) {
    drawLines(svg, nvmlSeries([['power', '', null]]), { xlabel: 'seconds', ylabel: 'board power, W', xname: 't', yname: 'W' });
  }

  var DRAW = { memory: drawMemory, timeline: drawTimeline, classes: drawClasses, fwdbwd: drawFwdBwd, roofline: drawRoofline,
               loss: drawLoss, throughput: drawThroughput, 'nvml-memory': drawNvmlMemory, 'nvml-util': drawNvmlUtil,
               'nvml-clock': drawNvmlClock, 'nvml-power': drawNvmlPower };
  var charts = document.querySelectorAll('svg.chart'), drawn = 0;
  Array.prototype.forEach.call(charts, function (svg) {
    var kind = svg.getAttribute('data-chart'), ri = svg.getAttribute('data-run');
    try {
      if (!DRAW[kind]) throw new Error('unknown chart kind ' + kind);
      DRAW[kind](svg, ri === null ? null : DATA.runs[+ri]);
      var n = svg.querySelectorAll('.mark').length;
      svg.setAttribute('data-drawn', String(n));
      if (n > 0) drawn++;
    } catch (e) {
      svg.setAttribute('data-drawn', '0');
      window.__anatomyError(kind + ' chart: ' + (e && e.message ? e.message : String(e)));
    }
  });
  if (!window.__anatomyErrors.length) {
    document.body.setAttribute('data-errors', '0');
    var s = document.getElementById('script-status');
    s.setAttribute('data-status', 'ok');
    s.textContent = drawn + ' of ' + charts.length + ' charts drawn; hover bars, areas and dots for exact numbers.';
  }
})();
)JS";

}  // namespace anatomy::report_assets
