// What does not fit on a page of the UI, for tests/e2e/test_ui.py: each check returns a list of
// problems in words (empty when all is well). Added to the page by Playwright.
window.layoutChecks = {
  // The visible elements of the selectors whose content is wider than they are.
  overflowing(selectors) {
    return selectors.flatMap((selector) => [...document.querySelectorAll(selector)]
      .filter((e) => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
      .map((e) => `${selector}: scrollWidth ${e.scrollWidth} > clientWidth ${e.clientWidth}`));
  },

  // The table cells in `container` that reach past its edges (a column cut off).
  cutOff(container) {
    const box = document.querySelector(container).getBoundingClientRect();
    return [...document.querySelectorAll(`${container} th, ${container} td`)]
      .filter((cell) => cell.offsetParent !== null)
      .map((cell) => [cell.textContent.trim().slice(0, 30), cell.getBoundingClientRect()])
      .filter(([, cell]) => cell.right > box.right + 1 || cell.left < box.left - 1)
      .map(([text, cell]) => `${text}: ${cell.left}..${cell.right} outside ${box.left}..${box.right}`);
  },

  // The header's links, labels, who you are and status that wrap onto a second line.
  wrappedHeader() {
    return [...document.querySelectorAll("header a, header label, #whoami, #status")]
      .filter((e) => e.getClientRects().length > 1)
      .map((e) => `header: '${e.textContent.trim()}' on ${e.getClientRects().length} lines`);
  },

  // The x-axis labels of the charts on the page that overlap (or nearly touch) the next one
  // on the same line. uPlot draws them on its canvas: their boxes are measured in its font.
  axisOverlaps(only = null, gapPx = 4) {
    const context = document.createElement("canvas").getContext("2d");
    const overlaps = [];
    for (const [key, u] of window.triggerer.charts) {
      if (!u.root.isConnected || (only && key !== only)) continue;
      const axis = u.axes[0];
      context.font = axis.font[0];
      const lines = new Map(); // line of the label -> its boxes, left to right
      axis._splits.forEach((split, i) => {
        const x = u.valToPos(split, "x");
        String(axis._values[i] ?? "").split("\n").forEach((text, line) => {
          if (!text.trim()) return;
          const half = context.measureText(text).width / devicePixelRatio / 2;
          if (!lines.has(line)) lines.set(line, []);
          lines.get(line).push({ text, left: x - half, right: x + half });
        });
      });
      for (const boxes of lines.values()) {
        for (let i = 1; i < boxes.length; i += 1) {
          const [before, after] = [boxes[i - 1], boxes[i]];
          if (after.left < before.right + gapPx) {
            overlaps.push(`${key}: '${before.text}' ends at ${before.right.toFixed(0)}, '${after.text}' starts at ${after.left.toFixed(0)}`);
          }
        }
      }
    }
    return overlaps;
  },

  // The labels of the chart `key` that overlap over windows of a minute to three hours, each
  // starting half a minute past: there the first label's second line carries the date, as in
  // the `11/28/26 6:50am6:51am` of a panel's durations chart. The chart's window is its spec's
  // (app.js), set here as a zoom would; the next poll sets it back.
  async axisOverlapsOverWindows(key) {
    const u = window.triggerer.charts.get(key);
    const start = Math.floor(Date.now() / 60000) * 60 - 3 * 3600 + 30;
    const found = new Set();
    for (let span = 60; span <= 3 * 3600; span = Math.round(span * 1.15)) {
      u.spec.xRange = [start, start + span];
      u.setScale("x", { min: start, max: start + span });
      await new Promise((resolve) => setTimeout(resolve)); // uPlot draws after a task
      for (const overlap of this.axisOverlaps(key)) found.add(`a ${span} s window: ${overlap}`);
    }
    return [...found];
  },

  // The graph's nodes whose labels are drawn smaller than `leastPx` screen pixels.
  smallLabels(leastPx) {
    const cy = window.triggerer.cy;
    return cy.nodes().filter((n) => parseFloat(n.style("font-size")) * cy.zoom() < leastPx)
      .map((n) => `${n.id()}: ${n.style("font-size")} at zoom ${cy.zoom().toFixed(2)}`);
  },

  // The graph's nodes (all, or the one of `id`) not wholly in the graph's view.
  outOfView(id = null) {
    const cy = window.triggerer.cy;
    const nodes = id ? cy.$id(id) : cy.nodes();
    return nodes.filter((n) => {
      const box = n.renderedBoundingBox({ includeLabels: false });
      return box.x1 < 0 || box.y1 < 0 || box.x2 > cy.width() || box.y2 > cy.height();
    }).map((n) => `${n.id()} at ${JSON.stringify(n.renderedBoundingBox({ includeLabels: false }))} outside the graph's ${cy.width()}x${cy.height()}`);
  },

  // The graph reaching under the panel beside it.
  graphUnderPanel() {
    const graph = document.querySelector("#graph").getBoundingClientRect();
    const canvas = document.querySelector("#graph canvas").getBoundingClientRect();
    const panel = document.querySelector("#panel").getBoundingClientRect();
    const right = Math.max(graph.right, canvas.right);
    return right > panel.left + 1 ? [`the graph ends at ${right}, the panel starts at ${panel.left}`] : [];
  },
};
