// The runs page: `git fabro ps` as a table, with filters, kept up to date by every run's
// event stream while it is open.
"use strict";

let allRuns = [];

function matches(run) {
  const status = document.getElementById("filter-status").value;
  const workflow = document.getElementById("filter-workflow").value;
  const label = document.getElementById("filter-label").value.trim();
  if (status && run.status !== status) return false;
  if (workflow && run.workflow !== workflow) return false;
  if (label) {
    const [key, ...rest] = label.split("=");
    const value = rest.join("=");
    const labels = run.labels || {};
    if (!(key in labels)) return false;
    if (rest.length && labels[key] !== value) return false;
  }
  return true;
}

function fillChoices(id, values) {
  const select = document.getElementById(id);
  const chosen = select.value;
  const known = new Set(Array.from(select.options).map((o) => o.value));
  for (const value of values) {
    if (!known.has(value)) select.append(el("option", { value }, value.replace(/_/g, " ")));
  }
  select.value = chosen;
}

function render() {
  fillChoices("filter-status", [...new Set(allRuns.map((r) => r.status))].sort());
  fillChoices("filter-workflow", [...new Set(allRuns.map((r) => r.workflow))].sort());
  const body = document.querySelector("#runs tbody");
  const shown = allRuns.filter(matches);
  body.replaceChildren(...shown.map((run) => {
    const usage = run.usage || {};
    const labels = Object.entries(run.labels || {}).map(([k, v]) => k + "=" + v).join(" ");
    return el("tr", { "data-run": run.run_id },
      el("td", {}, el("a", { href: "/runs/" + encodeURIComponent(run.run_id), class: "mono" }, run.run_id)),
      el("td", {}, run.workflow),
      el("td", {}, statusBadge(run.status)),
      el("td", {}, run.current_node || ""),
      el("td", {}, formatTime(run.started)),
      el("td", {}, formatMs(run.duration_ms)),
      el("td", {}, formatCost(run.total_cost)),
      el("td", {}, formatTokens(usage.input_tokens) + " / " + formatTokens(usage.output_tokens)),
      el("td", {}, labels));
  }));
  document.getElementById("run-count").textContent =
    shown.length + " of " + allRuns.length + " runs";
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    allRuns = await fetchJson("/api/runs");
    problem.hidden = true;
    render();
  } catch (error) {
    problem.textContent = "cannot read the runs: " + error.message;
    problem.hidden = false;
  }
}

// A run that moved is read again (its row only), once per burst of its events.
const rowTimers = new Map();

function rowSoon(runId) {
  if (rowTimers.has(runId)) return;
  rowTimers.set(runId, setTimeout(async () => {
    rowTimers.delete(runId);
    let row;
    try {
      row = await fetchJson("/api/runs/" + encodeURIComponent(runId) + "/row");
    } catch (_) {
      return; // not readable yet (a run just starting): its next event asks again
    }
    const index = allRuns.findIndex((r) => r.run_id === row.run_id);
    if (index >= 0) allRuns[index] = row;
    else {
      allRuns.push(row);
      allRuns.sort((a, b) => (a.run_id < b.run_id ? 1 : -1));
    }
    render();
    // The run's lock goes after its last event: a row still live is read once more.
    if (row.live && !/^(running|waiting|paused)/.test(row.status)) rowSoon(runId);
  }, 100));
}

// Every run's events from now on: each says which run moved. The list is read whole
// when the stream opens (again after a reconnect), so nothing falls in between.
function follow() {
  followStream("/api/events?from=now", {
    opened: refresh,
    message: (message) => {
      let event;
      try { event = JSON.parse(message.data); } catch (_) { return; }
      if (typeof event.run_id === "string") rowSoon(event.run_id);
    },
    ended: (problem) => {
      if (!problem) return;
      const said = document.getElementById("problem");
      said.textContent = "cannot follow the runs: " + problem.message;
      said.hidden = false;
    },
  });
}

for (const id of ["filter-status", "filter-workflow", "filter-label"]) {
  document.getElementById(id).addEventListener("input", render);
}
follow();
