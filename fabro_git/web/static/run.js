// A run's page: its graph coloured by each node's status, its stages, a stage's details,
// its events as they come (SSE, read by `followStream`), and, while it runs, its open
// gates and the steer and interrupt buttons. Run data is put into the page only as text.
"use strict";

const runId = decodeURIComponent(location.pathname.split("/").pop());
const api = "/api/runs/" + encodeURIComponent(runId);
const BOOKKEEPING = ["metadata.snapshot.", "sandbox.", "git.commit", "git.reset"];
const MAX_SHOWN_EVENTS = 1000;

let run = null;
let selectedStage = null;
let gateStream = null;
let openGates = new Map();
const events = [];

// Summary, stages and graph colours -------------------------------------------------------

async function refreshRun() {
  try {
    run = await fetchJson(api);
  } catch (error) {
    document.getElementById("run-title").textContent = "run " + runId + ": " + error.message;
    return;
  }
  document.title = "git fabro: " + run.workflow + " " + run.run_id;
  document.getElementById("run-title").textContent = run.run_id;
  document.getElementById("run-status").replaceChildren(statusBadge(run.status));
  document.getElementById("run-workflow").textContent = run.workflow;
  document.getElementById("run-goal").textContent = run.goal || "";
  document.getElementById("run-branch").textContent = run.run_branch || "";
  document.getElementById("run-duration").textContent = formatMs(run.duration_ms);
  document.getElementById("run-cost").textContent = formatCost(run.total_cost);
  const usage = run.usage || {};
  document.getElementById("run-tokens").textContent =
    formatTokens(usage.input_tokens) + " in / " + formatTokens(usage.output_tokens) + " out";
  const error = document.getElementById("run-error");
  error.hidden = !run.error;
  error.textContent = run.error || "";
  // A run that has ended its walk may still hold its lock while it writes its last
  // snapshot: there is nothing left to steer or interrupt.
  document.getElementById("controls").hidden = !(run.live && run.status === "running");
  renderTimeline();
  colourGraph();
  if (run.live && gateStream === null) followGates();
  if (selectedStage) showStage(selectedStage);
}
const refreshSoon = debounce(refreshRun, 100);

// Stages are updated in place, keyed by stage id, so a click never meets a list being
// rebuilt under it.
function renderTimeline() {
  const list = document.getElementById("timeline");
  const stages = run.stages || [];
  const longest = Math.max(1, ...stages.map((s) => s.duration_ms || 0));
  const existing = new Map(Array.from(list.children).map((item) => [item.dataset.stage, item]));
  stages.forEach((stage, index) => {
    let item = existing.get(stage.stage_id);
    existing.delete(stage.stage_id);
    if (!item) {
      item = el("li", { "data-stage": stage.stage_id },
        el("button", { class: "link" }, stage.label), " ",
        el("span", { class: "badge" }), " ",
        el("span", { class: "muted duration" }), " ",
        el("span", { class: "muted cost" }),
        el("span", { class: "bar" }));
      item.querySelector("button").addEventListener("click", () => showStage(stage.stage_id));
    }
    item.setAttribute("data-status", stage.status);
    item.querySelector(".badge").replaceChildren(statusBadge(stage.status));
    item.querySelector(".duration").textContent = formatMs(stage.duration_ms);
    item.querySelector(".cost").textContent = stage.cost ? formatCost(stage.cost) : "";
    const bar = item.querySelector(".bar");
    bar.className = "bar status-" + String(stage.status).replace(/[^a-z_]/g, "");
    bar.style.setProperty("--share", Math.max(2, Math.round(100 * (stage.duration_ms || 0) / longest)) + "%");
    item.classList.toggle("selected", stage.stage_id === selectedStage);
    if (list.children[index] !== item) list.insertBefore(item, list.children[index] || null);
  });
  for (const gone of existing.values()) gone.remove();
}

