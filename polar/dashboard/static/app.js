// polar dashboard: plain JS, no build step, no network beyond this server.
"use strict";
const P = (window.__polar = { firstCurveAt: null, lastUpdate: null, updates: 0, marks: { script: performance.now() } });
const COLORS = ["#3b64c4", "#d9534f", "#2e9e5b", "#e39b1f", "#8e44ad", "#16a2b8", "#7f8c8d", "#c0392b"];
const N_POINTS = 1000;
const EVENT_KEYS = ["connector/process_restarts", "connector/copies_restarted", "rollout/restarts",
  "rollout/scale_events", "rollout/target_workers", "rollout/workers"];

const S = {
  runs: [], selected: new Set(), focus: null, tab: "curves", keys: {}, // run -> [keys]
  series: {},          // run -> key -> [[x, y], ...]
  charts: [],          // keys shown on the curves tab
  defaults: {}, fresh: {}, removed: new Set(), sessions: { offset: 0, step: null, total: 0 }, token: "",
};

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const k of kids.flat()) e.append(k instanceof Node ? k : document.createTextNode(k == null ? "" : String(k)));
  return e;
};
const fmt = (v) => v == null ? "" : typeof v === "number" ? (Math.abs(v) >= 1e6 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : Number.isInteger(v) ? String(v) : String(+v.toPrecision(5))) : String(v);
async function api(path, opts) {
  const r = await fetch(path, opts);
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}
const q = (o) => new URLSearchParams(o).toString();
function note(text) { $("#notes").append(el("div", { class: "note" }, text)); }
function clearNotes() { $("#notes").innerHTML = ""; }
function colorOf(rid) { return COLORS[Math.max(0, S.runs.findIndex((r) => r.id === rid)) % COLORS.length]; }

// ---------------------------------------------------------------- runs
function renderRuns() {
  const box = $("#runs");
  box.innerHTML = "";
  if (!S.runs.length) box.append(el("div", { class: "dim" }, "no runs in this folder yet"));
  for (const r of S.runs) {
    const cb = el("input", { type: "checkbox", onclick: (ev) => { ev.stopPropagation(); toggleRun(r.id, ev.target.checked); } });
    cb.checked = S.selected.has(r.id);
    const meta = [`${r.rows} rows`, r.kind || ""];
    if (r.skipped_rows) meta.push(`${r.skipped_rows} corrupt rows skipped`);
    if (r.problem) meta.push(r.problem);
    box.append(el("div", { class: "run" + (S.focus === r.id ? " focus" : ""), "data-run": r.id,
      style: `border-left-color:${colorOf(r.id)}`, onclick: () => focusRun(r.id) },
      cb, " ", el("b", {}, r.name || r.id), " ", el("span", { class: `badge ${r.status}` }, r.status || "?"),
      el("div", { class: "meta" }, r.id + " · " + meta.filter(Boolean).join(" · "))));
  }
}
function toggleRun(rid, on) {
  if (on) S.selected.add(rid); else S.selected.delete(rid);
  renderRuns(); openStream(); refreshCurves();
}
function focusRun(rid) {
  S.focus = rid;
  if (!S.selected.has(rid)) S.selected.add(rid);
  S.sessions = { offset: 0, step: null, total: 0 };
  renderRuns(); openStream(); refreshCurves(); showTab(S.tab);
}

