// The triggerer web UI: the lineage graph as a live control room. It reads only the REST API
// under /api/v1 (with the bearer token the user gives, kept in sessionStorage) and polls it so
// the open page follows changes within POLL_MS plus one request.

// The graph libraries load while the first poll reads the API.
let dagre = null;
const graphLibrary = Promise.all([
  import("./vendor/cytoscape.js"),
  import("./vendor/dagre.js"),
]).then(([cytoscape, dagreModule]) => {
  dagre = dagreModule;
  return cytoscape.default;
});

const API = "/api/v1";
const POLL_MS = 1000;
const PAGE = 1000; // the API's largest page
const EVENTS_PER_PAGE = 10;
const DEFAULT_GROUP = "asset"; // an asset's group unless it names one
const LARGE_GRAPH = 600; // elements: above, the layout trades looks for speed
const TOKEN_KEY = "triggerer.token";
const ACTIVE = new Set(["queued", "running", "up_for_retry", "cancelling"]);
const CANCELLABLE = new Set(["queued", "running", "up_for_retry"]);
const FINISHED = new Set(["success", "failed", "cancelled"]); // what may be re-run

const $ = (selector) => document.querySelector(selector);
const state = {
  structure: "", // the lineage's nodes and edges: a change reads the assets' groups again
  signature: "", // of what is drawn (structure, groups collapsed): a change lays it out again
  watchers: new Map(), // node id -> WatcherRow
  pipelines: new Map(), // pipeline id -> PipelineRow
  runs: new Map(), // pipeline id -> its runs, newest first
  lastEvent: new Map(), // asset id -> newest EventRow
  groups: new Map(), // node id -> group
  eventsOffset: 0,
  importErrors: "", // what the broken-files banner shows: redrawn only when it changes
  busy: false,
};
// For the browser tests and the benchmark: the graph and when it was first drawn.
window.triggerer = { cy: null, renderMs: null, drawnMs: null, polls: 0 };

// ---------------------------------------------------------------- API and token

class Unauthorized extends Error {}

async function api(path, { method = "GET", body } = {}) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    askToken();
    throw new Unauthorized("the API wants a (valid) bearer token");
  }
  const type = response.headers.get("content-type") || "";
  const answer = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) throw new Error(answer.detail || `${method} ${path}: ${response.status}`);
  return answer;
}

async function all(path) {
  const rows = [];
  const joiner = path.includes("?") ? "&" : "?";
  for (let offset = 0; ; offset += PAGE) {
    const page = await api(`${path}${joiner}limit=${PAGE}&offset=${offset}`);
    rows.push(...page);
    if (page.length < PAGE) return rows;
  }
}

function askToken() {
  const dialog = $("#token-dialog");
  if (!dialog.open) dialog.showModal();
}

function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token-dialog").close();
  refresh();
}

// ---------------------------------------------------------------- small helpers

const escape = (value) =>
  String(value ?? "").replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// A template tag escaping every interpolated value but raw() ones.
function html(strings, ...values) {
  return strings.reduce((out, text, i) => {
    const value = values[i - 1];
    const shown = value && value.raw !== undefined ? value.raw : Array.isArray(value)
      ? value.map((v) => (v && v.raw !== undefined ? v.raw : escape(v))).join("")
      : escape(value);
    return out + shown + text;
  });
}
const raw = (text) => ({ raw: text });

