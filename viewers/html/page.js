// dlpt's HTML view (viewers/exporters/html.py writes the data). Every name from the profile is
// set as text (textContent, d3's .text), never as markup.
"use strict";
const DATA = JSON.parse(document.getElementById("dlpt-data").textContent);
const $ = (id) => document.getElementById(id);
const el = (tag, text, cls) => {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
};
// A name cell: a path may wrap after each `/`, never inside a file name or a word (the text is
// set in pieces, with <wbr> between them: still text only, and textContent stays the name).
const nameCell = (text) => {
  const td = el("td", null, "name"), parts = String(text).split(/(?<=\/)/);
  parts.forEach((p, i) => { if (i) td.appendChild(document.createElement("wbr")); td.appendChild(document.createTextNode(p)); });
  return td;
};

function fmt(unit, v) {
  const a = Math.abs(v);
  if (unit === "ns") {
    if (a === 0) return "0";
    if (a < 1e3) return v.toFixed(0) + " ns";
    if (a < 1e6) return (v / 1e3).toFixed(1) + " us";
    if (a < 1e9) return (v / 1e6).toFixed(2) + " ms";
    return (v / 1e9).toFixed(2) + " s";
  }
  if (unit === "bytes") {
    let n = v;
    for (const u of ["B", "KiB", "MiB", "GiB"]) {
      if (Math.abs(n) < 1024) return u === "B" ? n.toFixed(0) + " B" : n.toFixed(Math.abs(n) >= 10 ? 0 : 1) + " " + u;
      n /= 1024;
    }
    return n.toFixed(1) + " TiB";
  }
  return Math.round(v).toLocaleString("en-US");
}
const pct = (v, total) => (total ? (100 * v / total).toFixed(1) + "%" : "");

const KIND_COLORS = {
  python: "#f2a65a", module: "#e8c547", op: "#6fa8dc", kernel: "#7bc67b", memcpy: "#b39ddb", memset: "#ce93d8",
  backward: "#e57373", fused: "#4db6ac", thread: "#b0bec5", rank: "#cfd8dc", root: "#eceff1", unattributed: "#bdbdbd",
};

const state = { metric: DATA.metric, view: 0, by: "line", sortKey: "self", sortDesc: true, selected: null, search: "" };
let chart = null;

function unitOf(m) { return (DATA.metrics.find((x) => x.name === m) || { unit: "count" }).unit; }
function view() { return DATA.views[state.view]; }

function showHeader(lines, diag) {
  $("headline").textContent = lines.join("\n");
  $("diagnosis").textContent = (diag || []).join("\n");
  $("foot").textContent = "dlpt " + DATA.version + " · flame graph: d3-flame-graph 4.1.3 (Apache-2.0), charts: d3 7.9.2 (ISC); all inline, nothing fetched";
}

// ---- flame graph ----------------------------------------------------------------------------
function buildTree() {
  const t = view().tree, vals = t.values[state.metric] || [], nodes = new Array(t.parent.length);
  let root = null;
  for (let i = 0; i < t.parent.length; i++) {
    const v = vals[i] || 0;
    if (v <= 0 && i > 0) continue;
    const f = DATA.frames[String(t.frame[i])] || ["", "?", "", 0];
    const n = { n: f[1], v: v, k: f[0], file: f[2], line: f[3], c: [] };
    nodes[i] = n;
    if (t.parent[i] < 0) root = n;
    else if (nodes[t.parent[i]]) nodes[t.parent[i]].c.push(n);
  }
  for (const n of nodes) if (n && n.c.length > 1) n.c.sort((a, b) => b.v - a.v);
  return root;
}

