// The triggerer web UI: the lineage graph as a live control room. It reads only the REST API
// under /api/v1 (with the bearer token the user gives, kept in sessionStorage) and polls it so
// the open page follows changes within POLL_MS plus one request.

// The libraries (npm's, copied into vendor/ and committed) load while the first poll reads the
// API. One that does not load is said in words on the page, with the fix.
class MissingLibrary extends Error {
  constructor(file, cause) {
    super(`the UI's library /ui/vendor/${file} did not load (${cause?.message || cause})`);
    this.file = file;
  }
}
const vendor = (file) => import(`./vendor/${file}`).catch((error) => {
  throw new MissingLibrary(file, error);
});
import { layered, nodeSize } from "./layout.js";

let dagre = null;
let uPlot = null;
const graphLibrary = Promise.all([vendor("cytoscape.js"), vendor("dagre.js")])
  .then(([cytoscape, dagreModule]) => {
    dagre = dagreModule;
    return cytoscape.default;
  });
const chartLibrary = vendor("uplot.js").then((module) => {
  uPlot = module.default;
  return uPlot;
});
graphLibrary.catch(showLoadError);
// The graph, mounted empty as soon as its library loads (while the first poll reads the API),
// and shown empty for a frame: cytoscape draws every element of the first frame it draws into
// layer textures, the whole graph before the first pixel (a second at a thousand nodes), and
// afterwards only what is in view, filling the layers in the background.
const graphMounted = graphLibrary.then(async (cytoscape) => {
  const cy = cytoscape({ container: $("#graph"), style: STYLE, wheelSensitivity: 0.3 });
  cy.on("tap", "node", (event) => openNode(event.target.data()));
  cy.on("viewport", () => {
    if (state.pointerDown) state.userMoved = true;
  });
  // A hidden tab has no frames: a moment then.
  await Promise.race([
    new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))),
    new Promise((resolve) => setTimeout(resolve, 200)),
  ]);
  return cy;
});
graphMounted.catch(() => {}); // a missing library is said by showLoadError; polls go on without it
chartLibrary.catch(showLoadError);

function showLoadError(error) {
  $("#load-error-detail").textContent = `The file /ui/vendor/${error.file} was not found: ${error.message}.`;
  $("#load-error").hidden = false;
}

const API = "/api/v1";
const POLL_MS = 1000;
const PAGE = 1000; // the API's largest page
const EVENTS_PER_PAGE = 10;
const DEFAULT_GROUP = "asset"; // an asset's group unless it names one
const LARGE_GRAPH = 600; // elements: above, layout.js lays the graph out (dagre would take seconds)
const TOKEN_KEY = "triggerer.token";
const ACTIVITY_MS = 5000; // how often a chart's aggregate is read again
const EXPLAIN_MS = 30_000; // how often a waiting pipeline's explain is read again, its queue unchanged
const EXPLAINS_PER_POLL = 8; // the most explains a poll reads for the graph
const SKEW_MS = 2000; // a server clock this far from the browser's is corrected for (Date's rounding is 1 s)
const TIMELINE_MIN_S = 300; // the least a timeline fitted to its runs spans
const X_LABEL_SPACE = 80; // px between a chart's time labels, the widest (`12:55pm`) and a gap
const LABEL_PX = 13; // the nodes' labels
const READABLE_ZOOM = 12 / LABEL_PX; // labels drawn at 12 px: the least a graph opens at
const RUN_STATES = ["success", "failed", "running", "queued", "up_for_retry", "cancelling", "cancelled"];
const STATE_COLOURS = {
  success: "#1e8e3e", failed: "#b3261e", running: "#4b6cb7", queued: "#c98a00",
  up_for_retry: "#e37400", cancelling: "#8e44ad", cancelled: "#8690a2",
};
const PALETTE = ["#4b6cb7", "#e37400", "#1e8e3e", "#b3261e", "#8e44ad", "#00838f", "#c98a00", "#6d4c41", "#d81b60", "#5b6475"];
const ACTIVE = new Set(["queued", "running", "up_for_retry", "cancelling"]);
const CANCELLABLE = new Set(["queued", "running", "up_for_retry"]);
const FINISHED = new Set(["success", "failed", "cancelled"]); // what may be re-run
const CHANGES_SHOWN = 10; // a pipeline's last changes on its panel, from the audit log

const $ = (selector) => document.querySelector(selector);
const state = {
  structure: "", // the lineage's nodes and edges: a change reads the assets' groups again
  signature: "", // of what is drawn (structure, groups collapsed): a change lays it out again
  watchers: new Map(), // node id -> WatcherRow
  pipelines: new Map(), // pipeline id -> PipelineRow
  runs: new Map(), // pipeline id -> its runs, newest first
  explained: new Map(), // pipeline id -> { signature, at, value } of a pipeline with events queued
  lastEvent: new Map(), // asset id -> newest EventRow
  groups: new Map(), // node id -> group
  eventsOffset: 0,
  importErrors: "", // what the broken-files banner shows: redrawn only when it changes
  busy: false,
  waitingForToken: false, // the token dialog is open: no poll until it is answered
  me: null, // GET /whoami: the principal of the token, its role and permissions (read once a token)
  elements: [], // what is drawn (elementsOf), the text layer's source too
  drawn: false, // the elements are drawn on the graph
  userMoved: false, // the user zoomed or panned: a redraw keeps their viewport
  pointerDown: false,
  tree: new Map(), // node id -> { item, stateText, detail } of the text layer
  neighbours: new Map(), // node id -> the ids of the nodes it has an edge with
  selected: null, // the node id of the open panel
  window: "hour", // of the Activity page's charts
  runsFilter: { pipeline: "", state: "", since_s: 86400 },
};
// For the browser tests and the benchmark: the graph and when it was first drawn, the charts;
// the glob matching of an emitter's assets, checked against the API's.
const charts = new Map(); // chart key -> its uPlot
window.triggerer = { cy: null, renderMs: null, drawnMs: null, polls: 0, charts, globMatches };

// ---------------------------------------------------------------- API and token

class Unauthorized extends Error {}

async function api(path, { method = "GET", body, onResponse } = {}) {
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
    askToken(token
      ? "That token was refused (401): it is not one of [api] tokens, nor the token of an [[api.principals]] entry, of this daemon's config."
      : "");
    throw new Unauthorized("the API wants a (valid) bearer token");
  }
  noteServerClock(response);
  if (onResponse) onResponse(response);
  const type = response.headers.get("content-type") || "";
  const answer = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) throw new Error(answer.detail || `${method} ${path}: ${response.status}`);
  return answer;
}

// The server's clock less the browser's, from the responses' Date header: the times the API
// gives (an expiry, a run's latest start) count down by the server's clock. The header is
// rounded down to the second, so a difference within SKEW_MS is that rounding, and none.
let skewMs = 0;
function noteServerClock(response) {
  const date = Date.parse(response.headers.get("date") || "");
  if (Number.isNaN(date)) return;
  const skew = date + 500 - Date.now();
  skewMs = Math.abs(skew) > SKEW_MS ? skew : 0;
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

// An aggregate for a chart, read again at most every ACTIVITY_MS.
const activityRead = new Map(); // path -> { at, value }
async function activity(path) {
  const read = activityRead.get(path);
  if (read && Date.now() - read.at < ACTIVITY_MS) return read.value;
  const value = await api(`/activity/${path}`);
  activityRead.set(path, { at: Date.now(), value });
  return value;
}

function askToken(message = "") {
  state.waitingForToken = true;
  state.me = null;
  $("#token-error").textContent = message;
  const dialog = $("#token-dialog");
  if (!dialog.open) dialog.showModal();
}

function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  state.waitingForToken = false;
  state.me = null;
  $("#token-dialog").close();
  refresh();
}

// Who the token is (GET /whoami): its principal and role in the header, and what it may do, so
// that a button its role may not use is not shown (the API would answer 403).
function showWhoami(me) {
  state.me = me;
  const globs = me.assets ? ` (assets ${me.assets.join(", ")})` : "";
  const whoami = $("#whoami");
  whoami.textContent = `${me.name} · ${me.role}`;
  whoami.title = `${me.name} may: ${me.permissions.join(", ")}${globs}`;
  whoami.dataset.role = me.role;
}

const may = (permission) => Boolean(state.me?.permissions.includes(permission));

// Whether events of the asset may be created: an emitter's only on the assets one of its globs
// matches by name or URI.
function mayEmitTo(asset) {
  if (!may("emit")) return false;
  const globs = state.me.assets;
  return !globs || globs.some((glob) => globMatches(glob, asset.name) || globMatches(glob, asset.uri));
}