function age(timestamp) {
  if (!timestamp) return "never";
  const seconds = Math.max(0, (Date.now() - Date.parse(timestamp)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)}s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)}h ago`;
  return `${Math.round(seconds / 86400)}d ago`;
}

function duration(run) {
  if (!run.start_date) return "";
  const end = run.end_date ? Date.parse(run.end_date) : Date.now();
  return `${((end - Date.parse(run.start_date)) / 1000).toFixed(1)}s`;
}

// When a run started: the time today, else the date too; the full time on hover.
function started(run) {
  if (!run.start_date) return raw('<span class="muted">not started</span>');
  const start = new Date(run.start_date);
  const today = start.toDateString() === new Date().toDateString();
  return raw(html`<span title="${run.start_date}">${today ? start.toLocaleTimeString() : start.toLocaleString()}</span>`);
}

// A run id without its pipeline's id in front (`count_orders__asset__42` -> `asset__42`):
// the panel is the pipeline's already.
const shortRunId = (run) => run.run_id.startsWith(`${run.pipeline_id}__`)
  ? run.run_id.slice(run.pipeline_id.length + 2) : run.run_id;

const json = (value) => JSON.stringify(value, null, 2);
const badge = (text) => raw(html`<span class="state ${text}">${text}</span>`);

// A run's button: cancel one that runs or waits to, run a finished one again.
function runControl(run) {
  if (CANCELLABLE.has(run.state)) return raw(html`<button data-cancel-run="${run.run_id}">Cancel</button>`);
  if (FINISHED.has(run.state)) return raw(html`<button data-rerun-run="${run.run_id}">Re-run</button>`);
  return "";
}

// ---------------------------------------------------------------- the graph

// Cytoscape elements of /lineage: its nodes and edges, with each AND/OR of a pipeline's
// condition as a gate node between the condition's assets and the pipeline.
export function elementsOf(lineage) {
  const nodes = [];
  const edges = new Map();
  const leaves = new Map();
  const edge = (source, target, kind, extra = {}) => {
    const id = `${kind}:${source}->${target}`;
    edges.set(id, { group: "edges", data: { id, source, target, kind, ...extra } });
  };
  for (const node of lineage.nodes) {
    nodes.push({ group: "nodes", data: { id: node.id, kind: node.kind, name: node.name, label: node.name } });
    if (node.kind === "asset") leaves.set(`asset|${node.name}|${node.uri}`, node.id);
    if (node.kind === "alias") leaves.set(`alias|${node.name}`, node.id);
  }
  const gated = new Set();
  for (const pipeline of lineage.nodes) {
    const condition = pipeline.condition;
    if (pipeline.kind !== "pipeline" || !condition || !(condition.all || condition.any)) continue;
    gated.add(pipeline.id);
    const build = (part, id) => {
      if (part.asset) return leaves.get(`asset|${part.asset.name}|${part.asset.uri}`);
      if (part.alias) return leaves.get(`alias|${part.alias.name}`);
      const operator = part.all ? "all" : "any";
      nodes.push({
        group: "nodes",
        data: { id, kind: "gate", name: operator === "all" ? "AND" : "OR", label: operator === "all" ? "AND" : "OR", pipeline: pipeline.name },
      });
      part[operator].forEach((item, i) => {
        const source = build(item, `${id}.${i}`);
        if (source) edge(source, id, "input", { pipeline: pipeline.name });
      });
      return id;
    };
    edge(build(condition, `gate:${pipeline.name}`), pipeline.id, "schedules");
  }
  for (const { source, target, kind } of lineage.edges) {
    if (kind === "schedules" && gated.has(target)) continue; // drawn through its gates
    edge(source, target, kind);
  }
  const elements = [...nodes, ...edges.values()];
  return $("#collapse").checked ? collapsed(elements) : elements;
}

// The elements with each group of assets (other than the default one) as one node: edges to
// and from its assets go to it, and it shows the worst state of its assets (see paintGraph).
function collapsed(elements) {
  const into = new Map(); // asset node id -> group node id
  const groups = new Map(); // group node id -> its element
  for (const [id, group] of state.groups) {
    if (group === DEFAULT_GROUP) continue;
    const groupId = `group:${group}`;
    into.set(id, groupId);
    if (!groups.has(groupId)) {
      groups.set(groupId, { group: "nodes", data: { id: groupId, kind: "group", name: group, label: group, members: [] } });
    }
    groups.get(groupId).data.members.push(Number(id.slice(6)));
  }
  const result = [...groups.values()];
  const seen = new Set();
  for (const element of elements) {
    if (element.group === "nodes") {
      if (!into.has(element.data.id)) result.push(element);
      continue;
    }
    const source = into.get(element.data.source) || element.data.source;
    const target = into.get(element.data.target) || element.data.target;
    const id = `${element.data.kind}:${source}->${target}`;
    if (source === target || seen.has(id)) continue;
    seen.add(id);
    result.push({ group: "edges", data: { ...element.data, id, source, target } });
  }
  return result;
}

const STYLE = [
  // Labels too small to read are not drawn: a fitted thousand-node graph draws fast.
  { selector: "node", style: {
    "min-zoomed-font-size": 7, label: "data(label)", "text-wrap": "wrap", "text-valign": "center", "font-size": 11,
    shape: "round-rectangle", width: 150, height: 44, "background-color": "#e8ecf4",
    "border-width": 1, "border-color": "#9aa5b8", color: "#1d2330" } },
  { selector: "node[kind = 'watcher']", style: { shape: "round-tag", "background-color": "#e6f4ea", width: 130 } },
  { selector: "node[kind = 'watcher'].failing", style: { "background-color": "#f8d7d4", "border-color": "#b3261e", "border-width": 2 } },
  { selector: "node[kind = 'asset']", style: { shape: "ellipse", "background-color": "#dde7fb" } },
  { selector: "node[kind = 'asset'].queued", style: { "border-color": "#c98a00", "border-width": 3 } },
  { selector: "node[kind = 'group']", style: { shape: "round-rectangle", "background-color": "#dde7fb", "border-width": 2, "border-style": "double", width: 170 } },
  { selector: "node[kind = 'group'].queued", style: { "border-color": "#c98a00", "border-width": 4 } },
  { selector: "node[kind = 'alias']", style: { shape: "ellipse", "border-style": "dashed", "background-color": "#fff" } },
  { selector: "node[kind = 'pipeline']", style: { shape: "rectangle", "background-color": "#fff", width: 160 } },
  { selector: "node[kind = 'pipeline'].paused", style: { "background-color": "#eceff3", color: "#8690a2", "border-style": "dashed" } },
  { selector: "node[kind = 'pipeline'].failed", style: { "border-color": "#b3261e", "border-width": 3 } },
  { selector: "node[kind = 'pipeline'].running", style: { "border-color": "#1e8e3e", "border-width": 3 } },
  { selector: "node[kind = 'gate']", style: { shape: "diamond", width: 34, height: 34, "font-size": 9, "background-color": "#fdf0c6" } },
  { selector: "node.dimmed, edge.dimmed", style: { opacity: 0.15 } },
  { selector: "node:selected", style: { "border-color": "#4b6cb7", "border-width": 3 } },
  { selector: "edge", style: {
    width: 1.5, "curve-style": "bezier", "target-arrow-shape": "triangle",
    "line-color": "#9aa5b8", "target-arrow-color": "#9aa5b8" } },
  { selector: "edge[kind = 'resolves']", style: { "line-style": "dashed" } },
  // A large graph's edges are drawn as straight lines without arrowheads (left to right is the
  // direction): a quarter of its first frame otherwise goes to curves and arrows too small to see.
  { selector: "edge.many", style: { "curve-style": "haystack", "haystack-radius": 0 } },
  { selector: "edge.lit", style: { "line-color": "#c98a00", "target-arrow-color": "#c98a00", width: 3 } },
];

function drawGraph(cytoscape, lineage) {
  const started = performance.now();
  const elements = elementsOf(lineage);
  let cy = window.triggerer.cy;
  if (cy) {
    cy.batch(() => {
      cy.elements().remove();
      cy.add(elements);
      cy.edges().toggleClass("many", elements.length > LARGE_GRAPH);
    });
    layOut(cy);
    paintGraph();
  } else {
    // Built, laid out and painted headless, then mounted: the renderer draws once, not at
    // every step (a third of the time at a thousand nodes).
    cy = cytoscape({ headless: true, styleEnabled: true, elements, style: STYLE, wheelSensitivity: 0.3 });
    cy.edges().toggleClass("many", elements.length > LARGE_GRAPH);
    window.triggerer.cy = cy;
    layOut(cy);
    paintGraph();
    cy.mount($("#graph"));
    cy.on("tap", "node", (event) => openNode(event.target.data()));
  }
  fit(cy);
  window.triggerer.renderMs ??= performance.now() - started;
  // The frame after the one cytoscape drew in: since navigation start, for the benchmark.
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.triggerer.drawnMs ??= performance.now();
  }));
}

// Left to right in ranks, by dagre. At a thousand nodes its defaults take seconds: there,
// longest-path ranking (each node as close to what it feeds as it can be) instead of network
// simplex (shorter edges, columns that read better), one alignment instead of balancing four,
// and one ordering sweep instead of searching for the order with the fewest crossings.
function layOut(cy) {
  const large = cy.elements().length > LARGE_GRAPH;
  const graph = new dagre.graphlib.Graph({ multigraph: true });
  graph.setGraph({
    rankdir: "LR", nodesep: 12, ranksep: 70,
    ...(large ? { ranker: "longest-path", align: "UL" } : {}),
  });
  graph.setDefaultEdgeLabel(() => ({}));
  cy.nodes().forEach((node) => {
    graph.setNode(node.id(), { width: node.outerWidth(), height: node.outerHeight() });
  });
  cy.edges().forEach((edge) => graph.setEdge(edge.source().id(), edge.target().id(), {}, edge.id()));
  dagre.layout(graph, { disableOptimalOrderHeuristic: large });
  cy.nodes().positions((node) => {
    const { x, y } = graph.node(node.id());
    return { x, y };
  });
}

// cy.fit() from the nodes' positions and sizes: fit() measures every label's text, which
// costs more than the layout at a thousand nodes.
function fit(cy, padding = 30) {
  if (!cy.width() || !cy.nodes().length) return;
  const box = { x1: Infinity, y1: Infinity, x2: -Infinity, y2: -Infinity };
  cy.nodes().forEach((node) => {
    const { x, y } = node.position();
    const w = node.width() / 2;
    const h = node.height() / 2;
    box.x1 = Math.min(box.x1, x - w);
    box.x2 = Math.max(box.x2, x + w);
    box.y1 = Math.min(box.y1, y - h);
    box.y2 = Math.max(box.y2, y + h);
  });
  const zoom = Math.min(
    (cy.width() - 2 * padding) / Math.max(box.x2 - box.x1, 1),
    (cy.height() - 2 * padding) / Math.max(box.y2 - box.y1, 1),
    1.5,
  );
  cy.viewport({
    zoom,
    pan: { x: (cy.width() - zoom * (box.x1 + box.x2)) / 2, y: (cy.height() - zoom * (box.y1 + box.y2)) / 2 },
  });
}

function openNode(data) {
  if (data.kind === "group") {
    // Opened: its assets drawn again, and picked out by the filter.
    $("#collapse").checked = false;
    $("#search").value = data.name;
    state.signature = "";
    refresh();
    return;
  }
  if (data.kind === "gate") location.hash = `#/pipeline/${encodeURIComponent(data.pipeline)}`;
  else location.hash = `#/${data.kind}/${encodeURIComponent(data.id.slice(data.kind.length + 1))}`;
}

