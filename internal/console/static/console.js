// Sandstorm console: reads the master's API with the session cookie (the
// token is never kept here), follows /v1/events for what happens live.
"use strict";

const ROW = 28;            // px, as .row in console.css
const BUCKET = 10e3;       // chart bucket, ms
const SPAN = 5 * 60e3;     // chart span, ms
const SERIES = [["hot", "wakes"], ["frozen", "→ frozen"], ["snapshot", "→ snapshot"], ["detached", "→ detached"]];

const $ = (id) => document.getElementById(id);
// listSeq is the last event the list reflects (the API says so); pending
// holds the tier changes of later events, applied again on top of each new
// list, so that a list fetched while a change happened cannot undo it.
// The chart is drawn from the nodes' own counters, not from events (which
// a slow page can miss): counters is each node's last reading of its
// transitions by tier (GET /v1/nodes' "transitions", the node's
// sandstorm_transitions_total{outcome="ok"}), points the increases seen
// between readings, charted the total of every increase per tier.
const state = { boxes: new Map(), shown: [], listSeq: 0, pending: [], points: [], counters: new Map(), charted: {}, source: null, egress: null };

async function get(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (r.status === 401) throw Object.assign(new Error("unauthorized"), { status: 401 });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

function showLogin(msg) {
  $("app").hidden = true; $("logout").hidden = true; $("login").hidden = false;
  $("login-error").textContent = msg || "";
  $("status").textContent = "not logged in";
  if (state.source) { state.source.close(); state.source = null; }
}

async function login(ev) {
  ev.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";  // gone from the page at once
  const r = await fetch("/v1/session", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }) });
  if (r.status !== 204) { showLogin("That is not the API token."); return; }
  start();
}

async function logout() {
  closeEgress();
  await fetch("/v1/session", { method: "DELETE" });
  showLogin("Logged out.");
}

async function start() {
  try {
    await refreshNodes();
  } catch (e) {
    if (e.status === 401) { showLogin(); return; }
    $("status").textContent = String(e);
    return;
  }
  $("login").hidden = true; $("app").hidden = false; $("logout").hidden = false;
  await refreshList();
  follow();
}

// --- nodes ---------------------------------------------------------------
async function refreshNodes() {
  const nodes = (await get("/v1/nodes")).items || [];
  const box = $("nodes");
  box.replaceChildren(...nodes.map(nodeCard));
  sample(nodes, Date.now());
}

// sample takes each node's counters and adds what they rose by since the
// last reading to the chart, as a rate over counters does: a counter
// lower than before means the node restarted (counted from 0 again), so
// all of it is new. A node's first reading is only its starting point,
// and a lost node (no counters) keeps its last one.
function sample(nodes, at) {
  for (const n of nodes) {
    const cur = n.transitions;
    if (!cur) continue;
    const prev = state.counters.get(n.name);
    state.counters.set(n.name, cur);
    if (!prev) continue;
    for (const [k] of SERIES) {
      const c = cur[k] || 0, p = prev[k] || 0;
      const d = c >= p ? c - p : c;
      if (d > 0) {
        state.points.push({ series: k, at, n: d });
        state.charted[k] = (state.charted[k] || 0) + d;
      }
    }
  }
}

