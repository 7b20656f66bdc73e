// The headrace console: reads the JSON API of the HTTP port every REFRESH_MS
// and tails a stream over RS-IO on /rsio (docs/console.md). Everything shown
// is set with textContent: names and events are never parsed as HTML.
"use strict";

const REFRESH_MS = 2000;       // how often the tables are read again
const MAX_TAIL_LINES = 200;    // events the tail keeps on screen
const MAX_TAIL_CHARS = 500;    // characters of one event shown
const TAIL_DEMAND = 64;        // events asked for at once (RS-IO request-n)
const AUTH_EXTENSION = 2;      // RS-IO's auth extension (rsio.md, the auth extension)

let authorization = null;      // "Basic ..." while logged in; kept in memory only
let admin = false;
let previous = new Map();      // stream -> {t, events, bytes}: for the rates
let tail = null;

const $ = (id) => document.getElementById(id);

function show(message, error) {
  $("message").textContent = message || "";
  $("message").className = error ? "error" : "";
}

async function api(path, method) {
  const headers = { "X-Headrace-Console": "1" };
  if (authorization) headers["Authorization"] = authorization;
  const response = await fetch(path, { method: method || "GET", headers, cache: "no-store" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (response.status === 401) {
    authorization = null;
    $("login").hidden = false;
    $("who").hidden = true;
    throw new Error(body.error || "log in");
  }
  if (!response.ok && response.status !== 503) throw new Error(body.error || response.statusText);
  return body;
}

function cell(row, text, field, numeric) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "—" : String(text);
  if (field) td.dataset.field = field;
  if (numeric) td.className = "num";
  return td;
}

function fill(table, items, draw) {
  const body = $(table).tBodies[0];
  const rows = items.map((item) => {
    const row = document.createElement("tr");
    draw(row, item);
    return row;
  });
  body.replaceChildren(...rows);
}

function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + (s % 60) + "s";
}

function drawHealth(health) {
  const ok = health.status === "ok";
  $("status").textContent = health.status;
  $("status").className = "badge " + (ok ? "ok" : "bad");
  $("version").textContent = health.version ? "v" + health.version : "";
  $("store").textContent = health.store;
  $("uptime").textContent = health.started_s ? duration(Date.now() / 1000 - health.started_s) : "—";
  $("auth").textContent = health.auth ? "on" + (health.user ? ", " + health.user + (health.admin ? " (admin)" : "") : "") : "off (read-only)";
  if (health.cluster) $("cluster").textContent = JSON.stringify(health.cluster);
  admin = Boolean(health.admin);
  if (health.user) {
    $("login").hidden = true;
    $("who").hidden = false;
    $("who-name").textContent = health.user + (admin ? " (admin)" : "");
  } else {
    $("who").hidden = true;
    $("login").hidden = !health.auth;  // auth on, and this listener trusts the unidentified
  }
}

function drawConnections(answer) {
  fill("connections", answer.doors, (row, door) => {
    row.dataset.door = door.door;
    cell(row, door.door);
    cell(row, door.port, "port", true);
    cell(row, door.up ? "yes" : "no", "up");
    cell(row, door.open, "open", true);
    cell(row, door.accepted, "accepted", true);
    cell(row, door.requests, "requests", true);
    cell(row, door.received_bytes, "received_bytes", true);
    cell(row, door.sent_bytes, "sent_bytes", true);
  });
}