// Each node's label and classes from the latest state.
function paintGraph() {
  const cy = window.triggerer.cy;
  if (!cy) return;
  const queuedFor = new Map(); // "pipeline|asset id" -> count
  const queuedOf = new Map(); // asset id -> count over pipelines
  for (const pipeline of state.pipelines.values()) {
    for (const [assetId, count] of Object.entries(pipeline.queued_by_asset)) {
      queuedFor.set(`${pipeline.pipeline_id}|${assetId}`, count);
      queuedOf.set(Number(assetId), (queuedOf.get(Number(assetId)) || 0) + count);
    }
  }
  cy.batch(() => {
    cy.nodes().forEach((node) => {
      const data = node.data();
      const key = data.id.slice(data.kind.length + 1);
      let detail = "";
      let classes = [];
      if (data.kind === "watcher") {
        const watcher = state.watchers.get(data.id);
        if (watcher) {
          const failing = watcher.state !== "running" || watcher.last_error;
          detail = `${watcher.state}${watcher.lag != null ? ` · lag ${watcher.lag}` : ""}`;
          classes = failing ? ["failing"] : ["running"];
          node.data("error", watcher.last_error || "");
        }
      } else if (data.kind === "asset") {
        const queued = queuedOf.get(Number(key)) || 0;
        detail = `last ${age(state.lastEvent.get(Number(key))?.timestamp)}${queued ? ` · ${queued} queued` : ""}`;
        if (queued) classes = ["queued"];
      } else if (data.kind === "group") {
        const queued = data.members.reduce((sum, id) => sum + (queuedOf.get(id) || 0), 0);
        const newest = data.members.map((id) => state.lastEvent.get(id)?.timestamp).filter(Boolean).sort().at(-1);
        detail = `${data.members.length} assets · last ${age(newest)}${queued ? ` · ${queued} queued` : ""}`;
        if (queued) classes = ["queued"];
      } else if (data.kind === "pipeline") {
        const pipeline = state.pipelines.get(data.name);
        const runs = state.runs.get(data.name) || [];
        const active = runs.filter((run) => ACTIVE.has(run.state)).length;
        const parts = [];
        if (pipeline?.paused) parts.push("paused");
        if (active) parts.push(`${active} active`);
        if (runs.length) parts.push(`last ${runs[0].state}`);
        detail = parts.join(" · ") || "no runs";
        if (pipeline?.paused) classes.push("paused");
        if (active) classes.push("running");
        else if (runs[0]?.state === "failed" || pipeline?.error) classes.push("failed");
      }
      node.data("label", detail ? `${data.name}\n${detail}` : data.name);
      node.data("state", classes.join(" "));
      node.classes(classes);
    });
    cy.edges("[kind = 'input']").forEach((edge) => {
      const source = edge.source().data();
      const members = source.kind === "group" ? source.members : source.kind === "asset" ? [Number(source.id.slice(6))] : [];
      const lit = members.some((id) => queuedFor.has(`${edge.data("pipeline")}|${id}`));
      edge.toggleClass("lit", lit);
    });
  });
  filterGraph();
}

