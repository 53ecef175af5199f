// The value inspector: sliders and number boxes per dimension of more than one index, arrow keys, "Jump to max
// diff" and a click on the heatmap (which moves with the window) without a reload. The window lives in the URL (index, start, count), so links and the back button work; the server
// renders the grids (the same partial as the page), so this script only moves the window.

const form = document.querySelector("form.window");
if (form) {
  const pairId = form.dataset.pair;
  const shape = form.dataset.shape.split(",").filter((s) => s !== "").map(Number);
  const grids = document.getElementById("inspector-grids");
  const sliders = form.querySelector(".sliders");
  let state = readState(new URLSearchParams(location.search));
  let shown = 0; // the windows asked for: only the latest one's grids are shown

  function readState(params) {
    const index = (params.get("index") ?? form.elements.index.value).split(",");
    const free = index.map((v, d) => (v.trim() === ":" ? d : -1)).filter((d) => d >= 0);
    const starts = (params.get("start") ?? form.elements.start.value).split(",").map(Number);
    const counts = (params.get("count") ?? form.elements.count.value).split(",").map(Number);
    return { index, free, starts, counts };
  }

  function query(s) {
    return new URLSearchParams({ index: s.index.join(","), start: s.starts.join(","), count: s.counts.join(",") });
  }

  function clamp(value, lo, hi) { return Math.max(lo, Math.min(hi, value)); }

  async function show(s, push = true, refocus = false) {
    state = s;
    form.elements.index.value = s.index.join(",");
    form.elements.start.value = s.starts.join(",");
    form.elements.count.value = s.counts.join(",");
    syncSliders();
    const q = query(s);
    if (push) history.pushState(null, "", `/pairs/${pairId}?${q}`);
    const mine = ++shown;
    const response = await fetch(`/pairs/${pairId}/grid?${q}`);
    const text = await response.text();
    if (mine !== shown) return; // a later move already asked for another window
    grids.innerHTML = text;
    flow();
    bindHeatmap(refocus);
    showLargest();
  }

  // A 1-D window fills the width it has: the server sends it a value a row (what a page without scripts shows);
  // here its values are laid out as many a row as fit in each grid's width (the same number in all three, so
  // they line up), each row headed by its first index and the columns by their offset (+0, +1...). Again
  // whenever that width changes (the window, stacked or side by side).
  function flow() {
    const area = grids.querySelector(".grids.flow");
    const tables = area ? [...area.querySelectorAll("table.values[data-start]")] : [];
    if (!tables.length) return;
    const cellsOf = (table) => [...table.querySelectorAll("td:not(.corner)")];
    if (!area.dataset.cell) { // measured once as the server laid it out: a column as wide as its widest value
      area.dataset.cell = Math.max(...tables.map((t) => cellsOf(t)[0].getBoundingClientRect().width));
      const labels = tables.flatMap((t) => [...t.querySelectorAll("th[scope=row]")]);
      area.dataset.label = Math.max(...labels.map((th) => th.getBoundingClientRect().width));
    }
    const spacing = 3; // table.values' border-spacing
    const room = Math.min(...tables.map((t) => t.closest("figure").clientWidth)) - Number(area.dataset.label) - 3 * spacing;
    const count = cellsOf(tables[0]).length;
    const perRow = Math.max(1, Math.min(count, Math.floor(room / (Number(area.dataset.cell) + spacing))));
    if (String(perRow) === area.dataset.perRow) return;
    area.dataset.perRow = perRow;
    for (const table of tables) {
      const cells = cellsOf(table);
      const start = Number(table.dataset.start);
      const rows = [];
      if (perRow > 1) {
        const head = document.createElement("tr");
        const corner = Object.assign(document.createElement("td"), { className: "corner" });
        head.append(corner, ...Array.from({ length: perRow }, (_, k) => {
          const th = Object.assign(document.createElement("th"), { scope: "col", textContent: `+${k}` });
          return th;
        }));
        rows.push(head);
      }
      for (let i = 0; i < cells.length; i += perRow) {
        const row = document.createElement("tr");
        const th = Object.assign(document.createElement("th"), { scope: "row", textContent: String(start + i) });
        row.append(th, ...cells.slice(i, i + perRow));
        rows.push(row);
      }
      table.replaceChildren(...rows);
    }
  }
  new ResizeObserver(() => flow()).observe(grids);

  // the window's largest difference scrolled into view inside the grids' own scroll area (not the page)
  function showLargest() {
    const area = grids.querySelector(".grids");
    const cell = area && area.querySelector("td.max");
    if (!cell) return;
    const box = area.getBoundingClientRect();
    const at = cell.getBoundingClientRect();
    area.scrollTop += at.top - box.top - area.clientHeight / 2;
    area.scrollLeft += at.left - box.left - area.clientWidth / 2;
  }

  // the window moved so that it holds `target` (an aligned index), centred where it can be
  function moveTo(target, fromHeatmap = false) {
    const next = structuredClone(state);
    shape.forEach((size, dim) => {
      const w = next.free.indexOf(dim);
      if (w >= 0) next.starts[w] = clamp(target[dim] - Math.floor(next.counts[w] / 2), 0, Math.max(0, size - next.counts[w]));
      else next.index[dim] = String(target[dim]);
    });
    show(next, true, fromHeatmap);
  }

  // The heatmap is a PNG of a pixel per cell (scaled up): the cell under the pointer is worked out from the cells'
  // edges on the figure, read out with its value (fetched once as JSON) and outlined; a click opens it above. The
  // map is one tab stop: arrow keys move the outline a cell, Home and End to the row's ends (with Ctrl, the map's
  // corners), Enter opens the cell.
  function bindHeatmap(refocus = false) {
    const figure = grids.querySelector("figure.heatmap");
    if (!figure) return;
    const box = figure.querySelector(".heatmap-image");
    const img = box.querySelector("img");
    const cursor = box.querySelector("rect.cursor");
    const readout = figure.querySelector(".heatmap-readout");
    const rowEdges = figure.dataset.rowEdges.split(",").map(Number);
    const colEdges = figure.dataset.colEdges.split(",").map(Number);
    const fixed = figure.dataset.fixed.split(",");
    const rows = rowEdges.length - 1;
    const cols = colEdges.length - 1;
    let values = null;
    let at = null;
    const loading = fetch(figure.dataset.values).then((r) => (r.ok ? r.json() : null)).then((v) => {
      values = v;
      if (v) {
        figure.querySelector(".legend-high").textContent = `+${v.high}`;
        figure.querySelector(".legend-low").textContent = `−${v.high}`;
      }
      return v;
    }).catch(() => null);

    function spot(r, c) {
      let free = 0;
      return fixed.map((v) => (v.trim() === ":" ? (free++ === 0 ? rowEdges[r] : colEdges[c]) : Number(v)));
    }
    function mark(r, c) {
      at = [r, c];
      cursor.setAttribute("x", `${(100 * c) / cols}%`); cursor.setAttribute("y", `${(100 * r) / rows}%`);
      cursor.setAttribute("width", `${100 / cols}%`); cursor.setAttribute("height", `${100 / rows}%`);
      const span = (edges, i) => (edges[i + 1] - 1 > edges[i] ? `${edges[i]}–${edges[i + 1] - 1}` : `${edges[i]}`);
      const value = values ? values.values[r][c] : "…";
      readout.textContent = `rows ${span(rowEdges, r)}, columns ${span(colEdges, c)}: largest difference (candidate − reference) ${value}`;
      if (!values) loading.then(() => { if (at && at[0] === r && at[1] === c && values) mark(r, c); });
    }
    function cellAt(event) {
      const rect = img.getBoundingClientRect();
      const r = clamp(Math.floor(((event.clientY - rect.top) / rect.height) * rows), 0, rows - 1);
      const c = clamp(Math.floor(((event.clientX - rect.left) / rect.width) * cols), 0, cols - 1);
      return [r, c];
    }
    box.addEventListener("pointermove", (event) => mark(...cellAt(event)));
    box.addEventListener("click", (event) => moveTo(spot(...cellAt(event)), true));
    box.addEventListener("keydown", (event) => {
      let [r, c] = at ?? [0, 0];
      const step = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] }[event.key];
      if (step) { r += step[0]; c += step[1]; }
      else if (event.key === "Home") { c = 0; if (event.ctrlKey) r = 0; }
      else if (event.key === "End") { c = cols - 1; if (event.ctrlKey) r = rows - 1; }
      else if (event.key === "Enter") { event.preventDefault(); event.stopPropagation(); moveTo(spot(r, c), true); return; }
      else return;
      event.preventDefault();
      event.stopPropagation(); // the page's own arrow keys move the window
      mark(clamp(r, 0, rows - 1), clamp(c, 0, cols - 1));
    });
    box.addEventListener("focus", () => { if (!at) mark(0, 0); });
    if (refocus) box.focus();
  }

  function control(label, max, value, onChange) {
    const row = document.createElement("div");
    row.className = "slider";
    const name = document.createElement("span");
    name.textContent = label;
    const range = Object.assign(document.createElement("input"), { type: "range", min: 0, max, value });
    const box = Object.assign(document.createElement("input"), { type: "number", min: 0, max, value });
    range.setAttribute("aria-label", label);
    box.setAttribute("aria-label", `${label} (number)`);
    range.addEventListener("input", () => { box.value = range.value; onChange(Number(range.value)); });
    box.addEventListener("change", () => { range.value = box.value; onChange(Number(box.value)); });
    row.append(name, range, box);
    return { row, range, box };
  }

  let controls = [];
  function buildSliders() {
    sliders.replaceChildren();
    controls = shape.flatMap((size, dim) => {
      if (size <= 1) return []; // nothing to move along
      const w = state.free.indexOf(dim);
      const isWindow = w >= 0;
      const max = isWindow ? Math.max(0, size - state.counts[w]) : size - 1;
      const value = isWindow ? state.starts[w] : Number(state.index[dim]);
      const label = `dim ${dim} (size ${size})${isWindow ? ", window start" : ""}`;
      const c = control(label, max, value, (v) => {
        const next = structuredClone(state);
        if (isWindow) next.starts[w] = v; else next.index[dim] = String(v);
        schedule(next);
      });
      sliders.append(c.row);
      return [{ ...c, dim, isWindow, w }];
    });
    sliders.hidden = controls.length === 0;
  }

  function syncSliders() {
    for (const c of controls) {
      const v = c.isWindow ? state.starts[c.w] : Number(state.index[c.dim]);
      c.range.value = v; c.box.value = v;
    }
  }

  let timer = null;
  function schedule(next) {
    clearTimeout(timer);
    timer = setTimeout(() => show(next), 60);
  }

  // reference, candidate and difference stacked (the default on narrow screens) or side by side: the choice is kept
  const section = form.closest("section.inspector");
  const layout = document.createElement("button");
  layout.type = "button";
  layout.className = "secondary layout-toggle";
  function setLayout(side) {
    section.classList.toggle("layout-side", side);
    section.classList.toggle("layout-stacked", !side);
    layout.textContent = side ? "Stack the grids" : "Grids side by side";
    layout.setAttribute("aria-pressed", String(side));
  }
  const kept = localStorage.getItem("inspector-layout");
  setLayout(kept ? kept === "side" : window.matchMedia("(min-width: 1000px)").matches);
  layout.addEventListener("click", () => {
    const side = !section.classList.contains("layout-side");
    localStorage.setItem("inspector-layout", side ? "side" : "stacked");
    setLayout(side);
    flow();
    showLargest();
  });
  form.querySelector("button[type=submit]").after(layout);

  buildSliders();
  flow();
  bindHeatmap();
  showLargest();

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams(new FormData(form));
    state = readState(params);
    buildSliders();
    show(state);
  });

  const jump = document.getElementById("jump");
  if (jump) {
    jump.addEventListener("click", (event) => {
      event.preventDefault();
      // centre the current window (same dimensions and counts) on the largest difference
      moveTo(jump.dataset.argmax.split(",").map(Number));
    });
  }

  window.addEventListener("popstate", () => show(readState(new URLSearchParams(location.search)), false));

  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, textarea, select") || !["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown"].includes(event.key)) return;
    if (!shape.length) return;
    event.preventDefault();
    const next = structuredClone(state);
    if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      const w = next.free.length - 1;  // the last window dimension
      const dim = next.free[w];
      const step = (event.shiftKey ? next.counts[w] : 1) * (event.key === "ArrowRight" ? 1 : -1);
      next.starts[w] = clamp(next.starts[w] + step, 0, Math.max(0, shape[dim] - next.counts[w]));
    } else {
      const fixed = next.index.map((v, d) => (v.trim() === ":" ? -1 : d)).filter((d) => d >= 0);
      if (!fixed.length) return;
      const dim = fixed[fixed.length - 1];
      const step = event.key === "ArrowDown" ? 1 : -1;
      next.index[dim] = String(clamp(Number(next.index[dim]) + step, 0, shape[dim] - 1));
    }
    show(next);
  });
}