async function loadGraph() {
  const holder = document.getElementById("graph");
  try {
    const response = await fetch(api + "/graph.svg", authorized());
    if (!response.ok) {
      // The server's JSON error: what is wrong, and what to do about it.
      const text = await response.text();
      let said = text;
      try {
        const reply = JSON.parse(text);
        said = [reply.error, reply.hint].filter(Boolean).join("; ");
      } catch (_) { /* not JSON: shown as it came */ }
      throw new Error(said || String(response.status));
    }
    const parsed = new DOMParser().parseFromString(await response.text(), "image/svg+xml");
    const svg = parsed.documentElement;
    if (svg.nodeName !== "svg") throw new Error("not an SVG drawing");
    // Graphviz escapes the workflow's text; nothing active is kept all the same.
    for (const bad of svg.querySelectorAll("script, foreignObject, use, image")) bad.remove();
    for (const link of svg.querySelectorAll("a")) link.replaceWith(...link.childNodes);
    for (const node of svg.querySelectorAll("*")) {
      for (const attr of Array.from(node.attributes)) {
        // No handlers, links or styles; no ids either, which could shadow the page's own.
        if (/^on/i.test(attr.name) || /href$/i.test(attr.name) || /^(id|style)$/i.test(attr.name)) {
          node.removeAttribute(attr.name);
        }
      }
    }
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    holder.replaceChildren(document.importNode(svg, true));
    colourGraph();
  } catch (error) {
    holder.replaceChildren(el("p", { class: "muted", id: "graph-problem" }, "no drawing: " + error.message));
  }
}

function colourGraph() {
  if (!run) return;
  const nodes = run.nodes || {};
  for (const group of document.querySelectorAll("#graph g.node")) {
    const title = group.querySelector("title");
    if (!title) continue;
    const nodeId = title.textContent;
    group.setAttribute("data-node", nodeId);
    const state = nodes[nodeId];
    group.setAttribute("data-status", state ? state.status : "pending");
    let badge = group.querySelector("text.visits");
    if (state && state.visits > 1) {
      if (!badge) {
        const box = group.getBBox();
        badge = document.createElementNS("http://www.w3.org/2000/svg", "text");
        badge.setAttribute("class", "visits");
        badge.setAttribute("x", String(box.x + box.width));
        badge.setAttribute("y", String(box.y + 4));
        group.append(badge);
      }
      badge.textContent = "×" + state.visits;
    } else if (badge) {
      badge.remove();
    }
    if (!group.dataset.clickable) {
      group.dataset.clickable = "1";
      group.addEventListener("click", () => {
        const stages = (run.stages || []).filter((s) => s.node_id === nodeId);
        if (stages.length) showStage(stages[stages.length - 1].stage_id);
      });
    }
  }
}

// One stage's details ---------------------------------------------------------------------

function block(title, text, cls) {
  if (text === null || text === undefined || text === "") return null;
  return el("div", { class: "block" }, el("h3", {}, title), el("pre", { class: cls || "" }, text));
}

function diffBlock(diff) {
  if (!diff) return null;
  const pre = el("pre", { class: "diff" });
  for (const line of String(diff).split("\n")) {
    let cls = "";
    if (line.startsWith("+") && !line.startsWith("+++")) cls = "add";
    else if (line.startsWith("-") && !line.startsWith("---")) cls = "del";
    else if (line.startsWith("@@")) cls = "hunk";
    pre.append(el("span", { class: cls }, line), "\n");
  }
  return el("div", { class: "block" }, el("h3", {}, "Diff against the stage's parent"), pre);
}

function transcriptBlock(entries) {
  if (!entries || !entries.length) return null;
  const list = el("ol", { class: "transcript" });
  for (const entry of entries) {
    let head = entry.kind;
    let text = entry.text;
    if (entry.kind === "tool") {
      head = "tool " + entry.tool_name;
      text = entry.arguments;
    } else if (entry.kind === "result" && entry.is_error) {
      head = "result (error)";
    }
    const item = el("li", { class: "entry kind-" + entry.kind },
      el("span", { class: "kind" }, head), el("pre", {}, text));
    item.style.setProperty("--depth", String(entry.depth || 0));
    list.append(item);
  }
  return el("div", { class: "block" }, el("h3", {}, "Transcript"), list);
}