function drawFlame() {
  const box = $("flame");
  box.textContent = "";
  const root = buildTree();
  const t = view().tree, unit = unitOf(state.metric);
  $("flame-note").textContent = state.metric + " (inclusive), biggest first; click a frame to zoom, reset to go back" +
    (t.folded ? " · pruned for drawing: " + t.folded.toLocaleString("en-US") + " of " + t.nodes.toLocaleString("en-US") +
      " nodes, each under " + (100 * t.min_share).toPrecision(2) + "% of every metric, are folded into their callers (the tables hold everything)" : "");
  if (!root || !root.v) { box.appendChild(el("p", "(no " + state.metric + " in this profile)")); chart = null; return; }
  const total = root.v;
  chart = flamegraph()
    .width(Math.max(box.clientWidth, 400)).cellHeight(18).transitionDuration(250).minFrameSize(1)
    .inverted(true).sort(false).selfValue(false)
    .setLabelHandler((d) => d.data.n + "\n" + fmt(unit, d.data.v) + " " + state.metric + " (" + pct(d.data.v, total) + ")" + " · " + d.data.k)
    .setColorMapper((d) => (d.highlight ? "#e600e6" : KIND_COLORS[d.data.k] || "#ddd"))
    .setSearchMatch((d, term) => !!term && (d.data.n || "").toLowerCase().includes(term.toLowerCase()))
    .setSearchHandler((results, sum) => {
      $("found").textContent = state.search ? results.length + " frames match · " + fmt(unit, sum) + " (" + pct(sum, total) + ")" : "";
    })
    .setDetailsHandler((text) => { if (text) $("details").textContent = text.replace("\n", " · "); })
    .onClick((d) => { if (d.data.file) selectSource(d.data.file, d.data.line); });
  d3.select(box).datum(root).call(chart);
  if (state.search) chart.search(state.search);
}

function legend() {
  const box = $("legend");
  const kinds = new Set(Object.values(DATA.frames).map((f) => f[0]));
  for (const k of Object.keys(KIND_COLORS)) {
    if (!kinds.has(k)) continue;
    const s = el("span", k), i = el("i");
    i.style.background = KIND_COLORS[k];
    s.prepend(i);
    box.appendChild(s);
  }
}

// ---- flat table -----------------------------------------------------------------------------
function drawTable() {
  const tab = view().tables[state.by], m = state.metric, unit = unitOf(m);
  const self = tab.self[m] || [], tot = tab.total[m] || [];
  const total = self.reduce((a, b) => a + b, 0);
  let idx = tab.rows.map((_, i) => i).filter((i) => self[i] > 0 || tot[i] > 0);
  const q = state.search.toLowerCase();
  if (q) idx = idx.filter((i) => (tab.rows[i][0] + " " + tab.rows[i][1]).toLowerCase().includes(q));
  const key = state.sortKey, dir = state.sortDesc ? -1 : 1;
  const val = (i) => (key === "self" ? self[i] : key === "total" ? tot[i] : tab.rows[i][0].toLowerCase());
  idx.sort((a, b) => { const x = val(a), y = val(b); return x < y ? -dir : x > y ? dir : a - b; });
  const cols = [["percent", "%"], ["self", "self"], ["total", "total"], ["name", state.by]];
  if (state.by === "line") cols.push(["code", "code"]);
  const head = $("table").tHead;
  head.textContent = "";
  const hr = head.insertRow();
  for (const [k, label] of cols) {
    const th = el("th", label + (state.sortKey === k || (k === "percent" && state.sortKey === "self") ? (state.sortDesc ? " ▼" : " ▲") : ""), k === "name" || k === "code" ? "name" : "");
    th.dataset.key = k === "percent" ? "self" : k;
    th.onclick = () => { const nk = th.dataset.key; state.sortDesc = state.sortKey === nk ? !state.sortDesc : nk !== "name"; state.sortKey = nk; drawTable(); };
    hr.appendChild(th);
  }
  const body = $("table").tBodies[0];
  body.textContent = "";
  for (const i of idx) {
    const r = tab.rows[i], tr = body.insertRow();
    tr.appendChild(el("td", pct(self[i], total)));
    tr.appendChild(el("td", fmt(unit, self[i])));
    tr.appendChild(el("td", fmt(unit, tot[i])));
    const name = nameCell(r[0]);
    if (r[4]) name.title = r[4];
    tr.appendChild(name);
    if (state.by === "line") tr.appendChild(el("td", r[1], "code"));
    if (r[2]) tr.onclick = () => { for (const s of body.querySelectorAll("tr.sel")) s.className = ""; tr.className = "sel"; selectSource(r[2], r[3]); };
  }
  $("table-note").textContent = state.metric + "; self = owned by the " + state.by + ", total = everything beneath it; " +
    idx.length + " of " + tab.groups + " rows" + (tab.groups > idx.length ? " (the top of each metric)" : "");
}

