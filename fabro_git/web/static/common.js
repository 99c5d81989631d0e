// Shared by the pages. Run data only ever reaches the page as text: `el` makes elements
// and puts strings in them as text nodes; nothing here parses run data as HTML.
"use strict";

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
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) throw new Error(url + ": " + response.status);
  return response.json();
}

async function postJson(url, body) {
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
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
