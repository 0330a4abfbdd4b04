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