// ---- source pane ----------------------------------------------------------------------------
function selectSource(file, line) {
  state.selected = [file, line];
  const box = $("source");
  box.textContent = "";
  $("source-name").textContent = file + ":" + line;
  const text = DATA.sources[file];
  if (text === undefined) { box.appendChild(el("p", "(the profile holds no text of this file)")); return; }
  const k = DATA.metrics.findIndex((x) => x.name === state.metric), unit = unitOf(state.metric);
  const figs = {};
  let max = 0;
  for (const [ln, self, tot] of view().margin[file] || []) { figs[ln] = [self[k], tot[k], tot]; max = Math.max(max, tot[k]); }
  const lines = text.split("\n");
  const lo = Math.max(1, line - 40), hi = Math.min(lines.length, line + 40);
  let hot = null;
  for (let n = lo; n <= hi; n++) {
    const row = el("div", null, n === line ? "src hot" : "src"), f = figs[n];
    const fig = el("span", f && f[1] ? fmt(unit, f[1]) + (f[0] && f[0] !== f[1] ? " (self " + fmt(unit, f[0]) + ")" : "") : "", "fig");
    if (f && f[1] && max) { const b = el("span", null, "bar"); b.style.width = Math.max(1, Math.round(30 * f[1] / max)) + "px"; fig.prepend(b); }
    row.appendChild(fig);
    if (f) row.appendChild(stallBar(f[2]));
    row.appendChild(el("span", n, "no"));
    row.appendChild(el("span", lines[n - 1]));
    box.appendChild(row);
    if (n === line) hot = row;
  }
  // Scroll the pane only, never the page.
  if (hot) box.parentNode.scrollTop = hot.offsetTop - box.parentNode.offsetTop - box.parentNode.clientHeight / 2;
}