// Each artifact is a button that downloads it: a link could not send the token.
function artifactsBlock(items) {
  if (!items || !items.length) return null;
  return el("div", { class: "block" }, el("h3", {}, "Artifacts"),
    el("ul", {}, ...items.map((item) => {
      const url = api + "/artifacts/" + item.path.split("/").map(encodeURIComponent).join("/");
      const button = el("button", { class: "link mono", "data-artifact": item.path }, item.path);
      const said = el("span", { class: "muted" }, item.kind + ", " + item.bytes + " bytes");
      button.addEventListener("click", () => download(url).catch((error) => {
        said.textContent = "not saved: " + error.message;
      }));
      return el("li", {}, button, " ", said);
    })));
}

let stageAsks = 0;

async function showStage(stageId) {
  selectedStage = stageId;
  const asked = ++stageAsks;
  let stage;
  try {
    stage = await fetchJson(api + "/stages/" + encodeURIComponent(stageId));
  } catch (error) {
    return;
  }
  if (asked !== stageAsks) return; // a later look (another stage, or newer) is on its way
  const panel = document.getElementById("stage");
  panel.hidden = false;
  panel.setAttribute("data-stage", stage.stage_id);
  document.getElementById("stage-title").replaceChildren(
    stage.label + " (" + stage.stage_id + ") ", statusBadge(stage.status));
  const usage = stage.usage || {};
  if (stage.cost === null && usage.cost) stage.cost = usage.cost;
  document.getElementById("stage-meta").textContent =
    [stage.handler_type, "attempt " + stage.attempt, formatMs(stage.duration_ms),
      formatTokens(usage.input_tokens) + " in / " + formatTokens(usage.output_tokens) + " out",
      formatCost(stage.cost)].join(" · ");
  const files = stage.files_touched && stage.files_touched.length
    ? el("div", { class: "block" }, el("h3", {}, "Files touched"),
      el("ul", {}, ...stage.files_touched.map((f) => el("li", { class: "mono" }, f))))
    : null;
  document.getElementById("stage-body").replaceChildren(...[
    block("Error", stage.error, "problem"),
    block("Prompt", stage.prompt),
    block("Reply", stage.reply, "reply"),
    transcriptBlock(stage.transcript),
    block("Command output", stage.command_output, "output"),
    block("Command stderr", stage.command_stderr, "output"),
    files,
    diffBlock(stage.diff),
    artifactsBlock(stage.artifacts),
  ].filter((x) => x !== null));
  for (const item of document.querySelectorAll("#timeline li")) {
    item.classList.toggle("selected", item.dataset.stage === stageId);
  }
}

// Events ----------------------------------------------------------------------------------

function eventShown(event) {
  const name = String(event.event || "");
  const wanted = document.getElementById("filter-event").value.trim();
  const node = document.getElementById("filter-node").value;
  const bookkeeping = document.getElementById("filter-bookkeeping").checked;
  if (!bookkeeping && BOOKKEEPING.some((prefix) => name.startsWith(prefix))) return false;
  if (wanted && !name.includes(wanted)) return false;
  if (node && event.node_id !== node) return false;
  return true;
}

function eventRow(event) {
  const props = JSON.stringify(event.properties || {});
  return el("tr", { "data-event": event.event },
    el("td", { class: "mono" }, formatTime(event.ts)),
    el("td", {}, event.event),
    el("td", {}, event.node_id || ""),
    el("td", { class: "props" }, props.length > 300 ? props.slice(0, 300) + "…" : props));
}

const knownNodes = new Set();

function noteNode(event) {
  if (!event.node_id || knownNodes.has(event.node_id)) return;
  knownNodes.add(event.node_id);
  document.getElementById("filter-node").append(el("option", { value: event.node_id }, event.node_id));
}

