// Shinken panel: the revoke switches, the card buttons and the live denial
// stream. Every POST carries the page's anti-forgery value; the session
// cookie is HttpOnly and never touched here.
"use strict";

const csrf = document.querySelector('meta[name="panel-csrf"]').content;

function showError(msg) {
  const el = document.getElementById("action-error");
  el.textContent = msg;
  el.hidden = false;
}

async function post(path, body) {
  const resp = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Panel-CSRF": csrf },
    body: JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    throw new Error(data.error || resp.status + " " + resp.statusText);
  }
  return data;
}

function wireRevokes() {
  for (const sw of document.querySelectorAll("input.revoke")) {
    sw.addEventListener("change", async () => {
      if (sw.checked) { // a revoked handle never comes back
        sw.checked = false;
        return;
      }
      sw.disabled = true;
      try {
        await post("/api/revoke", { id: sw.dataset.grant });
        location.reload();
      } catch (e) {
        sw.checked = true;
        sw.disabled = false;
        showError("revoke " + sw.dataset.grant + ": " + e.message);
      }
    });
  }
}

function wireCards() {
  for (const b of document.querySelectorAll("button.decide")) {
    b.addEventListener("click", async () => {
      const card = b.closest(".card");
      for (const x of card.querySelectorAll("button")) x.disabled = true;
      try {
        await post("/api/cards/" + encodeURIComponent(b.dataset.card) + "/" + b.dataset.action);
        location.reload();
      } catch (e) {
        for (const x of card.querySelectorAll("button")) x.disabled = false;
        showError(b.dataset.action + " " + b.dataset.card + ": " + e.message);
      }
    });
  }
}

function cell(tr, text, code) {
  const td = document.createElement("td");
  if (code) {
    const c = document.createElement("code");
    c.textContent = text;
    td.appendChild(c);
  } else {
    td.textContent = text;
  }
  tr.appendChild(td);
}

// summarize picks session and reason out of a record's data, as the
// server does for the rows it renders (pages.go).
function summarize(data) {
  const out = { session: "", reason: "", detail: "" };
  if (typeof data !== "object" || data === null) {
    out.detail = JSON.stringify(data);
    return out;
  }
  const rest = [];
  for (const [k, v] of Object.entries(data)) {
    const key = k.toLowerCase();
    const val = typeof v === "object" ? JSON.stringify(v) : String(v);
    if (key === "session") out.session = val;
    else if (key === "reason") out.reason = val;
    else if (key !== "time" && val !== "" && val !== "0") rest.push(key + "=" + val);
  }
  out.detail = rest.sort().join(" ");
  return out;
}

function streamDenials() {
  const body = document.querySelector("#denials tbody");
  const state = document.getElementById("stream-state");
  const es = new EventSource("/events/stream");
  es.onopen = () => { state.textContent = "live"; };
  es.onerror = () => { state.textContent = "reconnecting…"; };
  es.addEventListener("failure", (ev) => { state.textContent = "agent: " + JSON.parse(ev.data); });
  es.addEventListener("record", (ev) => {
    const r = JSON.parse(ev.data);
    const tr = document.createElement("tr");
    tr.className = "fresh";
    cell(tr, new Date(r.time).toISOString().substring(11, 23));
    cell(tr, r.source);
    cell(tr, r.kind);
    const d = summarize(r.data);
    cell(tr, d.session);
    cell(tr, d.reason);
    cell(tr, d.detail, true);
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
  });
}

// The cards and grants pages reload when a card opens or is decided, or a
// grant is issued or revoked, elsewhere (the CLI, another panel, a deadline).
function reloadOnChange() {
  const es = new EventSource("/events/stream?all=1");
  let pending = false;
  es.addEventListener("record", (ev) => {
    const r = JSON.parse(ev.data);
    if (!pending && (r.kind.startsWith("card.") || r.kind.startsWith("grant."))) {
      pending = true; // one reload for a burst
      setTimeout(() => location.reload(), 300);
    }
  });
}

const pageName = document.body.dataset.page;
wireRevokes();
wireCards();
if (pageName === "events") streamDenials();
if (pageName === "cards" || pageName === "grants") reloadOnChange();

// The terminal page: a shell started in the session (POST
// /api/sessions/ID/terminal), its attach stream relayed by the panel over a
// WebSocket (channel-framed as the agent's: 0 stdin, 1 stdout, 2 stderr,
// 3 exit status, 4 resize). A small terminal: text with carriage returns
// and backspaces applied and escape sequences dropped (the shell runs with
// TERM=dumb), keys sent as a terminal sends them.
async function terminal() {
  const pre = document.getElementById("term");
  if (!pre) return;
  const state = document.getElementById("term-state");
  const session = pre.dataset.session;
  const cols = 100, rows = 30;
  let proc;
  try {
    proc = await post("/api/sessions/" + encodeURIComponent(session) + "/terminal", { rows: rows, cols: cols });
  } catch (e) {
    state.textContent = "could not start a shell: " + e.message;
    return;
  }
  const ws = new WebSocket("ws://" + location.host + "/api/sessions/" + encodeURIComponent(session) +
    "/processes/" + encodeURIComponent(proc.id) + "/attach", "v1.attach.shinken");
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder(), dec = new TextDecoder();
  let line = ""; // the current (last) line, edited by \r and \b
  const send = (ch, text) => {
    const b = enc.encode(text), m = new Uint8Array(b.length + 1);
    m[0] = ch;
    m.set(b, 1);
    if (ws.readyState === WebSocket.OPEN) ws.send(m);
  };
  const show = (text) => {
    text = text.replace(/\x1b\[[0-9;?]*[ -\/]*[@-~]/g, "").replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)/g, "").replace(/\x1b[()][0-9A-Za-z]/g, "");
    let done = pre.dataset.done || "";
    for (const c of text) {
      if (c === "\n") { done += line + "\n"; line = ""; }
      else if (c === "\r") { /* the line is rewritten only by what follows a lone \r in full terminals; keep it */ }
      else if (c === "\b") line = line.slice(0, -1);
      else if (c === "\x07") { /* bell */ }
      else line += c;
    }
    pre.dataset.done = done.slice(-200000);
    pre.textContent = pre.dataset.done + line;
    pre.scrollTop = pre.scrollHeight;
  };
  ws.onopen = () => { state.textContent = "connected: process " + proc.id; pre.focus(); };
  ws.onmessage = (ev) => {
    const m = new Uint8Array(ev.data);
    if (m[0] === 1 || m[0] === 2) show(dec.decode(m.subarray(1), { stream: true }));
    if (m[0] === 3) {
      const st = JSON.parse(dec.decode(m.subarray(1)));
      state.textContent = "the shell ended: " + (st.exit_code !== undefined ? "exit " + st.exit_code : "signal " + st.signal);
    }
  };
  ws.onclose = () => { if (!state.textContent.startsWith("the shell")) state.textContent = "disconnected (the shell runs on)"; };
  const keys = { Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A", ArrowDown: "\x1b[B", ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D" };
  pre.addEventListener("keydown", (ev) => {
    let s = null;
    if (ev.ctrlKey && ev.key.length === 1 && /[a-z]/i.test(ev.key)) s = String.fromCharCode(ev.key.toUpperCase().charCodeAt(0) - 64);
    else if (keys[ev.key]) s = keys[ev.key];
    else if (ev.key.length === 1 && !ev.metaKey) s = ev.key;
    if (s !== null) { ev.preventDefault(); send(0, s); }
  });
  pre.addEventListener("paste", (ev) => { ev.preventDefault(); send(0, ev.clipboardData.getData("text")); });
}
if (pageName === "terminal") terminal();