function filterGraph() {
  const cy = window.triggerer.cy;
  if (!cy) return;
  const term = $("#search").value.trim().toLowerCase();
  cy.batch(() => {
    cy.elements().removeClass("dimmed");
    if (!term) return;
    const matching = cy.nodes().filter((node) => {
      const data = node.data();
      return data.name.toLowerCase().includes(term) || (state.groups.get(data.id) || "").toLowerCase().includes(term);
    });
    const shown = matching.union(matching.neighborhood());
    cy.elements().not(shown).addClass("dimmed");
  });
}

// ---------------------------------------------------------------- polling

async function refresh() {
  if (state.busy || sessionStorage.getItem(TOKEN_KEY) === null) return;
  state.busy = true;
  try {
    const assetsRead = state.structure ? null : all("/assets"); // groups, at the first poll
    const [lineage, watchers, pipelines, runs, events, importErrors] = await Promise.all([
      api("/lineage"),
      all("/watchers"),
      all("/pipelines"),
      api(`/runs?limit=${PAGE}`),
      api(`/assets/events?limit=${PAGE}`),
      all("/importErrors"),
    ]);
    showImportErrors(importErrors);
    state.watchers = new Map(watchers.map((w) => [`watcher:${w.asset_id}:${w.watcher}`, w]));
    state.pipelines = new Map(pipelines.map((p) => [p.pipeline_id, p]));
    state.runs = new Map();
    for (const run of runs) {
      if (!state.runs.has(run.pipeline_id)) state.runs.set(run.pipeline_id, []);
      state.runs.get(run.pipeline_id).push(run);
    }
    state.lastEvent = new Map();
    for (const event of events) if (!state.lastEvent.has(event.asset_id)) state.lastEvent.set(event.asset_id, event);
    const structure = JSON.stringify([lineage.nodes.map((n) => n.id), lineage.edges]);
    if (structure !== state.structure) {
      const assets = await (assetsRead ?? all("/assets"));
      state.groups = new Map(assets.map((a) => [`asset:${a.id}`, a.group]));
      state.structure = structure;
    }
    const signature = `${$("#collapse").checked}${structure}`;
    if (signature !== state.signature) {
      state.signature = signature;
      drawGraph(await graphLibrary, lineage);
    } else {
      paintGraph();
    }
    await renderRoute();
    $("#status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    window.triggerer.polls += 1;
  } catch (error) {
    if (!(error instanceof Unauthorized)) $("#status").textContent = String(error.message || error);
  } finally {
    state.busy = false;
  }
}

// The banner of the pipeline files that failed to load, on every page: each file at its
// line with the error, and the traceback's last frames under it.
function showImportErrors(rows) {
  const content = rows.length ? html`<strong>${rows.length === 1 ? "1 pipeline file" : `${rows.length} pipeline files`} failed to load</strong>
    ${rows.map((e) => raw(html`<details data-import-error="${e.fileloc}"><summary><code>${e.fileloc}${e.line ? `:${e.line}` : ""}</code> ${e.error} <span class="muted">since ${age(e.error_at)}</span></summary>${e.traceback ? raw(html`<pre>${e.traceback}</pre>`) : ""}</details>`))}` : "";
  // Redrawn only when it changes: a traceback opened stays open across polls ("since" is
  // left out of the comparison for that reason).
  const signature = JSON.stringify(rows.map((e) => [e.fileloc, e.line, e.error, e.traceback]));
  if (signature === state.importErrors) return;
  state.importErrors = signature;
  $("#import-errors").innerHTML = content;
  $("#import-errors").hidden = !rows.length;
}

// ---------------------------------------------------------------- routes

function route() {
  const [, kind = "", ...rest] = location.hash.replace(/^#/, "").split("/");
  return { kind, key: decodeURIComponent(rest.join("/")) };
}

async function renderRoute() {
  const { kind, key } = route();
  const onGraph = ["", "asset", "pipeline", "watcher", "alias"].includes(kind);
  const refit = onGraph && ($("#graph").hidden || $("#panel").hidden !== !kind);
  $("#graph").hidden = !onGraph;
  $("#page").hidden = onGraph;
  $("#panel").hidden = !onGraph || !kind;
  document.querySelectorAll("header nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.nav === (onGraph ? "graph" : kind));
  });
  // The panel takes room from the graph, and one laid out while hidden had no size: fit it
  // to the room it has now.
  window.triggerer.cy?.resize();
  if (refit && window.triggerer.cy) fit(window.triggerer.cy);
  const target = onGraph ? $("#panel") : $("#page");
  const renderers = { asset: assetPanel, pipeline: pipelinePanel, watcher: watcherPanel, alias: aliasPanel, event: tracePage, watchers: watchersPage, "dead-letters": deadLettersPage };
  if (!renderers[kind]) return;
  try {
    const content = await renderers[kind](key);
    if (route().kind === kind && route().key === key) {
      target.innerHTML = content;
      // A followed log shows its newest lines.
      target.querySelectorAll("pre.log").forEach((log) => { log.scrollTop = log.scrollHeight; });
    }
  } catch (error) {
    if (!(error instanceof Unauthorized)) target.innerHTML = html`<p class="error">${error.message}</p>`;
  }
}

const closeLink = raw('<a class="close" href="#/">close ✕</a>');

async function assetPanel(id) {
  const [asset, events, queued] = await Promise.all([
    api(`/assets/${id}`),
    api(`/assets/events?asset_id=${id}&limit=${EVENTS_PER_PAGE}&offset=${state.eventsOffset}`),
    api(`/assets/${id}/queuedEvents?limit=${PAGE}`),
  ]);
  const byPipeline = new Map();
  for (const row of queued) byPipeline.set(row.pipeline_id, (byPipeline.get(row.pipeline_id) || 0) + 1);
  return html`${closeLink}<h1 data-asset="${asset.id}">${asset.name}</h1>
    <dl><dt>URI</dt><dd>${asset.uri}</dd><dt>group</dt><dd>${asset.group}</dd>
    <dt>watchers</dt><dd>${asset.watchers.join(", ") || "none"}</dd>
    <dt>producers</dt><dd>${asset.producers.map((p) => raw(html`<a href="#/pipeline/${p}">${p}</a> `))}</dd>
    <dt>consumers</dt><dd>${asset.consumers.map((p) => raw(html`<a href="#/pipeline/${p}">${p}</a> `))}</dd></dl>
    <h3>extra</h3><pre>${json(asset.extra)}</pre>
    <p><button id="create-event" data-asset-id="${asset.id}" data-asset-name="${asset.name}">Create event…</button></p>
    <h2>Queued events</h2>
    ${byPipeline.size ? raw(html`<table><tr><th>pipeline</th><th>queued</th><th></th></tr>${[...byPipeline].map(([p, n]) => raw(html`<tr><td>${p}</td><td>${n}</td><td><button data-delete-queued="${p}" data-asset-id="${asset.id}">delete</button></td></tr>`))}</table>`) : raw('<p class="muted">none</p>')}
    <h2>Events</h2>
    <table class="events"><tr><th>id</th><th>when</th><th>source</th><th>extra</th></tr>
    ${events.map((e) => raw(html`<tr data-event-id="${e.id}"><td><a href="#/event/${e.id}">${e.id}</a></td><td>${age(e.timestamp)}</td><td>${e.source}${e.partition_key ? ` · ${e.partition_key}` : ""}</td><td><pre>${json(e.extra)}</pre></td></tr>`))}</table>
    <p><button data-events-page="-1" ${raw(state.eventsOffset ? "" : "disabled")}>newer</button>
    <button data-events-page="1" ${raw(events.length < EVENTS_PER_PAGE ? "disabled" : "")}>older</button></p>`;
}

async function pipelinePanel(id) {
  const path = `/pipelines/${encodeURIComponent(id)}`;
  const [pipeline, explained, runs] = await Promise.all([
    api(path), api(`${path}/explain`), api(`${path}/runs?limit=20`),
  ]);
  const log = state.logRun ? await api(`/runs/${encodeURIComponent(state.logRun)}/logs`).catch((e) => e.message) : null;
  return html`${closeLink}<h1 data-pipeline="${pipeline.pipeline_id}">${pipeline.pipeline_id}</h1>
    <dl><dt>schedule</dt><dd>${pipeline.schedule}</dd><dt>progress</dt><dd>${pipeline.progress || "–"}</dd>
    <dt>state</dt><dd>${pipeline.paused ? "paused" : "active"}${pipeline.active ? "" : " (no longer defined)"}</dd>
    <dt>runs</dt><dd>${explained.active_runs} active of ${explained.max_active_runs}</dd>
    <dt>next cron</dt><dd>${pipeline.next_cron_at || "–"}</dd><dt>file</dt><dd>${pipeline.fileloc}</dd></dl>
    ${pipeline.error ? raw(html`<p class="error">${pipeline.error}</p>`) : ""}
    <h2>Explain</h2>
    <ul class="reasons" id="explain">${explained.reasons.map((r) => raw(html`<li>${r}</li>`))}</ul>
    <ul class="muted">${explained.assets.map((a) => raw(html`<li>${a.name}: ${a.queued_events ? `${a.queued_events} queued since ${new Date(a.queued_since).toLocaleTimeString()}` : "missing"}</li>`))}</ul>
    <p><button id="toggle-pause" data-pipeline="${pipeline.pipeline_id}" data-paused="${pipeline.paused}">${pipeline.paused ? "Unpause" : "Pause"}</button>
    <button id="trigger" data-pipeline="${pipeline.pipeline_id}">Trigger…</button></p>
    <h2>Runs</h2>
    <table class="runs"><tr><th>run <span class="muted">(log)</span></th><th>state</th><th>start</th><th>duration</th><th>events</th></tr>
    ${runs.map((r) => raw(html`<tr data-run-id="${r.run_id}" data-run-state="${r.state}"><td title="${r.run_id}">${r.start_date ? raw(html`<button class="link" data-log="${r.run_id}">${shortRunId(r)}</button>`) : shortRunId(r)}${r.rerun_of ? raw(html`<br><span class="muted" data-rerun-of="${r.rerun_of}">re-run of ${shortRunId({ run_id: r.rerun_of, pipeline_id: r.pipeline_id })}</span>`) : ""}</td><td>${badge(r.state)}${r.try_number > 1 ? ` try ${r.try_number} of ${r.max_tries}` : ""} ${runControl(r)}</td><td>${started(r)}</td><td>${duration(r)}</td><td>${r.events}</td></tr>`))}</table>
    ${runs.length ? "" : raw('<p class="muted">no runs yet</p>')}
    ${log !== null ? raw(html`<h3>Log of ${state.logRun}</h3><pre class="log">${log}</pre>`) : ""}`;
}

async function watcherPanel(key) {
  const watcher = state.watchers.get(`watcher:${key}`);
  if (!watcher) return html`${closeLink}<p class="muted">unknown watcher ${key}</p>`;
  return html`${closeLink}<h1>${watcher.watcher}</h1>${raw(watcherDetails(watcher))}`;
}

function watcherDetails(w) {
  return html`<dl><dt>asset</dt><dd><a href="#/asset/${w.asset_id}">${w.asset}</a></dd>
    <dt>trigger</dt><dd>${w.trigger}</dd><dt>state</dt><dd>${badge(w.state)}</dd>
    <dt>lag</dt><dd>${w.lag ?? "–"}</dd><dt>last poll</dt><dd>${age(w.last_poll_at)}</dd><dt>last event</dt><dd>${age(w.last_event_at)}</dd>
    <dt>restarts</dt><dd>${w.restarts}</dd><dt>consumer group</dt><dd>${w.consumer_group || "–"}</dd>
    <dt>instance</dt><dd>${w.instance_id || "–"}</dd></dl>
    ${w.last_error ? raw(html`<p class="error">${w.last_error}</p>`) : ""}`;
}

async function aliasPanel(id) {
  const aliases = await all("/assets/aliases");
  const alias = aliases.find((a) => String(a.id) === id);
  if (!alias) return html`${closeLink}<p class="muted">unknown alias ${id}</p>`;
  return html`${closeLink}<h1>${alias.name} <span class="muted">alias</span></h1>
    <dl><dt>assets</dt><dd>${alias.asset_ids.map((a) => raw(html`<a href="#/asset/${a}">${a}</a> `))}</dd>
    <dt>producers</dt><dd>${alias.producers.join(", ")}</dd><dt>consumers</dt><dd>${alias.consumers.join(", ")}</dd></dl>`;
}

async function watchersPage() {
  const watchers = [...state.watchers.values()];
  return html`<h1>Watchers</h1><table class="watchers"><tr><th>watcher</th><th>asset</th><th>trigger</th><th>state</th><th>lag</th><th>last poll</th><th>restarts</th><th>last error</th></tr>
    ${watchers.map((w) => raw(html`<tr data-watcher="${w.watcher}"><td><a href="#/watcher/${w.asset_id}:${w.watcher}">${w.watcher}</a></td><td><a href="#/asset/${w.asset_id}">${w.asset}</a></td><td>${w.trigger}</td><td>${badge(w.state)}</td><td>${w.lag ?? "–"}</td><td>${age(w.last_poll_at)}</td><td>${w.restarts}</td><td class="error">${w.last_error || ""}</td></tr>`))}</table>
    ${watchers.length ? "" : raw('<p class="muted">no watchers</p>')}`;
}

async function deadLettersPage() {
  const rows = await api("/dead-letters?limit=200");
  return html`<h1>Dead letters</h1><p class="muted">Events the store could not hold, newest first.</p>
    <table class="dead-letters"><tr><th>when</th><th>asset</th><th>source</th><th>reason</th><th>payload</th></tr>
    ${rows.map((d) => raw(html`<tr data-dead-letter="${d.id}"><td>${age(d.created_at)}</td><td>${d.asset || "–"}</td><td>${d.source}</td><td class="error">${d.reason}</td><td><pre>${d.payload}</pre></td></tr>`))}</table>
    ${rows.length ? "" : raw('<p class="muted">none</p>')}`;
}

// One event end to end: its payload (the broker message of a watcher's event), the pipelines it
// is queued for, the runs that consumed it with their logs and outlet events, and on down.
async function tracePage(id) {
  return html`<h1>Event trace</h1>${raw(await traceEvent(Number(id), 0, new Set()))}`;
}

const TRACE_DEPTH = 6;

async function traceEvent(id, depth, seen) {
  if (seen.has(id) || depth > TRACE_DEPTH) return "";
  seen.add(id);
  const event = await api(`/events/${id}`);
  const runs = await Promise.all(event.consumed_by.map((ref) => traceRun(ref.run_id, depth, seen)));
  return html`<div class="trace" data-trace-event="${event.id}">
    <h2>Event ${event.id} on <a href="#/asset/${event.asset_id}">${event.uri}</a></h2>
    <p>${event.source}${event.source_run_id ? ` produced by run ${event.source_run_id}` : ""} · ${event.timestamp}${event.partition_key ? ` · partition ${event.partition_key}` : ""}</p>
    <pre>${json(event.extra)}</pre>
    <p>${event.queued_for.length ? `still queued for ${event.queued_for.join(", ")}` : "queued for no pipeline now"}</p>
    ${runs.map(raw)}</div>`;
}

async function traceRun(runId, depth, seen) {
  const run = await api(`/runs/${encodeURIComponent(runId)}`);
  const [log, events] = await Promise.all([
    // A run that has not started has no log: asking would be a 404 in the console.
    run.start_date ? api(`/runs/${encodeURIComponent(runId)}/logs`).catch((error) => error.message) : "not started",
    run.start_date ? api(`/assets/events?since=${encodeURIComponent(run.created_at)}&limit=${PAGE}`) : [],
  ]);
  const outlets = events.filter((event) => event.source_run_id === runId).reverse();
  const children = await Promise.all(outlets.map((event) => traceEvent(event.id, depth + 1, seen)));
  return html`<div class="trace" data-trace-run="${run.run_id}" data-pipeline="${run.pipeline_id}">
    <h3>Run of <a href="#/pipeline/${run.pipeline_id}">${run.pipeline_id}</a> ${badge(run.state)} ${duration(run)}</h3>
    <p class="muted">${run.run_id} · consumed ${run.events} event(s)${run.rerun_of ? ` · re-run of ${run.rerun_of}` : ""}</p>
    <pre class="log">${log}</pre>${children.map(raw)}</div>`;
}

// ---------------------------------------------------------------- actions

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  const { dataset } = button;
  try {
    if (button.id === "create-event") {
      $("#event-asset").textContent = dataset.assetName;
      $("#event-form").dataset.assetId = dataset.assetId;
      $("#event-error").textContent = "";
      $("#event-dialog").showModal();
    } else if (button.id === "toggle-pause") {
      await api(`/pipelines/${encodeURIComponent(dataset.pipeline)}`, { method: "PATCH", body: { paused: dataset.paused !== "true" } });
      await refresh();
    } else if (button.id === "trigger") {
      $("#trigger-pipeline").textContent = dataset.pipeline;
      $("#trigger-error").textContent = "";
      $("#trigger-dialog").showModal();
    } else if (dataset.cancelRun) {
      await api(`/runs/${encodeURIComponent(dataset.cancelRun)}/cancel`, { method: "POST" });
      await refresh();
    } else if (dataset.rerunRun) {
      await api(`/runs/${encodeURIComponent(dataset.rerunRun)}/rerun`, { method: "POST" });
      await refresh();
    } else if (dataset.deleteQueued) {
      await api(`/pipelines/${encodeURIComponent(dataset.deleteQueued)}/assets/${dataset.assetId}/queuedEvents`, { method: "DELETE" });
      await refresh();
    } else if (dataset.eventsPage) {
      state.eventsOffset = Math.max(0, state.eventsOffset + Number(dataset.eventsPage) * EVENTS_PER_PAGE);
      await renderRoute();
    } else if (dataset.log) {
      state.logRun = dataset.log;
      await renderRoute();
    } else if (dataset.close !== undefined) {
      button.closest("dialog").close();
    }
  } catch (error) {
    $("#status").textContent = String(error.message || error);
  }
});