function drawStreams(answer) {
  const now = performance.now() / 1000;
  const seen = new Map();
  fill("streams", answer.streams, (row, s) => {
    row.dataset.stream = s.name;
    cell(row, s.name, "name");
    cell(row, s.sealed ? "sealed" : "open", "state");
    cell(row, s.segments, "segments", true);
    cell(row, s.bytes, "bytes", true);
    cell(row, s.events === null ? 0 : s.events, "events", true);
    const before = previous.get(s.name);
    const events = s.events || 0, bytes = s.appended_bytes || 0;
    let eventRate = null, byteRate = null;
    if (before && now > before.t) {
      eventRate = ((events - before.events) / (now - before.t)).toFixed(1);
      byteRate = ((bytes - before.bytes) / (now - before.t)).toFixed(0);
    }
    cell(row, eventRate, "event_rate", true);
    cell(row, byteRate, "byte_rate", true);
    const action = row.insertCell();
    if (admin && !s.sealed) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Seal";
      button.addEventListener("click", () => seal(s.name));
      action.append(button);
    }
    seen.set(s.name, { t: now, events, bytes });
  });
  previous = seen;
  $("streams-note").textContent = answer.truncated ? "The first " + answer.limit + " streams are shown." : "";
  const select = $("tail-stream");
  const chosen = select.value;
  const names = answer.streams.map((s) => s.name);
  if (names.join("\n") !== Array.from(select.options, (o) => o.value).join("\n")) {
    select.replaceChildren(...names.map((name) => new Option(name, name)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

function drawGroups(answer) {
  fill("groups", answer.groups, (row, g) => {
    row.dataset.group = g.name;
    cell(row, g.name, "name");
    cell(row, g.streams.join(", "), "streams");
    cell(row, g.readers.length, "readers", true);
    cell(row, g.segments.length, "segments", true);
    const lag = cell(row, g.known ? g.lag : null, "lag", true);
    lag.title = g.segments.map((s) => s.segment + ": " + s.lag).join("\n");
  });
}

async function refresh() {
  try {
    const health = await api("/api/health");
    drawHealth(health);
    const [connections, streams, groups] = await Promise.all([
      api("/api/connections"), api("/api/streams"), api("/api/groups"),
    ]);
    drawConnections(connections);
    drawStreams(streams);
    drawGroups(groups);
    show("Updated " + new Date().toLocaleTimeString());
    document.body.dataset.loaded = "1";
  } catch (error) {
    show(error.message, true);
    if (!authorization) {
      // Not logged in: /health is public, so the badge still says how the node is.
      fetch("/health").then((r) => r.json()).then((h) => {
        $("status").textContent = h.status;
        $("status").className = "badge " + (h.status === "ok" ? "ok" : "bad");
      }).catch(() => {});
    }
  }
}

async function seal(name) {
  if (!confirm("Seal " + name + "? Nothing can be appended to it afterwards.")) return;
  try {
    await api("/api/streams/seal?stream=" + encodeURIComponent(name), "POST");
    show("Sealed " + name);
  } catch (error) {
    show(error.message, true);
  }
  refresh();
}

// -- RS-IO over WebSocket (docs/protocols/rsio.md): just what a tail needs

function varint(n) {
  const out = [];
  while (n >= 0x80) { out.push((n % 0x80) | 0x80); n = Math.floor(n / 0x80); }
  out.push(n);
  return out;
}

function text(s) {
  const bytes = new TextEncoder().encode(s);
  return [...varint(bytes.length), ...bytes];
}

class Reader {
  constructor(buffer) { this.bytes = new Uint8Array(buffer); this.at = 0; }
  varint() {
    let value = 0, scale = 1;
    for (;;) {
      const b = this.bytes[this.at++];
      if (b === undefined) throw new Error("short RS-IO message");
      value += (b & 0x7f) * scale;
      if (b < 0x80) return value;
      scale *= 0x80;
    }
  }
  bytesField() { const n = this.varint(); const out = this.bytes.subarray(this.at, this.at + n); this.at += n; return out; }
  rest() { return this.bytes.subarray(this.at); }
}

const LOGIN_ID = 1, TAIL_ID = 2;

async function startTail(stream) {
  stopTail();
  // From the stream's tail as of now (its cut), so nothing appended after the
  // click is missed; a sealed stream, or one whose cut is not known, from "latest".
  let from = "latest";
  try {
    const found = (await api("/api/streams")).streams.find((s) => s.name === stream);
    if (found && found.tail) from = found.tail;
  } catch (error) {
    show(error.message, true);
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(scheme + "//" + location.host + "/rsio");
  ws.binaryType = "arraybuffer";
  const state = { ws, stream, received: 0, granted: TAIL_DEMAND, parts: [] };
  tail = state;
  const send = (bytes) => ws.send(new Uint8Array(bytes));
  $("tail-state").textContent = "connecting…";
  $("tail-stop").disabled = false;
  ws.onopen = () => {
    send([1, 0, ...varint(authorization ? 1 : 0), ...(authorization ? [AUTH_EXTENSION] : [])]);
    if (authorization) send([4, ...text("auth:" + authorization), LOGIN_ID, 0]);
    send([4, ...text(stream + "?from=" + from), TAIL_ID, ...varint(TAIL_DEMAND)]);
  };
  ws.onmessage = (message) => {
    const r = new Reader(message.data);
    const type = r.varint();
    if (type === 7 && r.varint() === TAIL_ID) {
      $("tail-state").textContent = "tailing " + stream;
      document.body.dataset.tailing = stream;
    } else if (type === 8 || type === 10 || type === 11) {
      const id = r.varint();
      if (type !== 8) r.varint(); // the element id of a split element
      const payload = r.bytesField();
      if (id !== TAIL_ID) return;
      state.parts.push(payload);
      if (type === 10) return;
      const whole = new Blob(state.parts);
      state.parts = [];
      whole.arrayBuffer().then((buffer) => addEvent(new TextDecoder().decode(buffer)));
      state.received += 1;
      if (state.granted - state.received <= TAIL_DEMAND / 2) {
        send([5, TAIL_ID, ...varint(TAIL_DEMAND)]);
        state.granted += TAIL_DEMAND;
      }
    } else if (type === 12) {
      if (r.varint() === TAIL_ID) $("tail-state").textContent = stream + " ended (sealed)";
    } else if (type === 13) {
      const id = r.varint();
      const reason = new TextDecoder().decode(r.bytesField());
      $("tail-state").textContent = (id === LOGIN_ID ? "login: " : "") + reason;
    } else if (type === 3) {
      $("tail-state").textContent = "server said goodbye: " + new TextDecoder().decode(r.bytesField());
    }
  };
  ws.onclose = () => {
    if (tail === state) { $("tail-state").textContent += " (closed)"; $("tail-stop").disabled = true; }
  };
}

function addEvent(value) {
  const list = $("tail");
  const item = document.createElement("li");
  item.textContent = value.length > MAX_TAIL_CHARS ? value.slice(0, MAX_TAIL_CHARS) + "…" : value;
  list.append(item);
  while (list.children.length > MAX_TAIL_LINES) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

function stopTail() {
  if (tail) { const t = tail; tail = null; t.ws.close(); }
  $("tail-stop").disabled = true;
  delete document.body.dataset.tailing;
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const pair = $("user").value + ":" + $("password").value;
    authorization = "Basic " + btoa(String.fromCharCode(...new TextEncoder().encode(pair)));
    $("password").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => {
    authorization = null; admin = false; stopTail(); refresh();
  });
  $("tail-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if ($("tail-stream").value) { $("tail").replaceChildren(); startTail($("tail-stream").value); }
  });
  $("tail-stop").addEventListener("click", () => { stopTail(); $("tail-state").textContent = "stopped"; });
  refresh();
  setInterval(refresh, REFRESH_MS);
});