// A line's PC samples by reason (`dlpt record --pc-samples`), as one stacked bar: each part's
// width its share of the line's samples, its name and share in the tooltip. Empty without samples.
const STALL_COLORS = ["#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#1f77b4", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf", "#aec7e8", "#c5b0d5"];
function stallBar(tot) {
  const box = el("span", null, "stalls");
  const at = DATA.metrics.findIndex((x) => x.name === "pc_samples"), n = at >= 0 ? tot[at] : 0;
  if (!n) return box;
  const tips = [];
  DATA.metrics.forEach((x, i) => {
    if (!(x.name === "pc_issued" || x.name.startsWith("stall_")) || !tot[i]) return;
    const seg = el("i");
    seg.style.width = (60 * tot[i] / n).toFixed(1) + "px";
    seg.style.background = STALL_COLORS[tips.length % STALL_COLORS.length];
    seg.dataset.part = x.name;
    box.appendChild(seg);
    tips.push(x.about + " " + (100 * tot[i] / n).toFixed(0) + "%");
  });
  box.title = "PC samples " + n.toLocaleString() + ": " + tips.join(" · ");
  return box;
}

// ---- timeline -------------------------------------------------------------------------------
function drawTimeline() {
  const t = DATA.timeline || {};
  const series = [];
  if (t.t && t.gpu_busy) series.push({ name: "GPU busy", x: t.t, y: t.gpu_busy, unit: "fraction" });
  const mt = t.mem_t || t.t;
  for (const k of ["allocated", "reserved"]) if (mt && t[k]) series.push({ name: "GPU memory " + k, x: mt, y: t[k], unit: "bytes" });
  if (!series.length) return;
  $("timeline-box").hidden = false;
  const box = $("timeline"), W = Math.max(box.clientWidth, 400), H = 100, M = { l: 64, r: 12, t: 8, b: 22 };
  for (const s of series) {
    const n = Math.min(s.x.length, s.y.length);
    if (!n) continue;
    const x0 = s.x[0];
    const pts = Array.from({ length: n }, (_, i) => [(s.x[i] - x0) / 1e9, s.y[i]]);
    const x = d3.scaleLinear().domain(d3.extent(pts, (p) => p[0])).range([M.l, W - M.r]);
    const y = d3.scaleLinear().domain([0, s.unit === "fraction" ? 1 : d3.max(pts, (p) => p[1]) || 1]).nice().range([H - M.b, M.t]);
    const svg = d3.select(box).append("svg").attr("width", W).attr("height", H);
    svg.append("g").attr("class", "axis").attr("transform", "translate(0," + (H - M.b) + ")").call(d3.axisBottom(x).ticks(8).tickFormat((v) => v + " s"));
    svg.append("g").attr("class", "axis").attr("transform", "translate(" + M.l + ",0)")
      .call(d3.axisLeft(y).ticks(4).tickFormat((v) => (s.unit === "fraction" ? Math.round(100 * v) + "%" : fmt("bytes", v))));
    svg.append("path").datum(pts).attr("fill", "none").attr("stroke", s.unit === "fraction" ? "#2e7d32" : "#6a1b9a")
      .attr("stroke-width", 1.2).attr("d", d3.line().x((p) => x(p[0])).y((p) => y(p[1])));
    svg.append("text").attr("x", M.l + 6).attr("y", M.t + 10).attr("font-size", 11).text(s.name);
  }
}

// ---- diff -----------------------------------------------------------------------------------
function drawDiff() {
  const d = DATA.diff, unit = d.unit;
  for (const id of ["flame-box", "lower", "controls"]) $(id).hidden = true;
  $("diff-box").hidden = false;
  showHeader([DATA.title,
    d.metric + ": " + fmt(unit, d.before) + " → " + fmt(unit, d.after) + " (" + (d.delta >= 0 ? "+" : "") + fmt(unit, d.delta) +
    (d.percent === null ? "" : ", " + (d.percent >= 0 ? "+" : "") + d.percent.toFixed(1) + "%") + ")",
    "A: " + d.a.path, "B: " + d.b.path, "rows by " + d.by + "; red got slower, green got faster"], []);
  const max = Math.max(1, ...d.rows.map((r) => Math.abs(r.delta)));
  const tab = $("diff"), hr = tab.tHead.insertRow();
  for (const h of ["change", "", "%", "before", "after", d.by, "code", "matched by"]) hr.appendChild(el("th", h, h === d.by || h === "code" ? "name" : ""));
  for (const r of d.rows) {
    const tr = tab.tBodies[0].insertRow(), cls = r.delta > 0 ? "up" : r.delta < 0 ? "down" : "";
    tr.className = cls;
    tr.appendChild(el("td", (r.delta > 0 ? "+" : "") + fmt(unit, r.delta), cls));
    const b = el("span", null, "bar " + cls), td = el("td");
    b.style.width = Math.round(80 * Math.abs(r.delta) / max) + "px";
    td.appendChild(b);
    tr.appendChild(td);
    tr.appendChild(el("td", r.percent === null ? "new" : (r.percent > 0 ? "+" : "") + r.percent.toFixed(1) + "%", cls));
    tr.appendChild(el("td", fmt(unit, r.before)));
    tr.appendChild(el("td", fmt(unit, r.after)));
    tr.appendChild(nameCell(r.label));
    tr.appendChild(el("td", r.code, "code"));
    tr.appendChild(el("td", r.match));
  }
}

// ---- wiring ---------------------------------------------------------------------------------
function main() {
  if (DATA.kind === "diff") { drawDiff(); return; }
  showHeader(DATA.header, DATA.diagnosis);
  const ms = $("metric");
  for (const m of DATA.metrics) { const o = el("option", m.name); o.title = m.about || ""; ms.appendChild(o); }
  ms.value = state.metric;
  ms.onchange = () => { state.metric = ms.value; drawFlame(); drawTable(); if (state.selected) selectSource(...state.selected); };
  if (DATA.views.length > 1) {
    $("rank-box").hidden = false;
    DATA.views.forEach((v, i) => $("rank").appendChild(el("option", v.label)).setAttribute("value", i));
    $("rank").onchange = () => { state.view = +$("rank").value; drawFlame(); drawTable(); };
  }
  $("by").onchange = () => { state.by = $("by").value; drawTable(); };
  let timer = null;
  $("search").oninput = () => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.search = $("search").value.trim(); if (chart) chart.search(state.search); drawTable(); }, 150);
  };
  $("reset").onclick = () => { if (chart) chart.resetZoom(); };
  legend();
  drawTimeline();
  drawFlame();
  drawTable();
  const first = $("table").tBodies[0].rows[0];
  if (first && first.onclick) first.onclick();
}
main();
document.body.dataset.ready = "1";