function nodeCard(n) {
  const el = document.createElement("div");
  el.className = "card"; el.dataset.node = n.name;
  const avail = n.mem_available_mib, reserve = n.mem_reserve_mib;
  const head = Math.max(0, avail - reserve);
  const total = Math.max(avail, 1);
  const pool = Object.values(n.warm_pool || {}).reduce((a, b) => a + b, 0);
  const t = n.sandboxes || {};
  el.innerHTML = "";
  const name = document.createElement("div"); name.className = "name";
  if (n.state === "lost") {
    el.classList.add("lost");
    name.textContent = n.name + " · lost";
    const why = document.createElement("div"); why.className = "error"; why.textContent = n.error || "does not answer";
    el.append(name, why);
    return el;
  }
  name.textContent = n.name + " · " + n.backend + (n.address ? " · " + n.address : "") + (n.reconciling ? " · repairing " + n.reconciling : "");
  if (n.draining) {
    // node drain: it takes no new sandboxes; drained once none is left.
    const left = ["hot", "frozen", "snapshot", "detached"].reduce((a, k) => a + ((n.sandboxes || {})[k] || 0), 0);
    name.textContent += left ? " · draining" : " · drained";
  }
  const mem = document.createElement("div"); mem.className = "headroom";
  mem.textContent = `headroom ${head} MiB (available ${avail}, reserve ${reserve})`;
  const bar = document.createElement("div"); bar.className = "bar";
  const fill = document.createElement("div"); fill.style.width = Math.round(100 * head / total) + "%"; bar.append(fill);
  const tiers = document.createElement("div"); tiers.className = "tiers";
  for (const k of ["hot", "frozen", "snapshot", "detached"]) {
    const s = document.createElement("span"); s.className = "t-" + k; s.textContent = `${k} ${t[k] || 0}`; tiers.append(s);
  }
  if (pool) { const s = document.createElement("span"); s.textContent = `warm pool ${pool}`; tiers.append(s); }
  el.append(name, mem, bar, tiers);
  return el;
}

// --- sandboxes -----------------------------------------------------------
async function refreshList() {
  const r = await fetch("/v1/sandboxes", { headers: { Accept: "application/json" } });
  if (r.status === 401) throw Object.assign(new Error("unauthorized"), { status: 401 });
  if (!r.ok) throw new Error("/v1/sandboxes: HTTP " + r.status);
  const seq = Number(r.headers.get("X-Sandstorm-Event-Seq") || 0);
  const items = (await r.json()).items || [];
  state.boxes = new Map(items.map((s) => [s.id, s]));
  state.listSeq = seq; // a restarted master numbers from 0 again
  state.pending = state.pending.filter((p) => p.seq > state.listSeq);
  for (const p of state.pending) apply(p);
  render();
}

let listTimer = null;
function refreshListSoon() {
  if (listTimer) return;
  listTimer = setTimeout(() => { listTimer = null; refreshList().catch(() => {}); }, 300);
}

// labels is a sandbox's labels as "key=value" words (the API's labels,
// the E2B API's metadata): shown in its row and searched.
function labels(s) {
  return Object.entries(s.labels || {}).sort().map(([k, v]) => `${k}=${v}`).join(" ");
}

function matches(s, q) {
  if (!q) return true;
  return [s.name, s.id, s.tier, s.template, s.node, s.note || "", labels(s), s.team || ""].some((v) => (v || "").toLowerCase().includes(q));
}

function render() {
  const q = $("search").value.trim().toLowerCase();
  state.shown = [...state.boxes.values()].filter((s) => matches(s, q)).sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  $("count").textContent = `(${state.shown.length}${q ? " of " + state.boxes.size : ""})`;
  $("spacer").style.height = state.shown.length * ROW + "px";
  draw();
}

// Only the rows in view are in the page: thousands of sandboxes cost a
// screenful of elements.
function draw() {
  const vp = $("viewport");
  const first = Math.max(0, Math.floor(vp.scrollTop / ROW) - 5);
  const last = Math.min(state.shown.length, first + Math.ceil(vp.clientHeight / ROW) + 10);
  const rows = $("rows");
  rows.style.transform = `translateY(${first * ROW}px)`;
  const out = [];
  for (let i = first; i < last; i++) out.push(row(state.shown[i]));
  rows.replaceChildren(...out);
}

function cell(text, cls) {
  const s = document.createElement("span");
  s.textContent = text; if (cls) s.className = cls; s.title = text;
  return s;
}