// An emitter's glob as the API matches it (Python's fnmatch.fnmatchcase): the whole text,
// case-sensitive; * any characters (/ too), ? one, [a-c] and [!a-c] a class; any other
// character itself, an unclosed [ too.
function globMatches(glob, text) {
  let pattern = "";
  for (let i = 0; i < glob.length; i += 1) {
    const c = glob[i];
    let end = i + 1;
    if (c === "[") {
      if (glob[end] === "!") end += 1;
      if (glob[end] === "]") end += 1;
      while (end < glob.length && glob[end] !== "]") end += 1;
    }
    if (c === "*") {
      pattern += "[\\s\\S]*";
    } else if (c === "?") {
      pattern += "[\\s\\S]";
    } else if (c === "[" && end < glob.length) {
      let members = glob.slice(i + 1, end);
      const negated = members.startsWith("!");
      if (negated) members = members.slice(1);
      pattern += `[${negated ? "^" : ""}${members.replace(/[\\\]\[^]/g, "\\$&")}]`;
      i = end;
    } else {
      pattern += c.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
    }
  }
  return new RegExp(`^(?:${pattern})$`, "u").test(text);
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

// A span of seconds, its two largest units: 42s, 59m 58s, 1h, 2h 5m, 3d 4h.
function span(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const units = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];
  const at = units.findIndex(([size]) => s >= size);
  if (at < 0) return "0s";
  const [size, unit] = units[at];
  const [smaller, smallerUnit] = units[at + 1] || [1, ""];
  const rest = Math.floor((s % size) / smaller);
  return `${Math.floor(s / size)}${unit}${rest && smallerUnit ? ` ${rest}${smallerUnit}` : ""}`;
}

// Seconds until a time the API gave, by the server's clock (negative once it has passed).
const secondsUntil = (timestamp) => (Date.parse(timestamp) - Date.now() - skewMs) / 1000;
const HMS = { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };

// A time the API gave, to come: "by 13:04:05 (in 59m 58s)" on the browser's clock, or "due
// now" once it has passed (the scheduler acts on it at its next pass). Polls write it again,
// so it counts down.
function countdown(timestamp) {
  const seconds = secondsUntil(timestamp);
  const by = new Date(Date.parse(timestamp) - skewMs).toLocaleTimeString([], HMS);
  return raw(html`<time datetime="${timestamp}" title="${timestamp}" data-countdown>by ${by} (${seconds > 0 ? `in ${span(seconds)}` : "due now"})</time>`);
}

// A time left, short, for the graph: "59m 58s", or "due" once it has passed.
const left = (timestamp) => {
  const seconds = secondsUntil(timestamp);
  return seconds > 0 ? span(seconds) : "due";
};

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

// A run id that may break after its `__`s and before a time's `T` (cron__2026-11-28T08:00:00):
// the panel's runs table fits its narrow column.
const breakable = (runId) => raw(escape(runId).replace(/__|\d(?=T\d)/g, "$&<wbr>"));

const json = (value) => JSON.stringify(value, null, 2);
const badge = (text) => raw(html`<span class="state ${text}">${text}</span>`);

// A run's button: cancel one that runs or waits to, run a finished one again (for a role that
// may operate).
function runControl(run) {
  if (!may("operate")) return "";
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
      const name = operator === "all" ? "AND" : "OR";
      // Its assets (name|uri), whose events' time left under a window it shows (nodeState).
      const operands = part[operator].filter((item) => item.asset).map((item) => `${item.asset.name}|${item.asset.uri}`);
      const data = { id, kind: "gate", name, label: name, pipeline: pipeline.name, operands };
      if (part.within_s != null) data.within_s = part.within_s;
      nodes.push({ group: "nodes", data });
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
    "min-zoomed-font-size": 7, label: "data(label)", "text-wrap": "wrap", "text-valign": "center", "font-size": LABEL_PX,
    "text-max-width": 156, shape: "round-rectangle", width: 170, height: 52, "background-color": "#e8ecf4",
    "border-width": 1, "border-color": "#9aa5b8", color: "#1d2330" } },
  { selector: "node[kind = 'watcher']", style: { shape: "round-tag", "background-color": "#e6f4ea", width: 150, "text-max-width": 130 } },
  { selector: "node[kind = 'watcher'].failing", style: { "background-color": "#f8d7d4", "border-color": "#b3261e", "border-width": 2 } },
  { selector: "node[kind = 'asset']", style: { shape: "ellipse", "background-color": "#dde7fb" } },
  { selector: "node[kind = 'asset'].queued", style: { "border-color": "#c98a00", "border-width": 3 } },
  { selector: "node[kind = 'group']", style: { shape: "round-rectangle", "background-color": "#dde7fb", "border-width": 2, "border-style": "double", width: 190, "text-max-width": 176 } },
  { selector: "node[kind = 'group'].queued", style: { "border-color": "#c98a00", "border-width": 4 } },
  { selector: "node[kind = 'alias']", style: { shape: "ellipse", "border-style": "dashed", "background-color": "#fff" } },
  { selector: "node[kind = 'pipeline']", style: { shape: "rectangle", "background-color": "#fff", width: 180, "text-max-width": 168 } },
  // A pipeline's fill is its last run's state.
  { selector: "node[kind = 'pipeline'].last-success", style: { "background-color": "#d6f0dc", "border-color": "#1e8e3e" } },
  { selector: "node[kind = 'pipeline'].last-failed", style: { "background-color": "#f8d7d4" } },
  { selector: "node[kind = 'pipeline'].last-queued, node[kind = 'pipeline'].last-up_for_retry", style: { "background-color": "#fdf0c6" } },
  { selector: "node[kind = 'pipeline'].last-running, node[kind = 'pipeline'].last-cancelling", style: { "background-color": "#dde7fb" } },
  { selector: "node[kind = 'pipeline'].last-cancelled", style: { "background-color": "#e3e6eb" } },
  { selector: "node[kind = 'pipeline'].paused", style: { "background-color": "#eceff3", color: "#8690a2", "border-style": "dashed" } },
  { selector: "node[kind = 'pipeline'].failed", style: { "border-color": "#b3261e", "border-width": 3 } },
  { selector: "node[kind = 'pipeline'].running", style: { "border-color": "#1e8e3e", "border-width": 3 } },
  { selector: "node[kind = 'gate']", style: { shape: "diamond", width: 46, height: 46, "background-color": "#fdf0c6" } },
  // A gate with times (a window, its events' time left) says them under its diamond.
  { selector: "node[kind = 'gate'].timed", style: {
    "text-valign": "bottom", "text-margin-y": 4, "text-background-color": "#fff", "text-background-opacity": 0.85,
    "text-background-padding": 2, "text-max-width": 150 } },
  // A watcher held back by a full backlog is healthy, waiting: amber, not red.
  { selector: "node[kind = 'watcher'].held", style: { "border-color": "#c98a00", "border-width": 2, "border-style": "dashed" } },
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

// The elements on the graph, replacing what it drew: with their labels and classes already
// (cytoscape styles each element once), laid out, in one batch (the renderer draws once, at
// the next frame). The user's zoom and pan stay when the graph changes; the selection is the
// route's.
function drawGraph(cy, elements, started) {
  // A large graph comes with its positions (layered); a small one is laid out by dagre.
  const large = elements.length > LARGE_GRAPH;
  if (large) {
    const positions = layered(elements);
    for (const element of elements) if (element.group === "nodes") element.position = positions[element.data.id];
  }
  const { queuedOf } = queuedCounts();
  for (const element of elements) {
    if (element.group !== "nodes") element.classes = large ? ["many"] : [];
    else {
      const { look, classes } = nodeLook(element.data, queuedOf);
      Object.assign(element.data, look);
      element.classes = classes;
    }
  }
  window.triggerer.cy = cy;
  const kept = state.userMoved ? { zoom: cy.zoom(), pan: { ...cy.pan() } } : null;
  cy.batch(() => {
    cy.elements().remove();
    cy.add(elements);
    if (!large) layOut(cy);
  });
  paintGraph();
  selectNode(state.selected);
  if (kept) cy.viewport(kept);
  else fit(cy);
  window.triggerer.renderMs ??= performance.now() - started;
  // The frame after the one cytoscape drew in: since navigation start, for the benchmark.
  requestAnimationFrame(() => requestAnimationFrame(() => {
    window.triggerer.drawnMs ??= performance.now();
  }));
}

