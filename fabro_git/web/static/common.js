// Shared by the pages. Run data only ever reaches the page as text: `el` makes elements
// and puts strings in them as text nodes; nothing here parses run data as HTML.
//
// The server's token is never a cookie (a cookie is the host's, whatever its port: the
// browser would give it to every server on 127.0.0.1). The page's address holds it in
// its fragment, which no request carries (the server moves it there from a printed
// address's query); it is kept in this tab's sessionStorage, which is this origin's,
// port included, taken out of the address bar, and sent as an Authorization header.
"use strict";

const TOKEN_KEY = "fabro-token";

(function takeToken() {
  const found = /^#token=([^&]*)/.exec(location.hash);
  if (!found) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
  // Out of the address bar, and of this tab's history.
  history.replaceState(history.state, "", location.pathname + location.search);
})();

// A request's options with the token, and without any cookie of this host's.
function authorized(options) {
  const headers = { ...((options || {}).headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = "Bearer " + token;
  return { ...options, headers, credentials: "omit" };
}

// Why a request was refused, as the page says it.
async function refusal(url, response) {
  if (response.status === 403 && !sessionStorage.getItem(TOKEN_KEY)) {
    return new Error("this tab holds no token: open the address `git fabro serve` printed");
  }
  return new Error(url + ": " + response.status);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "href") node.setAttribute("href", safeHref(value));
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function safeHref(value) {
  // Links are made from run ids and stage ids, always below this server.
  const text = String(value);
  return text.startsWith("/") && !text.startsWith("//") ? text : "#";
}

function formatMs(ms) {
  if (ms === null || ms === undefined) return "-";
  const seconds = ms / 1000;
  if (seconds < 60) return seconds.toFixed(1) + "s";
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return minutes + "m" + String(Math.floor(seconds % 60)).padStart(2, "0") + "s";
  return Math.floor(minutes / 60) + "h" + String(minutes % 60).padStart(2, "0") + "m";
}

function formatTokens(count) {
  if (!count) return "0";
  if (count < 1000) return String(count);
  if (count < 1000000) return (count / 1000).toFixed(1) + "k";
  return (count / 1000000).toFixed(1) + "M";
}

function formatCost(cost) {
  return cost === null || cost === undefined ? "-" : "$" + Number(cost).toFixed(4);
}

function formatTime(ts) {
  if (!ts) return "";
  return String(ts).replace("T", " ").replace(/\.\d+Z$/, "").replace(/Z$/, "");
}

async function fetchJson(url) {
  const response = await fetch(url, authorized());
  if (!response.ok) throw await refusal(url, response);
  return response.json();
}

async function postJson(url, body) {
  const response = await fetch(url, authorized({
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  }));
  let reply = {};
  try { reply = await response.json(); } catch (_) { reply = {}; }
  if (!response.ok) throw new Error(reply.error || String(response.status));
  return reply;
}

function statusBadge(status) {
  return el("span", { class: "status status-" + String(status).replace(/[^a-z_]/g, "") },
    String(status).replace(/_/g, " "));
}

// Runs `work` at most once per `ms`, and once more after the last call.
function debounce(work, ms) {
  let timer = null;
  return () => {
    if (timer !== null) return;
    timer = setTimeout(() => { timer = null; work(); }, ms);
  };
}

// A run's file, fetched with the token (a link could not send it) and saved under the
// name the server gives it.
async function download(url) {
  const response = await fetch(url, authorized());
  if (!response.ok) throw await refusal(url, response);
  const named = /filename="([^"]*)"/.exec(response.headers.get("content-disposition") || "");
  const link = el("a", { download: named ? named[1] : "artifact" });
  link.href = URL.createObjectURL(await response.blob()); // not through `el`: a blob: URL
  document.body.append(link);
  link.click();
  link.remove();
  // The browser reads the blob after the click returns: it is let go a while later.
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

// An SSE stream read with fetch, since EventSource cannot send the token's header; it
// behaves as EventSource does. Each message goes to `message` ({data, lastEventId}).
// When the stream ends or breaks it is asked for again after the retry pause, from after
// the last event it gave (Last-Event-ID). `opened` is called each time the server
// answers, and `ended(problem)` (awaited) each time the stream stops; either may call
// the returned `close()`. An answer other than a stream (a 403, a 404) closes it.
function followStream(url, { opened, message, ended }) {
  const stream = { lastId: "", retryMs: 3000, closed: false, aborter: null };
  stream.close = () => {
    stream.closed = true;
    if (stream.aborter) stream.aborter.abort();
  };
  (async () => {
    while (!stream.closed) {
      let problem = null;
      let refused = false;
      try {
        stream.aborter = new AbortController();
        const headers = { accept: "text/event-stream" };
        if (stream.lastId) headers["last-event-id"] = stream.lastId;
        const response = await fetch(url, authorized({
          headers, cache: "no-store", signal: stream.aborter.signal,
        }));
        const type = response.headers.get("content-type") || "";
        if (!response.ok || !type.startsWith("text/event-stream")) {
          refused = true;
          throw await refusal(url, response);
        }
        if (opened) opened();
        await readEvents(response.body, stream, message);
      } catch (error) {
        problem = error;
      }
      if (stream.closed) return;
      if (ended) await ended(problem);
      if (refused) stream.close();
      if (stream.closed) return;
      await new Promise((resolve) => setTimeout(resolve, stream.retryMs));
    }
  })();
  return stream;
}

// The SSE wire format, as the HTML standard parses it: lines end in CR LF, LF or CR; a
// blank line ends a message; `id:` sets the id to resume after, `retry:` the pause.
async function readEvents(body, stream, message) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  let data = [];
  let type = "";
  let idBuffer = stream.lastId;
  const line = (text) => {
    if (text === "") {
      stream.lastId = idBuffer;
      const kind = type || "message";
      const payload = data.join("\n");
      const had = data.length > 0;
      data = [];
      type = "";
      if (had && kind === "message") message({ data: payload, lastEventId: stream.lastId });
      return;
    }
    if (text.startsWith(":")) return;
    const colon = text.indexOf(":");
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") type = value;
    else if (field === "id" && !value.includes("\0")) idBuffer = value;
    else if (field === "retry" && /^\d+$/.test(value)) stream.retryMs = Number(value);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return; // a message cut off by the end is dropped, as EventSource drops it
    pending += value;
    // A CR at the very end may be the first half of a CR LF: kept for the next chunk.
    const cut = pending.endsWith("\r") ? pending.length - 1 : pending.length;
    const lines = pending.slice(0, cut).split(/\r\n|\r|\n/);
    pending = lines.pop() + pending.slice(cut);
    lines.forEach(line);
  }
}