function renderEvents() {
  const shown = events.filter(eventShown);
  const body = document.querySelector("#events tbody");
  body.replaceChildren(...shown.slice(-MAX_SHOWN_EVENTS).map(eventRow));
  document.getElementById("event-count").textContent = shown.length + " of " + events.length;
}
const renderEventsSoon = debounce(renderEvents, 200);

function followEvents() {
  const stream = followStream(api + "/events", {
    message: (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      events.push(event);
      noteNode(event);
      renderEventsSoon();
      const name = String(event.event || "");
      if (/^(stage|run|interview|checkpoint|agent\.message)/.test(name)) refreshSoon();
    },
    ended: async () => {
      // A finished run's stream ends; it would be asked for again and again.
      try {
        const now = await fetchJson(api);
        if (!now.live) {
          stream.close();
          refreshSoon();
        }
      } catch (_) {
        stream.close();
      }
    },
  });
}

for (const id of ["filter-event", "filter-node", "filter-bookkeeping"]) {
  document.getElementById(id).addEventListener("input", renderEvents);
}

// Gates, steering, interrupting -------------------------------------------------------------

function followGates() {
  gateStream = followStream(api + "/gates", {
    message: (message) => {
      let data;
      try { data = JSON.parse(message.data); } catch (_) { return; }
      if (data.question && typeof data.id === "number") openGates.set(data.id, data.question);
      else if (typeof data.closed === "number") openGates.delete(data.closed);
      showGate();
    },
    ended: async () => {
      const now = await fetchJson(api).catch(() => null);
      if (!now || !now.live) {
        gateStream.close();
        openGates = new Map();
        showGate();
      }
    },
  });
}

function showGate() {
  const panel = document.getElementById("gate");
  if (!openGates.size) {
    panel.hidden = true;
    return;
  }
  const [gateId, question] = openGates.entries().next().value;
  panel.hidden = false;
  panel.setAttribute("data-gate", String(gateId));
  document.getElementById("gate-question").textContent = question.text;
  document.getElementById("gate-details").textContent = question.details || "";
  document.getElementById("gate-details").hidden = !question.details;
  document.getElementById("gate-said").textContent = "";
  const choices = (question.choices || []).filter((c) => !c.freeform);
  document.getElementById("gate-choices").replaceChildren(...choices.map((choice) => {
    const button = el("button", { class: "choice", "data-key": choice.key || "" },
      choice.key ? "[" + choice.key + "] " + choice.label : choice.label);
    button.addEventListener("click", () => answer(gateId, choice.key || choice.label));
    return button;
  }));
  const free = (question.choices || []).some((c) => c.freeform) || !(question.choices || []).length;
  document.getElementById("gate-free").hidden = !free;
}

async function answer(gateId, text) {
  const said = document.getElementById("gate-said");
  try {
    const reply = await postJson(api + "/answer", { id: gateId, text });
    said.textContent = reply.accepted ? "answered: " + text : (reply.error || "that question was already answered");
  } catch (error) {
    said.textContent = "not sent: " + error.message;
  }
}

document.getElementById("gate-send").addEventListener("click", () => {
  const gate = document.getElementById("gate").getAttribute("data-gate");
  const text = document.getElementById("gate-text").value;
  if (gate !== null && text.trim()) answer(Number(gate), text);
});

document.getElementById("steer").addEventListener("click", async () => {
  const input = document.getElementById("steer-text");
  const said = document.getElementById("control-said");
  if (!input.value.trim()) return;
  try {
    const reply = await postJson(api + "/steer", { text: input.value });
    said.textContent = reply.delivered
      ? "the agent in flight takes it before its next turn"
      : "no agent stage is running now, so nothing received it";
    input.value = "";
  } catch (error) {
    said.textContent = "not sent: " + error.message;
  }
});

document.getElementById("interrupt").addEventListener("click", async () => {
  const said = document.getElementById("control-said");
  try {
    await postJson(api + "/interrupt", {});
    said.textContent = "stopping at a checkpoint; `git fabro resume " + runId + "` continues it";
  } catch (error) {
    said.textContent = "not sent: " + error.message;
  }
});

refreshRun().then(loadGraph);
followEvents();