function parseObject(text) {
  const value = JSON.parse(text || "{}");
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error("a JSON object, e.g. {\"n\": 1}");
  return value;
}

$("#event-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const partition = $("#event-partition").value.trim();
    await api("/assets/events", {
      method: "POST",
      body: { asset_id: Number(event.target.dataset.assetId), extra: parseObject($("#event-extra").value), partition_key: partition || null },
    });
    $("#event-dialog").close();
    await refresh();
  } catch (error) {
    $("#event-error").textContent = String(error.message || error);
  }
});

$("#trigger-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const pipeline = $("#trigger-pipeline").textContent;
    await api(`/pipelines/${encodeURIComponent(pipeline)}/runs`, { method: "POST", body: { params: parseObject($("#trigger-params").value) } });
    $("#trigger-dialog").close();
    await refresh();
  } catch (error) {
    $("#trigger-error").textContent = String(error.message || error);
  }
});

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken($("#token-input").value.trim());
});
$("#token-none").addEventListener("click", () => setToken(""));
$("#search").addEventListener("input", filterGraph);
$("#collapse").addEventListener("change", () => {
  state.signature = "";
  refresh();
});
window.addEventListener("hashchange", () => {
  state.eventsOffset = 0;
  state.logRun = null;
  // No stale content of the previous route while the new one loads.
  $("#panel").innerHTML = "";
  $("#page").innerHTML = "";
  renderRoute();
});

// Ask for the token before the first request: a 401 would be a console error on every open.
if (sessionStorage.getItem(TOKEN_KEY) === null) askToken();
refresh();
setInterval(refresh, POLL_MS);