function row(s) {
  const el = document.createElement("div");
  el.className = "row"; el.dataset.id = s.id;
  const wake = s.last_wake_ms ? `${s.last_wake_ms.toFixed(1)} ms${s.last_wake_from ? " from " + s.last_wake_from : ""}` : "";
  // A paused sandbox says so: it waits for a resume, not for traffic.
  const tier = s.transition ? `${s.tier} → ${s.transition}` : s.paused ? `${s.tier} ⏸ paused` : s.tier;
  el.append(cell(s.name, "name"), cell(s.id), cell(tier, "tier t-" + s.tier + (s.paused ? " paused" : "")),
    cell(s.template), cell(s.node), cell(wake), cell([labels(s), s.note || ""].filter(Boolean).join(" · ")));
  return el;
}

// --- live ----------------------------------------------------------------
function follow() {
  if (state.source) state.source.close();
  const es = new EventSource("/v1/events");
  state.source = es;
  es.onopen = () => { $("status").textContent = "live"; refreshListSoon(); };
  es.onerror = () => {
    $("status").textContent = "reconnecting…";
    // A stream refused for its session means the session is gone.
    get("/v1/nodes").catch((e) => { if (e.status === 401) showLogin("Your session ended; log in again."); });
  };
  const on = (kind, f) => es.addEventListener(kind, (m) => f(JSON.parse(m.data)));
  on("transition", (e) => update(e, e.to));
  on("wake", (e) => { update(e, "hot", e); recent(e); });
  on("refusal", (e) => recent(e));
  on("create", () => refreshListSoon());
  on("delete", (e) => { if (e.seq > state.listSeq && state.boxes.delete(e.id)) render(); });
}

// --- egress --------------------------------------------------------------
// A sandbox's egress log, followed (GET /v1/sandboxes/{id}/egress?follow=1:
// JSON lines, each a page of flows), newest first, until closed or another
// sandbox is picked. A last page with "end": "gone" says the sandbox left
// its node; a stream that stops without it was cut (a reload), and is
// asked again after the last page's next, a second later.
async function showEgress(id) {
  if (state.egress) state.egress.abort();
  const ctl = new AbortController();
  state.egress = ctl;
  const s = state.boxes.get(id);
  $("egress-name").textContent = s ? s.name : id;
  $("egress-list").replaceChildren();
  $("egress").hidden = false;
  const note = (text) => $("egress-list").prepend(Object.assign(document.createElement("li"), { className: "refused", textContent: text }));
  let after = 0;
  try {
    for (;;) {
      const end = await followEgress(id, after, ctl.signal, (next) => { after = next; });
      if (end === "gone") {
        note("the sandbox has left its node (deleted, or moved: its log starts again there)");
        return;
      }
      await new Promise((r) => setTimeout(r, 1000));
      if (ctl.signal.aborted) return;
    }
  } catch (e) {
    if (e.name !== "AbortError") note("egress log: " + e.message);
  }
}

// followEgress reads one followed stream of id's egress log after seq
// after, each page's flows shown and its next given to seen; it returns
// the last page's end ("" when the stream was cut).
async function followEgress(id, after, signal, seen) {
  const r = await fetch(`/v1/sandboxes/${encodeURIComponent(id)}/egress?follow=1&after=${after}`, { signal });
  if (!r.ok) throw new Error("HTTP " + r.status);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return "";
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const page = JSON.parse(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
      page.items.forEach(addFlow);
      seen(page.next);
      if (page.end) return page.end;
    }
  }
}

function addFlow(f) {
  const li = document.createElement("li");
  li.className = f.outcome;
  const where = f.addr ? ` (${f.addr})` : "";
  const bytes = f.outcome === "allowed" ? ` ↑${f.bytes_out} ↓${f.bytes_in} B` : "";
  // A name the DNS refused has no port (route "dns"): no flow followed.
  const dest = f.port ? `${f.name}:${f.port}` : `${f.name} (DNS)`;
  const secrets = f.secrets && f.secrets.length ? ` · secrets: ${f.secrets.join(", ")}` : "";
  li.textContent = `${new Date(f.time).toLocaleTimeString()} ${f.outcome} ${dest}${where}${bytes} — ${f.rule}${secrets}`;
  const list = $("egress-list");
  list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}