// ---------------------------------------------------------------- curves
const isResource = (k) => k.startsWith("system/") || k.startsWith("time/");
function defaultCharts() {  // the server says which keys are charted by default (polar/dashboard/metrics_index.py)
  const out = [];
  for (const rid of S.selected) for (const k of S.defaults[rid] || []) if (!out.includes(k)) out.push(k);
  return out.slice(0, 16);
}
const keysPending = {};
function loadKeys(rid) {  // keys, the default charts and their curves, in one request
  if (keysPending[rid]) { const p = keysPending[rid]; delete keysPending[rid]; return p; }
  return api("/api/keys?" + q({ run: rid, n: N_POINTS })).then((body) => {
    S.keys[rid] = body.keys;
    S.defaults[rid] = body.defaults;
    S.series[rid] = Object.assign(S.series[rid] || {}, body.curves);
    S.fresh[rid] = new Set(Object.keys(body.curves));
    if (body.skipped) note(`${rid}: ${body.skipped} corrupt lines of metrics.jsonl skipped (e.g. ${body.skipped_examples[0] || ""})`);
    return body.keys;
  });
}
async function refreshCurves() {
  clearNotes();
  const runs = [...S.selected];
  await Promise.all(runs.map((r) => loadKeys(r).catch((e) => note(`${r}: ${e.message}`))));
  P.marks.keys = P.marks.keys || performance.now();
  drawAll();  // the default charts came with the keys
  const all = [...new Set(runs.flatMap((r) => S.keys[r] || []))].sort();
  $("#all-keys").innerHTML = "";
  for (const k of all) $("#all-keys").append(el("option", { value: k }));
  for (const k of defaultCharts()) if (!S.charts.includes(k) && !S.removed.has(k)) S.charts.push(k);
  // the charts in view first (the first paint), then the resources and event counters
  const first = S.tab === "resources" ? all.filter(isResource) : S.charts;
  const rest = [...all.filter(isResource), ...EVENT_KEYS.filter((k) => all.includes(k))].filter((k) => !first.includes(k));
  for (const part of [first, rest]) {
    await Promise.all(runs.map(async (rid) => {
      const keys = part.filter((k) => (S.keys[rid] || []).includes(k) && !(S.fresh[rid] || new Set()).has(k));
      S.series[rid] = S.series[rid] || {};
      if (!keys.length) return;
      try {
        const body = await api("/api/curves?" + q({ run: rid, keys: keys.join(","), n: N_POINTS }));
        Object.assign(S.series[rid], body.curves);
        P.marks.curves = P.marks.curves || performance.now();
      } catch (e) { note(`${rid}: ${e.message}`); }
    }));
    drawAll();
  }
}
function drawAll() {
  renderChartGrid($("#charts"), S.charts, true);
  const sys = [...new Set([...S.selected].flatMap((r) => (S.keys[r] || []).filter(isResource)))].sort();
  renderChartGrid($("#res-charts"), sys, false);
  if (!sys.length) $("#res-charts").append(el("div", { class: "dim" }, "no system/ or time/ metrics in the selected runs (CPU, memory, GPU per process and stage timings are sampled into metrics.jsonl under system/ and time/ when the run records them)"));
}
function renderChartGrid(box, keys, removable) {
  const have = new Map([...box.querySelectorAll(".chart-box")].map((b) => [b.dataset.key, b]));
  for (const [k, b] of have) if (!keys.includes(k)) b.remove();
  for (const k of keys) {
    let b = have.get(k);
    if (!b) {
      const canvas = el("canvas", { class: "chart", "data-key": k });
      b = el("div", { class: "chart-box", "data-key": k },
        el("div", { class: "title" }, k, removable ? el("button", { onclick: () => { S.removed.add(k); S.charts = S.charts.filter((c) => c !== k); drawAll(); } }, "×") : ""),
        canvas, el("div", { class: "legend" }));
      box.append(b);
      attachChartEvents(canvas, k);
    }
    drawChart(b, k);
  }
}
function chartData(key) {
  return [...S.selected].map((rid) => ({ rid, pts: (S.series[rid] || {})[key] || [] })).filter((d) => d.pts.length);
}
function drawChart(box, key) {
  const canvas = box.querySelector("canvas");
  const data = chartData(key);
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 400, h = canvas.clientHeight || 200;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext("2d");
  g.scale(dpr, dpr);
  g.fillStyle = "#fff"; g.fillRect(0, 0, w, h);
  const pad = { l: 52, r: 8, t: 6, b: 22 };
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, n = 0;
  for (const d of data) for (const [x, y] of d.pts) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); n++; }
  canvas.dataset.points = n;
  if (!n) { g.fillStyle = "#7a8194"; g.fillText("no data yet", w / 2 - 25, h / 2); box.querySelector(".legend").textContent = ""; return; }
  if (x1 === x0) { x1 = x0 + 1; }
  if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
  const sx = (x) => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const sy = (y) => h - pad.b - (y - y0) / (y1 - y0) * (h - pad.t - pad.b);
  canvas._scale = { sx, sy, x0, x1, y0, y1, pad, w, h };
  g.strokeStyle = "#eceef3"; g.fillStyle = "#7a8194"; g.font = "10px system-ui"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4, yy = sy(yv);
    g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(w - pad.r, yy); g.stroke(); g.fillText(fmt(yv), 2, yy + 3);
    const xv = x0 + (x1 - x0) * i / 4;
    g.fillText(fmt(xv), Math.min(w - 40, sx(xv) - 10), h - 6);
  }
  let lastX = -Infinity;
  for (const d of data) {
    g.strokeStyle = colorOf(d.rid); g.lineWidth = 1.5; g.beginPath();
    d.pts.forEach(([x, y], i) => { i ? g.lineTo(sx(x), sy(y)) : g.moveTo(sx(x), sy(y)); });
    g.stroke();
    if (d.pts.length === 1) { g.fillStyle = colorOf(d.rid); g.fillRect(sx(d.pts[0][0]) - 2, sy(d.pts[0][1]) - 2, 4, 4); }
    lastX = Math.max(lastX, d.pts[d.pts.length - 1][0]);
  }
  canvas.dataset.lastX = lastX;
  const lg = box.querySelector(".legend"); lg.innerHTML = "";
  for (const d of data) lg.append(el("span", { style: `color:${colorOf(d.rid)}` }, `■ ${d.rid}: ${fmt(d.pts[d.pts.length - 1][1])}`));
  if (P.firstCurveAt === null) P.firstCurveAt = performance.now();
}
function nearest(canvas, key, ev) {
  const s = canvas._scale; if (!s) return null;
  const r = canvas.getBoundingClientRect(), mx = ev.clientX - r.left, my = ev.clientY - r.top;
  let best = null, bd = Infinity;
  for (const d of chartData(key)) for (const [x, y] of d.pts) {
    const dd = Math.abs(s.sx(x) - mx) * 4 + Math.abs(s.sy(y) - my);
    if (dd < bd) { bd = dd; best = { rid: d.rid, x, y }; }
  }
  return best;
}
function attachChartEvents(canvas, key) {
  const tip = $("#tip");
  canvas.addEventListener("mousemove", (ev) => {
    const p = nearest(canvas, key, ev); if (!p) return;
    tip.hidden = false; tip.style.left = ev.clientX + 12 + "px"; tip.style.top = ev.clientY + 12 + "px";
    tip.textContent = `${p.rid} · x ${fmt(p.x)} · ${key} ${fmt(p.y)}`;
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (ev) => { const p = nearest(canvas, key, ev); if (p) openStep(p.rid, p.x); });
}
// the link: a point on a curve opens what was collected at that step
async function openStep(rid, x) {
  const run = S.runs.find((r) => r.id === rid);
  S.focus = rid; renderRuns();
  if (run && run.has_sessions) { S.sessions = { offset: 0, step: x, total: 0 }; showTab("sessions"); }
  else { S.episodeStep = x; showTab("episodes"); }
}

// ---------------------------------------------------------------- live updates (server-sent events)
let source = null, sourceRuns = "";
function openStream() {
  const runs = [...S.selected].sort().join(",");
  if (source && runs === sourceRuns) return;
  if (source) source.close();
  sourceRuns = runs;
  source = new EventSource("/api/stream?" + q({ runs }));
  source.onopen = () => { $("#conn").textContent = "live"; $("#conn").className = "badge live"; };
  source.onerror = () => { $("#conn").textContent = "reconnecting"; $("#conn").className = "badge interrupted"; };
  source.addEventListener("runs", (ev) => { S.runs = JSON.parse(ev.data); renderRuns(); });
  source.addEventListener("metrics", (ev) => {
    const d = JSON.parse(ev.data);
    const ser = (S.series[d.run] = S.series[d.run] || {});
    let newKeys = false, refetch = false;
    for (const [k, pts] of Object.entries(d.points)) {
      if (!(S.keys[d.run] || []).includes(k)) { newKeys = true; continue; }
      if (!ser[k]) continue;
      ser[k].push(...pts);
      if (ser[k].length > 2 * N_POINTS) refetch = true;
    }
    if (newKeys || refetch) { refreshCurves(); } else { drawAll(); }
    P.updates++; P.lastUpdate = { run: d.run, rows: d.rows, at: performance.now(), wall: Date.now(), sent: d.sent };
  });
}

// ---------------------------------------------------------------- sessions and token traces
async function showSessions() {
  const box = $("#sessions-list"); box.innerHTML = "";
  if (!S.focus) { box.append(el("div", { class: "dim" }, "pick a run on the left")); return; }
  const p = { run: S.focus, offset: S.sessions.offset, limit: 100 };
  if (S.sessions.step !== null) p.step = S.sessions.step;
  let body;
  try { body = await api("/api/sessions?" + q(p)); } catch (e) { box.append(el("div", {}, e.message)); return; }
  S.sessions.total = body.total;
  $("#sessions-info").textContent = `${body.total} sessions` + (body.step != null ? ` at step ${body.step}` : "") +
    (body.all !== body.total ? ` (of ${body.all})` : "") + ` · showing ${body.offset + 1}-${body.offset + body.rows.length}`;
  if (body.note) note(body.note);
  const t = el("table", {}, el("tr", {}, ["session", "task", "status", "reward", "step", "calls", "tokens (trainable)", "time s"].map((h) => el("th", {}, h))));
  for (const r of body.rows) {
    t.append(el("tr", { class: "row", "data-session": r.session_id, onclick: (ev) => { t.querySelectorAll(".sel").forEach((x) => x.classList.remove("sel")); ev.currentTarget.classList.add("sel"); openSession(r.session_id); } },
      el("td", {}, r.session_id), el("td", {}, r.task_id || ""), el("td", {}, el("span", { class: `badge ${r.status}` }, r.status)),
      el("td", {}, fmt(r.reward)), el("td", {}, r.step ?? ""), el("td", {}, r.num_calls ?? ""),
      el("td", {}, r.tokens != null ? `${r.tokens} (${r.trainable_tokens})` : ""), el("td", {}, fmt((r.timings || {}).total_s))));
  }
  box.append(t);
  if (!body.rows.length) box.append(el("div", { class: "dim" }, "no sessions recorded in this run (agent runs keep them in sessions/)"));
}
async function openSession(sid) {
  const box = $("#session-detail"); box.innerHTML = "loading…";
  let s;
  try { s = await api("/api/session?" + q({ run: S.focus, id: sid })); } catch (e) { box.textContent = e.message; return; }
  box.innerHTML = "";
  box.append(el("h3", {}, sid));
  const kv = el("table", { class: "kv" });
  for (const k of ["status", "reward", "task_id", "step", "num_calls", "attempts", "error", "output"]) if (s[k] != null) kv.append(el("tr", {}, el("td", {}, k), el("td", {}, fmt(s[k]))));
  kv.append(el("tr", {}, el("td", {}, "timings"), el("td", {}, JSON.stringify(s.timings || {}))));
  kv.append(el("tr", {}, el("td", {}, "verifier"), el("td", {}, JSON.stringify(s.verifier_output || {}))));
  if (s.builder_stats) kv.append(el("tr", {}, el("td", {}, "prefix breaks"), el("td", {}, String(s.builder_stats.prefix_breaks ?? 0))));
  box.append(kv);
  for (const n of s.notes || []) box.append(el("div", { class: "note" }, n));
  if (s.calls && s.calls.length) {
    box.append(el("h3", {}, "calls"));
    const t = el("table", {}, el("tr", {}, ["#", "policy v", "prompt tok", "sampled tok", "finish", "ttft s", "total s"].map((h) => el("th", {}, h))));
    for (const c of s.calls) t.append(el("tr", { "data-call": c.call_index }, el("td", {}, c.call_index), el("td", {}, c.policy_version),
      el("td", {}, c.prompt_tokens), el("td", {}, c.sampled_tokens), el("td", {}, c.finish_reason + (c.complete === false ? " (incomplete)" : "")),
      el("td", {}, fmt((c.timings || {}).ttft_s)), el("td", {}, fmt((c.timings || {}).total_s ?? (c.ended_at - c.started_at)))));
    box.append(t);
  }
  box.append(el("h3", {}, "token trace ", el("span", { class: "dim" }, "(green: sampled by the policy, trained on; hover for logprob, policy version, call)")));
  const trace = el("div", { class: "trace" });
  s.samples.forEach((smp, si) => {
    if (si > 0) trace.append(el("span", { class: "brk" }, `prefix-merge break: chain ${si + 1} starts (its prompt does not extend the previous chain)`));
    let call = null;
    for (let i = 0; i < smp.token_ids.length; i++) {
      if (smp.call_indices[i] !== call) { call = smp.call_indices[i]; trace.append(el("span", { class: "callmark" }, `call ${call}`)); }
      const m = smp.loss_mask[i] === 1, lp = smp.logprobs[i];
      const text = smp.token_text && smp.token_text.length ? smp.token_text[i] : `[${smp.token_ids[i]}]`;
      trace.append(el("span", { class: "tok" + (m ? " trainable" : "") + (m && lp < -2.3 ? " lowlp" : ""),
        title: `id ${smp.token_ids[i]} · logprob ${m ? lp.toFixed(4) : "-"} · policy v${smp.policy_versions[i]} · call ${smp.call_indices[i]}` }, text));
    }
    if (smp.tokens_total > smp.token_ids.length) trace.append(el("span", { class: "brk" }, `${smp.tokens_total - smp.token_ids.length} more tokens not shown`));
  });
  box.append(trace);
  box.append(rateBox("session", sid));
}

// ---------------------------------------------------------------- episodes
async function showEpisodes() {
  const box = $("#episodes-list"); box.innerHTML = "";
  if (!S.focus) { box.append(el("div", { class: "dim" }, "pick a run on the left")); return; }
  const p = { run: S.focus }; if (S.episodeStep != null) p.step = S.episodeStep;
  let body;
  try { body = await api("/api/recordings?" + q(p)); } catch (e) { box.append(el("div", {}, e.message)); return; }
  if (!body.recordings.length) box.append(el("div", { class: "dim" }, "no recorded episodes: record some with `polar eval RUN --record`"));
  for (const rec of body.recordings) {
    box.append(el("h3", {}, `${rec.tag}`, el("span", { class: "dim" }, ` env steps ${rec.env_steps ?? "?"} · ${rec.checkpoint ? rec.checkpoint.split("/").pop() : ""}`)));
    if (rec.problem) box.append(el("div", { class: "note" }, rec.problem));
    const t = el("table", {}, el("tr", {}, ["episode", "seed", "return", "length", "success"].map((h) => el("th", {}, h))));
    for (const e of rec.episodes || []) t.append(el("tr", { class: "row", "data-episode": `${rec.tag}/${e.id}`, onclick: () => openEpisode(rec.tag, e.id) },
      el("td", {}, e.id), el("td", {}, e.seed), el("td", {}, fmt(e.return)), el("td", {}, e.length), el("td", {}, e.success == null ? "" : String(e.success))));
    box.append(t);
  }
  S.episodeStep = null;
}
let player = null;
async function openEpisode(tag, ep) {
  const box = $("#episode-player"); box.innerHTML = "loading…";
  if (player) clearInterval(player.timer);
  let d;
  try { d = await api("/api/episode?" + q({ run: S.focus, tag, ep })); } catch (e) { box.textContent = e.message; return; }
  box.innerHTML = "";
  for (const n of d.notes) box.append(el("div", { class: "note" }, n));
  const view = el("div", { class: "player" });
  const img = el("img", { id: "frame", alt: "frame" }), pre = el("pre", { id: "frame-text" });
  const info = el("div", { id: "frame-info" });
  const slider = el("input", { type: "range", min: 0, max: d.steps.length - 1, value: 0, id: "frame-slider" });
  const btn = el("button", { id: "play" }, "play");
  player = { i: 0, timer: null };
  const returns = []; let acc = 0;
  for (const s of d.steps) { acc += s.reward || 0; returns.push(acc); }
  function show(i) {
    player.i = i; slider.value = i;
    const s = d.steps[i];
    if (s.frame_url) { img.hidden = false; pre.hidden = true; img.src = s.frame_url; } else { img.hidden = true; pre.hidden = false; pre.textContent = s.text || ""; }
    info.textContent = `frame ${i} / ${d.steps.length - 1} · action ${JSON.stringify(s.action)} · reward ${fmt(s.reward)} · return ${fmt(returns[i])}` + (s.terminated ? " · terminated" : "") + (s.truncated ? " · truncated" : "");
    info.dataset.frame = i;
  }
  slider.addEventListener("input", () => show(+slider.value));
  btn.addEventListener("click", () => {
    if (player.timer) { clearInterval(player.timer); player.timer = null; btn.textContent = "play"; return; }
    btn.textContent = "pause";
    player.timer = setInterval(() => { if (player.i >= d.steps.length - 1) { clearInterval(player.timer); player.timer = null; btn.textContent = "play"; return; } show(player.i + 1); }, 120);
  });
  view.append(el("h3", {}, `${tag}/${ep}`), img, pre, el("div", {}, btn, " ", slider), info);
  box.append(view, rateBox("episode", `${tag}/${ep}`));
  show(0);
}

// ---------------------------------------------------------------- ratings
function rateBox(kind, target) {
  const score = el("select", { class: "rate-score" }, [1, 2, 3, 4, 5].map((v) => el("option", { value: v }, v)));
  score.value = 3;
  const comment = el("textarea", { class: "rate-comment", placeholder: "comment (optional)" });
  const status = el("span", { class: "rate-status dim" });
  const save = el("button", { class: "rate-save", onclick: async () => {
    status.textContent = "saving…";
    try {
      const headers = { "content-type": "application/json" };
      if (S.token) headers["x-polar-token"] = S.token;
      const row = await api("/api/ratings?" + q({ run: S.focus }), { method: "POST", headers, body: JSON.stringify({ kind, target, score: +score.value, comment: comment.value }) });
      status.textContent = `saved (${row.id})`; status.dataset.saved = row.id;
    } catch (e) { status.textContent = "not saved: " + e.message; }
  } }, "save rating");
  return el("div", { class: "rate" }, el("b", {}, "rate this " + kind + " "), score, " ", save, " ", status, comment);
}
async function showRatings() {
  const box = $("#ratings"); box.innerHTML = "";
  if (!S.focus) { box.append(el("div", { class: "dim" }, "pick a run on the left")); return; }
  const d = await api("/api/ratings?" + q({ run: S.focus }));
  const a = d.agreement;
  box.append(el("h3", { id: "agreement" }, `ratings vs verifier rewards: ` + (a.rate == null ? `no comparable pairs yet (${a.rated} rated)` : `${(100 * a.rate).toFixed(0)}% agree over ${a.pairs} pairs of the same task (${a.rated} rated)`)));
  if (d.skipped) box.append(el("div", { class: "note" }, `${d.skipped} unreadable lines of ratings.jsonl skipped`));
  const t = el("table", {}, el("tr", {}, ["kind", "target", "task", "score", "reward", "comment", "time"].map((h) => el("th", {}, h))));
  for (const r of d.ratings) t.append(el("tr", {}, el("td", {}, r.kind), el("td", {}, r.target), el("td", {}, r.task_id), el("td", {}, r.score),
    el("td", {}, fmt(r.reward)), el("td", {}, r.comment), el("td", {}, new Date(r.time * 1000).toLocaleString())));
  box.append(t, el("div", { class: "dim" }, "export a preference dataset: polar ratings export RUN --out prefs.jsonl"));
}

// ---------------------------------------------------------------- events, reports, logs
async function showEvents() {
  const box = $("#events"); box.innerHTML = "";
  if (!S.focus) { box.append(el("div", { class: "dim" }, "pick a run on the left")); return; }
  const d = await api("/api/events?" + q({ run: S.focus }));
  const rows = [];
  for (const [k, evs] of Object.entries(d.counters)) for (const e of evs) rows.push([e.x, k, `+${e.delta} (total ${e.value})`]);
  for (const e of d.scale_events) rows.push([e.env_steps ?? e.time ?? "", "scale", JSON.stringify(e)]);
  rows.sort((a, b) => a[0] - b[0]);
  box.append(el("h3", {}, `${rows.length} events`, el("span", { class: "dim" }, " (connector restarts, rollout restarts, scale events)")));
  const t = el("table", {}, el("tr", {}, ["x", "event", "detail"].map((h) => el("th", {}, h))));
  for (const r of rows) t.append(el("tr", { class: "event" }, r.map((c) => el("td", {}, fmt(c)))));
  box.append(t);
  const ev = el("div", { class: "charts" }); box.append(ev);
  renderChartGrid(ev, EVENT_KEYS.filter((k) => (S.keys[S.focus] || []).includes(k)), false);
}
async function showReports() {
  const box = $("#reports-list"); box.innerHTML = "";
  const d = await api("/api/reports");
  if (!d.reports.length) box.append(el("div", { class: "dim" }, "no evaluation reports (report.json) in this folder"));
  const t = el("table", {});
  for (const r of d.reports) t.append(el("tr", { class: "row", onclick: () => openReport(r) }, el("td", {}, r.id), el("td", {}, new Date(r.mtime * 1000).toLocaleString())));
  box.append(t);
}
function tableOf(v) {
  if (Array.isArray(v) && v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) {
    const cols = [...new Set(v.flatMap((x) => Object.keys(x)))];
    return el("table", {}, el("tr", {}, cols.map((c) => el("th", {}, c))), v.map((x) => el("tr", {}, cols.map((c) => el("td", {}, typeof x[c] === "object" ? JSON.stringify(x[c]) : fmt(x[c]))))));
  }
  if (v && typeof v === "object" && !Array.isArray(v)) {
    return el("table", { class: "kv" }, Object.entries(v).map(([k, x]) => el("tr", {}, el("td", {}, k), el("td", {}, typeof x === "object" && x !== null ? tableOf(x) : fmt(x)))));
  }
  return document.createTextNode(fmt(v));
}
async function openReport(r) {
  const box = $("#report"); box.innerHTML = "";
  const d = await api("/api/report?" + q({ id: r.id }));
  box.append(el("h3", {}, r.id), r.html ? el("a", { href: `/files/${r.id}/report.html`, download: "report.html" }, "report.html") : "", " ",
    r.md ? el("a", { href: `/files/${r.id}/report.md`, download: "report.md" }, "report.md") : "");
  if (d.error) box.append(el("div", { class: "note" }, d.error));
  const rep = d.report;
  if (rep && Array.isArray(rep.results)) {  // evaluation suite report (docs/evaluation.md): metric mean [low, high]
    const names = [...new Set(rep.results.flatMap((r) => Object.keys(r.metrics || {})))];
    box.append(el("h3", {}, `suite ${rep.suite || ""}`, el("span", { class: "dim" }, rep.interval ? ` ${rep.interval.method} ${rep.interval.level} intervals` : "")));
    box.append(el("table", { id: "report-table" }, el("tr", {}, ["harness", "policy", "n", ...names, "error"].map((h) => el("th", {}, h))),
      rep.results.map((r) => el("tr", {}, el("td", {}, r.harness), el("td", {}, r.policy), el("td", {}, r.n ?? ""),
        names.map((m) => { const v = (r.metrics || {})[m]; return el("td", {}, v && v.mean != null ? `${fmt(v.mean)} [${fmt(v.low)}, ${fmt(v.high)}]` : ""); }),
        el("td", {}, r.error || "")))));
  } else if (rep != null) box.append(tableOf(rep));
}
async function showLogs() {
  const box = $("#logs"); box.innerHTML = "";
  if (!S.focus) { box.append(el("div", { class: "dim" }, "pick a run on the left")); return; }
  const d = await api("/api/logs?" + q({ run: S.focus, q: $("#log-q").value }));
  if (!d.files.length) { box.append(el("div", { class: "dim" }, "no structured logs (RUN/logs/*.jsonl) in this run")); return; }
  const cols = ["ts", "level", "role", "pid", "trace_id", "msg"];
  const when = (r) => { const t = r.ts ?? r.time; return typeof t === "number" ? new Date(t * 1000).toLocaleTimeString() : ""; };
  box.append(el("div", { class: "dim" }, `${d.rows.length} lines from ${d.files.join(", ")}`));
  box.append(el("table", {}, el("tr", {}, cols.map((c) => el("th", {}, c === "ts" ? "time" : c))), d.rows.map((r) => el("tr", { class: "log" }, cols.map((c) => el("td", {}, c === "ts" ? when(r) : fmt(r[c])))))));
}

// ---------------------------------------------------------------- tabs, start
function showTab(name) {
  S.tab = name;
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((t) => { t.hidden = t.id !== "tab-" + name; });
  const show = { sessions: showSessions, episodes: showEpisodes, ratings: showRatings, events: showEvents, reports: showReports, logs: showLogs }[name];
  if (show) show().catch((e) => note(e.message));
  if (name === "curves" || name === "resources") drawAll();
}
document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
$("#add-key").addEventListener("change", (ev) => { const k = ev.target.value.trim(); if (k && !S.charts.includes(k)) { S.charts.push(k); S.removed.delete(k); refreshCurves(); } ev.target.value = ""; });
$("#sessions-prev").addEventListener("click", () => { S.sessions.offset = Math.max(0, S.sessions.offset - 100); showSessions(); });
$("#sessions-next").addEventListener("click", () => { if (S.sessions.offset + 100 < S.sessions.total) { S.sessions.offset += 100; showSessions(); } });
$("#sessions-all").addEventListener("click", () => { S.sessions = { offset: 0, step: null, total: 0 }; showSessions(); });
$("#log-q").addEventListener("change", () => showLogs());
$("#token").addEventListener("input", (ev) => { S.token = ev.target.value; });
window.addEventListener("resize", () => drawAll());

(async function start() {
  const params = new URLSearchParams(location.search);
  if (params.get("run")) keysPending[params.get("run")] = loadKeys(params.get("run")).catch(() => []);  // meanwhile
  const d = await api("/api/runs");
  P.marks.runs = performance.now();
  $("#root").textContent = d.root;
  $("#token-box").hidden = !d.ratings_token;
  S.runs = d.runs;
  const want = params.get("run");
  const first = want && S.runs.some((r) => r.id === want) ? want : (S.runs[S.runs.length - 1] || {}).id;
  if (first) { S.focus = first; S.selected.add(first); }
  for (const r of (params.get("compare") || "").split(",")) if (S.runs.some((x) => x.id === r)) S.selected.add(r);
  renderRuns(); openStream();
  await refreshCurves();
  const tab = params.get("tab"); if (tab) showTab(tab);
})().catch((e) => note("dashboard failed to start: " + e.message));
