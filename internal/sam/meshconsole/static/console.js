// SAM mesh console: reads GET /v1/console with the session cookie (the
// admin token is never kept here) every 2 s.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { timer: null, last: null };

function showLogin(msg) {
  $("app").hidden = true; $("logout").hidden = true; $("login").hidden = false;
  $("login-error").textContent = msg || "";
  $("status").textContent = "not logged in";
  if (state.timer) { clearInterval(state.timer); state.timer = null; }
}

async function login(ev) {
  ev.preventDefault();
  const token = $("token").value.trim();
  $("token").value = "";  // gone from the page at once
  const r = await fetch("/v1/session", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }) });
  if (r.status !== 204) { showLogin("That is not the admin token."); return; }
  start();
}

async function logout() {
  await fetch("/v1/session", { method: "DELETE" });
  showLogin("Logged out.");
}

async function refresh() {
  const r = await fetch("/v1/console", { headers: { Accept: "application/json" } });
  if (r.status === 401) { showLogin(); return false; }
  if (!r.ok) { $("status").textContent = "HTTP " + r.status; return true; }
  render(await r.json());
  $("status").textContent = "live";
  return true;
}

async function start() {
  try {
    if (!(await refresh())) return;
  } catch (e) { $("status").textContent = String(e); return; }
  $("login").hidden = true; $("app").hidden = false; $("logout").hidden = false;
  if (!state.timer) state.timer = setInterval(() => refresh().catch((e) => { $("status").textContent = "unreachable: " + e; }), 2000);
}

function td(text, cls) {
  const el = document.createElement("td");
  if (cls) el.className = cls;
  el.textContent = text;
  return el;
}

function chips(list, cls) {
  const el = document.createElement("td");
  if (!list || list.length === 0) { el.textContent = "—"; el.className = "off"; return el; }
  for (const x of list) {
    const c = document.createElement("span"); c.className = "chip" + (cls ? " " + cls : ""); c.textContent = x;
    el.append(c);
  }
  return el;
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

function until(iso) {
  if (!iso) return "— (none issued since start)";
  const s = Math.round((new Date(iso) - Date.now()) / 1000);
  const rel = s >= 0 ? "in " + (s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : s + " s") : "expired";
  return when(iso) + " (" + rel + ")";
}

// matches says whether a row's words contain the search, as the master
// console's search does: any of them, case aside.
function matches(words, q) {
  return !q || words.some((w) => String(w || "").toLowerCase().includes(q));
}

function render(s) {
  state.last = s;
  const q = $("search").value.trim().toLowerCase();
  const rt = s.router || {};
  $("router").textContent = rt.peer_id ? "router (member " + rt.member + "): " + rt.peer_id : "";

  const members = s.members || [];
  const shownMembers = members.filter((m) => matches([m.name, m.peer_id], q));
  $("member-count").textContent = "(" + (q ? shownMembers.length + " of " : "") + members.length + ")";
  $("members").replaceChildren(...shownMembers.map((m) => {
    const tr = document.createElement("tr");
    tr.dataset.member = m.name;
    if (m.revoked_at) tr.className = "revoked";
    const conn = m.name === rt.member ? td("this router", "on conn")
      : td(m.connected ? "connected" : "not connected", m.connected ? "on conn" : "off conn");
    tr.append(td(m.name, "name"), conn, td(when(m.enrolled_at)), td(until(m.credential_expires), "exp"),
      td(m.revoked_at ? "revoked " + when(m.revoked_at) : "no", "rev"), td(m.peer_id, "mono"));
    return tr;
  }));

  const p = s.policy || {};
  $("policy").textContent = p.version ? "(policy version " + p.version + ", set " + when(p.set_at) + ")" : "(no policy set: nothing is granted)";
  $("policy-error").textContent = p.error || "";
  const principals = (p.principals || []).filter((pr) => matches([pr.name, ...(pr.roles || []), ...(pr.services || []), ...(pr.egress || []), ...(pr.egress_private || [])], q));
  $("principals").replaceChildren(...principals.map((pr) => {
    const tr = document.createElement("tr");
    tr.dataset.principal = pr.name;
    const eg = (pr.egress || []).concat((pr.egress_private || []).map((x) => "private " + x));
    tr.append(td(pr.name, "name"), chips(pr.roles), chips(pr.services), chips(eg, "egress"));
    return tr;
  }));

  // A router refusal names a peer ID: a member's, if it is one.
  const byPeer = new Map(members.map((m) => [m.peer_id, m.name]));
  const ars = s.agent_refusals || [];
  const shownAgents = ars.filter((r) => matches([r.member, r.principal, r.by, r.what, r.target, r.reason, r.from], q));
  $("agent-refusal-count").textContent = "(" + (q ? shownAgents.length + " of " : "") + ars.length + " rows, newest first)";
  $("agent-refusals").replaceChildren(...shownAgents.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.agentMember = r.member;
    tr.dataset.agent = r.principal;
    // A call from another member was refused by this member's policy.
    const principal = r.from ? r.principal + " (of " + r.from + ")" : r.principal;
    tr.append(td(when(r.last)), td(r.member, "member"), td(principal, "principal"), td(r.by, "by"), td(r.what, "what"),
      td(r.target, "target mono"), td(r.reason, "why"), td(Number(r.count).toLocaleString(), "count"), td(when(r.first)));
    return tr;
  }));
  const dropped = members.filter((m) => m.refusals_dropped > 0).map((m) => m.name + " " + Number(m.refusals_dropped).toLocaleString());
  $("agent-dropped").textContent = dropped.length ? "Counted but not itemised (a member's table was full, or the oldest rows went): " + dropped.join(", ") : "";

  const rs = (s.refusals || []).filter((r) => matches([r.by, r.what, r.who, byPeer.get(r.who), r.reason], q));
  $("refusal-count").textContent = "(" + rs.length + ", newest first)";
  $("refusals").replaceChildren(...rs.map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.seq = r.seq;
    tr.append(td(when(r.at)), td(r.by), td(r.what), td(byPeer.has(r.who) ? byPeer.get(r.who) + " · " + r.who : (r.who || "—"), "mono"), td(r.reason, "why"));
    return tr;
  }));
}

$("login-form").addEventListener("submit", login);
$("search").addEventListener("input", () => { if (state.last) render(state.last); });
$("logout").addEventListener("click", logout);
start();