// Left to right in ranks, by dagre (network simplex ranking: short edges, columns that read
// well). Its nodes' sizes are their kinds' (nodeSize), not measured: measuring would compute
// every node's style before the first draw.
function layOut(cy) {
  const graph = new dagre.graphlib.Graph({ multigraph: true });
  graph.setGraph({ rankdir: "LR", nodesep: 12, ranksep: 50 });
  graph.setDefaultEdgeLabel(() => ({}));
  cy.nodes().forEach((node) => {
    const [width, height] = nodeSize(node.data());
    graph.setNode(node.id(), { width, height });
  });
  cy.edges().forEach((edge) => graph.setEdge(edge.data("source"), edge.data("target"), {}, edge.id()));
  dagre.layout(graph);
  cy.nodes().positions((node) => {
    const { x, y } = graph.node(node.id());
    return { x, y };
  });
}

// cy.fit() from the nodes' positions and sizes: fit() measures every label's text, which
// costs more than the layout at a thousand nodes. A graph too large to fit with labels one can
// read (a left-to-right graph of hundreds of nodes is thousands of pixels high) opens at the
// least readable zoom, fitted to the width where it can be, at its top left: where the sources are.
function fit(cy, padding = 30) {
  if (!cy.width() || !cy.nodes().length) return;
  const box = { x1: Infinity, y1: Infinity, x2: -Infinity, y2: -Infinity };
  cy.nodes().forEach((node) => {
    const { x, y } = node.position();
    const [width, height] = nodeSize(node.data());
    const w = width / 2;
    const h = height / 2;
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
  if (zoom < READABLE_ZOOM) {
    const widthZoom = Math.min((cy.width() - 2 * padding) / Math.max(box.x2 - box.x1, 1), 1);
    const readable = Math.max(READABLE_ZOOM, widthZoom);
    const x = Math.max(padding, (cy.width() - readable * (box.x2 - box.x1)) / 2);
    cy.viewport({ zoom: readable, pan: { x: x - readable * box.x1, y: padding - readable * box.y1 } });
    return;
  }
  cy.viewport({
    zoom,
    pan: { x: (cy.width() - zoom * (box.x1 + box.x2)) / 2, y: (cy.height() - zoom * (box.y1 + box.y2)) / 2 },
  });
}

// The selected node in view: the graph is centred on it when it is outside.
function showSelected(cy) {
  const node = state.selected ? cy.$id(state.selected) : cy.collection();
  if (!node.length) return;
  const box = node.renderedBoundingBox();
  if (box.x1 < 0 || box.y1 < 0 || box.x2 > cy.width() || box.y2 > cy.height()) cy.center(node);
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

// How many events each pipeline has queued of each asset, and each asset over pipelines.
function queuedCounts() {
  const queuedFor = new Map(); // "pipeline|asset id" -> count
  const queuedOf = new Map(); // asset id -> count over pipelines
  for (const pipeline of state.pipelines.values()) {
    for (const [assetId, count] of Object.entries(pipeline.queued_by_asset)) {
      queuedFor.set(`${pipeline.pipeline_id}|${assetId}`, count);
      queuedOf.set(Number(assetId), (queuedOf.get(Number(assetId)) || 0) + count);
    }
  }
  return { queuedFor, queuedOf };
}

// A node's state from the latest poll: the words under its name, and its classes.
function nodeState(data, queuedOf) {
  const key = data.id.slice(data.kind.length + 1);
  let detail = "";
  let classes = [];
  if (data.kind === "watcher") {
    const watcher = state.watchers.get(data.id);
    if (watcher) {
      // Red only while it fails now: an error it has run since is history (watcherError).
      const parts = [watcher.state];
      if (watcher.lag != null) parts.push(`lag ${watcher.lag}`);
      if (watcher.recovered) parts.push("recovered");
      if (watcher.held_by) parts.push(`held by ${watcher.held_by}`);
      detail = parts.join(" · ");
      classes = watcher.failing ? ["failing"] : watcher.state === "running" ? ["running"] : [];
      if (watcher.held_by && !watcher.failing) classes.push("held");
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
    const hold = pipeline && !pipeline.paused ? holdShort(pipeline, state.explained.get(data.name)?.value) : "";
    if (hold) parts.push(hold);
    detail = parts.join(" · ") || "no runs";
    if (runs.length) classes.push(`last-${runs[0].state}`);
    if (pipeline?.paused) classes.push("paused");
    if (active) classes.push("running");
    else if (runs[0]?.state === "failed" || pipeline?.error) classes.push("failed");
  } else if (data.kind === "gate") {
    // Its window, and the time left to each of its assets' oldest queued event.
    const assets = state.explained.get(data.pipeline)?.value.assets || [];
    const parts = data.within_s != null ? [`within ${span(data.within_s)}`] : [];
    for (const asset of assets) {
      if (asset.expires_at && asset.queued_events && data.operands.includes(`${asset.name}|${asset.uri}`)) {
        parts.push(`${asset.name} ${left(asset.expires_at)} left`);
      }
    }
    detail = parts.join(" · ");
    if (parts.length) classes = ["timed"];
  }
  return { detail, classes };
}

// What holds a pipeline's run back, short, for the graph: its batch (queued of the most) or its
// debounce, and the time left until the run starts at the latest (explain's held_until).
function holdShort(pipeline, explained) {
  if (!explained?.held_until) return "";
  const queued = Object.values(pipeline.queued_by_asset).reduce((sum, n) => sum + n, 0);
  const runs = `runs in ${left(explained.held_until)}`;
  return explained.batch ? `batch ${queued}/${explained.batch.max_events} · ${runs}` : `quiet · ${runs}`;
}

// A node's look on the graph from the latest state: its data (the label under its name, its
// state, a watcher's error) and its classes.
function nodeLook(data, queuedOf) {
  const { detail, classes } = nodeState(data, queuedOf);
  // A gate's times, a line each under its diamond.
  const lines = data.kind === "gate" ? detail.replaceAll(" · ", "\n") : detail;
  const look = { label: lines ? `${data.name}\n${lines}` : data.name, state: classes.join(" ") };
  if (data.kind === "watcher") look.error = state.watchers.get(data.id)?.last_error || "";
  return { look, classes };
}

// Each node's label and classes from the latest state, on the graph and in the text layer.
// Only what changed is set: each change is a node styled again.
function paintGraph() {
  const { queuedFor, queuedOf } = queuedCounts();
  paintTree(queuedOf);
  const cy = window.triggerer.cy;
  if (!cy) return;
  cy.batch(() => {
    cy.nodes().forEach((node) => {
      const data = node.data();
      const { look, classes } = nodeLook(data, queuedOf);
      if (Object.entries(look).some(([key, value]) => data[key] !== value)) {
        node.data(look);
        node.classes(classes);
      }
    });
    cy.edges("[kind = 'input']").forEach((edge) => {
      const source = edge.source().data();
      const members = source.kind === "group" ? source.members : source.kind === "asset" ? [Number(source.id.slice(6))] : [];
      const lit = members.some((id) => queuedFor.has(`${edge.data("pipeline")}|${id}`));
      if (edge.hasClass("lit") !== lit) edge.toggleClass("lit", lit);
    });
  });
  filterGraph();
}

// What the search box matches: a node's name or its asset group.
function matches(data, term) {
  return data.name.toLowerCase().includes(term) || (state.groups.get(data.id) || "").toLowerCase().includes(term);
}

function filterGraph() {
  const term = $("#search").value.trim().toLowerCase();
  filterTree(term);
  const cy = window.triggerer.cy;
  if (!cy) return;
  cy.batch(() => {
    cy.elements().removeClass("dimmed");
    if (!term) return;
    const matching = cy.nodes().filter((node) => matches(node.data(), term));
    const shown = matching.union(matching.neighborhood());
    cy.elements().not(shown).addClass("dimmed");
  });
}

// ---------------------------------------------------------------- the text layer

// Every node of the graph as text: a tree of the kinds, each node with its name, kind and state
// (ARIA tree, arrow keys to move, Enter to open), filtered by the search box like the graph.
const KINDS = [
  ["watcher", "Watchers"], ["asset", "Assets"], ["alias", "Aliases"], ["group", "Asset groups"],
  ["gate", "Gates"], ["pipeline", "Pipelines"],
];
const KIND_NAMES = { watcher: "watcher", asset: "asset", alias: "alias", group: "asset group", gate: "gate", pipeline: "pipeline" };
const nodeName = (data) => (data.kind === "gate" ? `${data.name} of ${data.pipeline}` : data.name);

function buildTree(elements) {
  const byKind = new Map(KINDS.map(([kind]) => [kind, []]));
  state.neighbours = new Map();
  const near = (a, b) => {
    if (!state.neighbours.has(a)) state.neighbours.set(a, []);
    state.neighbours.get(a).push(b);
  };
  for (const element of elements) {
    if (element.group === "nodes") byKind.get(element.data.kind)?.push(element.data);
    else {
      near(element.data.source, element.data.target);
      near(element.data.target, element.data.source);
    }
  }
  let first = true;
  const groups = [];
  for (const [kind, title] of KINDS) {
    const nodes = byKind.get(kind).sort((a, b) => nodeName(a).localeCompare(nodeName(b)));
    if (!nodes.length) continue;
    const items = nodes.map((data) => {
      const item = `<li role="treeitem" aria-level="2" aria-selected="false" tabindex="${first ? 0 : -1}" data-node="${escape(data.id)}"><span class="node-name">${escape(nodeName(data))}</span><span class="node-kind" hidden> (${KIND_NAMES[kind]})</span><span class="node-state"></span></li>`;
      first = false;
      return item;
    });
    groups.push(`<li role="treeitem" aria-level="1" aria-expanded="true" tabindex="-1" data-kind-group="${kind}"><span class="kind-title">${title} <span class="muted">${nodes.length}</span></span><ul role="group">${items.join("")}</ul></li>`);
  }
  const tree = $("#nodes");
  tree.innerHTML = groups.join("");
  $("#nodes-count").textContent = String(elements.filter((e) => e.group === "nodes").length);
  state.tree = new Map();
  const data = new Map(elements.filter((e) => e.group === "nodes").map((e) => [e.data.id, e.data]));
  for (const item of tree.querySelectorAll("[data-node]")) {
    state.tree.set(item.dataset.node, { item, data: data.get(item.dataset.node), stateText: item.lastChild, detail: null });
  }
  if (state.selected) state.tree.get(state.selected)?.item.setAttribute("aria-selected", "true");
}

function paintTree(queuedOf) {
  for (const entry of state.tree.values()) {
    const { detail, classes } = nodeState(entry.data, queuedOf);
    const shown = detail ? ` ${detail}` : "";
    if (shown === entry.detail) continue;
    entry.detail = shown;
    entry.stateText.textContent = shown;
    entry.stateText.className = `node-state ${classes.join(" ")}`;
  }
}

function filterTree(term) {
  let shown = null;
  if (term) {
    shown = new Set();
    for (const [id, entry] of state.tree) {
      if (!matches(entry.data, term)) continue;
      shown.add(id);
      for (const other of state.neighbours.get(id) || []) shown.add(other);
    }
  }
  for (const [id, entry] of state.tree) entry.item.hidden = shown !== null && !shown.has(id);
}

// The node of the open panel, selected on the graph and in the text layer.
function selectNode(id) {
  if (state.selected && state.selected !== id) state.tree.get(state.selected)?.item.setAttribute("aria-selected", "false");
  state.selected = id;
  if (id) state.tree.get(id)?.item.setAttribute("aria-selected", "true");
  const cy = window.triggerer.cy;
  if (!cy) return;
  const node = id ? cy.$id(id) : cy.collection();
  cy.$(":selected").not(node).unselect();
  if (node.length && !node.selected()) node.select();
}

function visibleItems() {
  return [...$("#nodes").querySelectorAll("[role=treeitem]")].filter((item) => item.offsetParent !== null);
}

function focusItem(item) {
  if (!item) return;
  $("#nodes").querySelectorAll("[tabindex='0']").forEach((other) => other.setAttribute("tabindex", "-1"));
  item.setAttribute("tabindex", "0");
  item.focus();
}

// An entry chosen: its node opens (its panel, selected and centred on the graph).
function chooseItem(item) {
  if (item.dataset.kindGroup) {
    item.setAttribute("aria-expanded", String(item.getAttribute("aria-expanded") !== "true"));
    return;
  }
  const entry = state.tree.get(item.dataset.node);
  if (!entry) return;
  const node = window.triggerer.cy?.$id(entry.data.id);
  if (node?.length) window.triggerer.cy.center(node);
  openNode(entry.data);
}

$("#nodes").addEventListener("click", (event) => {
  const item = event.target.closest("[role=treeitem]");
  if (!item) return;
  focusItem(item);
  chooseItem(item);
});

$("#nodes").addEventListener("keydown", (event) => {
  const item = event.target.closest("[role=treeitem]");
  if (!item) return;
  const items = visibleItems();
  const at = items.indexOf(item);
  const group = item.dataset.kindGroup !== undefined;
  const moves = {
    ArrowDown: () => focusItem(items[at + 1]),
    ArrowUp: () => focusItem(items[at - 1]),
    Home: () => focusItem(items[0]),
    End: () => focusItem(items.at(-1)),
    ArrowRight: () => (group ? item.setAttribute("aria-expanded", "true") : null),
    ArrowLeft: () => (group ? item.setAttribute("aria-expanded", "false") : focusItem(item.parentElement.closest("[role=treeitem]"))),
    Enter: () => chooseItem(item),
    " ": () => chooseItem(item),
  };
  if (!moves[event.key]) return;
  event.preventDefault();
  moves[event.key]();
});

$("#graph").addEventListener("pointerdown", () => { state.pointerDown = true; });
window.addEventListener("pointerup", () => { state.pointerDown = false; });
$("#graph").addEventListener("wheel", () => { state.userMoved = true; }, { passive: true });

// ---------------------------------------------------------------- polling

async function refresh() {
  if (state.busy || state.waitingForToken) return;
  state.busy = true;
  try {
    // The assets (their groups) are read with the first poll, and again when the lineage's
    // structure changes; inside the Promise.all, so that a 401 rejects it once, handled.
    const [lineage, watchers, pipelines, runs, events, importErrors, assetsRead, me] = await Promise.all([
      api("/lineage"),
      all("/watchers"),
      all("/pipelines"),
      api(`/runs?limit=${PAGE}`),
      api(`/assets/events?limit=${PAGE}`),
      all("/importErrors"),
      state.structure ? null : all("/assets"),
      state.me ? null : api("/whoami"),
    ]);
    if (me) showWhoami(me);
    showImportErrors(importErrors);
    state.watchers = new Map(watchers.map((w) => [`watcher:${w.asset_id}:${w.watcher}`, w]));
    state.pipelines = new Map(pipelines.map((p) => [p.pipeline_id, p]));
    await readExplains(pipelines);
    state.runs = new Map();
    for (const run of runs) {
      if (!state.runs.has(run.pipeline_id)) state.runs.set(run.pipeline_id, []);
      state.runs.get(run.pipeline_id).push(run);
    }
    state.lastEvent = new Map();
    for (const event of events) if (!state.lastEvent.has(event.asset_id)) state.lastEvent.set(event.asset_id, event);
    const structure = JSON.stringify([lineage.nodes.map((n) => n.id), lineage.edges]);
    if (structure !== state.structure) {
      const assets = assetsRead ?? (await all("/assets"));
      state.groups = new Map(assets.map((a) => [`asset:${a.id}`, a.group]));
      state.structure = structure;
    }
    const signature = `${$("#collapse").checked}${structure}`;
    const started = performance.now();
    if (signature !== state.signature) {
      state.signature = signature;
      state.elements = elementsOf(lineage);
      state.drawn = false;
      buildTree(state.elements);
    }
    // The text layer does not wait for the graph's libraries (nor needs them).
    const cy = await graphMounted.catch(() => null);
    if (cy && !state.drawn) {
      state.drawn = true;
      drawGraph(cy, state.elements, started);
    } else {
      paintGraph();
    }
    await renderRoute();
    await renderOverview();
    $("#status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    window.triggerer.polls += 1;
  } catch (error) {
    if (!(error instanceof Unauthorized)) $("#status").textContent = String(error.message || error);
  } finally {
    state.busy = false;
  }
}

// The explain of each pipeline with events queued, for the times on its gate and its node (a
// window's expiries, a batch's or debounce's hold). Those times change only with the queue: a
// pipeline with any of them is read again when its queue changes, any other every EXPLAIN_MS
// (its definition may have gained one); at most EXPLAINS_PER_POLL a poll, the stalest first.
async function readExplains(pipelines) {
  const now = Date.now();
  const kept = new Map();
  const stale = [];
  for (const pipeline of pipelines) {
    if (!Object.keys(pipeline.queued_by_asset).length) continue;
    const signature = JSON.stringify(pipeline.queued_by_asset);
    const read = state.explained.get(pipeline.pipeline_id);
    if (read) kept.set(pipeline.pipeline_id, read);
    const changed = read && read.signature !== signature && hasTimes(read.value);
    if (!read || changed || now - read.at > EXPLAIN_MS) stale.push({ pipeline, signature, at: read?.at ?? 0 });
  }
  state.explained = kept;
  stale.sort((a, b) => a.at - b.at);
  await Promise.all(stale.slice(0, EXPLAINS_PER_POLL).map(({ pipeline, signature }) =>
    api(`/pipelines/${encodeURIComponent(pipeline.pipeline_id)}/explain`)
      .then((value) => state.explained.set(pipeline.pipeline_id, { signature, at: Date.now(), value }))
      .catch((error) => {
        if (error instanceof Unauthorized) throw error;
        // Gone since the list was read (a reload): the next poll does without it.
      })));
}

const hasTimes = (explained) =>
  explained.batch != null || explained.debounce_s != null || explained.assets.some((a) => a.window_s != null);

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

// The graph's node of a route (#/asset/3 -> asset:3), or null.
function routeNode({ kind, key }) {
  return ["asset", "pipeline", "watcher", "alias"].includes(kind) ? `${kind}:${key}` : null;
}

// Pages with a part that stays across polls (filters, a choice of window): it is written once,
// and only their [data-results] part is written again at each poll.
const SHELLS = { runs: () => runsShell(), activity: () => activityShell() };

async function renderRoute() {
  const { kind, key } = route();
  const onGraph = ["", "asset", "pipeline", "watcher", "alias"].includes(kind);
  const refit = onGraph && ($("#graph").hidden || $("#panel").hidden !== !kind);
  $("#graph").hidden = !onGraph;
  $("#sidebar").hidden = !onGraph;
  $("#page").hidden = onGraph;
  $("#panel").hidden = !onGraph || !kind;
  const nav = onGraph ? "graph" : kind === "run" ? "runs" : kind;
  document.querySelectorAll("header nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.nav === nav);
  });
  const selected = state.selected;
  if (onGraph) selectNode(routeNode({ kind, key }));
  // The panel takes room from the graph, and one laid out while hidden had no size: fit it
  // to the room it has now (unless the user has zoomed or panned it), and show the node of
  // the panel where the graph does not fit.
  const cy = window.triggerer.cy;
  cy?.resize();
  if (refit && cy && !state.userMoved) fit(cy);
  if (cy && onGraph && (refit || selected !== state.selected)) showSelected(cy);
  let target = onGraph ? $("#panel") : $("#page");
  const renderers = {
    asset: assetPanel, pipeline: pipelinePanel, watcher: watcherPanel, alias: aliasPanel, event: tracePage,
    watchers: watchersPage, "dead-letters": deadLettersPage, runs: runsPage, run: runPage, activity: activityPage,
  };
  if (!renderers[kind]) return;
  try {
    if (SHELLS[kind] && !target.querySelector(`[data-shell="${kind}"]`)) target.innerHTML = SHELLS[kind]();
    if (SHELLS[kind]) target = target.querySelector("[data-results]");
    const specs = [];
    const content = await renderers[kind](key, specs);
    if (route().kind === kind && route().key === key) {
      target.innerHTML = content;
      // A followed log shows its newest lines.
      target.querySelectorAll("pre.log").forEach((log) => { log.scrollTop = log.scrollHeight; });
      await mountCharts(target, specs);
    }
  } catch (error) {
    if (!(error instanceof Unauthorized)) target.innerHTML = html`<p class="error">${error.message}</p>`;
  }
}

// ---------------------------------------------------------------- charts

// A chart's place in a page: its caption (what it shows, in words: for find-in-page, screen
// readers and tests), the plot, and the numbers under the pointer. mountCharts draws it.
function chartFigure(spec, specs) {
  specs.push(spec);
  return raw(html`<figure class="chart-figure" data-chart="${spec.key}"><figcaption>${spec.caption}</figcaption>
    <div class="chart" role="img" aria-label="${spec.caption}"></div><p class="chart-hover" aria-live="off"></p></figure>`);
}

// Each spec's uPlot in its figure: made once per key (and per set of series), then moved into
// the figure written again at each poll and given the new numbers.
async function mountCharts(root, specs) {
  if (!specs.length) return;
  const Plot = await chartLibrary.catch(() => null);
  if (!Plot) return;
  for (const spec of specs) {
    const holder = root.querySelector(`[data-chart="${spec.key}"] .chart`);
    if (!holder) continue;
    const width = Math.max(200, Math.floor(holder.getBoundingClientRect().width));
    const signature = JSON.stringify([spec.series.map((s) => s.label), spec.height]);
    let plot = charts.get(spec.key);
    if (plot && plot.signature === signature) {
      holder.append(plot.root);
      plot.spec = spec;
      plot.setData(spec.data);
      if (plot.width !== width) plot.setSize({ width, height: spec.height });
      // The figure is new at each poll: a pointer resting on the chart keeps its numbers.
      const hover = holder.closest("figure").querySelector(".chart-hover");
      if (plot.cursor.idx != null) hover.textContent = spec.describe(plot.cursor.idx);
      continue;
    }
    plot?.destroy();
    plot = new Plot(chartOptions(spec, width), spec.data, holder);
    plot.signature = signature;
    plot.spec = spec;
    charts.set(spec.key, plot);
  }
}

function chartOptions(spec, width) {
  return {
    width,
    height: spec.height,
    series: [{ label: "time", value: (u, v) => (v == null ? "–" : new Date(v * 1000).toLocaleTimeString()) }, ...spec.series],
    scales: {
      // A timeline spans its window, however few its points.
      x: { time: true, ...(spec.xRange ? { range: (u) => (u.spec ?? spec).xRange } : {}) },
      y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] },
    },
    // Time labels at least X_LABEL_SPACE apart: at uPlot's 50 px, `6:50am` met `6:51am`.
    axes: [{ space: X_LABEL_SPACE }, { size: 45 }],
    legend: { show: spec.legend !== false },
    cursor: { points: { size: 6 } },
    hooks: {
      setCursor: [(u) => {
        const hover = u.root.closest("figure")?.querySelector(".chart-hover");
        if (hover) hover.textContent = u.cursor.idx == null ? "" : u.spec.describe(u.cursor.idx);
      }],
    },
  };
}

const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
const WINDOW_WORDS = { hour: "hour", day: "day" };

// Events per minute: in total, and for each asset listed (none in the small overview).
function eventsChart(key, activityRead, { assets = true, height = 180, legend = true } = {}) {
  const shown = assets ? activityRead.assets : [];
  const counts = activityRead.counts;
  const busiest = counts.reduce((best, n, i) => (n > counts[best] ? i : best), 0);
  const caption = `${activityRead.events} events in the last ${WINDOW_WORDS[activityRead.window]}` +
    (activityRead.events ? `; busiest minute ${clock(activityRead.buckets[busiest])} with ${counts[busiest]}` : "");
  return {
    key, height, legend, caption,
    series: [
      { label: "all events", stroke: "#1d2330", width: 1.5, fill: "rgba(75,108,183,.12)" },
      ...shown.map((asset, i) => ({ label: asset.uri, stroke: PALETTE[i % PALETTE.length], width: 1 })),
    ],
    data: [activityRead.buckets, counts, ...shown.map((asset) => asset.counts)],
    describe: (i) => `${clock(activityRead.buckets[i])}: ${counts[i]} event(s)` +
      shown.filter((a) => a.counts[i]).map((a) => `, ${a.uri} ${a.counts[i]}`).join(""),
  };
}

function lagChart(key, lag) {
  const latest = lag.watchers.map((w) => `${w.watchers.join(", ")} ${w.latest ?? "–"}`).join("; ");
  return {
    key, height: 180,
    caption: lag.watchers.length ? `Lag per minute over the last ${WINDOW_WORDS[lag.window]}, latest: ${latest}` : `No watcher reported a lag in the last ${WINDOW_WORDS[lag.window]}`,
    series: lag.watchers.map((w, i) => ({ label: w.watchers.join(", ") || `trigger ${w.trigger_id}`, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true })),
    data: [lag.buckets, ...lag.watchers.map((w) => w.lag)],
    describe: (i) => `${clock(lag.buckets[i])}: ` + lag.watchers.map((w) => `${w.watchers.join(", ")} ${w.lag[i] ?? "–"}`).join(", "),
  };
}

// Runs on a timeline: each run a point at its start (its creation if not started) and its
// duration, coloured by its state. It spans its window (`since` to now), or with `fitRuns`
// its runs: from a little before the first to now, at least TIMELINE_MIN_S, so that a fresh
// deployment's runs do not sit at the right edge of a day.
function timelineChart(key, timeline, { height = 200, fitRuns = false } = {}) {
  const runs = [...timeline.runs].reverse(); // oldest first, as uPlot wants its x
  const at = (run) => Date.parse(run.start_date || run.created_at) / 1000;
  const states = RUN_STATES.filter((s) => runs.some((run) => run.state === s));
  const counts = Object.entries(timeline.states).map(([s, n]) => `${n} ${s}`).join(", ");
  const now = Date.now() / 1000;
  const since = Date.parse(timeline.since) / 1000;
  const first = runs.length && fitRuns ? Math.min(...runs.map(at)) : since;
  const span = Math.max(TIMELINE_MIN_S, (now - first) * 1.1);
  return {
    key, height, xRange: [Math.max(since, now - span), now],
    caption: `${Object.values(timeline.states).reduce((a, b) => a + b, 0)} runs since ${new Date(timeline.since).toLocaleString()}${counts ? `: ${counts}` : ""}`,
    series: states.map((s) => ({
      label: s, stroke: STATE_COLOURS[s], paths: () => null,
      points: { show: true, size: 7, fill: STATE_COLOURS[s], stroke: STATE_COLOURS[s] },
      value: (u, v) => (v == null ? "–" : `${v.toFixed(1)}s`),
    })),
    data: [runs.map(at), ...states.map((s) => runs.map((run) => (run.state === s ? run.duration_s ?? 0 : null)))],
    describe: (i) => {
      const run = runs[i];
      return run ? `${run.run_id} (${run.pipeline_id}): ${run.state}, ${run.duration_s == null ? "not started" : `${run.duration_s.toFixed(1)}s`}` : "";
    },
  };
}

// A pipeline's runs' durations, oldest to newest.
function durationsChart(key, timeline) {
  const runs = timeline.runs.filter((run) => run.start_date).reverse();
  const durations = runs.map((run) => run.duration_s);
  const sorted = [...durations].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  // Of an even count, the mean of the middle two.
  const median = sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  // Its runs' span and a margin (a minute at least): uPlot would span years around one point.
  const starts = runs.map((run) => Date.parse(run.start_date) / 1000);
  const first = starts.length ? Math.min(...starts) : Date.now() / 1000 - 3600;
  const last = starts.length ? Math.max(...starts) : Date.now() / 1000;
  const margin = Math.max(60, (last - first) * 0.05);
  return {
    key, height: 120, legend: false, xRange: [first - margin, last + margin],
    caption: runs.length ? `Durations of its last ${runs.length} run(s): median ${median.toFixed(1)}s, longest ${sorted.at(-1).toFixed(1)}s` : "No run has started yet",
    series: [{ label: "duration", stroke: "#4b6cb7", width: 1.5, points: { show: true, size: 6 }, value: (u, v) => (v == null ? "–" : `${v.toFixed(1)}s`) }],
    data: [starts, durations],
    describe: (i) => (runs[i] ? `${runs[i].run_id}: ${runs[i].state}, ${durations[i].toFixed(1)}s` : ""),
  };
}

// The overview over the text layer: events per minute in the last hour.
async function renderOverview() {
  if ($("#sidebar").hidden) return;
  try {
    const read = await activity("events?window=hour&top=1");
    const specs = [];
    $("#overview").innerHTML = chartFigure(eventsChart("overview", read, { assets: false, height: 90, legend: true }), specs).raw;
    await mountCharts($("#overview"), specs);
  } catch (error) {
    if (!(error instanceof Unauthorized)) $("#overview").textContent = error.message;
  }
}

const closeLink = raw('<a class="close" href="#/">close ✕</a>');

async function assetPanel(id, specs) {
  const [asset, events, queued, perMinute] = await Promise.all([
    api(`/assets/${id}`),
    api(`/assets/events?asset_id=${id}&limit=${EVENTS_PER_PAGE}&offset=${state.eventsOffset}`),
    api(`/assets/${id}/queuedEvents?limit=${PAGE}`),
    activity(`events?window=hour&asset_id=${id}&top=1`),
  ]);
  const byPipeline = new Map();
  for (const row of queued) byPipeline.set(row.pipeline_id, (byPipeline.get(row.pipeline_id) || 0) + 1);
  return html`${closeLink}<h1 data-asset="${asset.id}">${asset.name}</h1>
    <dl><dt>URI</dt><dd>${asset.uri}</dd><dt>group</dt><dd>${asset.group}</dd>
    <dt>watchers</dt><dd>${asset.watchers.join(", ") || "none"}</dd>
    <dt>producers</dt><dd>${asset.producers.map((p) => raw(html`<a href="#/pipeline/${p}">${p}</a> `))}</dd>
    <dt>consumers</dt><dd>${asset.consumers.map((p) => raw(html`<a href="#/pipeline/${p}">${p}</a> `))}</dd></dl>
    <h3>extra</h3><pre>${json(asset.extra)}</pre>
    ${mayEmitTo(asset) ? raw(html`<p><button id="create-event" data-asset-id="${asset.id}" data-asset-name="${asset.name}">Create event…</button></p>`) : ""}
    <h2>Events per minute</h2>
    ${chartFigure(eventsChart(`asset-${asset.id}`, perMinute, { assets: false, height: 110, legend: false }), specs)}
    <h2>Queued events</h2>
    ${byPipeline.size ? raw(html`<table><tr><th>pipeline</th><th>queued</th><th></th></tr>${[...byPipeline].map(([p, n]) => raw(html`<tr><td>${p}</td><td>${n}</td><td>${may("operate") ? raw(html`<button data-delete-queued="${p}" data-asset-id="${asset.id}">delete</button>`) : ""}</td></tr>`))}</table>`) : raw('<p class="muted">none</p>')}
    <h2>Events</h2>
    <table class="events"><tr><th>id</th><th>when</th><th>source</th><th>extra</th></tr>
    ${events.map((e) => raw(html`<tr data-event-id="${e.id}"><td><a href="#/event/${e.id}">${e.id}</a></td><td>${age(e.timestamp)}</td><td>${e.source}${e.partition_key ? ` · ${e.partition_key}` : ""}</td><td><pre>${json(e.extra)}</pre></td></tr>`))}</table>
    <p><button data-events-page="-1" ${raw(state.eventsOffset ? "" : "disabled")}>newer</button>
    <button data-events-page="1" ${raw(events.length < EVENTS_PER_PAGE ? "disabled" : "")}>older</button></p>`;
}

async function pipelinePanel(id, specs) {
  const path = `/pipelines/${encodeURIComponent(id)}`;
  const weekAgo = new Date(Date.now() - 7 * 86400_000).toISOString().slice(0, 16);
  const [pipeline, explained, runs, timeline, changes] = await Promise.all([
    api(path), api(`${path}/explain`), api(`${path}/runs?limit=20`),
    activity(`runs?pipeline_id=${encodeURIComponent(id)}&since=${weekAgo}&limit=50`),
    lastChanges(id),
  ]);
  if (Object.keys(pipeline.queued_by_asset).length) {
    state.explained.set(id, { signature: JSON.stringify(pipeline.queued_by_asset), at: Date.now(), value: explained });
  }
  const log = state.logRun ? await runLogBox(state.logRun) : null;
  return html`${closeLink}<h1 data-pipeline="${pipeline.pipeline_id}">${pipeline.pipeline_id}</h1>
    <dl><dt>schedule</dt><dd>${pipeline.schedule}</dd><dt>progress</dt><dd>${pipeline.progress || "–"}</dd>
    <dt>state</dt><dd>${pipeline.paused ? "paused" : "active"}${pipeline.active ? "" : " (no longer defined)"}</dd>
    <dt>runs</dt><dd>${explained.active_runs} active of ${explained.max_active_runs}</dd>
    <dt>next cron</dt><dd>${pipeline.next_cron_at || "–"}</dd><dt>file</dt><dd>${pipeline.fileloc}</dd></dl>
    ${pipeline.error ? raw(html`<p class="error">${pipeline.error}</p>`) : ""}
    <h2>Explain</h2>
    <ul class="reasons" id="explain">${explained.reasons.map((r) => raw(html`<li>${r}</li>`))}</ul>
    <ul class="muted operands">${explained.assets.map((a) => raw(html`<li data-operand="${a.name}">${a.name}: ${a.queued_events ? `${a.queued_events} queued since ${new Date(a.queued_since).toLocaleTimeString()}` : "missing"}${operandTimes(a)}</li>`))}</ul>
    ${holdText(pipeline, explained)}
    ${may("operate") ? raw(html`<p><button id="toggle-pause" data-pipeline="${pipeline.pipeline_id}" data-paused="${pipeline.paused}">${pipeline.paused ? "Unpause" : "Pause"}</button>
    <button id="trigger" data-pipeline="${pipeline.pipeline_id}">Trigger…</button></p>`) : ""}
    <h2>Runs</h2>
    ${chartFigure(durationsChart(`durations-${pipeline.pipeline_id}`, timeline), specs)}
    <table class="runs"><tr><th>run <span class="muted">(log), start</span></th><th>state</th><th>duration</th><th>events</th></tr>
    ${runs.map((r) => raw(html`<tr data-run-id="${r.run_id}" data-run-state="${r.state}"><td title="${r.run_id}">${r.start_date ? raw(html`<button class="link" data-log="${r.run_id}">${breakable(shortRunId(r))}</button>`) : breakable(shortRunId(r))}<br>${started(r)}${r.rerun_of ? raw(html`<br><span class="muted" data-rerun-of="${r.rerun_of}">re-run of ${breakable(shortRunId({ run_id: r.rerun_of, pipeline_id: r.pipeline_id }))}</span>`) : ""}</td><td>${badge(r.state)}${r.try_number > 1 ? ` try ${r.try_number} of ${r.max_tries}` : ""} ${runControl(r)}</td><td>${duration(r)}</td><td>${r.events}</td></tr>`))}</table>
    ${runs.length ? "" : raw('<p class="muted">no runs yet</p>')}
    ${log !== null ? raw(html`<h3>Log of ${state.logRun}</h3>${raw(log)}`) : ""}
    ${changesSection(changes)}`;
}

// The last changes made to a pipeline and its runs, newest first, from the audit log; null
// when the caller's role may not read it (GET /audit would answer 403).
async function lastChanges(pipelineId) {
  if (!may("audit")) return null;
  return api(`/audit?pipeline_id=${encodeURIComponent(pipelineId)}&limit=${CHANGES_SHOWN}`);
}

// Who changed the pipeline, when and how: none for a caller who may not read the audit log.
function changesSection(changes) {
  if (changes === null) return "";
  const what = ({ action, target, details }) => {
    if (details.run_id) return `${action} ${details.run_id}`;
    if (target.startsWith("run:")) return `${action} ${target.slice("run:".length)}`;  // cancel, rerun
    if (details.deleted !== undefined) return `${action} (${details.deleted} events)`;
    return action;
  };
  return raw(html`<h2>Last changes</h2>
    ${changes.length ? raw(html`<table class="changes"><tr><th>when</th><th>who</th><th>what</th></tr>
    ${changes.map((c) => raw(html`<tr data-audit-id="${c.id}" data-action="${c.action}"><td title="${c.time}">${age(c.time)}</td><td>${c.actor}</td><td>${breakable(what(c))}</td></tr>`))}</table>`) : raw('<p class="muted">none recorded</p>')}`);
}

// An asset's times under its AND's window: when its oldest queued event expires, counting
// down, or which of its events expired.
function operandTimes(asset) {
  if (asset.window_s == null) return "";
  const window = span(asset.window_s);
  if (asset.expires_at && asset.queued_events) {
    return raw(html` · <span class="countdown">its oldest expires ${countdown(asset.expires_at)}</span> (window ${window})`);
  }
  if (asset.expired_at) {
    return raw(html` · its event <a href="#/event/${asset.expired_event_id}">${asset.expired_event_id}</a> expired at ${new Date(asset.expired_at).toLocaleTimeString([], HMS)} (window ${window})`);
  }
  return ` · window ${window}`;
}

// What holds the pipeline's run back once its condition holds: its batch (the events queued of
// the most, by asset) and its debounce, and when the run starts at the latest, counting down.
function holdText(pipeline, explained) {
  const { batch, debounce_s: debounce, held_until: until } = explained;
  if (batch == null && debounce == null) return "";
  const queued = Object.values(pipeline.queued_by_asset).reduce((sum, n) => sum + n, 0);
  const byAsset = explained.assets.filter((a) => a.queued_events && !a.alias).map((a) => `${a.name} ${a.queued_events}`).join(", ");
  const lines = [];
  if (batch != null) {
    lines.push(html`<li data-hold="batch">Batch: ${queued} of ${batch.max_events} events queued${byAsset ? ` (${byAsset})` : ""}; a run takes them at ${batch.max_events}, or ${span(batch.max_wait_s)} after the oldest was queued.</li>`);
  }
  if (debounce != null) {
    lines.push(html`<li data-hold="debounce">Debounce: a run starts once no event has come for ${span(debounce)}${queued && batch == null ? ` (${queued} queued${byAsset ? `: ${byAsset}` : ""})` : ""}.</li>`);
  }
  if (until) {
    const how = batch != null ? "at the latest" : "if no event comes before";
    const paused = pipeline.paused ? " once unpaused" : "";
    lines.push(html`<li data-hold="until"><span class="countdown">The run starts ${countdown(until)}</span> ${how}${paused}.</li>`);
  }
  return raw(`<ul class="hold" id="hold">${lines.join("")}</ul>`);
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
    ${w.held_by ? raw(html`<p class="held" data-held-by="${w.held_by}">${heldBy(w)}</p>`) : ""}
    ${w.last_error ? raw(html`<p>${watcherError(w)}</p>`) : ""}`;
}

// A watcher held back by a full backlog: healthy, waiting for the pipeline to drain it.
function heldBy(w) {
  return raw(html`Held back by <a href="#/pipeline/${encodeURIComponent(w.held_by)}">${w.held_by}</a>: its backlog is full (max_backlog), so the watcher fetches nothing until it drains; the rest waits in the source.`);
}

// A watcher's last error: in red while it is its current state (GET /watchers' `failing`),
// else as history: when it happened, and whether the watcher has polled since (`recovered`).
function watcherError(w) {
  if (!w.last_error) return "";
  const at = w.last_error_at
    ? raw(html`at <time datetime="${w.last_error_at}" title="${w.last_error_at}">${new Date(w.last_error_at).toLocaleTimeString()}, ${age(w.last_error_at)}</time>`)
    : "at a time not recorded";
  if (w.failing) return raw(html`<span class="error" data-error="failing">${w.last_error}</span> <span class="muted">(last ${at})</span>`);
  const now = w.recovered ? "Recovered (it has polled since)" : "Not failing now";
  return raw(html`<span class="past-error" data-error="${w.recovered ? "recovered" : "earlier"}">${now}. Last error ${at}: ${w.last_error}</span>`);
}

async function aliasPanel(id) {
  const aliases = await all("/assets/aliases");
  const alias = aliases.find((a) => String(a.id) === id);
  if (!alias) return html`${closeLink}<p class="muted">unknown alias ${id}</p>`;
  return html`${closeLink}<h1>${alias.name} <span class="muted">alias</span></h1>
    <dl><dt>assets</dt><dd>${alias.asset_ids.map((a) => raw(html`<a href="#/asset/${a}">${a}</a> `))}</dd>
    <dt>producers</dt><dd>${alias.producers.join(", ")}</dd><dt>consumers</dt><dd>${alias.consumers.join(", ")}</dd></dl>`;
}

async function watchersPage(key, specs) {
  const watchers = [...state.watchers.values()];
  const lag = await activity("watcherLag?window=hour");
  return html`<h1>Watchers</h1>${chartFigure(lagChart("watchers-lag", lag), specs)}<table class="watchers"><tr><th>watcher</th><th>asset</th><th>trigger</th><th>state</th><th>lag</th><th>last poll</th><th>restarts</th><th>last error</th></tr>
    ${watchers.map((w) => raw(html`<tr data-watcher="${w.watcher}"><td><a href="#/watcher/${w.asset_id}:${w.watcher}">${w.watcher}</a></td><td><a href="#/asset/${w.asset_id}">${w.asset}</a></td><td>${w.trigger}</td><td>${badge(w.state)}${w.held_by ? raw(html` <span class="held" data-held-by="${w.held_by}">held by <a href="#/pipeline/${encodeURIComponent(w.held_by)}">${w.held_by}</a></span>`) : ""}</td><td>${w.lag ?? "–"}</td><td>${age(w.last_poll_at)}</td><td>${w.restarts}</td><td>${watcherError(w)}</td></tr>`))}</table>
    ${watchers.length ? "" : raw('<p class="muted">no watchers</p>')}`;
}

function activityShell() {
  return html`<div data-shell="activity"><h1>Activity</h1>
    <p class="filters" role="radiogroup" aria-label="Window">${["hour", "day"].map((w) => raw(html`<label><span>last ${w}</span><input type="radio" name="window" value="${w}" ${raw(state.window === w ? "checked" : "")}></label>`))}</p>
    <div data-results></div></div>`;
}

// The charts of the whole flow: events per minute, watchers' lag, the runs.
async function activityPage(key, specs) {
  const since = new Date(Date.now() - (state.window === "day" ? 86400_000 : 3600_000)).toISOString().slice(0, 16);
  const [events, lag, timeline] = await Promise.all([
    activity(`events?window=${state.window}`),
    activity(`watcherLag?window=${state.window}`),
    activity(`runs?since=${since}`),
  ]);
  return html`<div class="charts">
    <section><h2>Events per minute</h2>${chartFigure(eventsChart("activity-events", events), specs)}</section>
    <section><h2>Runs</h2>${chartFigure(timelineChart("activity-runs", timeline), specs)}</section>
    <section><h2>Watcher lag</h2>${chartFigure(lagChart("activity-lag", lag), specs)}</section></div>`;
}

const SINCE_CHOICES = [[3600, "last hour"], [6 * 3600, "last 6 hours"], [86400, "last day"], [7 * 86400, "last 7 days"], [30 * 86400, "last 30 days"]];

function runsShell() {
  const f = state.runsFilter;
  const pipelines = [...state.pipelines.keys()].sort();
  return html`<div data-shell="runs"><h1>Runs</h1>
    <form class="filters" id="runs-filters">
      <label>pipeline<select name="pipeline"><option value="">all</option>${pipelines.map((p) => raw(html`<option ${raw(f.pipeline === p ? "selected" : "")}>${p}</option>`))}</select></label>
      <label>state<select name="state"><option value="">all</option>${RUN_STATES.map((s) => raw(html`<option ${raw(f.state === s ? "selected" : "")}>${s}</option>`))}</select></label>
      <label>created<select name="since_s">${SINCE_CHOICES.map(([s, words]) => raw(html`<option value="${s}" ${raw(f.since_s === s ? "selected" : "")}>${words}</option>`))}</select></label>
    </form><div data-results></div></div>`;
}

// Every run across pipelines, newest first, filtered; the timeline of the same runs above.
async function runsPage(key, specs) {
  const f = state.runsFilter;
  const since = new Date(Math.floor((Date.now() - f.since_s * 1000) / 60_000) * 60_000).toISOString();
  const query = `since=${encodeURIComponent(since)}${f.pipeline ? `&pipeline_id=${encodeURIComponent(f.pipeline)}` : ""}${f.state ? `&state=${f.state}` : ""}`;
  const [timeline, runs] = await Promise.all([activity(`runs?${query}`), api(`/runs?${query}&limit=200`)]);
  return html`${chartFigure(timelineChart("runs-timeline", timeline, { fitRuns: true }), specs)}
    <table class="runs all-runs"><tr><th>run</th><th>pipeline</th><th>state</th><th>start</th><th>duration</th><th>events</th><th>log and trace</th></tr>
    ${runs.map((r) => raw(html`<tr data-run-id="${r.run_id}" data-run-state="${r.state}"><td><a href="#/run/${encodeURIComponent(r.run_id)}">${r.run_id}</a></td><td><a href="#/pipeline/${encodeURIComponent(r.pipeline_id)}">${r.pipeline_id}</a></td><td>${badge(r.state)}</td><td>${started(r)}</td><td>${duration(r)}</td><td>${r.events}</td><td><a href="#/run/${encodeURIComponent(r.run_id)}" data-run-log>log</a> · <a href="#/run/${encodeURIComponent(r.run_id)}" data-run-trace>events</a></td></tr>`))}</table>
    ${runs.length ? "" : raw('<p class="muted">no runs in this window</p>')}`;
}

// A run's Log box: its log, or, when it is empty, why (the API says so in a header: queued,
// cancelled before it started, nothing printed...).
async function runLogBox(runId) {
  let empty = null;
  let reason = "";
  const text = await api(`/runs/${encodeURIComponent(runId)}/logs`, {
    onResponse: (response) => {
      empty = response.headers.get("Triggerer-Log-Empty");
      reason = response.headers.get("Triggerer-Log-Empty-Reason") || "";
    },
  }).catch((error) => error.message);
  return empty
    ? html`<pre class="log muted" data-log-empty="${empty}">no log: ${reason}</pre>`
    : html`<pre class="log">${text}</pre>`;
}

// One run: what it consumed (each event linking to its trace), what it produced, its log.
async function runPage(id) {
  const run = await api(`/runs/${encodeURIComponent(id)}`);
  const [log, events] = await Promise.all([
    runLogBox(id),
    run.start_date ? api(`/assets/events?since=${encodeURIComponent(run.created_at)}&limit=${PAGE}`) : [],
  ]);
  const outlets = events.filter((event) => event.source_run_id === run.run_id).reverse();
  const eventRows = (rows) => rows.map((e) => raw(html`<tr data-event-id="${e.id}"><td><a href="#/event/${e.id}">trace of event ${e.id}</a></td><td><a href="#/asset/${e.asset_id}">${e.uri}</a></td><td>${age(e.timestamp)}</td></tr>`));
  return html`<h1 data-run="${run.run_id}">Run ${run.run_id}</h1>
    <dl><dt>pipeline</dt><dd><a href="#/pipeline/${encodeURIComponent(run.pipeline_id)}">${run.pipeline_id}</a></dd>
    <dt>state</dt><dd>${badge(run.state)} ${runControl(run)}</dd><dt>type</dt><dd>${run.run_type}</dd>
    <dt>start</dt><dd>${started(run)}</dd><dt>duration</dt><dd>${duration(run) || "–"}</dd>
    <dt>try</dt><dd>${run.try_number} of ${run.max_tries}</dd>${run.rerun_of ? raw(html`<dt>re-run of</dt><dd><a href="#/run/${encodeURIComponent(run.rerun_of)}">${run.rerun_of}</a></dd>`) : ""}</dl>
    ${run.error ? raw(html`<p class="error">${run.error}</p>`) : ""}
    <h2>Consumed events</h2>${run.consumed.length ? raw(html`<table>${eventRows(run.consumed)}</table>`) : raw('<p class="muted">none</p>')}
    <h2>Produced events</h2>${outlets.length ? raw(html`<table>${eventRows(outlets)}</table>`) : raw('<p class="muted">none</p>')}
    <h2 id="log">Log</h2>${raw(log)}`;
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
    <p>${event.source_run_id ? `produced by run ${event.source_run_id}` : `from ${event.source}`} · ${event.timestamp}${event.partition_key ? ` · partition ${event.partition_key}` : ""}</p>
    <pre>${json(event.extra)}</pre>
    <p>${event.queued_for.length ? `still queued for ${event.queued_for.join(", ")}` : "queued for no pipeline now"}</p>
    ${runs.map(raw)}</div>`;
}

async function traceRun(runId, depth, seen) {
  const run = await api(`/runs/${encodeURIComponent(runId)}`);
  const [log, events] = await Promise.all([
    runLogBox(runId),
    run.start_date ? api(`/assets/events?since=${encodeURIComponent(run.created_at)}&limit=${PAGE}`) : [],
  ]);
  const outlets = events.filter((event) => event.source_run_id === runId).reverse();
  const children = await Promise.all(outlets.map((event) => traceEvent(event.id, depth + 1, seen)));
  return html`<div class="trace" data-trace-run="${run.run_id}" data-pipeline="${run.pipeline_id}">
    <h3>Run of <a href="#/pipeline/${run.pipeline_id}">${run.pipeline_id}</a> ${badge(run.state)} ${duration(run)}</h3>
    <p class="muted">${run.run_id} · consumed ${run.events} event(s)${run.rerun_of ? ` · re-run of ${run.rerun_of}` : ""}</p>
    ${raw(log)}${children.map(raw)}</div>`;
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
$("#search").addEventListener("input", filterGraph);
$("#page").addEventListener("change", (event) => {
  const { name, value } = event.target;
  if (event.target.closest("#runs-filters")) {
    state.runsFilter = { ...state.runsFilter, [name]: name === "since_s" ? Number(value) : value };
  } else if (name === "window") {
    state.window = value;
  } else {
    return;
  }
  renderRoute();
});
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

// The token is asked for only when the API wants one: /healthz (open) says so, so that the page
// needs no 401 (a console error) to find out. With a token kept from earlier, polls start at once.
async function start() {
  if (sessionStorage.getItem(TOKEN_KEY) === null) {
    const health = await fetch(`${API}/healthz`).then((r) => r.json()).catch(() => ({}));
    if (health.token_required) askToken();
  }
  refresh();
  setInterval(refresh, POLL_MS);
}
start();
