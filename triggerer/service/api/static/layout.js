// The left-to-right layered layout of a large lineage graph, in one pass over its elements.
//
// dagre (app.js uses it below LARGE_GRAPH elements) takes seconds at a thousand nodes even with
// its fastest options: it splits each edge spanning several ranks into a chain of dummy nodes
// and aligns them. A large graph's edges are drawn as straight lines (no routing through the
// ranks), so this layout needs none of that: ranks by longest path, one ordering sweep each way
// by the neighbours' mean position, and each node placed at its neighbours' mean height, pushed
// down past the node above it. Linear in the nodes and edges: a thousand nodes in milliseconds.

// A node's size by its kind, as STYLE in app.js draws it (its border included).
export const NODE_SIZES = {
  watcher: [154, 56], asset: [174, 56], alias: [174, 56], group: [196, 58], pipeline: [186, 58],
  gate: [52, 52],
};
const LINE_PX = 17; // a line of a node's label
const TIMED_GATE_WIDTH = 160; // the widest line under a timed gate ("invoices 59m 58s left")

// The size of a node (its data): its kind's, or for a gate with a window, with room for what it
// says under its diamond (a line for the window, one for each of its assets), as much above it
// so that the diamond stays at its centre.
export function nodeSize(data) {
  if (data.kind === "gate" && data.within_s != null) {
    const under = LINE_PX * (2 + (data.operands?.length || 0)) + 6;
    return [TIMED_GATE_WIDTH, NODE_SIZES.gate[1] + 2 * under];
  }
  return NODE_SIZES[data.kind] || [174, 56];
}

// Positions ({id: {x, y}}, node centres) of the nodes of `elements` (cytoscape's element
// objects), ranks `rankSep` apart, nodes of a rank `nodeSep` apart.
export function layered(elements, { rankSep = 70, nodeSep = 12 } = {}) {
  const ids = [];
  const data = new Map();
  const succ = new Map();
  const pred = new Map();
  for (const element of elements) {
    if (element.group !== "nodes") continue;
    ids.push(element.data.id);
    data.set(element.data.id, element.data);
    succ.set(element.data.id, []);
    pred.set(element.data.id, []);
  }
  for (const element of elements) {
    if (element.group !== "edges") continue;
    const { source, target } = element.data;
    if (source === target || !succ.has(source) || !succ.has(target)) continue;
    succ.get(source).push(target);
    pred.get(target).push(source);
  }
  const rank = ranks(ids, succ, pred);

  // The ranks' nodes in first-seen order, then sorted by their neighbours' mean order: once
  // left to right (by predecessors), once right to left (by successors).
  const layers = [];
  for (const id of ids) (layers[rank.get(id)] ??= []).push(id);
  const order = new Map();
  const number = (layer) => layer.forEach((id, i) => order.set(id, i));
  layers.forEach(number);
  const sweep = (layer, neighbours) => {
    const key = new Map(layer.map((id) => {
      const near = neighbours.get(id);
      return [id, near.length ? near.reduce((sum, n) => sum + order.get(n), 0) / near.length : order.get(id)];
    }));
    layer.sort((a, b) => key.get(a) - key.get(b));
    number(layer);
  };
  for (let r = 1; r < layers.length; r += 1) if (layers[r]) sweep(layers[r], pred);
  for (let r = layers.length - 2; r >= 0; r -= 1) if (layers[r]) sweep(layers[r], succ);

  // Columns as wide as their widest node; in a column, each node at its predecessors' mean
  // height (the first column stacked), no higher than the node above it allows.
  const positions = {};
  let x = 0;
  for (const layer of layers) {
    if (!layer) continue;
    const width = Math.max(...layer.map((id) => nodeSize(data.get(id))[0]));
    let bottom = -Infinity;
    for (const id of layer) {
      const [, height] = nodeSize(data.get(id));
      const near = pred.get(id).filter((n) => positions[n]);
      const wanted = near.length ? near.reduce((sum, n) => sum + positions[n].y, 0) / near.length : bottom + nodeSep + height / 2;
      const y = Math.max(Number.isFinite(wanted) ? wanted : height / 2, bottom + nodeSep + height / 2);
      positions[id] = { x: x + width / 2, y };
      bottom = y + height / 2;
    }
    x += width + rankSep;
  }
  return positions;
}

// Each node's rank: one past its furthest predecessor (a longest path from the sources), then
// each source moved right to just before the first node it feeds. Edges closing a cycle are
// left out of the ranking.
function ranks(ids, succ, pred) {
  const rank = new Map();
  const waiting = new Map(ids.map((id) => [id, pred.get(id).length]));
  let ready = ids.filter((id) => waiting.get(id) === 0);
  const visit = (queue) => {
    for (let i = 0; i < queue.length; i += 1) {
      const id = queue[i];
      const r = Math.max(-1, ...pred.get(id).map((p) => rank.get(p) ?? -1)) + 1;
      rank.set(id, r);
      for (const next of succ.get(id)) {
        waiting.set(next, waiting.get(next) - 1);
        if (waiting.get(next) === 0) queue.push(next);
      }
    }
  };
  visit(ready);
  // What a cycle kept waiting: ranked from what is ranked already, one at a time.
  for (const id of ids) {
    if (rank.has(id)) continue;
    ready = [id];
    waiting.set(id, 0);
    visit(ready);
  }
  for (const id of ids) {
    if (pred.get(id).length || !succ.get(id).length) continue;
    rank.set(id, Math.max(0, Math.min(...succ.get(id).map((s) => rank.get(s))) - 1));
  }
  return rank;
}