function closeEgress() {
  if (state.egress) state.egress.abort();
  state.egress = null;
  $("egress").hidden = true;
}

function update(e, tier, wake) {
  if (e.seq <= state.listSeq) return; // the list already has it
  const p = { seq: e.seq, id: e.id, tier, wake };
  state.pending.push(p);
  if (state.pending.length > 5000) state.pending.shift();
  apply(p);
  render();
}

function apply(p) {
  const s = state.boxes.get(p.id);
  if (!s) return;
  s.tier = p.tier; s.transition = "";
  if (p.wake) { s.last_wake_ms = p.wake.ms; s.last_wake_from = p.wake.from; }
}

function nameOf(e) {
  const s = state.boxes.get(e.id);
  return s ? s.name : (e.name || e.id || "");
}

function recent(e) {
  const li = document.createElement("li");
  const t = new Date(e.at).toLocaleTimeString();
  if (e.kind === "wake") {
    li.className = "wake";
    li.textContent = `${t} woke ${nameOf(e)} from ${e.from} in ${e.ms.toFixed(1)} ms`;
  } else {
    li.className = "refusal";
    li.textContent = `${t} refused ${nameOf(e)}: ${e.reason}`;
  }
  const list = $("recent");
  list.prepend(li);
  while (list.children.length > 100) list.lastChild.remove();
}

function chart() {
  const c = $("chart"), g = c.getContext("2d");
  const now = Date.now(), n = SPAN / BUCKET;
  state.points = state.points.filter((p) => now - p.at < SPAN);
  const counts = Object.fromEntries(SERIES.map(([k]) => [k, new Array(n).fill(0)]));
  for (const p of state.points) {
    const i = n - 1 - Math.floor((now - p.at) / BUCKET);
    if (i >= 0 && counts[p.series]) counts[p.series][i] += p.n;
  }
  const max = Math.max(1, ...Object.values(counts).flat());
  g.clearRect(0, 0, c.width, c.height);
  const css = getComputedStyle(document.documentElement);
  g.fillStyle = "#868e96"; g.font = "11px sans-serif"; g.fillText(String(max), 4, 12); g.fillText("0", 4, c.height - 4);
  // Grouped bars, one per series in each bucket: two series with the
  // same count in the same bucket stay both visible (lines would overlap).
  const w = (c.width - 30) / n, bw = Math.max(1, w / SERIES.length - 1);
  SERIES.forEach(([k], j) => {
    g.fillStyle = css.getPropertyValue("--" + k).trim();
    counts[k].forEach((v, i) => {
      if (!v) return;
      const h = v * (c.height - 24) / max;
      g.fillRect(24 + i * w + j * (bw + 1), c.height - 8 - h, bw, h);
    });
  });
  g.fillStyle = "#dee2e6"; g.fillRect(24, c.height - 8, c.width - 30, 1);
}

function legend() {
  $("legend").replaceChildren(...SERIES.map(([k, label]) => {
    const s = document.createElement("span"); s.className = "t-" + k; s.textContent = "— " + label; return s;
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  $("search").addEventListener("input", render);
  $("viewport").addEventListener("scroll", draw, { passive: true });
  $("rows").addEventListener("click", (ev) => { const r = ev.target.closest(".row"); if (r) showEgress(r.dataset.id); });
  $("egress-close").addEventListener("click", closeEgress);
  legend();
  setInterval(chart, 1000);
  // Every 2 s: the nodes' headroom, and their counters for the chart.
  setInterval(() => { if (!$("app").hidden) refreshNodes().catch(() => {}); }, 2000);
  setInterval(() => { if (!$("app").hidden) refreshList().catch(() => {}); }, 30000);
  start();
});
